// The instruction-set report: cpu_isa() against Linux's own reading of cpuid (/proc/cpuinfo), the
// RELAYOUT_ISA_HIDE switch that tests use to take fallback branches, and the guard's list of
// missing features.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "relayout/kernels/isa.hpp"

namespace {

namespace isa = relayout::kernels::isa;

std::set<std::string> words(const std::string& s) {
  std::set<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.insert(w);
  return out;
}

// The flags of the first processor in /proc/cpuinfo (empty when there is none to read).
std::set<std::string> proc_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) return words(line.substr(line.find(':') + 1));
  return {};
}

struct HideEnv {
  explicit HideEnv(const char* v) { setenv(isa::kHideEnv, v, 1); }
  ~HideEnv() { unsetenv(isa::kHideEnv); }
};

}  // namespace

TEST_CASE("cpu_isa lists exactly the known features Linux reports") {
  const auto flags = proc_flags();
  if (flags.empty()) return;  // no /proc: nothing independent to compare with
  const auto cpu = words(isa::cpu_isa());
  for (const auto& f : isa::impl::kFeatures) {
    CAPTURE(f.name);
    CHECK(cpu.count(f.name) == flags.count(f.name));
    CHECK(isa::cpu_has(f.name) == (flags.count(f.name) == 1));
  }
  CHECK_FALSE(isa::cpu_has("no_such_feature"));
}

TEST_CASE("RELAYOUT_ISA_HIDE removes features from the run-time view") {
  const auto all = words(isa::cpu_isa());
  HideEnv hide("avx2, avx512f amx_bf16");
  const auto cpu = words(isa::cpu_isa());
  CHECK(cpu.count("avx2") == 0);
  CHECK(cpu.count("avx512f") == 0);
  CHECK(cpu.count("amx_bf16") == 0);
  CHECK_FALSE(isa::cpu_has("avx512f"));
  CHECK(cpu.size() + all.count("avx2") + all.count("avx512f") + all.count("amx_bf16") == all.size());
}

TEST_CASE("the guard names the compiled-for features the CPU lacks, in the table's order") {
  char buf[256];
  CHECK_FALSE(isa::impl::missing("", nullptr, buf, sizeof buf));
  CHECK_FALSE(isa::impl::missing(" unknown_feature", nullptr, buf, sizeof buf));
  char hide[] = "RELAYOUT_ISA_HIDE=avx512f,sse4_2";
  char other[] = "PATH=/bin";
  char* envp[] = {other, hide, nullptr};
  CHECK(isa::impl::missing(" avx512f sse4_2", envp, buf, sizeof buf));
  CHECK(std::string(buf) == "sse4_2 avx512f");
  char* no_hide[] = {other, nullptr};
  const bool lacks = isa::impl::missing(" avx512f", no_hide, buf, sizeof buf);
  CHECK(lacks == !isa::cpu_has("avx512f"));
}

TEST_CASE("the compiled-for list names only features of the table") {
  for (const auto& w : words(RELAYOUT_ISA_COMPILED)) {
    CAPTURE(w);
    bool known = false;
    for (const auto& f : isa::impl::kFeatures) known = known || w == f.name;
    CHECK(known);
    CHECK(isa::cpu_has(w.c_str()));  // this test runs, so the guard found them all
  }
}
