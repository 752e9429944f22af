// gemm_bf16 (see gemm_bf16.h). The AVX512-BF16 path, GotoBLAS-shaped:
//   A is packed once per call into tiles of kMR rows, each tile [k/2][kMR]
//   32-bit lanes holding bf16 pairs (a[i][2p], a[i][2p+1]);
//   the columns are cut into blocks of kNC, handed out to the threads; for
//   each block of kc pairs of k a thread packs B into panels of kNR columns,
//   [kc][kNR] pairs (two zmm per pair), then runs the 8 x 32 register tile
//   over every row tile (the B panel stays in L1, A streams from L2).
// vdpbf16ps adds both products of a pair into the f32 lane, so one zmm op
// is 32 multiply-adds. Edges are zero-padded when packed and masked when
// stored; sums over k blocks accumulate in C itself.
#include "backends/cpu/gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_amx.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/log.h"
#include "core/parallel.h"

#define LATHE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace lathe::cpu {
namespace {

constexpr int kMR = 8;           // rows of the register tile
constexpr int kNR = 32;          // columns of the register tile (two zmm)
constexpr int64_t kNC = 128;     // columns per thread task
constexpr int64_t kKcMax = 256;  // pairs of k per packed B block (32 KiB panels)
constexpr int64_t kPackedStepWords = 512;  // one k tile of a column pair in the packed-ahead layout

struct Problem : Bf16GemmProblem {
  int64_t k2;  // pairs of k, (k + 1) / 2; with a packed B, whole k tiles of 16 pairs (padding zero)
};

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : 0; }

// A, tile t of kMR rows: [k2][kMR] pairs. Rows past m are zero.
LATHE_AVX512BF16 void pack_a_tile(const Problem& P, int64_t t, uint32_t* dst) {
  alignas(64) uint32_t tmp[16];
  for (int r = 0; r < kMR; ++r) {
    const int64_t i = t * kMR + r;
    if (i >= P.m) {
      for (int64_t p = 0; p < P.k2; ++p) dst[p * kMR + r] = 0;
      continue;
    }
    const float* row = P.a + i * P.lda;
    for (int64_t p0 = 0; p0 < P.k2; p0 += 16) {
      const int64_t e0 = 2 * p0, left = P.k - e0;  // elements of this row still to read
      const __m512 lo = _mm512_maskz_loadu_ps(mask16(left), row + e0);
      const __m512 hi = _mm512_maskz_loadu_ps(mask16(left - 16), row + e0 + 16);
      _mm512_store_si512(tmp, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      const int64_t np = std::min<int64_t>(16, P.k2 - p0);
      for (int64_t q = 0; q < np; ++q) dst[(p0 + q) * kMR + r] = tmp[q];
    }
  }
}

// B block: columns [j0, j0 + nc), pairs [p0, p0 + kc), as panels of kNR
// columns, each [kc][kNR]. Columns past n and the odd k's partner are zero.
void pack_b_panel(const Problem& P, int64_t col0, int cols, int64_t p0, int64_t kc, uint32_t* panel) {
  if (cols < kNR) std::memset(panel, 0, sizeof(uint32_t) * size_t(kc * kNR));
  const int64_t full = std::min(kc, P.k / 2 - p0);  // pairs with both halves inside k
  if (P.trans_b) {  // B [n, k]: row col holds its pairs contiguously
    for (int j = 0; j < cols; ++j) {
      const uint16_t* row = P.b + (col0 + j) * P.ldb + 2 * p0;
      for (int64_t p = 0; p < full; ++p) {
        uint32_t v;
        std::memcpy(&v, row + 2 * p, sizeof v);
        panel[p * kNR + j] = v;
      }
      if (full < kc) panel[full * kNR + j] = row[2 * full];  // odd k: the last pair's partner is zero
    }
    return;
  }
  for (int64_t p = 0; p < kc; ++p) {  // B [k, n]: rows e and e + 1 interleaved
    const int64_t e = 2 * (p0 + p);
    const uint16_t* r0 = P.b + e * P.ldb + col0;
    const uint16_t* r1 = p < full ? r0 + P.ldb : nullptr;
    uint32_t* dst = panel + p * kNR;
    if (r1)
      for (int j = 0; j < cols; ++j) dst[j] = uint32_t(r0[j]) | uint32_t(r1[j]) << 16;
    else
      for (int j = 0; j < cols; ++j) dst[j] = r0[j];
  }
}

void pack_b(const Problem& P, int64_t j0, int64_t nc, int64_t p0, int64_t kc, uint32_t* dst) {
  for (int64_t pn = 0; pn * kNR < nc; ++pn)
    pack_b_panel(P, j0 + pn * kNR, int(std::min<int64_t>(kNR, nc - pn * kNR)), p0, kc, dst + pn * kc * kNR);
}

// C[rows, cols] (=, or += when add) alpha times a tile's accumulators.
LATHE_AVX512BF16 inline void store_tile(const __m512 (&acc)[kMR][2], float* c, int64_t ldc, int rows, int cols,
                                        float alpha, bool add) {
  const __mmask16 m0 = mask16(cols), m1 = mask16(cols - 16);
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m512 v0 = _mm512_mul_ps(acc[r][0], va), v1 = _mm512_mul_ps(acc[r][1], va);
    if (add) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, cr));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    _mm512_mask_storeu_ps(cr, m0, v0);
    _mm512_mask_storeu_ps(cr + 16, m1, v1);
  }
}

// C[rows, cols] (+)= alpha · Σ_p a-tile[p] · b-panel[p] over kc pairs.
LATHE_AVX512BF16 void tile(const uint32_t* ap, const uint32_t* bp, int64_t kc, float* c, int64_t ldc, int rows,
                           int cols, float alpha, bool add) {
  __m512 acc[kMR][2];
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * kNR + 16);
#pragma GCC unroll 8
    for (int r = 0; r < kMR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[p * kMR + r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  store_tile(acc, c, ldc, rows, cols, alpha, add);
}

// One column block [j0, j0 + nc) of C over every row tile and k block.
void column_block(const Problem& P, const uint32_t* apack, int64_t j0, int64_t nc, std::vector<uint32_t>& bbuf) {
  const int64_t kblocks = (P.k2 + kKcMax - 1) / kKcMax;
  const int64_t kc_even = (P.k2 + kblocks - 1) / kblocks;
  const int64_t tiles = (P.m + kMR - 1) / kMR, panels = (nc + kNR - 1) / kNR;
  bbuf.resize(size_t(panels * kc_even * kNR));
  for (int64_t p0 = 0; p0 < P.k2; p0 += kc_even) {
    const int64_t kc = std::min(kc_even, P.k2 - p0);
    const bool add = P.accumulate || p0 > 0;
    pack_b(P, j0, nc, p0, kc, bbuf.data());
    for (int64_t pn = 0; pn < panels; ++pn) {
      const int cols = int(std::min<int64_t>(kNR, nc - pn * kNR));
      const uint32_t* bp = bbuf.data() + pn * kc * kNR;
      for (int64_t t = 0; t < tiles; ++t) {
        const int rows = int(std::min<int64_t>(kMR, P.m - t * kMR));
        tile(apack + t * P.k2 * kMR + p0 * kMR, bp, kc, P.c + t * kMR * P.ldc + j0 + pn * kNR, P.ldc, rows, cols,
             P.alpha, add);
      }
    }
  }
}

// tile() on B in the packed-ahead layout (gemm_amx.h, amx_pack_b): pair p
// of a column pair is row p % 16 of k tile p / 16, columns 0-15 and, 256
// words on, 16-31. `steps` k tiles from bp.
LATHE_AVX512BF16 void tile_packed(const uint32_t* ap, const uint32_t* bp, int64_t steps, float* c, int64_t ldc,
                                  int rows, int cols, float alpha, bool add) {
  __m512 acc[kMR][2];
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s)
    for (int pr = 0; pr < 16; ++pr) {
      const uint32_t* b = bp + s * kPackedStepWords + pr * 16;
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 256);
      const uint32_t* a = ap + (s * 16 + pr) * kMR;
#pragma GCC unroll 8
      for (int r = 0; r < kMR; ++r) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r]));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
      }
    }
  store_tile(acc, c, ldc, rows, cols, alpha, add);
}

// The AVX512-BF16 kernel on a packed-ahead B: threads take blocks of kNC
// columns; per k block (kKcMax pairs = whole k tiles) each column pair's
// panel (32 KiB) stays in L1 over every row tile.
void gemm_avx512_packed(const Problem& P, const uint32_t* packed) {
  thread_local std::vector<uint32_t> apack;
  const int64_t tiles = (P.m + kMR - 1) / kMR, kt = P.k2 / 16;
  apack.resize(size_t(tiles * P.k2 * kMR));
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  const bool par = threads > 1 && P.m * P.n * P.k >= (int64_t{1} << 18);
  uint32_t* ap = apack.data();
#pragma omp parallel for num_threads(int(threads)) schedule(static) if (par)
  for (int64_t t = 0; t < tiles; ++t) pack_a_tile(P, t, ap + t * P.k2 * kMR);
  constexpr int64_t kStepsMax = kKcMax / 16;
  const int64_t blocks = (P.n + kNC - 1) / kNC;
#pragma omp parallel for num_threads(int(std::min(threads, blocks))) schedule(dynamic, 1) if (par)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kNC, j1 = std::min(P.n, j0 + kNC);
    for (int64_t t0 = 0; t0 < kt; t0 += kStepsMax) {
      const int64_t steps = std::min(kStepsMax, kt - t0);
      const bool add = P.accumulate || t0 > 0;
      for (int64_t jc = j0; jc < j1; jc += kNR) {
        const uint32_t* bp = packed + ((jc / kNR) * kt + t0) * kPackedStepWords;
        const int cols = int(std::min<int64_t>(kNR, P.n - jc));
        for (int64_t t = 0; t < tiles; ++t)
          tile_packed(ap + t * P.k2 * kMR + t0 * 16 * kMR, bp, steps, P.c + t * kMR * P.ldc + jc, P.ldc,
                      int(std::min<int64_t>(kMR, P.m - t * kMR)), cols, P.alpha, add);
      }
    }
  }
}

void gemm_avx512(const Problem& P) {
  thread_local std::vector<uint32_t> apack;
  const int64_t tiles = (P.m + kMR - 1) / kMR;
  apack.resize(size_t(tiles * P.k2 * kMR));
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  const bool par = threads > 1 && P.m * P.n * P.k >= (int64_t{1} << 18);
  uint32_t* ap = apack.data();
#pragma omp parallel for num_threads(int(threads)) schedule(static) if (par)
  for (int64_t t = 0; t < tiles; ++t) pack_a_tile(P, t, ap + t * P.k2 * kMR);
  const int64_t blocks = (P.n + kNC - 1) / kNC;
#pragma omp parallel for num_threads(int(std::min(threads, blocks))) schedule(dynamic, 1) if (par)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    thread_local std::vector<uint32_t> bbuf;
    const int64_t j0 = blk * kNC;
    column_block(P, ap, j0, std::min(kNC, P.n - j0), bbuf);
  }
}

// No AVX512-BF16: B widened to f32 a block at a time, then sgemm.
void gemm_portable(const Problem& P) {
  constexpr int64_t kBlock = 256;
  thread_local std::vector<float> wide;
  if (P.trans_b) {  // blocks of B's rows = columns of C
    wide.resize(size_t(std::min(kBlock, P.n) * P.k));
    for (int64_t j0 = 0; j0 < P.n; j0 += kBlock) {
      const int64_t cnt = std::min(kBlock, P.n - j0);
      for (int64_t j = 0; j < cnt; ++j) convert_to_f32(P.b + (j0 + j) * P.ldb, DType::BF16, wide.data() + j * P.k, P.k);
      sgemm(false, true, P.m, cnt, P.k, P.alpha, P.a, P.lda, wide.data(), P.k, P.accumulate ? 1.0f : 0.0f,
            P.c + j0, P.ldc);
    }
    return;
  }
  wide.resize(size_t(std::min(kBlock, P.k) * P.n));  // blocks of B's rows = k
  for (int64_t e0 = 0; e0 < P.k; e0 += kBlock) {
    const int64_t cnt = std::min(kBlock, P.k - e0);
    for (int64_t e = 0; e < cnt; ++e) convert_to_f32(P.b + (e0 + e) * P.ldb, DType::BF16, wide.data() + e * P.n, P.n);
    sgemm(false, false, P.m, P.n, cnt, P.alpha, P.a + e0, P.lda, wide.data(), P.n,
          P.accumulate || e0 > 0 ? 1.0f : 0.0f, P.c, P.ldc);
  }
}

constexpr int kNotForced = -1;
std::atomic<int> g_forced_path{kNotForced};

// LATHE_CPU_GEMM, read once.
int env_path() {
  static const int path = [] {
    const std::string v = env::cpu_gemm();
    if (v.empty()) return kNotForced;
    if (v == "amx") return int(Bf16GemmPath::kAmx);
    if (v == "avx512bf16") return int(Bf16GemmPath::kAvx512Bf16);
    if (v == "f32") return int(Bf16GemmPath::kF32);
    LATHE_LOG(kWarn, "LATHE_CPU_GEMM=", v, " is not amx, avx512bf16 or f32; ignored");
    return kNotForced;
  }();
  return path;
}

}  // namespace

Bf16GemmPath bf16_gemm_path() {
  int want = g_forced_path.load(std::memory_order_relaxed);
  if (want == kNotForced) want = env_path();
  if (want == kNotForced) want = int(Bf16GemmPath::kAmx);
  // Every faster path also needs AVX512-BF16 (has_avx512_bf16() is false
  // while the portable kernels are forced).
  if (!has_avx512_bf16()) return Bf16GemmPath::kF32;
  if (want == int(Bf16GemmPath::kAmx) && (amx_bf16_available() || amx_emulation())) return Bf16GemmPath::kAmx;
  return want == int(Bf16GemmPath::kF32) ? Bf16GemmPath::kF32 : Bf16GemmPath::kAvx512Bf16;
}

void force_bf16_gemm_path(std::optional<Bf16GemmPath> path) {
  g_forced_path.store(path ? int(*path) : kNotForced, std::memory_order_relaxed);
}

void gemm_bf16(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const Problem P{{trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc}, (k + 1) / 2};
  if (k <= 0) return sgemm(false, false, m, n, 0, alpha, a, lda, nullptr, n, accumulate ? 1.0f : 0.0f, c, ldc);
  switch (bf16_gemm_path()) {
    case Bf16GemmPath::kAmx:
      return gemm_bf16_amx(trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
    case Bf16GemmPath::kAvx512Bf16:
      return gemm_avx512(P);
    case Bf16GemmPath::kF32:
      return gemm_portable(P);
  }
}

namespace {

// Runs one call on a packed operand: n x k is op(B)'s shape.
void gemm_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const uint32_t* b,
                 bool accumulate, float* c, int64_t ldc) {
  if (bf16_gemm_path() == Bf16GemmPath::kAmx)
    return gemm_bf16_amx_packed(m, n, k, alpha, a, lda, b, accumulate, c, ldc);
  const int64_t kt = (k + 31) / 32;
  const Problem P{{false, m, n, k, alpha, a, lda, nullptr, 0, accumulate, c, ldc}, kt * 16};
  gemm_avx512_packed(P, b);
}

}  // namespace

PackedBf16Weight::PackedBf16Weight(const uint16_t* w, int64_t out, int64_t in) : w_(w), out_(out), in_(in) {
  if (!has_avx512_bf16() || out <= 0 || in <= 0) return;
  auto alloc = [](int64_t words) {
    const size_t bytes = (size_t(words) * sizeof(uint32_t) + 63) / 64 * 64;
    return std::unique_ptr<uint32_t[], Free>(static_cast<uint32_t*>(std::aligned_alloc(64, bytes)));
  };
  fwd_ = alloc(amx_packed_b_words(out, in));
  bwd_ = alloc(amx_packed_b_words(in, out));
  LATHE_CHECK(fwd_ && bwd_, "PackedBf16Weight: out of memory packing a ", out, " x ", in, " weight");
  amx_pack_b(true, out, in, w, in, fwd_.get());
  amx_pack_b(false, in, out, w, in, bwd_.get());
}

void PackedBf16Weight::forward(int64_t m, float alpha, const float* x, int64_t ldx, bool accumulate, float* y,
                               int64_t ldy) const {
  if (m <= 0 || out_ <= 0) return;
  if (!fwd_ || bf16_gemm_path() == Bf16GemmPath::kF32)
    return gemm_bf16(true, m, out_, in_, alpha, x, ldx, w_, in_, accumulate, y, ldy);
  gemm_packed(m, out_, in_, alpha, x, ldx, fwd_.get(), accumulate, y, ldy);
}

void PackedBf16Weight::backward(int64_t m, float alpha, const float* dy, int64_t lddy, bool accumulate, float* dx,
                                int64_t lddx) const {
  if (m <= 0 || in_ <= 0) return;
  if (!bwd_ || bf16_gemm_path() == Bf16GemmPath::kF32)
    return gemm_bf16(false, m, in_, out_, alpha, dy, lddy, w_, in_, accumulate, dx, lddx);
  gemm_packed(m, in_, out_, alpha, dy, lddy, bwd_.get(), accumulate, dx, lddx);
}

}  // namespace lathe::cpu
