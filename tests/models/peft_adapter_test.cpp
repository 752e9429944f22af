// PEFT LoRA adapters merged at load against peft itself: the fixtures of
// tests/data/adapters (tools/make_peft_fixtures.py) hold the logits of the
// unmerged PEFT model; lathe's merged model must give the same. Also the
// config reader (scale, target matching) and the errors for adapters lathe
// cannot apply, each of which must name the file and the field or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

const std::string kModel = std::string(LATHE_TEST_DATA) + "/models/llama";
std::string adapter(const std::string& name) { return std::string(LATHE_TEST_DATA) + "/adapters/" + name; }

// max|got − want| / max|want|.
double rel_error(const float* got, const float* want, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    ref = std::max(ref, std::abs(double(want[i])));
  }
  return diff / ref;
}

struct Logits {
  Tensor want;  // [seq, vocab] from peft
  Tensor got;   // [seq, vocab] from lathe
};

Logits run(const std::string& adapter_dir, const std::string& reference_dir, LoadOptions opts = {}) {
  auto ref = SafetensorsFile::open(reference_dir + "/reference.safetensors");
  LATHE_CHECK(ref.is_ok(), ref.status().message());
  Tensor ids = *ref->tensor("input_ids"), want = *ref->tensor("logits");
  opts.adapter_dir = adapter_dir;
  auto m = CausalLM::load(kModel, opts);
  LATHE_CHECK(m.is_ok(), m.status().message());
  const int64_t seq = ids.size(1);
  std::vector<int32_t> tokens(ids.data<int64_t>(), ids.data<int64_t>() + seq);
  KvCache cache = (*m)->new_cache(int(seq));
  Tensor got = Tensor::empty(DType::F32, {seq, (*m)->config().vocab_size});
  Status s = (*m)->forward(tokens, cache, got, true);
  LATHE_CHECK(s.is_ok(), s.message());
  return {want, got};
}

TEST(PeftAdapter, MergedLogitsMatchPeft) {
  for (const char* name : {"llama-lora", "llama-rslora"}) {
    for (bool keep_half : {true, false}) {
      Logits l = run(adapter(name), adapter(name), {.keep_half_weights = keep_half});
      EXPECT_LE(rel_error(l.got.data<float>(), l.want.data<float>(), l.want.numel()), 1e-4) << name;
    }
  }
}

TEST(PeftAdapter, AdapterChangesTheLogits) {
  // Without the adapter the base model is far from peft's logits: the
  // fixture's B is non-zero, so the comparison above tests the merge.
  for (const char* name : {"llama-lora", "llama-rslora"}) {
    Logits l = run("", adapter(name));
    EXPECT_GT(rel_error(l.got.data<float>(), l.want.data<float>(), l.want.numel()), 1e-2) << name;
  }
}

TEST(PeftAdapter, ReadsConfigAndPairs) {
  auto ad = load_peft_adapter(adapter("llama-rslora"));
  ASSERT_TRUE(ad.is_ok()) << ad.status().message();
  EXPECT_EQ(ad->config.r, 8);
  EXPECT_TRUE(ad->config.use_rslora);
  EXPECT_FLOAT_EQ(ad->config.scale(), 16.0f / std::sqrt(8.0f));
  EXPECT_EQ(ad->modules.size(), 2u * 3u);  // 2 layers x q, v, down
  const LoraPair& p = ad->modules.at("model.layers.1.mlp.down_proj");
  EXPECT_EQ(p.a.shape(), (Shape{8, 128}));
  EXPECT_EQ(p.b.shape(), (Shape{64, 8}));
  auto plain = load_peft_adapter(adapter("llama-lora"));
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  EXPECT_FLOAT_EQ(plain->config.scale(), 8.0f / 4.0f);
  EXPECT_EQ(plain->modules.size(), 2u * 7u);
}

TEST(PeftAdapter, TargetMatching) {
  auto list = parse_peft_adapter_config(R"({"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "mlp.up_proj"]})", "t");
  ASSERT_TRUE(list.is_ok()) << list.status().message();
  EXPECT_TRUE(list->targets("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(list->targets("model.layers.3.mlp.up_proj"));
  EXPECT_FALSE(list->targets("model.layers.0.self_attn.xq_proj"));
  EXPECT_FALSE(list->targets("model.layers.0.self_attn.k_proj"));
  auto re = parse_peft_adapter_config(R"({"r": 2, "lora_alpha": 4, "target_modules": ".*layers\\.1\\..*_proj"})", "t");
  ASSERT_TRUE(re.is_ok()) << re.status().message();
  EXPECT_TRUE(re->targets("model.layers.1.self_attn.o_proj"));
  EXPECT_FALSE(re->targets("model.layers.0.self_attn.o_proj"));
  auto all = parse_peft_adapter_config(R"({"r": 2, "lora_alpha": 4, "target_modules": "all-linear"})", "t");
  ASSERT_TRUE(all.is_ok());
  EXPECT_TRUE(all->targets("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(all->targets("lm_head"));
}

TEST(PeftAdapter, RefusesWhatItCannotApply) {
  const char* cases[][2] = {
      {R"("use_dora": true)", "use_dora"},
      {R"("fan_in_fan_out": true)", "fan_in_fan_out"},
      {R"("bias": "all")", "bias"},
      {R"("modules_to_save": ["lm_head"])", "modules_to_save"},
      {R"("rank_pattern": {"q_proj": 2})", "rank_pattern"},
      {R"("alpha_pattern": {"q_proj": 2})", "alpha_pattern"},
      {R"("layers_to_transform": [0])", "layers_to_transform"},
      {R"("peft_type": "IA3")", "peft_type"},
      {R"("r": 0)", "\"r\""},
      {R"("target_modules": "(")", "target_modules"},
  };
  for (const auto& c : cases) {
    std::string text = std::string(R"({"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], )") + c[0] + "}";
    // A later duplicate key wins in nlohmann::json, as in Python's json.
    auto cfg = parse_peft_adapter_config(text, "dir/adapter_config.json");
    ASSERT_FALSE(cfg.is_ok()) << c[0];
    EXPECT_NE(cfg.status().message().find("dir/adapter_config.json"), std::string::npos) << cfg.status().message();
    EXPECT_NE(cfg.status().message().find(c[1]), std::string::npos) << cfg.status().message();
  }
}

// A scratch adapter directory: the llama-lora config with edits, and tensors.
class BadAdapter : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lathe_peft_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const nlohmann::json& config, const std::vector<std::pair<std::string, Tensor>>& tensors) {
    std::ofstream(dir_ / "adapter_config.json") << config.dump();
    Status s = write_safetensors((dir_ / "adapter_model.safetensors").string(), tensors);
    LATHE_CHECK(s.is_ok(), s.message());
  }
  std::string load_error() {
    auto m = CausalLM::load(kModel, {.adapter_dir = dir_.string()});
    return m.is_ok() ? "" : m.status().message();
  }
  static nlohmann::json config(nlohmann::json targets) {
    return {{"peft_type", "LORA"}, {"r", 2}, {"lora_alpha", 4}, {"target_modules", targets}};
  }
  static std::string key(const std::string& module, const char* ab) {
    return "base_model.model." + module + ".lora_" + ab + ".weight";
  }
  fs::path dir_;
};

TEST_F(BadAdapter, LayerTheModelLacks) {
  const std::string m = "model.layers.5.self_attn.q_proj";
  write(config({"q_proj"}), {{key(m, "A"), Tensor::zeros(DType::F32, {2, 64})}, {key(m, "B"), Tensor::zeros(DType::F32, {64, 2})}});
  std::string e = load_error();
  EXPECT_NE(e.find("adapter_model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find(key(m, "A")), std::string::npos) << e;
}

TEST_F(BadAdapter, ModuleTheModelLacks) {
  const std::string m = "model.layers.0.self_attn.qkv_proj";
  write(config({"qkv_proj"}), {{key(m, "A"), Tensor::zeros(DType::F32, {2, 64})}, {key(m, "B"), Tensor::zeros(DType::F32, {192, 2})}});
  std::string e = load_error();
  EXPECT_NE(e.find("not a linear layer"), std::string::npos) << e;
  EXPECT_NE(e.find("qkv_proj"), std::string::npos) << e;
}

TEST_F(BadAdapter, ShapeThatDoesNotFit) {
  std::vector<std::pair<std::string, Tensor>> t;
  for (int l = 0; l < 2; ++l) {
    const std::string m = "model.layers." + std::to_string(l) + ".self_attn.k_proj";
    t.push_back({key(m, "A"), Tensor::zeros(DType::F32, {2, 64})});
    t.push_back({key(m, "B"), Tensor::zeros(DType::F32, {l == 1 ? 64 : 32, 2})});  // k_proj out is 32
  }
  write(config({"k_proj"}), t);
  std::string e = load_error();
  EXPECT_NE(e.find(key("model.layers.1.self_attn.k_proj", "B")), std::string::npos) << e;
  EXPECT_NE(e.find("expected [32, 2]"), std::string::npos) << e;
}

TEST_F(BadAdapter, TargetedModuleWithoutTensors) {
  const std::string m = "model.layers.0.self_attn.q_proj";
  write(config({"q_proj"}), {{key(m, "A"), Tensor::zeros(DType::F32, {2, 64})}, {key(m, "B"), Tensor::zeros(DType::F32, {64, 2})}});
  std::string e = load_error();  // layer 1's q_proj is targeted too
  EXPECT_NE(e.find(key("model.layers.1.self_attn.q_proj", "A")), std::string::npos) << e;
}

TEST_F(BadAdapter, UnpairedOrMisnamedTensors) {
  const std::string m = "model.layers.0.self_attn.q_proj";
  write(config({"q_proj"}), {{key(m, "A"), Tensor::zeros(DType::F32, {2, 64})}});
  EXPECT_NE(load_error().find("no lora_B"), std::string::npos) << load_error();
  write(config({"q_proj"}), {{"base_model.model.model.embed_tokens.lora_embedding_A", Tensor::zeros(DType::F32, {2, 384})}});
  EXPECT_NE(load_error().find("lora_embedding_A"), std::string::npos) << load_error();
  write(config({"q_proj"}), {{key(m, "A"), Tensor::zeros(DType::F32, {3, 64})}, {key(m, "B"), Tensor::zeros(DType::F32, {64, 3})}});
  EXPECT_NE(load_error().find("r = 2"), std::string::npos) << load_error();
  write(config({"v_proj"}), {{key(m, "A"), Tensor::zeros(DType::F32, {2, 64})}, {key(m, "B"), Tensor::zeros(DType::F32, {64, 2})}});
  EXPECT_NE(load_error().find("target_modules"), std::string::npos) << load_error();
}

TEST_F(BadAdapter, MissingDirectory) {
  auto m = CausalLM::load(kModel, {.adapter_dir = (dir_ / "nope").string()});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("adapter_config.json"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace lathe
