// CausalLM against Hugging Face transformers on the tiny fixtures of
// tests/data/models (made by tools/make_model_fixtures.py): logits of every
// family, incremental decoding through the KV cache, greedy continuations,
// rotary frequencies, and errors for bad models and bad calls.
//
// Error measure: per sequence, max|lathe − hf| / max|hf| over all its logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/causal_lm.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

const char* kFamilies[] = {"llama", "mistral", "qwen2", "qwen3"};

std::string fixture(const std::string& family) { return std::string(LATHE_TEST_DATA) + "/models/" + family; }

struct Reference {
  Tensor input_ids;  // [batch, seq] i64
  Tensor logits;     // [batch, seq, vocab] f32
  Tensor inv_freq;   // [head_dim / 2] f32
};

Reference load_reference(const std::string& family) {
  auto f = SafetensorsFile::open(fixture(family) + "/reference.safetensors");
  LATHE_CHECK(f.is_ok(), f.status().message());
  return {*f->tensor("input_ids"), *f->tensor("logits"), *f->tensor("inv_freq")};
}

std::vector<int32_t> row_ids(const Reference& r, int64_t b, int64_t len = -1) {
  int64_t seq = r.input_ids.size(1);
  if (len < 0) len = seq;
  const int64_t* p = r.input_ids.data<int64_t>() + b * seq;
  return {p, p + len};
}

double rel_error(const float* got, const float* want, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    ref = std::max(ref, std::abs(double(want[i])));
  }
  return diff / ref;
}

std::unique_ptr<CausalLM> load(const std::string& dir, LoadOptions opts = {}) {
  auto m = CausalLM::load(dir, opts);
  LATHE_CHECK(m.is_ok(), m.status().message());
  return std::move(m).value();
}

class Family : public ::testing::TestWithParam<const char*> {};

TEST_P(Family, LogitsMatchTransformers) {
  auto model = load(fixture(GetParam()));
  Reference ref = load_reference(GetParam());
  const int64_t batch = ref.input_ids.size(0), seq = ref.input_ids.size(1), vocab = model->config().vocab_size;
  ASSERT_EQ(ref.logits.size(2), vocab);
  for (int64_t b = 0; b < batch; ++b) {
    KvCache cache = model->new_cache(int(seq));
    Tensor logits = Tensor::empty(DType::F32, {seq, vocab});
    ASSERT_TRUE(model->forward(row_ids(ref, b), cache, logits, true).is_ok());
    EXPECT_LE(rel_error(logits.data<float>(), ref.logits.data<float>() + b * seq * vocab, seq * vocab), 1e-4)
        << "sequence " << b;
  }
}

TEST_P(Family, RotaryFrequenciesMatchTransformers) {
  auto model = load(fixture(GetParam()));
  Reference ref = load_reference(GetParam());
  const std::vector<float>& inv = model->rope_inv_freq();
  ASSERT_EQ(int64_t(inv.size()), ref.inv_freq.numel());
  for (size_t i = 0; i < inv.size(); ++i)  // equal, or one ulp where torch's pow is not correctly rounded
    EXPECT_LE(std::abs(inv[i] - ref.inv_freq.data<float>()[i]), std::abs(inv[i]) * 1.2e-7f) << "i=" << i;
}

TEST_P(Family, IncrementalDecodingMatchesFullPass) {
  auto model = load(fixture(GetParam()));
  Reference ref = load_reference(GetParam());
  const int64_t seq = ref.input_ids.size(1), vocab = model->config().vocab_size;
  std::vector<int32_t> ids = row_ids(ref, 0);
  KvCache full_cache = model->new_cache(int(seq));
  Tensor full = Tensor::empty(DType::F32, {seq, vocab});
  ASSERT_TRUE(model->forward(ids, full_cache, full, true).is_ok());

  // One token at a time, then in uneven chunks: every step's last logits equal the full pass's row.
  for (int64_t chunk : {1, 5}) {
    KvCache cache = model->new_cache(int(seq) + 4);
    Tensor step = Tensor::empty(DType::F32, {1, vocab});
    for (int64_t t = 0; t < seq; t += chunk) {
      int64_t len = std::min(chunk, seq - t);
      ASSERT_TRUE(model->forward({ids.data() + t, size_t(len)}, cache, step, false).is_ok());
      EXPECT_EQ(cache.n_tokens(), t + len);
      EXPECT_LE(rel_error(step.data<float>(), full.data<float>() + (t + len - 1) * vocab, vocab), 1e-5)
          << "chunk " << chunk << " at token " << t;
    }
  }
  // Truncating rewinds the sequence: re-running the tail gives the same logits.
  KvCache cache = model->new_cache(int(seq));
  Tensor out = Tensor::empty(DType::F32, {1, vocab});
  ASSERT_TRUE(model->forward(ids, cache, out, false).is_ok());
  cache.truncate(int(seq) - 3);
  ASSERT_TRUE(model->forward({ids.data() + seq - 3, 3}, cache, out, false).is_ok());
  EXPECT_LE(rel_error(out.data<float>(), full.data<float>() + (seq - 1) * vocab, vocab), 1e-5);
}

TEST_P(Family, GreedyContinuationMatchesTransformers) {
  auto model = load(fixture(GetParam()));
  std::ifstream f(fixture(GetParam()) + "/greedy.json");
  nlohmann::json j = nlohmann::json::parse(f);
  const int vocab = model->config().vocab_size;
  for (size_t b = 0; b < j["prompt"].size(); ++b) {
    std::vector<int32_t> prompt = j["prompt"][b].get<std::vector<int32_t>>();
    std::vector<int32_t> want = j["continuation"][b].get<std::vector<int32_t>>();
    KvCache cache = model->new_cache(int(prompt.size() + want.size()));
    Tensor logits = Tensor::empty(DType::F32, {1, vocab});
    std::vector<int32_t> got, next = prompt;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(model->forward(next, cache, logits, false).is_ok());
      const float* p = logits.data<float>();
      next = {int32_t(std::max_element(p, p + vocab) - p)};
      got.push_back(next[0]);
    }
    EXPECT_EQ(got, want) << "sequence " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Family, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) { return std::string(info.param); });

TEST(CausalLM, HalfWeightsWidenedAtLoadGiveTheSameLogits) {
  auto kept = load(fixture("qwen2"));
  auto widened = load(fixture("qwen2"), {.keep_half_weights = false});
  Reference ref = load_reference("qwen2");
  const int64_t seq = ref.input_ids.size(1), vocab = kept->config().vocab_size;
  Tensor a = Tensor::empty(DType::F32, {seq, vocab}), b = a.clone();
  KvCache ca = kept->new_cache(int(seq)), cb = widened->new_cache(int(seq));
  ASSERT_TRUE(kept->forward(row_ids(ref, 1), ca, a, true).is_ok());
  ASSERT_TRUE(widened->forward(row_ids(ref, 1), cb, b, true).is_ok());
  EXPECT_LE(rel_error(a.data<float>(), b.data<float>(), seq * vocab), 1e-6);
  EXPECT_EQ(kept->n_params(), widened->n_params());
}

TEST(CausalLM, ConcurrentPassesOnSeparateCachesAgree) {
  auto model = load(fixture("mistral"));
  Reference ref = load_reference("mistral");
  const int64_t seq = ref.input_ids.size(1), vocab = model->config().vocab_size;
  Tensor out[2] = {Tensor::empty(DType::F32, {seq, vocab}), Tensor::empty(DType::F32, {seq, vocab})};
  Status status[2];
  std::vector<std::thread> threads;
  for (int b = 0; b < 2; ++b)
    threads.emplace_back([&, b] {
      KvCache cache = model->new_cache(int(seq));
      std::vector<int32_t> ids = row_ids(ref, b);
      for (int64_t t = 0; t < seq && status[b].is_ok(); ++t)  // token by token: many small passes interleave
        status[b] = model->forward({ids.data() + t, 1}, cache, out[b].view().slice_rows(t, t + 1), false);
    });
  for (std::thread& t : threads) t.join();
  for (int b = 0; b < 2; ++b) {
    ASSERT_TRUE(status[b].is_ok()) << status[b].message();
    EXPECT_LE(rel_error(out[b].data<float>(), ref.logits.data<float>() + b * seq * vocab, seq * vocab), 1e-4);
  }
}

TEST(CausalLM, TiedEmbeddingsCountOnce) {
  auto model = load(fixture("llama"));
  const ModelConfig& c = model->config();
  int64_t per_layer = 2 * int64_t(c.hidden_size) * c.num_attention_heads * c.head_dim +
                      2 * int64_t(c.hidden_size) * c.num_key_value_heads * c.head_dim +
                      3 * int64_t(c.hidden_size) * c.intermediate_size + 2 * c.hidden_size;
  EXPECT_EQ(model->n_params(), int64_t(c.vocab_size) * c.hidden_size + c.num_hidden_layers * per_layer + c.hidden_size);
}

TEST(CausalLM, DecodeStepsDoNotAllocate) {
  auto model = load(fixture("qwen3"));
  Reference ref = load_reference("qwen3");
  const int vocab = model->config().vocab_size;
  KvCache cache = model->new_cache(64);
  Tensor logits = Tensor::empty(DType::F32, {1, vocab});
  ASSERT_TRUE(model->forward(row_ids(ref, 0), cache, logits, false).is_ok());
  std::vector<int32_t> token = {5};
  ASSERT_TRUE(model->forward(token, cache, logits, false).is_ok());
  const int64_t bytes = cache.scratch_bytes();
  EXPECT_GT(bytes, 0);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(model->forward(token, cache, logits, false).is_ok());
    EXPECT_EQ(cache.scratch_bytes(), bytes) << "step " << i;
  }
}

TEST(CausalLM, RejectsBadCalls) {
  auto model = load(fixture("llama"));
  const int vocab = model->config().vocab_size;
  KvCache cache = model->new_cache(4);
  Tensor logits = Tensor::empty(DType::F32, {1, vocab});
  std::vector<int32_t> five = {3, 4, 5, 6, 7};
  Status s = model->forward(five, cache, logits, false);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("overflow the KV cache of 4 tokens"), std::string::npos) << s.message();
  std::vector<int32_t> bad = {3, vocab};
  s = model->forward(bad, cache, logits, false);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("token id " + std::to_string(vocab)), std::string::npos) << s.message();
  EXPECT_EQ(cache.n_tokens(), 0);  // a failed call leaves the sequence as it was
  Tensor wrong = Tensor::empty(DType::F32, {2, vocab});
  s = model->forward(std::vector<int32_t>{3}, cache, wrong, false);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("logits"), std::string::npos) << s.message();
}

// A copy of a fixture in a temporary directory, for breaking.
class BrokenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("lathe_broken_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(fs::path(fixture("qwen3")) / f, dir_ / f);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Rewrites model.safetensors through edit(name, tensor) → keep?
  template <class Edit>
  void rewrite(Edit edit) {
    auto f = SafetensorsFile::open((fs::path(fixture("qwen3")) / "model.safetensors").string());
    ASSERT_TRUE(f.is_ok());
    std::vector<std::pair<std::string, Tensor>> out;
    for (const SafetensorsEntry& e : f->entries()) {
      Tensor t = f->tensor(e.name)->clone();
      if (edit(e.name, t)) out.emplace_back(e.name, t);
    }
    ASSERT_TRUE(write_safetensors((dir_ / "model.safetensors").string(), out).is_ok());
  }
  std::string load_error() {
    auto m = CausalLM::load(dir_.string());
    return m.is_ok() ? std::string("loaded") : m.status().message();
  }
  fs::path dir_;
};

TEST_F(BrokenModel, MissingTensorNamesFileAndTensor) {
  rewrite([](const std::string& name, Tensor&) { return name != "model.layers.1.self_attn.k_norm.weight"; });
  std::string msg = load_error();
  EXPECT_NE(msg.find("model.layers.1.self_attn.k_norm.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir_.string()), std::string::npos) << msg;
}

TEST_F(BrokenModel, MisShapedTensorNamesFileAndTensor) {
  rewrite([](const std::string& name, Tensor& t) {
    if (name == "model.layers.0.mlp.up_proj.weight") t = t.reshape({t.size(1), t.size(0)});
    return true;
  });
  std::string msg = load_error();
  EXPECT_NE(msg.find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, 128]"), std::string::npos) << msg;
}

TEST_F(BrokenModel, UnsupportedArchitectureNamesConfig) {
  std::ifstream in(dir_ / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["architectures"] = {"GPT2LMHeadModel"};
  cfg["model_type"] = "gpt2";
  std::ofstream(dir_ / "config.json") << cfg.dump();
  std::string msg = load_error();
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("GPT2LMHeadModel"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lathe
