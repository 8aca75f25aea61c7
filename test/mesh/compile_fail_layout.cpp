// Compiled once per RELAYOUT_CF_CASE_*: each must stop the compile with its static_assert sentence.
#include <relayout/mesh.hpp>

using namespace relayout;

int main() {
#if defined(RELAYOUT_CF_CASE_attn_divides)
  return Layout<Tp<8>, Dp<3>, DpAttention<true>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_moe_divides)
  return Layout<Tp<8>, Ep<3>>::moe_tp;
#elif defined(RELAYOUT_CF_CASE_zero_width)
  return Layout<Tp<0>>::tp;
#elif defined(RELAYOUT_CF_CASE_dspark_moe_draft)
  return Layout<Tp<32>, Dp<16>, DpAttention<true>, DraftModel<Draft::moe>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_rank_out_of_range)
  return Layout<Tp<4>>::coords<4>().attn_tp_rank;
#elif defined(RELAYOUT_CF_CASE_duplicate_option)
  return Layout<Tp<4>, Tp<8>>::tp;
#else
  return Layout<Tp<32>, Dp<32>, DpAttention<true>, DraftModel<Draft::moe>>::attn_tp - 1;
#endif
}
