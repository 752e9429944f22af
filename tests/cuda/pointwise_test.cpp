// RMSNorm (fused residual add), RoPE (default and Llama 3 scaling), SwiGLU,
// embedding and dtype conversion kernels against the naive double
// references of tests/ops, forward and backward, on the vector paths and
// their scalar fallbacks. Inputs are bf16 values; the references see the same
// values in f32. Tolerances, as max|got − want| / max|want|: bf16 outputs
// 8e-3 (one bf16 rounding, 2⁻⁹, after a few f32 ops); f32 outputs 1e-4 (f32
// sums over at most a few thousand terms); bit-exact where the device only
// moves or rounds the same value the host rounds, and between two kernels
// that do the same arithmetic (the q|k|v warp-per-token kernel and the
// earlier one). The attention backward's delta (rowsum(dO ⊙ O)) on both of
// its kernels against double sums: they add in different orders, 1e-5.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cuda/attention.h"
#include "backends/cuda/train_fused.h"
#include "cuda/cuda_test_util.h"
#include "ops/reference/reference.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

constexpr double kBf16Tol = 8e-3;
constexpr double kF32Tol = 1e-4;

std::vector<float> norm_weight(int64_t dim, uint32_t seed) {
  std::vector<float> w = random_bf16(dim, seed, 0.3f);
  for (float& x : w) x = round_bf16(1.0f + x);
  return w;
}

void check_rms_norm_forward(int64_t rows, int64_t dim, bool with_residual, bool in_place) {
  SCOPED_TRACE(::testing::Message() << rows << "x" << dim << " residual=" << with_residual << " in_place=" << in_place);
  CudaContext ctx = make_context();
  const float eps = 1e-5f;
  std::vector<float> x = random_bf16(rows * dim, 11), r = random_bf16(rows * dim, 12), w = norm_weight(dim, 13);
  std::vector<float> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = with_residual ? round_bf16(x[i] + r[i]) : x[i];
  std::vector<float> y_ref(x.size()), rstd_ref(rows);
  ref::rms_norm_forward({.x = view(h, {rows, dim}), .w = view(w, {dim}), .y = view(y_ref, {rows, dim}),
                         .rstd = view(rstd_ref, {rows}), .eps = eps});

  DeviceBuffer dx = upload_bf16(ctx, x), dr = upload_bf16(ctx, r), dw = upload_bf16(ctx, w);
  DeviceBuffer dh = upload_bf16(ctx, std::vector<float>(x.size())), dy = upload_bf16(ctx, std::vector<float>(x.size()));
  DeviceBuffer drstd = upload(ctx, std::vector<float>(rows));
  RmsNormResidualArgs a{.x = dptr<bf16_bits>(dx), .residual = with_residual ? dptr<bf16_bits>(dr) : nullptr,
                        .h_out = in_place ? dptr<bf16_bits>(dr) : dptr<bf16_bits>(dh), .w = dptr<bf16_bits>(dw),
                        .y = dptr<bf16_bits>(dy), .rstd = dptr<float>(drstd), .rows = rows, .dim = dim, .eps = eps};
  Status st = rms_norm_residual_forward(ctx, a);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> h_got = download_bf16(ctx, in_place ? dr : dh, rows * dim);
  for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h_got[i], h[i]) << "h element " << i;
  EXPECT_LE(rel_error(download_bf16(ctx, dy, rows * dim), y_ref), kBf16Tol);
  EXPECT_LE(rel_error(download<float>(ctx, drstd, rows), rstd_ref), 1e-5);
}

TEST(CudaRmsNorm, ForwardWithResidualMatchesReference) {
  LATHE_SKIP_WITHOUT_GPU();
  check_rms_norm_forward(19, 200, true, false);
  check_rms_norm_forward(3, 4096, true, false);
}

TEST(CudaRmsNorm, ForwardResidualUpdatedInPlace) {
  LATHE_SKIP_WITHOUT_GPU();
  check_rms_norm_forward(17, 333, true, true);
}

TEST(CudaRmsNorm, ForwardWithoutResidual) {
  LATHE_SKIP_WITHOUT_GPU();
  check_rms_norm_forward(5, 1000, false, false);
}

// Every shape class of the register path (a group of 8/16/32 lanes per
// row, a block per row with 1, 2, 4 or 8 chunks per thread) and the scalar
// fallbacks (dim 32: too short; 40000: too long; 333: not a multiple of 8).
TEST(CudaRmsNorm, ForwardEveryRowShape) {
  LATHE_SKIP_WITHOUT_GPU();
  for (int64_t dim : {32, 64, 96, 128, 200, 2048, 4096, 5120, 8192, 20000, 40000})
    check_rms_norm_forward(dim >= 8192 ? 3 : 37, dim, true, false);
  check_rms_norm_forward(45, 128, true, true);
  check_rms_norm_forward(9, 4096, true, true);
  check_rms_norm_forward(41, 64, false, false);
}

// The recompute path normalizes the stored h where the forward fused the
// residual add: both must give the same bits.
TEST(CudaRmsNorm, NormOfStoredSumIsBitwiseTheFusedForward) {
  LATHE_SKIP_WITHOUT_GPU();
  for (int64_t dim : {64, 2048, 4096, 333}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    CudaContext ctx = make_context();
    const int64_t rows = 21;
    std::vector<float> x = random_bf16(rows * dim, 71), r = random_bf16(rows * dim, 72), w = norm_weight(dim, 73);
    DeviceBuffer dx = upload_bf16(ctx, x), dr = upload_bf16(ctx, r), dw = upload_bf16(ctx, w);
    DeviceBuffer dh = upload_bf16(ctx, std::vector<float>(x.size()));
    DeviceBuffer y1 = upload_bf16(ctx, std::vector<float>(x.size())), y2 = upload_bf16(ctx, std::vector<float>(x.size()));
    DeviceBuffer s1 = upload(ctx, std::vector<float>(rows)), s2 = upload(ctx, std::vector<float>(rows));
    ASSERT_TRUE(rms_norm_residual_forward(ctx, {.x = dptr<bf16_bits>(dx), .residual = dptr<bf16_bits>(dr),
                                                .h_out = dptr<bf16_bits>(dh), .w = dptr<bf16_bits>(dw),
                                                .y = dptr<bf16_bits>(y1), .rstd = dptr<float>(s1), .rows = rows,
                                                .dim = dim})
                    .is_ok());
    ASSERT_TRUE(rms_norm_residual_forward(ctx, {.x = dptr<bf16_bits>(dh), .w = dptr<bf16_bits>(dw),
                                                .y = dptr<bf16_bits>(y2), .rstd = dptr<float>(s2), .rows = rows,
                                                .dim = dim})
                    .is_ok());
    EXPECT_EQ(download<uint16_t>(ctx, y1, rows * dim), download<uint16_t>(ctx, y2, rows * dim));
    EXPECT_EQ(download<float>(ctx, s1, rows), download<float>(ctx, s2, rows));
  }
}

void check_rms_norm_backward(int64_t rows, int64_t dim) {
  SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
  CudaContext ctx = make_context();
  std::vector<float> h = random_bf16(rows * dim, 21), w = norm_weight(dim, 22), dy = random_bf16(rows * dim, 23);
  std::vector<float> rstd(rows), y(h.size());
  ref::rms_norm_forward({.x = view(h, {rows, dim}), .w = view(w, {dim}), .y = view(y, {rows, dim}),
                         .rstd = view(rstd, {rows}), .eps = 1e-6f});
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    std::vector<float> dh0 = random_bf16(rows * dim, 24), dw0 = random_bf16(dim, 25);
    std::vector<float> dh_ref = dh0, dw_ref = dw0;
    ref::rms_norm_backward({.x = view(h, {rows, dim}), .w = view(w, {dim}), .rstd = view(rstd, {rows}),
                            .dy = view(dy, {rows, dim}), .dx = view(dh_ref, {rows, dim}), .dw = view(dw_ref, {dim}),
                            .accumulate = accumulate});
    DeviceBuffer d_h = upload_bf16(ctx, h), d_w = upload_bf16(ctx, w), d_rstd = upload(ctx, rstd);
    DeviceBuffer d_dy = upload_bf16(ctx, dy), d_dh = upload(ctx, dh0), d_dw = upload(ctx, dw0);
    Status st = rms_norm_residual_backward(
        ctx, {.h = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w), .rstd = dptr<float>(d_rstd),
              .dy = dptr<bf16_bits>(d_dy), .dh = dptr<float>(d_dh), .dw = dptr<float>(d_dw), .rows = rows,
              .dim = dim, .accumulate = accumulate});
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_LE(rel_error(download<float>(ctx, d_dh, rows * dim), dh_ref), kF32Tol);
    EXPECT_LE(rel_error(download<float>(ctx, d_dw, dim), dw_ref), kF32Tol);
  }
}

TEST(CudaRmsNorm, BackwardAccumulatesIntoResidualGradAndWeightGrad) {
  LATHE_SKIP_WITHOUT_GPU();
  check_rms_norm_backward(23, 300);
  check_rms_norm_backward(1500, 64);  // more rows than blocks: blocks stride over rows
}

// Without dw (the trainer's case: the register path where the shape allows
// it): dh in f32, its bf16 copy dh_bf exactly the rounded dh; and with dh
// null, dh_bf written over dy in place (the q/k norms).
void check_rms_norm_backward_bf16(int64_t rows, int64_t dim) {
  SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
  CudaContext ctx = make_context();
  std::vector<float> h = random_bf16(rows * dim, 81), w = norm_weight(dim, 82), dy = random_bf16(rows * dim, 83);
  std::vector<float> rstd(rows), y(h.size());
  ref::rms_norm_forward({.x = view(h, {rows, dim}), .w = view(w, {dim}), .y = view(y, {rows, dim}),
                         .rstd = view(rstd, {rows}), .eps = 1e-6f});
  DeviceBuffer d_h = upload_bf16(ctx, h), d_w = upload_bf16(ctx, w), d_rstd = upload(ctx, rstd);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    std::vector<float> dh0 = random_bf16(rows * dim, 84), dh_ref = dh0, dw_unused(dim);
    ref::rms_norm_backward({.x = view(h, {rows, dim}), .w = view(w, {dim}), .rstd = view(rstd, {rows}),
                            .dy = view(dy, {rows, dim}), .dx = view(dh_ref, {rows, dim}),
                            .dw = view(dw_unused, {dim}), .accumulate = accumulate});
    DeviceBuffer d_dy = upload_bf16(ctx, dy), d_dh = upload(ctx, dh0);
    DeviceBuffer d_bf = upload_bf16(ctx, std::vector<float>(h.size()));
    Status st = rms_norm_residual_backward(
        ctx, {.h = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w), .rstd = dptr<float>(d_rstd),
              .dy = dptr<bf16_bits>(d_dy), .dh = dptr<float>(d_dh), .dh_bf = dptr<bf16_bits>(d_bf), .rows = rows,
              .dim = dim, .accumulate = accumulate});
    ASSERT_TRUE(st.is_ok()) << st.message();
    const std::vector<float> got = download<float>(ctx, d_dh, rows * dim);
    EXPECT_LE(rel_error(got, dh_ref), kF32Tol);
    const std::vector<float> got_bf = download_bf16(ctx, d_bf, rows * dim);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got_bf[i], round_bf16(got[i])) << "dh_bf element " << i;
    if (accumulate) continue;
    // dh null, the bf16 result over dy.
    st = rms_norm_residual_backward(ctx, {.h = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(d_w),
                                          .rstd = dptr<float>(d_rstd), .dy = dptr<bf16_bits>(d_dy),
                                          .dh_bf = dptr<bf16_bits>(d_dy), .rows = rows, .dim = dim});
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(download_bf16(ctx, d_dy, rows * dim), got_bf);
  }
}

TEST(CudaRmsNorm, BackwardWritesTheBf16CopyOfDh) {
  LATHE_SKIP_WITHOUT_GPU();
  for (int64_t dim : {32, 64, 128, 200, 333, 2048, 4096, 8192}) check_rms_norm_backward_bf16(dim >= 4096 ? 5 : 29, dim);
}

// Rows written with a stride (the first dim columns of wider rows, as the
// trainer's GEMM inputs carry LoRA columns after them): the forward's y and
// the backward's dh_bf are bitwise the packed results, and the columns past
// dim are left as they were. Strides that keep rows 16-byte aligned take
// the register path as the packed call does; 333 takes the scalar kernels.
TEST(CudaRmsNorm, StridedOutputsAreThePackedOnes) {
  LATHE_SKIP_WITHOUT_GPU();
  const std::pair<int64_t, int64_t> cases[] = {{64, 64 + 16}, {2048, 2048 + 384}, {4096, 4096 + 128}, {333, 333 + 5}};
  for (const auto& [dim, ld] : cases) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim << " ld " << ld);
    CudaContext ctx = make_context();
    const int64_t rows = 19;
    std::vector<float> x = random_bf16(rows * dim, 91), r = random_bf16(rows * dim, 92), w = norm_weight(dim, 93);
    std::vector<float> dy = random_bf16(rows * dim, 94), dh0 = random_bf16(rows * dim, 95);
    DeviceBuffer dx = upload_bf16(ctx, x), dr = upload_bf16(ctx, r), dw = upload_bf16(ctx, w);
    DeviceBuffer y1 = upload_bf16(ctx, std::vector<float>(size_t(rows * dim)));
    DeviceBuffer y2 = upload_bf16(ctx, std::vector<float>(size_t(rows * ld), -3.0f));
    DeviceBuffer rstd = upload(ctx, std::vector<float>(size_t(rows)));
    RmsNormResidualArgs a{.x = dptr<bf16_bits>(dx), .residual = dptr<bf16_bits>(dr), .w = dptr<bf16_bits>(dw),
                          .y = dptr<bf16_bits>(y1), .rstd = dptr<float>(rstd), .rows = rows, .dim = dim};
    ASSERT_TRUE(rms_norm_residual_forward(ctx, a).is_ok());
    a.y = dptr<bf16_bits>(y2);
    a.ld_y = ld;
    ASSERT_TRUE(rms_norm_residual_forward(ctx, a).is_ok());
    const std::vector<uint16_t> packed = download<uint16_t>(ctx, y1, rows * dim);
    const std::vector<uint16_t> strided = download<uint16_t>(ctx, y2, rows * ld);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < ld; ++j) {
        const uint16_t want = j < dim ? packed[size_t(i * dim + j)] : lathe::f32_to_bf16(-3.0f);
        ASSERT_EQ(strided[size_t(i * ld + j)], want) << "y at " << i << "," << j;
      }
    // Backward: the bf16 copy of dh with a stride.
    std::vector<float> h = x;
    DeviceBuffer d_dy = upload_bf16(ctx, dy), d_h = upload_bf16(ctx, h);
    DeviceBuffer dh1 = upload(ctx, dh0), dh2 = upload(ctx, dh0);
    DeviceBuffer bf1 = upload_bf16(ctx, std::vector<float>(size_t(rows * dim)));
    DeviceBuffer bf2 = upload_bf16(ctx, std::vector<float>(size_t(rows * ld), -3.0f));
    RmsNormResidualBackwardArgs b{.h = dptr<bf16_bits>(d_h), .w = dptr<bf16_bits>(dw), .rstd = dptr<float>(rstd),
                                  .dy = dptr<bf16_bits>(d_dy), .dh = dptr<float>(dh1), .dh_bf = dptr<bf16_bits>(bf1),
                                  .rows = rows, .dim = dim, .accumulate = true};
    ASSERT_TRUE(rms_norm_residual_backward(ctx, b).is_ok());
    b.dh = dptr<float>(dh2);
    b.dh_bf = dptr<bf16_bits>(bf2);
    b.ld_dh_bf = ld;
    ASSERT_TRUE(rms_norm_residual_backward(ctx, b).is_ok());
    EXPECT_EQ(download<float>(ctx, dh1, rows * dim), download<float>(ctx, dh2, rows * dim));
    const std::vector<uint16_t> bp = download<uint16_t>(ctx, bf1, rows * dim);
    const std::vector<uint16_t> bs = download<uint16_t>(ctx, bf2, rows * ld);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < ld; ++j) {
        const uint16_t want = j < dim ? bp[size_t(i * dim + j)] : lathe::f32_to_bf16(-3.0f);
        ASSERT_EQ(bs[size_t(i * ld + j)], want) << "dh_bf at " << i << "," << j;
      }
  }
}

TEST(CudaRmsNorm, BackwardRejectsAMissingDh) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  DeviceBuffer b = upload(ctx, std::vector<float>(64));
  bf16_bits* p = dptr<bf16_bits>(b);
  Status st = rms_norm_residual_backward(ctx, {.h = p, .w = p, .rstd = dptr<float>(b), .dy = p, .rows = 1, .dim = 8});
  EXPECT_FALSE(st.is_ok());
  st = rms_norm_residual_backward(
      ctx, {.h = p, .w = p, .rstd = dptr<float>(b), .dy = p, .dh_bf = p, .rows = 1, .dim = 8, .accumulate = true});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("accumulate"), std::string::npos) << st.message();
}

// Exact both ways, with and without a tail of n mod 8 and on unaligned
// pointers (the scalar kernels).
TEST(CudaConvert, RoundTripsAreExact) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  for (int64_t n : {3, 8, 61, 4096 + 5}) {
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      std::vector<float> f = random_bf16(n + offset, 91);
      for (float& v : f) v *= 1.0f + 1.0f / 512;  // not bf16 values any more
      std::vector<float> want(f.begin() + offset, f.end());
      for (float& v : want) v = round_bf16(v);
      DeviceBuffer d_f = upload(ctx, f), d_b = upload_bf16(ctx, std::vector<float>(n + offset));
      ASSERT_TRUE(f32_to_bf16(ctx, dptr<float>(d_f) + offset, dptr<bf16_bits>(d_b) + offset, n).is_ok());
      std::vector<float> got = download_bf16(ctx, d_b, n + offset);
      EXPECT_EQ(std::vector<float>(got.begin() + offset, got.end()), want);
      DeviceBuffer d_back = upload(ctx, std::vector<float>(n + offset));
      ASSERT_TRUE(bf16_to_f32(ctx, dptr<bf16_bits>(d_b) + offset, dptr<float>(d_back) + offset, n).is_ok());
      got = download<float>(ctx, d_back, n + offset);
      EXPECT_EQ(std::vector<float>(got.begin() + offset, got.end()), want);
    }
  }
}

void check_rope(const RopeParams& p, int64_t head_dim) {
  SCOPED_TRACE(::testing::Message() << "rope type '" << p.type << "' head_dim " << head_dim);
  CudaContext ctx = make_context();
  auto inv = rope_inv_freq(p, static_cast<int>(head_dim));
  ASSERT_TRUE(inv.is_ok()) << inv.status().message();
  std::vector<float> inv_freq = *inv;
  const int64_t half = head_dim / 2, n_tok = 13, n_head = 5;
  std::vector<int32_t> pos(n_tok);
  for (int64_t t = 0; t < n_tok; ++t) pos[t] = static_cast<int32_t>(t * t * 97 % 20000);
  pos[n_tok - 1] = 131071;
  std::vector<float> cos_ref(n_tok * half), sin_ref(n_tok * half);
  ref::rope_tables({.inv_freq = view(inv_freq, {half}), .positions = view_i32(pos, {n_tok}),
                    .cos = view(cos_ref, {n_tok, half}), .sin = view(sin_ref, {n_tok, half})});
  DeviceBuffer d_inv = upload(ctx, inv_freq), d_pos = upload(ctx, pos);
  DeviceBuffer d_cos = upload(ctx, std::vector<float>(n_tok * half)), d_sin = upload(ctx, std::vector<float>(n_tok * half));
  Status st = rope_tables(ctx, {.inv_freq = dptr<float>(d_inv), .positions = dptr<int32_t>(d_pos),
                                .cos = dptr<float>(d_cos), .sin = dptr<float>(d_sin), .n_tokens = n_tok, .half = half});
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> cos_got = download<float>(ctx, d_cos, n_tok * half), sin_got = download<float>(ctx, d_sin, n_tok * half);
  for (size_t i = 0; i < cos_ref.size(); ++i) {  // same f32 angle, cos/sin in double: at most one f32 ulp apart
    ASSERT_NEAR(cos_got[i], cos_ref[i], 1.2e-7) << "cos element " << i;
    ASSERT_NEAR(sin_got[i], sin_ref[i], 1.2e-7) << "sin element " << i;
  }
  for (bool inverse : {false, true}) {
    std::vector<float> x = random_bf16(n_tok * n_head * head_dim, 31), x_ref = x;
    ref::rope_forward({.x = view(x_ref, {n_tok, n_head, head_dim}), .cos = view(cos_ref, {n_tok, half}),
                       .sin = view(sin_ref, {n_tok, half}), .inverse = inverse});
    DeviceBuffer dx = upload_bf16(ctx, x);
    st = rope_apply(ctx, {.x = dptr<bf16_bits>(dx), .cos = dptr<float>(d_cos), .sin = dptr<float>(d_sin),
                          .n_tokens = n_tok, .n_head = n_head, .half = half, .inverse = inverse});
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_LE(rel_error(download_bf16(ctx, dx, n_tok * n_head * head_dim), x_ref), kBf16Tol) << "inverse=" << inverse;
  }
}

TEST(CudaRope, DefaultFrequenciesMatchReference) {
  LATHE_SKIP_WITHOUT_GPU();
  check_rope(RopeParams{.theta = 10000.0f}, 64);
}

TEST(CudaRope, ShortHeadsTakeTheScalarKernel) {
  LATHE_SKIP_WITHOUT_GPU();
  check_rope(RopeParams{.theta = 10000.0f}, 20);
  check_rope(RopeParams{.theta = 10000.0f}, 48);
}

TEST(CudaRope, Llama3ScalingMatchesReference) {
  LATHE_SKIP_WITHOUT_GPU();
  check_rope(RopeParams{.theta = 500000.0f, .type = "llama3", .factor = 8.0f, .low_freq_factor = 1.0f,
                        .high_freq_factor = 4.0f, .original_max_position_embeddings = 8192},
             128);
}

TEST(CudaSwiglu, ForwardAndBackwardMatchReference) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t rows = 7, ffn = 431, n = rows * ffn;
  std::vector<float> g = random_bf16(n, 41, 2.0f), u = random_bf16(n, 42), d = random_bf16(n, 43);
  std::vector<float> out_ref(n), dg_ref(n), du_ref(n);
  ref::swiglu_forward({.gate = view(g, {rows, ffn}), .up = view(u, {rows, ffn}), .out = view(out_ref, {rows, ffn})});
  ref::swiglu_backward({.gate = view(g, {rows, ffn}), .up = view(u, {rows, ffn}), .d_out = view(d, {rows, ffn}),
                        .d_gate = view(dg_ref, {rows, ffn}), .d_up = view(du_ref, {rows, ffn})});
  DeviceBuffer dg = upload_bf16(ctx, g), du = upload_bf16(ctx, u), dd = upload_bf16(ctx, d);
  DeviceBuffer dout = upload_bf16(ctx, std::vector<float>(n));
  Status st = swiglu_forward(ctx, {.gate = dptr<bf16_bits>(dg), .up = dptr<bf16_bits>(du), .out = dptr<bf16_bits>(dout), .n = n});
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_LE(rel_error(download_bf16(ctx, dout, n), out_ref), kBf16Tol);
  // In place, as a training step reuses the activations' memory.
  st = swiglu_backward(ctx, {.gate = dptr<bf16_bits>(dg), .up = dptr<bf16_bits>(du), .d_out = dptr<bf16_bits>(dd),
                             .d_gate = dptr<bf16_bits>(dg), .d_up = dptr<bf16_bits>(du), .n = n});
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_LE(rel_error(download_bf16(ctx, dg, n), dg_ref), kBf16Tol);
  EXPECT_LE(rel_error(download_bf16(ctx, du, n), du_ref), kBf16Tol);
}

// Unaligned pointers take the scalar kernels; both paths give the same bits.
TEST(CudaSwiglu, ScalarAndVectorKernelsAgree) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t n = 1000 + 3;
  std::vector<float> g = random_bf16(n + 1, 44, 2.0f), u = random_bf16(n + 1, 45), d = random_bf16(n + 1, 46);
  std::vector<float> got[2][3];
  for (int64_t offset : {0, 1}) {
    DeviceBuffer dg = upload_bf16(ctx, g), du = upload_bf16(ctx, u), dd = upload_bf16(ctx, d);
    DeviceBuffer dout = upload_bf16(ctx, std::vector<float>(n + 1));
    bf16_bits *pg = dptr<bf16_bits>(dg) + offset, *pu = dptr<bf16_bits>(du) + offset;
    ASSERT_TRUE(swiglu_forward(ctx, {.gate = pg, .up = pu, .out = dptr<bf16_bits>(dout) + offset, .n = n}).is_ok());
    ASSERT_TRUE(swiglu_backward(ctx, {.gate = pg, .up = pu, .d_out = dptr<bf16_bits>(dd) + offset, .d_gate = pg,
                                      .d_up = pu, .n = n})
                    .is_ok());
    got[offset][0] = download_bf16(ctx, dout, n + 1);
    got[offset][1] = download_bf16(ctx, dg, n + 1);
    got[offset][2] = download_bf16(ctx, du, n + 1);
  }
  for (int k = 0; k < 3; ++k) {  // elements 1..n-1 went through both runs
    EXPECT_EQ(std::vector<float>(got[0][k].begin() + 1, got[0][k].begin() + n),
              std::vector<float>(got[1][k].begin() + 1, got[1][k].begin() + n))
        << "output " << k;
  }
}

TEST(CudaEmbedding, GatherIsExactAndBackwardAddsRepeatedIds) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t vocab = 50, dim = 130, n = 40;
  std::vector<float> table = random_bf16(vocab * dim, 51), d_out = random_bf16(n * dim, 52);
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7) % 13 + (i == n - 1 ? vocab - 14 : 0));
  std::vector<float> out_ref(n * dim), dt0 = random_bf16(vocab * dim, 53), dt_ref = dt0;
  ref::embedding_forward({.tokens = view_i32(ids, {n}), .table = view(table, {vocab, dim}), .out = view(out_ref, {n, dim})});
  ref::embedding_backward({.tokens = view_i32(ids, {n}), .d_out = view(d_out, {n, dim}), .d_table = view(dt_ref, {vocab, dim})});
  DeviceBuffer d_ids = upload(ctx, ids), d_table = upload_bf16(ctx, table), d_o = upload_bf16(ctx, std::vector<float>(n * dim));
  DeviceBuffer d_dout = upload_bf16(ctx, d_out), d_dt = upload(ctx, dt0);
  Status st = embedding_forward(ctx, {.tokens = dptr<int32_t>(d_ids), .table = dptr<bf16_bits>(d_table),
                                      .out = dptr<bf16_bits>(d_o), .n = n, .vocab = vocab, .dim = dim});
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> out = download_bf16(ctx, d_o, n * dim);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], out_ref[i]) << "element " << i;
  st = embedding_backward(ctx, {.tokens = dptr<int32_t>(d_ids), .d_out = dptr<bf16_bits>(d_dout),
                                .d_table = dptr<float>(d_dt), .n = n, .vocab = vocab, .dim = dim});
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_LE(rel_error(download<float>(ctx, d_dt, vocab * dim), dt_ref), 1e-6);
}

// The q|k|v split and merge of the warp-per-token kernel against the one-
// thread-per-8-pairs kernel it replaced: the same bits, with RoPE and
// without, packed and strided rows, at the head_dims it takes (16 lanes
// down to 1 lane per head).
void check_qkv_kernels_agree(int64_t n_tokens, int64_t n_head, int64_t n_kv, int64_t hd, int64_t pad, bool rope) {
  SCOPED_TRACE(::testing::Message() << n_tokens << " tokens, heads " << n_head << "/" << n_kv << ", head_dim " << hd
                                    << ", pad " << pad << (rope ? ", rope" : ""));
  CudaContext ctx = make_context();
  const int64_t half = hd / 2, row = (n_head + 2 * n_kv) * hd, ld = pad ? row + pad : 0;
  const int64_t nq = n_tokens * n_head * hd, nkv = n_tokens * n_kv * hd, nrow = n_tokens * (ld ? ld : row);
  std::vector<float> ang = random_bf16(n_tokens * half, 7, 3.0f), c(ang.size()), s(ang.size());
  for (size_t i = 0; i < ang.size(); ++i) c[i] = std::cos(ang[i]), s[i] = std::sin(ang[i]);
  DeviceBuffer d_c = upload(ctx, c), d_s = upload(ctx, s);
  std::vector<float> got[2][4];  // [kernel][qkv row after merge, q, k, v after split]
  for (int k = 0; k < 2; ++k) {
    DeviceBuffer d_row = upload_bf16(ctx, random_bf16(nrow, 8)), d_q = upload_bf16(ctx, random_bf16(nq, 9));
    DeviceBuffer d_k = upload_bf16(ctx, random_bf16(nkv, 10)), d_v = upload_bf16(ctx, random_bf16(nkv, 11));
    QkvSplitArgs a{.qkv = dptr<bf16_bits>(d_row), .q = dptr<bf16_bits>(d_q), .k = dptr<bf16_bits>(d_k),
                   .v = dptr<bf16_bits>(d_v), .cos = rope ? dptr<float>(d_c) : nullptr,
                   .sin = rope ? dptr<float>(d_s) : nullptr, .n_tokens = n_tokens, .n_head = n_head,
                   .n_head_kv = n_kv, .head_dim = hd, .ld_qkv = ld, .thread_per_8_pairs = k == 1};
    // Merge the random dense heads into the row, then split the row again.
    Status st = qkv_merge(ctx, a);
    ASSERT_TRUE(st.is_ok()) << st.message();
    got[k][0] = download_bf16(ctx, d_row, nrow);
    st = qkv_split(ctx, a);
    ASSERT_TRUE(st.is_ok()) << st.message();
    got[k][1] = download_bf16(ctx, d_q, nq);
    got[k][2] = download_bf16(ctx, d_k, nkv);
    got[k][3] = download_bf16(ctx, d_v, nkv);
  }
  for (int w = 0; w < 4; ++w) {
    ASSERT_EQ(got[0][w].size(), got[1][w].size());
    for (size_t i = 0; i < got[0][w].size(); ++i)
      ASSERT_EQ(lathe::f32_to_bf16(got[0][w][i]), lathe::f32_to_bf16(got[1][w][i])) << "output " << w << " at " << i;
  }
}

TEST(CudaQkv, WarpPerTokenKernelIsBitwiseTheEarlierOne) {
  LATHE_SKIP_WITHOUT_GPU();
  for (bool rope : {true, false}) {
    check_qkv_kernels_agree(37, 32, 8, 64, 384, rope);  // the 1B shape, the LoRA columns beside the row
    check_qkv_kernels_agree(11, 32, 8, 128, 0, rope);   // the 8B shape, packed
    check_qkv_kernels_agree(5, 6, 3, 256, 8, rope);     // 16 lanes a head
    check_qkv_kernels_agree(9, 3, 1, 16, 0, rope);      // one lane a head, 5 heads in a 32-head pass
  }
}

// D = rowsum(dO ⊙ O) per (token, head) through both delta kernels against a
// double sum; out's rows ld_out apart (an odd stride takes the per-row
// kernel on the fast path too).
void check_delta(int n_tokens, int n_head, int hd, int64_t ld_out) {
  SCOPED_TRACE(::testing::Message() << n_tokens << " tokens, " << n_head << " heads, head_dim " << hd << ", ld_out "
                                    << ld_out);
  CudaContext ctx = make_context();
  const int64_t ld = ld_out ? ld_out : int64_t(n_head) * hd, rows = int64_t(n_tokens) * n_head;
  const std::vector<float> o = random_bf16(n_tokens * ld, 21), d_o = random_bf16(rows * hd, 22);
  std::vector<float> want(size_t(rows), 0.0f);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_head; ++h) {
      double acc = 0;
      for (int64_t i = 0; i < hd; ++i) acc += double(d_o[size_t((t * n_head + h) * hd + i)]) * o[size_t(t * ld + h * hd + i)];
      want[size_t(t * n_head + h)] = float(acc);
    }
  DeviceBuffer d_out = upload_bf16(ctx, o), d_dout = upload_bf16(ctx, d_o), ws = upload(ctx, std::vector<float>(rows));
  for (bool simple : {false, true}) {
    ASSERT_TRUE(fill_zero(ctx, ws.data(), size_t(rows) * 4).is_ok());
    AttentionVarlenBwdArgs a{.out = d_out.data(), .d_out = d_dout.data(), .workspace = ws.data(),
                             .n_tokens = n_tokens, .n_head = n_head, .head_dim = hd, .stream = ctx.stream(),
                             .simple = simple, .ld_out = ld_out};
    Status st = attention_varlen_backward_delta(a);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_LE(rel_error(download<float>(ctx, ws, rows), want), 1e-5) << (simple ? "simple" : "fast");
  }
}

TEST(CudaAttentionDelta, BothKernelsMatchDoubleSums) {
  LATHE_SKIP_WITHOUT_GPU();
  check_delta(37, 32, 64, 0);
  check_delta(13, 8, 128, 8 * 128 + 64);
  check_delta(21, 5, 32, 0);
  check_delta(9, 4, 64, 4 * 64 + 3);  // rows not 16-byte aligned: the per-row kernel
}

}  // namespace
}  // namespace lathe::cuda
