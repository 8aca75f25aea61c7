// Exits 0 when the compiler, with the flags under test, builds constant lists of mostly equal
// elements right, and 1 (naming the first wrong case) when it does not. g++ 12 with AVX-512 enabled
// (-march=native on an AVX-512 CPU) turns `return {1, 1, 1, 1, 1, 0, 0, 0};` of 64-bit elements into
// eight ones: its SLP vectorizer copies the list with one broadcast. RelayoutNative.cmake runs this
// at configure time, and ctest test_codegen runs it built with the flags every program here uses.
#include <cstdint>
#include <cstdio>
#include <vector>

template <class T>
__attribute__((noinline)) std::vector<T> five_of_eight() { return {1, 1, 1, 1, 1, 0, 0, 0}; }
template <class T>
__attribute__((noinline)) std::vector<T> three_of_four() { return {1, 1, 1, 0}; }
// The shape it was found in: a table of chunk sizes chosen by a switch.
template <class T>
__attribute__((noinline)) std::vector<T> split_of_five(int parts) {
  switch (parts) {
    case 4: return {2, 1, 1, 1};
    case 8: return {1, 1, 1, 1, 1, 0, 0, 0};
  }
  return {};
}

template <class T>
bool right(const char* type) {
  const std::vector<T> a = five_of_eight<T>(), b = three_of_four<T>(), c = split_of_five<T>(8), d = split_of_five<T>(4);
  const bool ok = a.size() == 8 && a[4] == T(1) && a[5] == T(0) && a[7] == T(0) && b.size() == 4 && b[2] == T(1) &&
                  b[3] == T(0) && c.size() == 8 && c[4] == T(1) && c[5] == T(0) && d.size() == 4 && d[0] == T(2) &&
                  d[3] == T(1);
  if (!ok) std::printf("wrong constant list of %s\n", type);
  return ok;
}

int main() {
  const bool ok = right<std::int64_t>("int64") & right<std::uint64_t>("uint64") & right<double>("double") &
                  right<std::int32_t>("int32") & right<float>("float");
  return ok ? 0 : 1;
}
