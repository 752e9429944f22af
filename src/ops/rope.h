// Rotary position embedding, Hugging Face's rotate_half convention: the
// head_dim is split into halves (x1, x2) and rotated as
//   y1 = x1·cos − x2·sin,  y2 = x2·cos + x1·sin
// with angle position · inv_freq[i] for pair i. Frequencies follow
// transformers' modeling_rope_utils ("default" and "llama3"), computed in f32
// the way torch does, so cos/sin tables match the reference to the last bit or
// one ulp. Two steps: rope_tables() for the positions of a call, then
// rope_forward() on q and k in place.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct RopeParams {
  float theta = 10000.0f;
  std::string type;  // "" or "default", "llama3", "linear"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};
// inv_freq [head_dim / 2] f32. Unsupported types are an error naming the type.
Result<std::vector<float>> rope_inv_freq(const RopeParams& p, int head_dim);

struct RopeTablesArgs {
  TensorView inv_freq{};   // [half] f32
  TensorView positions{};  // [n_tokens] i32
  TensorView cos{};        // [n_tokens, half] f32
  TensorView sin{};        // [n_tokens, half] f32
};
Status validate(const RopeTablesArgs& a);  // messages start with "rope: "

struct RopeArgs {
  TensorView x{};    // [n_tokens, n_head, head_dim] f32, rotated in place
  TensorView cos{};  // [n_tokens, head_dim / 2] f32
  TensorView sin{};  // [n_tokens, head_dim / 2] f32
  bool inverse = false;  // rotate by −angle (the backward of rope is its inverse)
};
Status validate(const RopeArgs& a);  // messages start with "rope: "

}  // namespace lathe
