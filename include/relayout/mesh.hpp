// The layout engine: widths, coordinates, groups, bridge path, padding and DSpark rules (docs/layout.md#widths–docs/dspark.md),
// compile-time policies and their runtime twin. Pure arithmetic: no MPI, no Kokkos.
#pragma once

#include "relayout/mesh/error.hpp"
#include "relayout/mesh/layout.hpp"
#include "relayout/mesh/names.hpp"
#include "relayout/mesh/policy.hpp"
#include "relayout/mesh/radix.hpp"
#include "relayout/mesh/widths.hpp"
#include "relayout/mesh/world.hpp"
