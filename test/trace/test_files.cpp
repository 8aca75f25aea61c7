// Files read and written one way (relayout/io/files.hpp), the trace's lock and rank files on it:
// no FIFO waited on, no link followed or written through, a size limit before reading, every
// write checked with the destination left as it was.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "relayout/io/files.hpp"
#include "relayout/trace/dir_lock.hpp"
#include "relayout/trace/jsonl.hpp"
#include "relayout/trace/jsonl_reader.hpp"

namespace fs = std::filesystem;
using namespace relayout;

namespace {

// A fresh directory of its own under the system's temporary directory.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "relayout-files-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
void put(const std::string& p, const std::string& text) { std::ofstream(p) << text; }

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Files beside `p` whose names start with "." + p's name (the temporary files of write_output).
int temps_beside(const fs::path& p) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    n += e.path().filename().string().rfind("." + p.filename().string(), 0) == 0;
  return n;
}

// The file size limit (RLIMIT_FSIZE) lowered for the scope, SIGXFSZ ignored: writes past it fail
// with EFBIG, as on a full file system.
struct FileSizeLimit {
  rlimit old{};
  explicit FileSizeLimit(rlim_t bytes) {
    ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &old); }
};

const io::InputRule kRule{"a test file", "a regular file", 1000};

}  // namespace

TEST_CASE("open_input: a regular file within the limit, nothing else, and never a wait") {
  TempDir d;
  put(d / "ok", "hello");
  CHECK(io::read_input(d / "ok", kRule) == "hello");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);  // no writer: a blocking open would hang here
  CHECK(error_of([&] { io::read_input(d / "fifo", kRule); }) ==
        d / "fifo" + ": a FIFO, not a test file (a test file is a regular file)");
  CHECK(error_of([&] { io::read_input(d.path.string(), kRule); }) ==
        d.path.string() + ": a directory, not a test file (a test file is a regular file)");
  CHECK(error_of([&] { io::read_input("/dev/zero", kRule); }) ==
        "/dev/zero: a device, not a test file (a test file is a regular file)");
  fs::create_symlink("ok", d / "link");
  CHECK(error_of([&] { io::read_input(d / "link", kRule); }) ==
        d / "link" + ": a symbolic link (to ok), not a test file: an input is not read through a link; name the file itself");
  put(d / "big", std::string(1001, 'x'));
  CHECK(error_of([&] { io::read_input(d / "big", kRule); }) ==
        d / "big" + ": 1,001 bytes, more than a test file may have (1,000 bytes); not read");
  try {
    io::read_input(d / "missing", kRule);
    FAIL("a missing file was read");
  } catch (const io::FileError& e) {
    CHECK(e.code() == ENOENT);
  }
}

TEST_CASE("write_output: replaced whole; a failed write leaves the file as it was and nothing beside it") {
  TempDir d;
  const std::string out = d / "out.json";
  io::write_output(out, "first");
  CHECK(slurp(out) == "first");
  io::write_output(out, "second");
  CHECK(slurp(out) == "second");
  CHECK(temps_beside(out) == 0);
  {
    const FileSizeLimit limit(4096);
    const std::string e = error_of([&] { io::write_output(out, std::string(10000, 'x')); });
    CHECK(e == out + ": cannot write (File too large)");
  }
  CHECK(slurp(out) == "second");
  CHECK(temps_beside(out) == 0);
}

TEST_CASE("check_output: a new or regular file only, in a directory that takes one") {
  TempDir d;
  CHECK_NOTHROW(io::check_output(d / "new.json"));
  CHECK_FALSE(fs::exists(d / "new.json"));
  CHECK(temps_beside(d / "new.json") == 0);
  CHECK(error_of([&] { io::check_output(d.path.string()); }) ==
        d.path.string() + ": a directory, not a file: an output is a regular file, new or replaced whole");
  CHECK(error_of([&] { io::check_output("/dev/full"); }) ==
        "/dev/full: a device, not a file: an output is a regular file, new or replaced whole");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  CHECK(error_of([&] { io::check_output(d / "fifo"); }) ==
        d / "fifo" + ": a FIFO, not a file: an output is a regular file, new or replaced whole");
  put(d / "victim", "mine");
  fs::create_symlink(d / "victim", d / "link");
  CHECK(error_of([&] { io::write_output(d / "link", "theirs"); }) ==
        d / "link" + ": a symbolic link (to " + d / "victim" + "): an output is not written through a link; remove it or name another file");
  CHECK(slurp(d / "victim") == "mine");
  CHECK(error_of([&] { io::check_output(d / "no/such/dir.json"); }).rfind(d / "no/such/dir.json: cannot create a file in", 0) == 0);
}

TEST_CASE("create_new: a link or FIFO refused, a regular file replaced by a new one") {
  TempDir d;
  put(d / "victim", "mine");
  fs::create_symlink(d / "victim", d / "rank0.jsonl");
  CHECK_THROWS_AS(io::create_new(d / "rank0.jsonl"), io::FileError);
  CHECK(slurp(d / "victim") == "mine");
  put(d / "old", "old text");
  fs::create_hard_link(d / "old", d / "other_name");
  { io::Fd fd = io::create_new(d / "old"); }
  CHECK(fs::file_size(d / "old") == 0);
  CHECK(slurp(d / "other_name") == "old text");  // the other name keeps its data
}

TEST_CASE("the trace's lock file: never written through a link, a FIFO refused, not waited on") {
  TempDir d;
  const std::string lock = d / trace::kLockFile;
  put(d / "victim", "mine");
  fs::create_symlink(d / "victim", lock);
  trace::DirLock l;
  CHECK(l.acquire(d.path.string(), "r1") ==
        lock + " is a symbolic link (to " + d / "victim" + "): a run never writes through a link it did not create; remove it");
  CHECK(slurp(d / "victim") == "mine");
  fs::remove(lock);
  fs::create_hard_link(d / "victim", lock);
  CHECK(l.acquire(d.path.string(), "r1") == lock + " has 2 hard links: a run never writes a file another name shares; remove it");
  CHECK(slurp(d / "victim") == "mine");
  fs::remove(lock);
  REQUIRE(::mkfifo(lock.c_str(), 0600) == 0);
  CHECK(l.acquire(d.path.string(), "r1") == lock + " is a FIFO, not a lock file (a regular file a run creates); remove it");
  CHECK_FALSE(trace::live_run_over(d.path.string()).has_value());  // the probe does not wait either
  fs::remove(lock);
  CHECK(l.acquire(d.path.string(), "r1") == "");
}

TEST_CASE("JsonlSink: a linked rank file refused; a failed write reported at close") {
  TempDir d;
  put(d / "victim", "mine");
  fs::create_symlink(d / "victim", d / "rank0.jsonl");
  trace::JsonlSink sink;
  const std::string e = error_of([&] { sink.open(d.path.string(), 0, 1, "test"); });
  CHECK(e.rfind("trace: " + d / "rank0.jsonl" + ": a symbolic link (to ", 0) == 0);
  CHECK(slurp(d / "victim") == "mine");
  fs::remove(d / "rank0.jsonl");
  const FileSizeLimit limit(100);
  sink.open(d.path.string(), 0, 1, "test");
  trace::Record r;
  r.boundary = "b";
  r.state = "attn_out";
  for (int i = 0; i < 10; ++i) sink.write(r);
  CHECK(error_of([&] { sink.close(); }) ==
        "trace: cannot write " + d / "rank0.jsonl" + " (File too large); the trace is incomplete");
}
