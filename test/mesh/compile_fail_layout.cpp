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
#elif defined(RELAYOUT_CF_CASE_width_limit)
  return Layout<Tp<(1 << 20) + 1>>::tp;
#elif defined(RELAYOUT_CF_CASE_dspark_moe_draft)
  return Layout<Tp<32>, Dp<16>, DpAttention<true>, DraftModel<Draft::moe>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_rank_out_of_range)
  return Layout<Tp<4>>::coords<4>().attn_tp_rank;
#elif defined(RELAYOUT_CF_CASE_duplicate_option)
  return Layout<Tp<4>, Tp<8>>::tp;
#elif defined(RELAYOUT_CF_CASE_prefill_cp_tp)
  return Layout<Tp<16>, PrefillCp<true>>::attn_cp;
#elif defined(RELAYOUT_CF_CASE_prefill_cp_backend)
  return Layout<Tp<8>, PrefillCp<true>, A2a<Backend::pplx>>::attn_cp;
#elif defined(RELAYOUT_CF_CASE_cp_moe_dp)
  return Layout<Tp<8>, MoeDp<2>>::moe_tp;
#elif defined(RELAYOUT_CF_CASE_flashinfer_dp)
  return Layout<Tp<8>, Dp<4>, DpAttention<true>, A2a<Backend::flashinfer>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_attn_dp_replicas)
  return Layout<Tp<8>, Dp<2>, AttnDp<4>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_dspark_dp_lm_head)
  // speculative_hook.py _handle_dspark: DP attention with dp > 1 needs --enable-dp-lm-head.
  return Layout<Tp<8>, Dp<8>, DpAttention<true>, DraftModel<Draft::dense>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_dspark_backend)
  return Layout<Tp<8>, Dp<8>, DpAttention<true>, DpLmHead<true>, DraftModel<Draft::dense>,
                A2a<Backend::deepep>>::attn_tp;
#else
  return Layout<Tp<32>, Dp<32>, DpAttention<true>, DpLmHead<true>, DraftModel<Draft::moe>>::attn_tp - 1 +
         Layout<Tp<8>, PrefillCp<true>, MoeDp<8>>::moe_tp - 1;
#endif
}
