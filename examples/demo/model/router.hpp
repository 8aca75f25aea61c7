// The demo model's router: the library's gate + top-k (kernels::LinearTopkRouter), or, with
// ModelDims::expert_skew = s > 0, a skewed one for load-balance demos. Skewed, each token draws its
// top-k experts from a Zipf law of exponent s over a permutation of the experts fixed by the seed
// (relayout::zipf_topk_ids, keyed by the token's owner id: the same experts whichever rank routes
// it, and in the single-rank reference), and the drawn experts are weighed as the gate weighs
// them: the other experts' logits are masked out before route(), so its softmax (or sigmoid)
// scores, renormalised over the top-k, are those of the drawn experts. Every layer draws alike.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "relayout/bridge.hpp"
#include "relayout/bridge/testing.hpp"
#include "relayout/kernels/convert.hpp"
#include "relayout/kernels/moe.hpp"
#include "relayout/kernels/reference.hpp"
#include "relayout/placement/zipf_routing.hpp"
#include "demo_model/config.hpp"

namespace relayout::model {

// The Zipf law of the skewed router: hot experts spread by a seed-fixed permutation.
inline ZipfRouting skew_routing(const ModelDims& d) {
  return ZipfRouting{.experts = d.experts, .top_k = d.topk, .s = d.expert_skew, .seed = d.seed, .shuffle = true};
}

// A masked logit: no drawn expert's score is this small, and exp() of it is 0 under softmax and
// sigmoid scoring alike.
inline constexpr double kMaskedLogit = -1e30;

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
struct DemoRouter {
  using Mem = typename ExecSpace::memory_space;
  kernels::LinearTopkRouter<float, ExecSpace> gate;
  ZipfRouting zipf{};
  bool skewed = false;
  Kokkos::View<const std::int64_t*, Mem> tokens;  // skewed: the owner id of each row routed here
  // Under two-batch overlap the bridge routes its rows in two calls, the first micro-batch's rows
  // first: each call takes the next x.extent(0) token ids; the count starts again once all are taken.
  std::shared_ptr<std::size_t> taken = std::make_shared<std::size_t>(0);

  int top_k() const { return gate.top_k(); }
  // bf16 rows: the gate stays fp32 and reads them widened (exactly), as the reference does.
  void operator()(const ExecSpace& exec, const RowsView<relayout::bf16, ExecSpace>& x, TopK<relayout::bf16, ExecSpace>& out) const {
    RowsView<float, ExecSpace> wide(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::router_rows")),
                                    x.extent(0), x.extent(1));
    kernels::convert_rows(exec, x, wide);
    TopK<float, ExecSpace> f(out.ids, out.weights);
    (*this)(exec, wide, f);
  }
  void operator()(const ExecSpace& exec, const RowsView<float, ExecSpace>& x, TopK<float, ExecSpace>& out) const {
    if (!skewed) return gate(exec, x, out);
    const std::size_t first = *taken, n = x.extent(0);
    if (first + n > tokens.extent(0))
      throw LayoutError("expert_skew", "skewed router: " + std::to_string(n) + " rows to route and " +
                                           std::to_string(tokens.extent(0) - first) + " token ids left");
    *taken = first + n == tokens.extent(0) ? 0 : first + n;
    const auto mine = Kokkos::subview(tokens, std::pair<std::size_t, std::size_t>(first, first + n));
    RowsView<float, ExecSpace> logits(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::router_logits")),
                                      x.extent(0), std::size_t(gate.gate.out_features));
    kernels::linear(exec, x, gate.gate, logits);
    zipf_topk_ids(exec, zipf, mine, out.ids);  // the drawn experts; route() below rewrites ids in its order
    const auto ids = out.ids;
    const int experts = int(logits.extent(1)), k = int(ids.extent(1));
    Kokkos::parallel_for(
        "relayout::skew_mask", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(x.extent(0))),
        KOKKOS_LAMBDA(const std::int64_t t) {
          for (int e = 0; e < experts; ++e) {
            bool drawn = false;
            for (int j = 0; j < k; ++j) drawn = drawn || ids(t, j) == e;
            if (!drawn) logits(t, e) = float(kMaskedLogit);
          }
        });
    kernels::route(exec, logits, gate.config, out.ids, out.weights);
  }
};

// The reference's logits for the skewed router: those of each row's drawn experts kept, the others
// masked (owners: the rows' owner ids).
inline reference::Matrix skewed_logits(const ModelDims& d, reference::Matrix logits, std::span<const std::int64_t> owners) {
  if (owners.size() != std::size_t(logits.rows))
    throw LayoutError("expert_skew", "skewed reference router: " + std::to_string(owners.size()) + " owners for " +
                                         std::to_string(logits.rows) + " rows");
  using Host = Kokkos::DefaultHostExecutionSpace;
  Kokkos::View<int**, Kokkos::LayoutRight, Kokkos::HostSpace> ids("relayout::skew_ids", owners.size(), std::size_t(d.topk));
  Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> tok(owners.data(), owners.size());
  zipf_topk_ids(Host(), skew_routing(d), tok, ids);
  for (int t = 0; t < logits.rows; ++t)
    for (int e = 0; e < logits.cols; ++e) {
      bool drawn = false;
      for (int j = 0; j < d.topk; ++j) drawn = drawn || ids(t, j) == e;
      if (!drawn) logits(t, e) = kMaskedLogit;
    }
  return logits;
}

// The owner ids of the rows the bridge hands the router on this rank, from the owners of this
// rank's rows (its DP group's, Replicated over attn_tp): paths a2a_split and direct route this
// rank's attn_tp chunk (split_rows; all rows under the injected no_split), tp_moe its moe_dp slice,
// dp_gather its moe_dp slice of every group's rows gathered as the bridge gathers them (pads route
// as token 0; one all-gather of the owner ids over the domain).
template <class C, class T, class ExecSpace>
std::vector<std::int64_t> routed_owners(const MoeBridge<C, T, ExecSpace>& bridge, const ProcessGroupsOf<C>& pg,
                                        std::span<const std::int64_t> counts, const std::vector<std::int64_t>& owners) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  using OwnerView = RowsView<std::int64_t, Host>;
  OwnerView v("relayout::owner_ids", owners.size(), 1);
  for (std::size_t i = 0; i < owners.size(); ++i) v(i, 0) = owners[i];
  const Rows<std::int64_t, Replicated<AttnTp>, DpLocal, Host> rows(v);
  const auto column = [](const OwnerView& o, std::int64_t first, std::int64_t n) {
    std::vector<std::int64_t> out(static_cast<std::size_t>(n), 0);
    for (std::int64_t i = 0; i < n; ++i) out[std::size_t(i)] = o(std::size_t(first + i), 0);
    return out;
  };
  const Widths& w = pg.layout().widths();
  switch (bridge.path()) {
    case BridgePath::a2a_split:
    case BridgePath::direct: {
      if (testing::injected_fault(bridge) == BridgeFault::no_split) return owners;
      const OwnerView chunk = split_rows(pg, rows).view();
      return column(chunk, 0, std::int64_t(chunk.extent(0)));
    }
    case BridgePath::tp_moe: {
      const Range mine = tensor_split_range(std::int64_t(owners.size()), w.moe_dp, pg.coords().moe_dp_rank);
      return column(v, mine.begin, mine.count);
    }
    case BridgePath::dp_gather: break;
  }
  const DpSlotsPtr slots = bridge.slots(counts);
  OwnerView global = dp_gather_replicate(bridge.dp_groups(), rows, slots).view();
  if (slots->mode() == PaddingMode::max_len)
    for (int g = 0; g < slots->groups(); ++g)
      for (std::int64_t r = slots->count(g); r < slots->slot_rows(); ++r) global(std::size_t(slots->offset(g) + r), 0) = 0;
  const Range mine = tensor_split_range(std::int64_t(global.extent(0)), w.moe_dp, pg.coords().moe_dp_rank);
  return column(global, mine.begin, mine.count);
}

}  // namespace relayout::model
