// LoRA SFT throughput on one GPU at Llama-3.2-1B and Llama-3.1-8B shapes:
// random bf16 weights made on the device side (no weight files), LoRA on all
// seven projections, random token rows of one full-length document each
// (what the Hugging Face baseline in train_cuda_hf.py feeds), one optimizer
// step per micro batch (clip + AdamW). Prints tokens/s, step time, device
// memory in use (everything is allocated up front, so this is the peak),
// model FLOP/s (forward + input gradients of the frozen base, the LM head,
// causal attention forward and backward, LoRA; recomputation not counted)
// and its fraction of the 810 TFLOP/s bf16 GEMM peak. With --profile 1 (the
// default) two more steps run with the model's phase timer on, and a second
// table gives each phase's milliseconds per step (CUDA events between phase
// changes; those steps are not in the throughput figures). The phases time
// the main stream: with the LoRA gradients on their side stream (the
// default; LATHE_CUDA_LORA_OVERLAP=0 turns it off) "LoRA" is the LoRA work
// left on the main stream plus its waits for the side, and the side's
// kernels show only as far as they slow what the main stream runs.
//
// Usage: bench_train_cuda [--shape 1b|8b|all] [--micro-batch N] [--seq N]
//                         [--steps N] [--warmup N] [--recompute none|selective|full] [--r N]
//                         [--arena-gib X] [--profile 0|1] [--full 0|1] [--dropout P] [--plan 1]
//                         [--offload N]
// Defaults: every shape at its issue batch (1B: 8, 8B: 4), seq 2048, r 32,
// 10 timed steps after 3 warm-up steps, recomputation none for 1B and
// selective for 8B (--recompute 0 / 1 mean none / full). --arena-gib is
// selective's budget: layers keep q/k/v and h_mid (no GEMM reruns) while
// the arena stays within it; 8B's default leaves the optimizer's moments
// and the CUDA context room under a 40 GB (37.25 GiB) device peak.
// --full 1 trains every weight instead of LoRA (full SFT: f32 masters,
// gradients and moments; the model FLOPs add the weight gradients, 8B does
// not fit one H200 and is refused with the memory it needs). --dropout P
// runs LoRA dropout p (masks regenerated in each pass; not counted in the
// model FLOPs). --plan 1 prints the arena's plan by item instead (no
// device needed: what each buffer takes and how many layers keep q/k/v).
// --offload N puts N layers' [gate | up] in pinned host memory between the
// forward and the backward (CudaTrainOptions::offload_layers; default −1:
// as many as let the most layers keep q/k/v within the budget, 0: none).
// The trainer's memory switches (docs/gpu.md) are read from the
// environment: LATHE_CUDA_HOST_EMBED=0 keeps the embedding on the device,
// LATHE_CUDA_ACT_FROM_BWD=0 reruns SwiGLU's forward for down's LoRA.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if LATHE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "backends/cuda/device.h"
#include "train/cuda_model.h"

namespace {

using namespace lathe;

constexpr double kArenaGib8b = 35.9;

struct BenchShape {
  const char* name;
  int64_t vocab, hidden, inter, layers, heads, kv, head_dim;
  bool tied;
  int64_t micro_batch;
  CudaRecompute recompute;
  double arena_gib;  // selective's arena budget (CudaTrainOptions::max_arena_bytes); 0: none
};

const BenchShape kShapes[] = {
    {"llama-3.2-1b", 128256, 2048, 8192, 16, 32, 8, 64, true, 8, CudaRecompute::kNone, 0.0},
    {"llama-3.1-8b", 128256, 4096, 14336, 32, 32, 8, 128, false, 4, CudaRecompute::kSelective, kArenaGib8b},
};

struct Args {
  std::string shape = "all";
  int64_t micro_batch = 0, seq = 2048, steps = 10, warmup = 3, r = 32;
  std::string recompute;  // empty: the shape's default
  double arena_gib = -1;  // < 0: the shape's default
  int profile = 1;
  int full = 0;
  float dropout = 0.0f;
  int plan = 0;
  int64_t offload = -1;  // CudaTrainOptions::offload_layers
};

double model_flops_per_token(const BenchShape& s, int64_t seq, int64_t r, bool full) {
  const double H = double(s.hidden), F = double(s.inter), qd = double(s.heads * s.head_dim);
  const double kvd = double(s.kv * s.head_dim);
  const double lin = 2.0 * (H * qd + 2 * H * kvd + qd * H + 3 * H * F);
  const double lora = 2.0 * double(r) * ((H + qd) + 2 * (H + kvd) + (qd + H) + 2 * (H + F) + (F + H));
  const double attn = 2.0 * double(seq) * qd;  // causal: QKᵀ and PV over seq/2 keys on average
  const double head = 2.0 * double(s.vocab) * H;
  if (full) return double(s.layers) * (3 * lin + 3.5 * attn) + 3 * head;  // + weight gradients, no LoRA
  const double per_layer = 2 * lin + 3 * lora + 3.5 * attn;  // forward + input grads; LoRA 3×; flash bwd 2.5×
  return double(s.layers) * per_layer + 2 * head;
}

MicroBatch random_rows(int64_t rows, int64_t seq, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  MicroBatch mb;
  mb.n_rows = int32_t(rows);
  mb.cu_seqlens = {0};
  mb.row_starts = {0};
  for (int64_t b = 0; b < rows; ++b) {
    const size_t first = mb.input_ids.size();
    for (int64_t j = 0; j < seq; ++j) {
      mb.input_ids.push_back(int32_t(rng() % uint64_t(vocab)));
      mb.position_ids.push_back(int32_t(j));
    }
    for (int64_t j = 0; j < seq; ++j) mb.labels.push_back(j + 1 < seq ? mb.input_ids[first + size_t(j) + 1] : -100);
    mb.n_supervised += seq - 1;
    mb.cu_seqlens.push_back(int32_t(mb.input_ids.size()));
    mb.row_starts.push_back(int32_t(mb.input_ids.size()));
  }
  mb.max_seqlen = int32_t(seq);
  return mb;
}

double used_gib() {
#if LATHE_HAVE_CUDA
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return -1;
  return double(total_b - free_b) / double(1ull << 30);
#else
  return -1;
#endif
}

// Two steps under the phase timer; prints ms per step of each phase.
template <class Step>
int profile_phases(const BenchShape& s, CudaTrainableModel& m, Step& step) {
  constexpr int kSteps = 2;
  Status st = m.set_phase_timing(true);
  for (int i = 0; st.is_ok() && i < kSteps; ++i) st = step();
  auto times = st.is_ok() ? m.phase_times_ms() : Result<std::vector<std::pair<std::string, double>>>(st);
  (void)m.set_phase_timing(false);
  if (!times.is_ok()) {
    std::fprintf(stderr, "%s: phase timing: %s\n", s.name, times.status().message().c_str());
    return 1;
  }
  double total = 0;
  for (const auto& [name, ms] : *times) total += ms;
  std::printf("\n%s, ms per step by phase (%d steps under the timer):\n\n| phase | ms | share |\n|---|---|---|\n",
              s.name, kSteps);
  for (const auto& [name, ms] : *times)
    std::printf("| %s | %.2f | %.1f%% |\n", name.c_str(), ms / kSteps, total > 0 ? 100.0 * ms / total : 0.0);
  std::printf("| total | %.2f | |\n\n", total / kSteps);
  std::fflush(stdout);
  return 0;
}

// The arena create() would allocate, by item (MiB), and the layers it keeps.
int print_plan(const BenchShape& s, const CudaModelShape& shape, const CudaTrainOptions& opt) {
  auto plan = CudaTrainableModel::plan_arena(shape, opt);
  if (!plan.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, plan.status().message().c_str());
    return 1;
  }
  constexpr double kMiB = double(1 << 20);
  std::printf("\n%s arena plan: %.2f GiB (+ %.2f GiB optimizer moments beside it), %lld layers keep q/k/v, h_mid, "
              "%lld layers' gate|up in host memory\n\n",
              s.name, double(plan->bytes) / (kMiB * 1024), double(plan->optimizer_bytes) / (kMiB * 1024),
              (long long)plan->layers_kept, (long long)plan->layers_offloaded);
  std::printf("| item | MiB |\n|---|---|\n");
  for (const auto& [what, bytes] : plan->items) std::printf("| %s | %.1f |\n", what.c_str(), double(bytes) / kMiB);
  std::fflush(stdout);
  return 0;
}

int run_shape(const BenchShape& s, const Args& a) {
  const int64_t mbs = a.micro_batch > 0 ? a.micro_batch : s.micro_batch;
  CudaRecompute recompute = s.recompute;
  if (!a.recompute.empty()) {
    auto r = parse_recompute(a.recompute == "0" ? "none" : a.recompute == "1" ? "full" : a.recompute);
    if (!r.is_ok()) {
      std::fprintf(stderr, "%s\n", r.status().message().c_str());
      return 2;
    }
    recompute = *r;
  }
  const char* const mode_name[] = {"none", "selective", "full"};
  CudaModelShape shape{.vocab = s.vocab, .hidden = s.hidden, .inter = s.inter, .n_layer = s.layers,
                       .n_head = s.heads, .n_kv = s.kv, .head_dim = s.head_dim, .eps = 1e-5f, .tied = s.tied};
  for (int64_t i = 0; i < s.head_dim / 2; ++i)
    shape.inv_freq.push_back(float(std::pow(500000.0, -2.0 * double(i) / double(s.head_dim))));
  const double arena_gib = a.arena_gib >= 0 ? a.arena_gib : s.arena_gib;
  CudaTrainOptions opt{.device = 0, .max_tokens = mbs * a.seq, .max_seqlen = a.seq, .lora_r = int(a.r), .lora_scale = 1.0f,
                       .recompute = recompute, .max_arena_bytes = int64_t(arena_gib * double(1ull << 30)),
                       .offload_layers = a.offload, .full_sft = a.full != 0, .lora_dropout = a.dropout};
  if (a.plan) return print_plan(s, shape, opt);
  auto model = CudaTrainableModel::create(shape, opt);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, model.status().message().c_str());
    return 1;
  }
  CudaTrainableModel& m = **model;
  Status st = m.fill_random(1234);
  MicroBatch mb = random_rows(mbs, a.seq, s.vocab, 42);
  const float scale = 1.0f / float(mb.n_supervised);
  double loss = 0;
  auto step = [&]() -> Status {
    LATHE_TRY(m.zero_grads());
    LATHE_ASSIGN_OR_RETURN(PassLoss l, m.forward_backward(mb, scale));
    loss = l.loss_sum * double(scale);
    LATHE_ASSIGN_OR_RETURN(double norm, m.clip_grad_norm(1.0));
    (void)norm;
    return m.adamw_step(1e-4);
  };
  for (int64_t i = 0; st.is_ok() && i < a.warmup; ++i) st = step();
  if (st.is_ok()) st = m.context().synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; st.is_ok() && i < a.steps; ++i) st = step();
  if (st.is_ok()) st = m.context().synchronize();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, st.message().c_str());
    return 1;
  }
  const double tokens = double(mb.n_tokens()) * double(a.steps);
  const double tps = tokens / dt;
  const double tflops = tps * model_flops_per_token(s, a.seq, a.r, a.full != 0) / 1e12;
  std::printf("| shape | batch x seq | recompute | tokens/s | ms/step | arena GiB | device GiB used | model TFLOP/s | of 810 | loss |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::string mode = std::string(a.full ? "full SFT, " : "") + mode_name[int(recompute)];
  if (a.dropout > 0) mode += ", dropout " + std::to_string(a.dropout).substr(0, 4);
  if (m.layers_kept() > 0) mode += " (" + std::to_string(m.layers_kept()) + " layers keep q/k/v, h_mid)";
  if (m.layers_offloaded() > 0) mode += " (" + std::to_string(m.layers_offloaded()) + " layers' gate|up in host memory)";
  const double used = used_gib();  // the goal's 40 GB are decimal: both units
  std::printf("| %s | %lld x %lld | %s | %.0f | %.1f | %.2f | %.2f (%.2f GB) | %.0f | %.1f%% | %.4f |\n", s.name,
              (long long)mbs, (long long)a.seq, mode.c_str(), tps, 1e3 * dt / double(a.steps),
              double(m.arena_bytes()) / double(1ull << 30), used, used * double(1ull << 30) / 1e9, tflops,
              100.0 * tflops / 810.0, loss);
  std::fflush(stdout);
  if (a.profile) return profile_phases(s, m, step);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--shape") a.shape = v;
    else if (k == "--micro-batch") a.micro_batch = std::atoll(v);
    else if (k == "--seq") a.seq = std::atoll(v);
    else if (k == "--steps") a.steps = std::atoll(v);
    else if (k == "--warmup") a.warmup = std::atoll(v);
    else if (k == "--recompute") a.recompute = v;
    else if (k == "--r") a.r = std::atoll(v);
    else if (k == "--profile") a.profile = std::atoi(v);
    else if (k == "--arena-gib") a.arena_gib = std::atof(v);
    else if (k == "--full") a.full = std::atoi(v);
    else if (k == "--dropout") a.dropout = float(std::atof(v));
    else if (k == "--plan") a.plan = std::atoi(v);
    else if (k == "--offload") a.offload = std::atoll(v);
    else {
      std::fprintf(stderr, "unknown option %s (see the file header)\n", k.c_str());
      return 2;
    }
  }
  if (!a.plan && lathe::cuda::device_count() == 0) {
    std::fprintf(stderr, "bench_train_cuda: no CUDA device visible\n");
    return 1;
  }
  int rc = 0;
  for (const BenchShape& s : kShapes)
    if (a.shape == "all" || (a.shape == "1b" && s.hidden == 2048) || (a.shape == "8b" && s.hidden == 4096))
      rc |= run_shape(s, a);
  return rc;
}
