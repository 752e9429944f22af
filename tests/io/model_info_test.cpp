// inspect_model_dir: counts come from the safetensors headers lathe wrote,
// the config from config.json, and missing pieces are reported, not fatal;
// a missing directory or config.json is an error naming the path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "io/model_info.h"
#include "io/safetensors.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("lathe_info_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

ModelConfig tiny_config() {
  ModelConfig c;
  c.model_type = "llama";
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.tie_word_embeddings = true;
  c.eos_token_ids = {2, 3};
  return c;
}

TEST(ModelInfo, SummarizesConfigWeightsAndTokenizerFiles) {
  std::string dir = fresh_dir("full");
  std::ofstream(dir + "/config.json") << model_config_to_json(tiny_config());
  std::vector<std::pair<std::string, Tensor>> t = {
      {"model.embed_tokens.weight", Tensor::zeros(DType::BF16, {10, 8})},
      {"model.layers.0.self_attn.q_proj.weight", Tensor::zeros(DType::BF16, {8, 8})},
      {"model.layers.0.input_layernorm.weight", Tensor::zeros(DType::F32, {8})},
      {"model.norm.weight", Tensor::zeros(DType::F32, {8})},
  };
  ASSERT_TRUE(write_weights(dir, t, 100).is_ok());  // 160 + 128 + 32 + 32 bytes: sharded
  std::ofstream(dir + "/tokenizer.json") << "{}";
  std::ofstream(dir + "/tokenizer_config.json") << R"({"chat_template": "{{ messages }}"})";
  auto info = inspect_model_dir(dir);
  ASSERT_TRUE(info.is_ok()) << info.status().message();
  EXPECT_EQ(info->config.num_key_value_heads, 1);
  EXPECT_TRUE(info->has_weights);
  EXPECT_EQ(info->n_files, 3);
  EXPECT_EQ(info->n_tensors, 4);
  EXPECT_EQ(info->n_params, 80 + 64 + 8 + 8);
  EXPECT_EQ(info->total_bytes, 352u);
  EXPECT_EQ(info->tensors_by_dtype.at("bf16"), 2);
  EXPECT_EQ(info->tensors_by_dtype.at("f32"), 2);
  EXPECT_EQ(info->bytes_by_dtype.at("bf16"), 288u);
  EXPECT_TRUE(info->has_tokenizer_json);
  EXPECT_EQ(info->chat_template_source, "tokenizer_config.json");
  EXPECT_FALSE(info->has_generation_config);

  std::ofstream(dir + "/chat_template.jinja") << "{{ messages }}";  // transformers 5 layout
  EXPECT_EQ(inspect_model_dir(dir)->chat_template_source, "chat_template.jinja");
}

TEST(ModelInfo, ConfigOnlyDirectoryHasNoWeightsAndNoTokenizer) {
  std::string dir = fresh_dir("bare");
  std::ofstream(dir + "/config.json") << model_config_to_json(tiny_config());
  auto info = inspect_model_dir(dir);
  ASSERT_TRUE(info.is_ok()) << info.status().message();
  EXPECT_FALSE(info->has_weights);
  EXPECT_EQ(info->n_params, 0);
  EXPECT_FALSE(info->has_tokenizer_json);
  EXPECT_EQ(info->chat_template_source, "");
}

TEST(ModelInfo, ErrorsNameTheMissingOrBrokenPath) {
  std::string dir = fresh_dir("errors");
  auto none = inspect_model_dir(dir + "/absent");
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find(dir + "/absent"), std::string::npos);
  auto no_cfg = inspect_model_dir(dir);
  ASSERT_FALSE(no_cfg.is_ok());
  EXPECT_NE(no_cfg.status().message().find(dir + "/config.json"), std::string::npos);
  std::ofstream(dir + "/config.json") << model_config_to_json(tiny_config());
  std::ofstream(dir + "/model.safetensors") << "garbage!garbage!";
  auto bad = inspect_model_dir(dir);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(dir + "/model.safetensors"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace lathe
