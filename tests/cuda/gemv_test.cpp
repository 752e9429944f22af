// The decode step's skinny GEMM (decode_ops.h) against a double reference:
// every epilogue, rows 1..20 (1..4 on the CUDA cores, 5..16 on the tensor
// cores when k is a multiple of 32, past 16 in two launches), output counts
// that do not fill the last block, k with fewer steps than warps, with and
// without bias, f32 inputs plain and RMSNorm'd in the kernel, persistent
// grids, the shared-memory ring (kGemvBulkShape) at every ring size, with
// the L2 prefetch of the next GEMV's first weights. Tolerances as in
// gemm_test.cpp: inputs are exact bf16 values and accumulation is f32, so an
// f32 output is within ~k·2⁻²⁴ of the reference (1e-4 of max|out| allowed);
// a bf16 output adds one rounding (2⁻⁹ relative: 4e-3 of max|out| allowed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/decode_ops.h"
#include "backends/cuda/gemv_bulk.h"
#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

struct Shape2 {
  int64_t n, k;
};
const Shape2 kShapes[] = {{1, 8}, {7, 64}, {33, 96}, {513, 2056}, {130, 4096}};
const int64_t kRows[] = {1, 2, 3, 4, 5, 8, 11, 16, 20};

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// out as gemv() defines it, from x [rows, k], w [wrows, k], bias, out0 (kAddF32).
std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& bias,
                             const std::vector<float>& out0, int64_t rows, int64_t n, int64_t k, GemvEpilogue e) {
  auto dot = [&](int64_t r, int64_t j) {
    double acc = 0;
    for (int64_t p = 0; p < k; ++p) acc += double(x[r * k + p]) * double(w[j * k + p]);
    return acc + (bias.empty() ? 0.0 : double(bias[j]));
  };
  std::vector<float> out(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double v;
      if (e == GemvEpilogue::kSwigluBf16 || e == GemvEpilogue::kSwigluF32) v = silu(dot(r, j)) * dot(r, n + j);
      else v = dot(r, j) + (e == GemvEpilogue::kAddF32 ? double(out0[r * n + j]) : 0.0);
      out[r * n + j] = static_cast<float>(v);
    }
  return out;
}

void run_case(CudaContext& ctx, int64_t rows, Shape2 s, GemvEpilogue e, bool with_bias, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows=" << rows << " n=" << s.n << " k=" << s.k << " epilogue="
                                    << static_cast<int>(e) << " bias=" << with_bias);
  const int64_t w_rows = e == GemvEpilogue::kSwigluBf16 || e == GemvEpilogue::kSwigluF32 ? 2 * s.n : s.n;
  const bool f32_out = e != GemvEpilogue::kStoreBf16 && e != GemvEpilogue::kSwigluBf16;
  std::vector<float> x = random_bf16(rows * s.k, seed), w = random_bf16(w_rows * s.k, seed + 1, 0.05f);
  std::vector<float> bias = with_bias ? random_bf16(w_rows, seed + 2) : std::vector<float>{};
  std::vector<float> out0 = e == GemvEpilogue::kAddF32 ? random_bf16(rows * s.n, seed + 3) : std::vector<float>(size_t(rows * s.n), 0.0f);
  DeviceBuffer dx = upload_bf16(ctx, x), dw = upload_bf16(ctx, w), db = upload_bf16(ctx, with_bias ? bias : std::vector<float>{0.0f});
  DeviceBuffer dout = f32_out ? upload(ctx, out0) : upload_bf16(ctx, out0);
  Status st = gemv(ctx, {.x = dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(dw), .bias = with_bias ? dptr<bf16_bits>(db) : nullptr,
                         .out = dout.data(), .rows = rows, .n = s.n, .k = s.k, .epilogue = e});
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> got = f32_out ? download<float>(ctx, dout, rows * s.n) : download_bf16(ctx, dout, rows * s.n);
  EXPECT_LE(rel_error(got, reference(x, w, bias, out0, rows, s.n, s.k, e)), f32_out ? 1e-4 : 4e-3);
}

TEST(CudaGemv, EveryEpilogueRowCountAndShape) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  uint32_t seed = 1;
  for (GemvEpilogue e : {GemvEpilogue::kStoreBf16, GemvEpilogue::kStoreF32, GemvEpilogue::kAddF32,
                         GemvEpilogue::kSwigluBf16, GemvEpilogue::kSwigluF32})
    for (const Shape2& s : kShapes)
      for (int64_t rows : kRows) run_case(ctx, rows, s, e, /*with_bias=*/rows % 2 == 1, seed += 5);
}

// The other block shapes (GemvArgs::shape): the same sums in another
// order, on the CUDA cores (1..4 rows, and 5..16 when k is not a multiple
// of 32, where the shape is ignored) and on the tensor cores.
TEST(CudaGemv, EveryBlockShape) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  for (uint8_t shape : {0, 1, 2, 3, int(kGemvBulkShape)})
    for (GemvEpilogue e : {GemvEpilogue::kStoreF32, GemvEpilogue::kSwigluF32})
      for (const Shape2& s : {Shape2{33, 96}, Shape2{130, 4096}, Shape2{20, 2056}})
        for (int64_t rows : {1, 2, 3, 4, 5, 16}) {
          SCOPED_TRACE(::testing::Message() << "shape=" << int(shape) << " rows=" << rows << " n=" << s.n
                                            << " k=" << s.k << " epilogue=" << static_cast<int>(e));
          const int64_t w_rows = e == GemvEpilogue::kSwigluF32 ? 2 * s.n : s.n;
          std::vector<float> x = random_bf16(rows * s.k, 40 + shape), w = random_bf16(w_rows * s.k, 41, 0.05f);
          DeviceBuffer dx = upload_bf16(ctx, x), dw = upload_bf16(ctx, w);
          DeviceBuffer dout = upload(ctx, std::vector<float>(size_t(rows * s.n)));
          Status st = gemv(ctx, {.x = dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(dw), .out = dout.data(), .rows = rows,
                                 .n = s.n, .k = s.k, .epilogue = e, .shape = shape});
          ASSERT_TRUE(st.is_ok()) << st.message();
          EXPECT_LE(rel_error(download<float>(ctx, dout, rows * s.n), reference(x, w, {}, {}, rows, s.n, s.k, e)),
                    1e-4);
        }
}

// Each row's result does not depend on the other rows, so a batched decode
// step gives every sequence the logits it would get alone: bitwise up to 4
// rows (the CUDA-core path, the same sums in the same order for any row
// count); on the tensor-core path a row's result does not depend on its
// slot either (rows reversed: equal up to f32 rounding).
std::vector<float> run_f32(CudaContext& ctx, const DeviceBuffer& dx, const DeviceBuffer& dw, int64_t rows, int64_t n,
                           int64_t k) {
  DeviceBuffer out = upload(ctx, std::vector<float>(size_t(rows * n)));
  Status st = gemv(ctx, {.x = dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(dw), .out = out.data(), .rows = rows, .n = n,
                         .k = k, .epilogue = GemvEpilogue::kStoreF32});
  EXPECT_TRUE(st.is_ok()) << st.message();
  return download<float>(ctx, out, rows * n);
}

TEST(CudaGemv, RowsAreIndependent) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t n = 300, k = 1024, rows = 16;
  std::vector<float> x = random_bf16(rows * k, 7), w = random_bf16(n * k, 8, 0.05f);
  DeviceBuffer dw = upload_bf16(ctx, w);
  auto rows_of = [&](int64_t first, int64_t count, bool reversed) {
    std::vector<float> sub;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = first + (reversed ? count - 1 - i : i);
      sub.insert(sub.end(), x.begin() + r * k, x.begin() + (r + 1) * k);
    }
    return upload_bf16(ctx, sub);
  };
  const std::vector<float> four = run_f32(ctx, rows_of(0, 4, false), dw, 4, n, k);
  for (int64_t r = 0; r < 4; ++r) {
    const std::vector<float> alone = run_f32(ctx, rows_of(r, 1, false), dw, 1, n, k);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), four.begin() + r * n)) << "row " << r;
  }
  const std::vector<float> fwd = run_f32(ctx, rows_of(0, rows, false), dw, rows, n, k);
  const std::vector<float> rev = run_f32(ctx, rows_of(0, rows, true), dw, rows, n, k);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> a(fwd.begin() + r * n, fwd.begin() + (r + 1) * n);
    const std::vector<float> b(rev.begin() + (rows - 1 - r) * n, rev.begin() + (rows - r) * n);
    EXPECT_LE(rel_error(b, a), 1e-6) << "row " << r;
  }
}

// f32 input (x_f32), plain or RMSNorm'd inside the kernel (norm_w): against
// the double reference of the input the kernel is documented to use:
// rstd·(x_f32·norm_w), as is on the CUDA cores (up to 4 rows; f32 outputs
// then held to 1e-4), with x_f32·norm_w rounded to bf16 on the tensor cores,
// where a last-bit difference in the f32 product can flip an input's
// rounding (held to the bf16 tolerance, 4e-3 of max|out|).
TEST(CudaGemv, F32InputPlainAndNormed) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  uint32_t seed = 500;
  const float eps = 1e-5f;
  for (uint8_t shape : {0, int(kGemvBulkShape)})
  for (bool normed : {false, true})
    for (GemvEpilogue e : {GemvEpilogue::kStoreBf16, GemvEpilogue::kStoreF32, GemvEpilogue::kSwigluF32})
      for (const Shape2& s : {Shape2{33, 96}, Shape2{130, 4096}})
        for (int64_t rows : {1, 3, 4, 5, 16}) {
          SCOPED_TRACE(::testing::Message() << "shape=" << int(shape) << " rows=" << rows << " n=" << s.n << " k="
                                            << s.k << " epilogue=" << static_cast<int>(e) << " normed=" << normed);
          const int64_t w_rows = e == GemvEpilogue::kSwigluF32 ? 2 * s.n : s.n;
          const bool tensor_cores = rows > 4 && s.k % 32 == 0;
          std::vector<float> h = random_bf16(rows * s.k, seed += 3, 2.0f);
          for (size_t i = 0; i < h.size(); ++i) h[i] += 1e-3f * float(i % 7);  // not bf16 values
          std::vector<float> nw = random_bf16(s.k, seed + 1), w = random_bf16(w_rows * s.k, seed + 2, 0.05f);
          std::vector<float> x(h.size());
          for (int64_t r = 0; r < rows; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < s.k; ++i) ss += double(h[r * s.k + i]) * h[r * s.k + i];
            const double rstd = 1.0 / std::sqrt(ss / double(s.k) + eps);
            for (int64_t i = 0; i < s.k; ++i) {
              const float v = normed ? h[r * s.k + i] * nw[i] : h[r * s.k + i];
              x[r * s.k + i] = static_cast<float>((tensor_cores ? round_bf16(v) : double(v)) * (normed ? rstd : 1.0));
            }
          }
          const bool f32_out = e != GemvEpilogue::kStoreBf16;
          DeviceBuffer dh = upload(ctx, h), dn = upload_bf16(ctx, nw), dw = upload_bf16(ctx, w);
          DeviceBuffer dout = upload(ctx, std::vector<float>(size_t(rows * s.n)));
          Status st = gemv(ctx, {.w = dptr<bf16_bits>(dw), .out = dout.data(), .rows = rows, .n = s.n, .k = s.k,
                                 .epilogue = e, .x_f32 = dptr<float>(dh),
                                 .norm_w = normed ? dptr<bf16_bits>(dn) : nullptr, .eps = eps, .shape = shape});
          ASSERT_TRUE(st.is_ok()) << st.message();
          std::vector<float> got = f32_out ? download<float>(ctx, dout, rows * s.n) : download_bf16(ctx, dout, rows * s.n);
          const double tol = f32_out && !(tensor_cores && normed) ? 1e-4 : 4e-3;
          EXPECT_LE(rel_error(got, reference(x, w, {}, {}, rows, s.n, s.k, e)), tol);
        }
}

// kRopeAppend: the q|k|v projection with RoPE and the cache append in its
// epilogue, against a double reference of the projection rotated the same
// way and rounded once: 4 q heads and 2 kv heads of 16, with a bias, on
// both paths (k 96 takes the tensor cores above 4 rows, k 40 never), plain
// bf16 x and f32 x normed in the kernel; row 2's position is past the cache,
// so its k and v go nowhere (q still does), and cache rows not appended to
// keep their contents.
TEST(CudaGemv, RopeAppendEpilogue) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int n_head = 4, n_kv = 2, hd = 16, half = hd / 2, max_ctx = 8;
  const int64_t n = (n_head + 2 * n_kv) * hd, kv = int64_t(n_kv) * hd;
  const float eps = 1e-5f, sentinel = 3.0f;
  uint32_t seed = 900;
  for (uint8_t shape : {0, int(kGemvBulkShape)})
  for (int64_t k : {96, 40})
    for (bool normed : {false, true})
      for (int64_t rows : {1, 2, 4, 5, 16, 20}) {
        SCOPED_TRACE(::testing::Message() << "shape=" << int(shape) << " rows=" << rows << " k=" << k
                                          << " normed=" << normed);
        const bool tensor_cores = rows > 4 && k % 32 == 0;
        std::vector<float> h = random_bf16(rows * k, seed += 7, 2.0f), nw = random_bf16(k, seed + 1);
        std::vector<float> w = random_bf16(n * k, seed + 2, 0.05f), bias = random_bf16(n, seed + 3);
        std::vector<float> cos = random_bf16(rows * half, seed + 4), sin = random_bf16(rows * half, seed + 5);
        std::vector<int32_t> pos(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) pos[r] = r == 2 ? max_ctx : static_cast<int32_t>((r * 3) % max_ctx);
        std::vector<float> x(h.size());  // the input the kernel is documented to use (rstd folded in)
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t i = 0; i < k; ++i) ss += double(h[r * k + i]) * h[r * k + i];
          const double rstd = normed ? 1.0 / std::sqrt(ss / double(k) + eps) : 1.0;
          for (int64_t i = 0; i < k; ++i) {
            const float v = normed ? h[r * k + i] * nw[i] : h[r * k + i];
            x[r * k + i] = static_cast<float>((tensor_cores && normed ? round_bf16(v) : double(v)) * rstd);
          }
        }
        const std::vector<float> proj = reference(x, w, bias, {}, rows, n, k, GemvEpilogue::kStoreF32);
        // Reference q and caches.
        std::vector<float> want_q(size_t(rows * n_head * hd)), want_k(size_t(rows * max_ctx * kv), sentinel);
        std::vector<float> want_v = want_k;
        for (int64_t r = 0; r < rows; ++r)
          for (int head = 0; head < n_head + 2 * n_kv; ++head)
            for (int p = 0; p < half; ++p) {
              const double x1 = proj[r * n + head * hd + p], x2 = proj[r * n + head * hd + p + half];
              const double c = cos[r * half + p], sn = sin[r * half + p];
              const bool is_v = head >= n_head + n_kv;
              const double o1 = is_v ? x1 : x1 * c - x2 * sn, o2 = is_v ? x2 : x2 * c + x1 * sn;
              float* dst;
              if (head < n_head) {
                dst = &want_q[(r * n_head + head) * hd];
              } else {
                if (pos[r] >= max_ctx) continue;
                const int hk = head - n_head - (is_v ? n_kv : 0);
                dst = &(is_v ? want_v : want_k)[(r * max_ctx + pos[r]) * kv + hk * hd];
              }
              dst[p] = static_cast<float>(o1);
              dst[p + half] = static_cast<float>(o2);
            }
        DeviceBuffer dx = upload_bf16(ctx, h), dh = upload(ctx, h), dn = upload_bf16(ctx, nw);
        DeviceBuffer dw = upload_bf16(ctx, w), db = upload_bf16(ctx, bias), dcos = upload(ctx, cos);
        DeviceBuffer dsin = upload(ctx, sin), dpos = upload(ctx, pos);
        DeviceBuffer dq = upload_bf16(ctx, std::vector<float>(want_q.size()));
        DeviceBuffer dk = upload_bf16(ctx, std::vector<float>(want_k.size(), sentinel));
        DeviceBuffer dv = upload_bf16(ctx, std::vector<float>(want_v.size(), sentinel));
        std::vector<bf16_bits*> ptrs(size_t(2 * rows));
        for (int64_t r = 0; r < rows; ++r) {
          ptrs[r] = dptr<bf16_bits>(dk) + r * max_ctx * kv;
          ptrs[rows + r] = dptr<bf16_bits>(dv) + r * max_ctx * kv;
        }
        DeviceBuffer dptrs = upload(ctx, ptrs);
        GemvArgs g{.w = dptr<bf16_bits>(dw), .bias = dptr<bf16_bits>(db), .rows = rows, .n = n, .k = k,
                   .epilogue = GemvEpilogue::kRopeAppend, .shape = shape};
        if (normed) {
          g.x_f32 = dptr<float>(dh);
          g.norm_w = dptr<bf16_bits>(dn);
          g.eps = eps;
        } else {
          g.x = dptr<bf16_bits>(dx);  // h is made of bf16 values
        }
        g.rope = {.q_out = dptr<bf16_bits>(dq), .k_caches = dptr<bf16_bits*>(dptrs),
                  .v_caches = dptr<bf16_bits*>(dptrs) + rows, .pos = dptr<int32_t>(dpos), .cos = dptr<float>(dcos),
                  .sin = dptr<float>(dsin), .n_head = n_head, .n_head_kv = n_kv, .head_dim = hd, .max_ctx = max_ctx};
        Status st = gemv(ctx, g);
        ASSERT_TRUE(st.is_ok()) << st.message();
        EXPECT_LE(rel_error(download_bf16(ctx, dq, rows * n_head * hd), want_q), 4e-3);
        EXPECT_LE(rel_error(download_bf16(ctx, dk, rows * max_ctx * kv), want_k), 4e-3);
        EXPECT_LE(rel_error(download_bf16(ctx, dv, rows * max_ctx * kv), want_v), 4e-3);
        // Rows never appended to still hold the sentinel, exactly.
        const std::vector<float> got_k = download_bf16(ctx, dk, rows * max_ctx * kv);
        for (size_t i = 0; i < got_k.size(); ++i)
          if (want_k[i] == sentinel) ASSERT_EQ(got_k[i], sentinel) << "k cache element " << i;
      }
}

// Split k (GemvArgs::split; n small for the GPU, so the grid splits k into
// several slices per row tile): the same sums, f32 inputs normed in the
// kernel too (the sum of squares then also comes in slices); a row's
// result is bitwise the same alone and among 4 rows; the counts are zero
// again after every call. Then the tensor-core path's split.
TEST(CudaGemv, SplitK) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  DeviceBuffer counts = upload(ctx, std::vector<int32_t>(size_t(kGemvSplitCounts), 0));
  DeviceBuffer part = upload(ctx, std::vector<float>(size_t(kGemvSplitFloats), 0.0f));
  const GemvSplit split{.counts = dptr<int>(counts), .part = dptr<float>(part), .count_capacity = kGemvSplitCounts,
                        .part_capacity = kGemvSplitFloats};
  const float eps = 1e-5f;
  uint32_t seed = 1300;
  for (uint8_t shape : {0, 1, 2, 3})
    for (GemvEpilogue e : {GemvEpilogue::kStoreF32, GemvEpilogue::kAddF32, GemvEpilogue::kSwigluF32})
      for (bool normed : {false, true})
        for (const Shape2& s : {Shape2{130, 4096}, Shape2{20, 2056}}) {
          SCOPED_TRACE(::testing::Message() << "shape=" << int(shape) << " n=" << s.n << " k=" << s.k
                                            << " epilogue=" << static_cast<int>(e) << " normed=" << normed);
          const int64_t rows = 4, w_rows = e == GemvEpilogue::kSwigluF32 ? 2 * s.n : s.n;
          std::vector<float> h = random_bf16(rows * s.k, seed += 5), nw = random_bf16(s.k, seed + 1);
          std::vector<float> w = random_bf16(w_rows * s.k, seed + 2, 0.05f), bias = random_bf16(w_rows, seed + 3);
          std::vector<float> out0 = random_bf16(rows * s.n, seed + 4);
          std::vector<float> x(h.size());
          for (int64_t r = 0; r < rows; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < s.k; ++i) ss += double(h[r * s.k + i]) * h[r * s.k + i];
            const double rstd = normed ? 1.0 / std::sqrt(ss / double(s.k) + eps) : 1.0;
            for (int64_t i = 0; i < s.k; ++i)
              x[r * s.k + i] = static_cast<float>(double(normed ? h[r * s.k + i] * nw[i] : h[r * s.k + i]) * rstd);
          }
          DeviceBuffer dh = upload(ctx, h), dn = upload_bf16(ctx, nw), dw = upload_bf16(ctx, w);
          DeviceBuffer db = upload_bf16(ctx, bias);
          auto run = [&](int64_t first, int64_t count) {
            std::vector<float> o0(out0.begin() + first * s.n, out0.begin() + (first + count) * s.n);
            DeviceBuffer dout = upload(ctx, o0);
            Status st = gemv(ctx, {.w = dptr<bf16_bits>(dw), .bias = dptr<bf16_bits>(db), .out = dout.data(),
                                   .rows = count, .n = s.n, .k = s.k, .epilogue = e, .x_f32 = dptr<float>(dh) + first * s.k,
                                   .norm_w = normed ? dptr<bf16_bits>(dn) : nullptr, .eps = eps, .shape = shape,
                                   .split = split});
            EXPECT_TRUE(st.is_ok()) << st.message();
            return download<float>(ctx, dout, count * s.n);
          };
          const std::vector<float> four = run(0, rows);
          EXPECT_LE(rel_error(four, reference(x, w, bias, out0, rows, s.n, s.k, e)), 1e-4);
          for (int64_t r = 0; r < rows; ++r) {
            const std::vector<float> alone = run(r, 1);
            EXPECT_TRUE(std::equal(alone.begin(), alone.end(), four.begin() + r * s.n)) << "row " << r;
          }
          const std::vector<int32_t> left = download<int32_t>(ctx, counts, kGemvSplitCounts);
          EXPECT_TRUE(std::all_of(left.begin(), left.end(), [](int32_t v) { return v == 0; }));
        }
  // The tensor-core path (5..16 rows) splits the same way, bf16 x, or f32 x
  // (rounded to bf16 as it loads: bf16 values here, so the same reference).
  for (uint8_t shape : {0, 1, 2, 3})
    for (GemvEpilogue e : {GemvEpilogue::kStoreF32, GemvEpilogue::kAddF32, GemvEpilogue::kSwigluF32})
      for (int64_t rows : {5, 16})
      for (bool f32 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "tensor cores: shape=" << int(shape) << " rows=" << rows
                                          << " epilogue=" << static_cast<int>(e) << " f32 x=" << f32);
        const Shape2 s{130, 4096};
        const int64_t w_rows = e == GemvEpilogue::kSwigluF32 ? 2 * s.n : s.n;
        std::vector<float> x = random_bf16(rows * s.k, seed += 5), w = random_bf16(w_rows * s.k, seed + 1, 0.05f);
        std::vector<float> bias = random_bf16(w_rows, seed + 2), out0 = random_bf16(rows * s.n, seed + 3);
        DeviceBuffer dx = f32 ? upload(ctx, x) : upload_bf16(ctx, x), dw = upload_bf16(ctx, w);
        DeviceBuffer db = upload_bf16(ctx, bias);
        DeviceBuffer dout = upload(ctx, out0);
        Status st = gemv(ctx, {.x = f32 ? nullptr : dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(dw),
                               .bias = dptr<bf16_bits>(db), .out = dout.data(), .rows = rows, .n = s.n, .k = s.k,
                               .epilogue = e, .x_f32 = f32 ? dptr<float>(dx) : nullptr, .shape = shape,
                               .split = split});
        ASSERT_TRUE(st.is_ok()) << st.message();
        EXPECT_LE(rel_error(download<float>(ctx, dout, rows * s.n), reference(x, w, bias, out0, rows, s.n, s.k, e)),
                  1e-4);
        const std::vector<int32_t> left = download<int32_t>(ctx, counts, kGemvSplitCounts);
        EXPECT_TRUE(std::all_of(left.begin(), left.end(), [](int32_t v) { return v == 0; }));
      }
}

// A GEMV's output for the bitwise comparisons below: out, uploaded from o0
// (kAddF32 adds to it), or for kRopeAppend q then both caches (cache_elems
// per sequence, filled with 3.0 first); g's other rope fields are the
// caller's.
std::vector<float> gemv_output(CudaContext& ctx, GemvArgs g, const std::vector<float>& o0, int64_t cache_elems) {
  const bool rope = g.epilogue == GemvEpilogue::kRopeAppend;
  const int64_t n_q = rope ? g.rows * g.rope.n_head * g.rope.head_dim : 1;
  DeviceBuffer out = upload(ctx, o0), q = upload_bf16(ctx, std::vector<float>(size_t(n_q)));
  DeviceBuffer caches = upload_bf16(ctx, std::vector<float>(size_t(2 * g.rows * cache_elems), 3.0f));
  std::vector<bf16_bits*> ptrs(size_t(2 * g.rows));
  for (int64_t r = 0; r < 2 * g.rows; ++r) ptrs[r] = dptr<bf16_bits>(caches) + r * cache_elems;
  DeviceBuffer dptrs = upload(ctx, ptrs);
  if (rope) {
    g.rope.q_out = dptr<bf16_bits>(q);
    g.rope.k_caches = dptr<bf16_bits*>(dptrs);
    g.rope.v_caches = dptr<bf16_bits*>(dptrs) + g.rows;
  } else {
    g.out = out.data();
  }
  Status st = gemv(ctx, g);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!rope) return download<float>(ctx, out, g.rows * g.n);
  std::vector<float> got = download_bf16(ctx, q, n_q);
  const std::vector<float> c = download_bf16(ctx, caches, 2 * g.rows * cache_elems);
  got.insert(got.end(), c.begin(), c.end());
  return got;
}

// Persistent grids (GemvArgs::persistent: one block per resident slot, each
// an equal run of output columns tile after tile) compute every output with
// the same sums in the same order as one block per tile: bitwise equal, for
// each epilogue (RoPE + append: q and both caches), 1..4 rows, every block
// shape, bf16 x and f32 x normed in the kernel, outputs that do not fill the
// last tile, and grids of many more tiles than the GPU holds at once.
TEST(CudaGemv, PersistentGridEqualsOneBlockPerTileBitwise) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t k = 64, n = 4099, max_ctx = 4;
  const int n_head = 48, n_kv = 8, hd = 64;  // RoPE: 4096 weight rows, 2048 pairs
  const int64_t n_rope = int64_t(n_head + 2 * n_kv) * hd, kv = int64_t(n_kv) * hd;
  DeviceBuffer dw = upload_bf16(ctx, random_bf16(2 * n * k, 60, 0.05f)), dnorm = upload_bf16(ctx, random_bf16(k, 61));
  DeviceBuffer dx = upload_bf16(ctx, random_bf16(4 * k, 62)), dh = upload(ctx, random_bf16(4 * k, 63, 2.0f));
  DeviceBuffer dcos = upload(ctx, random_bf16(4 * hd / 2, 64)), dsin = upload(ctx, random_bf16(4 * hd / 2, 65));
  DeviceBuffer dpos = upload(ctx, std::vector<int32_t>{0, 3, 1, 2});
  for (GemvEpilogue e : {GemvEpilogue::kStoreF32, GemvEpilogue::kAddF32, GemvEpilogue::kSwigluF32,
                         GemvEpilogue::kRopeAppend})
    for (uint8_t shape : {0, 1, 2, 3})
      for (int64_t rows : {1, 2, 3, 4})
        for (bool normed : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "epilogue=" << static_cast<int>(e) << " shape=" << int(shape)
                                            << " rows=" << rows << " normed=" << normed);
          const bool rope = e == GemvEpilogue::kRopeAppend;
          const int64_t n_out = rope ? n_rope : n;
          auto run = [&](bool persistent) {
            GemvArgs g{.w = dptr<bf16_bits>(dw), .rows = rows, .n = n_out, .k = k, .epilogue = e, .shape = shape,
                       .persistent = persistent};
            if (normed) {
              g.x_f32 = dptr<float>(dh);
              g.norm_w = dptr<bf16_bits>(dnorm);
            } else {
              g.x = dptr<bf16_bits>(dx);
            }
            if (rope)
              g.rope = {.pos = dptr<int32_t>(dpos), .cos = dptr<float>(dcos), .sin = dptr<float>(dsin),
                        .n_head = n_head, .n_head_kv = n_kv, .head_dim = hd, .max_ctx = static_cast<int>(max_ctx)};
            return gemv_output(ctx, g, random_bf16(rows * n_out, 66), max_ctx * kv);
          };
          EXPECT_TRUE(run(true) == run(false));
        }
}

// The shared-memory ring (kGemvBulkShape): each output is the same sums in
// the same order whatever the ring's size (2 slots, wrapped many times, to
// all of an SM's memory), the blocks per SM, how the producer first fills
// it (the first unit alone, or all at once) and the number of x rows:
// bitwise, for each epilogue (RoPE + append: q and both caches), bf16 x and
// f32 x normed in the kernel, k of several stages with a short last one,
// blocks of many tiles and outputs that do not fill the last one; and
// within the f32 tolerance of the double reference.
TEST(CudaGemv, BulkRingIsBitwiseTheSameForAnyRingGridAndRowCount) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t k = 2056, n = 4099, max_ctx = 4;
  const int n_head = 48, n_kv = 8, hd = 64;  // RoPE: 4096 weight rows, 2048 pairs
  const int64_t n_rope = int64_t(n_head + 2 * n_kv) * hd, kv = int64_t(n_kv) * hd;
  const std::vector<float> w = random_bf16(2 * n * k, 70, 0.05f), x = random_bf16(4 * k, 72);
  const std::vector<float> out0 = random_bf16(4 * n_rope, 76);
  DeviceBuffer dw = upload_bf16(ctx, w), dnorm = upload_bf16(ctx, random_bf16(k, 71));
  DeviceBuffer dx = upload_bf16(ctx, x), dh = upload(ctx, random_bf16(4 * k, 73, 2.0f));
  DeviceBuffer dcos = upload(ctx, random_bf16(4 * hd / 2, 74)), dsin = upload(ctx, random_bf16(4 * hd / 2, 75));
  DeviceBuffer dpos = upload(ctx, std::vector<int32_t>{0, 3, 1, 2});
  struct Ring {
    uint16_t kib;
    uint8_t per_sm;
    bool at_once = false;
  };
  for (GemvEpilogue e : {GemvEpilogue::kStoreF32, GemvEpilogue::kAddF32, GemvEpilogue::kSwigluF32,
                         GemvEpilogue::kRopeAppend})
    for (bool normed : {false, true}) {
      const bool rope = e == GemvEpilogue::kRopeAppend;
      const int64_t n_out = rope ? n_rope : n;
      auto run = [&](int64_t first, int64_t rows, Ring ring) {
        GemvArgs g{.w = dptr<bf16_bits>(dw), .rows = rows, .n = n_out, .k = k, .epilogue = e, .shape = kGemvBulkShape,
                   .ring_kib = ring.kib, .blocks_per_sm = ring.per_sm};
        g.ring_fill_at_once = ring.at_once;
        if (normed) {
          g.x_f32 = dptr<float>(dh) + first * k;
          g.norm_w = dptr<bf16_bits>(dnorm);
        } else {
          g.x = dptr<bf16_bits>(dx) + first * k;
        }
        if (rope)
          g.rope = {.pos = dptr<int32_t>(dpos) + first, .cos = dptr<float>(dcos) + first * hd / 2,
                    .sin = dptr<float>(dsin) + first * hd / 2, .n_head = n_head, .n_head_kv = n_kv, .head_dim = hd,
                    .max_ctx = static_cast<int>(max_ctx)};
        const std::vector<float> o0(out0.begin() + first * n_out, out0.begin() + (first + rows) * n_out);
        return gemv_output(ctx, g, o0, max_ctx * kv);
      };
      for (int64_t rows : {1, 2, 3, 4}) {
        SCOPED_TRACE(::testing::Message() << "epilogue=" << static_cast<int>(e) << " rows=" << rows
                                          << " normed=" << normed);
        const std::vector<float> base = run(0, rows, {0, 0});
        for (Ring ring : {Ring{32, 1}, Ring{224, 1}, Ring{96, 2}, Ring{48, 3}, Ring{96, 2, true}, Ring{32, 1, true}})
          EXPECT_TRUE(run(0, rows, ring) == base) << "ring " << ring.kib << " KiB, " << int(ring.per_sm) << "/SM"
                                                  << (ring.at_once ? ", filled at once" : "");
        if (!rope && !normed) {
          const std::vector<float> want = reference(x, w, {}, out0, rows, n, k, e);
          EXPECT_LE(rel_error(base, want), 1e-4);
        }
        if (rope || rows == 1) continue;
        for (int64_t r = 0; r < rows; ++r) {  // each row alone: its part of the rows' output
          const std::vector<float> alone = run(r, 1, {0, 0});
          EXPECT_TRUE(std::equal(alone.begin(), alone.end(), base.begin() + r * n_out)) << "row " << r;
        }
      }
    }
}

// The L2 prefetch (GemvPrefetch): the byte ranges the blocks of a ring GEMV
// pull into L2 for the next one, against the next ring's units restated
// here. With more units than any block has, the blocks together cover
// every weight byte exactly once, whatever either grid; with one unit,
// exactly each next block's first tile (its first 8 rows, or 4 pairs: gate
// and up rows, RoPE's rows p and p + head_dim/2) over its first stage of k.
// Host arithmetic only (the device walks the same function).
TEST(CudaGemv, L2PrefetchRangesAreTheNextRingsFirstUnits) {
  struct Case {
    GemvEpilogue e;
    int64_t n, k, next_grid, grid;
  };
  const int hd = 64;  // RoPE: 10 heads of 64 rows, 320 pairs
  const Case cases[] = {{GemvEpilogue::kStoreF32, 2051, 2048, 264, 256}, {GemvEpilogue::kAddF32, 100, 4104, 7, 3},
                        {GemvEpilogue::kSwigluF32, 1003, 2056, 132, 264}, {GemvEpilogue::kSwigluBf16, 9, 64, 5, 9},
                        {GemvEpilogue::kRopeAppend, 10 * hd, 6144, 264, 132}, {GemvEpilogue::kRopeAppend, 10 * hd, 8, 3, 5}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "epilogue=" << static_cast<int>(c.e) << " n=" << c.n << " k=" << c.k
                                      << " grids " << c.next_grid << " <- " << c.grid);
    const bool swiglu = c.e == GemvEpilogue::kSwigluF32 || c.e == GemvEpilogue::kSwigluBf16;
    const bool rope = c.e == GemvEpilogue::kRopeAppend;
    const int64_t w_rows = swiglu ? 2 * c.n : c.n, row_bytes = c.k * 2, chunks = row_bytes / 16;
    GemvPrefetch p{.w = reinterpret_cast<const bf16_bits*>(uintptr_t(4096)), .n = c.n, .k = c.k, .grid = c.next_grid,
                   .units = 64, .head_dim = hd, .epilogue = c.e};
    // Every 16 bytes' count over all ranges of all blocks.
    auto coverage = [&](int units) {
      p.units = units;
      std::vector<int> count(size_t(w_rows * chunks), 0);
      for (int64_t b = 0; b < c.grid; ++b)
        for (auto [off, bytes] : gemv_l2_prefetch_ranges(p, b, c.grid)) {
          EXPECT_TRUE(off % 16 == 0 && bytes % 16 == 0 && bytes > 0 && bytes <= 4096) << off << " " << bytes;
          EXPECT_TRUE(off >= 0 && off + bytes <= w_rows * row_bytes) << off << " " << bytes;
          if (off < 0 || off + bytes > w_rows * row_bytes) continue;
          EXPECT_EQ(off / row_bytes, (off + bytes - 1) / row_bytes) << "a range within one row";
          for (int64_t i = off / 16; i < (off + bytes) / 16; ++i) ++count[size_t(i)];
        }
      return count;
    };
    const std::vector<int> all = coverage(64);
    EXPECT_TRUE(std::all_of(all.begin(), all.end(), [](int x) { return x == 1; }));
    // One unit: each next block's first tile over k [0, 2048).
    std::vector<int> want(size_t(w_rows * chunks), 0);
    const int64_t columns = rope ? c.n / 2 : c.n, tile = swiglu || rope ? 4 : 8;
    for (int64_t j = 0; j < c.next_grid; ++j) {
      const int64_t c0 = columns * j / c.next_grid, c1 = std::min(columns * (j + 1) / c.next_grid, c0 + tile);
      for (int64_t u = c0; u < c1; ++u) {
        std::vector<int64_t> rows_of{u};
        if (swiglu) rows_of.push_back(c.n + u);
        if (rope) rows_of = {u / (hd / 2) * hd + u % (hd / 2), u / (hd / 2) * hd + u % (hd / 2) + hd / 2};
        for (int64_t row : rows_of)
          for (int64_t i = 0; i < std::min<int64_t>(chunks, 2048 * 2 / 16); ++i) ++want[size_t(row * chunks + i)];
      }
    }
    EXPECT_TRUE(coverage(1) == want);
  }
}

// A ring GEMV that prefetches the next one's weights into L2 (units 1, 3
// and all of them, from a grid of another size) computes bitwise what it
// computes without, for each epilogue; the launch reports no error.
TEST(CudaGemv, BulkRingWithL2PrefetchIsBitwiseTheSame) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t k = 4104, n = 1030, max_ctx = 4;
  const int n_head = 12, n_kv = 2, hd = 64;
  const int64_t n_rope = int64_t(n_head + 2 * n_kv) * hd, kv = int64_t(n_kv) * hd;
  DeviceBuffer dw = upload_bf16(ctx, random_bf16(2 * n * k, 80, 0.05f)), dx = upload_bf16(ctx, random_bf16(2 * k, 81));
  DeviceBuffer dnext = upload_bf16(ctx, random_bf16(2 * n * k, 82, 0.05f));
  DeviceBuffer dcos = upload(ctx, random_bf16(2 * hd / 2, 84)), dsin = upload(ctx, random_bf16(2 * hd / 2, 85));
  DeviceBuffer dpos = upload(ctx, std::vector<int32_t>{1, 3});
  for (GemvEpilogue e : {GemvEpilogue::kAddF32, GemvEpilogue::kSwigluF32, GemvEpilogue::kRopeAppend})
    for (int64_t rows : {1, 2}) {
      const bool rope = e == GemvEpilogue::kRopeAppend;
      const int64_t n_out = rope ? n_rope : n;
      GemvArgs g{.x = dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(dw), .rows = rows, .n = n_out, .k = k, .epilogue = e,
                 .overlap = true, .shape = kGemvBulkShape, .blocks_per_sm = 2};
      if (rope)
        g.rope = {.pos = dptr<int32_t>(dpos), .cos = dptr<float>(dcos), .sin = dptr<float>(dsin), .n_head = n_head,
                  .n_head_kv = n_kv, .head_dim = hd, .max_ctx = static_cast<int>(max_ctx)};
      const std::vector<float> o0 = random_bf16(rows * n_out, 86);
      const std::vector<float> base = gemv_output(ctx, g, o0, max_ctx * kv);
      // The next GEMV: gate|up over the other weights, on a grid of one block per SM.
      const GemvArgs next{.x = dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(dnext), .rows = 1, .n = n, .k = k,
                          .epilogue = GemvEpilogue::kSwigluF32, .shape = kGemvBulkShape};
      // lag: at once, after all the block's units, all but its last 1, 2 or 64 (more than it has).
      for (auto [units, lag] : {std::pair{1, -1}, {3, -1}, {64, -1}, {1, 0}, {1, 1}, {3, 2}, {1, 64}}) {
        SCOPED_TRACE(::testing::Message() << "epilogue=" << static_cast<int>(e) << " rows=" << rows
                                          << " units=" << units << " lag=" << lag);
        GemvArgs with = g;
        with.prefetch = gemv_l2_prefetch(next, units, ctx.device(), lag);
        EXPECT_EQ(with.prefetch.units, units);
        EXPECT_EQ(with.prefetch.lag, lag);
        EXPECT_GT(with.prefetch.grid, 0);
        for (bool carveout : {false, true}) {
          with.max_carveout = carveout;
          EXPECT_TRUE(gemv_output(ctx, with, o0, max_ctx * kv) == base) << "max carveout " << carveout;
          ASSERT_TRUE(ctx.synchronize().is_ok());
        }
      }
      EXPECT_EQ(gemv_l2_prefetch(next, 0, ctx.device()).units, 0) << "no units: no prefetch";
      GemvArgs registers = next;
      registers.shape = 0;
      EXPECT_EQ(gemv_l2_prefetch(registers, 3, ctx.device()).w, nullptr) << "the next GEMV not on the ring";
    }
}

// The bench's chain diagnostic (launch_gemv_chain: GEMVs through one
// persistent ring kernel) computes each GEMV bitwise as the ring kernel
// does: one GEMV alone; two (k of one and of four stages) with the grid
// barrier between them, the second's outputs over the first's.
TEST(CudaGemv, ChainKernelComputesEachGemvAsTheRing) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t n1 = 1030, k1 = 2048, n2 = 300, k2 = 8192;
  DeviceBuffer dw1 = upload_bf16(ctx, random_bf16(n1 * k1, 100, 0.05f));
  DeviceBuffer dw2 = upload_bf16(ctx, random_bf16(n2 * k2, 101, 0.05f));
  DeviceBuffer dx = upload_bf16(ctx, random_bf16(k2, 102));
  DeviceBuffer dcount = upload(ctx, std::vector<uint32_t>(1, 0));
  auto ring = [&](const DeviceBuffer& w, int64_t n, int64_t k) {
    DeviceBuffer out = upload(ctx, std::vector<float>(size_t(n1), 0.0f));
    EXPECT_TRUE(gemv(ctx, {.x = dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(w), .out = out.data(), .rows = 1, .n = n,
                           .k = k, .epilogue = GemvEpilogue::kStoreF32, .shape = kGemvBulkShape, .ring_kib = 96,
                           .blocks_per_sm = 2})
                    .is_ok());
    return download<float>(ctx, out, n);
  };
  const std::vector<float> want1 = ring(dw1, n1, k1), want2 = ring(dw2, n2, k2);
  for (int count : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << count << " GEMVs");
    DeviceBuffer out = upload(ctx, std::vector<float>(size_t(n1), 0.0f));
    GemvChain c;
    c.w[0] = dptr<bf16_bits>(dw1), c.n[0] = n1, c.k[0] = k1;
    c.w[1] = dptr<bf16_bits>(dw2), c.n[1] = n2, c.k[1] = k2;
    c.count = count, c.x = dptr<bf16_bits>(dx), c.out = dptr<float>(out);
    c.barrier = count == 2 ? dptr<uint32_t>(dcount) : nullptr;
    ASSERT_EQ(launch_gemv_chain(c, 2, static_cast<cudaStream_t>(ctx.stream()), ctx.device()), cudaSuccess);
    ASSERT_TRUE(ctx.synchronize().is_ok());
    std::vector<float> want = want1;
    if (count == 2) std::copy(want2.begin(), want2.end(), want.begin());
    EXPECT_TRUE(download<float>(ctx, out, n1) == want);
  }
  GemvChain bad;
  EXPECT_NE(launch_gemv_chain(bad, 2, static_cast<cudaStream_t>(ctx.stream()), ctx.device()), cudaSuccess)
      << "an empty chain";
  bad.count = 1, bad.w[0] = dptr<bf16_bits>(dw1), bad.n[0] = n1, bad.k[0] = k1;
  bad.x = dptr<bf16_bits>(dx);
  for (int per_sm : {0, 3})
    EXPECT_NE(launch_gemv_chain(bad, per_sm, static_cast<cudaStream_t>(ctx.stream()), ctx.device()), cudaSuccess)
        << per_sm << " blocks per SM: not all resident at once";
}

TEST(CudaGemv, RefusesUnalignedK) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  DeviceBuffer dx = upload_bf16(ctx, random_bf16(12, 1)), dw = upload_bf16(ctx, random_bf16(12, 2));
  DeviceBuffer dout = upload(ctx, std::vector<float>(1));
  Status st = gemv(ctx, {.x = dptr<bf16_bits>(dx), .w = dptr<bf16_bits>(dw), .out = dout.data(), .rows = 1, .n = 1,
                         .k = 12, .epilogue = GemvEpilogue::kStoreF32});
  EXPECT_NE(st.message().find("multiple of 8"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace lathe::cuda
