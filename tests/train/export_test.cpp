// Export: the merge against a naive W + scale·B·A in double precision, the
// state_dict order and dtype of the merged weights, PEFT's key names and
// shapes (checked against a PEFT-made adapter), the shard index at a lowered
// threshold, a PEFT adapter exported as `hf` reproducing PEFT's own logits,
// and the errors for bad sources.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/random_init.h"
#include "train/export.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

const std::string kModels = LATHE_TEST_DATA "/models/";
const std::string kAdapters = LATHE_TEST_DATA "/adapters/";
const char* kLeaves[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

std::string temp_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "lathe_export_" + name;
  fs::remove_all(d);
  return d;
}

Tensor random_f32(Shape shape, std::mt19937& rng, float sd) {
  Tensor t = Tensor::empty(DType::F32, shape);
  std::normal_distribution<float> dist(0.0f, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Random LoRA factors (r 4) for every projection of every layer of model.
ExportSource lora_source(const std::string& model, bool rslora = false) {
  ExportSource src;
  src.base_model_dir = kModels + model;
  src.lora = {.r = 4, .alpha = 8.0f, .rslora = rslora,
              .target_modules = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}};
  WeightStore base = WeightStore::open_dir(src.base_model_dir).value();
  const ModelConfig cfg = load_model_config(src.base_model_dir).value();
  std::mt19937 rng(7);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    for (const char* leaf : kLeaves) {
      const std::string module = "model.layers." + std::to_string(i) + "." + lora_module_path(leaf);
      const Shape w = base.entry(module + ".weight")->shape;
      src.tensors.emplace_back("base_model.model." + module + ".lora_A.weight", random_f32({4, w[1]}, rng, 0.3f));
      src.tensors.emplace_back("base_model.model." + module + ".lora_B.weight", random_f32({w[0], 4}, rng, 0.3f));
    }
  }
  return src;
}

const Tensor* find(const std::vector<std::pair<std::string, Tensor>>& v, const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return &t;
  return nullptr;
}

double bf16_ulp(double x) { return std::ldexp(1.0, std::ilogb(x == 0 ? 1e-30 : x) - 7); }

// Every adapted weight equals base + scale·B·A computed naively in double;
// the rest are the base's, bit for bit.
void check_merge(const std::string& model, bool rslora, DType dtype) {
  SCOPED_TRACE(model);
  ExportSource src = lora_source(model, rslora);
  auto merged = merged_weights(src, dtype);
  ASSERT_TRUE(merged.is_ok()) << merged.status().message();
  WeightStore base = WeightStore::open_dir(src.base_model_dir).value();
  ASSERT_EQ(merged->size(), base.names().size());
  const double scale = rslora ? 8.0 / 2.0 : 8.0 / 4.0;
  int n_merged = 0;
  for (const auto& [name, t] : *merged) {
    ASSERT_EQ(t.dtype(), dtype) << name;
    const Tensor w = base.get(name).value().to_f32();
    const Tensor got = t.to_f32();
    const Tensor* a = find(src.tensors, "base_model.model." + name.substr(0, name.size() - 7) + ".lora_A.weight");
    if (a == nullptr) {
      const Tensor want = w.to(dtype).to_f32();
      for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << name;
      continue;
    }
    const Tensor* b = find(src.tensors, "base_model.model." + name.substr(0, name.size() - 7) + ".lora_B.weight");
    const int64_t out = w.size(0), in = w.size(1);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        double want = w.data<float>()[o * in + i];
        for (int64_t k = 0; k < 4; ++k)
          want += scale * double(b->data<float>()[o * 4 + k]) * double(a->data<float>()[k * in + i]);
        const double g = got.data<float>()[o * in + i];
        // f32: the merge's own rounding; bf16: one rounding of the f32 sum.
        const double tol = dtype == DType::F32 ? 1e-5 * (1 + std::fabs(want)) : bf16_ulp(want);
        ASSERT_LE(std::fabs(g - want), tol) << name << " [" << o << ", " << i << "]";
      }
    }
    ++n_merged;
  }
  EXPECT_EQ(n_merged, 2 * 7);
}

TEST(Export, MergeMatchesNaiveDoubleReference) {
  check_merge("llama", false, DType::F32);
  check_merge("qwen3", true, DType::F32);
  check_merge("qwen2", false, DType::BF16);  // bf16 base, q/k/v biases pass through
}

TEST(Export, MergedWeightsFollowSavePretrainedOrderAndBaseDtype) {
  for (const std::string model : {"llama", "qwen2", "qwen3"}) {
    ExportSource src = lora_source(model);
    const DType dtype = base_model_dtype(src.base_model_dir).value();
    EXPECT_EQ(dtype, model == "qwen2" ? DType::BF16 : DType::F32) << model;
    auto merged = merged_weights(src, dtype);
    ASSERT_TRUE(merged.is_ok()) << merged.status().message();
    const auto specs = llama_tensor_specs(load_model_config(src.base_model_dir).value());
    ASSERT_EQ(merged->size(), specs.size()) << model;
    for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ((*merged)[i].first, specs[i].name) << model << " #" << i;
  }
}

TEST(Export, HfWritesShardsIndexConfigAndTokenizer) {
  ExportSource src = lora_source("qwen2");
  src.tokenizer_files = {{"tokenizer.json", "{\"version\": \"1.0\"}"}, {"tokenizer_config.json", "{}"}};
  const std::string out = temp_dir("hf_sharded");
  ASSERT_TRUE(export_hf(src, out, {.max_shard_bytes = 100'000}).is_ok());
  std::ifstream in(out + "/model.safetensors.index.json");
  ASSERT_TRUE(in);
  nlohmann::json index = nlohmann::json::parse(in);
  const auto merged = merged_weights(src, DType::BF16).value();
  ASSERT_EQ(index["weight_map"].size(), merged.size());
  int64_t total = 0;
  for (const auto& [name, t] : merged) total += t.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 3u);  // 266 kB of weights in 100 kB shards
  for (const std::string& f : shards) {
    EXPECT_EQ(f.rfind("model-0000", 0), 0u) << f;
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  }
  WeightStore back = WeightStore::open_dir(out).value();
  for (const auto& [name, t] : merged) {
    Tensor b = back.get(name).value();
    ASSERT_EQ(b.dtype(), DType::BF16) << name;
    ASSERT_EQ(std::memcmp(b.raw(), t.raw(), size_t(t.nbytes())), 0) << name;
  }
  const ModelConfig cfg = load_model_config(out).value();
  EXPECT_EQ(cfg.torch_dtype, "bfloat16");
  EXPECT_EQ(cfg.model_type, "qwen2");
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  std::ifstream tok(out + "/tokenizer.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(tok), {}), "{\"version\": \"1.0\"}");
  // Written again as f32 under the threshold: one file, the stale shards gone.
  ASSERT_TRUE(export_hf(src, out, {.dtype = DType::F32}).is_ok());
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  for (const std::string& f : shards) EXPECT_FALSE(fs::exists(out + "/" + f)) << f;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_EQ(load_model_config(out).value().torch_dtype, "float32");
  fs::remove_all(out);
}

// A PEFT-made adapter, exported merged, gives PEFT's own logits.
TEST(Export, PeftAdapterExportedAsHfReproducesPeftLogits) {
  for (const std::string name : {"llama-lora", "llama-rslora"}) {
    SCOPED_TRACE(name);
    PeftAdapter ad = load_peft_adapter(kAdapters + name).value();
    ExportSource src;
    src.base_model_dir = kModels + "llama";
    src.lora = {.r = ad.config.r, .alpha = ad.config.lora_alpha, .rslora = ad.config.use_rslora, .target_modules = {}};
    std::set<std::string> leaves;
    for (const auto& [module, pair] : ad.modules) {
      leaves.insert(module.substr(module.rfind('.') + 1));
      src.tensors.emplace_back("base_model.model." + module + ".lora_A.weight", pair.a);
      src.tensors.emplace_back("base_model.model." + module + ".lora_B.weight", pair.b);
    }
    src.lora.target_modules.assign(leaves.begin(), leaves.end());
    const std::string out = temp_dir("hf_" + name);
    Status st = export_hf(src, out, {});
    ASSERT_TRUE(st.is_ok()) << st.message();
    auto model = CausalLM::load(out);
    ASSERT_TRUE(model.is_ok()) << model.status().message();
    SafetensorsFile ref = SafetensorsFile::open(kAdapters + name + "/reference.safetensors").value();
    Tensor ids64 = ref.tensor("input_ids").value(), want = ref.tensor("logits").value();
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < ids64.numel(); ++i) ids.push_back(int32_t(ids64.data<int64_t>()[i]));
    const int64_t vocab = (*model)->config().vocab_size;
    Tensor logits = Tensor::empty(DType::F32, {int64_t(ids.size()), vocab});
    KvCache cache = (*model)->new_cache(int(ids.size()));
    ASSERT_TRUE((*model)->forward(ids, cache, logits, true).is_ok());
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < logits.numel(); ++i) {
      max_err = std::max(max_err, double(std::fabs(logits.data<float>()[i] - want.data<float>()[i])));
      max_ref = std::max(max_ref, double(std::fabs(want.data<float>()[i])));
    }
    EXPECT_LE(max_err / max_ref, 1e-4);
    fs::remove_all(out);
  }
}

// hf-peft writes PEFT's keys and shapes: a PEFT-made adapter re-exported has
// the same tensor names, shapes and values, and its config reads back.
TEST(Export, HfPeftKeepsPeftKeyNamesAndShapes) {
  PeftAdapter ad = load_peft_adapter(kAdapters + "llama-lora").value();
  SafetensorsFile peft = SafetensorsFile::open(ad.weights_path).value();
  ExportSource src;
  src.base_model_dir = kModels + "llama";
  src.lora = {.r = ad.config.r, .alpha = ad.config.lora_alpha, .target_modules = ad.config.target_names};
  for (const SafetensorsEntry& e : peft.entries()) src.tensors.emplace_back(e.name, peft.tensor(e.name).value());
  const std::string out = temp_dir("peft");
  Status st = export_hf_peft(src, out);
  ASSERT_TRUE(st.is_ok()) << st.message();
  SafetensorsFile mine = SafetensorsFile::open(out + "/adapter_model.safetensors").value();
  ASSERT_EQ(mine.entries().size(), peft.entries().size());
  for (const SafetensorsEntry& e : peft.entries()) {
    const SafetensorsEntry* m = mine.find(e.name);
    ASSERT_NE(m, nullptr) << e.name;
    EXPECT_TRUE(m->shape == e.shape) << e.name;
    Tensor a = peft.tensor(e.name).value().to_f32(), b = mine.tensor(e.name).value();
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())), 0) << e.name;
  }
  EXPECT_NE(mine.find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"), nullptr);
  PeftAdapter back = load_peft_adapter(out).value();
  EXPECT_EQ(back.config.r, ad.config.r);
  EXPECT_EQ(back.config.lora_alpha, ad.config.lora_alpha);
  EXPECT_EQ(back.config.base_model_name_or_path, kModels + "llama");
  EXPECT_EQ(back.modules.size(), ad.modules.size());
  fs::remove_all(out);
}

TEST(Export, FullSftWeightsAreWrittenInTheBaseDtype) {
  ExportSource src;
  src.base_model_dir = kModels + "qwen2";
  src.full_sft = true;
  std::mt19937 rng(3);
  src.tensors.emplace_back("model.norm.weight", random_f32({64}, rng, 1.0f));
  auto merged = merged_weights(src, DType::BF16);
  ASSERT_TRUE(merged.is_ok()) << merged.status().message();
  const Tensor* norm = find(*merged, "model.norm.weight");
  ASSERT_NE(norm, nullptr);
  const Tensor want = src.tensors[0].second.to(DType::BF16);
  EXPECT_EQ(std::memcmp(norm->raw(), want.raw(), size_t(want.nbytes())), 0);
  EXPECT_FALSE(export_hf_peft(src, temp_dir("full_peft")).is_ok());
  src.tensors.emplace_back("model.layers.9.mlp.up_proj.weight", random_f32({4, 4}, rng, 1.0f));
  auto bad = merged_weights(src, DType::BF16);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("model.layers.9.mlp.up_proj.weight"), std::string::npos);
}

TEST(Export, BadSourcesAreErrorsNamingTheTensor) {
  auto message = [](const ExportSource& src) {
    auto r = merged_weights(src, DType::F32);
    return r.is_ok() ? std::string("ok") : r.status().message();
  };
  ExportSource wrong_shape = lora_source("llama");
  wrong_shape.tensors[0].second = Tensor::zeros(DType::F32, {4, 3});
  EXPECT_NE(message(wrong_shape).find(wrong_shape.tensors[0].first), std::string::npos) << message(wrong_shape);
  ExportSource no_b = lora_source("llama");
  no_b.tensors.pop_back();  // the last module's lora_B
  EXPECT_NE(message(no_b).find("mlp.down_proj' has lora_A but no lora_B"), std::string::npos) << message(no_b);
  ExportSource untargeted = lora_source("llama");
  untargeted.tensors.erase(untargeted.tensors.begin(), untargeted.tensors.begin() + 2);  // layer 0 q_proj
  EXPECT_NE(message(untargeted).find("model.layers.0.self_attn.q_proj"), std::string::npos) << message(untargeted);
  ExportSource stranger = lora_source("llama");
  stranger.tensors.emplace_back("base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight",
                                Tensor::zeros(DType::F32, {4, 64}));
  EXPECT_NE(message(stranger).find("layers.7.self_attn.q_proj"), std::string::npos) << message(stranger);
  ExportSource not_lora = lora_source("llama");
  not_lora.tensors.emplace_back("model.norm.weight", Tensor::zeros(DType::F32, {64}));
  EXPECT_NE(message(not_lora).find("'model.norm.weight' is not a LoRA factor"), std::string::npos);
  ExportSource into_base = lora_source("llama");
  Status st = export_hf(into_base, kModels + "llama");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("base model's directory"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace lathe
