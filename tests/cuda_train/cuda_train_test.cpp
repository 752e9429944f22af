// The GPU trainer (train/cuda_model.h) against transformers + PEFT and the
// CPU trainer: loss and every LoRA A/B gradient on head_dim-64 Llama, Qwen2
// (q/k/v biases) and Qwen3 (q/k norm, rsLoRA) fixtures made by
// tools/make_cuda_grad_fixtures.py; the CPU and GPU paths on one packed
// batch of three documents; activation recomputation changing nothing; and
// a few AdamW steps whose losses and parameters track the CPU run. Every
// GPU test skips itself without a visible GPU.
//
// Tolerances: tests/data/grad_hd64/bf16_error.json, made by
// tools/bf16_grad_error.py, holds for every LoRA gradient tensor (and the
// loss) of both comparisons how far Hugging Face + PEFT's own bf16 step (base
// in bf16, LoRA kept in f32: the analogue of this trainer's bf16 base and f32
// LoRA masters) is from its f32 step on the same model and batch: "peft/<f>"
// on the fixture batch, "packed/<f>" on random_batch(vocab, 17). Errors are
// max|got − want| / max|want| per tensor, for two equally valid HF bf16 runs:
// sdpa attention ("error") and eager ("eager"). One bf16 run is one draw of
// rounding noise, and the draws spread widely per tensor: HF's eager run is
// 0.07× to 1.76× its sdpa run's error, so a bound of one run's error times a
// small factor fails Hugging Face itself (1.25 × sdpa, this file's earlier
// bound, fails 16 of HF eager's 174 tensors, and 29 the other way round).
// The GPU pass is therefore held to what HF's runs do, per tensor and in
// aggregate (hf_bf16_check.h):
//   - each tensor within kRunSpread = 2 × the larger of HF's two errors (2:
//     the narrowest round factor above HF's largest run-to-run spread);
//   - per case, the median over its tensors of error / that larger error at
//     most 1: typically as accurate as HF's bf16 step (a uniformly sloppier
//     pass fails here first; tools/emulate_cuda_train.py shows the GPU pass
//     with each projection rounded twice failing it on qwen2, median 1.15).
// A missing entry fails. A real bug fails by far: the CPU trainer with the
// fixture's two documents attending to each other is ≥ 5× outside every
// per-tensor bound (9.7× the least) and its median error is 37× HF's or more
// (checked here without a GPU: ≥ 10×). The recomputation switch runs
// the very same kernels on the very same inputs: results must be identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/device.h"
#include "cuda_train/fixture_util.h"
#include "cuda_train/hf_bf16_check.h"
#include "io/safetensors.h"
#include "train/adamw.h"
#include "train/cuda_trainable.h"
#include "train/trainable_model.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers

const std::string kFix = data_dir() + "/grad_hd64/";
// The bf16 bounds of case `name` of bf16_error.json (hf_bf16_check.h).
HfBf16Bounds lora_bounds(const std::string& name) { return {kFix + "bf16_error.json", name}; }

std::unique_ptr<TrainableModel> load_host(const std::string& family, bool checkpoint = false) {
  auto m = TrainableModel::load(kFix + family + "/model",
                                {.adapter_dir = kFix + family + "/adapter", .activations_checkpoint = checkpoint});
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<CudaTrainableModel> to_gpu(TrainableModel& host, int64_t max_tokens = 256) {
  auto g = upload_to_cuda(host, 0, max_tokens, {});
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return g.is_ok() ? std::move(g).value() : nullptr;
}

// The fixture's batch through a GPU copy of the fixture's model: one
// forward + backward at the mean's scale. Null (with a test failure) when a
// step fails.
struct FixturePass {
  std::unique_ptr<TrainableModel> host;
  std::unique_ptr<CudaTrainableModel> gpu;
  std::optional<SafetensorsFile> file;
  MicroBatch mb;
  std::optional<PassLoss> loss;
};

std::unique_ptr<FixturePass> fixture_pass(const std::string& family) {
  auto run = std::make_unique<FixturePass>();
  run->host = load_host(family);
  if (!run->host) return nullptr;
  run->gpu = to_gpu(*run->host);
  if (!run->gpu) return nullptr;
  auto file = SafetensorsFile::open(kFix + family + "/lora_grads.safetensors");
  EXPECT_TRUE(file.is_ok()) << file.status().message();
  if (!file.is_ok()) return nullptr;
  run->file.emplace(std::move(file).value());
  run->mb = fixture_batch(*run->file);
  auto loss = run->gpu->forward_backward(run->mb, 1.0f / float(run->mb.n_supervised));
  EXPECT_TRUE(loss.is_ok()) << loss.status().message();
  if (!loss.is_ok()) return nullptr;
  run->loss = *loss;
  return run;
}

class CudaLoraFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaLoraFixture, LossAndEveryLoraGradientMatchPeft) {
  SKIP_WITHOUT_GPU();
  const std::string family = GetParam();
  auto run = fixture_pass(family);
  ASSERT_TRUE(run);
  auto& [host, gpu, file, mb, loss] = *run;
  EXPECT_EQ(loss->n_supervised, mb.n_supervised);
  const double want = file->tensor("loss").value().data<double>()[0];
  HfBf16Bounds check = lora_bounds("peft/" + family);
  check.expect("loss", std::abs(loss->loss_sum / double(loss->n_supervised) - want) / want);
  std::vector<float> g = grads_of(*gpu);
  int checked = 0;
  for (const SafetensorsEntry& e : file->entries()) {
    if (e.name == "input_ids" || e.name == "labels" || e.name == "lengths" || e.name == "loss") continue;
    const ParamInfo* p = host->find_param(e.name);
    ASSERT_NE(p, nullptr) << e.name;
    Tensor w = file->tensor(e.name).value();
    check.expect(e.name, rel_error(g.data() + p->offset, w.data<float>(), w.numel()));
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 7 * 2);
  check.expect_median();
}

// For tools/emulate_cuda_train.py --gpu-dump: with LATHE_CUDA_TRAIN_DUMP set
// to a folder, writes <folder>/<family>.safetensors holding the fixture
// pass's loss, LoRA gradients and the device buffers it leaves
// (CudaTrainableModel::read_buffer), so the emulation can be compared with
// the device buffer by buffer. Skips otherwise.
TEST_P(CudaLoraFixture, DumpsThePassForTheEmulation) {
  SKIP_WITHOUT_GPU();
  const char* dir = std::getenv("LATHE_CUDA_TRAIN_DUMP");
  if (!dir) GTEST_SKIP() << "set LATHE_CUDA_TRAIN_DUMP to a folder to dump the pass";
  const std::string family = GetParam();
  auto run = fixture_pass(family);
  ASSERT_TRUE(run);
  auto& [host, gpu, file, mb, loss] = *run;
  std::vector<std::pair<std::string, Tensor>> out;
  auto add = [&](const std::string& name, const float* v, int64_t n) {
    Tensor t = Tensor::empty(DType::F32, Shape{n});
    std::copy(v, v + n, t.data<float>());
    out.emplace_back(name, std::move(t));
  };
  const double mean = loss->loss_sum / double(loss->n_supervised);
  const float lf = float(mean);
  add("loss", &lf, 1);
  std::vector<float> g = grads_of(*gpu);
  for (const ParamInfo& p : gpu->param_table()) add("grads." + p.name, g.data() + p.offset, p.numel());
  const int64_t n = mb.n_tokens(), L = host->config().num_hidden_layers;
  std::vector<std::string> names = {"xf", "d_xf", "dh", "dh_bf", "d_xn", "qkv", "dq", "dk", "dv", "d_attn", "act"};
  for (int64_t l = 0; l <= L; ++l) names.push_back("hs." + std::to_string(l));
  for (int64_t l = 0; l < L; ++l)
    for (const char* b : {"xn1", "rstd1", "q", "k", "v", "attn", "lse", "h_mid", "xn2", "rstd2", "gu"})
      names.push_back(std::string(b) + "." + std::to_string(l));
  for (const std::string& b : names) {
    auto v = gpu->read_buffer(b, n);
    ASSERT_TRUE(v.is_ok()) << v.status().message();
    add(b, v->data(), int64_t(v->size()));
  }
  Status st = write_safetensors(std::string(dir) + "/" + family + ".safetensors", out);
  ASSERT_TRUE(st.is_ok()) << st.message();
}

INSTANTIATE_TEST_SUITE_P(Families, CudaLoraFixture, ::testing::Values("llama", "qwen2", "qwen3"));

// Without a GPU: the bounds pass the f32 CPU trainer and fail a real bug.
// The two documents merged into one (the second attends to the first, as a
// packing bug would do) put every gradient ≥ 5× outside its bound and the
// median error ≥ 10× HF's.
TEST_P(CudaLoraFixture, TolerancesPassTheCpuTrainerAndFailABug) {
  const std::string family = GetParam();
  auto file = SafetensorsFile::open(kFix + family + "/lora_grads.safetensors");
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  MicroBatch good = fixture_batch(*file);
  MicroBatch bad = good;
  bad.cu_seqlens = {0, int32_t(bad.input_ids.size())};
  bad.max_seqlen = int32_t(bad.input_ids.size());
  for (size_t j = 0; j < bad.position_ids.size(); ++j) bad.position_ids[j] = int32_t(j);
  for (const MicroBatch* mb : {&good, &bad}) {
    auto host = load_host(family);
    ASSERT_TRUE(host);
    ASSERT_TRUE(host->forward_backward(*mb, 1.0f / float(mb->n_supervised)).is_ok());
    HfBf16Bounds check = lora_bounds("peft/" + family);
    int checked = 0;
    for (const ParamInfo& p : host->param_table()) {
      Tensor w = file->tensor(p.name).value();
      const double err = rel_error(host->grads().data() + p.offset, w.data<float>(), w.numel());
      if (mb == &good) {
        check.expect(p.name, err);
      } else {
        EXPECT_GE(err, 5 * check.bound(p.name)) << family << " " << p.name << " (documents merged)";
        check.record(p.name, err);
      }
      ++checked;
    }
    EXPECT_EQ(checked, 2 * 7 * 2);
    if (mb == &good) check.expect_median();
    else EXPECT_GE(check.median(), 10.0) << family << " (documents merged)";
  }
}

class CudaVsCpu : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaVsCpu, PackedBatchMatchesTheCpuTrainer) {
  SKIP_WITHOUT_GPU();
  const std::string family = GetParam();
  auto host = load_host(family);
  ASSERT_TRUE(host);
  auto gpu = to_gpu(*host);
  ASSERT_TRUE(gpu);
  MicroBatch mb = random_batch(host->config().vocab_size, 17);
  HfBf16Bounds check = lora_bounds("packed/" + family);
  expect_pass_matches_cpu(*host, *gpu, mb, check);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaVsCpu, ::testing::Values("llama", "qwen2", "qwen3"));

// Two GPU models that must compute the same thing: one pass each on the same
// micro batch gives the same loss and the same gradients, bit for bit.
template <class Model>
void expect_identical_passes(Model& a, Model& b, const MicroBatch& mb) {
  auto la = a.forward_backward(mb, 0.01f), lb = b.forward_backward(mb, 0.01f);
  ASSERT_TRUE(la.is_ok() && lb.is_ok());
  EXPECT_EQ(la->loss_sum, lb->loss_sum);
  EXPECT_EQ(grads_of(a), grads_of(b));
}

// Every recompute mode runs the same kernels on the same inputs: selective
// and full give what keeping everything gives, bit for bit (Qwen2: the
// fused q|k|v bias; Qwen3: q/k norms).
class CudaRecomputeModes : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaRecomputeModes, ChangeNothing) {
  SKIP_WITHOUT_GPU();
  auto host = load_host(GetParam());
  ASSERT_TRUE(host);
  MicroBatch mb = random_batch(host->config().vocab_size, 5);
  for (CudaRecompute mode : {CudaRecompute::kSelective, CudaRecompute::kFull}) {
    auto keep = upload_to_cuda(*host, 0, 256, {}, CudaRecompute::kNone);
    auto redo = upload_to_cuda(*host, 0, 256, {}, mode);
    ASSERT_TRUE(keep.is_ok() && redo.is_ok()) << keep.status().message() << redo.status().message();
    SCOPED_TRACE(mode == CudaRecompute::kFull ? "full" : "selective");
    expect_identical_passes(**keep, **redo, mb);
  }
  // Selective with an arena budget (every layer keeps q/k/v and h_mid and
  // reruns just its norms), and with only the first layer keeping them.
  auto plain = upload_to_cuda(*host, 0, 256, {}, CudaRecompute::kSelective);
  auto roomy = upload_to_cuda(*host, 0, 256, {}, CudaRecompute::kSelective, int64_t{1} << 40);
  auto some = upload_to_cuda(*host, 0, 256, {}, CudaRecompute::kSelective, 0, 1);
  ASSERT_TRUE(plain.is_ok() && roomy.is_ok() && some.is_ok());
  const int64_t n_layer = host->config().num_hidden_layers;
  EXPECT_EQ((*plain)->layers_kept(), 0);
  EXPECT_EQ((*roomy)->layers_kept(), n_layer);
  EXPECT_EQ((*some)->layers_kept(), 1);
  EXPECT_GT((*roomy)->arena_bytes(), (*plain)->arena_bytes());
  for (auto* redo : {&*roomy, &*some}) {
    auto keep = upload_to_cuda(*host, 0, 256, {}, CudaRecompute::kNone);
    ASSERT_TRUE(keep.is_ok());
    SCOPED_TRACE(::testing::Message() << "selective keeping " << (*redo)->layers_kept() << " layers");
    expect_identical_passes(**keep, **redo, mb);
  }
  // The host's switch picks full.
  auto host_ckpt = load_host(GetParam(), /*checkpoint=*/true);
  ASSERT_TRUE(host_ckpt);
  auto a = to_gpu(*host), b = to_gpu(*host_ckpt);
  ASSERT_TRUE(a && b);
  expect_identical_passes(*a, *b, mb);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaRecomputeModes, ::testing::Values("qwen2", "qwen3"));

// The arena plan (no device needed) at Llama-3.1-8B's shape, micro batch
// 4 x 2048, r 32: each recompute mode needs less than the one before;
// selective's budget buys layers that keep q/k/v and h_mid, as many as fit
// (with every layer's gate|up on the device: cuda_offload_test.cpp plans
// the offloaded ones).
TEST(CudaTrainer, PlansTheArenaForEachRecomputeMode) {
  CudaModelShape shape{.vocab = 128256, .hidden = 4096, .inter = 14336, .n_layer = 32, .n_head = 32, .n_kv = 8,
                       .head_dim = 128, .eps = 1e-5f};
  shape.inv_freq.assign(64, 1.0f);
  auto plan = [&](CudaRecompute mode, int64_t budget) {
    CudaTrainOptions o{.max_tokens = 8192, .lora_r = 32, .recompute = mode, .max_arena_bytes = budget,
                       .offload_layers = 0};
    auto p = CudaTrainableModel::plan_arena(shape, o);
    EXPECT_TRUE(p.is_ok()) << p.status().message();
    return p.is_ok() ? *p : CudaArenaPlan{};
  };
  const CudaArenaPlan none = plan(CudaRecompute::kNone, 0), sel = plan(CudaRecompute::kSelective, 0);
  const CudaArenaPlan full = plan(CudaRecompute::kFull, 0);
  EXPECT_GT(none.bytes, sel.bytes);
  EXPECT_GT(sel.bytes, full.bytes);
  EXPECT_EQ(sel.layers_kept, 0);
  // A layer that keeps q, k, v (4096 + 2·1024 wide) and h_mid (4096) costs
  // that many bf16 per token (the LoRA u live in the rows of the inputs:
  // q|k|v's in xn1, shared and recomputed; o's in the attention output,
  // which every selective layer keeps).
  const int64_t per_layer = 8192 * (4096 + 2 * 1024 + 4096) * 2;
  const CudaArenaPlan some = plan(CudaRecompute::kSelective, sel.bytes + 5 * per_layer + per_layer / 2);
  EXPECT_EQ(some.layers_kept, 5);
  EXPECT_LE(some.bytes, sel.bytes + 5 * per_layer + per_layer / 2);
  EXPECT_EQ(plan(CudaRecompute::kSelective, none.bytes).layers_kept, 32);
  EXPECT_EQ(plan(CudaRecompute::kSelective, sel.bytes - 1).layers_kept, 0);  // too small: plain selective
  CudaTrainOptions three{.max_tokens = 8192, .lora_r = 32, .recompute = CudaRecompute::kSelective, .keep_layers = 3};
  auto p3 = CudaTrainableModel::plan_arena(shape, three);
  ASSERT_TRUE(p3.is_ok());
  EXPECT_EQ(p3->layers_kept, 3);
  EXPECT_EQ(p3->bytes, sel.bytes + 3 * per_layer);
  std::printf("8B arena GiB: none %.2f, selective %.2f, full %.2f\n", double(none.bytes) / (1 << 30),
              double(sel.bytes) / (1 << 30), double(full.bytes) / (1 << 30));
}

TEST(CudaTrainer, ParsesRecomputeModes) {
  EXPECT_EQ(parse_recompute("none").value(), CudaRecompute::kNone);
  EXPECT_EQ(parse_recompute("selective").value(), CudaRecompute::kSelective);
  EXPECT_EQ(parse_recompute("full").value(), CudaRecompute::kFull);
  auto bad = parse_recompute("some");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'some'"), std::string::npos);
}

TEST(CudaTrainer, HostBaseInBf16UploadsTheSameWeights) {
  SKIP_WITHOUT_GPU();
  // The fixture's weights are bf16 already, so f32 → bf16 on upload and the
  // host's bf16 copy give the same bits: identical passes.
  auto f32_host = load_host("qwen2");
  auto bf16_host = TrainableModel::load(kFix + "qwen2/model", {.adapter_dir = kFix + "qwen2/adapter", .bf16_base = true});
  ASSERT_TRUE(f32_host && bf16_host.is_ok()) << bf16_host.status().message();
  auto a = to_gpu(*f32_host), b = to_gpu(**bf16_host);
  ASSERT_TRUE(a && b);
  MicroBatch mb = random_batch(f32_host->config().vocab_size, 8);
  expect_identical_passes(*a, *b, mb);
}

TEST(CudaTrainer, AdamWStepsTrackTheCpuRun) {
  SKIP_WITHOUT_GPU();
  auto host = load_host("llama");
  ASSERT_TRUE(host);
  auto gpu = to_gpu(*host);
  ASSERT_TRUE(gpu);
  std::vector<AdamWParam> ps;
  for (const ParamInfo& p : host->param_table())
    ps.push_back({.name = p.name, .param = host->params().data() + p.offset, .grad = host->grads().data() + p.offset,
                  .n = p.numel()});
  auto cpu_opt = AdamW::create({}, std::move(ps));
  ASSERT_TRUE(cpu_opt.is_ok()) << cpu_opt.status().message();
  MicroBatch mb = random_batch(host->config().vocab_size, 99);
  const double lr = 1e-2;
  double first = 0, last_cpu = 0, last_gpu = 0;
  track_adamw_steps(*host, *gpu, *cpu_opt, mb, lr, 6, 5 * kTrackLossTol, kTrackGradTol, &first, &last_cpu, &last_gpu);
  (void)last_gpu;
  // The recipe learns: the comparison is not between two flat lines. (Parameters
  // are not compared: Adam moves an element whose gradient is near zero by ±lr
  // whichever side of zero rounding puts it, which the loss barely feels.)
  EXPECT_LT(last_cpu, 0.9 * first);
}

// Steps as the finetune e2e takes them: B starting at zero (a fresh LoRA),
// three micro batches accumulated per step, clipping, AdamW, the 4-term
// copies rewritten after each step. Before every step the CPU trainer gets
// the GPU's own parameters (downloaded), so both compute the step's
// accumulated gradients on the same adapter: a fault that builds up over
// steps or passes (copies not refreshed, gradients not accumulated,
// something kept from an earlier pass) puts them O(1) apart, bf16 a few
// percent (HF's own bf16 errors on the fixtures: 1.5-7.4% of a tensor's
// largest value). Each step's largest and median error are printed.
TEST(CudaTrainer, AccumulatedStepsFromZeroBTrackTheCpuGradients) {
  SKIP_WITHOUT_GPU();
  auto host = load_host("llama");
  ASSERT_TRUE(host);
  const std::vector<ParamInfo>& table = host->param_table();
  std::vector<float> start(host->params().begin(), host->params().end());
  for (const ParamInfo& t : table)
    if (t.name.find("lora_B") != std::string::npos) std::fill_n(start.begin() + t.offset, t.numel(), 0.0f);
  std::copy(start.begin(), start.end(), host->params().begin());
  auto gpu = to_gpu(*host);
  ASSERT_TRUE(gpu);
  const int64_t n = gpu->n_params();
  const MicroBatch mbs[3] = {random_batch(host->config().vocab_size, 31), random_batch(host->config().vocab_size, 32),
                             random_batch(host->config().vocab_size, 33)};
  int64_t supervised = 0;
  for (const MicroBatch& mb : mbs) supervised += mb.n_supervised;
  const float scale = 1.0f / float(supervised);
  std::vector<float> params(static_cast<size_t>(n));
  for (int step = 0; step < 6; ++step) {
    ASSERT_TRUE(gpu->download_params(params).is_ok());
    std::copy(params.begin(), params.end(), host->params().begin());
    host->zero_grads();
    ASSERT_TRUE(gpu->zero_grads().is_ok());
    for (const MicroBatch& mb : mbs) {
      ASSERT_TRUE(host->forward_backward(mb, scale).is_ok());
      ASSERT_TRUE(gpu->forward_backward(mb, scale).is_ok());
    }
    const std::vector<float> g = grads_of(*gpu);
    std::vector<double> errs;
    for (const ParamInfo& t : table) {
      const double err = rel_error(g.data() + t.offset, host->grads().data() + t.offset, t.numel());
      EXPECT_LE(err, 0.25) << "step " << step << " " << t.name;
      errs.push_back(err);
    }
    std::sort(errs.begin(), errs.end());
    std::printf("step %d: accumulated LoRA gradients vs the CPU's: median %.4f, max %.4f\n", step,
                errs[errs.size() / 2], errs.back());
    ASSERT_TRUE(gpu->clip_grad_norm(1.0).is_ok());
    ASSERT_TRUE(gpu->adamw_step(3e-3).is_ok());
  }
}

TEST(CudaTrainer, RefusesWhatItDoesNotDo) {
  SKIP_WITHOUT_GPU();
  auto small = TrainableModel::load(data_dir() + "/models/llama", {});  // head_dim 16
  ASSERT_TRUE(small.is_ok()) << small.status().message();
  auto g = upload_to_cuda(**small, 0, 64, {});
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("head_dim 16"), std::string::npos) << g.status().message();
  auto host = load_host("llama");
  ASSERT_TRUE(host);
  auto gpu = to_gpu(*host, 32);
  ASSERT_TRUE(gpu);
  MicroBatch mb = random_batch(host->config().vocab_size, 3);  // 107 tokens > 32
  auto l = gpu->forward_backward(mb, 1.0f);
  ASSERT_FALSE(l.is_ok());
  EXPECT_NE(l.status().message().find("planned for 32"), std::string::npos) << l.status().message();
}

TEST(DeviceChoice, ParsesCpuCudaAndIndex) {
  EXPECT_FALSE(parse_device("cpu")->cuda);
  EXPECT_TRUE(parse_device("cuda")->cuda);
  EXPECT_EQ(parse_device("cuda:3")->index, 3);
  EXPECT_EQ(parse_device("")->cuda, cuda::device_count() > 0);
  EXPECT_FALSE(parse_device("gpu").is_ok());
  EXPECT_FALSE(parse_device("cuda:").is_ok());
  EXPECT_FALSE(parse_device("cuda:x1").is_ok());
}

}  // namespace
}  // namespace lathe
