// CudaCausalLM against the CPU CausalLM and the Hugging Face reference logits
// on the tiny fixtures (tests/data/models), and on random-init models with
// head_dim 64 and 128 (the flash kernels; the fixtures' head dims 16 and 32
// take the plain kernel). Batch decode:
// sequences of different lengths stepped together against each one alone.
// No tokenizer: prompts are ids.
//
// Tolerances (error = max|got − want| / max|want| over the logits): per
// case, the error of Hugging Face's own bf16 run (weights and compute in
// bf16, its default attention) against its f32 run of the same model and
// inputs, measured by tools/bf16_reference_error.py into
// tests/data/models/bf16_error.json. The GPU, which holds bf16 weights and
// keeps activations in bf16, must be at least as close to the f32 reference
// as transformers itself is; no factor on top. The cases:
// - fixture/<family>/row<b>: the HF f32 reference logits of the fixture.
// - greedy/<family>, random/<family><head_dim>: the CPU CausalLM holding the
//   same bf16 weights in f32, step by step; the largest error over the steps.
// - adapter/<name>: PEFT's f32 logits; HF merges the adapter, then casts.
// Greedy: near-ties (the fixtures' smallest top-2 gaps are 0.001–0.03) can
// flip under bf16 rounding, so the GPU's greedy tokens must equal the CPU's
// up to the first step whose CPU top-2 gap is below twice the logit
// tolerance, and, teacher-forced on the CPU's tokens, at every step whose gap
// is above it. Graph replay against eager decode: bitwise equal logits.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/device.h"
#include "core/check.h"
#include "core/scoped_env.h"
#include "cuda/gen_test_util.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/cuda_causal_lm.h"
#include "models/random_init.h"

namespace lathe {
namespace {

using namespace gen_test;

namespace fs = std::filesystem;

constexpr int kGreedyTokens = 32;

#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine"; \
  } while (0)

// The fixtures: $LATHE_TEST_DATA when set (a build carried to another
// machine, where the source tree sits elsewhere), else the configured path.
std::string test_data() {
  const char* env = std::getenv("LATHE_TEST_DATA");
  return env && *env ? env : LATHE_TEST_DATA;
}
std::string fixture(const std::string& family) { return test_data() + "/models/" + family; }

// One case of bf16_error.json (see the top of the file); a missing file or
// case fails the test and gives a null object.
nlohmann::json bf16_case(const std::string& name) {
  const std::string path = test_data() + "/models/bf16_error.json";
  try {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open the file");
    const nlohmann::json doc = nlohmann::json::parse(f);
    if (!doc.at("cases").contains(name)) throw std::runtime_error("no case " + name);
    return doc.at("cases").at(name);
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": " << e.what();
    return nullptr;
  }
}
// The tolerance of a case: Hugging Face's bf16 error on it (0 when missing,
// which fails every comparison).
double hf_bf16_error(const std::string& name) {
  const nlohmann::json c = bf16_case(name);
  if (!c.is_object() || !c.contains("error") || !c.at("error").is_number()) {
    ADD_FAILURE() << "bf16_error.json: case " << name << " has no numeric \"error\"";
    return 0;
  }
  return c.at("error").get<double>();
}

double rel_error(const float* got, const float* want, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    ref = std::max(ref, std::abs(double(want[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

// Best logit minus the second best.
float top2_gap(std::vector<float> x) {
  std::partial_sort(x.begin(), x.begin() + 2, x.end(), std::greater<float>());
  return x[0] - x[1];
}
float max_abs(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::abs(v));
  return m;
}

// src's config.json and its weights rounded to bf16, written to dst: what the
// GPU holds, for the CPU to run in f32.
void write_bf16_copy(const std::string& src, const std::string& dst) {
  fs::copy_file(src + "/config.json", dst + "/config.json");
  auto store = WeightStore::open_dir(src);
  LATHE_CHECK(store.is_ok(), store.status().message());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : store->names()) tensors.emplace_back(name, store->get(name)->to(DType::BF16));
  Status st = write_weights(dst, tensors);
  LATHE_CHECK(st.is_ok(), st.message());
}

std::unique_ptr<CausalLM> load_cpu(const std::string& dir, const LoadOptions& opts = {}) {
  auto m = CausalLM::load(dir, opts);
  LATHE_CHECK(m.is_ok(), m.status().message());
  return std::move(m).value();
}

// The CPU's greedy run: each step's input token and logits.
struct CpuRun {
  std::vector<int32_t> tokens;  // generated
  std::vector<std::vector<float>> logits;  // [step][vocab], step 0 after the prompt
};
CpuRun cpu_greedy(const CausalLM& m, const std::vector<int32_t>& prompt, int n) {
  const int vocab = m.config().vocab_size;
  KvCache cache = m.new_cache(static_cast<int>(prompt.size()) + n);
  CpuRun r;
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> input = prompt;
  for (int i = 0; i < n; ++i) {
    TensorView out{logits.data(), DType::F32, {1, vocab}, Device::cpu()};
    Status st = m.forward(input, cache, out, false);
    LATHE_CHECK(st.is_ok(), st.message());
    r.logits.push_back(logits);
    r.tokens.push_back(argmax(logits));
    input = {r.tokens.back()};
  }
  return r;
}

// GPU logits step by step over the prompt then cpu.tokens (teacher forcing).
std::vector<std::vector<float>> gpu_forced(CudaCausalLM& m, const std::vector<int32_t>& prompt, const CpuRun& cpu) {
  m.clear();
  std::vector<std::vector<float>> out;
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  std::vector<int32_t> input = prompt;
  for (size_t i = 0; i < cpu.tokens.size(); ++i) {
    Status st = m.forward(input, logits);
    LATHE_CHECK(st.is_ok(), st.message());
    out.push_back(logits);
    input = {cpu.tokens[i]};
  }
  return out;
}

// The comparison described at the top of the file, for one model and prompt.
void check_against_cpu(CudaCausalLM& gpu, const CausalLM& cpu, const std::vector<int32_t>& prompt, double tol) {
  std::printf("  tolerance (HF bf16 error) %.4f\n", tol);
  const CpuRun ref = cpu_greedy(cpu, prompt, kGreedyTokens);
  const auto forced = gpu_forced(gpu, prompt, ref);
  int decisive = 0;
  for (size_t i = 0; i < forced.size(); ++i) {
    const double err = rel_error(forced[i].data(), ref.logits[i].data(), int64_t(forced[i].size()));
    EXPECT_LE(err, tol) << "step " << i;
    if (top2_gap(ref.logits[i]) > 2 * tol * max_abs(ref.logits[i])) {
      ++decisive;
      EXPECT_EQ(argmax(forced[i]), ref.tokens[i]) << "teacher-forced step " << i << " (a decisive one)";
    }
  }
  gpu.clear();
  std::vector<int32_t> input = prompt;
  for (int i = 0; i < kGreedyTokens; ++i) {
    auto id = gpu.forward_greedy(input);
    ASSERT_TRUE(id.is_ok()) << id.status().message();
    if (*id != ref.tokens[i]) {
      EXPECT_LE(top2_gap(ref.logits[i]), 2 * tol * max_abs(ref.logits[i]))
          << "free-running greedy differs at step " << i << " where the CPU's pick is decisive";
      break;
    }
    input = {*id};
  }
  std::printf("  %d of %d steps decisive\n", decisive, kGreedyTokens);
  EXPECT_GE(decisive, kGreedyTokens / 4) << "too few decisive steps for the greedy check to mean anything";
}

std::vector<int32_t> reference_prompt(const std::string& family, int64_t row) {
  auto f = SafetensorsFile::open(fixture(family) + "/reference.safetensors");
  LATHE_CHECK(f.is_ok(), f.status().message());
  Tensor ids = *f->tensor("input_ids");
  const int64_t seq = ids.size(1);
  const int64_t* p = ids.data<int64_t>() + row * seq;
  return {p, p + seq};
}

// Batch decode: kBatch sequences with prompts of different lengths (the
// first prompt.size() − 2·s tokens for sequence s), prefilled one by one,
// then decoded together for kBatchSteps steps (greedy on each sequence's own
// logits), must give every sequence the logits a one-sequence model gives it
// alone, bitwise on the GEMVs: every kernel of the decode step computes each
// row on its own (the skinny GEMM's sum over k runs in the same order for
// any number of rows); through cuBLASLt, see check_batch_decode. A last greedy step over the first kBatch − 1 sequences checks
// decode_batch_greedy, a batch smaller than max_batch, and that the sequence
// left out does not move. Bad requests change nothing.
constexpr int kBatch = 4, kBatchSteps = 6;

// n_steps greedy decode_batch() steps of the sequences 0..cur.size()−1:
// each step's input of sequence s appended to fed[s], its logits to got[s].
void batch_greedy_steps(CudaCausalLM& m, int n_steps, std::vector<int32_t>& cur,
                        std::vector<std::vector<int32_t>>& fed, std::vector<std::vector<float>>& got) {
  const int vocab = m.config().vocab_size, n = static_cast<int>(cur.size());
  std::vector<float> rows(static_cast<size_t>(n) * vocab);
  for (int step = 0; step < n_steps; ++step) {
    const Status st = m.decode_batch(cur, rows);
    ASSERT_TRUE(st.is_ok()) << st.message();
    for (int s = 0; s < n; ++s) {
      fed[s].push_back(cur[s]);
      const auto row = std::span<const float>(rows).subspan(size_t(s) * vocab, vocab);
      got[s].insert(got[s].end(), row.begin(), row.end());
      cur[s] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    }
  }
}

// `base`: the decode options both models take (max_seq, max_batch and
// simple_attention set here). On the GEMVs the batch must give each
// sequence bitwise the logits and picks it gets alone. Where its steps run
// through cuBLASLt (base.cublas_decode_rows) a sequence's logits depend on
// the batch, so they are held to the reference instead: within `tol` of
// the CPU's (running the same bf16 weights) for the same tokens, and its greedy picks the CPU's wherever
// the CPU's pick is decisive (as check_against_cpu).
void check_batch_decode(const std::string& dir, const std::vector<int32_t>& prompt, bool simple,
                        CudaModelOptions base = {}, double tol = 0) {
  const bool gemms = base.cublas_decode_rows > 0 && kBatch >= std::max(2, base.cublas_decode_rows);
  if (gemms && tol <= 0) ADD_FAILURE() << "a batch through cuBLASLt needs a tolerance";
  const int max_seq = int(prompt.size()) + kBatchSteps + 1;
  base.max_seq = max_seq;
  base.simple_attention = simple;
  CudaModelOptions batch_opts = base;
  batch_opts.max_batch = kBatch;
  auto batch = load_gpu(dir, batch_opts);
  auto alone = load_gpu(dir, base);
  const int vocab = batch->config().vocab_size;
  std::vector<std::vector<int32_t>> fed(kBatch);  // each sequence's tokens: prompt, then decoded inputs
  std::vector<std::vector<float>> got(kBatch);    // each sequence's logits after its prompt, then per step
  std::vector<int32_t> cur(kBatch);
  std::vector<float> logits(static_cast<size_t>(vocab)), rows(static_cast<size_t>(kBatch) * vocab);
  for (int s = 0; s < kBatch; ++s) {
    fed[s].assign(prompt.begin(), prompt.end() - 2 * s);
    ASSERT_TRUE(batch->forward_seq(s, fed[s], logits).is_ok());
    got[s] = logits;
    cur[s] = argmax(logits);
  }
  batch_greedy_steps(*batch, kBatchSteps, cur, fed, got);
  std::vector<int32_t> next(kBatch - 1);
  ASSERT_TRUE(batch->decode_batch_greedy(std::span<const int32_t>(cur).first(kBatch - 1), next).is_ok());
  EXPECT_EQ(batch->n_tokens(kBatch - 1), int(fed[kBatch - 1].size())) << "the sequence left out moved";

  std::vector<int32_t> too_many(kBatch + 1, 1);
  std::vector<float> too_many_rows(static_cast<size_t>(kBatch + 1) * vocab);
  Status st = batch->decode_batch(too_many, too_many_rows);
  EXPECT_NE(st.message().find("max_batch"), std::string::npos) << st.message();
  st = batch->decode_batch(std::span<const int32_t>(cur).first(kBatch - 1),
                           std::span<float>(rows).first(size_t(kBatch - 1) * vocab));  // sequence 0 is full
  EXPECT_NE(st.message().find("overflow"), std::string::npos) << st.message();
  for (int s = 1; s < kBatch; ++s) EXPECT_EQ(batch->n_tokens(s), int(fed[s].size()) + (s < kBatch - 1)) << s;

  // The CPU runs the weights the GPU holds (bf16), in f32.
  TempDir rounded("batch_bf16");
  if (gemms) write_bf16_copy(dir, rounded.str());
  auto cpu = gemms ? load_cpu(rounded.str()) : nullptr;
  for (int s = 0; s < kBatch; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + ", prompt of " + std::to_string(fed[s].size() - kBatchSteps));
    const std::vector<int32_t> own_prompt(fed[s].begin(), fed[s].end() - kBatchSteps);
    // The reference's logits after the prompt, then after each decoded token
    // (and after the greedy step's input, for the sequences it took).
    KvCache cache = gemms ? cpu->new_cache(static_cast<int>(fed[s].size()) + 1) : KvCache{};
    TensorView out{logits.data(), DType::F32, {1, vocab}, Device::cpu()};
    auto reference = [&](std::span<const int32_t> ids) {
      return gemms ? cpu->forward(ids, cache, out, false) : alone->forward(ids, logits);
    };
    if (!gemms) alone->clear();
    std::vector<std::vector<float>> want;
    ASSERT_TRUE(reference(own_prompt).is_ok());
    want.push_back(logits);
    const size_t n_inputs = fed[s].size() + (s < kBatch - 1 ? 1 : 0);
    for (size_t i = own_prompt.size(); i < n_inputs; ++i) {
      const int32_t id = i < fed[s].size() ? fed[s][i] : cur[s];
      ASSERT_TRUE(reference(std::span<const int32_t>(&id, 1)).is_ok());
      want.push_back(logits);
    }
    for (int step = 0; step <= kBatchSteps; ++step) {
      const float* g = got[s].data() + size_t(step) * vocab;
      const std::vector<float>& w = want[size_t(step)];
      if (gemms) {
        EXPECT_LE(rel_error(g, w.data(), vocab), tol) << "step " << step << " against the CPU";
      } else {
        EXPECT_TRUE(std::equal(w.begin(), w.end(), g))
            << "step " << step << ": batched logits differ from the sequence's own (error "
            << rel_error(g, w.data(), vocab) << ")";
      }
    }
    if (s < kBatch - 1) {
      const std::vector<float>& w = want.back();
      if (!gemms) {
        EXPECT_EQ(next[s], argmax(w)) << "decode_batch_greedy";
      } else if (top2_gap(w) > 2 * tol * max_abs(w)) {
        EXPECT_EQ(next[s], argmax(w)) << "decode_batch_greedy, where the CPU's pick is decisive";
      }
    }
  }
}

class CudaGenFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGenFixture, LogitsMatchReference) {
  SKIP_WITHOUT_GPU();
  auto f = SafetensorsFile::open(fixture(GetParam()) + "/reference.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  Tensor ids = *f->tensor("input_ids"), want = *f->tensor("logits");
  const int64_t seq = ids.size(1), vocab = want.size(2);
  auto gpu = load_gpu(fixture(GetParam()), {.max_seq = int(seq), .max_logit_rows = int(seq)});
  for (int64_t b = 0; b < ids.size(0); ++b) {
    gpu->clear();
    std::vector<int32_t> prompt = reference_prompt(GetParam(), b);
    std::vector<float> got(static_cast<size_t>(seq * vocab));
    ASSERT_TRUE(gpu->forward(prompt, got, true).is_ok());
    const double err = rel_error(got.data(), want.data<float>() + b * seq * vocab, seq * vocab);
    const double tol = hf_bf16_error("fixture/" + GetParam() + "/row" + std::to_string(b));
    std::printf("  %s row %lld: error vs HF f32 %.4f (HF bf16: %.4f)\n", GetParam().c_str(), (long long)b, err, tol);
    EXPECT_LE(err, tol) << "row " << b;
  }
}

TEST_P(CudaGenFixture, GreedyMatchesCpuWithBf16Weights) {
  SKIP_WITHOUT_GPU();
  TempDir dir("bf16_" + GetParam());
  write_bf16_copy(fixture(GetParam()), dir.str());
  auto cpu = load_cpu(dir.str());
  const std::vector<int32_t> prompt = reference_prompt(GetParam(), 0);
  auto gpu = load_gpu(fixture(GetParam()), {.max_seq = int(prompt.size()) + kGreedyTokens});
  check_against_cpu(*gpu, *cpu, prompt, hf_bf16_error("greedy/" + GetParam()));
}

// Every decode step's logits for greedy tokens after prompt, with or without
// CUDA graphs.
std::vector<float> decode_logits(CudaCausalLM& gpu, const std::vector<int32_t>& prompt, bool graphs) {
  gpu.set_use_graphs(graphs);
  gpu.clear();
  std::vector<float> all, logits(static_cast<size_t>(gpu.config().vocab_size));
  std::vector<int32_t> input = prompt;
  for (int i = 0; i < kGreedyTokens; ++i) {
    Status st = gpu.forward(input, logits);
    EXPECT_TRUE(st.is_ok()) << st.message();
    all.insert(all.end(), logits.begin(), logits.end());
    input = {argmax(logits)};
  }
  return all;
}

void check_graph_replay(CudaCausalLM& gpu, const std::vector<int32_t>& prompt) {
  const std::vector<float> eager = decode_logits(gpu, prompt, false), graph = decode_logits(gpu, prompt, true),
                           again = decode_logits(gpu, prompt, true);
  EXPECT_TRUE(eager == graph) << "graph replay differs from eager decode";
  EXPECT_TRUE(graph == again) << "a second run of the captured graph differs";
}

TEST_P(CudaGenFixture, GraphReplayEqualsEagerBitwise) {
  SKIP_WITHOUT_GPU();
  const std::vector<int32_t> prompt = reference_prompt(GetParam(), 1);
  auto gpu = load_gpu(fixture(GetParam()), {.max_seq = int(prompt.size()) + kGreedyTokens});
  check_graph_replay(*gpu, prompt);
}

TEST_P(CudaGenFixture, BatchDecodeGivesEachSequenceItsOwnLogits) {
  SKIP_WITHOUT_GPU();
  // Row 0: the prompt of the greedy case whose bf16 error is the tolerance
  // (sequence 0 decodes that case's first steps).
  for (int rows : {3, 0}) {
    SCOPED_TRACE(rows ? "cuBLASLt projections" : "GEMVs");
    check_batch_decode(fixture(GetParam()), reference_prompt(GetParam(), 0), /*simple=*/false,
                       {.cublas_decode_rows = rows}, hf_bf16_error("greedy/" + GetParam()));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaGenFixture, ::testing::Values("llama", "mistral", "qwen2", "qwen3"));

// head_dim 64 (Llama) and 128 (Mistral, sliding window 8 < prompt + output):
// the flash prefill and split-K decode kernels, and the plain kernel as twin.
class CudaGenFlash : public ::testing::TestWithParam<FlashCase> {};
std::string case_name(const FlashCase& c) { return "random/" + c.family + std::to_string(c.head_dim); }

TEST_P(CudaGenFlash, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "");
  auto cpu = load_cpu(dir.str());
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  for (bool simple : {false, true}) {
    SCOPED_TRACE(simple ? "plain attention" : "flash attention");
    auto gpu = load_gpu(dir.str(), {.max_seq = int(prompt.size()) + kGreedyTokens, .simple_attention = simple});
    check_against_cpu(*gpu, *cpu, prompt, hf_bf16_error(case_name(c)));
  }
}

TEST_P(CudaGenFlash, GraphReplayEqualsEagerBitwise) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_graph");
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  auto gpu = load_gpu(dir.str(), {.max_seq = int(prompt.size()) + kGreedyTokens});
  check_graph_replay(*gpu, prompt);
}

// Programmatic dependent launches (each decode kernel starting while the
// one before drains, the attention's last block per head merging) change
// when work runs, never what it computes: bitwise the logits of ordinary
// launches, eager and replayed. (Off sm_90 both runs are ordinary.)
TEST_P(CudaGenFlash, OverlappedLaunchesEqualOrdinaryBitwise) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_overlap");
  std::vector<int32_t> prompt = flash_prompt(20, 41, 3);
  auto on = load_gpu(dir.str(), {.max_seq = int(prompt.size()) + kGreedyTokens, .overlap_launches = true});
  auto off = load_gpu(dir.str(), {.max_seq = int(prompt.size()) + kGreedyTokens, .overlap_launches = false});
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graph" : "eager");
    EXPECT_TRUE(decode_logits(*on, prompt, graphs) == decode_logits(*off, prompt, graphs));
  }
}

TEST_P(CudaGenFlash, ChunkedPrefillEqualsOnePass) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_chunk");
  std::vector<int32_t> prompt = flash_prompt(40, 53, 5);
  auto whole = load_gpu(dir.str(), {.max_seq = 64});
  auto chunked = load_gpu(dir.str(), {.max_seq = 64, .max_forward_tokens = 16});
  std::vector<float> a(512), b(512);
  ASSERT_TRUE(whole->forward(prompt, a).is_ok());
  ASSERT_TRUE(chunked->forward(prompt, b).is_ok());
  EXPECT_LE(rel_error(b.data(), a.data(), 512), hf_bf16_error(case_name(c)));
  EXPECT_EQ(chunked->n_tokens(), 40);
}

TEST_P(CudaGenFlash, BatchDecodeGivesEachSequenceItsOwnLogits) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_batch");
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  for (bool simple : {false, true}) {
    for (int rows : {3, 0}) {
      SCOPED_TRACE(std::string(simple ? "plain attention, " : "flash attention, ") +
                   (rows ? "cuBLASLt projections" : "GEMVs"));
      check_batch_decode(dir.str(), prompt, simple, {.cublas_decode_rows = rows}, hf_bf16_error(case_name(c)));
    }
  }
}

// More sequences than the GEMVs fold the norm into (kFusedNormRows): the
// norm kernel, then the projections through cuBLASLt with RoPE + append and
// SwiGLU kernels (the default, CudaModelOptions::cublas_decode_rows) or on the
// tensor-core GEMVs with the grids of kCudaDecodeShapesMany (down and the
// LM head with k split over blocks). Eight sequences with prompts of
// different lengths decoded together for a few greedy steps: every step's
// logits of every sequence within the tolerance of the CPU's for the same
// tokens; a second run with CUDA graphs off bitwise the same.
void many_sequence_decode(const FlashCase& c, bool gemms) {
  FlashModel dir(c, gemms ? "_many_gemm" : "_many");
  auto cpu = load_cpu(dir.str());
  const double tol = hf_bf16_error(case_name(c));
  constexpr int kMany = 8, kSteps = 5;
  const std::vector<int32_t> prompt = flash_prompt(24, 41, 7);
  auto gpu = load_gpu(dir.str(), {.max_seq = int(prompt.size()) + kSteps + 1, .max_batch = kMany,
                                  .cublas_decode_rows = gemms ? 5 : 0});
  const int vocab = gpu->config().vocab_size;
  auto run = [&](bool graphs, std::vector<std::vector<int32_t>>& fed) {
    gpu->set_use_graphs(graphs);
    gpu->clear();
    fed.assign(kMany, {});
    std::vector<std::vector<float>> got(kMany);
    std::vector<float> logits(static_cast<size_t>(vocab));
    std::vector<int32_t> cur(kMany);
    for (int s = 0; s < kMany; ++s) {
      fed[s].assign(prompt.begin(), prompt.end() - 2 * s);
      EXPECT_TRUE(gpu->forward_seq(s, fed[s], logits).is_ok());
      cur[s] = argmax(logits);
    }
    batch_greedy_steps(*gpu, kSteps, cur, fed, got);
    return got;
  };
  std::vector<std::vector<int32_t>> fed, fed_eager;
  const auto got = run(true, fed), eager = run(false, fed_eager);
  EXPECT_TRUE(got == eager) << "graph replay differs from eager decode";
  for (int s = 0; s < kMany; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    KvCache cache = cpu->new_cache(static_cast<int>(fed[s].size()));
    std::vector<float> logits(static_cast<size_t>(vocab));
    TensorView out{logits.data(), DType::F32, {1, vocab}, Device::cpu()};
    const size_t n_prompt = fed[s].size() - kSteps;
    ASSERT_TRUE(cpu->forward(std::span<const int32_t>(fed[s]).first(n_prompt), cache, out, false).is_ok());
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(cpu->forward(std::span<const int32_t>(fed[s]).subspan(n_prompt + step, 1), cache, out, false).is_ok());
      const double err = rel_error(got[s].data() + size_t(step) * vocab, logits.data(), vocab);
      EXPECT_LE(err, tol) << "step " << step;
    }
  }
}

TEST_P(CudaGenFlash, ManySequenceDecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  for (bool gemms : {true, false}) {
    SCOPED_TRACE(gemms ? "cuBLASLt projections" : "tensor-core GEMVs");
    many_sequence_decode(c, gemms);
  }
}

// The decode GEMVs on the shared-memory ring at one block per SM
// (CudaModelOptions::bulk_gemv; the default table runs two) with the
// attention in chunks of at least 8 keys (attention_min_chunk), and on the
// grids before the ring (register_gemv): the CPU's logits within the same
// tolerance; on the ring graph replay and overlapped launches bitwise the
// eager and ordinary runs, batched sequences bitwise their own logits.
TEST_P(CudaGenFlash, BulkGemvDecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_bulk");
  auto cpu = load_cpu(dir.str());
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  const int max_seq = int(prompt.size()) + kGreedyTokens;
  auto on = load_gpu(dir.str(), {.max_seq = max_seq, .bulk_gemv = true, .bulk_per_sm = 1, .attention_min_chunk = 8});
  auto off = load_gpu(dir.str(), {.max_seq = max_seq, .overlap_launches = false, .bulk_gemv = true, .bulk_per_sm = 1,
                                  .attention_min_chunk = 8});
  check_against_cpu(*on, *cpu, prompt, hf_bf16_error(case_name(c)));
  auto registers = load_gpu(dir.str(), {.max_seq = max_seq, .register_gemv = true});
  check_against_cpu(*registers, *cpu, prompt, hf_bf16_error(case_name(c)));
  check_graph_replay(*on, prompt);
  EXPECT_TRUE(decode_logits(*on, prompt, true) == decode_logits(*off, prompt, true)) << "overlapped launches";
  check_batch_decode(dir.str(), prompt, /*simple=*/false, {.bulk_gemv = true, .cublas_decode_rows = 0});
}

// Decode attention on the split-K kernel (CudaModelOptions::
// split_k_attention; the default up to 4 sequences on sm_90 is the cluster
// kernel, which the tests above run): the CPU's logits within the same
// tolerance, greedy tokens the CPU's where its pick is decisive; graph
// replay and overlapped launches bitwise the eager and ordinary runs;
// batched sequences bitwise their own logits alone. The cluster kernel
// asked for four query heads per block (it takes the fixtures' whole group
// of two; the default takes 1 at head_dim 64) the same way.
TEST_P(CudaGenFlash, DecodeAttentionKernelsMatchCpu) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_attention");
  auto cpu = load_cpu(dir.str());
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  const int max_seq = int(prompt.size()) + kGreedyTokens;
  for (const CudaModelOptions& o : {CudaModelOptions{.split_k_attention = true},
                                    CudaModelOptions{.attention_cluster_heads = 4}}) {
    SCOPED_TRACE(o.split_k_attention ? "split-K attention" : "cluster attention, up to four heads per block");
    CudaModelOptions on_opts = o, off_opts = o;
    on_opts.max_seq = off_opts.max_seq = max_seq;
    off_opts.overlap_launches = false;
    auto on = load_gpu(dir.str(), on_opts);
    auto off = load_gpu(dir.str(), off_opts);
    check_against_cpu(*on, *cpu, prompt, hf_bf16_error(case_name(c)));
    check_graph_replay(*on, prompt);
    EXPECT_TRUE(decode_logits(*on, prompt, true) == decode_logits(*off, prompt, true)) << "overlapped launches";
    CudaModelOptions gemvs = o;
    gemvs.cublas_decode_rows = 0;  // the batch on the GEMVs too
    check_batch_decode(dir.str(), prompt, /*simple=*/false, gemvs);
  }
}

// The ring GEMVs pulling their successors' first weights into L2
// (CudaModelOptions::l2_prefetch_units: 3 units from every GEMV; all of
// them but none from q|k|v and one from o, with the largest shared-memory
// carveout; the same from LATHE_CUDA_DECODE_L2_PREFETCH), and their
// producers keeping 0 (their first unit alone, then the whole ring), 1 or
// 7 units in flight (more than the ring's slots: bounded by it) instead of
// the default's 2 at one sequence (ring_in_flight),
// move bytes earlier, never change a sum: bitwise the logits of the step
// without, eager and replayed; the CPU's within the same tolerance; batched
// sequences bitwise their own logits alone.
TEST_P(CudaGenFlash, L2PrefetchDecodeIsBitwiseTheSame) {
  SKIP_WITHOUT_GPU();
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_prefetch");
  auto cpu = load_cpu(dir.str());
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  const int max_seq = int(prompt.size()) + kGreedyTokens;
  auto plain = load_gpu(dir.str(), {.max_seq = max_seq, .l2_prefetch_units = 0});
  const std::vector<float> want = decode_logits(*plain, prompt, true);
  for (const CudaModelOptions& o :
       {CudaModelOptions{.l2_prefetch_units = 3},
        CudaModelOptions{.l2_prefetch_units = 64, .l2_prefetch_each = {.qkv = 0, .o = 1},
                         .ring_max_carveout = true},
        CudaModelOptions{.ring_in_flight = 0}, CudaModelOptions{.ring_in_flight = 1},
        CudaModelOptions{.ring_in_flight = 7}}) {
    SCOPED_TRACE(::testing::Message() << "units " << o.l2_prefetch_units << ", from q|k|v "
                                      << o.l2_prefetch_each.qkv << ", from o " << o.l2_prefetch_each.o
                                      << ", ring units in flight " << o.ring_in_flight);
    CudaModelOptions opts = o;
    opts.max_seq = max_seq;
    auto on = load_gpu(dir.str(), opts);
    EXPECT_TRUE(decode_logits(*on, prompt, false) == want) << "eager";
    EXPECT_TRUE(decode_logits(*on, prompt, true) == want) << "graph";
    check_against_cpu(*on, *cpu, prompt, hf_bf16_error(case_name(c)));
    CudaModelOptions gemvs = o;
    gemvs.cublas_decode_rows = 0;  // the batch on the GEMVs too
    check_batch_decode(dir.str(), prompt, /*simple=*/false, gemvs);
  }
  {  // the variable sets the units where the options leave them (-1)
    for (const char* units : {"3", "0,1,2,64,1"}) {
      lathe::testing::ScopedEnv env("LATHE_CUDA_DECODE_L2_PREFETCH", units);
      auto from_env = load_gpu(dir.str(), {.max_seq = max_seq});
      EXPECT_TRUE(decode_logits(*from_env, prompt, true) == want) << "LATHE_CUDA_DECODE_L2_PREFETCH=" << units;
    }
    // and when it goes out: at once, after all of a block's units, all but its last 2
    for (const char* lag : {"-1", "0", "2"}) {
      lathe::testing::ScopedEnv env("LATHE_CUDA_DECODE_L2_PREFETCH_LAG", lag);
      auto from_env = load_gpu(dir.str(), {.max_seq = max_seq});
      EXPECT_TRUE(decode_logits(*from_env, prompt, true) == want) << "LATHE_CUDA_DECODE_L2_PREFETCH_LAG=" << lag;
    }
  }
  for (const char* var : {"LATHE_CUDA_DECODE_L2_PREFETCH", "LATHE_CUDA_DECODE_L2_PREFETCH_LAG"}) {
    lathe::testing::ScopedEnv env(var, "lots");
    auto bad = CudaCausalLM::load(dir.str(), {.max_seq = max_seq});
    ASSERT_FALSE(bad.is_ok()) << var;
    EXPECT_NE(bad.status().message().find(var), std::string::npos) << bad.status().message();
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CudaGenFlash,
                         ::testing::Values(FlashCase{"llama", 64, 0}, FlashCase{"mistral", 128, 8}),
                         [](const auto& info) { return info.param.family + std::to_string(info.param.head_dim); });

TEST(CudaGen, AdapterMergedAtLoadMatchesPeftReference) {
  SKIP_WITHOUT_GPU();
  const std::string adapter = test_data() + "/adapters/llama-lora";
  auto f = SafetensorsFile::open(adapter + "/reference.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  Tensor ids = *f->tensor("input_ids"), want = *f->tensor("logits");
  const int64_t seq = ids.size(1), vocab = want.size(-1);
  std::vector<int32_t> prompt(ids.data<int64_t>(), ids.data<int64_t>() + seq);
  auto gpu = load_gpu(fixture("llama"), {.max_seq = int(seq), .max_logit_rows = int(seq), .adapter_dir = adapter});
  std::vector<float> got(static_cast<size_t>(seq * vocab));
  ASSERT_TRUE(gpu->forward(prompt, got, true).is_ok());
  const double err = rel_error(got.data(), want.data<float>(), seq * vocab), tol = hf_bf16_error("adapter/llama-lora");
  std::printf("  error vs PEFT f32 %.4f (HF merged then bf16: %.4f)\n", err, tol);
  EXPECT_LE(err, tol);
}

TEST(CudaGen, BadRequestsAreClearErrors) {
  SKIP_WITHOUT_GPU();
  auto gpu = load_gpu(fixture("llama"), {.max_seq = 8});
  std::vector<float> logits(384);
  std::vector<int32_t> too_long(9, 5), bad_id = {5, 384};
  Status st = gpu->forward(too_long, logits);
  EXPECT_NE(st.message().find("overflow the KV cache of 8"), std::string::npos) << st.message();
  st = gpu->forward(bad_id, logits);
  EXPECT_NE(st.message().find("token id 384"), std::string::npos) << st.message();
  EXPECT_EQ(gpu->n_tokens(), 0);
  std::vector<float> rows(2 * 384);
  st = gpu->forward(std::vector<int32_t>{1, 2}, rows, true);
  EXPECT_NE(st.message().find("max_logit_rows"), std::string::npos) << st.message();
  auto missing = CudaCausalLM::load(fixture("llama"), {.device = cuda::device_count(), .max_seq = 8});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos) << missing.status().message();
}

// Runs everywhere: without a GPU the load is refused with a message saying so.
TEST(CudaGen, LoadWithoutGpuSaysSo) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  auto m = CudaCausalLM::load(fixture("llama"), {.max_seq = 8});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("cuda"), std::string::npos) << m.status().message();
}

// Runs everywhere: the greedy comparisons have enough decisive steps (CPU
// top-2 gap above twice the tolerance) on every model they use.
int cpu_decisive_steps(const std::string& dir, const std::vector<int32_t>& prompt, double tol) {
  auto cpu = load_cpu(dir);
  const CpuRun r = cpu_greedy(*cpu, prompt, kGreedyTokens);
  int n = 0;
  for (const auto& l : r.logits) n += top2_gap(l) > 2 * tol * max_abs(l);
  return n;
}
TEST(CudaGen, GreedyChecksHaveDecisiveSteps) {
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    TempDir dir(std::string("decisive_") + family);
    write_bf16_copy(fixture(family), dir.str());
    const int n = cpu_decisive_steps(dir.str(), reference_prompt(family, 0), hf_bf16_error(std::string("greedy/") + family));
    std::printf("  %s: %d of %d steps decisive\n", family, n, kGreedyTokens);
    EXPECT_GE(n, kGreedyTokens / 4) << family;
  }
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  for (auto [family, hd, window] : {std::tuple{"llama", 64, 0}, std::tuple{"mistral", 128, 8}}) {
    TempDir dir(std::string("decisive_rand_") + family);
    write_random_model(dir.str(), family, hd, window);
    const int n = cpu_decisive_steps(dir.str(), prompt, hf_bf16_error(case_name({family, hd, window})));
    std::printf("  random %s hd %d: %d of %d steps decisive\n", family, hd, n, kGreedyTokens);
    EXPECT_GE(n, kGreedyTokens / 4) << family;
  }
}

// Runs everywhere: the random models the flash tests use load on the CPU.
TEST(CudaGen, RandomTestModelsLoadOnCpu) {
  for (auto [family, hd, window] : {std::tuple{"llama", 64, 0}, std::tuple{"mistral", 128, 8}}) {
    TempDir dir(std::string("cpu_") + family);
    write_random_model(dir.str(), family, hd, window);
    auto m = CausalLM::load(dir.str());
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    EXPECT_EQ((*m)->config().head_dim, hd);
    std::vector<float> logits(512);
    KvCache cache = (*m)->new_cache(4);
    std::vector<int32_t> ids = {1, 2, 3};
    ASSERT_TRUE((*m)->forward(ids, cache, TensorView{logits.data(), DType::F32, {1, 512}, Device::cpu()}, false).is_ok());
  }
}

// Runs everywhere: the random models the tolerances were measured on (by
// tools/bf16_reference_error.py, which reimplements the seeded init) are the
// ones write_random_model makes here.
TEST(CudaGen, Bf16ErrorWasMeasuredOnTheseRandomModels) {
  for (auto [family, hd, window] : {std::tuple{"llama", 64, 0}, std::tuple{"mistral", 128, 8}}) {
    const nlohmann::json rec = bf16_case(case_name({family, hd, window}));
    ASSERT_TRUE(rec.is_object() && rec.contains("embed_tokens_first") && rec.contains("weights_abs_sum")) << family;
    TempDir dir(std::string("measured_") + family);
    write_random_model(dir.str(), family, hd, window);
    auto store = WeightStore::open_dir(dir.str());
    ASSERT_TRUE(store.is_ok()) << store.status().message();
    double abs_sum = 0;
    for (const std::string& name : store->names()) {
      Tensor t = store->get(name)->to(DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i) abs_sum += std::abs(double(t.data<float>()[i]));
    }
    Tensor emb = store->get("model.embed_tokens.weight")->to(DType::F32);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(emb.data<float>()[i], rec.at("embed_tokens_first").at(i).get<float>()) << family;
    EXPECT_NEAR(abs_sum, rec.at("weights_abs_sum").get<double>(), 1e-9 * abs_sum) << family;
  }
}

// Runs everywhere: the measured tolerances still fail a real bug. Each case
// with a deliberately broken model recorded (adapter left out, sliding window
// ignored) must be off by far more than its tolerance.
TEST(CudaGen, Bf16TolerancesSeparateRealBugs) {
  for (const char* name : {"adapter/llama-lora", "greedy/mistral", "random/mistral128"}) {
    const nlohmann::json c = bf16_case(name);
    ASSERT_TRUE(c.is_object() && c.contains("wrong")) << name;
    const double tol = hf_bf16_error(name), wrong = c.at("wrong").at("error").get<double>();
    EXPECT_GT(tol, 0) << name;
    EXPECT_GT(wrong, 10 * tol) << name << ": " << c.at("wrong").at("what").get<std::string>();
  }
}

}  // namespace
}  // namespace lathe
