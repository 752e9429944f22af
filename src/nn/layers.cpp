// Forward passes of the decoder layers (see layers.h). Every layer calls the
// backend op for its tensors' device; only the CPU backend exists for these
// ops so far, so any other device is an error naming it.
#include "nn/layers.h"

#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"

namespace lathe {

namespace {
Status require_cpu(const TensorView& v, const char* layer) {
  if (!v.device.is_cpu()) return unsupported(layer, ": no ", v.device.str(), " implementation yet");
  return Status::ok();
}
}  // namespace

Status Linear::forward(TensorView x, TensorView y, Arena& arena, bool accumulate) const {
  LATHE_TRY(require_cpu(w_.view(), "linear"));
  Arena::Scope scope(arena);
  int64_t ws = linear_workspace_floats(x.shape[0], in(), w_.dtype(), num_threads());
  TensorView workspace = ws > 0 ? arena.alloc(DType::F32, {ws}) : TensorView{};
  return cpu::linear_forward(
      {.x = x, .w = w_, .bias = b_.view(), .y = y, .workspace = workspace, .accumulate = accumulate});
}

Status Linear::forward_group(TensorView x, std::span<const Linear* const> layers, std::span<const TensorView> ys,
                             Arena& arena) {
  LATHE_CHECK(layers.size() == ys.size() && layers.size() <= cpu::kMaxLinearGroup, "linear group of ",
              layers.size(), " layers, ", ys.size(), " outputs");
  Arena::Scope scope(arena);
  LinearArgs args[cpu::kMaxLinearGroup];
  for (size_t i = 0; i < layers.size(); ++i) {
    const Linear& l = *layers[i];
    LATHE_TRY(require_cpu(l.w_.view(), "linear"));
    int64_t ws = linear_workspace_floats(x.shape[0], l.in(), l.w_.dtype(), num_threads());
    args[i] = {.x = x, .w = l.w_, .bias = l.b_.view(), .y = ys[i],
               .workspace = ws > 0 ? arena.alloc(DType::F32, {ws}) : TensorView{}};
  }
  return cpu::linear_forward_group({args, layers.size()});
}

Status RmsNorm::forward(TensorView x, TensorView y) const {
  LATHE_TRY(require_cpu(w_.view(), "rms_norm"));
  return cpu::rms_norm_forward({.x = x, .w = w_, .y = y, .eps = eps_});
}

Status Embedding::forward(TensorView tokens, TensorView out) const {
  LATHE_TRY(require_cpu(table_.view(), "embedding"));
  return cpu::embedding_forward({.tokens = tokens, .table = table_, .out = out});
}

Attention::Attention(AttentionShape shape, Linear q, Linear k, Linear v, Linear o, std::optional<RmsNorm> q_norm,
                     std::optional<RmsNorm> k_norm)
    : shape_(shape), q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), o_(std::move(o)),
      q_norm_(std::move(q_norm)), k_norm_(std::move(k_norm)) {}

Status Attention::forward(TensorView x, TensorView h, const AttentionStep& step, Arena& arena) const {
  Arena::Scope scope(arena);
  const int64_t n = x.shape[0], hd = shape_.head_dim, nh = shape_.n_head, nkv = shape_.n_head_kv;
  TensorView q = arena.alloc(DType::F32, {n, nh * hd});
  // New keys and values go straight into their cache rows.
  TensorView k = step.k_cache.slice_rows(step.pos0, step.pos0 + n).reshape({n, nkv * hd});
  TensorView v = step.v_cache.slice_rows(step.pos0, step.pos0 + n).reshape({n, nkv * hd});
  const Linear* qkv[] = {&q_, &k_, &v_};
  const TensorView qkv_out[] = {q, k, v};
  LATHE_TRY(Linear::forward_group(x, qkv, qkv_out, arena));
  if (q_norm_) LATHE_TRY(q_norm_->forward(q.reshape({n * nh, hd}), q.reshape({n * nh, hd})));
  if (k_norm_) LATHE_TRY(k_norm_->forward(k.reshape({n * nkv, hd}), k.reshape({n * nkv, hd})));
  LATHE_TRY(cpu::rope_forward({.x = q.reshape({n, nh, hd}), .cos = step.cos, .sin = step.sin}));
  LATHE_TRY(cpu::rope_forward({.x = k.reshape({n, nkv, hd}), .cos = step.cos, .sin = step.sin}));

  const int64_t n_ctx = step.pos0 + n;
  TensorView attn = arena.alloc(DType::F32, {n, nh, hd});
  // Sized for the whole cache, so decode steps never outgrow the arena.
  TensorView ws = arena.alloc(DType::F32, {attention_workspace_floats(step.k_cache.shape[0], num_threads())});
  LATHE_TRY(cpu::attention_forward({.q = q.reshape({n, nh, hd}),
                                    .k = step.k_cache.slice_rows(0, n_ctx),
                                    .v = step.v_cache.slice_rows(0, n_ctx),
                                    .out = attn,
                                    .workspace = ws,
                                    .pos0 = step.pos0,
                                    .window = shape_.window,
                                    .scale = 1.0f / std::sqrt(float(hd))}));
  return o_.forward(attn.reshape({n, nh * hd}), h, arena, /*accumulate=*/true);
}

Status Mlp::forward(TensorView x, TensorView h, Arena& arena) const {
  Arena::Scope scope(arena);
  const int64_t n = x.shape[0], ffn = gate_.out();
  TensorView gate = arena.alloc(DType::F32, {n, ffn});
  TensorView up = arena.alloc(DType::F32, {n, ffn});
  const Linear* gate_up[] = {&gate_, &up_};
  const TensorView gate_up_out[] = {gate, up};
  LATHE_TRY(Linear::forward_group(x, gate_up, gate_up_out, arena));
  LATHE_TRY(cpu::swiglu_forward({.gate = gate, .up = up, .out = gate}));
  return down_.forward(gate, h, arena, /*accumulate=*/true);
}

Status DecoderBlock::forward(TensorView h, const AttentionStep& step, Arena& arena) const {
  Arena::Scope scope(arena);
  TensorView xn = arena.alloc(DType::F32, h.shape);
  LATHE_TRY(attn_norm_.forward(h, xn));
  LATHE_TRY(attn_.forward(xn, h, step, arena));  // h = h + attn(norm(h))
  LATHE_TRY(mlp_norm_.forward(h, xn));
  return mlp_.forward(xn, h, arena);             // h = h + mlp(norm(h))
}

}  // namespace lathe
