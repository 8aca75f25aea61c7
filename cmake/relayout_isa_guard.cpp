// Compiled into every executable that links relayout::native, with its flags: a CPU without the
// instructions they enable ends the program at start with exit 2 (relayout/kernels/isa.hpp).
#include "relayout/kernels/isa.hpp"

RELAYOUT_ISA_GUARD();
