// The trainer's fused-projection kernels (backends/cuda/train_fused.h)
// against naive host loops: the q|k|v split with and without RoPE, the merge
// of the gradients (RoPE undone), and SwiGLU on [gate | up] rows, on the
// 16-byte paths (head_dim a multiple of 16, inter a multiple of 8) and the
// scalar ones. Moves without rotation are exact; rotated and SwiGLU values
// are one bf16 rounding off the double reference (8e-3, as pointwise_test).
// Strided rows are checked bitwise against the packed calls.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cuda/train_fused.h"
#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

constexpr double kBf16Tol = 8e-3;

struct QkvCase {
  int64_t n_tokens, n_head, n_head_kv, head_dim;
};

// Random cos/sin of real angles, [n_tokens, half].
void angles(int64_t n_tokens, int64_t half, std::vector<float>* c, std::vector<float>* s) {
  std::vector<float> a = random_bf16(n_tokens * half, 5, 3.0f);
  c->resize(a.size()), s->resize(a.size());
  for (size_t i = 0; i < a.size(); ++i) (*c)[i] = std::cos(a[i]), (*s)[i] = std::sin(a[i]);
}

// Reference split: dense [q|k|v] heads from the fused rows, q and k rotated
// by sign·angle when rope.
void split_ref(const QkvCase& k, const std::vector<float>& qkv, const std::vector<float>& c,
               const std::vector<float>& s, bool rope, double sign, std::vector<float> (&out)[3]) {
  const int64_t hd = k.head_dim, half = hd / 2, slots = k.n_head + 2 * k.n_head_kv;
  out[0].assign(k.n_tokens * k.n_head * hd, 0.0f);
  out[1].assign(k.n_tokens * k.n_head_kv * hd, 0.0f);
  out[2].assign(k.n_tokens * k.n_head_kv * hd, 0.0f);
  for (int64_t t = 0; t < k.n_tokens; ++t)
    for (int64_t h = 0; h < slots; ++h) {
      const int which = h < k.n_head ? 0 : h < k.n_head + k.n_head_kv ? 1 : 2;
      const int64_t head = which == 0 ? h : which == 1 ? h - k.n_head : h - k.n_head - k.n_head_kv;
      const int64_t heads = which == 0 ? k.n_head : k.n_head_kv;
      const float* src = qkv.data() + (t * slots + h) * hd;
      float* dst = out[which].data() + (t * heads + head) * hd;
      for (int64_t p = 0; p < half; ++p) {
        double x1 = src[p], x2 = src[p + half];
        if (rope && which < 2) {
          const double cc = c[t * half + p], ss = sign * s[t * half + p];
          const double y1 = x1 * cc - x2 * ss, y2 = x2 * cc + x1 * ss;
          x1 = y1, x2 = y2;
        }
        dst[p] = float(x1), dst[p + half] = float(x2);
      }
    }
}

void check_qkv(const QkvCase& k, bool rope) {
  SCOPED_TRACE(::testing::Message() << k.n_tokens << " tokens, heads " << k.n_head << "/" << k.n_head_kv
                                    << ", head_dim " << k.head_dim << (rope ? ", rope" : ""));
  CudaContext ctx = make_context();
  const int64_t hd = k.head_dim, half = hd / 2, row = (k.n_head + 2 * k.n_head_kv) * hd;
  std::vector<float> qkv = random_bf16(k.n_tokens * row, 1), c, s;
  angles(k.n_tokens, half, &c, &s);
  std::vector<float> want[3];
  split_ref(k, qkv, c, s, rope, 1.0, want);
  DeviceBuffer d_qkv = upload_bf16(ctx, qkv), d_c = upload(ctx, c), d_s = upload(ctx, s);
  DeviceBuffer d_q = upload_bf16(ctx, want[0]), d_k = upload_bf16(ctx, want[1]), d_v = upload_bf16(ctx, want[2]);
  QkvSplitArgs a{.qkv = dptr<bf16_bits>(d_qkv), .q = dptr<bf16_bits>(d_q), .k = dptr<bf16_bits>(d_k),
                 .v = dptr<bf16_bits>(d_v), .cos = rope ? dptr<float>(d_c) : nullptr,
                 .sin = rope ? dptr<float>(d_s) : nullptr, .n_tokens = k.n_tokens, .n_head = k.n_head,
                 .n_head_kv = k.n_head_kv, .head_dim = hd};
  ASSERT_TRUE(fill_zero(ctx, a.q, want[0].size() * 2).is_ok());
  ASSERT_TRUE(fill_zero(ctx, a.k, want[1].size() * 2).is_ok());
  ASSERT_TRUE(fill_zero(ctx, a.v, want[2].size() * 2).is_ok());
  Status st = qkv_split(ctx, a);
  ASSERT_TRUE(st.is_ok()) << st.message();
  const DeviceBuffer* outs[3] = {&d_q, &d_k, &d_v};
  for (int w = 0; w < 3; ++w) {
    std::vector<float> got = download_bf16(ctx, *outs[w], int64_t(want[w].size()));
    if (rope && w < 2) {
      EXPECT_LE(rel_error(got, want[w]), kBf16Tol) << "part " << w;
    } else {
      EXPECT_EQ(got, want[w]) << "part " << w;  // moved, not rounded
    }
  }
  // Merge: the dense gradients back into one row, RoPE undone (rotation by
  // −angle); on a random dq|dk|dv.
  std::vector<float> grads[3] = {random_bf16(int64_t(want[0].size()), 2), random_bf16(int64_t(want[1].size()), 3),
                                 random_bf16(int64_t(want[2].size()), 4)};
  DeviceBuffer g_q = upload_bf16(ctx, grads[0]), g_k = upload_bf16(ctx, grads[1]), g_v = upload_bf16(ctx, grads[2]);
  a.q = dptr<bf16_bits>(g_q), a.k = dptr<bf16_bits>(g_k), a.v = dptr<bf16_bits>(g_v);
  st = qkv_merge(ctx, a);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> got = download_bf16(ctx, d_qkv, k.n_tokens * row);
  // The reference merge: split's inverse layout, rotated by −angle.
  std::vector<float> back(got.size());
  const int64_t slots = k.n_head + 2 * k.n_head_kv;
  for (int64_t t = 0; t < k.n_tokens; ++t)
    for (int64_t h = 0; h < slots; ++h) {
      const int which = h < k.n_head ? 0 : h < k.n_head + k.n_head_kv ? 1 : 2;
      const int64_t head = which == 0 ? h : which == 1 ? h - k.n_head : h - k.n_head - k.n_head_kv;
      const int64_t heads = which == 0 ? k.n_head : k.n_head_kv;
      const float* src = grads[which].data() + (t * heads + head) * hd;
      for (int64_t p = 0; p < half; ++p) {
        double x1 = src[p], x2 = src[p + half];
        if (rope && which < 2) {
          const double cc = c[t * half + p], ss = -double(s[t * half + p]);
          const double y1 = x1 * cc - x2 * ss, y2 = x2 * cc + x1 * ss;
          x1 = y1, x2 = y2;
        }
        back[(t * slots + h) * hd + p] = float(x1), back[(t * slots + h) * hd + p + half] = float(x2);
      }
    }
  if (rope) {
    EXPECT_LE(rel_error(got, back), kBf16Tol);
  } else {
    EXPECT_EQ(got, back);
  }
}

TEST(CudaTrainFused, QkvSplitAndMergeMatchReference) {
  LATHE_SKIP_WITHOUT_GPU();
  for (bool rope : {false, true}) {
    check_qkv({.n_tokens = 7, .n_head = 4, .n_head_kv = 2, .head_dim = 64}, rope);   // 16-byte path
    check_qkv({.n_tokens = 5, .n_head = 6, .n_head_kv = 3, .head_dim = 128}, rope);  // 16-byte path
    check_qkv({.n_tokens = 9, .n_head = 2, .n_head_kv = 1, .head_dim = 32}, rope);   // 16-byte path, one chunk
    check_qkv({.n_tokens = 6, .n_head = 3, .n_head_kv = 1, .head_dim = 24}, rope);   // scalar
  }
}

void check_swiglu_rows(int64_t n_tokens, int64_t inter) {
  SCOPED_TRACE(::testing::Message() << n_tokens << " x " << inter);
  CudaContext ctx = make_context();
  std::vector<float> gu = random_bf16(n_tokens * 2 * inter, 11, 2.0f), d = random_bf16(n_tokens * inter, 12);
  std::vector<float> out_ref(d.size()), dgu_ref(gu.size());
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t f = 0; f < inter; ++f) {
      const double g = gu[t * 2 * inter + f], u = gu[t * 2 * inter + inter + f], dd = d[t * inter + f];
      const double sg = 1.0 / (1.0 + std::exp(-g));
      out_ref[t * inter + f] = float(g * sg * u);
      dgu_ref[t * 2 * inter + f] = float(dd * u * sg * (1.0 + g * (1.0 - sg)));
      dgu_ref[t * 2 * inter + inter + f] = float(dd * g * sg);
    }
  DeviceBuffer d_gu = upload_bf16(ctx, gu), d_out = upload_bf16(ctx, std::vector<float>(d.size()));
  DeviceBuffer d_d = upload_bf16(ctx, d);
  Status st = swiglu_rows_forward(ctx, {.gu = dptr<bf16_bits>(d_gu), .out = dptr<bf16_bits>(d_out),
                                        .n_tokens = n_tokens, .inter = inter});
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_LE(rel_error(download_bf16(ctx, d_out, int64_t(d.size())), out_ref), kBf16Tol);
  // In place over [gate | up], as the trainer runs it.
  st = swiglu_rows_backward(ctx, {.gu = dptr<bf16_bits>(d_gu), .d_out = dptr<bf16_bits>(d_d),
                                  .d_gu = dptr<bf16_bits>(d_gu), .n_tokens = n_tokens, .inter = inter});
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_LE(rel_error(download_bf16(ctx, d_gu, int64_t(gu.size())), dgu_ref), kBf16Tol);
}

TEST(CudaTrainFused, SwigluRowsMatchReference) {
  LATHE_SKIP_WITHOUT_GPU();
  check_swiglu_rows(5, 136);  // 16-byte path
  check_swiglu_rows(3, 101);  // scalar
}

// Rows of `cols` values placed `ld` apart, the gaps holding `pad`.
std::vector<float> widen(const std::vector<float>& v, int64_t rows, int64_t cols, int64_t ld, float pad) {
  std::vector<float> out(size_t(rows * ld), pad);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[size_t(i * ld + j)] = v[size_t(i * cols + j)];
  return out;
}

// Strided rows (the trainer's x_ext and dy_ext rows carry LoRA columns after
// the fused values): the q|k|v split reads and the merge writes rows ld_qkv
// apart, SwiGLU reads gate|up and writes its output and the in-place
// gradient with strides; each bitwise the packed call, the gaps untouched.
void check_strided(const QkvCase& k, int64_t pad_qkv, int64_t inter, int64_t pad_gu, int64_t pad_out) {
  SCOPED_TRACE(::testing::Message() << "head_dim " << k.head_dim << " pad " << pad_qkv << ", inter " << inter
                                    << " pads " << pad_gu << "/" << pad_out);
  CudaContext ctx = make_context();
  const int64_t n = k.n_tokens, hd = k.head_dim, row = (k.n_head + 2 * k.n_head_kv) * hd, ld = row + pad_qkv;
  std::vector<float> qkv = random_bf16(n * row, 21), c, s;
  angles(n, hd / 2, &c, &s);
  DeviceBuffer d_c = upload(ctx, c), d_s = upload(ctx, s);
  DeviceBuffer packed = upload_bf16(ctx, qkv), wide = upload_bf16(ctx, widen(qkv, n, row, ld, 5.0f));
  std::vector<DeviceBuffer> dense;
  for (int64_t part : {k.n_head, k.n_head_kv, k.n_head_kv, k.n_head, k.n_head_kv, k.n_head_kv})
    dense.push_back(upload_bf16(ctx, std::vector<float>(size_t(n * part * hd))));
  QkvSplitArgs a{.qkv = dptr<bf16_bits>(packed), .q = dptr<bf16_bits>(dense[0]), .k = dptr<bf16_bits>(dense[1]),
                 .v = dptr<bf16_bits>(dense[2]), .cos = dptr<float>(d_c), .sin = dptr<float>(d_s), .n_tokens = n,
                 .n_head = k.n_head, .n_head_kv = k.n_head_kv, .head_dim = hd};
  ASSERT_TRUE(qkv_split(ctx, a).is_ok());
  QkvSplitArgs b = a;
  b.qkv = dptr<bf16_bits>(wide), b.ld_qkv = ld;
  b.q = dptr<bf16_bits>(dense[3]), b.k = dptr<bf16_bits>(dense[4]), b.v = dptr<bf16_bits>(dense[5]);
  ASSERT_TRUE(qkv_split(ctx, b).is_ok());
  const int64_t sizes[3] = {n * k.n_head * hd, n * k.n_head_kv * hd, n * k.n_head_kv * hd};
  for (int w = 0; w < 3; ++w)
    EXPECT_EQ(download<uint16_t>(ctx, dense[size_t(w)], sizes[w]), download<uint16_t>(ctx, dense[size_t(w + 3)], sizes[w]))
        << "split part " << w;
  // Merge the split values back (strided from the strided call's parts).
  ASSERT_TRUE(qkv_merge(ctx, a).is_ok());
  ASSERT_TRUE(qkv_merge(ctx, b).is_ok());
  std::vector<float> want = widen(download_bf16(ctx, packed, n * row), n, row, ld, 5.0f);
  EXPECT_EQ(download_bf16(ctx, wide, n * ld), want) << "merge";

  const int64_t ld_gu = 2 * inter + pad_gu, ld_out = inter + pad_out;
  std::vector<float> gu = random_bf16(n * 2 * inter, 22, 2.0f), d = random_bf16(n * inter, 23);
  DeviceBuffer gu1 = upload_bf16(ctx, gu), gu2 = upload_bf16(ctx, widen(gu, n, 2 * inter, ld_gu, 5.0f));
  DeviceBuffer o1 = upload_bf16(ctx, std::vector<float>(size_t(n * inter)));
  DeviceBuffer o2 = upload_bf16(ctx, std::vector<float>(size_t(n * ld_out), 5.0f));
  DeviceBuffer dd = upload_bf16(ctx, d);
  ASSERT_TRUE(swiglu_rows_forward(ctx, {.gu = dptr<bf16_bits>(gu1), .out = dptr<bf16_bits>(o1), .n_tokens = n,
                                        .inter = inter})
                  .is_ok());
  ASSERT_TRUE(swiglu_rows_forward(ctx, {.gu = dptr<bf16_bits>(gu2), .out = dptr<bf16_bits>(o2), .n_tokens = n,
                                        .inter = inter, .ld_gu = ld_gu, .ld_out = ld_out})
                  .is_ok());
  EXPECT_EQ(download_bf16(ctx, o2, n * ld_out), widen(download_bf16(ctx, o1, n * inter), n, inter, ld_out, 5.0f))
      << "swiglu forward";
  ASSERT_TRUE(swiglu_rows_backward(ctx, {.gu = dptr<bf16_bits>(gu1), .d_out = dptr<bf16_bits>(dd),
                                         .d_gu = dptr<bf16_bits>(gu1), .n_tokens = n, .inter = inter})
                  .is_ok());
  ASSERT_TRUE(swiglu_rows_backward(ctx, {.gu = dptr<bf16_bits>(gu2), .d_out = dptr<bf16_bits>(dd),
                                         .d_gu = dptr<bf16_bits>(gu2), .n_tokens = n, .inter = inter,
                                         .ld_gu = ld_gu, .ld_d_gu = ld_gu})
                  .is_ok());
  EXPECT_EQ(download_bf16(ctx, gu2, n * ld_gu), widen(download_bf16(ctx, gu1, n * 2 * inter), n, 2 * inter, ld_gu, 5.0f))
      << "swiglu backward";
  // In place with two strides is refused.
  EXPECT_FALSE(swiglu_rows_backward(ctx, {.gu = dptr<bf16_bits>(gu2), .d_out = dptr<bf16_bits>(dd),
                                          .d_gu = dptr<bf16_bits>(gu2), .n_tokens = n, .inter = inter,
                                          .ld_gu = ld_gu, .ld_d_gu = 0})
                   .is_ok());
}

TEST(CudaTrainFused, StridedRowsAreThePackedOnes) {
  LATHE_SKIP_WITHOUT_GPU();
  check_strided({.n_tokens = 7, .n_head = 4, .n_head_kv = 2, .head_dim = 64}, 384, 136, 256, 128);  // 16-byte paths
  check_strided({.n_tokens = 5, .n_head = 3, .n_head_kv = 1, .head_dim = 24}, 12, 101, 12, 4);      // scalar
  check_strided({.n_tokens = 4, .n_head = 2, .n_head_kv = 1, .head_dim = 32}, 12, 37, 12, 4);       // odd strides: scalar
}

}  // namespace
}  // namespace lathe::cuda
