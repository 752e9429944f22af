// Causal self-attention over a KV cache with grouped-query heads (GQA):
// query head h reads key/value head h / (n_head / n_head_kv). Query row i sits
// at position pos0 + i and sees keys 0 .. pos0 + i (and, with a sliding
// window W, only keys j > pos − W, as Hugging Face's sliding mask). Scores are
// scaled by `scale` (1/sqrt(head_dim)); softmax is fp32 with the max
// subtracted. Views are borrowed; the CPU implementation needs
// attention_workspace_floats() floats of workspace (one score row per thread).
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct AttentionArgs {
  TensorView q{};          // [n_tokens, n_head, head_dim] f32
  TensorView k{};          // [n_ctx, n_head_kv, head_dim] f32, n_ctx >= pos0 + n_tokens
  TensorView v{};          // [n_ctx, n_head_kv, head_dim] f32
  TensorView out{};        // [n_tokens, n_head, head_dim] f32, must not overlap q
  TensorView lse{};        // [n_tokens, n_head] f32 log-sum-exp for backward; empty when not training
  TensorView workspace{};  // [>= attention_workspace_floats(...)] f32
  int pos0 = 0;
  int window = 0;        // sliding window in tokens; 0: none
  float scale = 1.0f;
};
Status validate(const AttentionArgs& a);  // messages start with "attention: "

int64_t attention_workspace_floats(int64_t n_ctx, int n_threads);

// Training attention over packed variable-length sequences: the tokens of
// several documents lie back to back; document d holds rows
// [cu_seqlens[d], cu_seqlens[d + 1]) and attends causally within itself only
// (row i sees rows j of its document with j <= i, and j > i − window when a
// window is set). GQA as above. Forward writes out and lse (both needed by
// backward); backward recomputes the probabilities from lse and writes
// d_q, d_k, d_v (overwritten, not accumulated). Both run one query block of
// kAttentionBlockRows rows against its visible keys at a time through sgemm,
// so the CPU workspace grows linearly with the longest document:
// attention_varlen_workspace_floats() floats.
constexpr int64_t kAttentionBlockRows = 64;

struct AttentionVarlenArgs {
  TensorView q{};           // [n_tokens, n_head, head_dim] f32
  TensorView k{};           // [n_tokens, n_head_kv, head_dim] f32
  TensorView v{};           // [n_tokens, n_head_kv, head_dim] f32
  TensorView out{};         // [n_tokens, n_head, head_dim] f32, must not overlap q, k, v
  TensorView lse{};         // [n_tokens, n_head] f32
  TensorView cu_seqlens{};  // [n_docs + 1] i32: 0, ..., n_tokens, non-decreasing
  TensorView workspace{};   // [>= attention_varlen_workspace_floats(...)] f32
  int window = 0;
  float scale = 1.0f;
  // bf16-mixed: the four products take bf16 operands (rounded to nearest-
  // even) with f32 sums, on AMX tiles where the CPU has them; softmax, lse
  // and the row sums stay f32, with a vectorized f32 exp (within 2 ulp).
  // False (the default): everything f32, exps as exact as libm's.
  bool bf16_products = false;
};
Status validate(const AttentionVarlenArgs& a);  // messages start with "attention_varlen: "

struct AttentionVarlenBackwardArgs {
  TensorView q{}, k{}, v{}, out{}, lse{}, cu_seqlens{};  // as forward, out and lse from it
  TensorView d_out{};      // [n_tokens, n_head, head_dim] f32
  TensorView d_q{};        // [n_tokens, n_head, head_dim] f32
  TensorView d_k{};        // [n_tokens, n_head_kv, head_dim] f32
  TensorView d_v{};        // [n_tokens, n_head_kv, head_dim] f32
  TensorView workspace{};  // [>= attention_varlen_workspace_floats(...)] f32
  int window = 0;
  float scale = 1.0f;
  bool bf16_products = false;  // as forward's; give both the same value
};
Status validate(const AttentionVarlenBackwardArgs& a);  // messages start with "attention_varlen_backward: "

// Workspace for documents of up to max_seqlen tokens on n_threads threads.
int64_t attention_varlen_workspace_floats(int64_t max_seqlen, int n_threads);

}  // namespace lathe
