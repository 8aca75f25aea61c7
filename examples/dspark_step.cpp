// dspark_step: speculative decode rounds (docs/dspark.md) on real MPI ranks, with a KV cache for
// the target and the draft. A draft derived from the target (MoE: its first --draft-layers layers,
// with full DP/MoE participation; dense: a TP MLP of its layer-0 shared expert inside the
// attention-TP group) proposes k = --tokens-per-req - 1 tokens per request, the target verifies the
// k + 1 rows in one forward against its cache, greedy acceptance (or speculative sampling with
// --sample) commits, and both caches roll back the rejected positions. Shows raw and scaled
// global_num_tokens, idle participation, the decisions SpecTpSync broadcast at each site, and the
// acceptance per round. --check compares the committed tokens with a plain single-rank loop.
// Run with mpiexec -n <tp>.
//
// Exit codes: 0 ok; 1 the decisions of an attention-TP group disagreed (possible only with a
// SpecTpSync site switched off and --rank-local-rng), --check found a difference, or another error;
// 2 bad input or a layout the docs/dspark.md start-up check rejects (unless --bypass-guard).
#include <nlohmann/json.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/gather_all.hpp"
#include "common/layout_flags.hpp"
#include "common/memory.hpp"
#include "common/mpi_main.hpp"
#include "common/progress.hpp"
#include "common/sync_report.hpp"
#include "common/trace_flag.hpp"
#include "relayout/comm.hpp"
#include "demo/decoder.hpp"
#include "demo/spec_reference.hpp"
#include "relayout/trace.hpp"

using namespace relayout;

namespace {

struct Options {
  cli::LayoutFlags layout;
  spec::SpecConfig cfg;
  std::vector<int> requests{1, 3, 0, 2};
  int width = 6;
  int hidden = 64;
  std::string format = "text";
  bool check = false;  // compare the committed tokens with the plain single-rank loop
  std::string trace;  // directory for the row-ownership traces, DIR/draft and DIR/target (empty: none)
  std::uint64_t max_memory = 0;  // --max-memory (0: the available memory is the limit)
};


const std::vector<std::string>& site_order() {
  static const std::vector<std::string> s{spec::kSitePlan, spec::kSiteDraftGreedy, spec::kSiteDraftSample,
                                          spec::kSiteTarget, spec::kSiteAcceptGreedy,
                                          spec::kSiteAcceptSample};
  return s;
}

// This rank's record, flattened: idle, disagreed, then per round per site [site index, n, values...],
// then per request [id, rounds x accepted, m, committed...].
using Decoder = spec::SpecDecoder<MpiCommunicator, Kokkos::DefaultExecutionSpace, cli::RunSink>;

std::vector<std::int64_t> encode(const Decoder& d) {
  std::vector<std::int64_t> v{d.idle() ? 1 : 0, d.disagreed() ? 1 : 0, std::int64_t(d.rounds().size())};
  for (const spec::RoundLog& log : d.rounds()) {
    v.push_back(std::int64_t(log.decisions.size()));
    for (const auto& [site, values] : log.decisions) {
      std::int64_t idx = 0;
      while (site_order()[std::size_t(idx)] != site) ++idx;
      v.push_back(idx);
      v.push_back(std::find(log.disagreed.begin(), log.disagreed.end(), site) != log.disagreed.end() ? 1 : 0);
      v.push_back(std::int64_t(values.size()));
      v.insert(v.end(), values.begin(), values.end());
    }
  }
  v.push_back(std::int64_t(d.requests().size()));
  for (const spec::RequestRecord& r : d.requests()) {
    v.push_back(r.id);
    v.push_back(std::int64_t(r.accepted.size()));
    v.insert(v.end(), r.accepted.begin(), r.accepted.end());
    v.push_back(std::int64_t(r.committed.size()));
    v.insert(v.end(), r.committed.begin(), r.committed.end());
  }
  return v;
}

// The attention-TP group that reports attention-DP group g: that of its CP rank 0 (every CP rank of
// the group holds the same requests and reaches the same decisions).
std::vector<int> reporting_group(const RuntimeLayout& layout, int g) {
  for (int r = 0; r < layout.size(); ++r) {
    const RankCoords k = layout.coords(r);
    if (k.attn_dp_rank == g && k.attn_cp_rank == 0) return layout.group_members(GroupKind::attn_tp, r);
  }
  throw LayoutError("--dp", "no rank holds attention-DP group " + std::to_string(g));
}

struct RankView {
  bool idle = false, disagreed = false;
  std::vector<std::map<std::string, std::pair<bool, std::vector<std::int64_t>>>> rounds;
  std::vector<spec::RequestRecord> requests;
};

RankView decode(const std::vector<std::int64_t>& v) {
  RankView r;
  std::size_t at = 0;
  r.idle = v[at++] != 0;
  r.disagreed = v[at++] != 0;
  const std::int64_t nr = v[at++];
  for (std::int64_t i = 0; i < nr; ++i) {
    auto& m = r.rounds.emplace_back();
    const std::int64_t ns = v[at++];
    for (std::int64_t s = 0; s < ns; ++s) {
      const std::string site = site_order()[std::size_t(v[at++])];
      const bool bad = v[at++] != 0;
      const std::int64_t n = v[at++];
      m[site] = {bad, std::vector<std::int64_t>(v.begin() + std::ptrdiff_t(at), v.begin() + std::ptrdiff_t(at) + n)};
      at += std::size_t(n);
    }
  }
  const std::int64_t nq = v[at++];
  for (std::int64_t q = 0; q < nq; ++q) {
    spec::RequestRecord rec;
    rec.id = int(v[at++]);
    const std::int64_t rounds = v[at++];
    for (std::int64_t k = 0; k < rounds; ++k) rec.accepted.push_back(int(v[at++]));
    const std::int64_t m = v[at++];
    for (std::int64_t k = 0; k < m; ++k) rec.committed.push_back(int(v[at++]));
    r.requests.push_back(rec);
  }
  return r;
}

template <class T>
std::string list(const std::vector<T>& v) {
  std::ostringstream s;
  s << "[";
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? " " : "") << v[i];
  s << "]";
  return s.str();
}

// Refuses (exit 2) a run whose memory does not fit, before anything is allocated: the draft (MoE
// model or dense MLP) and the target over every round's rows, their KV caches, and the hidden rows
// the head reads.
cli::MemoryEstimate require_size(const Options& o, const RuntimeLayout& layout, const MpiCommunicator& world) {
  const Widths& w = layout.widths();
  double requests = 0;
  for (int n : o.requests) requests += std::max(n, 0);
  const double rows = requests * o.width;
  cli::MemoryEstimate need = cli::estimate_model(o.cfg.target_dims, w, rows, o.width);
  const double kv = requests * double(o.cfg.kv_capacity) * o.cfg.target_dims.head_dim * cli::kv_cache_elem(o.cfg.target_dims);
  if (layout.config().draft == Draft::moe) {
    need += cli::estimate_model(o.cfg.draft_dims(), w, rows, o.width);
    need.buffers += kv * o.cfg.draft_layers;
  } else {
    need.weights += 4.0 * (2.0 * o.cfg.dense_inter + 1.0) * o.hidden;
  }
  need.buffers += 8.0 * rows * o.hidden + kv * o.cfg.target_dims.layers;
  cli::require_memory(world, need, o.max_memory,
                      cli::model_flags(o.cfg.target_dims, "--target-layers") + " --draft-layers " +
                          std::to_string(o.cfg.draft_layers) + " and " + std::to_string(std::int64_t(rows)) +
                          " rows (--requests-per-group x --tokens-per-req)");
  return need;
}

// --check: the committed tokens of every request against the plain single-rank loop (greedy: the
// target's own decode; sampled: a speculative-sampling run with the same seed). One line per
// request that differs, naming its first differing position.
std::vector<std::string> check(const Options& o, const std::vector<spec::RequestRecord>& reqs, Draft draft) {
  namespace plain = spec::plain;
  const plain::PlainModel target = plain::PlainModel::layers_of(o.cfg.target_dims);
  std::optional<plain::PlainModel> drafter;
  if (o.cfg.sample)
    drafter = draft == Draft::moe ? plain::PlainModel::layers_of(o.cfg.draft_dims()) : plain::PlainModel::dense_of(o.cfg);
  std::vector<std::string> out;
  for (const spec::RequestRecord& rec : reqs) {
    const std::vector<int> want = o.cfg.sample ? plain::speculative_decode(o.cfg, *drafter, target, rec.id).committed
                                               : plain::greedy_decode(o.cfg, target, rec.id, rec.committed.size());
    std::size_t p = 0;
    while (p < want.size() && p < rec.committed.size() && want[p] == rec.committed[p]) ++p;
    if (p == want.size() && p == rec.committed.size()) continue;
    out.push_back("request " + model::RowOwner::request_name(rec.id) + " (id " + std::to_string(rec.id) + ") position " +
                  std::to_string(p) + ": committed " +
                  (p < rec.committed.size() ? std::to_string(rec.committed[p]) : "nothing") + ", the plain loop " +
                  (p < want.size() ? std::to_string(want[p]) : "nothing"));
  }
  return out;
}

// The flags into the decoder's settings, refused (exit 2, the flag named) before anything runs.
void apply_flags(Options& o) {
  o.cfg.requests_per_group = o.requests;
  o.cfg.width = spec::TokensPerRequest{o.width};
  o.cfg.target_dims.hidden = o.hidden;
  if (o.cfg.rank_local_rng) o.cfg.sample = true;
  o.cfg.validate();
  if (o.check && std::accumulate(o.requests.begin(), o.requests.end(), 0LL) == 0)
    throw LayoutError("--requests-per-group", "--requests-per-group " + list(o.requests) +
                                                  ": no group has a request, so --check would compare nothing; "
                                                  "give at least one group a request");
}

// The prefill and every round, traced under --trace (DIR/draft, DIR/target), with progress on a
// long run.
void run_rounds(const Options& o, const RuntimeLayout& layout, const MpiCommunicator& world, const cli::MemoryEstimate& need,
                Decoder& dec) {
  cli::TraceDirLock trace_lock;               // held until the sinks below are closed
  cli::RunSink draft_sink, target_sink;      // their files stay closed without --trace
  if (!o.trace.empty()) {
    trace_lock.acquire(world, o.trace);
    const std::string& id = trace_lock.run_id();
    if (layout.config().draft == Draft::moe)
      cli::open_trace(world, draft_sink.file, o.trace + "/draft", "dspark_step draft", id);
    try {
      cli::open_trace(world, target_sink.file, o.trace + "/target", "dspark_step target", id);
    } catch (const LayoutError&) {  // every rank together: no draft trace of a run that did not start
      draft_sink.file.abandon();
      throw;
    }
  }
  {  // every round's forwards, and the target's attention over its cache, which grows each round
    const model::ModelDims& d = o.cfg.target_dims;
    const double rows = double(std::accumulate(o.requests.begin(), o.requests.end(), 0LL)) * o.width;
    const double cache = o.cfg.prompt + o.cfg.rounds * o.width / 2.0;  // rows per request, on average
    const double flops = o.cfg.rounds * (need.flops + 4.0 * d.heads / layout.widths().attn_tp * d.head_dim * rows * d.layers * cache);
    const long forwards = long(o.cfg.rounds + 1) * d.layers;
    if (world.rank() == 0 && cli::long_run(flops, forwards)) target_sink.show_progress("dspark_step target", forwards, flops);
  }
  dec.trace_to(draft_sink, target_sink);
  dec.run();
  draft_sink.file.close();  // the traces are complete
  target_sink.file.close();
}

// What rank 0 reports, from every rank's record.
struct Summary {
  std::vector<RankView> ranks;
  int rounds_run = 0;  // fewer than --rounds after a disagreement
  std::vector<std::int64_t> raw;
  std::vector<int> idle_ranks;
  bool disagreed = false;
  spec::DraftContext ctx;
  int sync_size = 1;
  cli::SyncedSites synced;
  std::vector<spec::RequestRecord> reqs;  // in id order, from each group's reporting rank
  int k = 0;                              // draft tokens per request per round
  std::vector<double> acceptance;         // per round
  double overall = 0, mean_accepted = 0;
  std::vector<std::string> mismatches;  // --check
  int rc = 0;
};

Summary summarize(const Options& o, const RuntimeLayout& layout, const Decoder& dec, const spec::SyncSites& sites,
                  const std::vector<std::vector<std::int64_t>>& all) {
  Summary m;
  for (const auto& v : all) m.ranks.push_back(decode(v));
  m.rounds_run = int(m.ranks.front().rounds.size());
  for (auto r : dec.meta().raw) m.raw.push_back(r.value);
  for (std::size_t r = 0; r < m.ranks.size(); ++r) {
    if (m.ranks[r].idle) m.idle_ranks.push_back(int(r));
    m.disagreed = m.disagreed || m.ranks[r].disagreed;
  }
  m.ctx = dec.draft_context_used();
  m.sync_size = layout.group_size(m.ctx.sync_group);
  std::set<std::string> visited;  // the sites this run's decoder went through
  for (const RankView& v : m.ranks)
    for (const auto& round : v.rounds)
      for (const auto& [site, _] : round) visited.insert(site);
  m.synced = cli::synced_sites(sites, visited, m.sync_size);
  // Requests in id order, taken from each group's rank 0 in the sync group's order.
  for (int g = 0; g < layout.widths().attn_dp; ++g) {
    const int first = reporting_group(layout, g).front();
    for (const auto& rec : m.ranks[std::size_t(first)].requests) m.reqs.push_back(rec);
  }
  // Acceptance: accepted draft tokens over proposed ones, per round and over the run.
  m.k = o.cfg.draft_tokens();
  const std::size_t n = m.reqs.size(), k = std::size_t(m.k), rounds = std::size_t(m.rounds_run);
  std::int64_t accepted_total = 0;
  for (int r = 0; r < m.rounds_run; ++r) {
    std::int64_t a = 0;
    for (const auto& rec : m.reqs) a += rec.accepted.at(std::size_t(r));
    accepted_total += a;
    m.acceptance.push_back(m.reqs.empty() ? 0.0 : double(a) / double(n * k));
  }
  m.overall = m.reqs.empty() || m.rounds_run == 0 ? 0.0 : double(accepted_total) / double(n * k * rounds);
  m.mean_accepted = m.reqs.empty() || m.rounds_run == 0 ? 0.0 : double(accepted_total) / double(n * rounds);
  if (o.check) m.mismatches = check(o, m.reqs, layout.config().draft);
  m.rc = m.disagreed || !m.mismatches.empty() ? 1 : 0;
  return m;
}

void print_json(const Options& o, const RuntimeLayout& layout, const Decoder& dec, const spec::SyncSites& sites,
                const Summary& m, bool guard_fails) {
  const Widths& w = layout.widths();
  const spec::DpSyncMetadata& meta = dec.meta();
  nlohmann::json j;
  j["layout"] = {{"tp", w.tp}, {"attn_dp", w.attn_dp}, {"attn_cp", w.attn_cp}, {"attn_tp", w.attn_tp}, {"moe_ep", w.moe_ep},
                 {"moe_tp", w.moe_tp}, {"draft", std::string(to_string(layout.config().draft))},
                 {"enable_dp_attention", layout.config().enable_dp_attention}};
  j["startup_check"] = guard_fails ? (o.cfg.bypass_guard ? "BYPASSED (developer experiment)" : "rejected") : "passed";
  j["draft_context"] = {{"patched", m.ctx.patched}, {"tp_group", std::string(to_string(m.ctx.tp_group))},
                        {"dp_moe_sync", m.ctx.dp_moe_sync}, {"sync_group", std::string(to_string(m.ctx.sync_group))},
                        {"sync_group_size", m.sync_size}};
  j["tokens_per_req"] = o.width;
  j["global_num_tokens"] = {{"raw_requests", m.raw}, {"scaled_rows", meta.scaled_values()}};
  j["idle_ranks"] = m.idle_ranks;
  j["sync_sites_enabled"] = m.synced.enabled;
  j["sync_sites_synced"] = m.synced.synced;
  j["rank_local_rng"] = o.cfg.rank_local_rng;
  j["disagreement"] = m.disagreed;
  j["mode"] = o.cfg.sample ? "sampled" : "greedy";
  j["draft_tokens"] = m.k;
  j["acceptance_per_round"] = m.acceptance;
  j["acceptance"] = m.overall;
  j["mean_accepted_per_request_per_round"] = m.mean_accepted;
  if (o.check) j["check"] = {{"passed", m.mismatches.empty()}, {"differences", m.mismatches}};
  for (int r = 0; r < m.rounds_run; ++r) {
    nlohmann::json round{{"round", r}, {"groups", nlohmann::json::array()}};
    for (int g = 0; g < w.attn_dp; ++g) {
      const auto members = reporting_group(layout, g);
      nlohmann::json grp{{"group", g}, {"idle", meta.idle(std::size_t(g))}, {"sites", nlohmann::json::object()}};
      for (const auto& [site, val] : m.ranks[std::size_t(members.front())].rounds.at(std::size_t(r))) {
        nlohmann::json per_rank = nlohmann::json::object();
        for (int k : members) per_rank[std::to_string(k)] = m.ranks[std::size_t(k)].rounds.at(std::size_t(r)).at(site).second;
        grp["sites"][site] = {{"synced", sites.enabled(site) && m.sync_size > 1}, {"agree", !val.first},
                              {"values_by_rank", per_rank}};
      }
      round["groups"].push_back(grp);
    }
    j["rounds"].push_back(round);
  }
  for (const auto& rec : m.reqs)
    j["requests"].push_back({{"id", rec.id}, {"accepted", rec.accepted}, {"committed", rec.committed}});
  std::cout << j.dump(2) << "\n";
}

// One line per round and group: the decisions at each site, a disagreement's values by rank.
void text_rounds(std::ostringstream& s, const RuntimeLayout& layout, const Decoder& dec, const Summary& m) {
  for (int r = 0; r < m.rounds_run; ++r) {
    s << "round " << r << ": acceptance " << m.acceptance[std::size_t(r)] << "\n";
    for (int g = 0; g < layout.widths().attn_dp; ++g) {
      const auto members = reporting_group(layout, g);
      const auto& round = m.ranks[std::size_t(members.front())].rounds.at(std::size_t(r));
      s << "  group " << g << (dec.meta().idle(std::size_t(g)) ? " (idle)" : "") << ":";
      for (const std::string& site : site_order()) {
        if (!round.count(site)) continue;
        s << " " << site << "=" << list(round.at(site).second);
        if (round.at(site).first) {
          s << " DISAGREE{";
          for (int k : members) s << " r" << k << list(m.ranks[std::size_t(k)].rounds.at(std::size_t(r)).at(site).second);
          s << " }";
        }
      }
      s << "\n";
    }
  }
}

void print_text(const Options& o, const RuntimeLayout& layout, const Decoder& dec, const Summary& m, bool guard_fails) {
  const Widths& w = layout.widths();
  std::ostringstream s;
  s << "dspark_step: tp=" << w.tp << " attn dp x tp = " << w.attn_dp << " x " << w.attn_tp
    << (w.attn_cp > 1 ? ", attn cp " + std::to_string(w.attn_cp) : std::string()) << ", moe dp x ep x tp = "
    << w.moe_dp << " x " << w.moe_ep << " x " << w.moe_tp << ", draft " << to_string(layout.config().draft)
    << ", DP attention " << (layout.config().enable_dp_attention ? "on" : "off") << "\n";
  if (guard_fails)
    s << "*** DEVELOPER EXPERIMENT: the DSpark start-up check was BYPASSED (--bypass-guard); this layout is "
         "rejected in production ***\n";
  s << "draft context: " << (m.ctx.patched ? "patched to " : "") << "tp group " << to_string(m.ctx.tp_group)
    << ", dp_moe_sync " << (m.ctx.dp_moe_sync ? "on" : "off") << "; SpecTpSync over " << to_string(m.ctx.sync_group)
    << " (" << m.sync_size << (m.sync_size == 1 ? " rank: broadcasts skipped" : " ranks") << "), " << m.synced.text << "\n";
  s << "global_num_tokens raw (requests):   " << list(m.raw) << "\n";
  s << "global_num_tokens scaled (rows, x" << o.width << "): " << list(dec.meta().scaled_values()) << "\n";
  s << "idle participation (zero rows, same metadata, draft + verify forwards run): ranks " << list(m.idle_ranks)
    << "\n";
  text_rounds(s, layout, dec, m);
  s << "requests (accepted per round; committed tokens):\n";
  for (const auto& rec : m.reqs)
    s << "  " << model::RowOwner::request_name(rec.id) << " accepted " << list(rec.accepted) << " committed "
      << list(rec.committed) << "\n";
  if (m.reqs.empty())
    s << "no requests: every rank ran its " << m.rounds_run << " rounds idle; nothing was proposed or committed\n";
  else
    s << (o.cfg.sample ? "sampled" : "greedy") << " acceptance over " << m.rounds_run << " rounds: " << m.overall
      << " of k = " << m.k << " draft tokens; mean accepted tokens per request per round " << m.mean_accepted
      << " (committed " << m.mean_accepted + 1 << ")\n";
  if (o.check) {
    if (m.mismatches.empty())
      s << "check: the committed tokens equal the " << (o.cfg.sample ? "single-rank speculative run (plain loop, same seed)" : "target's own greedy decode (plain loop, one rank)") << " for every request\n";
    for (const std::string& x : m.mismatches) s << "CHECK FAILED: " << x << "\n";
  }
  if (m.disagreed)
    s << "DISAGREEMENT: members of an attention-TP group hold different decisions (SpecTpSync off for these "
         "sites); exit 1\n";
  std::cout << s.str();
}

// Collective over the job: every rank runs the rounds; rank 0 writes the report.
int run(Options& o, const MpiCommunicator& world) {
  const RuntimeLayout layout = o.layout.layout();
  if (world.size() != layout.size())
    throw LayoutError("--tp", "--tp " + std::to_string(layout.size()) + " needs exactly tp MPI ranks; this job has " +
                                  std::to_string(world.size()) + " (run with mpiexec -n " + std::to_string(layout.size()) + ")");
  apply_flags(o);
  const cli::MemoryEstimate need = require_size(o, layout, world);
  const spec::SyncSites sites = spec::SyncSites::from_env();  // RELAYOUT_SPEC_TP_SYNC
  const bool guard_fails = !layout.dspark().allowed;
  const ProcessGroups groups(layout, world);
  const Kokkos::DefaultExecutionSpace exec;  // the one instance both models run on
  Decoder dec(groups, o.cfg, sites, exec);   // the start-up check (exit 2)
  run_rounds(o, layout, world, need, dec);

  const auto all = cli::gather_all(world, encode(dec));
  if (world.rank() != 0) return dec.disagreed() ? 1 : 0;
  JobGuard::working_alone(o.check ? "the --check reference and the report" : "writing the report");
  const Summary m = summarize(o, layout, dec, sites, all);
  if (o.format == "json") print_json(o, layout, dec, sites, m, guard_fails);
  else print_text(o, layout, dec, m, guard_fails);
  return m.rc;
}

}  // namespace

int main(int argc, char** argv) {
  const cli::MpiSession mpi(argc, argv);
  int rc = 0;
  {
    cli::KokkosArgs args(argc, argv);
    JobGuard job;  // a rank that fails alone ends the job instead of leaving the others waiting
    Options o;
    o.layout.draft = "moe";
    CLI::App app{"dspark_step: speculative decode rounds on a KV cache (draft + verify, greedy or sampled acceptance) on MPI ranks; "
                 "RELAYOUT_SPEC_TP_SYNC=all|off|SITE,SITE chooses the SpecTpSync sites"};
    o.layout.add_to(app);
    cli::add_int_list(app, "--requests-per-group", o.requests, "requests per attention-DP group, e.g. 1,3,0,2");
    cli::add_int(app, "--tokens-per-req", o.width,
                 "rows per request in the verify forward (num_tokens_per_req): k = N - 1 draft tokens plus one");
    cli::add_int(app, "--rounds", o.cfg.rounds, "speculative rounds");
    cli::add_int(app, "--vocab", o.cfg.vocab, "vocabulary size of the toy head");
    cli::add_int(app, "--hidden", o.hidden, "hidden size of draft and target");
    // Checked here: the models' own check would name their shared field, --layers.
    cli::add_int(app, "--target-layers", o.cfg.target_dims.layers, "target decoder layers", 1, std::numeric_limits<int>::max());
    cli::add_int(app, "--draft-layers", o.cfg.draft_layers, "MoE draft: the target's first N layers (same weights)", 1,
                 std::numeric_limits<int>::max());
    cli::add_int(app, "--prompt", o.cfg.prompt, "prompt tokens per request (prefilled into both KV caches)");
    cli::add_int(app, "--kv-capacity", o.cfg.kv_capacity, "KV cache rows per request (prompt - 1 + rounds x tokens-per-req must fit)");
    cli::add_float(app, "--head-hidden-weight", o.cfg.hidden_weight,
                   "toy vocabulary head: weight of the hidden-row projection against the bigram table "
                   "(lower: draft and target agree more often)");
    cli::add_int(app, "--seed", o.cfg.seed, "seed of the vocabulary head, prompts and sampler");
    app.add_flag("--sample", o.cfg.sample,
                 "speculative sampling: the draft samples (site DRAFT_SAMPLE), acceptance by min(1, p/q) with "
                 "resampling (ACCEPT_SAMPLE); default greedy (DRAFT_GREEDY, TARGET, ACCEPT_GREEDY)");
    cli::add_float(app, "--temperature", o.cfg.temperature, "sampling temperature of draft and target (with --sample; > 0)");
    app.add_flag("--check", o.check,
                 "compare the committed tokens with a plain single-rank loop (greedy: the target's own decode; "
                 "--sample: a speculative run with the same seed); exit 1 on a difference");
    app.add_flag("--rank-local-rng", o.cfg.rank_local_rng,
                 "seed each rank's sampler differently (implies --sample): only SpecTpSync makes a group agree");
    app.add_flag("--bypass-guard", o.cfg.bypass_guard,
                 "DEVELOPER EXPERIMENT: run a layout the DSpark start-up check rejects");
    cli::add_path(app, "--trace", o.trace,
                   "write row-ownership traces of every round, DIR/draft (MoE draft) and DIR/target, one "
                   "DIR/*/rank<R>.jsonl per rank (compare each with `relayout trace diff`)");
    app.add_option("--format", o.format, "text or json")->check(CLI::IsMember({"text", "json"}));
    cli::add_max_memory(app, o.max_memory);
    rc = cli::run_mpi_main(app, args, job, [&] { return run(o, MpiCommunicator::world()); });
  }
  return rc;
}
