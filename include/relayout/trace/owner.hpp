// A token row's owner in a trace: request id and position packed in 64 bits, -1 for a padding row.
// Engines name their rows this way when they carry an owner column through the bridge.
#pragma once

#include <cstdint>
#include <string>

namespace relayout::trace {

struct RowOwner {
  static constexpr std::int64_t kPad = -1;
  static constexpr std::int64_t pack(int request, int position) {
    return (std::int64_t(request) << 32) | std::uint32_t(position);
  }
  static constexpr int request(std::int64_t id) { return int(id >> 32); }
  static constexpr int position(std::int64_t id) { return int(id & 0xffffffff); }
  // Request 0 is "A", ..., 25 is "Z", then "R26" and so on.
  static std::string request_name(int r) { return r < 26 ? std::string(1, char('A' + r)) : "R" + std::to_string(r); }
  // "A3": request A, position 3; padding is "pad".
  static std::string label(std::int64_t id) {
    return id == kPad ? "pad" : request_name(request(id)) + std::to_string(position(id));
  }
};

}  // namespace relayout::trace
