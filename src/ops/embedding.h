// Embedding lookup: out[i] = table[tokens[i]] converted to f32. Token ids out
// of range are bad input (a Status naming the id), checked by validate().
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct EmbeddingArgs {
  TensorView tokens{};  // [n] i32
  TensorView table{};   // [vocab, dim] f32, bf16 or f16
  TensorView out{};     // [n, dim] f32
};
Status validate(const EmbeddingArgs& a);  // messages start with "embedding: "

// Backward: d_table[tokens[i]] += d_out[i] (repeated ids add up).
struct EmbeddingBackwardArgs {
  TensorView tokens{};   // [n] i32
  TensorView d_out{};    // [n, dim] f32
  TensorView d_table{};  // [vocab, dim] f32, accumulated
};
Status validate(const EmbeddingBackwardArgs& a);  // messages start with "embedding_backward: "

}  // namespace lathe
