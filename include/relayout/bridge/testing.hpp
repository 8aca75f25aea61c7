// Test and demo hooks of MoeBridge, never included by relayout/bridge.hpp: wiring a known bug into
// a bridge shows that a verification (--check, the trace diff) catches it.
#pragma once

#include "relayout/bridge/bridge.hpp"

namespace relayout::testing {

// Wires `fault` into the bridge's next runs (BridgeFault::none removes it). A fault the layout's
// path never reaches is a LayoutError (check_fault), so a verification cannot pass untested.
template <class C, class T, class Space>
void inject_fault(MoeBridge<C, T, Space>& bridge, BridgeFault fault) {
  check_fault(fault, bridge.pg_.layout());
  bridge.fault_ = fault;
}
// The fault wired into the bridge (BridgeFault::none: none).
template <class C, class T, class Space>
BridgeFault injected_fault(const MoeBridge<C, T, Space>& bridge) {
  return bridge.fault_;
}

}  // namespace relayout::testing
