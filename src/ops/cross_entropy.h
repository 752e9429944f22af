// The LM head fused with cross-entropy: for each row i with targets[i] !=
// kCrossEntropyIgnore, loss_i = logsumexp(hidden_i·wᵀ) − (hidden_i·wᵀ)[target_i].
// The op returns Σ loss_i and the count of such rows; normalizing (dividing
// by the supervised tokens of the whole global batch) is the caller's, passed
// in as grad_scale. When d_hidden is given, the same call writes the
// gradient of grad_scale·Σ loss_i: d_hidden (zero rows where ignored) and,
// when the head trains, d_w += Σ_i g_iᵀ·hidden_i.
//
// Chunked over tokens: supervised rows are gathered chunk_rows at a time and
// only that chunk's [chunk_rows, vocab] logits ever exist (in the workspace);
// each logits row is reduced in two passes (max, then Σ exp) and turned into
// its gradient softmax − onehot in place. Ignored rows cost nothing.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

constexpr int32_t kCrossEntropyIgnore = -100;

struct CrossEntropyArgs {
  TensorView hidden{};     // [n, dim] f32 (after the final norm)
  TensorView w{};          // [vocab, dim] f32, the LM head; bf16 when frozen (no d_w)
  TensorView targets{};    // [n] i32 in [0, vocab) or kCrossEntropyIgnore
  TensorView d_hidden{};   // [n, dim] f32, written; empty: loss only
  TensorView d_w{};        // [vocab, dim] f32, accumulated; empty: head frozen (needs d_hidden)
  TensorView workspace{};  // [>= cross_entropy_workspace_floats(...)] f32
  int64_t chunk_rows = 0;  // rows per chunk; 0: cross_entropy_chunk_rows(vocab)
  float grad_scale = 1.0f;
};
Status validate(const CrossEntropyArgs& a);  // messages start with "cross_entropy: "

struct CrossEntropyStats {
  double loss_sum = 0;   // Σ loss_i over supervised rows
  int64_t n_valid = 0;   // supervised rows
};

// Rows per chunk that keep the chunk's logits near 32 MiB (at least 16).
int64_t cross_entropy_chunk_rows(int64_t vocab);
int64_t cross_entropy_workspace_floats(int64_t vocab, int64_t dim, int64_t chunk_rows);

}  // namespace lathe
