// Helpers the GPU trainer tests share: where the fixtures are, the skip
// without a GPU, packing documents into a micro batch as lathe does (the
// gradient fixtures' batch and the tests' random one), the error metric of
// the bf16 bounds and reading a model's gradients back.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "io/safetensors.h"
#include "train/adamw.h"
#include "train/cuda_model.h"
#include "train/trainable_model.h"
#include "../train/grad_fixture.h"  // rel_error

#define SKIP_WITHOUT_GPU()                                                                              \
  do {                                                                                                  \
    if (::lathe::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine"; \
  } while (0)

namespace lathe::testing {

// The fixtures: $LATHE_TEST_DATA, else the source tree's tests/data, else
// tests/data under the working directory (a copied tree on the GPU machine).
inline std::string data_dir() {
  if (const char* e = std::getenv("LATHE_TEST_DATA")) return e;
  if (std::filesystem::exists(LATHE_TEST_DATA "/grad_hd64")) return LATHE_TEST_DATA;
  return "tests/data";
}

// Documents as lathe packs them: labels[j] predicts token j + 1.
inline MicroBatch pack(const std::vector<std::vector<int32_t>>& ids, const std::vector<std::vector<int32_t>>& labels) {
  MicroBatch mb;
  mb.n_rows = 1;
  mb.cu_seqlens = {0};
  for (size_t d = 0; d < ids.size(); ++d) {
    for (size_t j = 0; j < ids[d].size(); ++j) {
      mb.input_ids.push_back(ids[d][j]);
      mb.labels.push_back(labels[d][j]);
      mb.position_ids.push_back(int32_t(j));
      mb.n_supervised += labels[d][j] != kIgnoreIndex;
    }
    mb.cu_seqlens.push_back(int32_t(mb.input_ids.size()));
    mb.max_seqlen = std::max(mb.max_seqlen, int32_t(ids[d].size()));
  }
  mb.row_starts = {0, int32_t(mb.input_ids.size())};
  return mb;
}

// The batch of a gradient fixture (input_ids, labels and lengths of HF's
// right-padded batch), packed.
inline MicroBatch fixture_batch(const SafetensorsFile& f) {
  Tensor ids = f.tensor("input_ids").value(), labels = f.tensor("labels").value(), lens = f.tensor("lengths").value();
  std::vector<std::vector<int32_t>> x, y;
  const int64_t L = ids.size(1);
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const int64_t n = lens.data<int64_t>()[b];
    x.emplace_back();
    y.emplace_back();
    for (int64_t j = 0; j < n; ++j) {
      x.back().push_back(int32_t(ids.data<int64_t>()[b * L + j]));
      y.back().push_back(j + 1 < n ? int32_t(labels.data<int64_t>()[b * L + j + 1]) : kIgnoreIndex);
    }
  }
  return pack(x, y);
}

// Three documents of random tokens, the first 5 of each unsupervised
// (tools/bf16_grad_error.py's packed batch for seed 17).
inline MicroBatch random_batch(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> x, y;
  for (int len : {50, 37, 20}) {
    x.emplace_back();
    y.emplace_back();
    for (int j = 0; j < len; ++j) x.back().push_back(int32_t(3 + rng() % uint32_t(vocab - 3)));
    for (int j = 0; j < len; ++j) y.back().push_back(j >= 5 && j + 1 < len ? x.back()[size_t(j + 1)] : kIgnoreIndex);
  }
  return pack(x, y);
}

// Documents of random tokens filling `tokens`, each min_len + [0, spread)
// long (the last one cut short), the first `unsupervised` of each not
// supervised.
inline MicroBatch random_docs(int64_t vocab, int tokens, uint32_t seed, int min_len, int spread, int unsupervised) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> x, y;
  for (int left = tokens; left > 0;) {
    const int len = std::min(left, min_len + int(rng() % uint32_t(spread)));
    left -= len;
    x.emplace_back();
    y.emplace_back();
    for (int j = 0; j < len; ++j) x.back().push_back(int32_t(rng() % uint32_t(vocab)));
    for (int j = 0; j < len; ++j)
      y.back().push_back(j >= unsupervised && j + 1 < len ? x.back()[size_t(j + 1)] : kIgnoreIndex);
  }
  return pack(x, y);
}

inline std::vector<float> grads_of(CudaTrainableModel& g) {
  std::vector<float> out(size_t(g.n_params()));
  Status st = g.download_grads(out);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return out;
}

// The bounds both trainers' AdamW tracking tests use (LoRA and full SFT):
// the pre-clip gradient norm and the loss after each step, relative to the
// CPU's (the loss bound is taken 5x over six steps, as rounding compounds).
inline constexpr double kTrackGradTol = 3e-2;
inline constexpr double kTrackLossTol = 2e-3;

// `steps` AdamW steps on one micro batch on the CPU (host + cpu_opt) and on
// the GPU side by side: each step's loss within loss_tol and pre-clip
// gradient norm within grad_tol (relative) of the CPU's. The first CPU loss
// and the last ones of both come back through *first, *last_cpu, *last_gpu.
inline void track_adamw_steps(TrainableModel& host, CudaTrainableModel& gpu, AdamW& cpu_opt, const MicroBatch& mb,
                              double lr, int steps, double loss_tol, double grad_tol, double* first,
                              double* last_cpu, double* last_gpu) {
  const float scale = 1.0f / float(mb.n_supervised);
  const double clip = 1.0;
  for (int step = 0; step < steps; ++step) {
    host.zero_grads();
    ASSERT_TRUE(gpu.zero_grads().is_ok());
    auto lc = host.forward_backward(mb, scale);
    auto lg = gpu.forward_backward(mb, scale);
    ASSERT_TRUE(lc.is_ok() && lg.is_ok());
    const double cpu_loss = lc->loss_sum * scale, gpu_loss = lg->loss_sum * scale;
    EXPECT_LE(std::abs(gpu_loss - cpu_loss) / cpu_loss, loss_tol) << "step " << step;
    const double cpu_norm = cpu_opt.clip_grad_norm(clip);
    auto gpu_norm = gpu.clip_grad_norm(clip);
    ASSERT_TRUE(gpu_norm.is_ok()) << gpu_norm.status().message();
    EXPECT_LE(std::abs(*gpu_norm - cpu_norm) / cpu_norm, grad_tol) << "step " << step;
    cpu_opt.step(lr);
    ASSERT_TRUE(gpu.adamw_step(lr).is_ok());
    if (step == 0) *first = cpu_loss;
    *last_cpu = cpu_loss;
    *last_gpu = gpu_loss;
  }
}

}  // namespace lathe::testing
