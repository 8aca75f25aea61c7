// The width formulas of SPEC §1 and §4, written once as constexpr functions. The compile-time
// policy (policy.hpp) and the runtime layout (layout.hpp) both call derive_widths().
#pragma once

#include <cstdint>
#include <string>

#include "relayout/mesh/error.hpp"
#include "relayout/mesh/names.hpp"

// Sentences shared by the static_asserts of the compile-time policy and the runtime errors.
#define RELAYOUT_RULE_WIDTH_POSITIVE "relayout: every width (tp, dp, cp, ep, moe_dp) must be >= 1"
#define RELAYOUT_RULE_WIDTH_LIMIT "relayout: every width must be <= 1048576 (2^20 ranks)"
#define RELAYOUT_RULE_ATTN_DIVIDES \
  "relayout: attn_tp = tp / attn_dp / attn_cp must divide exactly (tp % (attn_dp * attn_cp) == 0)"
#define RELAYOUT_RULE_MOE_DIVIDES \
  "relayout: moe_tp = tp / moe_ep / moe_dp must divide exactly (tp % (moe_ep * moe_dp) == 0)"
#define RELAYOUT_DSPARK_MOE_DRAFT_MESSAGE                                                \
  "DSpark + dp attention with a DeepSeek-V4 (MoE) draft requires attn_tp == 1 (set "   \
  "--dp-size == --tp). attn_tp > 1 corrupts the MoE-under-DP all-reduce."

namespace relayout {

inline constexpr int kMaxWidth = 1 << 20;

// What an engine's server flags say (SGLang's names in comments).
struct LayoutConfig {
  int tp = 1;                             // --tp-size
  int dp = 1;                             // --dp-size
  int cp = 1;                             // attention context parallel
  int ep = 1;                             // --ep-size, honoured only with Backend::none
  int moe_dp = 1;                         // --moe-dp-size
  bool enable_dp_attention = false;       // --enable-dp-attention
  Backend moe_a2a_backend = Backend::none;  // --moe-a2a-backend
  Draft draft = Draft::none;              // speculative draft model kind

  friend constexpr bool operator==(const LayoutConfig&, const LayoutConfig&) = default;
};

// The derived widths. tp == attn_dp*attn_cp*attn_tp == moe_dp*moe_ep*moe_tp.
struct Widths {
  int tp = 0;
  int attn_dp = 0;
  int attn_cp = 0;
  int attn_tp = 0;
  int moe_dp = 0;
  int moe_ep = 0;
  int moe_tp = 0;

  friend constexpr bool operator==(const Widths&, const Widths&) = default;
};

enum class LayoutRule : std::uint8_t {
  ok,
  width_positive,
  width_limit,
  attn_divides,
  moe_divides,
};

struct WidthsResult {
  LayoutRule rule = LayoutRule::ok;
  const char* input = "";  // the flag that broke the rule
  Widths widths{};
};

constexpr int attn_dp_width(const LayoutConfig& c) { return c.enable_dp_attention ? c.dp : 1; }
constexpr int moe_ep_width(const LayoutConfig& c) {
  return spans_ep(c.moe_a2a_backend) ? c.tp : c.ep;
}
// True when the user asked for an --ep that the layout does not use (a backend forced EP to tp).
constexpr bool ep_overridden(const LayoutConfig& c) { return c.ep != 1 && moe_ep_width(c) != c.ep; }

constexpr WidthsResult derive_widths(const LayoutConfig& c) {
  struct Flag {
    int value;
    const char* name;
  };
  const Flag flags[] = {{c.tp, "--tp"}, {c.dp, "--dp"}, {c.cp, "--cp"}, {c.ep, "--ep"},
                        {c.moe_dp, "--moe-dp-size"}};
  for (const Flag& f : flags) {
    if (f.value < 1) return {LayoutRule::width_positive, f.name, {}};
    if (f.value > kMaxWidth) return {LayoutRule::width_limit, f.name, {}};
  }
  Widths w;
  w.tp = c.tp;
  w.attn_dp = attn_dp_width(c);
  w.attn_cp = c.cp;
  // Both factors are <= 2^20, so the products are exact in 64 bits.
  const std::int64_t attn_outer = std::int64_t{w.attn_dp} * w.attn_cp;
  if (c.tp % attn_outer != 0)
    return {LayoutRule::attn_divides, c.enable_dp_attention ? "--dp" : "--cp", {}};
  w.attn_tp = static_cast<int>(c.tp / attn_outer);
  w.moe_ep = moe_ep_width(c);
  w.moe_dp = c.moe_dp;
  const std::int64_t moe_outer = std::int64_t{w.moe_ep} * w.moe_dp;
  if (c.tp % moe_outer != 0)
    return {LayoutRule::moe_divides, c.ep != 1 && !spans_ep(c.moe_a2a_backend) ? "--ep"
                                                                                : "--moe-dp-size",
            {}};
  w.moe_tp = static_cast<int>(c.tp / moe_outer);
  return {LayoutRule::ok, "", w};
}

namespace impl {

inline std::string describe_rule(const WidthsResult& r, const LayoutConfig& c) {
  const std::string in = r.input;
  switch (r.rule) {
    case LayoutRule::ok:
      return "ok";
    case LayoutRule::width_positive:
    case LayoutRule::width_limit: {
      const int value = in == "--tp" ? c.tp : in == "--dp" ? c.dp : in == "--cp" ? c.cp
                        : in == "--ep" ? c.ep : c.moe_dp;
      return in + " = " + std::to_string(value) + " is invalid: " +
             (r.rule == LayoutRule::width_positive ? RELAYOUT_RULE_WIDTH_POSITIVE
                                                   : RELAYOUT_RULE_WIDTH_LIMIT);
    }
    case LayoutRule::attn_divides:
      return in + ": tp = " + std::to_string(c.tp) + " is not divisible by attn_dp * attn_cp = " +
             std::to_string(attn_dp_width(c)) + " * " + std::to_string(c.cp) + "; " +
             RELAYOUT_RULE_ATTN_DIVIDES;
    case LayoutRule::moe_divides:
      return in + ": tp = " + std::to_string(c.tp) + " is not divisible by moe_ep * moe_dp = " +
             std::to_string(moe_ep_width(c)) + " * " + std::to_string(c.moe_dp) +
             (spans_ep(c.moe_a2a_backend)
                  ? " (moe_ep is forced to tp by --moe-a2a-backend " +
                        std::string(to_string(c.moe_a2a_backend)) + ")"
                  : std::string()) +
             "; " + RELAYOUT_RULE_MOE_DIVIDES;
  }
  return "unknown rule";
}

}  // namespace impl

// Derives the widths or throws LayoutError naming the flag and the rule.
inline Widths checked_widths(const LayoutConfig& c) {
  const WidthsResult r = derive_widths(c);
  if (r.rule != LayoutRule::ok) throw LayoutError(r.input, impl::describe_rule(r, c));
  return r.widths;
}

}  // namespace relayout
