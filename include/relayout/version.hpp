// The relayout version (kept equal to the CMake project version; a test checks it).
#pragma once

#define RELAYOUT_VERSION_MAJOR 0
#define RELAYOUT_VERSION_MINOR 1
#define RELAYOUT_VERSION_PATCH 0
#define RELAYOUT_VERSION_STRING "0.1.0"
