// relayout::instances: EpBuffer and MoeBridge's run compiled once for the combinations of
// relayout/instances.hpp, so the programs that link the target do not compile them again.
#define RELAYOUT_COMPILING_INSTANCES 1
#include "relayout/instances.hpp"

#define RELAYOUT_INSTANCE(C, T, S)              \
  template class ::relayout::EpBuffer<C, T, S>; \
  template class ::relayout::impl::BridgeRun<C, T, S>;

RELAYOUT_INSTANCES(RELAYOUT_INSTANCE)
