// An inference engine's serving loop on the installed relayout package, attention side included:
// its own model (6 query heads sharing one KV head, a tanh-MLP MoE that is not SwiGLU, double
// precision), its own KV store and attention kernel, its own communicator and execution-space
// instance. Decode steps under attention CP (attn_cp = 2 on 2 or 4 ranks; one rank: no CP), with
// continuous batching: requests join mid-run with their prompt as extend rows beside the decode
// rows, and one leaves. Every row of every step is compared with a serial computation of its own;
// with --trace DIR each rank writes a row-ownership trace (trace::Recorder: its attention output,
// every bridge boundary, its layer output) that `relayout trace diff` compares with a one-rank run. Prints one line per step; exits 1 on any mismatch.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <relayout/relayout.hpp>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Scalar = double;
using View = relayout::RowsView<Scalar, Exec>;

constexpr int kHidden = 12, kHeads = 6, kDim = 4, kExperts = 4, kTopK = 2, kInter = 6;

Scalar param(int tensor, int i, int j) {
  const std::uint64_t h = (std::uint64_t(tensor) * 1000003u + std::uint64_t(i) * 7919u + std::uint64_t(j) * 104729u) % 2003u;
  return (Scalar(h) / 2003.0 - 0.5) * 0.8;
}
// The token embedding of (request, position).
Scalar embed(int request, int position, int f) { return std::sin(0.41 * request + 0.29 * position + 0.13 * f); }

// ---- the engine's attention projections: q = x Wq (heads x dim), kv = x Wkv, out = o Wo
Scalar q_of(const Scalar* x, int h, int d) {
  Scalar s = 0;
  for (int f = 0; f < kHidden; ++f) s += param(1, h * kDim + d, f) * x[f];
  return s;
}
Scalar kv_of(const Scalar* x, int d) {
  Scalar s = 0;
  for (int f = 0; f < kHidden; ++f) s += param(2, d, f) * x[f];
  return s;
}
Scalar wo(int f, int h, int d) { return param(3, f, h * kDim + d); }

// ---- the engine's MoE: softmax top-2 router, experts y = A tanh(B x) (no shared expert)
struct Router {
  int top_k() const { return kTopK; }
  static void route(const Scalar* x, int* ids, Scalar* w) {
    Scalar logit[kExperts];
    for (int e = 0; e < kExperts; ++e) {
      logit[e] = 0;
      for (int f = 0; f < kHidden; ++f) logit[e] += param(4, e, f) * x[f];
    }
    const int a = int(std::max_element(logit, logit + kExperts) - logit);
    int b = a == 0 ? 1 : 0;
    for (int e = 0; e < kExperts; ++e)
      if (e != a && logit[e] > logit[b]) b = e;
    ids[0] = a, ids[1] = b;
    w[0] = 1 / (1 + std::exp(logit[b] - logit[a])), w[1] = 1 - w[0];
  }
  void operator()(const Exec& exec, const View& x, relayout::TopK<Scalar, Exec>& out) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i) route(&xh(i, 0), &ih(i, 0), &wh(i, 0));
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();
  }
};
Scalar expert(int e, const Scalar* x, int f, int i0, int i1) {
  Scalar y = 0;
  for (int i = i0; i < i1; ++i) {
    Scalar h = 0;
    for (int g = 0; g < kHidden; ++g) h += param(10 + 2 * e, i, g) * x[g];
    y += param(11 + 2 * e, f, i) * std::tanh(h);
  }
  return y;
}
struct Experts {
  int moe_tp = 1, moe_tp_rank = 0;
  void operator()(const Exec& exec, const relayout::ExpertBatch<Scalar, Exec>& b, const View& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    const int i0 = kInter * moe_tp_rank / moe_tp, i1 = kInter * (moe_tp_rank + 1) / moe_tp;
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (int f = 0; f < kHidden; ++f) yh(r, f) = expert(b.first_expert + e, &xh(r, 0), f, i0, i1);
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};

// ---- the engine's own KV store and attention kernel (a relayout::ExtendKernel): per slot the kv
// rows this rank holds, in position order; row b attends rows [first(b), limits(b)) of slot(b).
struct KvStore {
  std::vector<std::vector<std::vector<Scalar>>> rows;  // [slot][held row][dim]
};
// What the request table tells the store (relayout::KvStoreHook): a slot changes hands, empties,
// or is rolled back to its first rows.
struct StoreHook {
  KvStore* store;
  void on_admit(int slot, std::int64_t) const { store->rows[std::size_t(slot)].clear(); }
  void on_release(int slot) const { store->rows[std::size_t(slot)].clear(); }
  void on_truncate(int slot, std::int64_t rows) const { store->rows[std::size_t(slot)].resize(std::size_t(rows)); }
};
struct MyAttention {
  const KvStore* store;
  int heads;
  void operator()(const Exec& exec, const View& q, const relayout::ExtendRows<Mem>& rows, const View& out,
                  const View& lse) const {
    auto qh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q);
    auto oh = Kokkos::create_mirror_view(out);
    auto lh = Kokkos::create_mirror_view(lse);
    auto slot = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rows.slots);
    auto lim = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rows.limits);
    auto first = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rows.first);
    const double scale = 1 / std::sqrt(double(kDim));
    for (std::size_t b = 0; b < q.extent(0); ++b) {
      const auto& keys = store->rows[std::size_t(slot(b))];
      for (int h = 0; h < heads; ++h) {
        double m = -std::numeric_limits<double>::infinity(), l = 0, acc[kDim] = {};
        for (int k = first(b); k < lim(b); ++k) {
          double s = 0;
          for (int d = 0; d < kDim; ++d) s += qh(b, h * kDim + d) * keys[std::size_t(k)][std::size_t(d)];
          s *= scale;
          const double mn = std::max(m, s), c = std::exp(m - mn), p = std::exp(s - mn);
          l = l * c + p;
          for (int d = 0; d < kDim; ++d) acc[d] = acc[d] * c + p * keys[std::size_t(k)][std::size_t(d)];
          m = mn;
        }
        for (int d = 0; d < kDim; ++d) oh(b, h * kDim + d) = l > 0 ? acc[d] / l : 0;
        if (!rows.whole) lh(b, h) = l > 0 ? m + std::log(l) : -std::numeric_limits<double>::infinity();
      }
    }
    Kokkos::deep_copy(exec, out, oh);
    if (!rows.whole) Kokkos::deep_copy(exec, lse, lh);
    exec.fence();
  }
};

// ---- the serial answer: every row of a request through attention over all its positions, + MoE
struct Serial {
  std::map<int, std::vector<std::vector<Scalar>>> kv;  // per request, every position
  std::vector<Scalar> row(int request, int position) {
    Scalar x[kHidden], a[kHidden] = {}, y[kHidden];
    for (int f = 0; f < kHidden; ++f) x[f] = embed(request, position, f);
    auto& keys = kv[request];
    keys.resize(std::size_t(position + 1), std::vector<Scalar>(kDim));
    for (int d = 0; d < kDim; ++d) keys[std::size_t(position)][std::size_t(d)] = kv_of(x, d);
    for (int h = 0; h < kHeads; ++h) {
      std::vector<double> s;
      for (int k = 0; k <= position; ++k) {
        double dot = 0;
        for (int d = 0; d < kDim; ++d) dot += q_of(x, h, d) * keys[std::size_t(k)][std::size_t(d)];
        s.push_back(dot / std::sqrt(double(kDim)));
      }
      const double m = *std::max_element(s.begin(), s.end());
      double l = 0;
      for (double& v : s) l += (v = std::exp(v - m));
      for (int d = 0; d < kDim; ++d) {
        double o = 0;
        for (int k = 0; k <= position; ++k) o += s[std::size_t(k)] / l * keys[std::size_t(k)][std::size_t(d)];
        for (int f = 0; f < kHidden; ++f) a[f] += wo(f, h, d) * o;
      }
    }
    int ids[kTopK];
    Scalar w[kTopK];
    Router::route(a, ids, w);
    std::vector<Scalar> out(kHidden);
    for (int f = 0; f < kHidden; ++f) {
      y[f] = 0;
      for (int k = 0; k < kTopK; ++k) y[f] += w[k] * expert(ids[k], a, f, 0, kInter);
      out[std::size_t(f)] = x[f] + a[f] + y[f];
    }
    return out;
  }
};

// What joins and leaves at each step: (request, new rows) in step order; a request not seen before
// joins with its prompt; `leaving` finishes after the step.
struct Step {
  std::vector<std::pair<int, int>> rows;
  int leaving = -1;
};
const std::vector<Step> kSteps = {
    {{{0, 5}, {1, 3}}},                  // two prompts
    {{{0, 1}, {1, 1}}},                  // decode
    {{{0, 1}, {2, 4}, {1, 1}}},          // request 2 joins: its prompt beside the decode rows
    {{{0, 1}, {1, 1}, {2, 1}}, 1},       // request 1 leaves after this step
    {{{3, 2}, {0, 1}, {2, 1}}},          // request 3 joins in request 1's slot
    {{{0, 1}, {2, 1}, {3, 1}}},
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::string trace_dir;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--trace") trace_dir = argv[i + 1];
  int failures = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int size = 0, world_rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm engine;
    MPI_Comm_split(MPI_COMM_WORLD, 0, world_rank, &engine);
    using namespace relayout;
    try {
      // ---- set-up: layout, groups, the attention side, the bridge, the KV store and its request table
      const MpiCommunicator world = MpiCommunicator::adopt(engine);
      const LayoutConfig config{.tp = size, .cp = size >= 2 ? 2 : 1};
      const ProcessGroups pg(RuntimeLayout(config), world);
      const RankCoords k = pg.coords();
      const Widths& w = pg.layout().widths();
      const int heads = kHeads / w.attn_tp, h0 = k.attn_tp_rank * heads;
      Exec exec;
      TrafficLog log;
      CpAttention<MpiCommunicator, Scalar, Exec> attn(pg, &log);
      MoeBridge<MpiCommunicator, Scalar, Exec> bridge(pg, kExperts);
      constexpr int kSlots = 4;
      KvStore store{std::vector<std::vector<std::vector<Scalar>>>(kSlots)};
      auto requests = attn.request_table(kSlots, StoreHook{&store});  // slots, CP positions, the store
      trace::JsonlSink sink;
      if (!trace_dir.empty()) sink.open(trace_dir, k.rank, size, "engine_attention");
      std::vector<std::int64_t> counts;  // this step's global_num_tokens, stamped on every record
      trace::Recorder<MpiCommunicator, trace::JsonlSink> rec(pg, &sink, &counts);
      Serial serial;
      const Router router;
      const Experts experts{w.moe_tp, k.moe_tp_rank};

      for (std::size_t s = 0; s < kSteps.size(); ++s) {
        // ---- the step's rows: joins, the table's plan (this rank's rows under CP)
        std::vector<RequestRows> step;
        for (const auto& [request, count] : kSteps[s].rows) {
          if (!requests.holds(request)) requests.admit(request);  // a reused slot comes back empty
          step.push_back({request, count});
        }
        const ExtendPlan plan = requests.extend(step);
        const std::size_t n = std::size_t(plan.rows()), HD = std::size_t(heads * kDim);
        // ---- the engine's projections; kv into its own store
        View x("x", n, kHidden), q("q", n, HD), o("o", n, HD), part("attn_partial", n, kHidden);
        auto xh = Kokkos::create_mirror_view(x);
        auto qh = Kokkos::create_mirror_view(q);
        std::vector<int> request_of(n);
        std::vector<std::int64_t> owners(n);  // the rows' (request, position), for the trace
        for (std::size_t i = 0; i < n; ++i) {
          request_of[i] = int(requests.id_in(plan.slot[i]));
          owners[i] = trace::RowOwner::pack(request_of[i], plan.position[i]);
          for (int f = 0; f < kHidden; ++f) xh(i, f) = embed(request_of[i], plan.position[i], f);
          for (int h = 0; h < heads; ++h)
            for (int d = 0; d < kDim; ++d) qh(i, h * kDim + d) = q_of(&xh(i, 0), h0 + h, d);
          std::vector<Scalar> kv(kDim);
          for (int d = 0; d < kDim; ++d) kv[std::size_t(d)] = kv_of(&xh(i, 0), d);
          store.rows[std::size_t(plan.slot[i])].push_back(kv);
        }
        Kokkos::deep_copy(exec, x, xh);
        Kokkos::deep_copy(exec, q, qh);
        // ---- attention under CP with the engine's kernel, wo (partial over attn_tp), all-reduce
        attn.extend(exec, plan, extend_rows(exec, plan), q, o, kDim, MyAttention{&store, heads});
        auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), o);
        auto ph = Kokkos::create_mirror_view(part);
        for (std::size_t i = 0; i < n; ++i)
          for (int f = 0; f < kHidden; ++f) {
            Scalar v = 0;
            for (int h = 0; h < heads; ++h)
              for (int d = 0; d < kDim; ++d) v += wo(f, h0 + h, d) * oh(i, h * kDim + d);
            ph(i, f) = v;
          }
        Kokkos::deep_copy(exec, part, ph);
        const auto a = attn.all_reduce(exec, Rows<Scalar, Partial<AttnTp>, DpLocal, Exec>(part));
        // ---- the MoE hand-over with the engine's router and experts (every boundary traced); residual
        counts = bridge.gather_num_tokens(std::int64_t(n));
        rec.step = int(s);
        rec.attention_output(0, owners, a.view());
        rec.bridge_input(0, owners, a.view());
        const auto y = bridge.run(exec, a, router, experts,
                                  {.global_num_tokens = counts, .owners = &owners, .observer = rec.observer(0)});
        const auto ah = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.view());
        const auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
        Kokkos::View<Scalar**, Kokkos::HostSpace> out("out", n, kHidden);
        for (std::size_t i = 0; i < n; ++i)
          for (int f = 0; f < kHidden; ++f) out(i, f) = xh(i, f) + ah(i, f) + yh(i, f);
        rec.layer_output(0, owners, out);
        // ---- check every row against the serial computation; leave
        double err = 0;
        for (const auto& [request, count] : kSteps[s].rows)
          for (int c = 0; c < count; ++c) {
            const int p = int(requests.length(request)) - count + c;
            const std::vector<Scalar> ref = serial.row(request, p);
            for (std::size_t i = 0; i < n; ++i)
              if (request_of[i] == request && plan.position[i] == p)
                for (int f = 0; f < kHidden; ++f) err = std::max(err, std::abs(out(i, f) - ref[std::size_t(f)]));
          }
        all_reduce_in_place(world, std::span<double>(&err, 1), ReduceOp::max);
        std::int64_t rows = std::int64_t(n);
        all_reduce_in_place(pg.comm(GroupKind::attn_cp), std::span<std::int64_t>(&rows, 1));
        const bool ok = err < 1e-12;
        failures += ok ? 0 : 1;
        if (k.rank == 0)
          std::printf("engine_attention: step %zu  attn_cp %d attn_tp %d  %lld rows  double  max_err %.3g  %s\n", s,
                      w.attn_cp, w.attn_tp, static_cast<long long>(rows), err, ok ? "OK" : "MISMATCH");
        if (kSteps[s].leaving >= 0) requests.finish(kSteps[s].leaving);
      }
      if (sink.active()) sink.close();
    } catch (const std::exception& e) {
      ++failures;
      std::fprintf(stderr, "engine_attention: rank %d: %s\n", world_rank, e.what());
    }
    MPI_Comm_free(&engine);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
