// Row-ownership trace: the checksum's float-noise tolerance, the JSON Lines round trip, and the exit
// codes of `relayout trace diff` on hand-made traces (agree, diverge, truncated, missing).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli/commands.hpp"
#include "cli/trace_diff.hpp"
#include "relayout/trace.hpp"

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout;
namespace fs = std::filesystem;

namespace {

std::vector<float> row(int H, float scale = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(H));
  for (int f = 0; f < H; ++f) v[std::size_t(f)] = scale * std::sin(0.7f * float(f) + 0.3f);
  return v;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("relayout_trace_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  return d;
}

trace::Record record(int layer, const std::string& boundary, const std::string& state, int copies, int rank,
                     const std::vector<std::vector<float>>& values) {
  trace::Record r;
  r.layer = layer;
  r.boundary = boundary;
  r.state = state;
  r.copies = copies;
  r.global_rank = rank;
  r.attn_tp_rank = rank;
  r.group = "attn_tp";
  r.handle = 1;
  r.hidden = int(values.front().size());
  r.row_count = std::int64_t(values.size());
  r.global_num_tokens = {std::int64_t(values.size())};
  for (std::size_t i = 0; i < values.size(); ++i)
    r.rows.push_back({0, int(i), 0, true, trace::row_sum(values[i].data(), r.hidden)});
  return r;
}

// A run of `ranks` ranks, each holding every row (replicated, copies = ranks), at two boundaries.
void write_run(const fs::path& dir, int ranks, float scale_at_second = 1.0f, int bad_rank = -1) {
  const std::vector<std::vector<float>> rows{row(16), row(16, 0.5f), row(16, 2.0f)};
  std::vector<std::vector<float>> changed = rows;
  for (auto& v : changed)
    for (float& x : v) x *= scale_at_second;
  for (int r = 0; r < ranks; ++r) {
    trace::JsonlSink sink(dir.string(), r, ranks, "test");
    sink.write(record(0, "attention all_reduce", "attn_out", ranks, r, rows));
    sink.write(record(0, "layer output", "layer_out", ranks, r, bad_rank < 0 || bad_rank == r ? changed : rows));
  }
}

int diff(const fs::path& b, const fs::path& c, std::string* out_text = nullptr, std::string* err_text = nullptr) {
  std::ostringstream out, err;
  const std::string bs = b.string(), cs = c.string();
  const char* argv[] = {"relayout", "trace", "diff", bs.c_str(), cs.c_str()};
  const int rc = cli::relayout_command(5, argv, out, err);
  if (out_text) *out_text = out.str();
  if (err_text) *err_text = err.str();
  return rc;
}

}  // namespace

TEST_CASE("checksums agree within float noise and differ on layout bugs") {
  const int H = 64;
  const std::vector<float> v = row(H);
  const trace::RowSum a = trace::row_sum(v.data(), H);
  std::vector<float> noisy = v;
  for (int f = 0; f < H; ++f) noisy[std::size_t(f)] *= 1.0f + ((f % 2) ? 3e-6f : -3e-6f);  // reordering noise
  CHECK(trace::checksums_agree(a, trace::row_sum(noisy.data(), H), H));

  const std::vector<float> doubled = row(H, 2.0f);  // double reduction
  CHECK_FALSE(trace::checksums_agree(a, trace::row_sum(doubled.data(), H), H));
  const std::vector<float> slightly = row(H, 1.01f);  // 1 % off: above rtol 1e-3
  CHECK_FALSE(trace::checksums_agree(a, trace::row_sum(slightly.data(), H), H));

  std::vector<float> swapped = v;  // same sum and l2, features moved: wsum catches it
  std::swap(swapped[0], swapped[5]);
  CHECK_FALSE(trace::checksums_agree(a, trace::row_sum(swapped.data(), H), H));

  trace::RowSum nan = a;
  nan.sum = std::nan("");
  CHECK_FALSE(trace::checksums_agree(a, nan, H));

  // Partial rows: sum and wsum add up; l2 does not, so it is left out.
  std::vector<float> half = row(H, 0.5f);
  trace::RowSum p = trace::row_sum(half.data(), H), total = p;
  total.sum += p.sum;
  total.wsum += p.wsum;
  CHECK(trace::checksums_agree(a, total, H, {}, false));
  CHECK_FALSE(trace::checksums_agree(a, total, H, {}, true));
}

TEST_CASE("NullSink is compiled out; JsonlSink round-trips a record") {
  static_assert(!trace::NullSink::enabled && trace::JsonlSink::enabled);
  const fs::path dir = fresh_dir("roundtrip");
  trace::Record r = record(3, "reduce_scatterv", "moe_out", 1, 0, {row(8), row(8, -1.5f)});
  r.sharing = RowState::partial;
  r.pad_rows = 2;
  r.row_count = 4;
  r.group = "tp";
  r.handle = 0;
  r.global_num_tokens = {14, 10};
  r.scaled_global_num_tokens = {28, 20};
  r.rows[1].step = 2;
  r.rows[1].sum.l2 = std::nan("");  // non-finite values are written as null and read back as NaN
  r.error = "row \"conservation\"\nbroken";
  trace::Record unseen = r;  // a boundary whose values this rank does not see: no checksums
  unseen.rows = {{5, 7, 1, false, {}}};
  unseen.row_count = 3;
  {
    trace::JsonlSink sink(dir.string(), 0, 1, "test");
    CHECK(sink.active());
    sink.write(r);
    sink.write(unseen);
  }
  const cli::TraceRun run = cli::read_trace(dir.string());
  REQUIRE(run.world_size == 1);
  REQUIRE(run.ranks.at(0).records.size() == 2);
  const trace::Record& b = run.ranks[0].records[0];
  CHECK(b.layer == 3);
  CHECK(b.boundary == "reduce_scatterv");
  CHECK(b.state == "moe_out");
  CHECK(b.sharing == RowState::partial);
  CHECK(b.group == "tp");
  CHECK(b.handle == 0);
  CHECK(b.row_count == 4);
  CHECK(b.pad_rows == 2);
  CHECK(b.hidden == 8);
  CHECK(b.global_num_tokens == std::vector<std::int64_t>{14, 10});
  CHECK(b.scaled_global_num_tokens == std::vector<std::int64_t>{28, 20});
  CHECK(b.error == r.error);
  REQUIRE(b.rows.size() == 2);
  CHECK(b.rows[0].sum.sum == r.rows[0].sum.sum);  // %.17g: bit-exact
  CHECK(b.rows[0].sum.wsum == r.rows[0].sum.wsum);
  CHECK(b.rows[1].step == 2);
  CHECK(std::isnan(b.rows[1].sum.l2));
  const trace::Record& u = run.ranks[0].records[1];
  REQUIRE(u.rows.size() == 1);
  CHECK_FALSE(u.rows[0].has_sum);
  CHECK(u.rows[0].request == 5);
  CHECK(u.rows[0].position == 7);
}

TEST_CASE("trace diff: 0 agree (across layouts), 1 diverge, 2 unreadable") {
  const fs::path base = fresh_dir("base"), wide = fresh_dir("wide"), bad = fresh_dir("bad"),
                 one_bad = fresh_dir("one_bad"), cut = fresh_dir("cut");
  write_run(base, 1);
  write_run(wide, 4);  // another layout, same rows: agree
  std::string out, err;
  CHECK(diff(base, wide, &out) == 0);
  CHECK(out.find("traces agree") != std::string::npos);

  write_run(bad, 2, 2.0f);  // every row doubled at the layer output
  CHECK(diff(base, bad, &out) == 1);
  CHECK(out.find("first divergence: layer 0, boundary \"layer output\"") != std::string::npos);
  CHECK(out.find("row: request A (id 0), position 0, step 0") != std::string::npos);

  write_run(one_bad, 2, 1.5f, 1);  // only rank 1's copy is wrong: it is named
  CHECK(diff(base, one_bad, &out) == 1);
  CHECK(out.find("rank 1: sum=") != std::string::npos);
  CHECK(out.find("<- differs") != std::string::npos);

  // A row held by too few ranks: count, not values.
  {
    const fs::path few = fresh_dir("few");
    write_run(few, 2);
    trace::JsonlSink sink(few.string(), 1, 2, "test");  // rank 1 rewritten with one row missing
    trace::Record r = record(0, "attention all_reduce", "attn_out", 2, 1, {row(16), row(16, 0.5f), row(16, 2.0f)});
    r.rows.pop_back();
    r.row_count = 2;
    sink.write(r);
    sink.write(record(0, "layer output", "layer_out", 2, 1, {row(16), row(16, 0.5f), row(16, 2.0f)}));
    sink.close();
    CHECK(diff(base, few, &out) == 1);
    CHECK(out.find("boundary \"attention all_reduce\"") != std::string::npos);
    CHECK(out.find("position 2") != std::string::npos);
    CHECK(out.find("expected: count 2") != std::string::npos);
  }

  // Truncated: the last record cut in the middle of its line.
  write_run(cut, 2);
  const fs::path f = cut / "rank1.jsonl";
  std::ifstream in(f);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::size_t third = all.find('\n', all.find('\n') + 1);
  std::ofstream(f, std::ios::trunc) << all.substr(0, third + 40);
  CHECK(diff(base, cut, &out, &err) == 2);
  CHECK(err.find("rank1.jsonl:3: invalid JSON") != std::string::npos);

  // Cut at a line boundary: no end line.
  std::ofstream(f, std::ios::trunc) << all.substr(0, third + 1);
  CHECK(diff(base, cut, &out, &err) == 2);
  CHECK(err.find("rank1.jsonl:2: the trace ends without its end line") != std::string::npos);
  // A partial trace: where each rank stopped, never compared.
  CHECK(err.find("is a partial trace") != std::string::npos);
  CHECK(err.find("rank 0: layer 0 \"layer output\", step 0 (record 2, then its end line)") != std::string::npos);
  CHECK(err.find("rank 1: layer 0 \"attention all_reduce\", step 0 (record 1, then the file ends)") != std::string::npos);
  CHECK(out.find("agree") == std::string::npos);

  fs::remove(f);  // a rank file missing
  CHECK(diff(base, cut, &out, &err) == 2);
  CHECK(err.find("rank1.jsonl: cannot open") != std::string::npos);

  CHECK(diff(base, base / "nowhere", &out, &err) == 2);
  CHECK(err.find("not a trace directory") != std::string::npos);
  fs::remove_all(base.parent_path());
}

TEST_CASE("trace::Tracked: typed rows with one owner per row, or none; any other count is a LayoutError") {
  using R = Rows<float, Replicated<AttnTp>, DpLocal>;
  const R::view_type v("v", 3, 2);
  const trace::Tracked<R> untracked(R{v});
  CHECK(untracked.count() == 3);
  CHECK(untracked.owners.empty());
  const std::vector<std::int64_t> own{trace::RowOwner::pack(0, 0), trace::RowOwner::pack(0, 1), trace::RowOwner::kPad};
  const trace::Tracked<R> tracked(R{v}, own);
  CHECK(tracked.owners == own);
  CHECK(tracked.view().data() == v.data());  // the same rows, not a copy
  CHECK(trace::Tracked<R>().count() == 0);
  CHECK_THROWS_WITH_AS(trace::Tracked<R>(R{v}, {1, 2}), doctest::Contains("2 owners for 3 rows"), LayoutError);
}

// Steps of one run may take different plans: under automatic padding a step's sum is
// "dp_reduce_scatter" (max_len) or "reduce_scatterv" (sum_len), each holding only the rows of the
// steps that ran it. Each step's rows are judged at the boundary that step ran; a step that ran no
// boundary of that state is not excused.
TEST_CASE("trace diff: steps that take different plans are each judged at their own boundary") {
  const std::vector<std::vector<float>> rows{row(16), row(16, 0.5f)};
  // Step s holds rows (request 0, position s*2 + i); `sums[s]` names its moe_out boundary ("" none).
  const auto write = [&](const fs::path& dir, int ranks, const std::vector<std::string>& sums, int drop_at_step = -1) {
    for (int r = 0; r < ranks; ++r) {
      trace::JsonlSink sink(dir.string(), r, ranks, "test");
      for (int s = 0; s < int(sums.size()); ++s) {
        const auto at_step = [&](trace::Record rec) {
          for (std::size_t i = 0; i < rec.rows.size(); ++i) {
            rec.rows[i].position = s * 2 + int(i);
            rec.rows[i].step = s;
          }
          return rec;
        };
        sink.write(at_step(record(0, "attention all_reduce", "attn_out", ranks, r, rows)));
        if (!sums[std::size_t(s)].empty()) {
          trace::Record m = at_step(record(0, sums[std::size_t(s)], "moe_out", ranks, r, rows));
          if (s == drop_at_step) {
            m.rows.pop_back();
            m.row_count = 1;
          }
          sink.write(m);
        }
        sink.write(at_step(record(0, "layer output", "layer_out", ranks, r, rows)));
      }
    }
  };
  const fs::path base = fresh_dir("plans_base"), mixed = fresh_dir("plans_mixed"), none = fresh_dir("plans_none"),
                 lost = fresh_dir("plans_lost");
  write(base, 1, {"all_reduce", "all_reduce", "all_reduce"});
  std::string out;

  write(mixed, 2, {"dp_reduce_scatter", "reduce_scatterv", "dp_reduce_scatter"});
  CHECK(diff(base, mixed, &out) == 0);
  // attention all_reduce, dp_reduce_scatter, reduce_scatterv, layer output; 2 rows x 3 steps at the
  // two ends, 4 rows at dp_reduce_scatter (steps 0 and 2) and 2 at reduce_scatterv (step 1).
  CHECK(out.find("traces agree: 4 boundaries over 1 layer compared, 18 row checksums") != std::string::npos);
  // A multi-rank baseline that switches too.
  CHECK(diff(mixed, base, &out) == 0);

  write(none, 2, {"dp_reduce_scatter", "", "dp_reduce_scatter"});  // step 1 never sums
  CHECK(diff(base, none, &out) == 1);
  CHECK(out.find("boundary \"dp_reduce_scatter\"") != std::string::npos);
  CHECK(out.find("row: request A (id 0), position 2, step 1") != std::string::npos);
  CHECK(out.find("found:    count 0") != std::string::npos);

  write(lost, 2, {"dp_reduce_scatter", "reduce_scatterv", "dp_reduce_scatter"}, 1);  // step 1 loses a row
  CHECK(diff(base, lost, &out) == 1);
  CHECK(out.find("boundary \"reduce_scatterv\"") != std::string::npos);
  CHECK(out.find("row: request A (id 0), position 3, step 1") != std::string::npos);
  fs::remove_all(base.parent_path());
}

// A sink that follows the boundaries only (progress): records come with their rows, without sums.
struct BoundariesOnlySink : trace::MemorySink {
  bool sums = false;
  bool wants_sums() const { return sums; }
};

TEST_CASE("trace::Recorder: a sink that wants no sums gets the rows without them") {
  using Comm = SingleRankCommunicator;
  const ProcessGroupsOf<Comm> groups(RuntimeLayout({.tp = 1}), Comm{});
  Kokkos::View<float**, Kokkos::HostSpace> v("v", 2, 4);
  Kokkos::deep_copy(v, 0.5f);
  const std::vector<std::int64_t> owners{trace::RowOwner::pack(0, 0), trace::RowOwner::pack(0, 1)};
  BoundariesOnlySink sink;
  static_assert(trace::TraceSink<BoundariesOnlySink>);
  trace::Recorder<Comm, BoundariesOnlySink> rec(groups, &sink);
  rec.layer_output(0, owners, v);
  sink.sums = true;
  rec.layer_output(1, owners, v);
  REQUIRE(sink.records.size() == 2);
  REQUIRE(sink.records[0].rows.size() == 2);
  CHECK(sink.records[0].row_count == 2);
  CHECK_FALSE(sink.records[0].rows[0].has_sum);
  CHECK_FALSE(sink.records[0].rows[1].has_sum);
  REQUIRE(sink.records[1].rows.size() == 2);
  CHECK(sink.records[1].rows[1].has_sum);
  CHECK(sink.records[1].rows[1].sum.sum == within_rel(2.0, 1e-9));  // 4 x 0.5
}

TEST_CASE("trace::Recorder: an engine's own boundaries become records trace diff reads, counts optional") {
  using Comm = SingleRankCommunicator;
  const ProcessGroupsOf<Comm> groups(RuntimeLayout({.tp = 1}), Comm{});
  const int H = 8;
  Kokkos::View<double**, Kokkos::HostSpace> v("v", 3, H);  // double rows: no float-only path
  for (int i = 0; i < 3; ++i)
    for (int f = 0; f < H; ++f) v(i, f) = 0.25 * (i + 1) + 0.01 * f;
  const std::vector<std::int64_t> owners{trace::RowOwner::pack(0, 0), trace::RowOwner::kPad, trace::RowOwner::pack(1, 4)};
  trace::MemorySink sink;
  std::vector<std::string> seen;
  trace::Recorder<Comm, trace::MemorySink> rec(groups, &sink, nullptr,
                                               [&](int layer, std::string_view name, std::span<const std::int64_t> own) {
                                                 seen.push_back(std::to_string(layer) + " " + std::string(name) + " " +
                                                                std::to_string(own.size()));
                                               });
  rec.attention_output(2, owners, v);
  rec.layer_output(2, owners, v);
  rec.bridge_failed(2, "rows lost");
  const trace::Record& a = sink.records[0];
  CHECK(a.layer == 2);
  CHECK(a.boundary == "attention all_reduce");
  CHECK(a.state == "attn_out");
  CHECK(a.copies == 1);
  CHECK(a.group == "attn_tp");
  CHECK(a.handle == groups.handle_id(GroupKind::attn_tp));
  CHECK(a.row_count == 3);
  CHECK(a.pad_rows == 1);
  CHECK(a.hidden == H);
  CHECK(a.global_num_tokens.empty());  // not known: written empty
  REQUIRE(a.rows.size() == 2);
  CHECK(a.rows[1].request == 1);
  CHECK(a.rows[1].position == 4);
  double sum = 0;  // row 2 of v, summed here independently of row_sum
  for (int f = 0; f < H; ++f) sum += 0.75 + 0.01 * f;
  CHECK(a.rows[1].sum.sum == within_rel(sum, 1e-9));
  CHECK(sink.records[1].state == "layer_out");
  CHECK(sink.records[1].group.empty());
  CHECK(sink.records[2].error == "rows lost");
  // The hook sees the attention output only (the layer output repeats its rows).
  CHECK(seen == std::vector<std::string>{"2 attention all_reduce 3"});
  // Rows split over attn_tp (a scattered residual): named for the reduce_scatter, each row on one member.
  rec.attention_output(3, owners, v, {}, true);
  rec.bridge_input(3, owners, v, true);
  REQUIRE(sink.records.size() == 5);
  CHECK(sink.records[3].boundary == "attention reduce_scatter");
  CHECK(sink.records[3].sharing == RowState::row_shard);
  CHECK(sink.records[3].copies == 1);
  CHECK(sink.records[4].boundary == "bridge input");
  CHECK(sink.records[4].sharing == RowState::row_shard);
  CHECK(sink.records[1].sharing == RowState::replicated);

  // Written as JSON Lines, a one-rank run with empty global_num_tokens agrees with itself.
  const fs::path dir = fresh_dir("recorder");
  {
    trace::JsonlSink file(dir.string(), 0, 1, "engine");
    trace::Recorder<Comm, trace::JsonlSink> r2(groups, &file);
    r2.attention_output(0, owners, v);
    r2.layer_output(0, owners, v);
  }
  std::string out, err;
  CHECK(diff(dir, dir, &out, &err) == 0);
  CHECK(out.find("traces agree: 2 boundaries") != std::string::npos);
  fs::remove_all(dir.parent_path());
}

TEST_CASE("trace::DirLock: one live run per directory tree, named to the others") {
  const fs::path root = fresh_dir("locks");
  const std::string a = (root / "a").string(), sub = (root / "a" / "sub").string();
  trace::DirLock first, second;
  REQUIRE(first.acquire(a, "one") == "");
  CHECK(second.acquire(a, "two").find("another live run is writing a trace there (run one, pid ") == 0);
  const std::string child = second.acquire(sub, "two");  // inside a live run's directory
  CHECK(child.find("another live run is writing a trace in ") == 0);
  CHECK(child.find("/a, around it (run one, pid ") != std::string::npos);
  const auto over = trace::live_run_over(sub);
  REQUIRE(over.has_value());
  CHECK(over->holder.find("run one") == 0);
  first.release();
  CHECK(!trace::live_run_over(sub).has_value());  // the lock file stays, unheld: no live run
  REQUIRE(second.acquire(sub, "two") == "");
  const std::string parent = first.acquire(a, "one");  // around a live run's directory
  CHECK(parent.find("/a/sub, inside it (run two, pid ") != std::string::npos);
  second.release();
  CHECK(first.acquire(a, "one") == "");
  fs::remove_all(root.parent_path());
}

// A candidate wrong in every row, held by many ranks, after many boundaries that agreed, still gets
// a report of a few lines: at most 8 holders, ranks and agreed boundaries are listed, and the rest
// are counted ("... and K more"). K is computed here from how the traces were made.
TEST_CASE("trace diff: a report lists at most 8 holders, ranks and agreed boundaries, and counts the rest") {
  constexpr int kCap = 8;  // the listing cap the documentation promises
  const int ranks = 21, layers = 13, nrows = 300;
  std::vector<std::vector<float>> rows;
  for (int i = 0; i < nrows; ++i) rows.push_back(row(16, 1.0f + 0.01f * float(i)));
  std::vector<std::vector<float>> doubled = rows;
  for (auto& v : doubled)
    for (float& x : v) x *= 2.0f;
  // kind: "count" (the last layer adds a moe_in boundary, copies 1, where every rank holds every
  // row), "values" (the last layer's output doubled on every rank), "error" (every rank records a
  // failed invariant in the last layer).
  const auto write = [&](const fs::path& dir, int n, const std::string& kind) {
    for (int r = 0; r < n; ++r) {
      trace::JsonlSink sink(dir.string(), r, n, "test");
      for (int l = 0; l < layers; ++l) {
        const bool last = l == layers - 1;
        sink.write(record(l, "attention all_reduce", "attn_out", n, r, rows));
        if (last && kind == "count") {
          trace::Record g = record(l, "dp_gather", "moe_in", 1, r, rows);
          g.group = "tp";
          g.handle = 0;
          sink.write(g);
        }
        if (last && kind == "error") {
          trace::Record e = record(l, "split_rows", "moe_in", 1, r, rows);
          e.error = "row conservation failed";
          sink.write(e);
        }
        sink.write(record(l, "layer output", "layer_out", n, r, last && kind == "values" ? doubled : rows));
      }
    }
  };
  const auto lines_starting = [](const std::string& text, const std::string& prefix) {
    int n = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0;
    return n;
  };
  const auto line_count = [](const std::string& text) { return int(std::count(text.begin(), text.end(), '\n')); };
  const fs::path base = fresh_dir("cap_base");
  write(base, 1, "none");
  // Agreed before the divergence: every layer's two boundaries but the last layer's, then its
  // attention all_reduce.
  const int agreed = 2 * (layers - 1) + 1;
  const std::string agreed_line = "  agreed before it: " + std::to_string(agreed - kCap) + " boundaries, then layer";
  std::string out;

  SUBCASE("every row held by every rank where the layout holds it once") {
    const fs::path cand = fresh_dir("cap_count");
    write(cand, ranks, "count");
    CHECK(diff(base, cand, &out) == 1);
    CHECK(out.find("first divergence: layer " + std::to_string(layers - 1) + ", boundary \"dp_gather\"") != std::string::npos);
    CHECK(out.find("  held by:\n    rank 0 (") != std::string::npos);
    CHECK(lines_starting(out, "    rank ") == kCap);  // the holders listed
    CHECK(out.find("\n    ... and " + std::to_string(ranks - kCap) + " more\n") != std::string::npos);
    CHECK(out.find("found:    count " + std::to_string(ranks) + "\n") != std::string::npos);
    CHECK(out.find("  " + std::to_string(nrows) + " of " + std::to_string(nrows) + " rows differ") != std::string::npos);
    CHECK(lines_starting(out, "  row: ") == 1);  // the first row only, the others counted
    CHECK(out.find(agreed_line) != std::string::npos);
    // Listed after the count: the last kCap agreed boundaries, each followed by ';'.
    const std::string agreed_text = out.substr(out.find(agreed_line));
    CHECK(std::count(agreed_text.begin(), agreed_text.end(), ';') == kCap);
    // header, first divergence, row, held by, kCap holders, "... and K more", expected, found,
    // rows differ, agreed before it.
    CHECK(line_count(out) == 9 + kCap);
  }
  SUBCASE("every holder's checksum differs") {
    const fs::path cand = fresh_dir("cap_values");
    write(cand, ranks, "values");
    CHECK(diff(base, cand, &out) == 1);
    CHECK(out.find("first divergence: layer " + std::to_string(layers - 1) + ", boundary \"layer output\"") != std::string::npos);
    CHECK(lines_starting(out, "    rank ") == 2 * kCap);  // kCap holders, then kCap per-holder checksums
    int differs = 0;
    for (std::size_t at = out.find("<- differs"); at != std::string::npos; at = out.find("<- differs", at + 1)) ++differs;
    CHECK(differs == kCap);
    int more = 0;
    const std::string k = "    ... and " + std::to_string(ranks - kCap) + " more\n";
    for (std::size_t at = out.find(k); at != std::string::npos; at = out.find(k, at + 1)) ++more;
    CHECK(more == 2);  // under "held by:" and under "per holder:"
    CHECK(out.find(agreed_line) != std::string::npos);
    CHECK(line_count(out) == 10 + 2 * kCap);
  }
  SUBCASE("every rank records a failed invariant") {
    const fs::path cand = fresh_dir("cap_error");
    write(cand, ranks, "error");
    CHECK(diff(base, cand, &out) == 1);
    std::string listed;
    for (int r = 0; r < kCap; ++r) listed += (r ? ", " : "") + std::to_string(r);
    CHECK(out.find("  checked invariant failed on rank(s) " + listed + ", ... and " + std::to_string(ranks - kCap) +
                   " more: row conservation failed\n") != std::string::npos);
    CHECK(line_count(out) == 4);  // header, first divergence, the failed invariant, agreed before it
  }
  fs::remove_all(base.parent_path());
}

// The search for live runs inside a directory is bounded (it runs while the other ranks wait under
// the deadline): a lock a few levels down is found, one deeper than kLockSearchDepth is not, and a
// tree of more entries than kLockSearchEntries is looked at only that far.
TEST_CASE("trace::live_run_under: a bounded walk, deep enough for nested trace directories") {
  const fs::path root = fresh_dir("walk");
  trace::DirLock deep;
  fs::path level = root;
  for (int d = 1; d <= trace::kLockSearchDepth; ++d) level /= "d" + std::to_string(d);
  REQUIRE(deep.acquire(level.string(), "deep") == "");  // root/d1/.../d4: the deepest looked at
  const auto found = trace::live_run_under(root.string());
  REQUIRE(found.has_value());
  CHECK(found->holder.find("run deep") == 0);
  CHECK(!trace::live_run_under(root.string(), {.depth = trace::kLockSearchDepth - 1}).has_value());
  deep.release();
  trace::DirLock deeper;
  REQUIRE(deeper.acquire((level / "d5").string(), "deeper") == "");  // one level further
  CHECK(!trace::live_run_under(root.string()).has_value());
  CHECK(trace::live_run_under((root / "d1").string()).has_value());  // four levels below d1
  deeper.release();

  // A tree larger than the bound: 3 directories of 4000 files each, 12,003 entries.
  const fs::path wide = root / "wide";
  for (int d = 0; d < 3; ++d) {
    fs::create_directories(wide / std::to_string(d));
    for (int f = 0; f < 4000; ++f) std::ofstream(wide / std::to_string(d) / std::to_string(f)).put('x');
  }
  std::size_t visited = 0;
  CHECK(!trace::live_run_under(wide.string(), {}, &visited).has_value());
  CHECK(visited == trace::kLockSearchEntries);
  CHECK(!trace::live_run_under(wide.string(), {.entries = 20000}, &visited).has_value());
  CHECK(visited == 3 + 3 * 4000);
  // A run may still start there, and quickly: the walk stops at the bound.
  trace::DirLock lock;
  CHECK(lock.acquire(wide.string(), "wide") == "");
  lock.release();
  fs::remove_all(root.parent_path());
}
