// The MoE block on one rank: routed experts (the ones this rank holds, with its intermediate shard)
// plus the shared expert, either on rows every rank holds (partial sums, summed once by the caller)
// or with expert-parallel dispatch/combine of this rank's own rows over moe_ep (complete outputs).
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <span>
#include <vector>

#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/moe.hpp"
#include "relayout/kernels/router.hpp"
#include "relayout/model/layer_weights.hpp"
#include "relayout/model/rows.hpp"
#include "relayout/moe/wire.hpp"

namespace relayout::moe {

template <class ExecSpace>
using RowView = typename model::Rows<ExecSpace>::View;

template <class ExecSpace>
struct Routed {
  Kokkos::View<int**, Kokkos::LayoutRight, typename ExecSpace::memory_space> ids;
  RowView<ExecSpace> weights;
};

template <class ExecSpace, class X>
Routed<ExecSpace> route_rows(const ExecSpace& exec, const model::ModelDims& d,
                             const model::LayerShard<ExecSpace>& w, const X& x) {
  const std::size_t m = x.extent(0);
  RowView<ExecSpace> logits("relayout::router_logits", m, std::size_t(d.experts));
  kernels::linear(exec, x, w.router, logits);
  Routed<ExecSpace> r{decltype(Routed<ExecSpace>::ids)("relayout::topk_ids", m, std::size_t(d.topk)),
                      RowView<ExecSpace>("relayout::topk_weights", m, std::size_t(d.topk))};
  kernels::route(exec, logits, d.router(), r.ids, r.weights);
  return r;
}

// out[begin, end) = this rank's partial MoE output for rows [begin, end) of x: the routed experts it
// holds (intermediate shard included) and its shard of the shared expert. Summing the partials of
// every rank of the MoE (moe_ep x moe_tp) gives the complete output. No communication.
template <class ExecSpace>
void moe_partial(const ExecSpace& exec, const model::ModelDims& d, const model::LayerShard<ExecSpace>& w,
                 const RowView<ExecSpace>& x, std::int64_t begin, std::int64_t end,
                 const RowView<ExecSpace>& out) {
  if (end <= begin) return;
  const auto rows = Kokkos::make_pair(begin, end);
  const auto xs = Kokkos::subview(x, rows, Kokkos::ALL());
  const auto os = Kokkos::subview(out, rows, Kokkos::ALL());
  const Routed<ExecSpace> r = route_rows(exec, d, w, xs);
  const auto buckets = kernels::bucket_by_expert(exec, r.ids, w.spec.experts, w.spec.expert_begin);
  RowView<ExecSpace> y_sorted("relayout::y_sorted", std::size_t(buckets.rows()), std::size_t(d.hidden));
  kernels::expert_ffn(exec, xs, buckets, w.experts, y_sorted);
  kernels::moe_combine(exec, y_sorted, buckets, r.weights, os);
  if (w.spec.shared > 0) kernels::swiglu_ffn(exec, xs, w.shared, os, true);
}

// Expert parallelism: route this rank's rows, send each (row, k) slot to the moe_ep rank holding its
// expert (all_to_allv), run the local experts on what arrived, send the outputs back and combine
// them with the router weights, plus the shared expert. Returns complete outputs for x's rows.
// Ranks with no rows still take part in every exchange. `dispatched`, when given, receives the
// owners of the slots this rank's experts processed.
template <class C, class ExecSpace>
RowView<ExecSpace> ep_moe(Wire<C>& wire, const ExecSpace& exec, const model::ModelDims& d,
                          const model::LayerShard<ExecSpace>& w, const RowView<ExecSpace>& x,
                          const std::vector<std::int64_t>& owners,
                          std::vector<std::int64_t>* dispatched = nullptr) {
  using Mem = typename ExecSpace::memory_space;
  const int H = d.hidden, K = d.topk, experts_per_rank = w.spec.experts;
  const int ep = wire.size(GroupKind::moe_ep);
  const std::int64_t m = std::int64_t(x.extent(0)), slots = m * K;

  const Routed<ExecSpace> r = route_rows(exec, d, w, x);
  const auto ids = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.ids);

  // Slots in destination order (stable), and where each slot sits in the send buffer.
  std::vector<int> send_counts(static_cast<std::size_t>(ep), 0);
  for (std::int64_t s = 0; s < slots; ++s) ++send_counts[std::size_t(ids(s / K, s % K) / experts_per_rank)];
  std::vector<int> next(static_cast<std::size_t>(ep), 0);
  for (int j = 1; j < ep; ++j) next[std::size_t(j)] = next[std::size_t(j - 1)] + send_counts[std::size_t(j - 1)];
  Kokkos::View<int*, Mem> pos("relayout::slot_pos", std::size_t(slots));
  auto pos_h = Kokkos::create_mirror_view(pos);
  std::vector<int> send_expert(static_cast<std::size_t>(slots));
  // Owners travel only when asked for, and then on every rank (a rank with no rows sends none).
  const bool track = dispatched != nullptr;
  std::vector<std::int64_t> send_owner(track ? std::size_t(slots) : 0);
  for (std::int64_t s = 0; s < slots; ++s) {
    const int e = ids(s / K, s % K);
    const int p = next[std::size_t(e / experts_per_rank)]++;
    pos_h(s) = p;
    send_expert[std::size_t(p)] = e;
    if (track) send_owner[std::size_t(p)] = owners.at(std::size_t(s / K));
  }
  Kokkos::deep_copy(pos, pos_h);

  RowView<ExecSpace> send("relayout::dispatch_send", std::size_t(slots), std::size_t(H));
  Kokkos::parallel_for(
      "relayout::dispatch_pack", Kokkos::RangePolicy<ExecSpace>(exec, 0, slots),
      KOKKOS_LAMBDA(const std::int64_t s) {
        for (int f = 0; f < H; ++f) send(pos(s), f) = x(s / K, f);
      });

  std::vector<int> recv_counts(static_cast<std::size_t>(ep), 0);
  wire.all_to_all(GroupKind::moe_ep, std::span<const int>(send_counts), std::span<int>(recv_counts));
  std::int64_t received = 0;
  for (int c : recv_counts) received += c;
  auto times = [](const std::vector<int>& c, int f) {
    std::vector<int> out(c);
    for (int& v : out) v *= f;
    return out;
  };
  RowView<ExecSpace> recv("relayout::dispatch_recv", std::size_t(received), std::size_t(H));
  wire.all_to_allv(GroupKind::moe_ep, std::span<const float>(send.data(), send.size()), times(send_counts, H),
                   std::span<float>(recv.data(), recv.size()), times(recv_counts, H));
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> recv_expert("relayout::recv_expert", std::size_t(received), 1);
  wire.all_to_allv(GroupKind::moe_ep, std::span<const int>(send_expert), send_counts,
                   std::span<int>(recv_expert.data(), recv_expert.size()), recv_counts);
  if (track) {
    dispatched->assign(std::size_t(received), 0);
    wire.bookkeeping().all_to_allv(GroupKind::moe_ep, std::span<const std::int64_t>(send_owner), send_counts,
                       std::span<std::int64_t>(*dispatched), recv_counts);
  }

  // The local experts on what arrived, back in arrival order (each arrival is one slot, weight 1).
  const auto buckets = kernels::bucket_by_expert(exec, recv_expert, experts_per_rank, w.spec.expert_begin);
  RowView<ExecSpace> y_sorted("relayout::y_sorted", std::size_t(buckets.rows()), std::size_t(H));
  kernels::expert_ffn(exec, recv, buckets, w.experts, y_sorted);
  RowView<ExecSpace> ones("relayout::ones", std::size_t(received), 1);
  Kokkos::deep_copy(ones, 1.0f);
  RowView<ExecSpace> y_recv("relayout::y_recv", std::size_t(received), std::size_t(H));
  kernels::moe_combine(exec, y_sorted, buckets, ones, y_recv);

  RowView<ExecSpace> back("relayout::combine_recv", std::size_t(slots), std::size_t(H));
  wire.all_to_allv(GroupKind::moe_ep, std::span<const float>(y_recv.data(), y_recv.size()), times(recv_counts, H),
                   std::span<float>(back.data(), back.size()), times(send_counts, H));

  RowView<ExecSpace> out("relayout::moe_out", std::size_t(m), std::size_t(H));
  const auto weights = r.weights;
  Kokkos::parallel_for(
      "relayout::combine", Kokkos::RangePolicy<ExecSpace>(exec, 0, m), KOKKOS_LAMBDA(const std::int64_t t) {
        for (int f = 0; f < H; ++f) {
          float acc = 0.0f;
          for (int j = 0; j < K; ++j) acc += weights(t, j) * back(pos(t * K + j), f);
          out(t, f) = acc;
        }
      });
  if (w.spec.shared > 0) kernels::swiglu_ffn(exec, x, w.shared, out, true);
  return out;
}

}  // namespace relayout::moe
