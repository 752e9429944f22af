// The fused LM head + cross-entropy against the naive double reference
// (every logit materialized): loss sum, supervised count, d_hidden and the
// accumulated d_w, over several chunks with a partial last one and ignored
// rows; loss-only mode; a bad target is an error. Tolerances: the loss comes
// from f32 logits of exact bf16 inputs (1e-4 relative); the gradients pass
// through the bf16 softmax − onehot and, for d_hidden, a bf16 output, so
// 1e-2 of max|want| (two bf16 roundings, 2⁻⁹ each, plus f32 sums).
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "ops/reference/reference.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

struct Problem {
  int64_t n = 37, dim = 64, vocab = 1000;
  std::vector<float> hidden, w;
  std::vector<int32_t> targets;
};

Problem make_problem() {
  Problem p;
  p.hidden = random_bf16(p.n * p.dim, 61);
  p.w = random_bf16(p.vocab * p.dim, 62, 0.1f);
  p.targets.resize(p.n);
  for (int64_t i = 0; i < p.n; ++i) {
    p.targets[i] = i % 5 == 2 ? kCrossEntropyIgnore : static_cast<int32_t>((i * 389) % p.vocab);
  }
  p.targets[0] = static_cast<int32_t>(p.vocab - 1);
  return p;
}

TEST(CudaCrossEntropy, LossAndGradientsMatchReferenceAcrossChunks) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  Problem p = make_problem();
  const float scale = 1.0f / 29.0f;
  std::vector<float> dh_ref(p.n * p.dim), dw0 = random_bf16(p.vocab * p.dim, 63, 0.01f), dw_ref = dw0;
  CrossEntropyStats want = ref::cross_entropy(
      {.hidden = view(p.hidden, {p.n, p.dim}), .w = view(p.w, {p.vocab, p.dim}), .targets = view_i32(p.targets, {p.n}),
       .d_hidden = view(dh_ref, {p.n, p.dim}), .d_w = view(dw_ref, {p.vocab, p.dim}), .grad_scale = scale});
  for (int64_t chunk : {int64_t{16}, int64_t{37}, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "chunk_rows " << chunk);
    DeviceBuffer d_h = upload_bf16(ctx, p.hidden), d_w = upload_bf16(ctx, p.w), d_t = upload(ctx, p.targets);
    DeviceBuffer d_dh = upload_bf16(ctx, std::vector<float>(p.n * p.dim)), d_dw = upload(ctx, dw0);
    auto ws = DeviceBuffer::alloc(0, cross_entropy_workspace_bytes(p.vocab, chunk));
    ASSERT_TRUE(ws.is_ok()) << ws.status().message();
    auto got = cross_entropy(ctx, {.hidden = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w),
                                   .targets = dptr<int32_t>(d_t), .d_hidden = dptr<bf16_bits>(d_dh),
                                   .d_w = dptr<float>(d_dw), .workspace = ws->data(), .n = p.n, .vocab = p.vocab,
                                   .dim = p.dim, .chunk_rows = chunk, .grad_scale = scale});
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    EXPECT_EQ(got->n_valid, want.n_valid);
    EXPECT_NEAR(got->loss_sum, want.loss_sum, 1e-4 * std::abs(want.loss_sum));
    EXPECT_LE(rel_error(download_bf16(ctx, d_dh, p.n * p.dim), dh_ref), 1e-2);
    std::vector<float> dw_got = download<float>(ctx, d_dw, p.vocab * p.dim);
    std::vector<float> dw_delta(dw_got.size()), dw_want(dw_got.size());
    for (size_t i = 0; i < dw_got.size(); ++i) {  // compare what was added, not the initial values
      dw_delta[i] = dw_got[i] - dw0[i];
      dw_want[i] = dw_ref[i] - dw0[i];
    }
    EXPECT_LE(rel_error(dw_delta, dw_want), 1e-2);
    // Ignored rows get exactly zero gradient.
    std::vector<float> dh = download_bf16(ctx, d_dh, p.n * p.dim);
    for (int64_t i = 0; i < p.n; ++i)
      if (p.targets[i] == kCrossEntropyIgnore)
        for (int64_t j = 0; j < p.dim; ++j) ASSERT_EQ(dh[i * p.dim + j], 0.0f) << "row " << i;
  }
}

TEST(CudaCrossEntropy, LossOnlyNeedsNoGradientBuffers) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  Problem p = make_problem();
  CrossEntropyStats want = ref::cross_entropy({.hidden = view(p.hidden, {p.n, p.dim}),
                                               .w = view(p.w, {p.vocab, p.dim}), .targets = view_i32(p.targets, {p.n})});
  DeviceBuffer d_h = upload_bf16(ctx, p.hidden), d_w = upload_bf16(ctx, p.w), d_t = upload(ctx, p.targets);
  auto ws = DeviceBuffer::alloc(0, cross_entropy_workspace_bytes(p.vocab, 8));
  ASSERT_TRUE(ws.is_ok());
  auto got = cross_entropy(ctx, {.hidden = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w), .targets = dptr<int32_t>(d_t),
                                 .workspace = ws->data(), .n = p.n, .vocab = p.vocab, .dim = p.dim, .chunk_rows = 8});
  ASSERT_TRUE(got.is_ok()) << got.status().message();
  EXPECT_EQ(got->n_valid, want.n_valid);
  EXPECT_NEAR(got->loss_sum, want.loss_sum, 1e-4 * std::abs(want.loss_sum));
}

TEST(CudaCrossEntropy, TargetOutsideVocabIsAnError) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  Problem p = make_problem();
  p.targets[3] = static_cast<int32_t>(p.vocab);
  DeviceBuffer d_h = upload_bf16(ctx, p.hidden), d_w = upload_bf16(ctx, p.w), d_t = upload(ctx, p.targets);
  auto ws = DeviceBuffer::alloc(0, cross_entropy_workspace_bytes(p.vocab, 16));
  ASSERT_TRUE(ws.is_ok());
  auto got = cross_entropy(ctx, {.hidden = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w), .targets = dptr<int32_t>(d_t),
                                 .workspace = ws->data(), .n = p.n, .vocab = p.vocab, .dim = p.dim, .chunk_rows = 16});
  ASSERT_FALSE(got.is_ok());
  EXPECT_NE(got.status().message().find("outside"), std::string::npos) << got.status().message();
}

}  // namespace
}  // namespace lathe::cuda
