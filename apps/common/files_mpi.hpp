// Files of an MPI job: a verdict every rank learns before it goes on, so no rank is left waiting in
// a collective while another stops. Collective over `world`: call on every rank, in the same order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/files.hpp"
#include "relayout/comm.hpp"
#include "relayout/mesh/error.hpp"

namespace relayout::cli {

// Rank `root`'s text on every rank (a length, then the characters as int32).
inline std::string broadcast_text(const MpiCommunicator& world, const std::string& text, int root = 0) {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  broadcast(world, std::span<std::int64_t>(&n, 1), root);
  std::vector<std::int32_t> chars(text.begin(), text.end());
  chars.resize(static_cast<std::size_t>(n));
  if (n > 0) broadcast(world, std::span<std::int32_t>(chars), root);
  return std::string(chars.begin(), chars.end());
}

// The lowest failing rank's error on every rank ("" when none failed).
inline std::string agree_error(const MpiCommunicator& world, const std::string& mine) {
  int first = mine.empty() ? world.size() : world.rank();
  all_reduce_in_place(world, std::span<int>(&first, 1), ReduceOp::min);
  if (first == world.size()) return "";
  return broadcast_text(world, mine, first);
}

// Runs `f` (which may throw LayoutError) on rank 0 alone; every rank throws its error together.
template <class F>
void on_root_agreed(const MpiCommunicator& world, const std::string& flag, F&& f) {
  std::string error;
  if (world.rank() == 0) {
    try {
      f();
    } catch (const LayoutError& e) {
      error = e.what();
    }
  }
  error = broadcast_text(world, error);
  if (!error.empty()) throw LayoutError(flag, error);
}

// Before the work: rank 0 checks the output `flag` names (empty: none); every rank learns the verdict.
inline void require_output(const MpiCommunicator& world, const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  on_root_agreed(world, flag, [&] { check_output_flag(flag, path); });
}

// After the work: rank 0 replaces the file `flag` names by `text` (only rank 0's text counts);
// every rank throws together when it failed.
inline void write_output_on_root(const MpiCommunicator& world, const std::string& flag, const std::string& path,
                                 std::string_view text) {
  on_root_agreed(world, flag, [&] { write_output_flag(flag, path, text); });
}

}  // namespace relayout::cli
