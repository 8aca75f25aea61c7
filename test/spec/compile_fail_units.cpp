// Request counts and token rows do not mix: comparing or adding them must not compile.
#include <relayout/spec/tokens.hpp>

using namespace relayout::spec;

int main() {
  const RequestCount requests{3};
  const TokenRows rows = scale(requests, TokensPerRequest{6});
#if defined(RELAYOUT_CF_CASE_mix)
  return requests == rows ? 1 : 0;  // 18 rows are not 18 requests
#else
  return rows == TokenRows{18} ? 0 : 1;
#endif
}
