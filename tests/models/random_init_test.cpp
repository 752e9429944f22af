// Random-init checkpoints: the tensor list of each family, the statistics
// and determinism of the values, and sharding read back through WeightStore.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "io/safetensors.h"
#include "models/random_init.h"

namespace lathe {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.model_type = "llama";
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  return c;
}

std::set<std::string> names_of(const std::vector<TensorSpec>& specs) {
  std::set<std::string> s;
  for (const auto& t : specs) s.insert(t.name);
  return s;
}

TEST(RandomInit, LlamaTensorListHasHfNamesAndShapes) {
  ModelConfig c = small_config();
  auto specs = llama_tensor_specs(c);
  EXPECT_EQ(specs.size(), 1 + 2 * 9 + 1 + 1u);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  for (const auto& s : specs) {
    if (s.name == "model.layers.1.self_attn.k_proj.weight") EXPECT_EQ(s.shape, (Shape{16, 32}));
    if (s.name == "model.layers.0.mlp.down_proj.weight") EXPECT_EQ(s.shape, (Shape{32, 64}));
    if (s.name.find("norm") != std::string::npos) EXPECT_EQ(s.init, InitKind::kOnes);
  }
  c.tie_word_embeddings = true;
  EXPECT_EQ(names_of(llama_tensor_specs(c)).count("lm_head.weight"), 0u);
}

TEST(RandomInit, FamilyQuirksAddTheirTensors) {
  ModelConfig c = small_config();
  c.model_type = "qwen2";
  auto qwen2 = names_of(llama_tensor_specs(c));
  EXPECT_EQ(qwen2.count("model.layers.0.self_attn.q_proj.bias"), 1u);
  EXPECT_EQ(qwen2.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  c.model_type = "qwen3";
  c.qk_norm = true;
  auto qwen3 = names_of(llama_tensor_specs(c));
  EXPECT_EQ(qwen3.count("model.layers.1.self_attn.k_norm.weight"), 1u);
  EXPECT_EQ(qwen3.count("model.layers.0.self_attn.q_proj.bias"), 0u);
}

TEST(RandomInit, NormalValuesHaveTheInitStatisticsAndRepeatPerSeed) {
  TensorSpec spec{"w", Shape{400, 500}, InitKind::kNormal};
  Tensor a = random_tensor(spec, {.seed = 1});
  const float* x = a.data<float>();
  const int64_t n = a.numel();
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i], sq += static_cast<double>(x[i]) * x[i];
  double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(sd, 0.02, 5 * 0.02 / std::sqrt(2.0 * n));
  Tensor b = random_tensor(spec, {.seed = 1});
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.nbytes())), 0);
  Tensor c = random_tensor(spec, {.seed = 2});
  EXPECT_NE(std::memcmp(a.raw(), c.raw(), static_cast<size_t>(a.nbytes())), 0);
  Tensor other = random_tensor({"v", Shape{400, 500}, InitKind::kNormal}, {.seed = 1});
  EXPECT_NE(std::memcmp(a.raw(), other.raw(), static_cast<size_t>(a.nbytes())), 0);
  Tensor half = random_tensor(spec, {.seed = 1, .dtype = DType::BF16});
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(half.data<uint16_t>()[i], f32_to_bf16(x[i]));
  Tensor ones = random_tensor({"n", Shape{7}, InitKind::kOnes}, {.dtype = DType::BF16});
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(bf16_to_f32(ones.data<uint16_t>()[i]), 1.0f);
}

TEST(RandomInit, ShardsAndIndexReadBackThroughWeightStore) {
  auto dir = std::filesystem::temp_directory_path() / ("lathe_random_init_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ModelConfig c = small_config();
  RandomInitOptions opts{.seed = 9, .max_shard_bytes = 40000};
  ASSERT_TRUE(write_random_weights(dir.string(), c, opts).is_ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00001-of-00003.safetensors"));
  auto store = WeightStore::open_dir(dir.string());
  ASSERT_TRUE(store.is_ok()) << store.status().message();
  for (const TensorSpec& s : llama_tensor_specs(c)) {
    auto t = store->get(s.name, s.shape);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    Tensor want = random_tensor(s, opts);
    EXPECT_EQ(std::memcmp(t->raw(), want.raw(), static_cast<size_t>(want.nbytes())), 0) << s.name;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lathe
