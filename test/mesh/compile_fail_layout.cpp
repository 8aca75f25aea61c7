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
#elif defined(RELAYOUT_CF_CASE_dspark_cp)
  // speculative_hook.py _handle_dspark: under DP attention with dp > 1, attn_cp must be 1.
  return Layout<Tp<8>, Dp<2>, Cp<2>, DpAttention<true>, DpLmHead<true>, DraftModel<Draft::dense>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_dp_lm_head)
  // overrides.py _dp_lm_head_validation: --enable-dp-lm-head (dp > 1) needs DP attention.
  return Layout<Tp<4>, Dp<2>, DpLmHead<true>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_dcp_divides)
  // parallel_state.py initialize_model_parallel: decode-CP blocks of dcp ranks inside TP.
  return Layout<Tp<4>, Dcp<3>>::dcp;
#elif defined(RELAYOUT_CF_CASE_dense_tp)
  // validation_hook.py check_server_args: moe_dense_tp_size in (None, 1, tp_size).
  return Layout<Tp<4>, MoeDenseTp<2>>::dense_tp;
#elif defined(RELAYOUT_CF_CASE_tp_lm_head_a2a)
  // overrides.py _dp_lm_head_validation: the TP LM-head all-to-all needs tp == dp.
  return Layout<Tp<8>, Dp<4>, DpAttention<true>, TpLmHeadAllToAll<true>>::attn_tp;
#elif defined(RELAYOUT_CF_CASE_redundant_needs_ep)
  return Layout<Tp<4>, EpRedundantExperts<2>>::moe_ep;
#elif defined(RELAYOUT_CF_CASE_pp_speculative)
  // validation_hook.py check_server_args: pipeline parallelism without speculative decoding.
  return Layout<Tp<4>, Pp<2>, DraftModel<Draft::dense>>::pp;
#elif defined(RELAYOUT_CF_CASE_nnodes_replicas)
  return Layout<Tp<4>, Dp<2>, Nnodes<2>>::nnodes;
#else
  // Every option at once, valid: the failures above come from their rules alone.
  static_assert(Layout<Tp<8>, Dp<8>, DpAttention<true>, TpLmHeadAllToAll<true>, MoeDenseTp<1>, Dcp<2>,
                       EpRedundantExperts<8>, A2a<Backend::deepep>, Pp<2>, Nnodes<2>>::dcp == 2);
  return Layout<Tp<32>, Dp<32>, DpAttention<true>, DpLmHead<true>, DraftModel<Draft::moe>>::attn_tp - 1 +
         Layout<Tp<8>, PrefillCp<true>, MoeDp<8>>::moe_tp - 1;
#endif
}
