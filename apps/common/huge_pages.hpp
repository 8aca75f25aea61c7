// Whether this process's heap is backed by transparent huge pages, for the programs' reports.
//
// MPI's shared-memory transport (MPICH over UCX here) moves a large message by reading the sender's
// pages from the receiver's process (cross-memory attach), pinning every page it reads. With 4 KiB
// pages that costs: a 4 MiB all-to-all of two ranks takes 1.5-1.7x as long as on huge pages
// (page_pinning_probe), and the layer's collectives 1.4-1.7x (docs/benchmarks.md). Kokkos' host
// views come from malloc, and glibc advises its large allocations for transparent huge pages when
// the tunable glibc.malloc.hugetlb=1 is set (GLIBC_TUNABLES, read at start-up) and the kernel's THP
// mode is madvise; under THP `always` they get them anyway. The programs report both, as they
// report the instruction set, so a figure says what it was measured with.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace relayout::cli {

struct HugePages {
  std::string thp;             // the kernel's mode: always, madvise, never, or "unknown"
  std::string malloc_hugetlb;  // glibc.malloc.hugetlb from GLIBC_TUNABLES ("" when unset)

  // What backs large malloc'd buffers (views, MPI's messages): "huge" (THP always, or madvise with
  // glibc.malloc.hugetlb=1), "hugetlbfs" (glibc.malloc.hugetlb=2: MAP_HUGETLB pages, where the
  // administrator reserved some; glibc falls back to 4 KiB pages otherwise) or "4 KiB".
  std::string heap() const {
    if (malloc_hugetlb == "2") return "hugetlbfs";
    if (thp == "always" || (thp == "madvise" && malloc_hugetlb == "1")) return "huge";
    return "4 KiB";
  }
  // One line for the reports; under THP madvise with 4 KiB pages it names the setting that helps.
  std::string describe() const {
    std::string s = "THP " + thp + ", glibc.malloc.hugetlb " + (malloc_hugetlb.empty() ? "unset" : malloc_hugetlb) +
                    ": large buffers on " + heap() + " pages";
    if (thp == "madvise" && heap() == "4 KiB")
      s += " (GLIBC_TUNABLES=glibc.malloc.hugetlb=1 puts them on huge pages and makes MPI's large messages cheaper)";
    return s;
  }
};

// The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never").
inline std::string bracketed(const std::string& line) {
  const auto a = line.find('['), b = line.find(']');
  return a != std::string::npos && b != std::string::npos && b > a ? line.substr(a + 1, b - a - 1) : "unknown";
}

// The value of glibc.malloc.hugetlb in a GLIBC_TUNABLES string ("a=1:glibc.malloc.hugetlb=1").
inline std::string malloc_hugetlb_of(const std::string& tunables) {
  const std::string key = "glibc.malloc.hugetlb=";
  std::string value;
  for (std::size_t at = 0; at <= tunables.size();) {
    const std::size_t end = std::min(tunables.find(':', at), tunables.size());
    const std::string item = tunables.substr(at, end - at);
    if (item.rfind(key, 0) == 0) value = item.substr(key.size());  // the last one counts, as in glibc
    at = end + 1;
  }
  return value;
}

inline HugePages huge_pages() {
  HugePages h;
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  h.thp = f && std::getline(f, line) ? bracketed(line) : "unknown";
  const char* t = std::getenv("GLIBC_TUNABLES");
  h.malloc_hugetlb = t ? malloc_hugetlb_of(t) : "";
  return h;
}

}  // namespace relayout::cli
