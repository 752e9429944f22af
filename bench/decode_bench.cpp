// Decode throughput at batch 1 against the memory-bandwidth floor.
//
// Decoding one token reads every weight once (plus the KV cache), so on a
// CPU its speed is bounded by memory bandwidth: max tokens/s = bandwidth /
// bytes read per token. This bench measures both on the same machine with the
// same thread count: lathe's decode (after a short prefill) and a STREAM-like
// read of a buffer far larger than the caches, then prints the ratio.
//
//   bench_decode --model DIR [--prompt-tokens 16] [--new-tokens 64] [--buffer-mb 2048]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"
#include "engine/sampler.h"
#include "models/causal_lm.h"
#include "models/random_init.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Args {
  std::string model;
  int prompt_tokens = 16;
  int new_tokens = 64;
  int64_t buffer_mb = 2048;
};

bool parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (k == "--model") a->model = v;
    else if (k == "--prompt-tokens") a->prompt_tokens = std::atoi(v);
    else if (k == "--new-tokens") a->new_tokens = std::atoi(v);
    else if (k == "--buffer-mb") a->buffer_mb = std::atoll(v);
    else return false;
  }
  return !a->model.empty() && a->prompt_tokens > 0 && a->new_tokens > 1 && a->buffer_mb > 0;
}

// Best-of-5 read bandwidth in bytes/s over a buffer of size_mb, all threads.
// 32 independent partial sums per thread keep the adds off the critical path,
// so the loop is bound by memory, not by add latency.
double read_bandwidth(int64_t size_mb) {
  constexpr int64_t kLanes = 32;
  const int64_t n = size_mb * (1 << 20) / static_cast<int64_t>(sizeof(float)) / kLanes * kLanes;
  float* buf = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i & 7);  // first touch on the reading thread
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int rep = 0; rep < 5; ++rep) {
    Clock::time_point t = Clock::now();
    float total = 0.0f;
#pragma omp parallel reduction(+ : total)
    {
      float acc[kLanes] = {};
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; i += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) acc[j] += buf[i + j];
      for (float a : acc) total += a;
    }
    double sec = seconds_since(t);
    sink = sink + total;
    best = std::max(best, static_cast<double>(n) * sizeof(float) / sec);
  }
  std::free(buf);
  return best;
}

// Bytes one decode step reads: every weight once (the embedding table only
// as the lm_head when tied; an untied table is read one row at a time), and
// the f32 KV cache over ctx positions.
double bytes_per_token(const lathe::ModelConfig& cfg, lathe::DType weight_dtype, double ctx) {
  double bytes = 0.0;
  for (const lathe::TensorSpec& s : lathe::llama_tensor_specs(cfg)) {
    if (s.name == "model.embed_tokens.weight" && !cfg.tie_word_embeddings) continue;
    bytes += static_cast<double>(lathe::dtype_bytes(weight_dtype, s.shape.numel()));
  }
  const int head_dim = cfg.head_dim > 0 ? cfg.head_dim : cfg.hidden_size / cfg.num_attention_heads;
  bytes += 2.0 * cfg.num_hidden_layers * ctx * cfg.num_key_value_heads * head_dim * sizeof(float);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse_args(argc, argv, &a)) {
    std::fprintf(stderr, "usage: bench_decode --model DIR [--prompt-tokens 16] [--new-tokens 64] [--buffer-mb 2048]\n");
    return 2;
  }
  lathe::init_threads();
  auto loaded = lathe::CausalLM::load(a.model);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "bench_decode: %s\n", loaded.status().message().c_str());
    return 1;
  }
  const lathe::CausalLM& model = **loaded;
  const lathe::ModelConfig& cfg = model.config();
  auto dtype = lathe::dtype_from_name(cfg.torch_dtype == "bfloat16" ? "bf16" : "f32").value();

  lathe::KvCache cache = model.new_cache(a.prompt_tokens + a.new_tokens);
  std::vector<int32_t> prompt(static_cast<size_t>(a.prompt_tokens));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7 + 3) % static_cast<size_t>(cfg.vocab_size));
  lathe::Tensor logits = lathe::Tensor::empty(lathe::DType::F32, lathe::Shape{1, cfg.vocab_size});
  std::span<const float> row(logits.data<float>(), static_cast<size_t>(cfg.vocab_size));

  Clock::time_point t0 = Clock::now();
  lathe::Status s = model.forward(prompt, cache, logits, false);
  double prefill_s = seconds_since(t0);
  int32_t next = lathe::argmax(row);
  std::vector<double> step_s;
  for (int i = 1; i < a.new_tokens && s.is_ok(); ++i) {
    Clock::time_point t = Clock::now();
    s = model.forward(std::span<const int32_t>(&next, 1), cache, logits, false);
    next = lathe::argmax(row);
    step_s.push_back(seconds_since(t));
  }
  if (!s.is_ok()) {
    std::fprintf(stderr, "bench_decode: %s\n", s.message().c_str());
    return 1;
  }
  double decode_s = 0.0;
  for (double x : step_s) decode_s += x;
  const double tok_s = static_cast<double>(step_s.size()) / decode_s;

  const double bw = read_bandwidth(a.buffer_mb);
  const double avg_ctx = a.prompt_tokens + a.new_tokens / 2.0;
  const double bytes = bytes_per_token(cfg, dtype, avg_ctx);
  const double floor_tok_s = bw / bytes;

  std::printf("model: %s (%lld params, %s weights), threads: %d\n", a.model.c_str(),
              static_cast<long long>(model.n_params()), std::string(lathe::dtype_name(dtype)).c_str(),
              lathe::num_threads());
  std::printf("prefill: %d tokens in %.3f s (%.1f tokens/s)\n", a.prompt_tokens, prefill_s, a.prompt_tokens / prefill_s);
  std::printf("\n| figure | lathe | floor | ratio |\n|---|---|---|---|\n");
  std::printf("| decode tokens/s, batch 1 (%d tokens after a %d-token prompt) | %.2f | %.2f | %.2f |\n",
              static_cast<int>(step_s.size()), a.prompt_tokens, tok_s, floor_tok_s, tok_s / floor_tok_s);
  std::printf("| effective read bandwidth GB/s (bytes/token x tokens/s) | %.2f | %.2f | %.2f |\n",
              bytes * tok_s / 1e9, bw / 1e9, bytes * tok_s / bw);
  std::printf("\nbytes read per token: %.3f GB (weights + KV at %.0f positions); STREAM-like read: %.2f GB/s over %lld MB\n",
              bytes / 1e9, avg_ctx, bw / 1e9, static_cast<long long>(a.buffer_mb));
  return 0;
}
