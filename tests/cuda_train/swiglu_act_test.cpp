// swiglu_rows_backward_act (backends/cuda/cuda_ops.h), the kernel the LoRA
// trainer's down backward uses to get silu(gate)·up back: its [gate | up]
// gradient must be swiglu_rows_backward's and the act it writes over d_out
// swiglu_rows_forward's, bit for bit (the recompute modes' identical passes
// rest on it), on strided rows as the trainer runs it (gate|up in place,
// d_out in x_ext rows whose LoRA columns stay untouched) and packed, on the
// 16-byte path and the scalar one.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/train_fused.h"
#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;  // NOLINT: the shared test helpers

// Rows of `cols` values placed `ld` apart, the gaps holding `pad`.
std::vector<float> spread(const std::vector<float>& v, int64_t rows, int64_t cols, int64_t ld, float pad) {
  std::vector<float> out(size_t(rows * ld), pad);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[size_t(i * ld + j)] = v[size_t(i * cols + j)];
  return out;
}

void check(int64_t n, int64_t inter, int64_t pad_gu, int64_t pad_d, bool write_act) {
  SCOPED_TRACE(::testing::Message() << n << " x " << inter << " pads " << pad_gu << "/" << pad_d << " act "
                                    << write_act);
  CudaContext ctx = make_context();
  const int64_t ld_gu = 2 * inter + pad_gu, ld_d = inter + pad_d;
  const std::vector<float> gu = random_bf16(n * 2 * inter, 31, 2.0f), d = random_bf16(n * inter, 32);
  // The reference: the forward's act and the backward's gradient, packed.
  DeviceBuffer ref_gu = upload_bf16(ctx, gu), ref_act = upload_bf16(ctx, std::vector<float>(size_t(n * inter)));
  DeviceBuffer ref_d = upload_bf16(ctx, d);
  ASSERT_TRUE(swiglu_rows_forward(ctx, {.gu = dptr<bf16_bits>(ref_gu), .out = dptr<bf16_bits>(ref_act),
                                        .n_tokens = n, .inter = inter})
                  .is_ok());
  ASSERT_TRUE(swiglu_rows_backward(ctx, {.gu = dptr<bf16_bits>(ref_gu), .d_out = dptr<bf16_bits>(ref_d),
                                         .d_gu = dptr<bf16_bits>(ref_gu), .n_tokens = n, .inter = inter})
                  .is_ok());
  // The fused kernel on strided rows: gate|up in place, d_out → act in place.
  DeviceBuffer gu2 = upload_bf16(ctx, spread(gu, n, 2 * inter, ld_gu, 3.0f));
  DeviceBuffer d2 = upload_bf16(ctx, spread(d, n, inter, ld_d, 5.0f));
  Status st = swiglu_rows_backward_act(ctx, {.gu = dptr<bf16_bits>(gu2), .d_out = dptr<bf16_bits>(d2),
                                             .d_gu = dptr<bf16_bits>(gu2), .n_tokens = n, .inter = inter,
                                             .ld_gu = pad_gu ? ld_gu : 0, .ld_d_out = pad_d ? ld_d : 0,
                                             .ld_d_gu = pad_gu ? ld_gu : 0, .write_act = write_act});
  ASSERT_TRUE(st.is_ok()) << st.message();
  const std::vector<float> dgu = download_bf16(ctx, ref_gu, n * 2 * inter);
  EXPECT_EQ(download_bf16(ctx, gu2, n * ld_gu), spread(dgu, n, 2 * inter, ld_gu, 3.0f)) << "[gate | up] gradient";
  const std::vector<float> want = write_act ? download_bf16(ctx, ref_act, n * inter) : d;
  EXPECT_EQ(download_bf16(ctx, d2, n * ld_d), spread(want, n, inter, ld_d, 5.0f)) << (write_act ? "act" : "d_out kept");
}

TEST(SwigluRowsBackwardAct, IsTheForwardAndBackwardBitForBit) {
  LATHE_SKIP_WITHOUT_GPU();
  check(7, 136, 16, 8, true);   // 16-byte path, strided as in the trainer
  check(7, 136, 0, 0, true);    // packed
  check(5, 136, 16, 8, false);  // act kept elsewhere: d_out left as it was
  check(3, 101, 5, 3, true);    // scalar path
}

TEST(SwigluRowsBackwardAct, RefusesBadArguments) {
  if (!built_with_cuda()) GTEST_SKIP() << "no CUDA in this build";
  CudaContext ctx;  // the checks come before any launch
  bf16_bits* p = reinterpret_cast<bf16_bits*>(uintptr_t{256});
  auto bad = swiglu_rows_backward_act(ctx, {.gu = p, .d_out = p, .d_gu = p, .n_tokens = 2, .inter = 8, .ld_d_out = 4});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("ld_d_out 4"), std::string::npos) << bad.message();
  auto alias = swiglu_rows_backward_act(ctx, {.gu = p, .d_out = p, .d_gu = p, .n_tokens = 2, .inter = 8,
                                              .ld_gu = 24, .ld_d_gu = 16});
  ASSERT_FALSE(alias.is_ok());
  EXPECT_NE(alias.message().find("aliases"), std::string::npos) << alias.message();
  EXPECT_FALSE(swiglu_rows_backward_act(ctx, {.n_tokens = 2, .inter = 8}).is_ok());
}

}  // namespace
}  // namespace lathe::cuda
