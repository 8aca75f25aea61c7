// EpBuffer's members (placement/ep.hpp) defined out of the class, so the class reads as its API.
#pragma once

#include "relayout/placement/ep.hpp"

namespace relayout {

// What is wrong with this member's call ("" when nothing is), checked before any exchange so that
// its verdict can travel with the counts: the tags' length, the router output, the capacity.
template <class C, class T, class Space>
impl::Refusal EpBuffer<C, T, Space>::call_problem(const Space& exec, const RowsIn& x, const TopK<T, Space>& route,
                                                  const EpDispatchOptions& o) const {
  const std::int64_t m = x.rows();
  if (!o.refuse.empty()) return {o.refuse_counts ? impl::kCountsRefused : impl::kCallRefused, std::string(o.refuse)};
  if (o.tags && static_cast<std::int64_t>(o.tags->size()) != m)
    return {impl::kCallRefused,
            std::to_string(o.tags->size()) + " tags for " + std::to_string(m) + " rows; tags must stay aligned with rows"};
  if (std::string p = impl::route_problem(exec, route, m, experts_, o.check_route); !p.empty())
    return {impl::kRouteRefused, p};
  if (o.mode == EpMode::low_latency && m > low_latency_capacity())
    return {impl::kOverCapacity, "this member dispatches " + std::to_string(m) +
                                     " rows, over the low-latency capacity of " + std::to_string(low_latency_capacity()) +
                                     " rows per rank (num_max_dispatch_tokens_per_rank)"};
  return {};
}

// The router's logical ids as physical ones (same weights) under an expert location, the replica
// of by_token chosen by the row's index in its DP group; this dispatch's load counted. The map is
// agreed over the TP domain at the first dispatch (collective: every rank dispatches).
template <class C, class T, class Space>
TopK<T, Space> EpBuffer<C, T, Space>::physical_route(const Space& exec, const TopK<T, Space>& route,
                                                     const EpDispatchOptions& o, impl::Refusal& refusal) {
  const ExpertLocation* loc = location();
  if (!loc) return route;
  if (!replicas_) {
    require_same_expert_location(exec, pg_.tp(), *loc);
    replicas_ = replica_table(exec, *loc, pg_.moe_ep().rank(), opts_.replica_choice);
  }
  if (refusal.verdict != impl::kFine) return route;  // refused: nothing is sent, nothing counted
  TopK<T, Space> p(typename TopK<T, Space>::ids_view(
                       Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::physical_ids")),
                       route.ids.extent(0), route.ids.extent(1)),
                   route.weights);
  try {
    relayout::to_physical(exec, *replicas_, route.ids, o.first_token, p.ids);
  } catch (const LayoutError& e) {
    refusal = {impl::kRouteRefused, e.what()};  // unchecked routes only: refused on every member
    return route;
  }
  ExpertLoad load = count_expert_load(exec, *loc, p.ids);
  if (load_.physical.size() == load.physical.size())
    for (std::size_t e = 0; e < load.physical.size(); ++e) load.physical[e] += load_.physical[e];
  load_ = ExpertLoad(*loc, std::move(load.physical));
  return p;
}

// A dispatch's state in memory no live handle uses: its sizes, mode, dtype and message.
template <class C, class T, class Space>
std::shared_ptr<impl::EpState<T, Space>> EpBuffer<C, T, Space>::new_state(const RowsIn& x, int k,
                                                                         const EpDispatchOptions& o,
                                                                         std::uint32_t digest) {
  auto s = std::make_shared<impl::EpState<T, Space>>();
  impl::EpState<T, Space>& d = *s;
  d.mem = free_memory();
  d.rows = x.rows();
  d.full_rows = x.full_rows();
  d.hidden = static_cast<int>(x.hidden());
  d.k = k;
  d.per_rank = local_experts();
  d.first_expert = first_expert();
  d.mode = o.mode;
  d.dtype = o.dtype;
  d.traffic = o.traffic;
  d.digest = digest;
  d.message = message(o.dtype, d.k, d.hidden);
  return s;
}

template <class C, class T, class Space>
EpDispatchInFlight<T, Space> EpBuffer<C, T, Space>::dispatch_start(const Space& exec, const RowsIn& x,
                                                                   const TopK<T, Space>& logical,
                                                                   const EpDispatchOptions& o,
                                                                   std::source_location site) {
  const auto& comm = pg_.moe_ep();
  const int ep = comm.size();
  const bool ll = o.mode == EpMode::low_latency;
  EpDispatchInFlight<T, Space> p;
  p.site_ = site;
  impl::Refusal refusal = call_problem(exec, x, logical, o);
  const TopK<T, Space> route = physical_route(exec, logical, o, refusal);
  p.problem_ = std::move(refusal.text);
  p.own_.verdict = refusal.verdict;
  p.own_.rows = x.rows();
  p.own_.digest = impl::counts_digest(o.global_num_tokens);
  if (o.tags && p.own_.verdict == impl::kFine) {
    p.tags_ = *o.tags;
    p.has_tags_ = true;
  }
  p.indexed_ = o.indexed_batch;
  auto s = new_state(x, route.k(), o, p.own_.digest);
  impl::EpState<T, Space>& d = *s;
  const std::int64_t W = d.message.words();
  p.block_words_ = ll ? impl::kLlHead + low_latency_capacity() * W : 0;
  if (p.block_words_ > std::int64_t(std::numeric_limits<int>::max()))
    throw LayoutError("num_max_dispatch_tokens_per_rank",
                      "EpBuffer::dispatch: a low-latency block of " + std::to_string(low_latency_capacity()) +
                          " rows of " + std::to_string(W) + " words exceeds MPI's int count" + impl::called_at(site));
  const std::int64_t mo = p.own_.verdict == impl::kFine ? d.rows : 0;  // a refused call sends nothing
  impl::send_layout(exec, *d.mem, d, route.ids, mo, ep, d.per_rank);
  const std::int64_t B = p.block_words_;
  const auto send = ll ? d.mem->flat(d.mem->ll_send, "relayout::ep_ll_send", ep * B)
                       : d.mem->flat(d.mem->send, "relayout::ep_send", d.sent * W);
  impl::pack_dtype(exec, d, x.view(), route, mo, ep, B, send);
  p.s_ = s;
  if (ll) {  // the verdicts travel in the blocks' heads: read, and thrown, at finish
    p.ll_recv_ = d.mem->flat(d.mem->ll_recv, "relayout::ep_ll_recv", ep * B);
    p.request_ = impl::post_blocks(exec, comm, *d.mem, send, p.ll_recv_, B, d.send_rows, p.own_, site);
    return p;
  }
  const impl::Verdicts v = impl::exchange_counts(exec, comm, d.send_rows, p.own_, site);
  impl::throw_refused("EpBuffer::dispatch", p.problem_, p.own_, v, low_latency_capacity(), impl::called_at(site));
  d.recv_rows = v.rows;
  for (int c : d.recv_rows) d.received += c;
  if (ep == 1) {  // the messages it packed are the ones it receives
    d.received_messages = send;
    return p;
  }
  d.received_messages = d.mem->flat(d.mem->recv, "relayout::ep_recv", d.received * W);
  p.request_ = all_to_allv_start(exec, comm, send, impl::times(d.send_rows, W, "EpBuffer::dispatch"),
                                 d.received_messages, impl::times(d.recv_rows, W, "EpBuffer::dispatch"), site);
  return p;
}

template <class C, class T, class Space>
EpHandle<T, Space> EpBuffer<C, T, Space>::dispatch_finish(const Space& exec, EpDispatchInFlight<T, Space>&& p) {
  if (!p.s_)
    throw LayoutError("in_flight", "EpBuffer::dispatch_finish: the dispatch does not come from dispatch_start (or "
                                   "was finished already)");
  const auto& comm = pg_.moe_ep();
  const int ep = comm.size();
  p.request_.wait();
  std::shared_ptr<impl::EpState<T, Space>> s = std::move(p.s_);
  impl::EpState<T, Space>& d = *s;
  const std::int64_t W = d.message.words(), B = p.block_words_;
  if (B > 0) {
    const impl::Verdicts v = impl::read_blocks(exec, *d.mem, p.ll_recv_, B, ep);
    impl::throw_refused("EpBuffer::dispatch", p.problem_, p.own_, v, low_latency_capacity(), impl::called_at(p.site_));
    d.recv_rows = v.rows;
    for (int c : d.recv_rows) d.received += c;
    d.received_messages = d.mem->flat(d.mem->recv, "relayout::ep_recv", d.received * W);
    impl::unpack_blocks(exec, p.ll_recv_, B, W, d.recv_rows, d.received_messages);
  }
  // Low-latency mode sends its whole blocks, used or not.
  if (d.traffic && ep > 1) d.traffic->add(TrafficOp::dispatch, GroupKind::moe_ep, B > 0 ? ep * B * 4 : d.sent * d.message.bytes);
  if (p.has_tags_) impl::exchange_tags(exec, comm, d, p.tags_, p.site_);
  impl::group_dispatched(exec, d, p.indexed_);
  if (const ExpertLocation* loc = location())
    for (int e = 0; e < d.batch.experts(); ++e) d.batch.logical.push_back(loc->logical_of(d.first_expert + e));
  exec.fence();
  return Handle(std::move(s));
}

template <class C, class T, class Space>
EpCombineInFlight<T, Space> EpBuffer<C, T, Space>::combine_start(const Space& exec, const Handle& h,
                                                                 const RowsView<T, Space>& y, std::source_location site) {
  const impl::EpState<T, Space>& d = h.state();
  try {
    impl::require_expert_outputs(d.batch, y, "EpBuffer::combine");
  } catch (const LayoutError& e) {
    throw LayoutError("expert_y", e.what() + impl::called_at(site));
  }
  auto& buf = *d.mem;
  const auto& comm = pg_.moe_ep();
  const std::int64_t H = d.hidden;
  const EpMessage msg = d.message;
  const std::int64_t W = msg.words();
  const auto recv = d.received_messages;
  const auto reduced = buf.rows(buf.reduced, "relayout::ep_reduced", d.received, H);
  impl::weighted_sum(
      exec, d.k,
      KOKKOS_LAMBDA(const std::int64_t i, const int k) {
        return reinterpret_cast<const compute_t<T>*>(reinterpret_cast<const char*>(recv.data() + i * W) +
                                                     msg.weights)[k];
      },
      d.slot_of, y, reduced);
  EpCombineInFlight<T, Space> p;
  p.s_ = h.s_;
  p.ep_ = comm.size();
  if (comm.size() == 1) {
    p.back_ = reduced;  // returned to itself, in the order it was sent
    return p;
  }
  p.back_ = buf.rows(buf.back, "relayout::ep_back", d.sent, H);
  p.request_ = all_to_allv_start(exec, comm, reduced, impl::times(d.recv_rows, H, "EpBuffer::combine"), p.back_,
                                 impl::times(d.send_rows, H, "EpBuffer::combine"), site);
  if (d.traffic) d.traffic->add(TrafficOp::combine, GroupKind::moe_ep, d.received * H * std::int64_t(sizeof(T)));
  return p;
}

template <class C, class T, class Space>
Rows<T, RowShard<AttnTp>, DpLocal, Space> EpBuffer<C, T, Space>::combine_finish(const Space& exec,
                                                                                EpCombineInFlight<T, Space>&& p) {
  if (!p.s_)
    throw LayoutError("in_flight", "EpBuffer::combine_finish: the combine does not come from combine_start (or was "
                                   "finished already)");
  p.request_.wait();
  const std::shared_ptr<const impl::EpState<T, Space>> s = std::move(p.s_);
  const impl::EpState<T, Space>& d = *s;
  // One member that sent every row to itself: the weighted sums are its rows, in their order.
  if (p.ep_ == 1 && d.sent == d.rows) {
    exec.fence();
    return Rows<T, RowShard<AttnTp>, DpLocal, Space>(p.back_, d.full_rows);
  }
  const auto out = d.mem->rows(d.mem->combined, "relayout::ep_combined", d.rows, d.hidden);
  impl::sum_returns(exec, d, p.back_, out, p.ep_);
  exec.fence();
  return Rows<T, RowShard<AttnTp>, DpLocal, Space>(out, d.full_rows);
}

}  // namespace relayout
