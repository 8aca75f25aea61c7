// Instruction sets: what the including code was compiled for (RELAYOUT_ISA_COMPILED, from the
// compiler's macros), what this CPU and OS offer (cpu_isa(), from cpuid and xgetbv at run time),
// and RELAYOUT_ISA_GUARD(), which ends a program built for instructions the CPU lacks with exit 2
// and a message naming them, before any of them executes (no SIGILL).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

// The checks run before main and before the program's own code, so they must not contain the
// instructions they check for: on x86-64 every function below is compiled for baseline x86-64
// whatever the command line says (-march=native included), calls only libc and inline asm, and is
// identical in every translation unit (no ODR clash between units built with different flags).
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__) && !defined(__HIPCC__) && !defined(__SYCL_DEVICE_ONLY__)
#define RELAYOUT_ISA_X86 1
#define RELAYOUT_ISA_BASELINE __attribute__((target("arch=x86-64")))
#else
#define RELAYOUT_ISA_BASELINE
#endif

// One name per feature, as Linux's /proc/cpuinfo spells it, in the order cpu_isa() lists them.
#if defined(__SSE4_2__)
#define RELAYOUT_ISA_C_SSE4_2 " sse4_2"
#else
#define RELAYOUT_ISA_C_SSE4_2 ""
#endif
#if defined(__AVX__)
#define RELAYOUT_ISA_C_AVX " avx"
#else
#define RELAYOUT_ISA_C_AVX ""
#endif
#if defined(__F16C__)
#define RELAYOUT_ISA_C_F16C " f16c"
#else
#define RELAYOUT_ISA_C_F16C ""
#endif
#if defined(__FMA__)
#define RELAYOUT_ISA_C_FMA " fma"
#else
#define RELAYOUT_ISA_C_FMA ""
#endif
#if defined(__BMI2__)
#define RELAYOUT_ISA_C_BMI2 " bmi2"
#else
#define RELAYOUT_ISA_C_BMI2 ""
#endif
#if defined(__AVX2__)
#define RELAYOUT_ISA_C_AVX2 " avx2"
#else
#define RELAYOUT_ISA_C_AVX2 ""
#endif
#if defined(__AVXVNNI__)
#define RELAYOUT_ISA_C_AVXVNNI " avx_vnni"
#else
#define RELAYOUT_ISA_C_AVXVNNI ""
#endif
#if defined(__AVX512F__)
#define RELAYOUT_ISA_C_AVX512F " avx512f"
#else
#define RELAYOUT_ISA_C_AVX512F ""
#endif
#if defined(__AVX512DQ__)
#define RELAYOUT_ISA_C_AVX512DQ " avx512dq"
#else
#define RELAYOUT_ISA_C_AVX512DQ ""
#endif
#if defined(__AVX512CD__)
#define RELAYOUT_ISA_C_AVX512CD " avx512cd"
#else
#define RELAYOUT_ISA_C_AVX512CD ""
#endif
#if defined(__AVX512BW__)
#define RELAYOUT_ISA_C_AVX512BW " avx512bw"
#else
#define RELAYOUT_ISA_C_AVX512BW ""
#endif
#if defined(__AVX512VL__)
#define RELAYOUT_ISA_C_AVX512VL " avx512vl"
#else
#define RELAYOUT_ISA_C_AVX512VL ""
#endif
#if defined(__AVX512VBMI__)
#define RELAYOUT_ISA_C_AVX512VBMI " avx512vbmi"
#else
#define RELAYOUT_ISA_C_AVX512VBMI ""
#endif
#if defined(__AVX512VNNI__)
#define RELAYOUT_ISA_C_AVX512VNNI " avx512_vnni"
#else
#define RELAYOUT_ISA_C_AVX512VNNI ""
#endif
#if defined(__AVX512VPOPCNTDQ__)
#define RELAYOUT_ISA_C_AVX512VPOPCNTDQ " avx512_vpopcntdq"
#else
#define RELAYOUT_ISA_C_AVX512VPOPCNTDQ ""
#endif
#if defined(__AVX512BF16__)
#define RELAYOUT_ISA_C_AVX512BF16 " avx512_bf16"
#else
#define RELAYOUT_ISA_C_AVX512BF16 ""
#endif
#if defined(__AVX512FP16__)
#define RELAYOUT_ISA_C_AVX512FP16 " avx512_fp16"
#else
#define RELAYOUT_ISA_C_AVX512FP16 ""
#endif
#if defined(__AMX_TILE__)
#define RELAYOUT_ISA_C_AMX_TILE " amx_tile"
#else
#define RELAYOUT_ISA_C_AMX_TILE ""
#endif
#if defined(__AMX_BF16__)
#define RELAYOUT_ISA_C_AMX_BF16 " amx_bf16"
#else
#define RELAYOUT_ISA_C_AMX_BF16 ""
#endif
#if defined(__AMX_INT8__)
#define RELAYOUT_ISA_C_AMX_INT8 " amx_int8"
#else
#define RELAYOUT_ISA_C_AMX_INT8 ""
#endif

// The features of the list above that the including translation unit was compiled for, each
// preceded by a space ("" for baseline x86-64 or a non-x86 target). A macro, not a function, so
// that it is the caller's flags that count.
#define RELAYOUT_ISA_COMPILED                                                                       \
  RELAYOUT_ISA_C_SSE4_2 RELAYOUT_ISA_C_AVX RELAYOUT_ISA_C_F16C RELAYOUT_ISA_C_FMA RELAYOUT_ISA_C_BMI2  \
  RELAYOUT_ISA_C_AVX2 RELAYOUT_ISA_C_AVXVNNI RELAYOUT_ISA_C_AVX512F RELAYOUT_ISA_C_AVX512DQ           \
  RELAYOUT_ISA_C_AVX512CD RELAYOUT_ISA_C_AVX512BW RELAYOUT_ISA_C_AVX512VL RELAYOUT_ISA_C_AVX512VBMI  \
  RELAYOUT_ISA_C_AVX512VNNI RELAYOUT_ISA_C_AVX512VPOPCNTDQ RELAYOUT_ISA_C_AVX512BF16                 \
  RELAYOUT_ISA_C_AVX512FP16 RELAYOUT_ISA_C_AMX_TILE RELAYOUT_ISA_C_AMX_BF16 RELAYOUT_ISA_C_AMX_INT8

namespace relayout::kernels::isa {

// Environment variable naming features to treat as absent (space or comma separated), so that a
// test can take the fallback branch of a run-time dispatch, or see the guard refuse, on a CPU that
// has them.
inline constexpr const char* kHideEnv = "RELAYOUT_ISA_HIDE";

namespace impl {

struct FeatureBit {
  const char* name;
  unsigned leaf, subleaf;
  int reg;  // 0 eax, 1 ebx, 2 ecx, 3 edx
  unsigned bit;
  unsigned long long xcr0;  // register state the OS must save for the feature to be usable
};

inline constexpr unsigned long long kXcrAvx = 0x6;              // SSE and AVX state
inline constexpr unsigned long long kXcrAvx512 = 0xe6;          // + opmask, ZMM_Hi256, Hi16_ZMM
inline constexpr unsigned long long kXcrAmx = 0x60000;          // XTILECFG, XTILEDATA
inline constexpr FeatureBit kFeatures[] = {
    {"sse4_2", 1, 0, 2, 20, 0},
    {"avx", 1, 0, 2, 28, kXcrAvx},
    {"f16c", 1, 0, 2, 29, kXcrAvx},
    {"fma", 1, 0, 2, 12, kXcrAvx},
    {"bmi2", 7, 0, 1, 8, 0},
    {"avx2", 7, 0, 1, 5, kXcrAvx},
    {"avx_vnni", 7, 1, 0, 4, kXcrAvx},
    {"avx512f", 7, 0, 1, 16, kXcrAvx512},
    {"avx512dq", 7, 0, 1, 17, kXcrAvx512},
    {"avx512cd", 7, 0, 1, 28, kXcrAvx512},
    {"avx512bw", 7, 0, 1, 30, kXcrAvx512},
    {"avx512vl", 7, 0, 1, 31, kXcrAvx512},
    {"avx512vbmi", 7, 0, 2, 1, kXcrAvx512},
    {"avx512_vnni", 7, 0, 2, 11, kXcrAvx512},
    {"avx512_vpopcntdq", 7, 0, 2, 14, kXcrAvx512},
    {"avx512_bf16", 7, 1, 0, 5, kXcrAvx512},
    {"avx512_fp16", 7, 0, 3, 23, kXcrAvx512},
    {"amx_tile", 7, 0, 3, 24, kXcrAmx},
    {"amx_bf16", 7, 0, 3, 22, kXcrAmx},
    {"amx_int8", 7, 0, 3, 25, kXcrAmx},
};

RELAYOUT_ISA_BASELINE inline void cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]) {
#if defined(RELAYOUT_ISA_X86)
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
#else
  (void)leaf, (void)subleaf;
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

// True when `word` (length n) is one of the words of `list` (separated by spaces or commas).
RELAYOUT_ISA_BASELINE inline bool list_has(const char* list, const char* word, std::size_t n) {
  if (!list) return false;
  for (const char* p = list; *p;) {
    while (*p == ' ' || *p == ',') ++p;
    const char* e = p;
    while (*e && *e != ' ' && *e != ',') ++e;
    if (std::size_t(e - p) == n && n > 0 && std::strncmp(p, word, n) == 0) return true;
    p = e;
  }
  return false;
}

// The value of `name` in envp (null: the process environment).
RELAYOUT_ISA_BASELINE inline const char* env(char** envp, const char* name) {
  if (!envp) return std::getenv(name);
  const std::size_t n = std::strlen(name);
  for (char** e = envp; *e; ++e)
    if (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  return nullptr;
}

// Whether the CPU and the OS provide feature f, unless the hide list names it.
RELAYOUT_ISA_BASELINE inline bool has(const FeatureBit& f, const char* hide) {
  if (list_has(hide, f.name, std::strlen(f.name))) return false;
#if defined(RELAYOUT_ISA_X86)
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  if (f.leaf > max_leaf) return false;
  if (f.leaf == 7 && f.subleaf > 0) {
    cpuid(7, 0, r);
    if (f.subleaf > r[0]) return false;
  }
  cpuid(f.leaf, f.subleaf, r);
  if (!((r[f.reg] >> f.bit) & 1u)) return false;
  if (f.xcr0) {
    cpuid(1, 0, r);
    if (!((r[2] >> 27) & 1u)) return false;  // OSXSAVE: xgetbv is usable
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const unsigned long long xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
    if ((xcr0 & f.xcr0) != f.xcr0) return false;
  }
  return true;
#else
  return false;
#endif
}

// Appends `word` and a separating space to buf (size cap), truncating quietly.
RELAYOUT_ISA_BASELINE inline void append(char* buf, std::size_t cap, const char* word) {
  std::size_t len = std::strlen(buf);
  if (len > 0 && len + 1 < cap) buf[len++] = ' ', buf[len] = '\0';
  for (const char* w = word; *w && len + 1 < cap; ++w) buf[len++] = *w, buf[len] = '\0';
}

// The features of `compiled` this CPU lacks, written to buf; returns whether there are any.
RELAYOUT_ISA_BASELINE inline bool missing(const char* compiled, char** envp, char* buf, std::size_t cap) {
  buf[0] = '\0';
  const char* hide = env(envp, kHideEnv);
  for (const FeatureBit& f : kFeatures)
    if (list_has(compiled, f.name, std::strlen(f.name)) && !has(f, hide)) append(buf, cap, f.name);
  return buf[0] != '\0';
}

// What RELAYOUT_ISA_GUARD runs: exit 2 with a message when the CPU lacks a compiled-for feature.
RELAYOUT_ISA_BASELINE inline void guard(const char* compiled, char** argv, char** envp) {
  char lacks[512];
  if (!missing(compiled, envp, lacks, sizeof lacks)) return;
  const char* prog = argv && argv[0] ? argv[0] : "relayout";
  const char* base = prog;  // no strrchr: its C++ overloads are always_inline at the caller's flags
  for (const char* p = prog; *p; ++p)
    if (*p == '/') base = p + 1;
  std::fprintf(stderr,
               "%s: this binary was compiled for instructions this CPU does not have: %s (compiled for:%s). "
               "Rebuild it on this machine, or build a portable binary (cmake -DRELAYOUT_NATIVE=OFF)\n",
               base, lacks, compiled);
  std::fflush(stderr);
  _exit(2);
}

}  // namespace impl

// The features of the list above this CPU and OS offer, space separated, minus those named by
// RELAYOUT_ISA_HIDE.
RELAYOUT_ISA_BASELINE inline std::string cpu_isa() {
  char buf[512] = "";
  const char* hide = impl::env(nullptr, kHideEnv);
  for (const impl::FeatureBit& f : impl::kFeatures)
    if (impl::has(f, hide)) impl::append(buf, sizeof buf, f.name);
  return std::string(buf);
}

namespace impl {
// What the CPU and OS offer, feature by feature of kFeatures, asked once per process: cpuid traps
// to the hypervisor in a virtual machine, and run-time dispatch (the bf16 GEMM) asks on every call
// (40% of a `dsv4_layer --dtype bf16` decode run when each call asked again).
inline constexpr std::size_t kFeatureCount = sizeof kFeatures / sizeof kFeatures[0];
RELAYOUT_ISA_BASELINE inline const bool* hardware_features() {
  static const struct Bits {
    bool on[kFeatureCount];
    Bits() : on{} {
      for (std::size_t i = 0; i < kFeatureCount; ++i) on[i] = has(kFeatures[i], nullptr);
    }
  } bits;
  return bits.on;
}
}  // namespace impl

// Whether the CPU offers one feature by name (false for a name not in the list). The hardware is
// asked once; RELAYOUT_ISA_HIDE is read on every call, so a test may set it between calls.
RELAYOUT_ISA_BASELINE inline bool cpu_has(const char* name) {
  const char* hide = impl::env(nullptr, kHideEnv);
  const std::size_t n = std::strlen(name);
  for (std::size_t i = 0; i < impl::kFeatureCount; ++i)
    if (std::strcmp(impl::kFeatures[i].name, name) == 0)
      return impl::hardware_features()[i] && !impl::list_has(hide, name, n);
  return false;
}

// The CPU's vendor string from cpuid leaf 0 ("GenuineIntel", "AuthenticAMD", ...; "" off x86),
// asked once per process. Kernels whose speed differs by vendor at the same instructions read it
// (vdpbf16ps: twice the fp32 FMA rate on AMD Zen 4, below it on Intel parts without AMX).
RELAYOUT_ISA_BASELINE inline const char* cpu_vendor() {
  static const struct Vendor {
    char name[13];
    Vendor() : name{} {
#if defined(RELAYOUT_ISA_X86)
      unsigned r[4];
      impl::cpuid(0, 0, r);
      std::memcpy(name, &r[1], 4);
      std::memcpy(name + 4, &r[3], 4);
      std::memcpy(name + 8, &r[2], 4);
#endif
    }
  } vendor;
  return vendor.name;
}

// RELAYOUT_ISA_COMPILED without its leading space; "x86-64" (baseline) when empty.
inline std::string trim_compiled(const char* compiled) {
  while (*compiled == ' ') ++compiled;
  return *compiled ? std::string(compiled) : std::string("x86-64");
}

}  // namespace relayout::kernels::isa

// The instruction set of the including unit as a std::string, e.g. "avx2 fma" (see above).
#define RELAYOUT_ISA_COMPILED_STRING() ::relayout::kernels::isa::trim_compiled(RELAYOUT_ISA_COMPILED)

// Put once in a program's sources (one .cpp built with the program's flags): before any other code
// of the program runs, a CPU lacking a feature that unit was compiled for ends the program with
// exit 2 and a message naming the features. In an executable it is a .preinit_array entry, which
// the loader calls before every constructor, shared libraries' included; in a shared object (which
// has no .preinit_array) the earliest constructor of that object.
#if defined(RELAYOUT_ISA_X86) && defined(__ELF__)
#if defined(__PIC__) && !defined(__PIE__)
#define RELAYOUT_ISA_GUARD_SECTION section(".init_array"), used
#else
#define RELAYOUT_ISA_GUARD_SECTION section(".preinit_array"), used
#endif
// glibc calls both arrays' entries with (argc, argv, envp).
#define RELAYOUT_ISA_GUARD()                                                                  \
  RELAYOUT_ISA_BASELINE static void relayout_isa_guard_entry(int, char** argv, char** envp) { \
    ::relayout::kernels::isa::impl::guard(RELAYOUT_ISA_COMPILED, argv, envp);                 \
  }                                                                                           \
  __attribute__((RELAYOUT_ISA_GUARD_SECTION)) static void (*relayout_isa_guard_ptr)(          \
      int, char**, char**) = relayout_isa_guard_entry
#else
#define RELAYOUT_ISA_GUARD() static_assert(true)
#endif
