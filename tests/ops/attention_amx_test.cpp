// Training attention on AMX tiles (backends/cpu/attention_amx.h) against the
// f32 kernel: forward (out, lse) and backward (dq, dk, dv) over packed
// documents with GQA groups, lengths that are not multiples of 32 and an
// empty document. The products take bf16 operands, so the bound is bf16's
// (8 significant bits), where a masking, packing or layout slip is off by
// order one: measured on emulated tiles, out, dq, dk and dv within 1.6e-3
// to 5.9e-3 of their largest entry and lse within 2.1e-3; allowed 1.5e-2
// and 5e-3. The emulated tiles run the packing, blocking and softmax
// wherever AVX512-BF16 does; the hardware tiles, and the dispatch from
// attention_varlen_* with bf16_products, where the CPU has AMX. Without
// AMX, bf16_products keeps the f32 kernel with f32 exps: that path is
// checked against the f32 one at f32's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/attention_amx.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm_bf16.h"
#include "ops/op_test_util.h"

namespace lathe {
namespace {

struct AmxCase {
  std::vector<int32_t> cu;
  int64_t n_head, n_head_kv, head_dim;
};

const AmxCase kAmxCases[] = {{{0, 5}, 2, 1, 32}, {{0, 40, 40, 103}, 4, 2, 64}, {{0, 64, 97}, 2, 2, 32}};

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(DType::I32, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

struct Grads {
  Tensor out, lse, dq, dk, dv;
};

// One forward and backward; how: 0 the f32 kernel, 1 the dispatch with
// bf16_products, 2 emulated tiles, 3 hardware tiles.
Grads run(const AmxCase& c, int how, uint32_t seed) {
  const int64_t n = c.cu.back();
  Tensor q = testing::random_tensor(DType::F32, {n, c.n_head, c.head_dim}, seed);
  Tensor k = testing::random_tensor(DType::F32, {n, c.n_head_kv, c.head_dim}, seed + 1);
  Tensor v = testing::random_tensor(DType::F32, {n, c.n_head_kv, c.head_dim}, seed + 2);
  Tensor d_out = testing::random_tensor(DType::F32, {n, c.n_head, c.head_dim}, seed + 3);
  Tensor cu = i32(c.cu);
  int64_t longest = 0;
  for (size_t d = 0; d + 1 < c.cu.size(); ++d) longest = std::max<int64_t>(longest, c.cu[d + 1] - c.cu[d]);
  Tensor ws = Tensor::empty(DType::F32, {attention_varlen_workspace_floats(longest, 4)});
  Grads g{Tensor::zeros(DType::F32, q.shape()), Tensor::zeros(DType::F32, {n, c.n_head}),
          testing::random_tensor(DType::F32, q.shape(), seed + 4), testing::random_tensor(DType::F32, k.shape(), seed + 5),
          testing::random_tensor(DType::F32, k.shape(), seed + 6)};  // gradients are overwritten
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  AttentionVarlenArgs fa{.q = q, .k = k, .v = v, .out = g.out, .lse = g.lse, .cu_seqlens = cu, .workspace = ws,
                         .scale = scale, .bf16_products = how == 1};
  AttentionVarlenBackwardArgs ba{.q = q, .k = k, .v = v, .out = g.out, .lse = g.lse, .cu_seqlens = cu,
                                 .d_out = d_out, .d_q = g.dq, .d_k = g.dk, .d_v = g.dv, .workspace = ws,
                                 .scale = scale, .bf16_products = how == 1};
  if (how <= 1) {
    EXPECT_TRUE(cpu::attention_varlen_forward(fa).is_ok());
    EXPECT_TRUE(cpu::attention_varlen_backward(ba).is_ok());
  } else {
    const cpu::AmxTiles tiles = how == 2 ? cpu::AmxTiles::kEmulated : cpu::AmxTiles::kHardware;
    cpu::attention_varlen_forward_amx(fa, tiles);
    cpu::attention_varlen_backward_amx(ba, tiles);
  }
  return g;
}

void expect_close(const Grads& got, const Grads& want, double tol, double lse_tol) {
  std::printf("  rel errors: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", testing::rel_error(got.out, want.out),
              testing::rel_error(got.lse, want.lse), testing::rel_error(got.dq, want.dq),
              testing::rel_error(got.dk, want.dk), testing::rel_error(got.dv, want.dv));
  EXPECT_LE(testing::rel_error(got.out, want.out), tol);
  EXPECT_LE(testing::rel_error(got.lse, want.lse), lse_tol);
  EXPECT_LE(testing::rel_error(got.dq, want.dq), tol);
  EXPECT_LE(testing::rel_error(got.dk, want.dk), tol);
  EXPECT_LE(testing::rel_error(got.dv, want.dv), tol);
}

void check_tiles(int how) {
  uint32_t seed = 500;
  for (const AmxCase& c : kAmxCases) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.cu.back() << " heads=" << c.n_head << "/" << c.n_head_kv
                                      << " d=" << c.head_dim);
    ASSERT_TRUE(cpu::attention_amx_fits(c.head_dim, 0, c.cu.back()));
    expect_close(run(c, how, seed), run(c, 0, seed), 1.5e-2, 5e-3);
    seed += 10;
  }
}

TEST(AttentionAmx, EmulatedTilesMatchTheF32Kernel) {
  if (!cpu::has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine (the AMX kernel packs with it)";
  check_tiles(2);
}

TEST(AttentionAmx, HardwareTilesMatchTheF32Kernel) {
  if (!cpu::amx_bf16_available())
    GTEST_SKIP() << "no AMX-BF16 on this machine, or the OS did not grant the tile state";
  check_tiles(3);
  // bf16_products dispatches to the tiles when the bf16 GEMM path is AMX.
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAmx);
  const Grads tiles = run(kAmxCases[1], 3, 7), dispatched = run(kAmxCases[1], 1, 7);
  cpu::force_bf16_gemm_path(std::nullopt);
  expect_close(dispatched, tiles, 0.0, 0.0);
}

TEST(AttentionAmx, F32ExpsOffTheTilesStayNearTheF32Kernel) {
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAvx512Bf16);  // never the tiles
  uint32_t seed = 600;
  for (const AmxCase& c : kAmxCases) {
    expect_close(run(c, 1, seed), run(c, 0, seed), 1e-5, 1e-6);
    seed += 10;
  }
  cpu::force_bf16_gemm_path(std::nullopt);
  EXPECT_FALSE(cpu::attention_amx_fits(48, 0, 100));
  EXPECT_FALSE(cpu::attention_amx_fits(64, 16, 100));
  EXPECT_TRUE(cpu::attention_amx_fits(64, 100, 100));
}

}  // namespace
}  // namespace lathe
