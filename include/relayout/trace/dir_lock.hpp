// The lock of a trace directory: DIR/.relayout-trace.lock, held (flock) by the one process of a run
// that writes DIR, and naming that run. The kernel drops a flock when its process ends, so a crashed
// run leaves no stale lock. A run is refused DIR while a live run writes DIR, a directory inside it
// (up to a bounded depth and number of entries: live_run_under) or one it lies in (their files
// would mix); `relayout trace diff` reports a trace still being
// written as such instead of reading it half-way.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "relayout/io/files.hpp"

namespace relayout::trace {

inline constexpr const char* kLockFile = ".relayout-trace.lock";

// A live run: the directory whose lock it holds and the lock file's text ("run ID, pid P").
struct LiveRun {
  std::string dir;
  std::string holder;
};

namespace impl {

inline std::string lock_text(int fd) {
  char b[512] = {0};
  ssize_t n = ::pread(fd, b, sizeof b - 1, 0);
  while (n > 0 && std::isspace(static_cast<unsigned char>(b[n - 1]))) --n;
  return n > 0 ? std::string(b, static_cast<std::size_t>(n)) : std::string("lock held");
}

// The live run holding the lock file of `dir`, if any. The probe takes a shared lock for an instant,
// so a run starting at that moment retries (DirLock::acquire) rather than seeing a live run. A lock
// that is a link or not a regular file is no run's lock: never followed, never waited on (a FIFO).
inline std::optional<LiveRun> holder_of(const std::filesystem::path& dir) {
  const std::string path = (dir / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return std::nullopt;
  }
  std::optional<LiveRun> live;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) live = LiveRun{dir.string(), lock_text(fd)};
  } else {
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return live;
}

inline std::filesystem::path full_path(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec);
  return ec ? std::filesystem::path(dir) : p;
}

}  // namespace impl

// The live run writing `dir` or a directory it lies in; nullopt when none.
inline std::optional<LiveRun> live_run_over(const std::string& dir) {
  std::filesystem::path p = impl::full_path(dir);
  for (;;) {
    if (auto live = impl::holder_of(p)) return live;
    if (!p.has_parent_path() || p.parent_path() == p) return std::nullopt;
    p = p.parent_path();
  }
}

// How far live_run_under looks below a directory: directories at most kLockSearchDepth levels
// down (DIR/a/b/c/d), and at most kLockSearchEntries entries (files and directories) in all. The
// walk runs on rank 0 while the other ranks wait for it under the collective deadline, so a trace
// directory inside a large tree (--trace /tmp, a home directory) must not take long: trace
// directories nest a level or two (dspark_step writes DIR/target and DIR/draft), and a live run
// deeper or further on than that is not seen.
inline constexpr int kLockSearchDepth = 4;
inline constexpr std::size_t kLockSearchEntries = 10000;

struct LockSearch {
  int depth = kLockSearchDepth;
  std::size_t entries = kLockSearchEntries;
};

// The live run writing a directory inside `dir` (not `dir` itself), within `bound`; nullopt when
// none. `visited`, when given, gets the number of entries looked at (at most bound.entries).
// Unreadable directories are skipped; symbolic links to directories are not followed.
inline std::optional<LiveRun> live_run_under(const std::string& dir, LockSearch bound = {}, std::size_t* visited = nullptr) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::size_t seen = 0;
  std::optional<LiveRun> live;
  fs::recursive_directory_iterator it(impl::full_path(dir), fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator() && seen < bound.entries; it.increment(ec)) {
    ++seen;
    std::error_code type_ec;
    if (!it->is_directory(type_ec) || it->is_symlink(type_ec)) continue;
    if ((live = impl::holder_of(it->path()))) break;
    if (it.depth() + 1 >= bound.depth) it.disable_recursion_pending();  // its entries would be deeper
  }
  if (visited) *visited = seen;
  return live;
}

// This process's hold on a trace directory; released by the destructor (or the process's end).
class DirLock {
 public:
  DirLock() = default;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock() { release(); }

  // Creates `dir` if needed and takes its lock for run `id`. Returns "" when held, else why not:
  // a live run writes `dir`, a directory around it or one inside it (named, with its holder's
  // text), a lock file that is a link, not a regular file or shares its data with another name
  // (never written through), or a file-system error. Throws std::filesystem::filesystem_error when
  // `dir` cannot be created.
  std::string acquire(const std::string& dir, const std::string& id) {
    release();
    std::filesystem::create_directories(dir);
    const std::string path = (std::filesystem::path(dir) / kLockFile).string();
    if (std::string why = open_lock(path); !why.empty()) return why;
    // A probe (holder_of) holds the lock for microseconds: retry for a moment before refusing.
    int rc = -1, why = 0;
    for (int attempt = 0; attempt < 25 && rc != 0; ++attempt) {
      rc = ::flock(fd_, LOCK_EX | LOCK_NB);
      why = errno;
      if (rc != 0 && why == EWOULDBLOCK) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (rc != 0 && why != EWOULDBLOCK) break;
    }
    if (rc != 0) {
      const std::string holder = impl::lock_text(fd_);
      release();
      if (why != EWOULDBLOCK) return "cannot lock " + path + " (" + std::strerror(why) + ")";
      return "another live run is writing a trace there (" + holder + "); wait for it to end or choose another directory";
    }
    const std::string text = "run " + id + ", pid " + std::to_string(::getpid());
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size())) {
      const std::string e = std::strerror(errno);
      release();
      return "cannot write " + path + " (" + e + ")";
    }
    // Held first, checked second: of two runs starting at once in nested directories, at least
    // one sees the other.
    const std::string parent = impl::full_path(dir).parent_path().string();
    std::optional<LiveRun> other = live_run_over(parent);
    const char* where = "around it";
    if (!other) {
      other = live_run_under(dir);
      where = "inside it";
    }
    if (other) {
      release();
      return "another live run is writing a trace in " + other->dir + ", " + where + " (" + other->holder +
             "); its files and this run's would mix: wait for it to end or choose a directory outside it";
    }
    return "";
  }
  void release() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
    fd_ = -1;
  }

 private:
  // Opens (creating it if missing) the lock file into fd_: O_NOFOLLOW, O_NONBLOCK (a FIFO is refused
  // after fstat, not waited on), a regular file of one link. Returns "" or why not.
  std::string open_lock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int err = errno;
      const std::string link = err == ELOOP ? io::impl::link_at(path) : "";
      if (!link.empty())
        return path + " is " + link + ": a run never writes through a link it did not create; remove it";
      return "cannot write the trace there (" + path + ": " + std::strerror(err) + ")";
    }
    struct stat st {};
    std::string why;
    if (::fstat(fd_, &st) != 0)
      why = "cannot write the trace there (" + path + ": " + std::strerror(errno) + ")";
    else if (!S_ISREG(st.st_mode))
      why = path + " is " + io::impl::kind_of(st.st_mode) + ", not a lock file (a regular file a run creates); remove it";
    else if (st.st_nlink > 1)
      why = path + " has " + std::to_string(st.st_nlink) +
            " hard links: a run never writes a file another name shares; remove it";
    if (!why.empty()) release();
    return why;
  }

  int fd_ = -1;
};

}  // namespace relayout::trace
