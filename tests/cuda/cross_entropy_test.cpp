// The fused LM head + cross-entropy against naive double references (every
// logit materialized): loss sum, supervised count, d_hidden and the
// accumulated d_w, over several chunks with a partial last one and ignored
// rows; loss-only mode; a bad target is an error. f32 logits are checked
// against ref::cross_entropy; bf16 logits against a reference that rounds
// each logit to bf16 first, as a bf16 lm_head's output is (the loss then
// upcasts it), on the 8-wide kernel (vocab a multiple of 8, and at Llama 3's
// 128256, wider than the shared memory kept per row) and the element-wise
// one. Tolerances: the loss comes from f32 sums over exact inputs (1e-4
// relative); the gradients pass through the bf16 softmax − onehot and, for
// d_hidden, a bf16 output, so 1e-2 of max|want| (two bf16 roundings, 2⁻⁹
// each, plus f32 sums). Two runs give the same bits; counters left on the
// device by cross_entropy_enqueue read back as the waiting call's.
#include <gtest/gtest.h>

#include <cstring>

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

Problem make_problem(int64_t n = 37, int64_t vocab = 1000) {
  Problem p;
  p.n = n;
  p.vocab = vocab;
  p.hidden = random_bf16(p.n * p.dim, 61);
  p.w = random_bf16(p.vocab * p.dim, 62, 0.1f);
  p.targets.resize(p.n);
  for (int64_t i = 0; i < p.n; ++i) {
    p.targets[i] = i % 5 == 2 ? kCrossEntropyIgnore : static_cast<int32_t>((i * 389) % p.vocab);
  }
  p.targets[0] = static_cast<int32_t>(p.vocab - 1);
  return p;
}

// As ref::cross_entropy, with each logit rounded to bf16 before the loss.
CrossEntropyStats bf16_logit_reference(const Problem& p, float scale, std::vector<float>& d_hidden,
                                       std::vector<float>& d_w) {
  CrossEntropyStats st;
  std::vector<double> z(static_cast<size_t>(p.vocab));
  for (int64_t t = 0; t < p.n; ++t) {
    const int32_t target = p.targets[size_t(t)];
    if (target == kCrossEntropyIgnore) continue;
    double m = -INFINITY;
    for (int64_t v = 0; v < p.vocab; ++v) {
      double s = 0;
      for (int64_t i = 0; i < p.dim; ++i) s += double(p.hidden[size_t(t * p.dim + i)]) * p.w[size_t(v * p.dim + i)];
      z[size_t(v)] = round_bf16(static_cast<float>(s));
      m = std::max(m, z[size_t(v)]);
    }
    double sum = 0;
    for (double x : z) sum += std::exp(x - m);
    const double lse = m + std::log(sum);
    st.loss_sum += lse - z[size_t(target)];
    st.n_valid += 1;
    for (int64_t v = 0; v < p.vocab; ++v) {
      const double g = (std::exp(z[size_t(v)] - lse) - (v == target ? 1.0 : 0.0)) * scale;
      for (int64_t i = 0; i < p.dim; ++i) {
        d_hidden[size_t(t * p.dim + i)] += float(g * p.w[size_t(v * p.dim + i)]);
        d_w[size_t(v * p.dim + i)] += float(g * p.hidden[size_t(t * p.dim + i)]);
      }
    }
  }
  return st;
}

// One call's outputs, downloaded.
struct CeRun {
  CrossEntropyStats stats;
  std::vector<float> dh, dw;
};

CeRun run_cross_entropy(CudaContext& ctx, const Problem& p, const std::vector<float>& dw0, float scale, int64_t chunk,
                        CeLogits logits) {
  CeRun r;
  DeviceBuffer d_h = upload_bf16(ctx, p.hidden), d_w = upload_bf16(ctx, p.w), d_t = upload(ctx, p.targets);
  DeviceBuffer d_dh = upload_bf16(ctx, std::vector<float>(p.n * p.dim)), d_dw = upload(ctx, dw0);
  auto ws = DeviceBuffer::alloc(0, cross_entropy_workspace_bytes(p.vocab, chunk, logits));
  EXPECT_TRUE(ws.is_ok()) << ws.status().message();
  if (!ws.is_ok()) return r;
  auto got = cross_entropy(ctx, {.hidden = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w),
                                 .targets = dptr<int32_t>(d_t), .d_hidden = dptr<bf16_bits>(d_dh),
                                 .d_w = dptr<float>(d_dw), .workspace = ws->data(), .n = p.n, .vocab = p.vocab,
                                 .dim = p.dim, .chunk_rows = chunk, .grad_scale = scale, .logits = logits});
  EXPECT_TRUE(got.is_ok()) << got.status().message();
  if (!got.is_ok()) return r;
  r.stats = *got;
  r.dh = download_bf16(ctx, d_dh, p.n * p.dim);
  r.dw = download<float>(ctx, d_dw, p.vocab * p.dim);
  for (size_t i = 0; i < r.dw.size(); ++i) r.dw[i] -= dw0[i];  // what was added, not the initial values
  return r;
}

void expect_matches(const CeRun& got, const Problem& p, const CrossEntropyStats& want, const std::vector<float>& dh_ref,
                    const std::vector<float>& dw_added) {
  EXPECT_EQ(got.stats.n_valid, want.n_valid);
  EXPECT_NEAR(got.stats.loss_sum, want.loss_sum, 1e-4 * std::abs(want.loss_sum));
  ASSERT_EQ(got.dh.size(), dh_ref.size());
  EXPECT_LE(rel_error(got.dh, dh_ref), 1e-2);
  EXPECT_LE(rel_error(got.dw, dw_added), 1e-2);
  for (int64_t i = 0; i < p.n; ++i)  // ignored rows get exactly zero gradient
    if (p.targets[i] == kCrossEntropyIgnore)
      for (int64_t j = 0; j < p.dim; ++j) ASSERT_EQ(got.dh[i * p.dim + j], 0.0f) << "row " << i;
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
  std::vector<float> dw_added(dw_ref.size());
  for (size_t i = 0; i < dw_ref.size(); ++i) dw_added[i] = dw_ref[i] - dw0[i];
  for (int64_t chunk : {int64_t{16}, int64_t{37}, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "chunk_rows " << chunk);
    CeRun got = run_cross_entropy(ctx, p, dw0, scale, chunk, CeLogits::kF32);
    expect_matches(got, p, want, dh_ref, dw_added);
  }
}

// bf16 logits: vocab 1000 (8-wide kernel), 1001 (element-wise) and 128256
// (8-wide, the row wider than shared memory: its tail is read twice).
TEST(CudaCrossEntropy, Bf16LogitsMatchRoundedReference) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const float scale = 1.0f / 29.0f;
  for (int64_t vocab : {int64_t{1000}, int64_t{1001}, int64_t{128256}}) {
    const int64_t n = vocab > 2000 ? 11 : 37;
    Problem p = make_problem(n, vocab);
    std::vector<float> dh_ref(p.n * p.dim), dw_added(p.vocab * p.dim);
    const CrossEntropyStats want = bf16_logit_reference(p, scale, dh_ref, dw_added);
    const std::vector<float> dw0 = random_bf16(p.vocab * p.dim, 63, 0.01f);
    for (int64_t chunk : {int64_t{4}, int64_t{16}, int64_t{0}}) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " chunk_rows " << chunk);
      CeRun got = run_cross_entropy(ctx, p, dw0, scale, chunk, CeLogits::kBf16);
      expect_matches(got, p, want, dh_ref, dw_added);
    }
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The loss is summed in a fixed order: two runs give the same bits.
TEST(CudaCrossEntropy, RepeatsBitForBit) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  Problem p = make_problem(70);
  const std::vector<float> dw0 = random_bf16(p.vocab * p.dim, 63, 0.01f);
  for (CeLogits logits : {CeLogits::kF32, CeLogits::kBf16}) {
    SCOPED_TRACE(::testing::Message() << "logits " << int(logits));
    const CeRun a = run_cross_entropy(ctx, p, dw0, 0.5f, 16, logits);
    const CeRun b = run_cross_entropy(ctx, p, dw0, 0.5f, 16, logits);
    EXPECT_EQ(std::memcmp(&a.stats.loss_sum, &b.stats.loss_sum, sizeof(double)), 0)
        << a.stats.loss_sum << " vs " << b.stats.loss_sum;
    EXPECT_EQ(a.stats.n_valid, b.stats.n_valid);
    EXPECT_TRUE(same_bits(a.dh, b.dh));
    EXPECT_TRUE(same_bits(a.dw, b.dw));
  }
}

// cross_entropy_enqueue leaves the counters in the caller's buffer, which
// later work on the workspace does not touch: read afterwards they are the
// waiting call's; a bad target is reported by the read.
TEST(CudaCrossEntropy, DeferredCountersReadAsTheWaitingCall) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  Problem p = make_problem();
  DeviceBuffer d_h = upload_bf16(ctx, p.hidden), d_w = upload_bf16(ctx, p.w), d_t = upload(ctx, p.targets);
  DeviceBuffer d_dh = upload_bf16(ctx, std::vector<float>(p.n * p.dim));
  const size_t ws_bytes = cross_entropy_workspace_bytes(p.vocab, 16, CeLogits::kBf16);
  auto ws = DeviceBuffer::alloc(0, ws_bytes);
  auto counters = DeviceBuffer::alloc(0, cross_entropy_counter_bytes());
  ASSERT_TRUE(ws.is_ok() && counters.is_ok());
  CrossEntropyCudaArgs args{.hidden = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w), .targets = dptr<int32_t>(d_t),
                            .d_hidden = dptr<bf16_bits>(d_dh), .workspace = ws->data(), .n = p.n, .vocab = p.vocab,
                            .dim = p.dim, .chunk_rows = 16, .logits = CeLogits::kBf16};
  auto waited = cross_entropy(ctx, args);
  ASSERT_TRUE(waited.is_ok()) << waited.status().message();
  ASSERT_TRUE(cross_entropy_enqueue(ctx, args, counters->data()).is_ok());
  ASSERT_TRUE(fill_zero(ctx, ws->data(), ws_bytes).is_ok());  // later work reusing the workspace
  auto deferred = cross_entropy_counters(ctx, counters->data(), p.vocab);
  ASSERT_TRUE(deferred.is_ok()) << deferred.status().message();
  EXPECT_EQ(std::memcmp(&deferred->loss_sum, &waited->loss_sum, sizeof(double)), 0);
  EXPECT_EQ(deferred->n_valid, waited->n_valid);
  EXPECT_FALSE(cross_entropy_enqueue(ctx, args, nullptr).is_ok());
  p.targets[5] = -7;
  DeviceBuffer bad_t = upload(ctx, p.targets);
  args.targets = dptr<int32_t>(bad_t);
  ASSERT_TRUE(cross_entropy_enqueue(ctx, args, counters->data()).is_ok());
  auto bad = cross_entropy_counters(ctx, counters->data(), p.vocab);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("1 target(s) outside"), std::string::npos) << bad.status().message();
}

TEST(CudaCrossEntropy, LossOnlyNeedsNoGradientBuffers) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  Problem p = make_problem();
  CrossEntropyStats want = ref::cross_entropy({.hidden = view(p.hidden, {p.n, p.dim}),
                                               .w = view(p.w, {p.vocab, p.dim}), .targets = view_i32(p.targets, {p.n})});
  std::vector<float> unused_dh(p.n * p.dim), unused_dw(p.vocab * p.dim);
  const CrossEntropyStats want_bf16 = bf16_logit_reference(p, 1.0f, unused_dh, unused_dw);
  DeviceBuffer d_h = upload_bf16(ctx, p.hidden), d_w = upload_bf16(ctx, p.w), d_t = upload(ctx, p.targets);
  for (CeLogits logits : {CeLogits::kF32, CeLogits::kBf16}) {
    SCOPED_TRACE(::testing::Message() << "logits " << int(logits));
    auto ws = DeviceBuffer::alloc(0, cross_entropy_workspace_bytes(p.vocab, 8, logits));
    ASSERT_TRUE(ws.is_ok());
    auto got = cross_entropy(ctx, {.hidden = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w),
                                   .targets = dptr<int32_t>(d_t), .workspace = ws->data(), .n = p.n,
                                   .vocab = p.vocab, .dim = p.dim, .chunk_rows = 8, .logits = logits});
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    const CrossEntropyStats& w = logits == CeLogits::kF32 ? want : want_bf16;
    EXPECT_EQ(got->n_valid, w.n_valid);
    EXPECT_NEAR(got->loss_sum, w.loss_sum, 1e-4 * std::abs(w.loss_sum));
  }
}

TEST(CudaCrossEntropy, TargetOutsideVocabIsAnError) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  Problem p = make_problem();
  p.targets[3] = static_cast<int32_t>(p.vocab);
  DeviceBuffer d_h = upload_bf16(ctx, p.hidden), d_w = upload_bf16(ctx, p.w), d_t = upload(ctx, p.targets);
  for (CeLogits logits : {CeLogits::kF32, CeLogits::kBf16}) {
    auto ws = DeviceBuffer::alloc(0, cross_entropy_workspace_bytes(p.vocab, 16, logits));
    ASSERT_TRUE(ws.is_ok());
    auto got = cross_entropy(ctx, {.hidden = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w),
                                   .targets = dptr<int32_t>(d_t), .workspace = ws->data(), .n = p.n,
                                   .vocab = p.vocab, .dim = p.dim, .chunk_rows = 16, .logits = logits});
    ASSERT_FALSE(got.is_ok());
    EXPECT_NE(got.status().message().find("outside"), std::string::npos) << got.status().message();
  }
}

}  // namespace
}  // namespace lathe::cuda
