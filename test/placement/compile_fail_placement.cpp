// Compiled once per RELAYOUT_CF_CASE_*: each forbidden transition must stop the compile with its
// sentence. With no case defined the legal chain compiles.
#include <relayout/comm.hpp>
#include <relayout/bridge.hpp>
#include <relayout/placement.hpp>

using namespace relayout;
using View = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space>;

// An engine's router and experts for double rows.
struct DoubleRouter {
  int top_k() const { return 1; }
  void operator()(const Kokkos::DefaultExecutionSpace&, const RowsView<double>&, TopK<double>&) {}
};
struct DoubleExperts {
  void operator()(const Kokkos::DefaultExecutionSpace&, const ExpertBatch<double>&, const RowsView<double>&) {}
};

int main() {
  const ProcessGroupsOf<SingleRankCommunicator> pg(RuntimeLayout({.tp = 1}), SingleRankCommunicator{});
  const View v("v", 2, 2);
  const Rows<float, Partial<AttnTp>> partial(v);
  const Rows<float, Replicated<AttnTp>> replicated = all_reduce(pg, partial);
  const DpSlotsPtr slots = make_dp_slots(pg.layout(), std::vector<std::int64_t>{2});
  const Rows<float, Partial<group::Tp>, DpGlobal> moe_partial(v, slots);
#if defined(RELAYOUT_CF_CASE_double_all_reduce)
  const auto twice = all_reduce(pg, replicated);  // docs/bridge.md: [2,3] + [2,3] = [4,6] double-counts
  return static_cast<int>(twice.rows());
#elif defined(RELAYOUT_CF_CASE_gather_partial_on_replicated)
  return static_cast<int>(dp_gather_partial(pg, replicated, slots).rows());  // failure mode 3
#elif defined(RELAYOUT_CF_CASE_all_gather_on_partial)
  return static_cast<int>(all_gather(pg, partial).rows());
#elif defined(RELAYOUT_CF_CASE_scatter_partial)
  return static_cast<int>(dp_scatter(pg, moe_partial).rows());  // failure mode 2
#elif defined(RELAYOUT_CF_CASE_reduce_scatterv_replicated)
  const auto summed = all_reduce(pg, moe_partial);
  return static_cast<int>(reduce_scatterv(pg, summed).rows());  // failure mode 1
#elif defined(RELAYOUT_CF_CASE_split_partial)
  return static_cast<int>(split_rows(pg, partial).rows());
#elif defined(RELAYOUT_CF_CASE_gather_replicate_twice)
  return static_cast<int>(dp_gather_replicate(pg, dp_gather_replicate(pg, replicated, slots), slots).rows());
#elif defined(RELAYOUT_CF_CASE_bridge_partial)
  MoeBridge<SingleRankCommunicator, float> bridge(pg, 1);
  int router = 0, experts = 0;
  bridge.run(Kokkos::DefaultExecutionSpace(), partial, router, experts);  // the attention all-reduce skipped
  return 0;
#elif defined(RELAYOUT_CF_CASE_bridge_rows_of_other_type)
  MoeBridge<SingleRankCommunicator, double> bridge(pg, 1);  // float rows into a double bridge
  DoubleRouter router;
  DoubleExperts experts;
  bridge.run(Kokkos::DefaultExecutionSpace(), replicated, router, experts);
  return 0;
#elif defined(RELAYOUT_CF_CASE_bridge_model_of_other_type)
  MoeBridge<SingleRankCommunicator, bf16> bridge(pg, 1);  // a double router and experts into a bf16 bridge
  const Kokkos::View<bf16**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space> b("b", 2, 2);
  DoubleRouter router;
  DoubleExperts experts;
  bridge.run(Kokkos::DefaultExecutionSpace(), Rows<bf16, Replicated<AttnTp>>(b), router, experts);
  return 0;
#else
  const auto global = dp_gather_replicate(pg, split_rows(pg, replicated).full_rows() == 2 ? replicated : replicated, slots);
  return static_cast<int>(dp_scatter(pg, global).rows() + reduce_scatterv(pg, moe_partial).rows()) - 4;
#endif
}
