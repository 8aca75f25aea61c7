// SpecTpSync syncs decisions only: a hidden-state tensor (rows x hidden View) does not compile.
#include <Kokkos_Core.hpp>
#include <vector>

#include <relayout/comm/single.hpp>
#include <relayout/spec/sync.hpp>

using namespace relayout;

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  const ProcessGroupsOf<SingleRankCommunicator> groups(RuntimeLayout({.tp = 1, .draft = Draft::moe}),
                                                       SingleRankCommunicator{});
  spec::SpecTpSyncOf<SingleRankCommunicator> sync(groups, spec::SyncSites{});
#if defined(RELAYOUT_CF_CASE_hidden)
  Kokkos::View<float**, Kokkos::LayoutRight> hidden("hidden", 4, 16);
  sync.sync("TARGET", hidden);
#elif defined(RELAYOUT_CF_CASE_double)
  std::vector<double> router(8);
  sync.sync("TARGET", router);
#else
  std::vector<std::int32_t> tokens(8);
  sync.sync("TARGET", tokens);
#endif
  return 0;
}
