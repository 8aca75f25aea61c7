// The examples' --trace DIR flag. Collective over the job: rank 0 takes DIR's lock (another live run
// writing there is refused, naming it) and makes the run id every rank's header carries, then each
// rank opens its JSON Lines file. A directory that cannot be created or a file that cannot be
// opened is a LayoutError naming --trace; a failed write ends the run at JsonlSink::close (exit 1).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "relayout/comm.hpp"
#include "relayout/mesh/error.hpp"
#include "relayout/trace/jsonl.hpp"

namespace relayout::cli {

// Rank 0's text on every rank (a length, then the characters as int32).
inline std::string broadcast_text(const MpiCommunicator& world, const std::string& text) {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  broadcast(world, std::span<std::int64_t>(&n, 1), 0);
  std::vector<std::int32_t> chars(text.begin(), text.end());
  chars.resize(static_cast<std::size_t>(n));
  if (n > 0) broadcast(world, std::span<std::int32_t>(chars), 0);
  return std::string(chars.begin(), chars.end());
}

// DIR/.relayout-trace.lock, held (flock) by rank 0 while the run writes DIR: the kernel drops it
// when the process ends, so a crashed run leaves no stale lock. The file says which run holds it.
class TraceDirLock {
 public:
  TraceDirLock() = default;
  TraceDirLock(const TraceDirLock&) = delete;
  TraceDirLock& operator=(const TraceDirLock&) = delete;
  ~TraceDirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }
  const std::string& run_id() const { return run_id_; }

  // Collective. Throws LayoutError("--trace", ...) on every rank when rank 0 cannot create DIR or
  // another live run holds its lock.
  void acquire(const MpiCommunicator& world, const std::string& dir) {
    std::string error, id;
    if (world.rank() == 0) {
      id = make_run_id();
      error = lock(dir, id);
    }
    error = broadcast_text(world, error);
    run_id_ = broadcast_text(world, id);
    if (!error.empty()) throw LayoutError("--trace", error);
  }

 private:
  static std::string make_run_id() {
    char host[64] = "host";
    ::gethostname(host, sizeof host - 1);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    char b[160];
    std::snprintf(b, sizeof b, "%s-%ld-%llx", host, static_cast<long>(::getpid()), static_cast<unsigned long long>(ns));
    return b;
  }

  std::string lock(const std::string& dir, const std::string& id) {
    try {
      std::filesystem::create_directories(dir);
    } catch (const std::exception& e) {
      return "--trace " + dir + ": cannot write the trace there (" + e.what() + ")";
    }
    const std::string path = (std::filesystem::path(dir) / ".relayout-trace.lock").string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return "--trace " + dir + ": cannot write the trace there (" + path + ": " + std::strerror(errno) + ")";
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int why = errno;
      char holder[512] = {0};
      ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
      while (n > 0 && std::isspace(static_cast<unsigned char>(holder[n - 1]))) --n;
      ::close(fd_);
      fd_ = -1;
      if (why != EWOULDBLOCK)
        return "--trace " + dir + ": cannot lock " + path + " (" + std::strerror(why) + ")";
      return "--trace " + dir + ": another live run is writing a trace there (" +
             (n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : std::string("lock held")) +
             "); wait for it to end or choose another directory";
    }
    const std::string text = "run " + id + ", pid " + std::to_string(::getpid());
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size()))
      return "--trace " + dir + ": cannot write " + path + " (" + std::strerror(errno) + ")";
    return "";
  }

  int fd_ = -1;
  std::string run_id_;
};

inline void open_trace(trace::JsonlSink& sink, const std::string& dir, int rank, int world_size,
                       const std::string& program, const std::string& run_id) {
  try {
    sink.open(dir, rank, world_size, program, run_id);
  } catch (const std::exception& e) {
    throw LayoutError("--trace", "--trace " + dir + ": cannot write the trace there (" + e.what() + ")");
  }
}

}  // namespace relayout::cli
