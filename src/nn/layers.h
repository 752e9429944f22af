// The layers of a Llama-family decoder: Linear, RmsNorm, Embedding,
// Attention, Mlp, DecoderBlock. Each holds its parameters as Tensors (which
// may point into a memory-mapped weight file) and a forward() that reads like
// the model's definition; intermediates come from the caller's Arena.
// forward() is const: one set of layers serves any number of concurrent
// passes, each with its own Arena and KV cache. The backward pass will sit
// beside each forward and read what forward saved (rstd, lse) in its arena.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "nn/arena.h"

namespace lathe {

class Linear {
 public:
  Linear() = default;
  Linear(Tensor w, Tensor bias) : w_(std::move(w)), b_(std::move(bias)) {}  // w [out, in], bias [out] or none
  int64_t in() const { return w_.size(1); }
  int64_t out() const { return w_.size(0); }
  const Tensor& weight() const { return w_; }
  // y = x·wᵀ + b, or y += x·wᵀ + b when accumulate. x [n, in], y [n, out].
  Status forward(TensorView x, TensorView y, Arena& arena, bool accumulate = false) const;
  // ys[i] = x·layers[i]ᵀ + b for several layers on one input, fused into one
  // pass over the cores when decoding (q/k/v, gate/up). At most 4 layers.
  static Status forward_group(TensorView x, std::span<const Linear* const> layers, std::span<const TensorView> ys,
                              Arena& arena);

 private:
  Tensor w_, b_;
};

class RmsNorm {
 public:
  RmsNorm() = default;
  RmsNorm(Tensor w, float eps) : w_(std::move(w)), eps_(eps) {}  // w [dim]
  // x [rows, dim] → y [rows, dim]; y may alias x.
  Status forward(TensorView x, TensorView y) const;

 private:
  Tensor w_;
  float eps_ = 1e-6f;
};

class Embedding {
 public:
  Embedding() = default;
  explicit Embedding(Tensor table) : table_(std::move(table)) {}  // [vocab, dim]
  const Tensor& table() const { return table_; }
  // tokens [n] i32 → out [n, dim] f32.
  Status forward(TensorView tokens, TensorView out) const;

 private:
  Tensor table_;
};

// What one forward call shares across layers, plus this layer's cache.
struct AttentionStep {
  int pos0 = 0;        // position of the first new token
  TensorView cos{};      // [n, head_dim / 2] f32
  TensorView sin{};      // [n, head_dim / 2] f32
  TensorView k_cache{};  // [max_tokens, n_head_kv, head_dim] f32, this layer's
  TensorView v_cache{};  // [max_tokens, n_head_kv, head_dim] f32
};

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int window = 0;  // sliding window; 0: none
};

class Attention {
 public:
  Attention() = default;
  // q_norm / k_norm: Qwen3's RMSNorm over head_dim, or nullopt.
  Attention(AttentionShape shape, Linear q, Linear k, Linear v, Linear o, std::optional<RmsNorm> q_norm,
            std::optional<RmsNorm> k_norm);
  // h += o_proj(attention(x)): x [n, hidden] normalized input, h [n, hidden]
  // the residual stream. Writes the new keys/values into the step's cache rows.
  Status forward(TensorView x, TensorView h, const AttentionStep& step, Arena& arena) const;

 private:
  AttentionShape shape_;
  Linear q_, k_, v_, o_;
  std::optional<RmsNorm> q_norm_, k_norm_;
};

class Mlp {
 public:
  Mlp() = default;
  Mlp(Linear gate, Linear up, Linear down) : gate_(std::move(gate)), up_(std::move(up)), down_(std::move(down)) {}
  // h += down(silu(gate(x)) * up(x)). x, h [n, hidden].
  Status forward(TensorView x, TensorView h, Arena& arena) const;

 private:
  Linear gate_, up_, down_;
};

class DecoderBlock {
 public:
  DecoderBlock() = default;
  DecoderBlock(RmsNorm attn_norm, Attention attn, RmsNorm mlp_norm, Mlp mlp)
      : attn_norm_(std::move(attn_norm)), attn_(std::move(attn)), mlp_norm_(std::move(mlp_norm)), mlp_(std::move(mlp)) {}
  // Pre-norm block on the residual stream h [n, hidden], in place.
  Status forward(TensorView h, const AttentionStep& step, Arena& arena) const;

 private:
  RmsNorm attn_norm_;
  Attention attn_;
  RmsNorm mlp_norm_;
  Mlp mlp_;
};

}  // namespace lathe
