// The decode step's small ops (decode_ops.h) besides the GEMV and the
// picks: the f32 residual stream's pre-norm and the step's inputs kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "backends/cuda/decode_ops.h"
#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

// h += delta + bias in f32, y = bf16(h·rstd·w): against double.
TEST(CudaResidualNorm, MatchesReference) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 4096}, {3, 64}, {200, 2048}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    std::vector<float> h = random_bf16(rows * dim, 11), delta = random_bf16(rows * dim, 12);
    std::vector<float> bias = random_bf16(dim, 13), w = random_bf16(dim, 14);
    DeviceBuffer dh = upload(ctx, h), dd = upload(ctx, delta), db = upload_bf16(ctx, bias), dw = upload_bf16(ctx, w);
    DeviceBuffer dy = upload_bf16(ctx, std::vector<float>(size_t(rows * dim)));
    ASSERT_TRUE(residual_norm(ctx, {.h = dptr<float>(dh), .delta = dptr<float>(dd), .bias = dptr<bf16_bits>(db),
                                    .w = dptr<bf16_bits>(dw), .y = dptr<bf16_bits>(dy), .rows = rows, .dim = dim,
                                    .eps = 1e-5f}).is_ok());
    std::vector<float> want_h(h.size()), want_y(h.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < dim; ++j) {
        const double v = double(h[r * dim + j]) + double(delta[r * dim + j]) + double(bias[j]);
        want_h[r * dim + j] = static_cast<float>(v);
        ss += v * v;
      }
      const double rstd = 1.0 / std::sqrt(ss / double(dim) + 1e-5);
      for (int64_t j = 0; j < dim; ++j) want_y[r * dim + j] = static_cast<float>(double(want_h[r * dim + j]) * rstd * w[j]);
    }
    EXPECT_LE(rel_error(download<float>(ctx, dh, rows * dim), want_h), 1e-6);
    EXPECT_LE(rel_error(download_bf16(ctx, dy, rows * dim), want_y), 4e-3);
  }
}

// The step's inputs kernel writes bitwise what embedding_f32 and rope_tables
// write (rows, seen bits, cos, sin), overlapped or not; an id outside the
// vocabulary gives a zero row and no seen bit.
TEST(CudaDecodeInputs, BitwiseTheEmbeddingAndTheRopeTables) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t vocab = 1000, dim = 2048, half = 32, words = (vocab + 31) / 32;
  const std::vector<float> table = random_bf16(vocab * dim, 21);
  std::vector<float> inv_freq(half);
  for (int64_t p = 0; p < half; ++p) inv_freq[p] = std::pow(500000.0f, -2.0f * float(p) / float(2 * half));
  DeviceBuffer d_table = upload_bf16(ctx, table), d_inv = upload(ctx, inv_freq);
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{7}, std::vector<int32_t>{999, -1, 0, 1000}}) {
    const int64_t n = int64_t(ids.size());
    std::vector<int32_t> pos(ids.size());
    for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(t * 4099 + 17);
    DeviceBuffer d_ids = upload(ctx, ids), d_pos = upload(ctx, pos);
    auto run = [&](int how) {  // 0: the two ops; 1: decode_inputs; 2: decode_inputs overlapped
      DeviceBuffer h = upload(ctx, std::vector<float>(n * dim, -1.0f)), c = upload(ctx, std::vector<float>(n * half));
      DeviceBuffer sn = upload(ctx, std::vector<float>(n * half)), seen = upload(ctx, std::vector<uint32_t>(n * words));
      const EmbeddingF32Args e{.tokens = dptr<int32_t>(d_ids), .table = dptr<bf16_bits>(d_table), .out = dptr<float>(h),
                               .n = n, .vocab = vocab, .dim = dim, .seen = dptr<uint32_t>(seen), .seen_stride = words};
      const RopeTablesCudaArgs r{.inv_freq = dptr<float>(d_inv), .positions = dptr<int32_t>(d_pos),
                                 .cos = dptr<float>(c), .sin = dptr<float>(sn), .n_tokens = n, .half = half};
      if (how == 0) {
        EXPECT_TRUE(embedding_f32(ctx, e).is_ok());
        EXPECT_TRUE(rope_tables(ctx, r).is_ok());
      } else {
        const Status st = decode_inputs(ctx, {.embedding = e, .rope = r, .overlap = how == 2});
        EXPECT_TRUE(st.is_ok()) << st.message();
      }
      return std::tuple{download<float>(ctx, h, n * dim), download<float>(ctx, c, n * half),
                        download<float>(ctx, sn, n * half), download<uint32_t>(ctx, seen, n * words)};
    };
    const auto want = run(0);
    EXPECT_EQ(std::get<0>(want)[0], table[int64_t(ids[0]) * dim]);  // the rows are the table's
    if (n > 1) EXPECT_EQ(std::get<0>(want)[dim], 0.0f);            // id -1: zeros
    for (int how : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << n << " rows, overlapped " << (how == 2));
      const auto got = run(how);
      EXPECT_EQ(std::get<0>(got), std::get<0>(want));
      EXPECT_EQ(std::get<1>(got), std::get<1>(want));
      EXPECT_EQ(std::get<2>(got), std::get<2>(want));
      EXPECT_EQ(std::get<3>(got), std::get<3>(want));
    }
  }
  const Status st =
      decode_inputs(ctx, {.embedding = {.n = 1, .vocab = vocab, .dim = dim}, .rope = {.n_tokens = 1, .half = half}});
  EXPECT_NE(st.message().find("cuda decode_inputs: null argument"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace lathe::cuda
