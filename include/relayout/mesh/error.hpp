// Errors a user can cause by describing a layout or feeding it data: bad widths, unknown names,
// ranks out of range, token counts of the wrong shape. Each names the input and the rule it broke.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace relayout {

class LayoutError : public std::invalid_argument {
 public:
  LayoutError(std::string input, const std::string& message)
      : std::invalid_argument(message), input_(std::move(input)) {}

  // The flag, field or argument that was wrong (for example "--tp" or "rank").
  const std::string& input() const noexcept { return input_; }

 private:
  std::string input_;
};

}  // namespace relayout
