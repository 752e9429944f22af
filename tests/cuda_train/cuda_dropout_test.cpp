// LoRA dropout on the GPU trainer (train/cuda_model.h): the device's masks
// are the CPU trainer's (the hash ported bit for bit, the seeds derived the
// same way per pass, adapter and element), so a GPU pass and a CPU pass at
// the same pass count compute the same function and their LoRA gradients
// differ by rounding only (the dropout path runs over chunks of tokens; the
// tests run one chunk and several). Covered: the device hash against the host's
// lora_dropout_keep on many indices, seeds and rates; gradients against the
// CPU trainer's f32 ones on two consecutive passes (the masks change from
// pass to pass on both); passes_run() counting forward_backward and
// forward_loss and set_passes_run() replaying a pass's masks; two models
// bit-identical; every recompute mode identical to none; the arena growing
// only with dropout; and a Trainer run on each device counting the same
// passes for its checkpoint. GPU tests skip without a visible GPU.
//
// Tolerances: the bf16 bounds of cuda_train_test.cpp (hf_bf16_check.h:
// each tensor within 2 × the larger of Hugging Face's sdpa and eager bf16
// errors, the median of error / that error at most 1), case "packed/<f>"
// of tests/data/grad_hd64/bf16_error.json, measured WITHOUT dropout. They
// still apply: dropout does not add a rounding point to either pass. The
// GPU's masked input is exact in bf16 (x or 0) and the 1/(1 − p) multiplies
// f32 values (u's sum, dA's sum, the f32 du·A), as the CPU's f32 pass does;
// the bf16 roundings (activations, the base GEMMs' outputs, dx rounded once
// from its f32 sum) are where and how many they are without dropout, on
// inputs of the same size (p = 0.1 zeroes a tenth of an adapter's input and
// scales the rest by 1.11). tools/emulate_cuda_train.py --dropout 0.1
// (the device's roundings on the CPU) measures it: the packed cases' median
// error / HF's is 0.69-0.77 with dropout, 0.74-0.76 without, the largest
// tensor 0.62 of its bound (0.65 without). What differs by more than
// rounding is caught:
// the CPU trainer without dropout, or with the next pass's masks, against
// the CPU trainer with this pass's (checked without a GPU) has a median
// error many times HF's (≥ 10× asserted; 21-34× measured), so a GPU that
// ignored or misdrew the masks fails the median bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/lora_ops.h"
#include "cuda/cuda_test_util.h"
#include "cuda_train/fixture_util.h"
#include "cuda_train/hf_bf16_check.h"
#include "cuda_train/trainer_run.h"
#include "nn/lora.h"
#include "train/cuda_trainable.h"
#include "train/pretokenized_data.h"
#include "train/trainable_model.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers
namespace fs = std::filesystem;

constexpr float kDropout = 0.1f;
const std::string kFix = data_dir() + "/grad_hd64/";

std::unique_ptr<TrainableModel> load_host(const std::string& family, float dropout, bool checkpoint = false) {
  auto m = TrainableModel::load(kFix + family + "/model", {.lora = {.dropout = dropout},
                                                           .adapter_dir = kFix + family + "/adapter",
                                                           .activations_checkpoint = checkpoint});
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<CudaTrainableModel> to_gpu(TrainableModel& host, std::optional<CudaRecompute> mode = std::nullopt,
                                           int64_t max_arena_bytes = 0, int64_t keep_layers = -1) {
  auto g = upload_to_cuda(host, 0, 256, {}, mode, max_arena_bytes, keep_layers);
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return g.is_ok() ? std::move(g).value() : nullptr;
}

HfBf16Bounds packed_bounds(const std::string& family) {
  return {kFix + "bf16_error.json", "packed/" + family};
}

// ---- the mask --------------------------------------------------------------

// x = 1 everywhere, so the masked copy is the mask; rows with a stride on
// both sides, as the trainer reads x inside its x_ext rows; the rows first
// of the input and far into it (indices past 2³²: a chunk of a long batch);
// rows 16-byte aligned (eight columns at a time) and not.
void expect_device_masks_match(int64_t cols, int64_t ld_x, int64_t ld_out) {
  SCOPED_TRACE(::testing::Message() << cols << " columns, ld_x " << ld_x << ", ld_out " << ld_out);
  cuda::CudaContext ctx = cuda::testing::make_context();
  const int64_t rows = 41;
  const std::vector<float> ones(size_t(rows * ld_x), 1.0f);
  cuda::DeviceBuffer x = cuda::testing::upload_bf16(ctx, ones);
  auto out = cuda::DeviceBuffer::alloc(0, size_t(rows * ld_out) * 2);
  ASSERT_TRUE(out.is_ok());
  const uint64_t seeds[] = {0, 1, 0x9E3779B97F4A7C15ull, 0xFFFFFFFFFFFFFFFFull, 1234};
  const float rates[] = {0.0f, 1e-7f, 0.05f, 0.1f, 0.5f, 0.9f, 0.999f};
  for (uint64_t seed : seeds)
    for (float p : rates)
      for (int64_t row0 : {int64_t{0}, int64_t{5000000}}) {
        Status st = cuda::lora_dropout_apply(ctx, {.x = cuda::testing::dptr<cuda::bf16_bits>(x), .ld_x = ld_x,
                                                   .out = cuda::testing::dptr<cuda::bf16_bits>(*out),
                                                   .ld_out = ld_out,
                                                   .rows = rows, .cols = cols, .row0 = row0,
                                                   .mask = {.seed = seed, .p = p}});
        ASSERT_TRUE(st.is_ok()) << st.message();
        const std::vector<float> got = cuda::testing::download_bf16(ctx, *out, rows * ld_out);
        int64_t mismatches = 0, kept = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const bool want = lora_dropout_keep(seed, (row0 + r) * cols + c, p);
            const float g = got[size_t(r * ld_out + c)];
            mismatches += (g == 1.0f) != want || (g != 0.0f && g != 1.0f);
            kept += want;
          }
        EXPECT_EQ(mismatches, 0) << "seed " << seed << " p " << p << " row0 " << row0;
        // The host's draws are what they should be (4σ of a binomial).
        const double n = double(rows * cols), sd = std::sqrt(n * p * (1 - p));
        EXPECT_NEAR(double(kept), n * (1 - p), 4 * sd + 1) << "seed " << seed << " p " << p << " row0 " << row0;
      }
}

TEST(CudaDropoutMask, DeviceHashMatchesTheHost) {
  LATHE_SKIP_WITHOUT_GPU();
  expect_device_masks_match(1000, 1040, 1008);  // eight columns at a time
  expect_device_masks_match(997, 1001, 999);    // one at a time
}

// acc + scale·src where kept (one fused multiply-add), into acc, or as
// bf16 into a strided out (acc then unchanged); rows 16-byte aligned
// (eight columns at a time) and not (one at a time).
TEST(CudaDropoutMask, MaskedAddMatchesTheHost) {
  LATHE_SKIP_WITHOUT_GPU();
  cuda::CudaContext ctx = cuda::testing::make_context();
  const cuda::LoraDropoutMask mask{.seed = 77, .p = 0.3f};
  const float scale = 1.0f / (1.0f - mask.p);
  const int64_t rows = 37, row0 = 3;  // the rows are [3, 3 + rows) of the input
  for (int64_t cols : {200, 203})
    for (bool to_out : {false, true}) {
      SCOPED_TRACE(::testing::Message() << cols << " columns, " << (to_out ? "into out" : "into acc"));
      const int64_t ld_out = cols + 32;
      std::mt19937 rng(3);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> src(size_t(rows * cols)), acc(src.size());
      for (float& v : src) v = dist(rng);
      for (float& v : acc) v = dist(rng);
      cuda::DeviceBuffer s = cuda::testing::upload(ctx, src), a = cuda::testing::upload(ctx, acc);
      auto out = cuda::DeviceBuffer::alloc(0, size_t(rows * ld_out) * 2);
      ASSERT_TRUE(out.is_ok());
      Status st = cuda::lora_dropout_add(
          ctx, {.src = cuda::testing::dptr<float>(s), .acc = cuda::testing::dptr<float>(a), .scale = scale,
                .out = to_out ? cuda::testing::dptr<cuda::bf16_bits>(*out) : nullptr, .ld_out = ld_out, .rows = rows,
                .cols = cols, .row0 = row0, .mask = mask});
      ASSERT_TRUE(st.is_ok()) << st.message();
      const std::vector<float> got_acc = cuda::testing::download<float>(ctx, a, rows * cols);
      const std::vector<float> got_out = cuda::testing::download_bf16(ctx, *out, rows * ld_out);
      int64_t bad = 0;
      for (int64_t i = 0; i < rows * cols; ++i) {
        const bool kept = lora_dropout_keep(mask.seed, row0 * cols + i, mask.p);
        const float want = kept ? std::fma(scale, src[size_t(i)], acc[size_t(i)]) : acc[size_t(i)];
        if (to_out) {
          bad += got_acc[size_t(i)] != acc[size_t(i)];
          bad += got_out[size_t((i / cols) * ld_out + i % cols)] != cuda::testing::round_bf16(want);
        } else {
          bad += got_acc[size_t(i)] != want;
        }
      }
      EXPECT_EQ(bad, 0);
    }
}

// ---- passes against the CPU trainer -------------------------------------------

// Without a GPU: the bounds pass the CPU trainer with dropout against
// itself trivially, and fail the CPU trainer that ignores the masks or
// draws the next pass's: the median bound is what catches a GPU doing so.
TEST(CudaDropoutBounds, FailPassesWithoutTheSameMasks) {
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    auto with = load_host(family, kDropout), without = load_host(family, 0.0f), later = load_host(family, kDropout);
    ASSERT_TRUE(with && without && later);
    later->set_passes_run(1);
    const MicroBatch mb = random_batch(with->config().vocab_size, 17);
    for (TrainableModel* m : {with.get(), without.get(), later.get()})
      ASSERT_TRUE(m->forward_backward(mb, 1.0f / float(mb.n_supervised)).is_ok());
    for (TrainableModel* other : {without.get(), later.get()}) {
      HfBf16Bounds check = packed_bounds(family);
      for (const ParamInfo& p : with->param_table())
        check.record(p.name, rel_error(other->grads().data() + p.offset, with->grads().data() + p.offset, p.numel()));
      const double median = check.median();
      std::printf("%s, %s: median error / HF's bf16 error %.1f\n", family,
                  other == without.get() ? "no dropout" : "the next pass's masks", median);
      EXPECT_GE(median, 10.0) << family;
    }
  }
}

// The GPU's pass against the CPU trainer's on two consecutive passes (each
// with its own masks), then forward_loss, which drops nothing;
// chunk_rows > 0: the dropout path over chunks of that many tokens.
void expect_passes_match_cpu(const std::string& family, int64_t chunk_rows) {
  auto host = load_host(family, kDropout);
  ASSERT_TRUE(host);
  auto gpu = to_gpu(*host);
  ASSERT_TRUE(gpu);
  if (chunk_rows > 0) gpu->set_dropout_chunk_rows(chunk_rows);
  const MicroBatch mb = random_batch(host->config().vocab_size, 17);
  const float scale = 1.0f / float(mb.n_supervised);
  std::vector<float> first;
  double loss = 0;
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(::testing::Message() << family << " pass " << pass << " chunk rows " << chunk_rows);
    EXPECT_EQ(gpu->passes_run(), uint64_t(pass));
    host->zero_grads();
    ASSERT_TRUE(gpu->zero_grads().is_ok());
    auto lc = host->forward_backward(mb, scale);
    auto lg = gpu->forward_backward(mb, scale);
    ASSERT_TRUE(lc.is_ok() && lg.is_ok()) << lc.status().message() << lg.status().message();
    HfBf16Bounds check = packed_bounds(family);
    check.expect("loss", std::abs(lg->loss_sum - lc->loss_sum) / lc->loss_sum);
    const std::vector<float> g = grads_of(*gpu);
    for (const ParamInfo& p : host->param_table())
      check.expect(p.name, rel_error(g.data() + p.offset, host->grads().data() + p.offset, p.numel()));
    check.expect_median();
    if (pass == 0) first = g;
    else EXPECT_NE(g, first) << "the second pass drew the first pass's masks";
    loss = lg->loss_sum;
  }
  EXPECT_EQ(gpu->passes_run(), 2u);
  const std::vector<float> g = grads_of(*gpu);
  // Evaluation runs the adapters whole: the same loss whatever the pass
  // index, not the training pass's; it counts as a pass and leaves the
  // gradients alone.
  gpu->set_passes_run(1);
  auto lf = gpu->forward_loss(mb);
  ASSERT_TRUE(lf.is_ok()) << lf.status().message();
  EXPECT_NE(lf->loss_sum, loss);
  EXPECT_EQ(gpu->passes_run(), 2u);
  EXPECT_EQ(grads_of(*gpu), g);
  auto next = gpu->forward_loss(mb);
  ASSERT_TRUE(next.is_ok());
  EXPECT_EQ(next->loss_sum, lf->loss_sum);
}

class CudaDropout : public ::testing::TestWithParam<const char*> {};

// The batch's 107 tokens in one chunk, and in chunks of 40 (two full, one
// partial: the masks' row offsets and dA summed over chunks).
TEST_P(CudaDropout, GradientsMatchTheCpuTrainer) {
  SKIP_WITHOUT_GPU();
  expect_passes_match_cpu(GetParam(), 0);
  expect_passes_match_cpu(GetParam(), 40);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaDropout, ::testing::Values("llama", "qwen2", "qwen3"));

// ---- determinism and recomputation ---------------------------------------------

void expect_identical_passes(CudaTrainableModel& a, CudaTrainableModel& b, const MicroBatch& mb) {
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_TRUE(a.zero_grads().is_ok() && b.zero_grads().is_ok());
    auto la = a.forward_backward(mb, 0.01f), lb = b.forward_backward(mb, 0.01f);
    ASSERT_TRUE(la.is_ok() && lb.is_ok()) << la.status().message() << lb.status().message();
    EXPECT_EQ(la->loss_sum, lb->loss_sum) << "pass " << pass;
    EXPECT_EQ(grads_of(a), grads_of(b)) << "pass " << pass;
  }
}

TEST(CudaDropoutRuns, TwoModelsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  auto host = load_host("llama", kDropout);
  ASSERT_TRUE(host);
  for (int64_t chunk : {0, 40}) {
    SCOPED_TRACE(::testing::Message() << "chunk rows " << chunk);
    auto a = to_gpu(*host), b = to_gpu(*host);
    ASSERT_TRUE(a && b);
    if (chunk) a->set_dropout_chunk_rows(chunk), b->set_dropout_chunk_rows(chunk);
    expect_identical_passes(*a, *b, random_batch(host->config().vocab_size, 23));
  }
}

// An evaluation pass (no backward) runs the adapters whole, as PEFT's eval
// mode does: the same loss, bit for bit, as a model without dropout; it
// still counts as a pass. A training pass drops.
TEST(CudaDropoutRuns, EvaluationDoesNotDrop) {
  SKIP_WITHOUT_GPU();
  auto drop_host = load_host("llama", kDropout), none_host = load_host("llama", 0.0f);
  ASSERT_TRUE(drop_host && none_host);
  auto drop = to_gpu(*drop_host), none = to_gpu(*none_host);
  ASSERT_TRUE(drop && none);
  const MicroBatch mb = random_batch(drop_host->config().vocab_size, 29);
  auto e1 = drop->forward_loss(mb), e0 = none->forward_loss(mb);
  ASSERT_TRUE(e1.is_ok() && e0.is_ok());
  EXPECT_EQ(e1->loss_sum, e0->loss_sum);
  EXPECT_EQ(drop->passes_run(), 1u);
  auto t1 = drop->forward_backward(mb, 0.01f), t0 = none->forward_backward(mb, 0.01f);
  ASSERT_TRUE(t1.is_ok() && t0.is_ok());
  EXPECT_NE(t1->loss_sum, t0->loss_sum);
}

// Every recompute mode regenerates the masks it needs: selective, full and
// selective keeping some layers give what keeping everything gives, bit for
// bit (Qwen2: fused q|k|v bias; Qwen3: q/k norms); the dropout path in one
// chunk and in chunks of 40 tokens.
class CudaDropoutRecompute : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaDropoutRecompute, ChangesNothing) {
  SKIP_WITHOUT_GPU();
  auto host = load_host(GetParam(), kDropout);
  ASSERT_TRUE(host);
  const MicroBatch mb = random_batch(host->config().vocab_size, 5);
  struct Mode {
    const char* name;
    CudaRecompute mode;
    int64_t budget, keep;
  };
  for (const Mode& m : {Mode{"selective", CudaRecompute::kSelective, 0, -1},
                        Mode{"full", CudaRecompute::kFull, 0, -1},
                        Mode{"selective keeping every layer", CudaRecompute::kSelective, int64_t{1} << 40, -1},
                        Mode{"selective keeping one layer", CudaRecompute::kSelective, 0, 1}}) {
    for (int64_t chunk : {0, 40}) {
      SCOPED_TRACE(::testing::Message() << m.name << ", chunk rows " << chunk);
      auto keep = to_gpu(*host, CudaRecompute::kNone), redo = to_gpu(*host, m.mode, m.budget, m.keep);
      ASSERT_TRUE(keep && redo);
      if (chunk) keep->set_dropout_chunk_rows(chunk), redo->set_dropout_chunk_rows(chunk);
      expect_identical_passes(*keep, *redo, mb);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaDropoutRecompute, ::testing::Values("qwen2", "qwen3"));

// ---- memory --------------------------------------------------------------------

// No device: at Llama-3.1-8B's shape (micro batch 4 x 2048, r 32) dropout
// adds at most its two 64 MiB f32 buffers (chunks of tokens at the widest
// LoRA input, down's) to each recompute mode's plan, and full SFT, which
// has no adapters, nothing.
TEST(CudaDropoutPlan, GrowsOnlyWithDropout) {
  CudaModelShape shape{.vocab = 128256, .hidden = 4096, .inter = 14336, .n_layer = 32, .n_head = 32, .n_kv = 8,
                       .head_dim = 128, .eps = 1e-5f};
  shape.inv_freq.assign(64, 1.0f);
  const int64_t T = 8192, extra = 2 * 4 * (int64_t{1} << 24);
  auto bytes = [&](CudaRecompute mode, float p, bool full) {
    CudaTrainOptions o{.max_tokens = T, .lora_r = 32, .recompute = mode, .full_sft = full, .lora_dropout = p};
    auto plan = CudaTrainableModel::plan_arena(shape, o);
    EXPECT_TRUE(plan.is_ok()) << plan.status().message();
    return plan.is_ok() ? plan->bytes : 0;
  };
  for (CudaRecompute mode : {CudaRecompute::kNone, CudaRecompute::kSelective, CudaRecompute::kFull}) {
    const int64_t off = bytes(mode, 0.0f, false), on = bytes(mode, kDropout, false);
    EXPECT_GE(on, off);
    EXPECT_LE(on - off, extra + 1024);
    std::printf("8B arena GiB without / with dropout: %.2f / %.2f\n", double(off) / (1 << 30), double(on) / (1 << 30));
  }
  EXPECT_EQ(bytes(CudaRecompute::kNone, kDropout, true), bytes(CudaRecompute::kNone, 0.0f, true));
  CudaTrainOptions bad{.max_tokens = T, .lora_dropout = 1.0f};
  auto refused = CudaTrainableModel::plan_arena(shape, bad);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("dropout"), std::string::npos) << refused.status().message();
}

// ---- through the Trainer -------------------------------------------------------

// The dropout stream position a run's last checkpoint saved.
uint64_t saved_passes(const fs::path& run) {
  for (const auto& e : fs::directory_iterator(run / "checkpoints")) {
    if (e.path().filename().string().rfind("step=000006", 0) != 0) continue;
    std::ifstream f(e.path() / "trainer_state.json");
    auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_object()) return j["rng"]["dropout_passes"].get<uint64_t>();
  }
  ADD_FAILURE() << "no readable step-6 checkpoint under " << run;
  return 0;
}

// Six steps of two micro batches with validation every two steps, on each
// device: the same number of passes (training and validation) saved in the
// checkpoint, and the GPU's loss starting where the CPU's does and falling
// about as far (cuda_trainer_test.cpp's checks).
TEST(CudaDropoutRuns, TrainerCountsPassesAsTheCpuDoes) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = fs::path(::testing::TempDir()) / "cuda_dropout_run";
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  std::ofstream(dir / "data" / "training.jsonl") << pretokenized_jsonl(8, 0);
  std::ofstream(dir / "data" / "validation.jsonl") << pretokenized_jsonl(3, 1);
  std::vector<std::vector<double>> losses;
  for (const char* device : {"cpu", "cuda"})
    losses.push_back(trainer_losses(kFix + "llama/model", dir / "data", dir / device, device,
                                    {"peft.dim=8", "peft.alpha=16", "peft.dropout=0.1", "trainer.max_steps=6",
                                     "trainer.val_check_interval=2", "data.seq_length=64", "data.micro_batch_size=2",
                                     "data.global_batch_size=4", "optim.lr=0.01", "optim.sched.warmup_steps=0"}));
  ASSERT_EQ(losses[0].size(), 6u);
  ASSERT_EQ(losses[1].size(), 6u);
  const std::vector<double>&cpu_loss = losses[0], &gpu_loss = losses[1];
  EXPECT_LE(std::abs(gpu_loss.front() - cpu_loss.front()) / cpu_loss.front(), 0.01);
  EXPECT_GE(gpu_loss.front() - gpu_loss.back(), 0.8 * (cpu_loss.front() - cpu_loss.back()))
      << "cpu " << cpu_loss.front() << " -> " << cpu_loss.back() << ", gpu " << gpu_loss.front() << " -> "
      << gpu_loss.back();
  const uint64_t cpu = saved_passes(dir / "cpu"), gpu = saved_passes(dir / "cuda");
  EXPECT_GT(cpu, 12u);  // 6 steps x 2 micro batches, and the validations'
  EXPECT_EQ(gpu, cpu);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lathe
