// spec/sampling.hpp: the speculative-sampling rule commits tokens distributed exactly as the target's
// own samples (computed here in closed form and by counting), whatever the draft proposes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <relayout/spec/sampling.hpp>

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout;
using namespace relayout::spec;

namespace {
// A fixed stream of uniforms in [0, 1) (splitmix64), so the counts below are exact and repeatable.
struct Uniforms {
  std::uint64_t x = 12345;
  double operator()() {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return double((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  }
};
}  // namespace

TEST_CASE("speculative_accept: one draft token drawn from q, the committed token is distributed as p") {
  const std::vector<double> p{0.5, 0.2, 0.3, 0.0}, q{0.1, 0.6, 0.1, 0.2}, bonus{0.25, 0.25, 0.25, 0.25};
  Uniforms u;
  const int n = 200000;
  std::vector<double> first(4, 0.0);
  int accepted = 0;
  for (int i = 0; i < n; ++i) {
    const int x = sample_index(q, u());
    const std::vector<int> draft{x};
    const std::vector<double> ua{u()};
    const AcceptOutcome o = speculative_accept({p, bonus}, {q}, draft, ua, u());
    accepted += o.accepted;
    first[std::size_t(o.accepted == 1 ? x : o.token)] += 1.0 / n;  // the token at the draft's position
  }
  // 2% of each probability: at least 4.5 standard deviations of 200000 draws (0.2: sigma 0.0009);
  // p(3) = 0 must come out exactly 0.
  for (int v = 0; v < 4; ++v) {
    CAPTURE(v);
    CHECK(first[std::size_t(v)] == within_rel(p[std::size_t(v)], 0.02));
  }
  // Acceptance probability: sum_x min(p(x), q(x)) = 0.1 + 0.2 + 0.1 + 0 = 0.4.
  CHECK(double(accepted) / n == within_rel(0.4, 0.02));
}

TEST_CASE("speculative_accept: rejection resamples from max(0, p - q); all accepted draws the bonus from p[k]") {
  const std::vector<double> p{0.7, 0.3, 0.0}, q{0.0, 1.0, 0.0}, bonus{0.0, 0.0, 1.0};
  const std::vector<int> draft{1};
  // p/q at the draft token is 0.3: u = 0.2 accepts, u = 0.5 rejects.
  const std::vector<double> accept{0.2}, reject{0.5};
  const AcceptOutcome a = speculative_accept({p, bonus}, {q}, draft, accept, 0.9);
  CHECK(a.accepted == 1);
  CHECK(a.token == 2);  // the bonus from p[k]
  const AcceptOutcome r = speculative_accept({p, bonus}, {q}, draft, reject, 0.99);
  CHECK(r.accepted == 0);
  CHECK(r.token == 0);  // max(0, p - q) = {0.7, 0, 0}: never the rejected token
  // q == p: every draft token is accepted.
  const std::vector<int> two{0, 1};
  const std::vector<double> high{0.999, 0.999};
  const AcceptOutcome same = speculative_accept({p, p, bonus}, {p, p}, two, high, 0.5);
  CHECK(same.accepted == 2);
  CHECK_THROWS_AS(speculative_accept({p}, {q}, draft, accept, 0.5), LayoutError);
}

TEST_CASE("softmax and sample_index: temperature must be finite and > 0; inverse CDF") {
  const std::vector<double> z{0.0, std::log(3.0)};
  const std::vector<double> s = softmax(z, 1.0);
  CHECK(s[0] == within_rel(0.25, 1e-9));
  CHECK(s[1] == within_rel(0.75, 1e-9));
  CHECK(softmax(z, 0.5)[1] == within_rel(0.9, 1e-9));
  CHECK_THROWS_AS(softmax(z, 0.0), LayoutError);
  CHECK_THROWS_AS(softmax(z, std::nan("")), LayoutError);
  CHECK_THROWS_AS(softmax(z, INFINITY), LayoutError);
  CHECK(sample_index(s, 0.24) == 0);
  CHECK(sample_index(s, 0.26) == 1);
  CHECK(sample_index(std::vector<double>{0.0, 2.0, 0.0}, 0.0) == 1);
}
