// Family detection and quirks (see family.h).
#include "models/family.h"

#include "ops/rope.h"

namespace lathe {

namespace {
struct Known {
  const char* architecture;
  const char* model_type;
};
constexpr Known kKnown[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
};
}  // namespace

Result<FamilyQuirks> family_quirks(const ModelConfig& cfg, const std::string& source) {
  FamilyQuirks q;
  for (const Known& k : kKnown) {
    if (cfg.architecture == k.architecture || (cfg.architecture.empty() && cfg.model_type == k.model_type)) {
      q.family = k.model_type;
      break;
    }
  }
  if (q.family.empty()) {
    std::string arch = cfg.architecture.empty() ? "model_type '" + cfg.model_type + "'"
                                                : "architecture '" + cfg.architecture + "'";
    return unsupported(source, ": ", arch,
                       " is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM "
                       "are)");
  }
  if (cfg.hidden_act != "silu")
    return unsupported(source, ": hidden_act '", cfg.hidden_act, "' is not supported (silu is)");
  // Qwen2 always carries q/k/v biases and never an o_proj bias; elsewhere
  // attention_bias covers all four projections.
  q.qkv_bias = q.family == "qwen2" || cfg.attention_bias;
  q.o_bias = (q.family != "qwen2" && cfg.attention_bias) || cfg.attention_out_bias;
  q.mlp_bias = cfg.mlp_bias;
  q.qk_norm = q.family == "qwen3" || cfg.qk_norm;
  q.tied_embeddings = cfg.tie_word_embeddings;
  // Qwen2's sliding window applies only with use_sliding_window, which its
  // released models leave off; Mistral applies it to every layer.
  q.sliding_window = q.family == "mistral" ? cfg.sliding_window : 0;
  return q;
}

Result<ModelHeader> model_header_from_config(ModelConfig cfg, const std::string& source) {
  ModelHeader h;
  h.cfg = std::move(cfg);
  LATHE_TRY(h.cfg.validate().with_context(source));
  LATHE_ASSIGN_OR_RETURN(h.quirks, family_quirks(h.cfg, source));
  const RopeScaling& rs = h.cfg.rope_scaling;
  RopeParams rope{.theta = h.cfg.rope_theta, .type = rs.type, .factor = rs.factor,
                  .low_freq_factor = rs.low_freq_factor, .high_freq_factor = rs.high_freq_factor,
                  .original_max_position_embeddings = rs.original_max_position_embeddings};
  auto inv_freq = rope_inv_freq(rope, h.cfg.head_dim);
  if (!inv_freq.is_ok()) return inv_freq.status().with_context(source);
  h.inv_freq = std::move(inv_freq).value();
  return h;
}

Result<ModelHeader> load_model_header(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(config_path));
  return model_header_from_config(std::move(cfg), config_path);
}

}  // namespace lathe
