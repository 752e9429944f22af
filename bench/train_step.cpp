// One LoRA (or full-SFT) training micro batch on the CPU: forward, fused LM
// head + cross-entropy and backward of a random-init Llama written to a
// temporary directory, timed over a few passes (best and median). The
// baseline, transformers + PEFT on PyTorch's CPU backend with the same
// shapes, threads and batch, is bench/train_step_torch.py; run both in one
// call and compare tokens/s.
// Usage: bench_train_step [threads] [hidden] [layers] [ffn] [vocab] [batch] [seq] [lora_r|full] [32|bf16-mixed]
//                         [amx-prefetch: the AMX kernel prefetches its A operand | amx-cols: packed GEMMs split
//                          columns over the threads, not rows (set_amx_rows_split) |
//                          amx-emulated: the AMX code with its tile instructions in scalar code (checks, slow) |
//                          group=N[,items]: fused tile groups in chunks of N row pairs [, each item over a
//                          thread's fixed rows before the next] (set_amx_group_schedule) | ce-rows=N: LM head chunk rows]
// Defaults: 2 threads, the 58M-parameter shape (512, 8, 1376, 32000), batch 4 x 256, r 16, precision 32
// (bf16-mixed: the frozen base in bf16, trainer.precision's other value).
// The bf16 GEMM path (amx, avx512bf16 or f32; LATHE_CPU_GEMM forces one) is
// printed with the result.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"
#include "core/parallel.h"
#include "io/safetensors.h"
#include "train/trainable_model.h"

namespace {

using namespace lathe;
using Clock = std::chrono::steady_clock;

int arg(int argc, char** argv, int i, int def) { return argc > i ? std::atoi(argv[i]) : def; }

Tensor random(Shape s, std::mt19937& rng, float scale) {
  Tensor t = Tensor::empty(DType::F32, s);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

void write_model(const std::string& dir, int H, int L, int F, int V) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": " << H
      << ", \"intermediate_size\": " << F << ", \"num_hidden_layers\": " << L
      << ", \"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"vocab_size\": " << V
      << ", \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
         "\"max_position_embeddings\": 4096, \"hidden_act\": \"silu\", \"torch_dtype\": \"float32\"}\n";
  std::mt19937 rng(7);
  std::vector<std::pair<std::string, Tensor>> w;
  w.emplace_back("model.embed_tokens.weight", random({V, H}, rng, 0.02f));
  for (int i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"})
      w.emplace_back(p + n + ".weight", random({H, H}, rng, 0.02f));
    w.emplace_back(p + "mlp.gate_proj.weight", random({F, H}, rng, 0.02f));
    w.emplace_back(p + "mlp.up_proj.weight", random({F, H}, rng, 0.02f));
    w.emplace_back(p + "mlp.down_proj.weight", random({H, F}, rng, 0.02f));
    Tensor ones = Tensor::empty(DType::F32, {H});
    std::fill(ones.data<float>(), ones.data<float>() + H, 1.0f);
    w.emplace_back(p + "input_layernorm.weight", ones);
    w.emplace_back(p + "post_attention_layernorm.weight", ones.clone());
  }
  Tensor ones = Tensor::empty(DType::F32, {H});
  std::fill(ones.data<float>(), ones.data<float>() + H, 1.0f);
  w.emplace_back("model.norm.weight", ones);
  w.emplace_back("lm_head.weight", random({V, H}, rng, 0.02f));
  Status s = write_weights(dir, w);
  if (!s.is_ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = arg(argc, argv, 1, 2), H = arg(argc, argv, 2, 512), L = arg(argc, argv, 3, 8);
  const int F = arg(argc, argv, 4, 1376), V = arg(argc, argv, 5, 32000), B = arg(argc, argv, 6, 4);
  const int S = arg(argc, argv, 7, 256);
  const bool full = argc > 8 && std::string(argv[8]) == "full";
  const int r = full ? 0 : arg(argc, argv, 8, 16);
  const bool bf16 = argc > 9 && std::string(argv[9]) == "bf16-mixed";
  set_num_threads(threads);
  const bool prefetch = argc > 10 && std::string(argv[10]) == "amx-prefetch";
  const bool rows_split = !(argc > 10 && std::string(argv[10]) == "amx-cols");
  cpu::set_amx_rows_split(rows_split);
  const int64_t ce_rows = argc > 10 && std::string(argv[10]).rfind("ce-rows=", 0) == 0 ? std::atol(argv[10] + 8) : 0;
  if (prefetch && cpu::amx_bf16_available()) cpu::set_amx_prefetch(true);
  if (argc > 10 && std::string(argv[10]) == "amx-emulated") cpu::set_amx_emulation(true);
  const std::string group_opt = argc > 10 && std::string(argv[10]).rfind("group=", 0) == 0 ? argv[10] + 6 : "";
  if (!group_opt.empty())  // group=N[,items]: fused groups in chunks of N row pairs [, items outermost]
    cpu::set_amx_group_schedule(std::atoi(group_opt.c_str()), group_opt.find("items") != std::string::npos);
  const std::string dir = (std::filesystem::temp_directory_path() / "lathe_bench_train_model").string();
  write_model(dir, H, L, F, V);
  TrainableModelOptions opts;
  opts.full_sft = full;
  opts.bf16_base = bf16;
  opts.lora.r = std::max(r, 1);
  opts.lm_head_chunk_rows = ce_rows;
  opts.lora.alpha = 32.0f;  // all seven projections: NeMo's default target_modules
  auto model = TrainableModel::load(dir, opts);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s\n", model.status().message().c_str());
    return 1;
  }
  MicroBatch mb;
  std::mt19937 rng(3);
  mb.cu_seqlens = {0};
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < S; ++j) {
      mb.input_ids.push_back(int32_t(rng() % uint32_t(V)));
      mb.position_ids.push_back(j);
    }
    mb.cu_seqlens.push_back(int32_t(mb.input_ids.size()));
  }
  for (size_t i = 0; i < mb.input_ids.size(); ++i) {
    const bool last = std::find(mb.cu_seqlens.begin(), mb.cu_seqlens.end(), int32_t(i + 1)) != mb.cu_seqlens.end();
    mb.labels.push_back(last ? kIgnoreIndex : mb.input_ids[i + 1]);
  }
  std::vector<double> times;
  double mean_loss = 0;
  for (int rep = 0; rep < 6; ++rep) {
    if (rep == 1) (*model)->set_phase_timing(true);  // the counted passes only
    auto t0 = Clock::now();
    auto loss = (*model)->forward_backward(mb, 1.0f / float(B * (S - 1)));
    if (!loss.is_ok()) {
      std::fprintf(stderr, "%s\n", loss.status().message().c_str());
      return 1;
    }
    if (rep > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    mean_loss = loss->loss_sum / double(std::max<int64_t>(loss->n_supervised, 1));
  }
  std::sort(times.begin(), times.end());
  const double tokens = double(B) * S;
  const char* kPathNames[] = {"f32", "avx512bf16", "amx"};
  const std::string precision =
      bf16 ? std::string("bf16-mixed (") + kPathNames[int(cpu::bf16_gemm_path())] +
                 (prefetch ? "+prefetch" : "") + (rows_split ? "" : ", columns split") +
                 (group_opt.empty() ? "" : ", group=" + group_opt) + " GEMM" +
                 (ce_rows > 0 ? ", LM head chunks of " + std::to_string(ce_rows) : std::string()) + ")"
           : "32";
  std::printf("| lathe %s %s | %d threads | %dx%d tokens | best %.3f s | median %.3f s | %.0f tokens/s | act %.0f MiB |\n",
              full ? "full SFT" : ("LoRA r=" + std::to_string(r)).c_str(), precision.c_str(), threads, B,
              S, times.front(),
              times[times.size() / 2], tokens / times[times.size() / 2],
              double((*model)->activation_bytes()) / (1 << 20));
  std::printf("|   loss %.4f (the same micro batch each pass; ln(vocab) %.4f) | where a pass goes (mean of %zu):",
              mean_loss, std::log(double(V)), times.size());
  for (const auto& [name, sec] : (*model)->phase_seconds())
    std::printf(" %s %.3f s |", name.c_str(), sec / double(times.size()));
  std::printf("\n");
  std::filesystem::remove_all(dir);
  return 0;
}
