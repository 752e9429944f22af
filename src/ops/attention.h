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

}  // namespace lathe
