// Generation on one GPU at Llama-3.2-1B and Llama-3.1-8B shapes with random
// bf16 weights made on the device: prefill tokens/s over a prompt, and
// decode tokens/s of B sequences at once (every sequence gets the same
// prompt, then one token each per step, greedy on the device) with and
// without CUDA graphs, each beside its floor: decode against the
// memory-bandwidth floor (every weight read once per step plus each
// sequence's KV cache, at the measured ~4.3 TB/s of the H200; tokens/s
// counts all B sequences), prefill against the bf16 GEMM peak
// (~810 TFLOP/s through cuBLASLt). A decode step is 5·n_layer + 2 kernels
// (cuda_causal_lm.cpp) plus the greedy pick. Decode runs as `lathe
// generate` does (start_decode / next_tokens: each step's picks feed the
// next step on the device, steps queued ahead of the host); the row also
// shows the host-fed loop (a decode_batch_greedy() call per step, the ids
// up and down each step). The baseline, transformers generate on the same
// machine, is bench/generate_hf.py (same --batch).
//
//   bench_generate_cuda [--shape 1b|8b|all] [--prompt 512] [--decode 256] [--batch 1] [--overlap 1] [--kernels 1]
//                       [--persistent 1] [--registers 0] [--bulk 0] [--ring-kib 0] [--ring-per-sm 0]
//                       [--attn-chunk 0] [--split-k-attention 0] [--ab 1] [--ab-filter TEXT] [--chain 0]
//
// --chain 1 runs only a diagnostic: layers of the shape's four decode GEMVs
// (one x row, f32 out) streamed by one persistent ring kernel
// (launch_gemv_chain), plain and with a grid barrier before each GEMV's
// products (as a persistent decode step needs), at 2 blocks per SM
// and 96 KiB and at 1 with 224 KiB, each with the producers' units in
// flight unbounded and at 1, 2, 3 and 5 (GemvChain::in_flight), beside the same GEMVs as one
// ring kernel each (2 per SM, and 1 per SM with rings small enough for the
// next kernel's block to be resident beside): what kernel boundaries and
// barriers cost the stream. --ab-filter runs only the A/B cases whose name
// holds TEXT.
// --overlap 0 launches the decode kernels the ordinary way rather than as
// programmatic dependent launches (to measure what the overlap gains).
// --persistent 0 turns off the persistent GEMV grids cuda_decode_shapes()
// picks (CudaModelOptions::persistent_gemv). --registers 1 runs the decode
// GEMVs on kCudaDecodeRegisterShapes (the grids before the shared-memory
// ring); --bulk 1 every one on the ring with --ring-kib KiB and
// --ring-per-sm blocks per SM (0: cuda_decode_shapes()' values);
// --attn-chunk N the split-K decode attention with chunks of at least N
// keys; --split-k-attention 1 the step on it (not the cluster kernel). Up
// to 4 sequences (unless --ab 0) each shape's row is followed by the A/B line: the same
// model's decode with the split-K attention instead of the cluster
// kernel, the cluster kernel at 4, 2 and 1 query heads per block, every
// GEMV on the ring of 96 and of 64 KiB (two blocks per SM), and on
// kCudaDecodeRegisterShapes; without and with the L2 prefetch of each
// GEMV's successor (CudaModelOptions::l2_prefetch_units: 1, 3, all units;
// 3 but not from q|k|v), the ring GEMVs at the largest shared-memory
// carveout, the ring filled at once (GemvArgs::ring_fill_at_once), its
// producers at 0 (the whole ring), 1 and 3 units in flight (GemvArgs::ring_in_flight), and the
// 64 KiB ring with the largest carveout (without and with the prefetch).
// LATHE_CUDA_DECODE_L2_PREFETCH sets the prefetch of the main row and of
// the A/B cases that do not name one. From 2 sequences on (unless --ab 0)
// the row is also followed by the decode with the projections on the GEMVs
// (CudaModelOptions::cublas_decode_rows 0) and through cuBLASLt (2), twice
// each, alternating. The kernel table and --chain live in
// generate_cuda_kernels.cpp.
// After each shape's row, unless --kernels 0, a table of the decode step's
// kernels one at a time at that shape and batch: each skinny GEMM (with
// the epilogue and fused norm the decode step gives it) and the attention
// at the mean context (split-K and cluster kernels), timed as a CUDA graph of back-to-back calls (each
// call on its own copy of the weights, so nothing is served from L2), in
// GB/s of weights (K/V for attention) beside the ~4.3 TB/s floor; whole
// layers chained as the step runs them (q|k|v, attention, o, gate|up,
// down: what the boundaries cost) with cuda_decode_shapes() (also with the
// L2 prefetch and the largest carveout) and on the ring;
// and the step the per-step kernels add up to, beside the one measured.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "generate_cuda.h"
#include "models/cuda_causal_lm.h"
#include "models/family.h"

namespace {

using namespace lathe::bench_generate;
using lathe::CudaCausalLM;
using lathe::ModelConfig;
using Clock = std::chrono::steady_clock;

constexpr double kBandwidth = 4.3e12;  // bytes/s, device-to-device copy measured on the H200
constexpr double kGemmPeak = 810e12;   // bf16 FLOP/s through cuBLASLt on the H200

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

// fed: decode through start_decode() / next_tokens() (each step's picks feed
// the next on the device, steps queued ahead of the host: what `lathe
// generate` runs); otherwise a decode_batch_greedy() call per step (the ids
// come to the host and go back up each step).
Timing time_model(CudaCausalLM& m, const std::vector<int32_t>& prompt, int n_decode, int batch, bool graphs,
                  int reps, bool fed = true) {
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
    lathe::Status st = fed ? m.start_decode(cur, n_decode) : lathe::Status::ok();
    for (int i = 0; i < n_decode && st.is_ok(); ++i) {
      st = fed ? m.next_tokens(next) : m.decode_batch_greedy(cur, next);
      cur.swap(next);
    }
    if (!st.is_ok()) {
      std::fprintf(stderr, "decode: %s\n", st.message().c_str());
      return t;
    }
    t.decode_s = std::min(t.decode_s, seconds_since(t1));
    m.stop_decode();
  }
  return t;
}

double run_shape(const Shape& s, int n_prompt, int n_decode, int batch, bool overlap, const StepGemvs& step, bool ab,
                 const std::string& ab_filter) {
  auto header = lathe::model_header_from_config(s.cfg, s.name);
  if (!header.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, header.status().message().c_str());
    return 0.0;
  }
  lathe::CudaModelOptions opts{.max_seq = n_prompt + n_decode + 1, .max_forward_tokens = n_prompt, .max_batch = batch,
                               .overlap_launches = overlap, .persistent_gemv = step.persistent,
                               .register_gemv = step.registers, .bulk_gemv = step.bulk,
                               .bulk_ring_kib = step.ring_kib, .bulk_per_sm = step.per_sm,
                               .attention_min_chunk = step.attention_min_chunk,
                               .split_k_attention = step.split_k_attention};
  auto model = CudaCausalLM::random(*header, opts, /*seed=*/1);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, model.status().message().c_str());
    return 0.0;
  }
  CudaCausalLM& m = **model;
  const std::vector<int32_t> prompt = prompt_ids(n_prompt, s.cfg.vocab_size);
  const Timing eager = time_model(m, prompt, n_decode, batch, /*graphs=*/false, 2);
  const Timing graph = time_model(m, prompt, n_decode, batch, /*graphs=*/true, 3);
  const Timing host_fed = time_model(m, prompt, n_decode, batch, /*graphs=*/true, 3, /*fed=*/false);
  const double params = double(m.n_params());
  const double prefill_flops = 2.0 * params * n_prompt;
  const double bytes = decode_bytes(s.cfg, m.n_params(), n_prompt + n_decode / 2.0, batch);
  const double floor_tps = batch * kBandwidth / bytes;
  const double tps_graph = double(batch) * n_decode / graph.decode_s;
  const double tps_eager = double(batch) * n_decode / eager.decode_s;
  const double tps_host = double(batch) * n_decode / host_fed.decode_s;
  std::printf("| %s | %.2fB | %d | %d | %.0f | %.0f%% | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n", s.name,
              params / 1e9, batch, n_prompt, n_prompt / graph.prefill_s,
              100.0 * prefill_flops / graph.prefill_s / kGemmPeak, tps_eager, tps_host, tps_graph, floor_tps,
              100.0 * tps_graph / floor_tps);
  // The A/B of the decode GEMVs (up to 4 sequences): the same model with the grids before the ring, and the ring
  // in other sizes.
  if (batch <= 4 && ab) {
    std::printf("  %s decode tok/s (graph)", s.name);
    struct Case {
      const char* name;
      lathe::CudaModelOptions o;
    };
    const Case cases[] = {
        {"split-K attention (the step before the cluster kernel)", {.split_k_attention = true}},
        {"cluster attention, 4 q heads per block", {.attention_cluster_heads = 4}},
        {"cluster attention, 2 q heads per block", {.attention_cluster_heads = 2}},
        {"cluster attention, 1 q head per block", {.attention_cluster_heads = 1}},
        {"ring 96 KiB 2/SM", {.bulk_gemv = true, .bulk_ring_kib = 96, .bulk_per_sm = 2}},
        {"ring 64 KiB 2/SM", {.bulk_gemv = true, .bulk_ring_kib = 64, .bulk_per_sm = 2}},
        {"kCudaDecodeRegisterShapes", {.register_gemv = true}},
        {"no L2 prefetch", {.l2_prefetch_units = 0}},
        {"L2 prefetch 1 unit", {.l2_prefetch_units = 1}},
        {"L2 prefetch 3 units", {.l2_prefetch_units = 3}},
        {"L2 prefetch all", {.l2_prefetch_units = 64}},
        {"L2 prefetch 3 units, not from q|k|v", {.l2_prefetch_units = 3, .l2_prefetch_each = {.qkv = 0}}},
        {"L2 prefetch q|k|v 0, o 1, gate|up 3, down all, LM head all",
         {.l2_prefetch_each = {.qkv = 0, .o = 1, .gate_up = 3, .down = 64, .lm_head = 64}}},
        {"max carveout", {.ring_max_carveout = true}},
        {"ring filled at once (not the first unit alone first)", {.ring_fill_at_once = true}},
        {"ring GEMVs, the first unit alone, then the whole ring in flight (before)", {.ring_in_flight = 0}},
        {"ring GEMVs, 1 unit in flight", {.ring_in_flight = 1}},
        {"ring GEMVs, 3 units in flight", {.ring_in_flight = 3}},
        {"ring 64 KiB 2/SM, max carveout",
         {.bulk_gemv = true, .bulk_ring_kib = 64, .bulk_per_sm = 2, .ring_max_carveout = true}},
        {"ring 64 KiB 2/SM, max carveout, L2 prefetch 3",
         {.bulk_gemv = true, .bulk_ring_kib = 64, .bulk_per_sm = 2, .l2_prefetch_units = 3,
          .ring_max_carveout = true}},
        {"ring 96 KiB 1/SM, max carveout (the next kernel's block beside)",
         {.bulk_gemv = true, .bulk_ring_kib = 96, .bulk_per_sm = 1, .ring_max_carveout = true}},
        {"ring 104 KiB 1/SM, max carveout (the next kernel's block beside)",
         {.bulk_gemv = true, .bulk_ring_kib = 104, .bulk_per_sm = 1, .ring_max_carveout = true}},
        {"ring 104 KiB 1/SM, max carveout, no L2 prefetch",
         {.bulk_gemv = true, .bulk_ring_kib = 104, .bulk_per_sm = 1, .l2_prefetch_units = 0,
          .ring_max_carveout = true}},
        {"ring 112 KiB 1/SM, max carveout (two rings and the attention fill an SM)",
         {.bulk_gemv = true, .bulk_ring_kib = 112, .bulk_per_sm = 1, .ring_max_carveout = true}},
    };
    for (const Case& c : cases) {
      if (!ab_filter.empty() && std::string(c.name).find(ab_filter) == std::string::npos) continue;
      m.set_decode_gemvs(c.o);
      const double tps = double(batch) * n_decode / time_model(m, prompt, n_decode, batch, true, 2).decode_s;
      std::printf(" %s: %.1f (%.0f%%);", c.name, tps, 100.0 * tps / floor_tps);
    }
    std::printf("\n");
    m.set_decode_gemvs(opts);
  }
  if (batch > 1 && ab) {
    // The projections through cuBLASLt against the GEMVs (the ring up to 4 sequences, the tensor cores above).
    lathe::CudaModelOptions gemvs = opts, gemms = opts;
    gemvs.cublas_decode_rows = 0;
    gemms.cublas_decode_rows = 2;
    for (int round = 0; round < 2; ++round) {
      for (const lathe::CudaModelOptions* o : {&gemvs, &gemms}) {
        m.set_decode_gemvs(*o);
        const double tps = double(batch) * n_decode / time_model(m, prompt, n_decode, batch, true, 2).decode_s;
        std::printf("  %s decode tok/s (graph), %s: %.1f (%.0f%%)\n", s.name,
                    o->cublas_decode_rows ? "cuBLASLt projections" : "GEMVs", tps, 100.0 * tps / floor_tps);
      }
    }
    m.set_decode_gemvs(opts);
  }
  std::fflush(stdout);
  return graph.decode_s / n_decode;
}

// --chain: a diagnostic. Layers of the shape's four decode GEMVs (q|k|v,
// o, gate|up, down; one x row, f32 out, copies of the weights through the
// pool) streamed (a) by one persistent ring kernel (launch_gemv_chain) and
// (b) as separate ring kernels with overlapped launches: what a kernel
// boundary costs the stream with nothing else in the step.
}  // namespace

int main(int argc, char** argv) {
  std::string which = "all", ab_filter;
  int n_prompt = 512, n_decode = 256, batch = 1, overlap = 1, kernels = 1, persistent = 1, bulk = 0, ring_kib = 0,
      attn_chunk = 0, ring_per_sm = 0, registers = 0, split_k_attention = 0, ab = 1, chain = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shape")) which = argv[i + 1];
    else if (!std::strcmp(argv[i], "--prompt")) n_prompt = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--decode")) n_decode = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--overlap")) overlap = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kernels")) kernels = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--persistent")) persistent = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bulk")) bulk = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ring-kib")) ring_kib = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ring-per-sm")) ring_per_sm = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--registers")) registers = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--attn-chunk")) attn_chunk = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--split-k-attention")) split_k_attention = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ab")) ab = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ab-filter")) ab_filter = argv[i + 1];
    else if (!std::strcmp(argv[i], "--chain")) chain = std::atoi(argv[i + 1]);
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
  if (chain) {
    for (const Shape& s : shapes)
      if (which == "all" || (which == "1b") == (std::strstr(s.name, "1B") != nullptr)) bench_chain(s);
    return 0;
  }
  std::printf("generation, batch %d, bf16, random weights; decode greedy on the device, 5 kernels per layer + 2 "
              "per step (overlapped launches: %s); tok/s counts all sequences\n", batch, overlap ? "on" : "off");
  std::printf("| shape | params | batch | prompt | prefill tok/s | of GEMM peak | decode tok/s eager | decode tok/s "
              "graph, host-fed | decode tok/s graph | bandwidth floor tok/s | of floor |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  const StepGemvs step{
      .persistent = persistent != 0, .registers = registers != 0, .bulk = bulk != 0, .ring_kib = ring_kib,
      .per_sm = ring_per_sm, .attention_min_chunk = attn_chunk, .split_k_attention = split_k_attention != 0};
  std::vector<std::pair<const Shape*, double>> ran;  // shape, seconds per decode step
  for (const Shape& s : shapes) {
    const bool is_1b = std::strstr(s.name, "1B") != nullptr;
    if (which != "all" && !(which == "1b" && is_1b) && !(which == "8b" && !is_1b)) continue;
    ran.push_back({&s, run_shape(s, n_prompt, n_decode, batch, overlap != 0, step, ab != 0, ab_filter)});
  }
  if (kernels)
    for (const auto& [s, step_s] : ran) bench_kernels(*s, batch, n_prompt + n_decode / 2, overlap != 0, step, step_s);
  return 0;
}
