// Random-init checkpoints. Normals come from Box-Muller over a splitmix64
// counter stream: element pair j of a tensor uses counters 2j and 2j+1 of a
// key hashed from (seed, name), so any thread can make any slice.
#include "models/random_init.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/parallel.h"
#include "io/safetensors.h"

namespace lathe {

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(seed * kGamma + h);
}

// Normals for elements [begin, end) of the stream keyed by key.
void fill_normal(uint64_t key, int64_t begin, int64_t end, float stddev, float* out) {
  constexpr double kTwoPi = 6.283185307179586476925;
  for (int64_t i = begin & ~int64_t{1}; i < end; i += 2) {
    uint64_t pair = static_cast<uint64_t>(i) / 2;
    uint64_t a = mix64(key + (2 * pair + 1) * kGamma);
    uint64_t b = mix64(key + (2 * pair + 2) * kGamma);
    double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log stays finite
    double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1)) * stddev;
    if (i >= begin) out[i - begin] = static_cast<float>(r * std::cos(kTwoPi * u2));
    if (i + 1 >= begin && i + 1 < end) out[i + 1 - begin] = static_cast<float>(r * std::sin(kTwoPi * u2));
  }
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& c) {
  const int64_t d = c.hidden_size, ff = c.intermediate_size, v = c.vocab_size;
  const int64_t hd = c.head_dim > 0 ? c.head_dim : d / c.num_attention_heads;
  const int64_t n_kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const int64_t q_out = c.num_attention_heads * hd, kv_out = n_kv * hd;
  const bool qkv_bias = c.attention_bias || c.model_type == "qwen2";
  const bool o_bias = c.attention_out_bias || (c.attention_bias && c.model_type == "llama");
  std::vector<TensorSpec> s;
  s.push_back({"model.embed_tokens.weight", Shape{v, d}, InitKind::kNormal});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
      s.push_back({p + name + ".weight", Shape{out, in}, InitKind::kNormal});
      if (bias) s.push_back({p + name + ".bias", Shape{out}, InitKind::kZeros});
    };
    linear("self_attn.q_proj", q_out, d, qkv_bias);
    linear("self_attn.k_proj", kv_out, d, qkv_bias);
    linear("self_attn.v_proj", kv_out, d, qkv_bias);
    linear("self_attn.o_proj", d, q_out, o_bias);
    if (c.qk_norm) {
      s.push_back({p + "self_attn.q_norm.weight", Shape{hd}, InitKind::kOnes});
      s.push_back({p + "self_attn.k_norm.weight", Shape{hd}, InitKind::kOnes});
    }
    linear("mlp.gate_proj", ff, d, c.mlp_bias);
    linear("mlp.up_proj", ff, d, c.mlp_bias);
    linear("mlp.down_proj", d, ff, c.mlp_bias);
    s.push_back({p + "input_layernorm.weight", Shape{d}, InitKind::kOnes});
    s.push_back({p + "post_attention_layernorm.weight", Shape{d}, InitKind::kOnes});
  }
  s.push_back({"model.norm.weight", Shape{d}, InitKind::kOnes});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", Shape{v, d}, InitKind::kNormal});
  return s;
}

Tensor random_tensor(const TensorSpec& spec, const RandomInitOptions& opts) {
  Tensor t = Tensor::empty(opts.dtype, spec.shape);
  const int64_t n = t.numel();
  const uint64_t key = tensor_key(opts.seed, spec.name);
  constexpr int64_t kChunk = 1 << 16;
  parallel_for(n, kChunk, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(end - begin));
    if (spec.init == InitKind::kNormal) {
      fill_normal(key, begin, end, opts.initializer_range, buf.data());
    } else {
      std::fill(buf.begin(), buf.end(), spec.init == InitKind::kOnes ? 1.0f : 0.0f);
    }
    char* dst = static_cast<char*>(t.raw()) + dtype_bytes(opts.dtype, begin);
    convert_from_f32(buf.data(), dst, opts.dtype, end - begin);
  });
  return t;
}

Status write_random_weights(const std::string& dir, const ModelConfig& cfg, const RandomInitOptions& opts) {
  if (opts.dtype != DType::F32 && opts.dtype != DType::BF16 && opts.dtype != DType::F16)
    return invalid_argument("init-model: dtype must be f32, bf16 or f16, got ", dtype_name(opts.dtype));
  std::vector<TensorSpec> specs = llama_tensor_specs(cfg);
  // Group into shards in order, as save_pretrained does.
  std::vector<std::vector<const TensorSpec*>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorSpec& s : specs) {
    uint64_t b = static_cast<uint64_t>(dtype_bytes(opts.dtype, s.shape.numel()));
    if (!shards.back().empty() && shard_bytes + b > opts.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&s);
    shard_bytes += b;
    total_bytes += b;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {kRandomInitMetadataKey, "seed=" + std::to_string(opts.seed)}};
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string file = shards.size() == 1 ? "model.safetensors" : shard_name(i, shards.size());
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const TensorSpec* s : shards[i]) {
      tensors.emplace_back(s->name, random_tensor(*s, opts));
      weight_map[s->name] = file;
    }
    LATHE_TRY(write_safetensors((std::filesystem::path(dir) / file).string(), tensors, metadata));
  }
  if (shards.size() == 1) return Status::ok();
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  std::string path = (std::filesystem::path(dir) / "model.safetensors.index.json").string();
  std::ofstream f(path);
  f << index.dump(2) << "\n";
  f.close();
  if (!f) return io_error("init-model: cannot write ", path);
  return Status::ok();
}

}  // namespace lathe
