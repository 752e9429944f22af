// Generation on one GPU at Llama-3.2-1B and Llama-3.1-8B shapes with random
// bf16 weights made on the device: prefill tokens/s over a prompt, and
// decode tokens/s of B sequences at once (every sequence gets the same
// prompt, then one token each per step, greedy on the device) with and
// without CUDA graphs, each beside its floor: decode against the
// memory-bandwidth floor (every weight read once per step plus each
// sequence's KV cache, at the measured ~4.3 TB/s of the H200; tokens/s
// counts all B sequences), prefill against the bf16 GEMM peak
// (~810 TFLOP/s through cuBLASLt). A decode step is 7·n_layer + 3 kernels
// (cuda_causal_lm.cpp) plus the argmax. The baseline, transformers generate
// on the same machine, is bench/generate_hf.py (same --batch).
//
//   bench_generate_cuda [--shape 1b|8b|all] [--prompt 512] [--decode 256] [--batch 1] [--overlap 1]
//
// --overlap 0 launches the decode kernels the ordinary way rather than as
// programmatic dependent launches (to measure what the overlap gains).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "models/cuda_causal_lm.h"
#include "models/family.h"

namespace {

using lathe::CudaCausalLM;
using lathe::ModelConfig;
using Clock = std::chrono::steady_clock;

constexpr double kBandwidth = 4.3e12;  // bytes/s, device-to-device copy measured on the H200
constexpr double kGemmPeak = 810e12;   // bf16 FLOP/s through cuBLASLt on the H200

struct Shape {
  const char* name;
  ModelConfig cfg;
};

ModelConfig llama3(int hidden, int layers, int heads, int kv_heads, int ffn, bool tied) {
  ModelConfig c;
  c.model_type = "llama";
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 32.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 8192;
  c.tie_word_embeddings = tied;
  return c;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int32_t> prompt_ids(int n, int vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((int64_t(i) * 7919 + 13) % vocab);
  return ids;
}

// Bytes read per decode step of `batch` sequences: the weights once (the
// embedding contributes a row per sequence, neglected; a tied head is the
// embedding read once) plus each sequence's KV cache at mean context ctx.
double decode_bytes(const ModelConfig& c, int64_t n_params, double ctx, int batch) {
  const double embed = double(c.vocab_size) * c.hidden_size;
  const double weights = 2.0 * (n_params - (c.tie_word_embeddings ? 0.0 : embed));
  const double kv = 2.0 * 2.0 * c.num_hidden_layers * ctx * c.num_key_value_heads * c.head_dim;
  return weights + batch * kv;
}

// Best of reps: prefill seconds for the prompt; decode seconds for n tokens after it.
struct Timing {
  double prefill_s = 1e30, decode_s = 1e30;
};

Timing time_model(CudaCausalLM& m, const std::vector<int32_t>& prompt, int n_decode, int batch, bool graphs,
                  int reps) {
  Timing t;
  m.set_use_graphs(graphs);
  std::vector<int32_t> cur(static_cast<size_t>(batch)), next(static_cast<size_t>(batch));
  for (int r = 0; r < reps; ++r) {
    m.clear();
    for (int s = 0; s < batch; ++s) {
      Clock::time_point t0 = Clock::now();
      std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
      lathe::Status st = m.forward_seq(s, prompt, logits);  // waits for the device (the logits come back)
      if (!st.is_ok()) {
        std::fprintf(stderr, "prefill: %s\n", st.message().c_str());
        return t;
      }
      if (s == 0) t.prefill_s = std::min(t.prefill_s, seconds_since(t0));
      cur[s] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    Clock::time_point t1 = Clock::now();
    for (int i = 0; i < n_decode; ++i) {
      lathe::Status st = m.decode_batch_greedy(cur, next);
      if (!st.is_ok()) {
        std::fprintf(stderr, "decode: %s\n", st.message().c_str());
        return t;
      }
      cur.swap(next);
    }
    t.decode_s = std::min(t.decode_s, seconds_since(t1));
  }
  return t;
}

void run_shape(const Shape& s, int n_prompt, int n_decode, int batch, bool overlap) {
  auto header = lathe::model_header_from_config(s.cfg, s.name);
  if (!header.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, header.status().message().c_str());
    return;
  }
  lathe::CudaModelOptions opts{.max_seq = n_prompt + n_decode + 1, .max_forward_tokens = n_prompt, .max_batch = batch,
                               .overlap_launches = overlap};
  auto model = CudaCausalLM::random(*header, opts, /*seed=*/1);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, model.status().message().c_str());
    return;
  }
  CudaCausalLM& m = **model;
  const std::vector<int32_t> prompt = prompt_ids(n_prompt, s.cfg.vocab_size);
  const Timing eager = time_model(m, prompt, n_decode, batch, /*graphs=*/false, 2);
  const Timing graph = time_model(m, prompt, n_decode, batch, /*graphs=*/true, 3);
  const double params = double(m.n_params());
  const double prefill_flops = 2.0 * params * n_prompt;
  const double bytes = decode_bytes(s.cfg, m.n_params(), n_prompt + n_decode / 2.0, batch);
  const double floor_tps = batch * kBandwidth / bytes;
  const double tps_graph = double(batch) * n_decode / graph.decode_s;
  const double tps_eager = double(batch) * n_decode / eager.decode_s;
  std::printf("| %s | %.2fB | %d | %d | %.0f | %.0f%% | %.1f | %.1f | %.0f | %.0f%% |\n", s.name, params / 1e9,
              batch, n_prompt, n_prompt / graph.prefill_s, 100.0 * prefill_flops / graph.prefill_s / kGemmPeak,
              tps_eager, tps_graph, floor_tps, 100.0 * tps_graph / floor_tps);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  int n_prompt = 512, n_decode = 256, batch = 1, overlap = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shape")) which = argv[i + 1];
    else if (!std::strcmp(argv[i], "--prompt")) n_prompt = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--decode")) n_decode = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--overlap")) overlap = std::atoi(argv[i + 1]);
  }
  if (lathe::cuda::device_count() == 0) {
    std::fprintf(stderr, "bench_generate_cuda: no CUDA device visible\n");
    return 1;
  }
  if (n_prompt < 2 || n_decode < 1 || batch < 1 || batch > 256) {
    std::fprintf(stderr, "bench_generate_cuda: --prompt must be >= 2, --decode >= 1 and --batch in [1, 256]\n");
    return 1;
  }
  const Shape shapes[] = {
      {"Llama-3.2-1B", llama3(2048, 16, 32, 8, 8192, /*tied=*/true)},
      {"Llama-3.1-8B", llama3(4096, 32, 32, 8, 14336, /*tied=*/false)},
  };
  std::printf("generation, batch %d, bf16, random weights; decode greedy on the device, 7 kernels per layer + 3 "
              "per step (overlapped launches: %s); tok/s counts all sequences\n", batch, overlap ? "on" : "off");
  std::printf("| shape | params | batch | prompt | prefill tok/s | of GEMM peak | decode tok/s eager | decode tok/s graph "
              "| bandwidth floor tok/s | of floor |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const bool is_1b = std::strstr(s.name, "1B") != nullptr;
    if (which == "all" || (which == "1b" && is_1b) || (which == "8b" && !is_1b)) run_shape(s, n_prompt, n_decode, batch, overlap != 0);
  }
  return 0;
}
