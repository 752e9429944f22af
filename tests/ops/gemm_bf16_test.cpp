// gemm_bf16 against a naive double-precision reference, on every path
// (AMX and AVX512-BF16 where the machine has them, the AMX kernel with its
// tile instructions emulated, and the forced portable one), with edges in
// every dimension: rows not a multiple of the register tile or tile block,
// columns past a panel and past a thread block, odd k, k tails inside a
// tile, k over several packed blocks, leading dimensions wider than the
// matrices, accumulate and alpha.
// Then the LM head + cross-entropy with a bf16 (frozen) head, whose softmax
// is vectorized, against the reference on the same rounded weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"
#include "core/dtype.h"
#include "ops/op_test_util.h"
#include "ops/reference/reference.h"

namespace lathe {
namespace {

struct Case {
  bool trans_b;
  int64_t m, n, k;
  float alpha;
  bool accumulate;
};

struct Outcome {
  std::vector<float> got, exact_ref, rounded_ref;  // [m, ldc]
};

// gemm_bf16's signature: the dispatched entry point or one kernel.
using GemmFn = std::function<void(bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const uint16_t*,
                                  int64_t, bool, float*, int64_t)>;

void dispatched(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  cpu::gemm_bf16(trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void amx_emulated(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  cpu::gemm_bf16_amx(trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc, cpu::AmxTiles::kEmulated);
}

// ref_rounded: Σ bf16(a)·b in double (what the kernel computes up to f32
// summation order); ref_exact: Σ a·b with a unrounded (the f32 model's GEMM).
Outcome run_case(const Case& c, uint32_t seed, const GemmFn& gemm = dispatched) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int64_t lda = c.k + 3, ldb = (c.trans_b ? c.k : c.n) + 5, ldc = c.n + 2;
  const int64_t b_rows = c.trans_b ? c.n : c.k;
  std::vector<float> a(size_t(c.m * lda));
  std::vector<uint16_t> b(size_t(b_rows * ldb));
  std::vector<float> c0(size_t(c.m * ldc));
  for (float& x : a) x = d(rng);
  for (uint16_t& x : b) x = f32_to_bf16(d(rng));
  for (float& x : c0) x = d(rng);
  Outcome r;
  r.got = c0;
  r.exact_ref = c0;
  r.rounded_ref = c0;
  gemm(c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.accumulate, r.got.data(), ldc);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double exact = 0, rounded = 0;
      for (int64_t e = 0; e < c.k; ++e) {
        const double bv = bf16_to_f32(c.trans_b ? b[size_t(j * ldb + e)] : b[size_t(e * ldb + j)]);
        const float av = a[size_t(i * lda + e)];
        exact += double(av) * bv;
        rounded += double(bf16_to_f32(f32_to_bf16(av))) * bv;
      }
      const double base = c.accumulate ? c0[size_t(i * ldc + j)] : 0.0;
      r.exact_ref[size_t(i * ldc + j)] = float(base + c.alpha * exact);
      r.rounded_ref[size_t(i * ldc + j)] = float(base + c.alpha * rounded);
    }
  return r;
}

// max |got − want| / max |want| over C's m x n; padding columns must be untouched.
double rel_err(const std::vector<float>& got, const std::vector<float>& want, const Case& c) {
  const int64_t ldc = c.n + 2;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const double g = got[size_t(i * ldc + j)], w = want[size_t(i * ldc + j)];
      if (j >= c.n) {
        if (g != w) return INFINITY;  // wrote past the matrix
        continue;
      }
      if (std::isnan(g)) return INFINITY;
      diff = std::max(diff, std::abs(g - w));
      ref = std::max(ref, std::abs(w));
    }
  }
  return diff / ref;
}

const Case kCases[] = {
    {true, 13, 45, 37, 1.0f, false},    // every edge at once, one k block
    {false, 13, 45, 37, 1.0f, false},
    {true, 64, 300, 600, 1.0f, true},   // several column blocks and k blocks, accumulate
    {false, 64, 300, 600, 0.5f, true},
    {true, 9, 33, 1, 2.0f, false},      // k = 1: one half-empty pair
    {false, 100, 17, 1100, 1.0f, false},  // one narrow panel, long k
};

// The AMX kernel's own edges: 32-row and 32-column tile blocks, 64-column
// thread blocks, 32-wide k tiles, k blocks of up to 16 tiles.
const Case kAmxCases[] = {
    {true, 33, 65, 33, 1.0f, false},     // one past a tile block / thread block / k tile
    {false, 33, 65, 33, 1.0f, true},
    {true, 1, 1, 1, 1.0f, false},        // one element
    {false, 1, 1, 2, -1.5f, true},
    {true, 31, 129, 529, 0.25f, true},   // k: 17 tiles in two blocks, a 17-wide tail
    {false, 47, 100, 1024, 1.0f, false}, // k: exactly two full blocks
    {true, 16, 16, 32, 1.0f, false},     // exactly one tile of each
    {false, 70, 31, 63, 1.0f, false},    // odd k with a 31-wide tail
};

// Checks `gemm` on `cases`; rounds_a: whether the path rounds A to bf16.
void check_cases(std::span<const Case> cases, const GemmFn& gemm, bool rounds_a, const char* path) {
  uint32_t seed = 11;
  for (const Case& c : cases) {
    Outcome r = run_case(c, seed++, gemm);
    SCOPED_TRACE(::testing::Message() << "trans_b " << c.trans_b << " m " << c.m << " n " << c.n << " k " << c.k
                                      << " " << path);
    // A path that rounds A to bf16 does so exactly as the reference does, so
    // what is left is f32 summation order (~k · 2⁻²⁴ relative); the portable
    // path keeps A in f32 and matches the exact reference to the same order.
    EXPECT_LT(rel_err(r.got, rounds_a ? r.rounded_ref : r.exact_ref, c), 2e-6 * std::sqrt(double(c.k)) + 1e-6);
    // Against the f32 GEMM: bf16 rounding of A is 2⁻⁹ relative per element;
    // errors of random sign over k terms stay near that relative to the output.
    EXPECT_LT(rel_err(r.got, r.exact_ref, c), 8e-3);
  }
}

// 1 + 2⁻¹² is not a bf16 value: rounded it is 1, so 1 x 1 gives exactly 1.
void check_rounds_a(const GemmFn& gemm) {
  const float a[2] = {1.0f + 0x1.0p-12f, 0.0f};
  const uint16_t b[2] = {f32_to_bf16(1.0f), f32_to_bf16(1.0f)};
  float c = -1.0f;
  gemm(true, 1, 1, 2, 1.0f, a, 2, b, 2, false, &c, 1);
  EXPECT_EQ(c, 1.0f);
}

TEST(GemmBf16, MatchesReferenceOnTheVectorPath) {
  if (!cpu::has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine";
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAvx512Bf16);
  ASSERT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::kAvx512Bf16);
  check_cases(kCases, dispatched, true, "avx512bf16");
  check_cases(kAmxCases, dispatched, true, "avx512bf16");
  check_rounds_a(dispatched);
  cpu::force_bf16_gemm_path(std::nullopt);
}

TEST(GemmBf16, MatchesReferenceOnThePortablePath) {
  cpu::set_portable_only(true);
  ASSERT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::kF32);
  check_cases(kCases, dispatched, false, "portable");
  cpu::set_portable_only(false);
}

// Packing, blocking, edges and the store, with the tile instructions done in
// scalar code: runs wherever AVX512-BF16 does.
TEST(GemmBf16, AmxKernelMatchesReferenceWithEmulatedTiles) {
  if (!cpu::has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine (the AMX kernel packs with it)";
  check_cases(kCases, amx_emulated, true, "amx emulated");
  check_cases(kAmxCases, amx_emulated, true, "amx emulated");
  check_rounds_a(amx_emulated);
}

TEST(GemmBf16, MatchesReferenceOnTheAmxPath) {
  if (!cpu::amx_bf16_available())
    GTEST_SKIP() << "no AMX-BF16 on this machine, or the OS did not grant the tile state: the AMX path is not "
                    "tested here (it runs on Intel Xeon 4th generation and later)";
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAmx);
  ASSERT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::kAmx);
  check_cases(kCases, dispatched, true, "amx");
  check_cases(kAmxCases, dispatched, true, "amx");
  check_rounds_a(dispatched);
  // The tile configuration is per thread: calls from threads of the
  // caller's own, at once, must work as well as from the main thread.
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &ok] {
      const Case c{t % 2 == 0, 20 + t, 40 + t, 70 + t, 1.0f, false};
      Outcome r = run_case(c, 100 + uint32_t(t));
      ok[size_t(t)] = rel_err(r.got, r.rounded_ref, c) < 2e-6 * std::sqrt(double(c.k)) + 1e-6;
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[size_t(t)]) << "call from thread " << t;
  cpu::force_bf16_gemm_path(std::nullopt);
}

// A weight packed ahead (PackedBf16Weight): op(B) = wᵀ is its forward,
// op(B) = w its input gradient. B is copied to a dense w first (the handle
// takes w [out, in] without a leading dimension).
void packed_weight(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const int64_t out = trans_b ? n : k, in = trans_b ? k : n;
  std::vector<uint16_t> w(size_t(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) w[size_t(o * in + i)] = b[o * ldb + i];
  const cpu::PackedBf16Weight pw(w.data(), out, in);
  if (trans_b)
    pw.forward(m, alpha, a, lda, accumulate, c, ldc);
  else
    pw.backward(m, alpha, a, lda, accumulate, c, ldc);
}

// The AMX kernel on B packed by amx_pack_b, tiles emulated.
void amx_packed_emulated(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  std::vector<uint32_t> packed(size_t(cpu::amx_packed_b_words(n, k)));
  cpu::amx_pack_b(trans_b, n, k, b, ldb, packed.data());
  cpu::gemm_bf16_amx_packed(m, n, k, alpha, a, lda, packed.data(), accumulate, c, ldc, cpu::AmxTiles::kEmulated);
}

TEST(GemmBf16, PackedWeightMatchesReferenceOnEveryPath) {
  std::vector<std::pair<cpu::Bf16GemmPath, const char*>> paths = {{cpu::Bf16GemmPath::kF32, "f32 packed"}};
  if (cpu::has_avx512_bf16()) paths.push_back({cpu::Bf16GemmPath::kAvx512Bf16, "avx512bf16 packed"});
  if (cpu::amx_bf16_available()) paths.push_back({cpu::Bf16GemmPath::kAmx, "amx packed"});
  for (const auto& [path, name] : paths) {
    cpu::force_bf16_gemm_path(path);
    ASSERT_EQ(cpu::bf16_gemm_path(), path);
    const bool rounds_a = path != cpu::Bf16GemmPath::kF32;
    check_cases(kCases, packed_weight, rounds_a, name);
    check_cases(kAmxCases, packed_weight, rounds_a, name);
    if (rounds_a) check_rounds_a(packed_weight);
  }
  cpu::force_bf16_gemm_path(std::nullopt);
}

// The packing ahead changes where B is read from, nothing else: the AMX
// kernel gives the same bits both ways, and within one k block (k up to
// 512) so does the AVX512-BF16 kernel.
TEST(GemmBf16, PackedAheadGivesTheSameBits) {
  if (!cpu::has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine (nothing is packed)";
  check_cases(kAmxCases, amx_packed_emulated, true, "amx packed emulated");
  // Rows split over the threads (m large enough for 4 threads): the same
  // sums per element, so the same bits as the column split.
  for (const Case& c : {Case{true, 600, 70, 100, 1.0f, false}, Case{false, 600, 45, 70, 0.5f, true}}) {
    cpu::set_amx_rows_split(false);
    const Outcome cols = run_case(c, 60, amx_packed_emulated);
    cpu::set_amx_rows_split(true);  // the default
    const Outcome rows = run_case(c, 60, amx_packed_emulated);
    EXPECT_EQ(rows.got, cols.got) << "m " << c.m << " n " << c.n;
    EXPECT_LT(rel_err(rows.got, rows.rounded_ref, c), 2e-6 * std::sqrt(double(c.k)) + 1e-6);
  }
  uint32_t seed = 40;
  for (const Case& c : kAmxCases) {
    SCOPED_TRACE(::testing::Message() << "trans_b " << c.trans_b << " m " << c.m << " n " << c.n << " k " << c.k);
    EXPECT_EQ(run_case(c, seed, amx_packed_emulated).got, run_case(c, seed, amx_emulated).got);
    if (c.k <= 512) {
      cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAvx512Bf16);
      EXPECT_EQ(run_case(c, seed, packed_weight).got, run_case(c, seed).got);
      cpu::force_bf16_gemm_path(std::nullopt);
    }
    ++seed;
  }
}

// A group (gemm_bf16_amx_packed_group): items sharing A, a chain (an item
// reading as A the C an earlier one wrote: LoRA's u) and an accumulation
// into an earlier item's C, over rows that span several chunks and a tail.
// Each item gives the bits of its own gemm_bf16_amx_packed call, in order.
TEST(GemmBf16, PackedGroupGivesTheBitsOfItsCallsInTurn) {
  if (!cpu::has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine (the AMX kernel packs with it)";
  std::mt19937 rng(77);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto randv = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng);
    return v;
  };
  auto packed = [&](int64_t n, int64_t k) {
    std::vector<uint16_t> b(static_cast<size_t>(n * k));
    for (uint16_t& x : b) x = f32_to_bf16(d(rng));
    std::vector<uint32_t> p(static_cast<size_t>(cpu::amx_packed_b_words(n, k)));
    cpu::amx_pack_b(true, n, k, b.data(), k, p.data(), false);
    return p;
  };
  const int64_t m = 300, k = 100, r = 16, n1 = 70, n2 = 45;
  const std::vector<float> x = randv(m * k);
  const std::vector<uint32_t> w1 = packed(n1, k), w2 = packed(n2, k), a = packed(r, k), b = packed(n1, r);
  const std::vector<float> y2_in = randv(m * n2);
  std::vector<cpu::AmxTiles> tiles = {cpu::AmxTiles::kEmulated};
  if (cpu::amx_bf16_available()) tiles.push_back(cpu::AmxTiles::kHardware);
  for (const cpu::AmxTiles t : tiles) {
    SCOPED_TRACE(t == cpu::AmxTiles::kHardware ? "hardware tiles" : "emulated tiles");
    std::vector<float> y1[2], y2[2], u[2];
    for (int group = 0; group < 2; ++group) {
      y1[group].assign(size_t(m * n1), 0.0f), y2[group] = y2_in, u[group].assign(size_t(m * r), 0.0f);
      const cpu::AmxGroupItem items[] = {
          {n1, k, 1.0f, x.data(), k, w1.data(), false, y1[group].data(), n1},
          {n2, k, 0.5f, x.data(), k, w2.data(), true, y2[group].data(), n2},
          {r, k, 2.0f, x.data(), k, a.data(), false, u[group].data(), r},
          {n1, r, 1.0f, u[group].data(), r, b.data(), true, y1[group].data(), n1},
      };
      if (group) {  // every schedule gives the same bits
        for (const auto& [pairs, items_outer] : {std::pair{4, false}, {8, false}, {2, true}, {1, true}}) {
          std::fill(y1[1].begin(), y1[1].end(), 0.0f), std::fill(u[1].begin(), u[1].end(), 0.0f);
          std::copy(y2_in.begin(), y2_in.end(), y2[1].begin());  // in place: items hold the pointers
          cpu::set_amx_group_schedule(pairs, items_outer);
          cpu::gemm_bf16_amx_packed_group(m, items, t);
          cpu::set_amx_group_schedule(4, false);
          EXPECT_EQ(y1[1], y1[0]) << pairs << " " << items_outer;
          EXPECT_EQ(y2[1], y2[0]) << pairs << " " << items_outer;
          EXPECT_EQ(u[1], u[0]) << pairs << " " << items_outer;
        }
        continue;
      }
      for (const cpu::AmxGroupItem& it : items)
        cpu::gemm_bf16_amx_packed(m, it.n, it.k, it.alpha, it.a, it.lda, it.b_packed, it.accumulate, it.c, it.ldc, t);
    }
    EXPECT_NE(y2[0], y2_in);
  }
}

// A packed head on AMX tiles (emulated where the CPU has none) with a hidden
// size the fused head takes (cross_entropy_amx.h): its logits never reach
// memory, its softmax is online over vocabulary blocks and thread shares.
// Against the reference on the same bf16 weights at the bounds the
// unfused bf16 head meets (here, measured: loss 1.5e-5 both ways, dh 4.2e-3
// unfused and 4.4e-3 fused, against 5e-4 and 5e-3); rows over several chunks, ignored rows, a
// vocabulary with a ragged last column pair; the loss alone is the loss
// that comes with the gradient.
TEST(CrossEntropy, PackedHeadOnAmxTilesMatchesReference) {
  if (!cpu::has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine (the AMX code packs with it)";
  const int64_t n = 600, dim = 64, vocab = 1007;
  Tensor h = testing::random_tensor(DType::F32, {n, dim}, 80, 2.0f);
  Tensor w16 = testing::random_tensor(DType::BF16, {vocab, dim}, 81, 0.3f), w = w16.to_f32();
  Tensor targets = Tensor::empty(DType::I32, {n});
  for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = i % 7 == 3 ? kCrossEntropyIgnore : int32_t(i * 37 % vocab);
  cpu::set_amx_emulation(!cpu::amx_bf16_available());
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAmx);
  const cpu::PackedBf16Weight packed(w16.data<uint16_t>(), vocab, dim);
  Tensor ws = Tensor::empty(DType::F32, {cross_entropy_workspace_floats(vocab, dim, 1024)});
  Tensor dh = Tensor::zeros(DType::F32, {n, dim}), dh_ref = Tensor::zeros(DType::F32, {n, dim});
  CrossEntropyArgs args{.hidden = h, .w = w16, .targets = targets, .d_hidden = dh, .workspace = ws,
                        .chunk_rows = 1024, .grad_scale = 0.1f};
  auto got = cpu::cross_entropy(args, &packed);
  args.d_hidden = {};
  auto loss_only = cpu::cross_entropy(args, &packed);
  cpu::set_amx_emulation(false);
  cpu::force_bf16_gemm_path(std::nullopt);
  ASSERT_TRUE(got.is_ok() && loss_only.is_ok()) << got.status().message();
  CrossEntropyStats want = ref::cross_entropy({.hidden = h, .w = w, .targets = targets, .d_hidden = dh_ref,
                                               .workspace = ws, .chunk_rows = 1024, .grad_scale = 0.1f});
  EXPECT_EQ(got->n_valid, want.n_valid);
  EXPECT_NEAR(got->loss_sum, want.loss_sum, 5e-4 * std::abs(want.loss_sum));
  EXPECT_LE(testing::rel_error(dh, dh_ref), 5e-3);
  EXPECT_EQ(loss_only->loss_sum, got->loss_sum);
  std::printf("  fused head: loss rel error %.2e, dh rel error %.2e\n",
              std::abs(got->loss_sum - want.loss_sum) / std::abs(want.loss_sum), testing::rel_error(dh, dh_ref));
}

// An unrunnable forced path falls back instead of failing.
TEST(GemmBf16, ForcedPathFallsBackWhenUnavailable) {
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAmx);
  const cpu::Bf16GemmPath want = cpu::amx_bf16_available()   ? cpu::Bf16GemmPath::kAmx
                                 : cpu::has_avx512_bf16()     ? cpu::Bf16GemmPath::kAvx512Bf16
                                                              : cpu::Bf16GemmPath::kF32;
  EXPECT_EQ(cpu::bf16_gemm_path(), want);
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kF32);
  EXPECT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::kF32);
  cpu::force_bf16_gemm_path(std::nullopt);
}

// Bf16 head vs the f32 reference on the same (bf16-valued) weights: the only
// rounding left is the hidden rows' and the logits gradient's to bf16 (2⁻⁹
// relative each) and the vector exp (2 ulp), so the loss agrees to a few
// parts in ten thousand and dH to well under a percent.
TEST(CrossEntropy, Bf16HeadMatchesReference) {
  const int64_t n = 29, dim = 40, vocab = 300;  // vocab: one 256 run and a ragged tail
  Tensor h = testing::random_tensor(DType::F32, {n, dim}, 70);
  Tensor w16 = testing::random_tensor(DType::BF16, {vocab, dim}, 71, 0.3f), w = w16.to_f32();
  Tensor targets = Tensor::empty(DType::I32, {n});
  for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = i % 5 == 2 ? kCrossEntropyIgnore : int32_t(i * 41 % vocab);
  for (bool portable : {false, true}) {
    cpu::set_portable_only(portable);
    Tensor ws = Tensor::empty(DType::F32, {cross_entropy_workspace_floats(vocab, dim, 8)});
    Tensor dh = Tensor::zeros(DType::F32, {n, dim}), dh_ref = Tensor::zeros(DType::F32, {n, dim});
    auto got = cpu::cross_entropy(
        {.hidden = h, .w = w16, .targets = targets, .d_hidden = dh, .workspace = ws, .chunk_rows = 8, .grad_scale = 0.1f});
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    CrossEntropyStats want = ref::cross_entropy(
        {.hidden = h, .w = w, .targets = targets, .d_hidden = dh_ref, .workspace = ws, .chunk_rows = 8, .grad_scale = 0.1f});
    EXPECT_EQ(got->n_valid, want.n_valid);
    EXPECT_NEAR(got->loss_sum, want.loss_sum, 5e-4 * std::abs(want.loss_sum));
    EXPECT_LE(testing::rel_error(dh, dh_ref), 5e-3);
  }
  cpu::set_portable_only(false);
  // The head packed ahead: the same loss and gradient bits as unpacked (one
  // k block each way), also with chunks past the 256 rows of its input-
  // gradient GEMMs; and a packing of another matrix is refused.
  const int64_t big_n = 600;
  Tensor big_h = testing::random_tensor(DType::F32, {big_n, dim}, 72);
  Tensor big_targets = Tensor::empty(DType::I32, {big_n});
  for (int64_t i = 0; i < big_n; ++i) big_targets.data<int32_t>()[i] = int32_t(i * 7 % vocab);
  // With the AMX code (tiles emulated where the CPU has none) the packed
  // head's softmax writes its gradient straight into the tiles' layout.
  for (bool amx : {false, true}) {
    for (int64_t chunk : {8, 300}) {
      if (amx && !cpu::has_avx512_bf16()) continue;
      SCOPED_TRACE(::testing::Message() << "amx " << amx << " chunk " << chunk);
      cpu::set_amx_emulation(amx && !cpu::amx_bf16_available());
      cpu::force_bf16_gemm_path(amx ? std::optional(cpu::Bf16GemmPath::kAmx) : std::nullopt);
      const Tensor& hh = chunk == 8 ? h : big_h;
      const Tensor& tt = chunk == 8 ? targets : big_targets;
      const int64_t rows = hh.shape()[0];
      const cpu::PackedBf16Weight packed(w16.data<uint16_t>(), vocab, dim);
      Tensor ws = Tensor::empty(DType::F32, {cross_entropy_workspace_floats(vocab, dim, chunk)});
      Tensor dh = Tensor::zeros(DType::F32, {rows, dim}), dh_packed = Tensor::zeros(DType::F32, {rows, dim});
      CrossEntropyArgs args{.hidden = hh, .w = w16, .targets = tt, .d_hidden = dh, .workspace = ws,
                            .chunk_rows = chunk, .grad_scale = 0.1f};
      auto plain = cpu::cross_entropy(args);
      args.d_hidden = dh_packed;
      auto with_packed = cpu::cross_entropy(args, &packed);
      ASSERT_TRUE(plain.is_ok() && with_packed.is_ok());
      EXPECT_EQ(plain->loss_sum, with_packed->loss_sum);
      EXPECT_EQ(0, std::memcmp(dh.raw(), dh_packed.raw(), size_t(dh.nbytes())));
      const cpu::PackedBf16Weight other(w16.data<uint16_t>(), vocab - 1, dim);
      Status wrong = cpu::cross_entropy(args, &other).status();
      EXPECT_NE(wrong.message().find("packed head is not w"), std::string::npos) << wrong.message();
    }
  }
  cpu::set_amx_emulation(false);
  cpu::force_bf16_gemm_path(std::nullopt);
  // A trainable bf16 head has no f32 weights to update: an error, not a silent skip.
  Tensor dw = Tensor::zeros(DType::F32, {vocab, dim}), dh = Tensor::zeros(DType::F32, {n, dim});
  Tensor ws = Tensor::empty(DType::F32, {cross_entropy_workspace_floats(vocab, dim, 8)});
  Status bad = cpu::cross_entropy({.hidden = h, .w = w16, .targets = targets, .d_hidden = dh, .d_w = dw,
                                   .workspace = ws, .chunk_rows = 8})
                   .status();
  EXPECT_NE(bad.message().find("bf16 for a frozen head"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace lathe
