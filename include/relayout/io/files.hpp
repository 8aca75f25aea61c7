// Files a run reads or writes, opened one way everywhere.
// Input: a regular file of at most the bytes its format needs, opened with O_NOFOLLOW (a symbolic
// link is refused, naming its target) and O_NONBLOCK (a FIFO is refused after fstat, never waited
// on); a directory or a device is refused too.
// Output: the destination is replaced whole: checked first (check_output, before the work), then
// written to a temporary file in its directory (mkostemp: O_CREAT | O_EXCL, so no link is followed),
// every write, the fsync and the close checked, then renamed over it. A failed write leaves the
// destination as it was and no file behind. Streaming writers (the trace's rank files) use
// create_new: an existing link or non-regular file is refused, a regular one replaced by a new file.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace relayout::io {

// A file refused or failed; the message names the path and the rule or the system's error, `code`
// is the errno behind it (0: a rule of this header).
class FileError : public std::runtime_error {
 public:
  FileError(const std::string& what, int code = 0) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// A descriptor, closed by the destructor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// What an input must be: `what` names it in messages ("a rank file"), `is` says what such a file is
// ("a regular file written by --trace"), `max_bytes` is the most its format needs.
struct InputRule {
  std::string what;
  std::string is;
  std::uintmax_t max_bytes = 0;
};

namespace impl {

inline std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "a special file";
}

// "a symbolic link (to TARGET)" when `path` is one, else "".
inline std::string link_at(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return "";
  std::error_code ec;
  const std::filesystem::path to = std::filesystem::read_symlink(path, ec);
  return ec ? std::string("a symbolic link") : "a symbolic link (to " + to.string() + ")";
}

inline std::string with_sep(std::uintmax_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(std::size_t(i), ",");
  return s;
}

}  // namespace impl

// Opens `path` for reading under `rule`; returns the descriptor and, in *size, the file's bytes.
// Throws FileError: missing or unreadable (the system's error), a symbolic link, not a regular
// file, or larger than rule.max_bytes. Never blocks: a FIFO is opened O_NONBLOCK and refused.
inline Fd open_input(const std::string& path, const InputRule& rule, std::uintmax_t* size = nullptr) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    const int err = errno;
    const std::string link = err == ELOOP ? impl::link_at(path) : "";
    if (!link.empty())
      throw FileError(path + ": " + link + ", not " + rule.what + ": an input is not read through a link; name the file itself",
                      err);
    throw FileError(path + ": cannot open (" + std::strerror(err) + ")", err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw FileError(path + ": cannot stat (" + std::strerror(errno) + ")", errno);
  if (!S_ISREG(st.st_mode))
    throw FileError(path + ": " + impl::kind_of(st.st_mode) + ", not " + rule.what + " (" + rule.what + " is " + rule.is + ")");
  if (std::uintmax_t(st.st_size) > rule.max_bytes)
    throw FileError(path + ": " + impl::with_sep(std::uintmax_t(st.st_size)) + " bytes, more than " + rule.what +
                    " may have (" + impl::with_sep(rule.max_bytes) + " bytes); not read");
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  if (size) *size = std::uintmax_t(st.st_size);
  return fd;
}

// An input file as a stream buffer: open_input's checks, then at most rule.max_bytes read (a file
// that grows past it reads as cut there: exceeded() says so). A read error ends the stream
// (error() names it).
class InputFile : public std::streambuf {
 public:
  InputFile(const std::string& path, const InputRule& rule) : path_(path), rule_(rule), fd_(open_input(path, rule, &size_)) {}
  std::uintmax_t size() const { return size_; }
  bool exceeded() const { return exceeded_; }
  const std::string& error() const { return error_; }
  // Throws FileError when the read failed or went past the limit.
  void check() const {
    if (!error_.empty()) throw FileError(path_ + ": read failed (" + error_ + ")");
    if (exceeded_)
      throw FileError(path_ + ": grew past " + impl::with_sep(rule_.max_bytes) + " bytes while read, more than " + rule_.what +
                      " may have; not read");
  }
  // The whole file (at most rule.max_bytes); throws FileError as check().
  std::string read_all() {
    std::string text;
    text.reserve(std::size_t(size_));
    while (underflow() != traits_type::eof()) {
      text.append(gptr(), egptr());
      setg(buf_.data(), egptr(), egptr());
    }
    check();
    return text;
  }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (read_ > rule_.max_bytes || !error_.empty()) return traits_type::eof();
    buf_.resize(1 << 16);
    ssize_t n;
    do n = ::read(fd_.get(), buf_.data(), buf_.size());
    while (n < 0 && errno == EINTR);
    if (n < 0) error_ = std::strerror(errno);
    if (n <= 0) return traits_type::eof();
    read_ += std::uintmax_t(n);
    if (read_ > rule_.max_bytes) {
      exceeded_ = true;
      return traits_type::eof();
    }
    setg(buf_.data(), buf_.data(), buf_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  std::string path_;
  InputRule rule_;
  std::uintmax_t size_ = 0, read_ = 0;
  Fd fd_;
  std::vector<char> buf_;
  bool exceeded_ = false;
  std::string error_;
};

// The whole of input `path` under `rule`; throws FileError.
inline std::string read_input(const std::string& path, const InputRule& rule) { return InputFile(path, rule).read_all(); }

// Writes all of `text` to `fd` (partial writes and EINTR retried); throws FileError naming `path`.
inline void write_all(int fd, std::string_view text, const std::string& path) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      throw FileError(path + ": cannot write (" + std::strerror(err) + ")", err);
    }
    text.remove_prefix(std::size_t(n));
  }
}

namespace impl {

// Refuses an existing destination that is not a regular file or is a symbolic link.
inline void check_replaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw FileError(path + ": " + std::strerror(errno), errno);
  }
  if (S_ISLNK(st.st_mode))
    throw FileError(path + ": " + link_at(path) + ": an output is not written through a link; remove it or name another file");
  if (!S_ISREG(st.st_mode))
    throw FileError(path + ": " + kind_of(st.st_mode) + ", not a file: an output is a regular file, new or replaced whole");
}

// A new temporary file beside `path` (O_EXCL: never a link); its name into *tmp.
inline Fd temp_beside(const std::string& path, std::string* tmp) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.parent_path().empty() ? std::filesystem::path(".") : p.parent_path();
  std::string name = (dir / ("." + p.filename().string() + ".tmp-XXXXXX")).string();
  Fd fd(::mkostemp(name.data(), O_CLOEXEC));
  if (fd.get() < 0)
    throw FileError(path + ": cannot create a file in " + dir.string() + " (" + std::strerror(errno) + ")", errno);
  const mode_t mask = ::umask(0);  // mkostemp makes 0600: give the mode a plain create would
  ::umask(mask);
  ::fchmod(fd.get(), 0666 & ~mask);
  *tmp = name;
  return fd;
}

}  // namespace impl

// Whether `path` can take an output, before the work: a new or a regular file (not a link, a
// directory, a FIFO or a device) in a directory where a file can be created (tried). Throws FileError.
inline void check_output(const std::string& path) {
  if (path.empty() || path.back() == '/') throw FileError("'" + path + "': not a file name");
  impl::check_replaceable(path);
  std::string tmp;
  Fd fd = impl::temp_beside(path, &tmp);
  ::unlink(tmp.c_str());
}

// Replaces `path` whole by `text`: check_output's rules, a temporary file beside it, every write,
// the fsync and the close checked, then renamed. On failure the temporary file is removed and
// `path` is as it was. Throws FileError.
inline void write_output(const std::string& path, std::string_view text) {
  impl::check_replaceable(path);
  std::string tmp;
  Fd fd = impl::temp_beside(path, &tmp);
  try {
    write_all(fd.get(), text, path);
    if (::fsync(fd.get()) != 0 && errno != EINVAL)
      throw FileError(path + ": cannot write (fsync: " + std::strerror(errno) + ")", errno);
    if (::close(fd.release()) != 0) throw FileError(path + ": cannot write (close: " + std::strerror(errno) + ")", errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw FileError(path + ": cannot replace it (" + std::strerror(errno) + ")", errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

// A new, empty file at `path` for a writer that appends as it goes: an existing regular file is
// removed first, an existing link or non-regular file refused; created O_EXCL | O_NOFOLLOW, so the
// file written is the one created here. Throws FileError.
inline Fd create_new(const std::string& path) {
  impl::check_replaceable(path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    throw FileError(path + ": cannot replace it (" + std::strerror(errno) + ")", errno);
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
  if (fd.get() < 0) throw FileError(path + ": cannot create it (" + std::strerror(errno) + ")", errno);
  return fd;
}

}  // namespace relayout::io
