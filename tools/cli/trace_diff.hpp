// `relayout trace diff BASELINE CANDIDATE`: reads two row-ownership traces (directories of
// rank<R>.jsonl, written by trace::JsonlSink) and reports the first boundary where the candidate
// layout's rows diverge from the trusted baseline's (docs/trace.md). Exit 0 agree, 1 diverge, 2 unreadable.
//
// Matching rule. Rows are matched by owner (request, position, speculative step), never by rank or
// index, because the two runs may use different layouts (1 rank vs TP8/DP4). Boundaries are visited
// layer by layer in the candidate's execution order. A candidate boundary is compared with the
// baseline boundary of the same layer and the same name when the baseline has one whose values mean
// the same (same `state`); otherwise with the baseline's last boundary of that layer in the same
// state (attn_out, moe_in, moe_partial, moe_out, layer_out): e.g. a dp_gather candidate's
// "reduce_scatterv" (moe_out) is compared with a single-rank baseline's "all_reduce" (moe_out), its
// "dp_gather" (moe_in) with the baseline's "bridge input". A boundary with no such counterpart
// (e.g. "dispatch+experts") still gets the row-conservation check. At each candidate boundary:
//   1. count: every row of the layer must appear exactly `copies` times over all ranks (the layout's
//      own expectation, recorded by the library: 1 after split_rows, attn group size when replicated...),
//      and no row the baseline does not know may appear. Only the rows of the steps that ran the
//      boundary count there: a step whose plan differs (automatic padding picks reduce_scatterv or
//      dp_reduce_scatter per step) is judged at its own boundary of the same state (see aggregate);
//   2. values: replicated rows — every holder's checksum must agree with the baseline row's;
//      partial rows (experts) — the holders' sum/wsum add up to the baseline row's (l2 is not compared);
//      tolerance: trace::checksums_agree (--rtol, --atol);
//   3. a checked invariant that failed there (record with "error", e.g. row conservation).
// The first boundary with a problem is reported with its first row in (request, position, step)
// order. The baseline's attention all_reduce and layer output (attn_out, layer_out) must exist in the
// candidate, so a candidate that stops early diverges. An injected bug therefore shows at the first
// boundary whose rows it changes, which is the boundary where it is wired.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "relayout/mesh/names.hpp"
#include "relayout/trace/dir_lock.hpp"
#include "relayout/trace/jsonl_reader.hpp"
#include "relayout/trace/owner.hpp"
#include "relayout/trace/record.hpp"

namespace relayout::cli {

// The reader's types under the names the CLI has always used.
using trace::RankTrace;
using trace::read_rank_trace;
using trace::read_trace;
using trace::TraceInputError;
using trace::TraceRun;

// One boundary of one layer, over all ranks of a run.
using RowKey = std::tuple<int, int, int>;  // request, position, step
inline RowKey key_of(const trace::Row& w) { return {w.request, w.position, w.step}; }

// One holder of a row: the rank and its row as read (owner and checksum), not a copy: 16 bytes
// beside the row itself.
struct Holding {
  const trace::Row* row = nullptr;
  int rank = 0;
  bool has_sum() const { return row->has_sum; }
  const trace::RowSum& sum() const { return row->sum; }
};

// The holders of every row at one boundary: one flat array sorted by row (request, position, step),
// a row's holders in the order they were added (rank order), found by binary search. A map of
// vectors took about 130 bytes more per row than this.
class RowHolders {
 public:
  void reserve(std::size_t n) { all_.reserve(n); }
  void add(int rank, const trace::Row& w) { all_.push_back({&w, rank}); }
  // After the last add: sorts, and counts the distinct rows.
  void finish() {
    std::stable_sort(all_.begin(), all_.end(), [](const Holding& a, const Holding& b) { return key_of(*a.row) < key_of(*b.row); });
    distinct_ = 0;
    for (std::size_t i = 0; i < all_.size(); ++i) distinct_ += i == 0 || key_of(*all_[i - 1].row) != key_of(*all_[i].row);
  }
  // The holders of row k (none: empty).
  std::span<const Holding> find(const RowKey& k) const {
    const auto lo = std::lower_bound(all_.begin(), all_.end(), k, [](const Holding& h, const RowKey& x) { return key_of(*h.row) < x; });
    auto hi = lo;
    while (hi != all_.end() && key_of(*hi->row) == k) ++hi;
    return {all_.data() + (lo - all_.begin()), std::size_t(hi - lo)};
  }
  // The distinct rows held, in order.
  std::vector<RowKey> keys() const {
    std::vector<RowKey> out;
    out.reserve(distinct_);
    for (const Holding& h : all_)
      if (out.empty() || out.back() != key_of(*h.row)) out.push_back(key_of(*h.row));
    return out;
  }
  std::size_t distinct() const { return distinct_; }

 private:
  std::vector<Holding> all_;
  std::size_t distinct_ = 0;
};

struct BoundaryAgg {
  std::string name, state;
  RowState sharing = RowState::replicated;
  int copies = 0, hidden = 0;
  RowHolders rows;
  // By (rank, step of its rows; -1 for a record without rows): each step's own counts.
  std::map<std::pair<int, int>, const trace::Record*> records;
  std::vector<const trace::Record*> errors;
};
struct LayerAgg {
  std::vector<std::string> order;  // execution order
  std::map<std::string, BoundaryAgg> by_name;
  std::vector<RowKey> all_rows;  // every row of the layer, sorted, each once
  bool has_row(const RowKey& k) const { return std::binary_search(all_rows.begin(), all_rows.end(), k); }
  // Per boundary, the steps that ran without it: a step may take another plan (automatic padding
  // picks max_len or sum_len from each step's counts, so a step's sum is "reduce_scatterv" or
  // "dp_reduce_scatter"), and that boundary holds none of the step's rows.
  std::map<std::string, std::set<int>> skipped_steps;
  // Whether boundary `name` is expected to hold row `k`: it is, unless k's step is known to have
  // run without it.
  bool expects(const std::string& name, const RowKey& k) const {
    const auto it = skipped_steps.find(name);
    return it == skipped_steps.end() || !it->second.count(std::get<2>(k));
  }
};

inline std::map<int, LayerAgg> aggregate(const TraceRun& run) {
  std::map<int, LayerAgg> layers;
  // Passes (forwards): a rank's records in file order, a new pass starting where a (layer, boundary)
  // recurs. Every rank writes every boundary of every pass, so pass p is the same forward on all
  // ranks; its steps are those of the rows any rank recorded in it (none in a pass without rows).
  std::vector<std::set<std::pair<int, std::string>>> pass_names;
  std::vector<std::set<int>> pass_steps;
  for (const RankTrace& t : run.ranks) {
    std::size_t pass = 0;
    std::set<std::pair<int, std::string>> current;
    for (const trace::Record& r : t.records) {
      if (!current.emplace(r.layer, r.boundary).second) {
        ++pass;
        current = {{r.layer, r.boundary}};
      }
      if (pass_names.size() <= pass) {
        pass_names.resize(pass + 1);
        pass_steps.resize(pass + 1);
      }
      pass_names[pass].emplace(r.layer, r.boundary);
      for (const trace::Row& w : r.rows) pass_steps[pass].insert(w.step);
    }
  }
  std::map<std::pair<int, std::string>, std::size_t> held;  // rows per (layer, boundary), to reserve
  for (const RankTrace& t : run.ranks)
    for (const trace::Record& r : t.records) held[{r.layer, r.boundary}] += r.rows.size();
  for (const auto& [at, n] : held) layers[at.first].by_name[at.second].rows.reserve(n);
  for (const RankTrace& t : run.ranks) {
    std::map<int, std::ptrdiff_t> last;  // this rank's previous boundary per layer, as an index in order
    for (const trace::Record& r : t.records) {
      LayerAgg& L = layers[r.layer];
      auto it = std::find(L.order.begin(), L.order.end(), r.boundary);
      auto& prev = last.try_emplace(r.layer, -1).first->second;
      if (it == L.order.end()) it = L.order.insert(L.order.begin() + (prev + 1), r.boundary);
      prev = it - L.order.begin();
      BoundaryAgg& b = L.by_name[r.boundary];
      b.name = r.boundary;
      b.state = r.state;
      b.sharing = r.sharing;
      b.copies = std::max(b.copies, r.copies);
      b.hidden = std::max(b.hidden, r.hidden);
      b.records.try_emplace({r.global_rank, r.rows.empty() ? -1 : r.rows.front().step}, &r);
      if (!r.error.empty()) b.errors.push_back(&r);
      for (const trace::Row& w : r.rows) b.rows.add(r.global_rank, w);
    }
  }
  for (auto& [layer, L] : layers) {
    for (auto& [name, b] : L.by_name) {
      b.rows.finish();
      const std::vector<RowKey> keys = b.rows.keys();
      L.all_rows.insert(L.all_rows.end(), keys.begin(), keys.end());
    }
    std::sort(L.all_rows.begin(), L.all_rows.end());
    L.all_rows.erase(std::unique(L.all_rows.begin(), L.all_rows.end()), L.all_rows.end());
    L.all_rows.shrink_to_fit();
  }
  // A step skipped a boundary when no pass with rows of that step ran it but one ran another boundary
  // of that layer in the same state instead (the other plan's counterpart). A step that reached no
  // boundary of that state is not excused: its rows are expected there, so a run that stopped early
  // or lost a step's rows diverges.
  std::map<int, std::set<std::pair<int, std::string>>> step_names;
  for (std::size_t p = 0; p < pass_names.size(); ++p)
    for (int s : pass_steps[p]) step_names[s].insert(pass_names[p].begin(), pass_names[p].end());
  for (auto& entry : layers) {  // named, not bound: the lambda below captures them (clang 14)
    const int layer = entry.first;
    auto& L = entry.second;
    for (const std::string& name : L.order)
      for (const auto& [s, ran] : step_names) {
        const auto& names = ran;
        if (names.count({layer, name})) continue;
        const std::string& state = L.by_name.at(name).state;
        if (std::any_of(L.order.begin(), L.order.end(), [&](const std::string& other) {
              return names.count({layer, other}) && L.by_name.at(other).state == state;
            }))
          L.skipped_steps[name].insert(s);
      }
  }
  return layers;
}

struct DiffOptions {
  trace::Tolerance tolerance;
};

namespace detail {

inline std::string fmt(const trace::RowSum& s, bool l2 = true) {
  char b[128];
  if (l2)
    std::snprintf(b, sizeof b, "sum=%.6g wsum=%.6g l2=%.6g", s.sum, s.wsum, s.l2);
  else
    std::snprintf(b, sizeof b, "sum=%.6g wsum=%.6g", s.sum, s.wsum);
  return b;
}

inline std::string row_name(const RowKey& k) {
  return "request " + trace::RowOwner::request_name(std::get<0>(k)) + " (id " + std::to_string(std::get<0>(k)) +
         "), position " + std::to_string(std::get<1>(k)) + ", step " + std::to_string(std::get<2>(k));
}

// A holder of a row of step `step`, with the row count and global_num_tokens of its record of that
// step (else of its record without rows: the step's rows were not there).
inline std::string rank_info(const BoundaryAgg& b, int rank, int step) {
  auto it = b.records.find({rank, step});
  if (it == b.records.end()) it = b.records.find({rank, -1});
  if (it == b.records.end()) return "rank " + std::to_string(rank);
  const trace::Record& r = *it->second;
  std::string s = "rank " + std::to_string(rank) + " (attn_dp " + std::to_string(r.attn_dp_rank) +
                  (r.attn_cp_rank > 0 ? ", attn_cp " + std::to_string(r.attn_cp_rank) : std::string()) + ", attn_tp " +
                  std::to_string(r.attn_tp_rank) + ", moe_ep " + std::to_string(r.moe_ep_rank) + ", " +
                  (r.group.empty() ? std::string("local step") : "group " + r.group + " handle " + std::to_string(r.handle)) +
                  ", " + std::to_string(r.row_count) + " rows, ";
  if (r.global_num_tokens.empty()) return s + "global_num_tokens not recorded)";
  s += "global_num_tokens [";
  for (std::size_t i = 0; i < r.global_num_tokens.size(); ++i) s += (i ? " " : "") + std::to_string(r.global_num_tokens[i]);
  return s + "])";
}

// The row as the baseline has it: a holder's checksum, or the partial holders' total. A total's l2
// is the holders' l2 summed: not the total's l2, but a bound on it (triangle inequality), used only
// as the tolerance scale.
inline std::optional<trace::RowSum> expected_sum(const BoundaryAgg& b, const RowKey& k) {
  const std::span<const Holding> held = b.rows.find(k);
  if (held.empty() || !held.front().has_sum()) return std::nullopt;
  if (b.sharing == RowState::replicated) return held.front().sum();
  trace::RowSum t;
  for (const Holding& h : held) {
    t.sum += h.sum().sum;
    t.wsum += h.sum().wsum;
    t.l2 += h.sum().l2;
  }
  return t;
}

// The baseline boundary row k is compared at: `b` (the candidate boundary's counterpart) when k's
// step ran it, else the baseline's last boundary of the layer in `state` that k's step ran (a
// baseline whose steps took different plans); nullptr when there is none.
inline const BoundaryAgg* baseline_for(const LayerAgg& B, const BoundaryAgg* b, const std::string& state, const RowKey& k) {
  if (!b || B.expects(b->name, k)) return b;
  for (auto it = B.order.rbegin(); it != B.order.rend(); ++it)
    if (B.by_name.at(*it).state == state && B.expects(*it, k)) return &B.by_name.at(*it);
  return nullptr;
}

// The model width a run's records were taken at (0: no records).
inline int run_hidden(const TraceRun& run) {
  for (const RankTrace& rank : run.ranks)
    for (const trace::Record& r : rank.records)
      if (r.hidden > 0) return r.hidden;
  return 0;
}

inline std::string at(const RankTrace& t, std::size_t i) { return t.file + ":" + std::to_string(i + 2) + ": "; }
inline std::string list(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::int64_t x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return "[" + s + "]";
}

struct FirstSeen {
  const RankTrace* t;
  std::size_t i;
};
// What the checks learn over the files of one run.
struct RunFacts {
  std::optional<FirstSeen> width;
  std::map<std::string, FirstSeen> handle_of;
  std::map<std::tuple<int, std::string, int>, FirstSeen> boundary;  // layer, name, occurrence
  std::map<std::pair<int, int>, std::vector<int>> tp_ranks;  // (attn_dp_rank, attn_cp_rank) -> attn_tp_ranks
  int cp = 1;  // attention CP width: global_num_tokens has one entry per CP share of each DP group
};

inline int cp_width(const TraceRun& run) {
  int cp = 1;
  for (const RankTrace& t : run.ranks)
    for (std::size_t i = 0; i < t.records.size(); ++i) {
      const int c = t.records[i].attn_cp_rank;
      if (c >= run.world_size)
        throw TraceInputError(detail::at(t, i) + "field 'attn_cp_rank': " + std::to_string(c) + " in a run of " +
                              std::to_string(run.world_size) + " ranks (a CP rank is below the CP width)");
      cp = std::max(cp, c + 1);
    }
  return cp;
}

// One rank's file against itself and against the files checked before it.
inline void check_file(const TraceRun& run, const RankTrace& t, RunFacts& f) {
  std::map<std::pair<int, std::string>, int> seen;
  std::map<int, std::size_t> step_first;  // step -> first record of it in this file
  for (std::size_t i = 0; i < t.records.size(); ++i) {
    const trace::Record& r = t.records[i];
    const trace::Record& r0 = t.records.front();
    if (r.attn_dp_rank != r0.attn_dp_rank || r.attn_tp_rank != r0.attn_tp_rank || r.moe_ep_rank != r0.moe_ep_rank ||
        r.attn_cp_rank != r0.attn_cp_rank)
      throw TraceInputError(detail::at(t, i) + "fields 'attn_dp_rank', 'attn_cp_rank', 'attn_tp_rank', 'moe_ep_rank' (" +
                            std::to_string(r.attn_dp_rank) + ", " + std::to_string(r.attn_cp_rank) + ", " +
                            std::to_string(r.attn_tp_rank) + ", " + std::to_string(r.moe_ep_rank) +
                            ") differ from the file's first record's (" + std::to_string(r0.attn_dp_rank) + ", " +
                            std::to_string(r0.attn_cp_rank) + ", " + std::to_string(r0.attn_tp_rank) + ", " +
                            std::to_string(r0.moe_ep_rank) +
                            "): a rank's coordinates do not change");
    if (r.copies > run.world_size)
      throw TraceInputError(detail::at(t, i) + "field 'copies': " + std::to_string(r.copies) + " copies of a row in a run of " +
                            std::to_string(run.world_size) + " ranks");
    if (!f.width && r.hidden > 0) f.width = FirstSeen{&t, i};
    const trace::Record& w = f.width ? f.width->t->records[f.width->i] : r;
    if (r.hidden > 0 && r.hidden != w.hidden)
      throw TraceInputError(detail::at(t, i) + "field 'hidden': " + std::to_string(r.hidden) + ", but " + detail::at(*f.width->t, f.width->i) +
                            "says " + std::to_string(w.hidden) + ": one run has one model width");
    if (!r.group.empty()) {
      const auto [it, fresh] = f.handle_of.try_emplace(r.group, FirstSeen{&t, i});
      const trace::Record& h = it->second.t->records[it->second.i];
      if (!fresh && h.handle != r.handle)
        throw TraceInputError(detail::at(t, i) + "field 'handle': group " + r.group + " has handle " + std::to_string(r.handle) +
                              " here and " + std::to_string(h.handle) + " at " + detail::at(*it->second.t, it->second.i) +
                              "one group, one communicator");
    }
    if (!r.rows.empty()) {
      const auto [it, fresh] = step_first.try_emplace(r.rows.front().step, i);
      const trace::Record& first = t.records[it->second];
      if (!fresh && first.global_num_tokens != r.global_num_tokens)
        throw TraceInputError(detail::at(t, i) + "field 'global_num_tokens': " + detail::list(r.global_num_tokens) + ", but line " +
                              std::to_string(it->second + 2) + " of the same step says " + detail::list(first.global_num_tokens));
    }
    const int occurrence = seen[{r.layer, r.boundary}]++;
    const auto [it, fresh] = f.boundary.try_emplace({r.layer, r.boundary, occurrence}, FirstSeen{&t, i});
    if (fresh) continue;
    const trace::Record& o = it->second.t->records[it->second.i];
    const char* field = o.state != r.state                           ? "state"
                        : o.sharing != r.sharing                     ? "sharing"
                        : o.copies != r.copies                       ? "copies"
                        : o.group != r.group                         ? "group"
                        : o.global_num_tokens != r.global_num_tokens ? "global_num_tokens"
                        : o.scaled_global_num_tokens != r.scaled_global_num_tokens ? "scaled_global_num_tokens"
                                                                                   : nullptr;
    if (field) {
      std::string where = detail::at(*it->second.t, it->second.i);
      where.resize(where.size() - 2);  // "FILE:LINE", without the ": " of a message prefix
      throw TraceInputError(detail::at(t, i) + "field '" + field + "' of layer " + std::to_string(r.layer) + " boundary \"" +
                            r.boundary + "\" differs from rank " + std::to_string(o.global_rank) + "'s record at " +
                            where + ": the ranks of one boundary agree on it");
    }
  }
  if (!t.records.empty())
    f.tp_ranks[{t.records.front().attn_dp_rank, t.records.front().attn_cp_rank}].push_back(t.records.front().attn_tp_rank);
}

// An attention-TP group's ranks are numbered 0..n-1 and its outputs are held by all n of them, or
// (copies 1: the residual kept split over attn_tp) each row by one of them.
inline void check_groups(const TraceRun& run, RunFacts& f, bool baseline) {
  for (auto& [group, ranks] : f.tp_ranks) {
    std::sort(ranks.begin(), ranks.end());
    for (std::size_t k = 0; k < ranks.size(); ++k)
      if (ranks[k] != int(k))
        throw TraceInputError(run.dir + ": field 'attn_tp_rank': attention-DP group " + std::to_string(group.first) +
                              (f.cp > 1 ? " CP rank " + std::to_string(group.second) : "") + " has " +
                              std::to_string(ranks.size()) + " ranks, so its attn_tp_ranks must be 0.." +
                              std::to_string(ranks.size() - 1) + ", not " + detail::list(std::vector<std::int64_t>(ranks.begin(), ranks.end())));
  }
  for (const RankTrace& t : run.ranks)
    for (std::size_t i = 0; i < t.records.size(); ++i) {
      const trace::Record& r = t.records[i];
      const int group_size = int(f.tp_ranks[{r.attn_dp_rank, r.attn_cp_rank}].size());
      if ((r.state == "attn_out" || r.state == "layer_out") && r.copies != group_size && r.copies != 1)
        throw TraceInputError(detail::at(t, i) + "field 'copies': " + std::to_string(r.copies) + ", but a " + r.state +
                              " row is held by every rank of its attention-TP group, which has " + std::to_string(group_size) +
                              " ranks here, or by one of them (the rows split over attn_tp)");
      // A candidate's rows are judged against the baseline's; counts not recorded (empty) are not
      // checked, nor the chunks of rows split over attn_tp (copies 1 in a group of several).
      if (baseline && r.state == "attn_out" && r.copies == group_size && !r.global_num_tokens.empty()) {
        const std::size_t share = std::size_t(r.attn_dp_rank) * std::size_t(f.cp) + std::size_t(r.attn_cp_rank);
        if (share >= r.global_num_tokens.size() || r.global_num_tokens[share] != std::int64_t(r.rows.size()))
          throw TraceInputError(detail::at(t, i) + "field 'global_num_tokens': " + detail::list(r.global_num_tokens) +
                                " for attention-DP group " + std::to_string(r.attn_dp_rank) +
                                (f.cp > 1 ? " CP rank " + std::to_string(r.attn_cp_rank) : "") +
                                ", whose attention output holds " + std::to_string(r.rows.size()) + " rows here");
      }
    }
}

// The baseline against itself: counts and replicated copies.
inline void check_baseline_rows(const TraceRun& run, const trace::Tolerance& tol) {
  for (const auto& [layer, L] : aggregate(run))
    for (const std::string& name : L.order) {
      const BoundaryAgg& b = L.by_name.at(name);
      const std::string where = run.dir + " (baseline): layer " + std::to_string(layer) + ", boundary \"" + name + "\": ";
      for (const RowKey& k : L.all_rows) {
        if (!L.expects(name, k)) continue;  // its step ran another plan's boundary instead
        const std::span<const Holding> holders = b.rows.find(k);
        const std::size_t held = holders.size();
        if (int(held) != b.copies)
          throw TraceInputError(where + detail::row_name(k) + " is held " + std::to_string(held) + " times, the record says copies " +
                                std::to_string(b.copies) + ": a baseline must keep its own row count");
        if (b.sharing != RowState::replicated || held < 2 || !holders.front().has_sum()) continue;
        const Holding& first = holders.front();
        for (const Holding& h : holders)
          if (!trace::checksums_agree(first.sum(), h.sum(), b.hidden, tol))
            throw TraceInputError(where + detail::row_name(k) + ": rank " + std::to_string(first.rank) + " holds " +
                                  detail::fmt(first.sum()) + ", rank " + std::to_string(h.rank) + " holds " + detail::fmt(h.sum()) +
                                  ": the replicated copies of a baseline row must agree with each other");
      }
    }
}

}  // namespace detail

// A run consistent with itself, or TraceInputError naming file, line, field and rule: every record of
// a rank has that rank's coordinates; one model width; a group always has the same communicator
// handle; the records of one boundary (layer, name, n-th occurrence) agree over the ranks on
// state, sharing, copies, group, handle and global_num_tokens; a file's records of one speculative
// step carry one global_num_tokens; an attention-TP group's ranks are numbered 0..n-1; attention
// and layer outputs are held `copies` = attention-TP group size times. A baseline must also hold every row
// of a layer `copies` times at each boundary, and the holders of a replicated row must agree with
// each other (within `tol`): the baseline is the reference, so it is refused rather than trusted.
// (In a baseline, too, the attention output of a rank holds global_num_tokens[its group] rows.)
inline void check_run(const TraceRun& run, const trace::Tolerance& tol, bool baseline) {
  detail::RunFacts f;
  f.cp = detail::cp_width(run);
  for (const RankTrace& t : run.ranks) detail::check_file(run, t, f);
  detail::check_groups(run, f, baseline);
  if (baseline) detail::check_baseline_rows(run, tol);
}

// Traces of different programs (dsv4_layer, the DSpark draft, the DSpark target) or of different
// model widths come from different models: any "divergence" between them would say nothing about
// the layout, so they are refused (exit 2) instead of compared.
inline void require_comparable(const TraceRun& base, const TraceRun& cand) {
  if (!base.program.empty() && !cand.program.empty() && base.program != cand.program)
    throw TraceInputError(cand.dir + ": a trace of \"" + cand.program + "\" cannot be compared with a baseline of \"" +
                          base.program + "\" (" + base.dir + "): they run different models");
  const int hb = detail::run_hidden(base), hc = detail::run_hidden(cand);
  if (hb > 0 && hc > 0 && hb != hc)
    throw TraceInputError(cand.dir + ": its records have hidden " + std::to_string(hc) + ", the baseline's (" + base.dir +
                          ") hidden " + std::to_string(hb) + ": traces of different model sizes cannot be compared");
}

namespace detail {

// Holders, boundaries and rows listed in a report; the rest are counted ("... and K more"), so a
// candidate that holds a row thousands of times still gets a report of a few lines.
inline constexpr std::size_t kListed = 8;

inline std::string capped(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (std::size_t i = 0; i < items.size() && i < kListed; ++i) s += sep + items[i];
  if (items.size() > kListed) s += sep + "... and " + std::to_string(items.size() - kListed) + " more";
  return s;
}

// The candidate's holders of a row, checked against the baseline's checksum `want`: "" when they
// agree, else the "found:" text.
inline std::string checksum_problem(const BoundaryAgg& bk, const BoundaryAgg& c, std::span<const Holding> held,
                                    const trace::RowSum& want, bool l2, const DiffOptions& opt) {
  if (c.sharing == RowState::partial) {
    trace::RowSum t;
    for (const Holding& h : held) {
      t.sum += h.sum().sum;
      t.wsum += h.sum().wsum;
      t.l2 += h.sum().l2;  // tolerance scale only (see expected_sum)
    }
    if (trace::checksums_agree(want, t, bk.hidden, opt.tolerance, false)) return "";
    return "total of " + std::to_string(held.size()) + " partial rows: " + fmt(t, false);
  }
  std::vector<std::string> differ, agree;  // the holders that differ are listed first
  for (const Holding& h : held) {
    const bool ok = trace::checksums_agree(want, h.sum(), bk.hidden, opt.tolerance, l2);
    (ok ? agree : differ).push_back("rank " + std::to_string(h.rank) + ": " + fmt(h.sum(), l2) + (ok ? "" : "   <- differs"));
  }
  if (differ.empty()) return "";
  differ.insert(differ.end(), agree.begin(), agree.end());
  return "per holder:" + capped(differ, "\n    ");
}

// What is wrong with row k at candidate boundary c, compared with baseline boundary b of layer B
// (nullptr: none): "" when nothing. `checks` counts the checksums compared.
inline std::string row_problem(const LayerAgg& B, const BoundaryAgg* b, const BoundaryAgg& c, const RowKey& k,
                               const DiffOptions& opt, std::int64_t& checks) {
  const std::span<const Holding> held = c.rows.find(k);
  const auto holders = [&] {
    std::string s;
    for (std::size_t i = 0; i < held.size() && i < kListed; ++i) s += "\n    " + rank_info(c, held[i].rank, std::get<2>(k));
    if (held.size() > kListed) s += "\n    ... and " + std::to_string(held.size() - kListed) + " more";
    return "  held by:" + (held.empty() ? std::string(" none") : s) + "\n";
  };
  const std::string count = std::to_string(held.size());
  if (!B.has_row(k))
    return holders() + "  expected: no such row (the baseline never holds it)\n  found:    count " + count + "\n";
  if (int(held.size()) != c.copies)
    return holders() + "  expected: count " + std::to_string(c.copies) +
           " (each row held that many times over all ranks here)\n  found:    count " + count + "\n";
  const BoundaryAgg* bk = baseline_for(B, b, c.state, k);
  if (!bk) return "";
  const std::optional<trace::RowSum> want = expected_sum(*bk, k);
  if (!want || held.empty() || !held.front().has_sum()) return "";
  ++checks;
  const bool l2 = bk->sharing == RowState::replicated && c.sharing == RowState::replicated;
  const std::string found = checksum_problem(*bk, c, held, *want, l2, opt);
  if (found.empty()) return "";
  return holders() + "  expected: count " + std::to_string(c.copies) + ", " + fmt(*want, l2) + " (baseline \"" + bk->name +
         "\"" + (bk->sharing == RowState::partial ? ", partial rows added" : "") + ")\n  found:    count " + count + ", " +
         found + "\n";
}

// The baseline boundary a candidate boundary is compared with: the same name in the same state,
// else the baseline's last boundary of the layer in that state; nullptr when there is none.
inline const BoundaryAgg* counterpart(const LayerAgg& B, const BoundaryAgg& c) {
  if (auto it = B.by_name.find(c.name); it != B.by_name.end() && it->second.state == c.state) return &it->second;
  for (auto it = B.order.rbegin(); it != B.order.rend(); ++it)
    if (B.by_name.at(*it).state == c.state) return &B.by_name.at(*it);
  return nullptr;
}

// One candidate boundary against the baseline's rows: "" when it agrees, else the report's body.
inline std::string compare_boundary(const LayerAgg& B, const BoundaryAgg* b, const LayerAgg& C, const BoundaryAgg& c,
                                    const DiffOptions& opt, std::int64_t& checks) {
  if (!c.errors.empty()) {
    std::vector<std::string> ranks;
    for (const trace::Record* r : c.errors) ranks.push_back(std::to_string(r->global_rank));
    return "  checked invariant failed on rank(s) " + capped(ranks, ", ").substr(2) + ": " + c.errors.front()->error + "\n";
  }
  // The baseline's rows of the steps that ran this boundary (a step that took another plan's
  // counterpart is checked there), and whatever the candidate holds here.
  std::vector<RowKey> expected, keys;
  for (const RowKey& k : B.all_rows)
    if (C.expects(c.name, k)) expected.push_back(k);
  const std::vector<RowKey> held = c.rows.keys();
  std::set_union(expected.begin(), expected.end(), held.begin(), held.end(), std::back_inserter(keys));
  std::string first;
  std::int64_t bad = 0;
  for (const RowKey& k : keys) {
    std::string problem = row_problem(B, b, c, k, opt, checks);
    if (problem.empty()) continue;
    if (bad++ == 0) first = "  row: " + row_name(k) + "\n" + problem;
  }
  if (bad == 0) return "";
  char tol[96];
  std::snprintf(tol, sizeof tol, "(tolerance rtol %g, atol %g)", opt.tolerance.rtol, opt.tolerance.atol);
  return first + "  " + std::to_string(bad) + " of " + std::to_string(keys.size()) + " rows differ at this boundary " + tol + "\n";
}

// The boundaries that agreed before a divergence: the last kListed of them, the others counted.
inline std::string agreed_before(const std::vector<std::string>& agreed) {
  if (agreed.empty()) return "";
  std::string s = "  agreed before it:";
  if (agreed.size() > kListed) s += " " + std::to_string(agreed.size() - kListed) + " boundaries, then";
  for (std::size_t i = agreed.size() > kListed ? agreed.size() - kListed : 0; i < agreed.size(); ++i) s += " " + agreed[i] + ";";
  return s + "\n";
}

}  // namespace detail

inline int trace_diff(const TraceRun& base_run, const TraceRun& cand_run, const DiffOptions& opt, std::ostream& out) {
  require_comparable(base_run, cand_run);
  const auto base = aggregate(base_run);
  const auto cand = aggregate(cand_run);
  out << "trace diff: baseline " << base_run.dir << " (" << base_run.world_size << " rank" << (base_run.world_size > 1 ? "s" : "")
      << "), candidate " << cand_run.dir << " (" << cand_run.world_size << " rank" << (cand_run.world_size > 1 ? "s" : "") << ")\n";
  std::vector<std::string> agreed, not_compared;
  std::int64_t compared = 0, checks = 0;
  const auto diverge = [&](int layer, const std::string& boundary, const std::string& detail) {
    out << "first divergence: layer " << layer << ", boundary \"" << boundary << "\"" << detail << detail::agreed_before(agreed);
    return 1;
  };

  std::set<int> layers;
  for (const auto& [l, _] : base) layers.insert(l);
  for (const auto& [l, _] : cand) layers.insert(l);
  for (int layer : layers) {
    const auto bl = base.find(layer);
    const auto cl = cand.find(layer);
    if (cl == cand.end())
      return diverge(layer, bl->second.order.front(), " (the candidate has no record of layer " + std::to_string(layer) +
                                                          "; it stopped early)\n");
    if (bl == base.end())
      return diverge(layer, cl->second.order.front(), " (the baseline has no layer " + std::to_string(layer) + ")\n");
    const LayerAgg& B = bl->second;
    const LayerAgg& C = cl->second;
    std::set<std::string> matched;  // states of the baseline compared
    for (const std::string& name : C.order) {
      const BoundaryAgg& c = C.by_name.at(name);
      const BoundaryAgg* b = detail::counterpart(B, c);
      if (b) matched.insert(b->state);
      const std::string against = b ? (b->name == name ? "" : ", compared with baseline \"" + b->name + "\"") : "";
      const std::string problem = detail::compare_boundary(B, b, C, c, opt, checks);
      if (!problem.empty()) return diverge(layer, name, " (state " + c.state + against + ")\n" + problem);
      (b ? agreed : not_compared).push_back("layer " + std::to_string(layer) + " " + name);
      compared += b ? 1 : 0;
    }
    // The candidate must reach the states every layout has: attention output and layer output.
    for (const std::string& name : B.order) {
      const BoundaryAgg& b = B.by_name.at(name);
      if ((b.state == "attn_out" || b.state == "layer_out") && !matched.count(b.state))
        return diverge(layer, name, " (state " + b.state + ")\n  expected: " + std::to_string(b.rows.distinct()) +
                                        " rows (baseline)\n  found:    no such boundary in the candidate (it stopped before it)\n");
    }
  }
  out << "traces agree: " << compared << " boundaries over " << layers.size() << " layer" << (layers.size() == 1 ? "" : "s")
      << " compared, " << checks << " row checksums\n";
  if (!not_compared.empty()) {
    out << "  not compared (no baseline counterpart; row counts checked):";
    for (const auto& n : not_compared) out << " " << n << ";";
    out << "\n";
  }
  return 0;
}

namespace detail {

// A trace still being written is not read: its files end anywhere.
inline void refuse_live(const std::string& dir) {
  if (const auto live = trace::live_run_over(dir))
    throw TraceInputError(dir + ": a live run is still writing this trace (" + live->holder +
                          (trace::impl::full_path(dir).string() == live->dir ? "" : ", into " + live->dir) +
                          "); compare it when the run has ended");
}

// Where a rank's records stop: its last boundary, with the step of its rows.
inline std::string last_boundary(const RankTrace& t) {
  if (t.records.empty()) return "no boundary (the header only)";
  const trace::Record& r = t.records.back();
  return "layer " + std::to_string(r.layer) + " \"" + r.boundary + "\"" +
         (r.rows.empty() ? std::string() : ", step " + std::to_string(r.rows.front().step)) + " (record " +
         std::to_string(t.records.size()) + (t.stopped.empty() ? ", then its end line" : ", then the file ends") + ")";
}

// A run whose files were not all closed (killed, aborted by the watchdog, crashed) is never
// compared, so it cannot "agree": the error names where each rank stopped, ranks stopped at the same
// place on one line.
inline void refuse_partial(const TraceRun& run, const char* role) {
  const auto cut = std::find_if(run.ranks.begin(), run.ranks.end(), [](const RankTrace& t) { return !t.stopped.empty(); });
  if (cut == run.ranks.end()) return;
  std::vector<std::pair<std::string, std::vector<std::string>>> places;  // where, the ranks stopped there
  for (const RankTrace& t : run.ranks) {
    const std::string where = last_boundary(t);
    auto it = std::find_if(places.begin(), places.end(), [&](const auto& p) { return p.first == where; });
    if (it == places.end()) it = places.emplace(places.end(), where, std::vector<std::string>{});
    it->second.push_back(std::to_string(t.rank));
  }
  std::string text = cut->stopped + "\n  the " + role + " " + run.dir +
                     " is a partial trace (its run stopped before closing its files: killed, aborted or crashed); "
                     "not compared. The last boundary each rank reached:";
  for (const auto& [where, ranks] : places)
    text += "\n    rank" + std::string(ranks.size() > 1 ? "s " : " ") + capped(ranks, ", ").substr(2) + ": " + where;
  throw TraceInputError(text);
}

// Memory of the diff, per row, per record and per text byte of the largest line: a row is kept as
// read (trace::Row, 40 bytes) and aggregated (a Holding, 16 bytes, and its share of the layer's row
// list), the two runs at once; a record keeps its strings and counts, and the diff its forward's
// boundaries; a line is parsed whole before its record is kept. A 1 GiB rank file (15M rows) compared
// with itself peaked at 66 bytes per row of the two runs (docs/trace.md, "Memory and time").
inline constexpr double kBytesPerRow = 72.0, kBytesPerRecord = 600.0, kBytesPerLineByte = 12.0;

struct TraceSize {
  std::uintmax_t bytes = 0, rows = 0, records = 0, longest_line = 0;
  std::string largest;  // the largest file
  std::uintmax_t largest_bytes = 0;
};

// The rows of a run's files, counted before anything is parsed: every row is one '[' of a record
// line beyond its "rows" and "global_num_tokens" arrays (an estimate; the reader checks the rest).
inline void measure(const std::string& dir, TraceSize& size) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank", 0) != 0) continue;
    std::optional<io::InputFile> file;  // a file refused here is refused, named, by the reader
    try {
      file.emplace(it->path().string(), trace::rank_file_rule());
    } catch (const io::FileError&) {
      continue;
    }
    std::istream in(&*file);
    std::vector<char> buf(std::size_t(1) << 20);
    std::uintmax_t bytes = 0, line = 0, brackets = 0;  // brackets: of the line being read
    const auto end_line = [&] {
      size.longest_line = std::max(size.longest_line, line);
      size.records += line > 0;
      size.rows += brackets > 2 ? brackets - 2 : 0;
      line = brackets = 0;
    };
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
      const std::size_t got = std::size_t(in.gcount());
      for (std::size_t i = 0; i < got; ++i) {
        brackets += buf[i] == '[';
        if (buf[i] == '\n')
          end_line();
        else
          ++line;
      }
      bytes += got;
    }
    end_line();
    size.bytes += bytes;
    if (bytes >= size.largest_bytes) {
      size.largest_bytes = bytes;
      size.largest = it->path().string();
    }
  }
}

// What this process may still allocate: the address-space limit (ulimit -v) less what it maps now,
// and the memory the system has available; the smaller of them (max when neither is known).
inline std::uintmax_t memory_available() {
  std::uintmax_t avail = std::numeric_limits<std::uintmax_t>::max();
  rlimit lim{};
  if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    std::uintmax_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const std::uintmax_t mapped = pages * std::uintmax_t(::sysconf(_SC_PAGESIZE));
    avail = lim.rlim_cur > mapped ? lim.rlim_cur - mapped : 0;
  }
  std::ifstream info("/proc/meminfo");
  std::string key;
  std::uintmax_t kb = 0;
  std::string unit;
  while (info >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = std::min(avail, kb * 1024);
  return avail;
}

inline std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(std::uintmax_t(1) << 30));
  return b;
}

// What comparing two runs needs, estimated from their files before anything is parsed.
struct MemoryNeed {
  TraceSize size;
  double bytes = 0;
  // "needs about X GiB of memory (N rows in Y GiB of trace files, this the largest at Z GiB)"
  std::string text() const {
    return "needs about " + gib(bytes) + " of memory (" + std::to_string(size.rows) + " rows in " + gib(double(size.bytes)) +
           " of trace files, this the largest at " + gib(double(size.largest_bytes)) + ")";
  }
};

inline MemoryNeed memory_need(const std::string& baseline, const std::string& candidate) {
  MemoryNeed m;
  measure(baseline, m.size);
  measure(candidate, m.size);
  m.bytes = kBytesPerRow * double(m.size.rows) + kBytesPerRecord * double(m.size.records) +
            kBytesPerLineByte * double(m.size.longest_line) + double(64 << 20);
  return m;
}

// Refuses, before reading, a comparison that would not fit in memory: naming the largest file, the
// memory the two runs need and what is available.
inline void require_memory(const std::string& baseline, const std::string& candidate, const MemoryNeed& need) {
  const std::uintmax_t avail = memory_available();
  if (need.bytes <= double(avail)) return;
  throw TraceInputError(need.size.largest + ": comparing " + baseline + " with " + candidate + " " + need.text() + "; " +
                        gib(double(avail)) +
                        " is available (ulimit -v and the system's available memory): trace fewer steps or layers, or "
                        "compare on a machine with more memory");
}

}  // namespace detail

// The subcommand's body: exit 0 agree, 1 diverge, 2 unreadable input (a partial trace, or one still
// being written, included).
inline int trace_diff(const std::string& baseline, const std::string& candidate, const DiffOptions& opt,
                      std::ostream& out, std::ostream& err) {
  detail::MemoryNeed need;
  const char* stage = "before reading";
  try {
    detail::refuse_live(baseline);
    detail::refuse_live(candidate);
    std::error_code ec;
    if (!std::filesystem::is_directory(baseline, ec) || !std::filesystem::is_directory(candidate, ec)) {
      read_trace(baseline);  // says which is not a trace directory
      read_trace(candidate);
    }
    need = detail::memory_need(baseline, candidate);
    detail::require_memory(baseline, candidate, need);
    stage = "reading the baseline";
    const TraceRun b = read_trace(baseline, true);
    stage = "reading the candidate";
    const TraceRun c = read_trace(candidate, true);
    detail::refuse_partial(b, "baseline");
    detail::refuse_partial(c, "candidate");
    stage = "checking the runs";
    check_run(b, opt.tolerance, true);
    check_run(c, opt.tolerance, false);
    stage = "comparing";
    return trace_diff(b, c, opt, out);
  } catch (const TraceInputError& e) {
    err << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {  // the estimate was short: still a message, not a crash
    err << "error: " << (need.size.largest.empty() ? baseline : need.size.largest) << ": comparing " << baseline << " with "
        << candidate << " ran out of memory " << stage << " (ulimit -v or the system's memory); it "
        << (need.size.largest.empty() ? std::string("was not measured") : need.text() + " by the estimate, and took more")
        << ": trace fewer steps or layers, or compare on a machine with more memory\n";
    return 2;
  }
}

}  // namespace relayout::cli
