// The programs' progress lines (apps/common/progress.hpp): fed by the model's boundary records, a
// long run reports its estimate up front, each layer forward with the time left, and, while one
// layer forward takes long, where it is (from a thread of the sink's, since no record may come for
// minutes). The lines are read back from a file; the times in them are matched as numbers, never
// compared with a bound.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/progress.hpp"

using namespace relayout;

namespace {

std::vector<std::string> lines_of(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::vector<std::string> out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) {
    std::string l(buf);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    out.push_back(l);
  }
  return out;
}

trace::Record record(const char* boundary, const char* state) {
  trace::Record r;
  r.boundary = boundary;
  r.state = state;
  return r;
}

}  // namespace

TEST_CASE("progress: the estimate first, then each layer forward with the time left") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    cli::RunSink sink;
    sink.out = f;
    sink.quiet_s = 1e6;  // no line of the heartbeat's in this test
    sink.every_s = 0;    // a line for every forward done
    CHECK_FALSE(sink.active());  // no file, no progress: the model builds no records
    sink.show_progress("dsv4_layer", 3, 4.5e10);
    CHECK(sink.active());
    sink.write(record("split_rows", "attn_out"));  // inside a forward: no line of its own
    for (int i = 0; i < 4; ++i) sink.write(record("layer output", "layer_out"));  // the 4th is beyond the total
  }
  const std::vector<std::string> l = lines_of(f);
  std::fclose(f);
  REQUIRE(l.size() == 4);
  CHECK(l[0] == "dsv4_layer: a long run (3 layer forwards); progress follows, about 45 GFLOP per rank");
  const std::string n = "[0-9]+\\.[0-9]";
  CHECK(std::regex_match(l[1], std::regex("dsv4_layer: layer 1/3 done, " + n + " s, about [0-9]+ s left")));
  CHECK(std::regex_match(l[2], std::regex("dsv4_layer: layer 2/3 done, " + n + " s, about [0-9]+ s left")));
  CHECK(std::regex_match(l[3], std::regex("dsv4_layer: layer 3/3 done, " + n + " s")));
}

TEST_CASE("progress: many quick layer forwards get the first and the last line, not one each") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    cli::RunSink sink;
    sink.out = f;
    sink.quiet_s = 1e6;
    sink.every_s = 1e6;  // every line but the first and the last falls inside the interval
    sink.show_progress("dspark_step target", 402, 9e8);
    for (int i = 0; i < 402; ++i) sink.write(record("layer output", "layer_out"));
  }
  const std::vector<std::string> l = lines_of(f);
  std::fclose(f);
  REQUIRE(l.size() == 3);
  CHECK(std::regex_match(l[1], std::regex("dspark_step target: layer 1/402 done, .* s left")));
  CHECK(std::regex_match(l[2], std::regex("dspark_step target: layer 402/402 done, [0-9.]+ s")));
}

TEST_CASE("progress: a layer forward that takes long says where it is, with no record arriving") {
  char path[] = "/tmp/relayout_progress_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::FILE* f = ::fdopen(fd, "w");
  REQUIRE(f != nullptr);
  std::vector<std::string> l;
  {
    cli::RunSink sink;
    sink.out = f;
    sink.quiet_s = 0.01;
    sink.show_progress("dspark_step target", 2, 3e10);
    sink.write(record("dp_gather", "moe_in"));
    // Until the heartbeat's first line is there (it comes after quiet_s; the wait has no bound of its own).
    while (l.size() < 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::FILE* r = std::fopen(path, "r");
      REQUIRE(r != nullptr);
      l = lines_of(r);
      std::fclose(r);
    }
  }
  std::fclose(f);
  std::remove(path);
  CHECK(l[0] == "dspark_step target: a long run (2 layer forwards); progress follows, about 30 GFLOP per rank");
  CHECK(std::regex_match(l[1], std::regex("dspark_step target: in layer 1/2 \\(after boundary dp_gather\\), [0-9]+\\.[0-9] s")));
}
