// upload_to_cuda: reads the host TrainableModel's internals (shape, quirks,
// the f32 base, the LoRA or full-SFT table, LoRA dropout's seed and pass
// count) and fills a CudaTrainableModel with them; parse_device for the CLI
// and the Trainer. Under full SFT the host's base pointers are its
// trainable weights: the same upload serves.
#include "train/cuda_trainable.h"

#include <algorithm>
#include <charconv>

#include "backends/cuda/device.h"
#include "train/trainable_impl.h"

namespace lathe {

Result<DeviceChoice> parse_device(const std::string& text) {
  if (text.empty() || text == "auto") return DeviceChoice{.cuda = cuda::device_count() > 0, .index = 0};
  if (text == "cpu") return DeviceChoice{};
  if (text == "cuda") return DeviceChoice{.cuda = true, .index = 0};
  if (text.rfind("cuda:", 0) == 0) {
    int index = -1;
    const char* b = text.data() + 5;
    const char* e = text.data() + text.size();
    auto [p, ec] = std::from_chars(b, e, index);
    if (ec == std::errc() && p == e && b != e && index >= 0) return DeviceChoice{.cuda = true, .index = index};
  }
  return invalid_argument("device '", text, "': expected cpu, cuda or cuda:N");
}

namespace {

const char* const kLeaf[kNumProj] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                     "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

Status check_supported(const TrainableModelImpl& h) {
  if (h.quirks.o_bias || h.quirks.mlp_bias)
    return unsupported("--device cuda: o_proj / MLP biases are not implemented on the GPU");
  if (h.blocks.empty()) return invalid_argument("--device cuda: the model has no layers");
  return Status::ok();
}

// The host keeps a matrix in f32, or in bf16 under bf16_base (then p is null).
Status upload(CudaTrainableModel& g, const std::string& name, const float* p, int64_t n,
              const uint16_t* p16 = nullptr) {
  if (!p && p16) return g.upload_base_bf16(name, std::span<const uint16_t>(p16, size_t(n)));
  if (!p) return invalid_argument("--device cuda: the host model holds no values for ", name);
  return g.upload_base(name, std::span<const float>(p, size_t(n)));
}

Status upload_base(const TrainableModelImpl& h, CudaTrainableModel& g) {
  const int64_t H = h.cfg.hidden_size, V = h.cfg.vocab_size, hd = h.cfg.head_dim;
  LATHE_TRY(upload(g, "model.embed_tokens.weight", h.embed, V * H, h.embed16));
  if (!h.quirks.tied_embeddings) LATHE_TRY(upload(g, "lm_head.weight", h.lm_head.w, V * H, h.lm_head.w16));
  LATHE_TRY(upload(g, "model.norm.weight", h.final_norm.w, H));
  for (size_t l = 0; l < h.blocks.size(); ++l) {
    const TBlock& b = h.blocks[l];
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    LATHE_TRY(upload(g, pre + "input_layernorm.weight", b.attn_norm.w, H));
    LATHE_TRY(upload(g, pre + "post_attention_layernorm.weight", b.mlp_norm.w, H));
    if (b.q_norm.w) {
      LATHE_TRY(upload(g, pre + "self_attn.q_norm.weight", b.q_norm.w, hd));
      LATHE_TRY(upload(g, pre + "self_attn.k_norm.weight", b.k_norm.w, hd));
    }
    for (int j = 0; j < kNumProj; ++j) {
      const TLinear& L = b.proj[size_t(j)];
      LATHE_TRY(upload(g, pre + kLeaf[j] + ".weight", L.w, L.out * L.in, L.w16));
      if (L.b) LATHE_TRY(upload(g, pre + kLeaf[j] + ".bias", L.b, L.out));
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<CudaTrainableModel>> upload_to_cuda(TrainableModel& host, int device, int64_t max_tokens,
                                                           const cuda::CudaAdamWConfig& adamw,
                                                           std::optional<CudaRecompute> recompute,
                                                           int64_t max_arena_bytes, int64_t keep_layers,
                                                           int64_t max_seqlen, int64_t device_budget_bytes,
                                                           bool fit_recompute, const char* budget_key) {
  const TrainableModelImpl& h = host.internals();
  LATHE_TRY(check_supported(h));
  CudaModelShape s{.vocab = h.cfg.vocab_size, .hidden = h.cfg.hidden_size, .inter = h.cfg.intermediate_size,
                   .n_layer = h.cfg.num_hidden_layers, .n_head = h.cfg.num_attention_heads,
                   .n_kv = h.cfg.num_key_value_heads, .head_dim = h.cfg.head_dim, .eps = h.cfg.rms_norm_eps,
                   .tied = h.quirks.tied_embeddings, .qkv_bias = h.quirks.qkv_bias, .qk_norm = h.quirks.qk_norm,
                   .window = h.quirks.sliding_window, .inv_freq = h.inv_freq};
  CudaTrainOptions o{.device = device, .max_tokens = max_tokens, .max_seqlen = max_seqlen, .lora_r = h.opts.lora.r,
                     .lora_scale = h.opts.lora.scale(), .targets = {},
                     .recompute = recompute.value_or(h.opts.activations_checkpoint ? CudaRecompute::kFull
                                                                                   : CudaRecompute::kNone),
                     .max_arena_bytes = max_arena_bytes, .keep_layers = keep_layers, .full_sft = h.opts.full_sft,
                     .lora_dropout = h.opts.lora.dropout, .seed = h.opts.seed, .adamw = adamw};
  for (int j = 0; j < kNumProj; ++j) o.targets[size_t(j)] = h.blocks[0].proj[size_t(j)].lora >= 0;
  if (device_budget_bytes > 0 && max_arena_bytes == 0) {
    // A mode's plan within `cap` arena bytes (selective: the most kept
    // layers that fit, else its least memory; the others do not choose).
    auto plan_for = [&](int64_t cap) {
      CudaTrainOptions p = o;
      if (p.recompute == CudaRecompute::kSelective) p.max_arena_bytes = cap;
      return CudaTrainableModel::plan_arena(s, p);
    };
    // The moments' bytes do not depend on the arena's plan; a budget they
    // use up leaves selective's plan with no kept layer (1 byte: none fit).
    LATHE_ASSIGN_OR_RETURN(CudaArenaPlan plan, plan_for(1));
    const int64_t arena_budget = std::max<int64_t>(1, device_budget_bytes - plan.optimizer_bytes);
    LATHE_ASSIGN_OR_RETURN(plan, plan_for(arena_budget));
    while (fit_recompute && o.recompute != CudaRecompute::kFull && plan.bytes > arena_budget) {
      o.recompute = o.recompute == CudaRecompute::kNone ? CudaRecompute::kSelective : CudaRecompute::kFull;
      LATHE_ASSIGN_OR_RETURN(plan, plan_for(arena_budget));
    }
    if (budget_key && plan.bytes > arena_budget) {
      LATHE_ASSIGN_OR_RETURN(const CudaArenaPlan least, plan_for(1));
      const auto mib = [](int64_t b) { return (b + (int64_t(1) << 20) - 1) >> 20; };  // rounded up
      const char* mode = o.recompute == CudaRecompute::kFull        ? "full recomputation"
                         : o.recompute == CudaRecompute::kSelective ? "selective recomputation"
                                                                    : "no recomputation";
      const int64_t need = least.bytes + least.optimizer_bytes;
      return invalid_argument(budget_key, ": the budget leaves ", device_budget_bytes,
                              " bytes for training; this run needs at least ", need, " bytes (", mib(need),
                              " MiB: the arena with ", mode, ", ", mib(least.bytes), " MiB, and the optimizer's moments, ",
                              mib(least.optimizer_bytes), " MiB); raise it, or lower data.micro_batch_size or data.seq_length",
                              o.recompute == CudaRecompute::kFull
                                  ? ""
                                  : ", or recompute fully (trainer.activations_checkpoint=true, "
                                    "trainer.activations_checkpoint_granularity=full)");
    }
    if (o.recompute == CudaRecompute::kSelective) o.max_arena_bytes = arena_budget;
  }
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<CudaTrainableModel> g, CudaTrainableModel::create(s, o));
  const std::vector<ParamInfo>& want = host.param_table();
  const std::vector<ParamInfo>& got = g->param_table();
  bool same = want.size() == got.size();
  for (size_t i = 0; same && i < want.size(); ++i)
    same = want[i].name == got[i].name && want[i].offset == got[i].offset && want[i].shape == got[i].shape;
  if (!same) return error(StatusCode::kInternal, "--device cuda: the GPU's parameter layout differs from the host model's");
  LATHE_TRY(upload_base(h, *g));
  if (g->n_params() > 0) LATHE_TRY(g->upload_params(host.params().subspan(0, size_t(g->n_params()))));
  g->set_passes_run(host.passes_run());  // the dropout masks go on where the host's stand
  LATHE_TRY(g->context().synchronize());
  return g;
}

}  // namespace lathe
