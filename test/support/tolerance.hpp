// Approximate comparisons whose tolerance is stated where they are made, relative or absolute:
// CHECK(seconds == within_rel(1408e-6, 0.25)) holds for |seconds - 1408e-6| <= 0.25 * 1408e-6;
// CHECK(x == within_abs(0.0, 1e-12)) for |x| <= 1e-12. doctest::Approx is not used for this: its
// tolerance, epsilon * (1 + max(|a|, |b|)), is absolute near 0 and lets a 2x error through at
// values of a millisecond.
#pragma once

#include <cmath>
#include <ostream>

namespace relayout::test {

struct Near {
  double expected = 0;
  double tolerance = 0;  // a share of |expected| when relative, in the value's unit when absolute
  bool relative = true;

  double bound() const { return relative ? tolerance * std::fabs(expected) : tolerance; }
  bool holds(double actual) const { return std::isfinite(actual) && std::fabs(actual - expected) <= bound(); }

  friend bool operator==(double actual, const Near& n) { return n.holds(actual); }
  friend bool operator==(const Near& n, double actual) { return n.holds(actual); }
  friend bool operator!=(double actual, const Near& n) { return !n.holds(actual); }
  friend std::ostream& operator<<(std::ostream& o, const Near& n) {
    o << n.expected << " +- ";
    if (n.relative) o << n.tolerance * 100 << "% (" << n.bound() << ")";
    else o << n.tolerance;
    return o;
  }
};

// |actual - expected| <= share * |expected|; share > 0 (an expected 0 needs within_abs).
inline Near within_rel(double expected, double share) { return {expected, share, true}; }
// |actual - expected| <= tolerance, in the value's own unit.
inline Near within_abs(double expected, double tolerance) { return {expected, tolerance, false}; }

}  // namespace relayout::test
