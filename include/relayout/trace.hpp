// Row-ownership tracing (docs/trace.md): records of who holds which row after every layout boundary, with
// value checksums, sent to a sink (none by default; JSON Lines per rank), and compared across
// layouts by `relayout trace diff`.
#pragma once

#include "relayout/trace/dir_lock.hpp"
#include "relayout/trace/jsonl.hpp"
#include "relayout/trace/owner.hpp"
#include "relayout/trace/record.hpp"
#include "relayout/trace/recorder.hpp"
#include "relayout/trace/tracked.hpp"
