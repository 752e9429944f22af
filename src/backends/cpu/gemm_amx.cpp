// gemm_bf16_amx (see gemm_amx.h). Every operand the tiles read is packed
// into 1 KiB tiles of 16 rows x 64 bytes, zero-padded, so that the tile
// configuration never changes and no tile load reads past a matrix:
//   A: per call; a tile (16 rows, k tile t of 32) holds 16 rows of 32
//      consecutive bf16 (f32 rounded to nearest-even while packed); the two
//      tiles of a 32-row pair sit side by side for each t;
//   B: per column block of kNC and k block of up to kMaxSteps tiles, panels
//      of 16 columns; tile row p holds, for each of the 16 columns, the pair
//      (b[2p][j], b[2p + 1][j]) in one 32-bit lane (the VNNI pair layout
//      TDPBF16PS reads as its second source), low half the even k; the two
//      panels of a 32-column pair sit side by side for each step.
// So each k step of the micro-kernel reads two contiguous 2 KiB runs.
// The micro-kernel holds a 32 x 32 block of C in four f32 tiles (tmm0-3),
// two A tiles (tmm4-5) and two B tiles (tmm6-7), and runs the k block; the
// block goes through a 4 KiB scratch to C with alpha, masks at the edges and
// (after the first k block, or when accumulating) an add; a whole block that
// needs none of these (alpha 1, first k block, no accumulate) is stored by
// the tiles straight into C. Threads share the
// column blocks; each loads the tile configuration before its first tile
// instruction and releases the tiles after its last.
//
// GCC's tile intrinsics are asm statements that name no memory, so each tile
// routine is a noinline function fenced by compiler memory barriers: packed
// data is stored before the loads, the scratch is read after the stores.
#include "backends/cpu/gemm_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <span>
#include <chrono>
#include <cstring>
#include <vector>

#include "backends/cpu/simd.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/parallel.h"

#define LATHE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define LATHE_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16"), noinline))

namespace lathe::cpu {
namespace {

constexpr int kTileRows = 16;       // rows of every tile
constexpr int kTileBytes = 64;      // bytes of every tile row
constexpr int kTileK = 32;          // k per tile: 32 bf16 (A) or 16 pairs (B)
constexpr int kTileWords = 256;     // 32-bit words per tile (1 KiB)
constexpr int kBlock = 32;          // rows and columns of C per micro-kernel call
constexpr int64_t kNC = 64;         // columns of C per thread task
constexpr int64_t kMaxSteps = 16;   // k tiles per packed B block: 32 KiB per 32 columns, in L1

struct Problem : Bf16GemmProblem {
  int64_t kt;                        // k tiles, ceil(k / 32)
  const uint32_t* packed = nullptr;  // all of B packed ahead (amx_pack_b), or null: packed per call
};

// LDTILECFG's 64-byte operand, palette 1.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile i
  uint8_t rows[16];    // rows of tile i
};
static_assert(sizeof(TileConfig) == 64);

inline void compiler_barrier() { asm volatile("" ::: "memory"); }

std::atomic<bool> g_prefetch{false};
std::atomic<bool> g_rows_split{true};
std::atomic<bool> g_emulate{false};
std::atomic<int> g_group_chunk_pairs{4};
std::atomic<bool> g_group_items_outer{false};

// The tiles a kHardware call runs: the emulated ones while set_amx_emulation is on.
AmxTiles resolve(AmxTiles tiles) {
  return tiles == AmxTiles::kHardware && g_emulate.load(std::memory_order_relaxed) ? AmxTiles::kEmulated : tiles;
}

// ---- the hardware tiles -------------------------------------------------

LATHE_AMX void tiles_configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kTileBytes;
    cfg.rows[t] = kTileRows;
  }
  compiler_barrier();
  _tile_loadconfig(&cfg);
  compiler_barrier();
}

LATHE_AMX void tiles_release() { _tile_release(); }

// out[32][32] = A rows · B columns over `steps` k tiles: step s reads the
// A tiles of rows 0-15 and 16-31 at a + s · 1024 and + 512 (bf16), the B
// tiles of columns 0-15 and 16-31 at b + s · 512 and + 256 (32-bit words).
// kPrefetch: A's run two steps ahead is prefetched into L1 (B is there).
template <bool kPrefetch>
LATHE_AMX void block_hardware(const uint16_t* a, const uint32_t* b, int64_t steps, float* out, int64_t ldo) {
  compiler_barrier();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    if constexpr (kPrefetch) {  // prefetches never fault: past the end is harmless
      const char* next = reinterpret_cast<const char*>(a + (s + 2) * 4 * kTileWords);
      for (int line = 0; line < 2 * kTileRows; ++line) _mm_prefetch(next + line * 64, _MM_HINT_T0);
    }
    _tile_loadd(4, a + s * 4 * kTileWords, kTileBytes);
    _tile_loadd(5, a + s * 4 * kTileWords + 2 * kTileWords, kTileBytes);
    _tile_loadd(6, b + s * 2 * kTileWords, kTileBytes);
    _tile_loadd(7, b + s * 2 * kTileWords + kTileWords, kTileBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  const long stride = long(ldo * sizeof(float));
  _tile_stored(0, out, stride);
  _tile_stored(1, out + 16, stride);
  _tile_stored(2, out + 16 * ldo, stride);
  _tile_stored(3, out + 16 * ldo + 16, stride);
  compiler_barrier();
}

// ---- the same arithmetic in scalar code ---------------------------------

// TDPBF16PS as documented: per row i, pair p, column j,
//   c[i][j] += a[i][2p]·b[p][j].lo; c[i][j] += a[i][2p+1]·b[p][j].hi
// (bf16 products are exact in f32; each add rounds to nearest-even).
void tile_dp_emulated(float* c, int64_t ldc, const uint16_t* a, const uint32_t* b) {
  for (int i = 0; i < kTileRows; ++i)
    for (int p = 0; p < kTileK / 2; ++p) {
      const float a0 = bf16_to_f32(a[i * kTileK + 2 * p]), a1 = bf16_to_f32(a[i * kTileK + 2 * p + 1]);
      for (int j = 0; j < 16; ++j) {
        const uint32_t w = b[p * 16 + j];
        float& acc = c[i * ldc + j];
        acc = acc + a0 * bf16_to_f32(uint16_t(w & 0xffff));
        acc = acc + a1 * bf16_to_f32(uint16_t(w >> 16));
      }
    }
}

void block_emulated(const uint16_t* a, const uint32_t* b, int64_t steps, float* out, int64_t ldo) {
  for (int r = 0; r < kBlock; ++r) std::fill(out + r * ldo, out + r * ldo + kBlock, 0.0f);
  for (int64_t s = 0; s < steps; ++s) {
    const uint16_t* as[2] = {a + s * 4 * kTileWords, a + s * 4 * kTileWords + 2 * kTileWords};
    const uint32_t* bs[2] = {b + s * 2 * kTileWords, b + s * 2 * kTileWords + kTileWords};
    for (int r = 0; r < 2; ++r)
      for (int q = 0; q < 2; ++q) tile_dp_emulated(out + r * 16 * ldo + q * 16, ldo, as[r], bs[q]);
  }
}

using BlockFn = void (*)(const uint16_t*, const uint32_t*, int64_t, float*, int64_t);

// ---- packing ------------------------------------------------------------

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : 0; }
inline __mmask32 mask32(int64_t n) { return n >= 32 ? ~__mmask32(0) : n > 0 ? __mmask32((1u << n) - 1) : 0; }

// Row block rb of A (16 rows; rb / 2 the pair, rb % 2 the half): tile t at
// dst + ((rb / 2) · kt + t) · 1024 + (rb % 2) · 512 bf16.
LATHE_AVX512BF16 void pack_a_block(const Problem& P, int64_t rb, uint16_t* dst) {
  for (int r = 0; r < kTileRows; ++r) {
    const int64_t i = rb * kTileRows + r;
    for (int64_t t = 0; t < P.kt; ++t) {
      uint16_t* row = dst + ((rb / 2) * P.kt + t) * 4 * kTileWords + (rb % 2) * 2 * kTileWords + r * kTileK;
      if (i >= P.m) {
        _mm512_storeu_si512(row, _mm512_setzero_si512());
        continue;
      }
      const int64_t e0 = t * kTileK, left = P.k - e0;
      const float* src = P.a + i * P.lda + e0;
      const __m512 lo = _mm512_maskz_loadu_ps(mask16(left), src);
      const __m512 hi = left > 16 ? _mm512_maskz_loadu_ps(mask16(left - 16), src + 16) : _mm512_setzero_ps();
      _mm512_storeu_si512(row, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

// B [n, k]: tile rows are the pairs of 16 rows of B, transposed.
LATHE_AVX512BF16 void pack_b_tile_nk(const Problem& P, int64_t col, int64_t t, uint32_t* dst) {
  __m512i r[16];
  const int64_t e0 = t * kTileK;
  const __mmask32 km = mask32(P.k - e0);
  for (int j = 0; j < 16; ++j)
    r[j] = col + j < P.n ? _mm512_maskz_loadu_epi16(km, P.b + (col + j) * P.ldb + e0) : _mm512_setzero_si512();
  simd::transpose16(r);
  for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * 16, r[p]);
}

// B [k, n]: tile row p interleaves rows 2p and 2p + 1 of 16 columns.
// (GCC 12 warns about the undefined source operand inside the widening
// intrinsics, which the full mask never reads.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
LATHE_AVX512BF16 void pack_b_tile_kn(const Problem& P, int64_t col, int64_t t, uint32_t* dst) {
  const __mmask16 cm = mask16(P.n - col);
  for (int p = 0; p < 16; ++p) {
    const int64_t e = t * kTileK + 2 * p;
    __m256i r0 = _mm256_setzero_si256(), r1 = _mm256_setzero_si256();
    if (cm && e < P.k) r0 = _mm256_maskz_loadu_epi16(cm, P.b + e * P.ldb + col);
    if (cm && e + 1 < P.k) r1 = _mm256_maskz_loadu_epi16(cm, P.b + (e + 1) * P.ldb + col);
    const __m512i v = _mm512_or_si512(_mm512_cvtepu16_epi32(r0), _mm512_slli_epi32(_mm512_cvtepu16_epi32(r1), 16));
    _mm512_storeu_si512(dst + p * 16, v);
  }
}
#pragma GCC diagnostic pop

// Columns [j0, j0 + nc) rounded up to whole blocks of 32, k tiles [t0, t0 +
// steps): panel q's tile s at dst + ((q / 2) · steps + s) · 512 + (q % 2) ·
// 256 words.
void pack_b_block(const Problem& P, int64_t j0, int64_t nc, int64_t t0, int64_t steps, uint32_t* dst) {
  const int64_t panels = (nc + kBlock - 1) / kBlock * 2;
  for (int64_t q = 0; q < panels; ++q)
    for (int64_t s = 0; s < steps; ++s) {
      uint32_t* tile = dst + ((q / 2) * steps + s) * 2 * kTileWords + (q % 2) * kTileWords;
      if (P.trans_b)
        pack_b_tile_nk(P, j0 + q * 16, t0 + s, tile);
      else
        pack_b_tile_kn(P, j0 + q * 16, t0 + s, tile);
    }
}

// ---- blocking -----------------------------------------------------------

// C[rows, cols] = alpha · out (+ C when add).
LATHE_AVX512BF16 void store_block(const float* out, float* c, int64_t ldc, int rows, int cols, float alpha, bool add) {
  const __mmask16 m0 = mask16(cols), m1 = mask16(cols - 16);
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m512 v0 = _mm512_mul_ps(_mm512_loadu_ps(out + r * kBlock), va);
    __m512 v1 = _mm512_mul_ps(_mm512_loadu_ps(out + r * kBlock + 16), va);
    if (add) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, cr));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    _mm512_mask_storeu_ps(cr, m0, v0);
    _mm512_mask_storeu_ps(cr + 16, m1, v1);
  }
}

struct Scratch {
  std::vector<uint32_t> b;                 // one packed B block
  alignas(64) float out[kBlock * kBlock];  // one C block from the tiles
};

// One column block [j0, j0 + nc) of C over every row block and k block.
// B comes from the packed-ahead operand (column pair q's k tile t at
// ((q · kt) + t) · 512 words) or is packed here, a k block at a time.
void column_block(const Problem& P, const uint16_t* apack, int64_t j0, int64_t nc, Scratch& s, BlockFn block) {
  const int64_t kblocks = (P.kt + kMaxSteps - 1) / kMaxSteps;
  const int64_t steps_even = (P.kt + kblocks - 1) / kblocks;
  const int64_t col_pairs = (nc + kBlock - 1) / kBlock, row_pairs = (P.m + kBlock - 1) / kBlock;
  if (!P.packed) s.b.resize(size_t(col_pairs * 2 * steps_even * kTileWords));
  for (int64_t t0 = 0; t0 < P.kt; t0 += steps_even) {
    const int64_t steps = std::min(steps_even, P.kt - t0);
    const bool add = P.accumulate || t0 > 0;
    const uint32_t* bblock = P.packed ? P.packed + ((j0 / kBlock) * P.kt + t0) * 2 * kTileWords : s.b.data();
    const int64_t pair_stride = (P.packed ? P.kt : steps) * 2 * kTileWords;
    if (!P.packed) pack_b_block(P, j0, nc, t0, steps, s.b.data());
    // The B pair of panels (32 KiB at most) stays in L1 over every row pair;
    // A streams from L2 in order.
    for (int64_t jp = 0; jp < col_pairs; ++jp) {
      const int cols = int(std::min<int64_t>(kBlock, nc - jp * kBlock));
      const uint32_t* b = bblock + jp * pair_stride;
      for (int64_t ip = 0; ip < row_pairs; ++ip) {
        const int rows = int(std::min<int64_t>(kBlock, P.m - ip * kBlock));
        const uint16_t* a = apack + (ip * P.kt + t0) * 4 * kTileWords;
        float* c = P.c + ip * kBlock * P.ldc + j0 + jp * kBlock;
        if (!add && P.alpha == 1.0f && rows == kBlock && cols == kBlock) {
          block(a, b, steps, c, P.ldc);  // C = the sums, as they are: the tiles store straight into C
          continue;
        }
        block(a, b, steps, s.out, kBlock);
        store_block(s.out, c, P.ldc, rows, cols, P.alpha, add);
      }
    }
  }
}

// Columns per thread task: kNC, or when packed A outgrows L2 (long k, as in
// the LM head's input gradient) an even share per thread, so that each
// thread streams A once instead of once per kNC columns.
int64_t task_columns(const Problem& P, int64_t threads) {
  constexpr int64_t kAL2Bytes = int64_t{1} << 20;
  const int64_t a_bytes = (P.m + kBlock - 1) / kBlock * kBlock * P.kt * kTileK * 2;
  if (a_bytes <= kAL2Bytes || threads <= 1) return kNC;
  const int64_t share = (P.n + threads - 1) / threads;
  return std::max(kNC, (share + kBlock - 1) / kBlock * kBlock);
}

void run(const Problem& P, AmxTiles tiles);
void run_columns(const Problem& P, const uint16_t* ap, AmxTiles tiles, BlockFn block);

// B packed ahead and small enough to sit in each core's L2 (the projections,
// not the LM head), with rows enough for every thread: the threads split
// the rows instead, each packing only its own rows of A and computing them
// against all of B: one parallel region and no barrier between packing and
// computing (with OMP_WAIT_POLICY=passive every region start and barrier
// is a sleep and a wake-up), and no thread reads A rows another packed.
// Rows go out in chunks of kRowChunkPairs row pairs, dynamically, so a
// core slowed by a neighbour does not hold the others back.
constexpr int64_t kRowChunkPairs = 4;

// B packed per call qualifies when it is one column block (n up to kNC, as
// LoRA's rank-wide products): the columns could not be shared, and each
// chunk packs the small B again.
bool rows_split_fits(const Problem& P, int64_t threads) {
  constexpr int64_t kBL2Bytes = int64_t{3} << 19;
  const int64_t b_bytes = (P.n + kBlock - 1) / kBlock * kBlock * P.kt * kTileK * 2;
  return (P.packed || P.n <= kNC) && threads > 1 && P.m >= 4 * kBlock * threads && b_bytes <= kBL2Bytes &&
         g_rows_split.load(std::memory_order_relaxed);
}

void run_rows_split(const Problem& P, AmxTiles tiles, int64_t threads) {
  const int64_t pairs = (P.m + kBlock - 1) / kBlock, chunks = (pairs + kRowChunkPairs - 1) / kRowChunkPairs;
#pragma omp parallel for num_threads(int(std::min(threads, chunks))) schedule(dynamic, 1)
  for (int64_t t = 0; t < chunks; ++t) {
    const int64_t p0 = t * kRowChunkPairs, p1 = std::min(pairs, p0 + kRowChunkPairs);
    Problem S = P;
    S.m = std::min(P.m, p1 * kBlock) - p0 * kBlock;
    S.a = P.a + p0 * kBlock * P.lda;
    S.c = P.c + p0 * kBlock * P.ldc;
    if (S.m > 0) run(S, tiles);  // inside the region: on this thread alone
  }
}

void run(const Problem& P, AmxTiles tiles) {
  if (const int64_t threads = omp_in_parallel() ? 1 : num_threads(); rows_split_fits(P, threads))
    return run_rows_split(P, tiles, threads);
  const bool hw = tiles == AmxTiles::kHardware;
  const bool prefetch = g_prefetch.load(std::memory_order_relaxed);
  const BlockFn block = !hw ? block_emulated : prefetch ? block_hardware<true> : block_hardware<false>;
  const int64_t row_blocks = (P.m + kBlock - 1) / kBlock * 2;
  thread_local std::vector<uint16_t> apack;
  apack.resize(size_t(row_blocks * P.kt * 2 * kTileWords));
  uint16_t* ap = apack.data();
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  const bool par = threads > 1 && P.m * P.n * P.k >= (int64_t{1} << 18);
#pragma omp parallel for num_threads(int(threads)) schedule(static) if (par)
  for (int64_t rb = 0; rb < row_blocks; ++rb) pack_a_block(P, rb, ap);
  run_columns(P, ap, tiles, block);
}

// The columns of C over the threads, A already packed at ap.
void run_columns(const Problem& P, const uint16_t* ap, AmxTiles tiles, BlockFn block) {
  const bool hw = tiles == AmxTiles::kHardware;
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  const bool par = threads > 1 && P.m * P.n * P.k >= (int64_t{1} << 18);
  const int64_t nc = task_columns(P, threads), blocks = (P.n + nc - 1) / nc;
#pragma omp parallel num_threads(int(std::min(threads, blocks))) if (par)
  {
    thread_local Scratch scratch;
    if (hw) tiles_configure();
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t j0 = blk * nc;
      column_block(P, ap, j0, std::min(nc, P.n - j0), scratch, block);
    }
    if (hw) tiles_release();
  }
}

// gemm_bf16_amx_packed_group's work on rows [r0, r0 + cnt) of every item,
// on the calling thread (tiles configured): each item's A rows are packed
// unless the previous item read the same ones.
void group_chunk(std::span<const AmxGroupItem> items, int64_t r0, int64_t cnt, BlockFn block, Scratch& scratch,
                 std::vector<uint16_t>& apack) {
  const float* last_a = nullptr;
  int64_t last_lda = 0, last_k = 0;
  for (const AmxGroupItem& it : items) {
    Problem S{{false, cnt, it.n, it.k, it.alpha, it.a + r0 * it.lda, it.lda, nullptr, 0, it.accumulate,
               it.c + r0 * it.ldc, it.ldc},
              (it.k + kTileK - 1) / kTileK};
    S.packed = it.b_packed;
    if (it.a != last_a || it.lda != last_lda || it.k != last_k) {
      const int64_t row_blocks = (cnt + kBlock - 1) / kBlock * 2;
      apack.resize(std::max(apack.size(), size_t(row_blocks * S.kt * 2 * kTileWords)));
      for (int64_t rb = 0; rb < row_blocks; ++rb) pack_a_block(S, rb, apack.data());
      last_a = it.a, last_lda = it.lda, last_k = it.k;
    }
    for (int64_t j0 = 0; j0 < it.n; j0 += kNC) column_block(S, apack.data(), j0, std::min(kNC, it.n - j0), scratch, block);
  }
}

bool cpu_has_avx512_bf16() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

// CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; XCR0 bits 17-18 the
// tile state enabled by the OS; then Linux's per-process permission.
bool request_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 22)) || !(d & (1u << 24)) || !cpu_has_avx512_bf16()) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) {
    LATHE_LOG(kWarn, "gemm_bf16: the CPU has AMX but the OS does not enable its tile state; using AVX-512");
    return false;
  }
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    LATHE_LOG(kWarn, "gemm_bf16: the CPU has AMX but arch_prctl(ARCH_REQ_XCOMP_PERM) was refused; using AVX-512");
    return false;
  }
  return true;
}

}  // namespace

bool amx_bf16_available() {
  static const bool ok = request_amx();
  return ok;
}

void gemm_bf16_amx(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc, AmxTiles tiles) {
  tiles = resolve(tiles);
  LATHE_CHECK(tiles == AmxTiles::kHardware ? amx_bf16_available() : cpu_has_avx512_bf16(),
              "gemm_bf16_amx: this machine cannot run the requested path");
  LATHE_CHECK(k > 0, "gemm_bf16_amx: k must be positive");
  if (m <= 0 || n <= 0) return;
  run({{trans_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc}, (k + kTileK - 1) / kTileK}, tiles);
}

int64_t amx_packed_b_words(int64_t n, int64_t k) {
  return (n + kBlock - 1) / kBlock * 2 * ((k + kTileK - 1) / kTileK) * kTileWords;
}

void amx_pack_b(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, uint32_t* dst, bool parallel) {
  LATHE_CHECK(cpu_has_avx512_bf16(), "amx_pack_b: packing needs AVX512-BF16");
  LATHE_CHECK(n > 0 && k > 0, "amx_pack_b: empty operand ", n, " x ", k);
  const Problem P{{trans_b, 0, n, k, 1.0f, nullptr, 0, b, ldb, false, nullptr, 0}, (k + kTileK - 1) / kTileK};
  const int64_t pairs = (n + kBlock - 1) / kBlock;
  // Column pair q is pack_b_block's block [32q, 32q + 32) over all k tiles.
  auto pack = [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q)
      pack_b_block(P, q * kBlock, std::min<int64_t>(kBlock, n - q * kBlock), 0, P.kt,
                   dst + q * P.kt * 2 * kTileWords);
  };
  if (parallel)
    parallel_for(pairs, 1, pack);
  else
    pack(0, pairs);
}

void gemm_bf16_amx_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                          const uint32_t* b_packed, bool accumulate, float* c, int64_t ldc, AmxTiles tiles) {
  tiles = resolve(tiles);
  LATHE_CHECK(tiles == AmxTiles::kHardware ? amx_bf16_available() : cpu_has_avx512_bf16(),
              "gemm_bf16_amx_packed: this machine cannot run the requested path");
  LATHE_CHECK(k > 0, "gemm_bf16_amx_packed: k must be positive");
  if (m <= 0 || n <= 0) return;
  Problem P{{false, m, n, k, alpha, a, lda, nullptr, 0, accumulate, c, ldc}, (k + kTileK - 1) / kTileK};
  P.packed = b_packed;
  run(P, tiles);
}

void gemm_bf16_amx_packed_group(int64_t m, std::span<const AmxGroupItem> items, AmxTiles tiles,
                                const AmxGroupAfter* after, const AmxGroupAfter* before) {
  tiles = resolve(tiles);
  LATHE_CHECK(tiles == AmxTiles::kHardware ? amx_bf16_available() : cpu_has_avx512_bf16(),
              "gemm_bf16_amx_packed_group: this machine cannot run the requested path");
  for (const AmxGroupItem& it : items)
    LATHE_CHECK(it.n > 0 && it.k > 0 && it.b_packed, "gemm_bf16_amx_packed_group: empty item ", it.n, " x ", it.k);
  if (m <= 0 || items.empty()) return;
  const bool hw = tiles == AmxTiles::kHardware;
  const BlockFn block = hw ? block_hardware<false> : block_emulated;
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  const int64_t chunk_rows = int64_t{g_group_chunk_pairs.load(std::memory_order_relaxed)} * kBlock;
  const int64_t chunks = (m + chunk_rows - 1) / chunk_rows;
  const int team = int(std::min(threads, chunks));
  const bool items_outer = g_group_items_outer.load(std::memory_order_relaxed);
#pragma omp parallel num_threads(team) if (team > 1)
  {
    thread_local Scratch scratch;
    thread_local std::vector<uint16_t> apack;
    if (hw) tiles_configure();
    const int me = omp_get_thread_num();
    if (items_outer) {  // static rows per thread, every item over them before the next: each B once per thread
      const int64_t c0 = chunks * me / team, c1 = chunks * (me + 1) / team;
      for (int64_t t = c0; t < c1 && before; ++t)
        before->fn(before->ctx, t * chunk_rows, std::min(chunk_rows, m - t * chunk_rows), me);
      for (const AmxGroupItem& it : items)
        for (int64_t t = c0; t < c1; ++t)
          group_chunk({&it, 1}, t * chunk_rows, std::min(chunk_rows, m - t * chunk_rows), block, scratch, apack);
      for (int64_t t = c0; t < c1 && after; ++t)
        after->fn(after->ctx, t * chunk_rows, std::min(chunk_rows, m - t * chunk_rows), me);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < chunks; ++t) {
        const int64_t r0 = t * chunk_rows, rows = std::min(chunk_rows, m - r0);
        if (before) before->fn(before->ctx, r0, rows, me);
        group_chunk(items, r0, rows, block, scratch, apack);
        if (after) after->fn(after->ctx, r0, rows, me);
      }
    }
    if (hw) tiles_release();
  }
}

void set_amx_group_schedule(int chunk_pairs, bool items_outer) {
  g_group_chunk_pairs.store(std::max(1, chunk_pairs), std::memory_order_relaxed);
  g_group_items_outer.store(items_outer, std::memory_order_relaxed);
}

void amx_pack_a(const float* a, int64_t lda, int64_t m, int64_t k, uint16_t* dst) {
  const Problem P{{false, m, 0, k, 1.0f, a, lda, nullptr, 0, false, nullptr, 0}, (k + kTileK - 1) / kTileK};
  for (int64_t rb = 0; rb < (m + kBlock - 1) / kBlock * 2; ++rb) pack_a_block(P, rb, dst);
}

int64_t amx_packed_a_elems(int64_t m, int64_t k) {
  return (m + kBlock - 1) / kBlock * ((k + kTileK - 1) / kTileK) * 4 * kTileWords;
}

double amx_tile_peak_gflops(int64_t calls) {
  LATHE_CHECK(amx_bf16_available(), "amx_tile_peak_gflops: no AMX here");
  constexpr int64_t kSteps = 8;  // 16 KiB of A, 16 KiB of B
  std::vector<uint16_t> a(size_t(kSteps * 4 * kTileWords), f32_to_bf16(1.0f));
  std::vector<uint32_t> b(size_t(kSteps * 2 * kTileWords), 0x3f803f80u);  // pairs of bf16 1.0
  alignas(64) float out[kBlock * kBlock];
  tiles_configure();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i)
    block_hardware<false>(a.data(), b.data(), kSteps, out, kBlock);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tiles_release();
  LATHE_CHECK(out[0] == float(kSteps * kTileK), "amx_tile_peak_gflops: wrong sum ", out[0]);
  return 2.0 * kBlock * kBlock * kSteps * kTileK * double(calls) / s * 1e-9;
}

double amx_stream_gflops(bool prefetch, int64_t calls) {
  LATHE_CHECK(amx_bf16_available(), "amx_stream_gflops: no AMX here");
  constexpr int64_t kSteps = kMaxSteps, kPairs = 32;  // A: 32 row pairs x 16 steps x 2 KiB = 1 MiB
  std::vector<uint16_t> a(size_t(kPairs * kSteps * 4 * kTileWords), f32_to_bf16(1.0f));
  std::vector<uint32_t> b(size_t(kSteps * 2 * kTileWords), 0x3f803f80u);
  alignas(64) float out[kBlock * kBlock];
  const BlockFn block = prefetch ? block_hardware<true> : block_hardware<false>;
  tiles_configure();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i)
    block(a.data() + (i % kPairs) * kSteps * 4 * kTileWords, b.data(), kSteps, out, kBlock);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tiles_release();
  LATHE_CHECK(out[0] == float(kSteps * kTileK), "amx_stream_gflops: wrong sum ", out[0]);
  return 2.0 * kBlock * kBlock * kSteps * kTileK * double(calls) / s * 1e-9;
}

AmxBlockFn amx_block_kernel(AmxTiles tiles) {
  return resolve(tiles) == AmxTiles::kHardware ? block_hardware<false> : block_emulated;
}

void amx_thread_begin(AmxTiles tiles) {
  if (resolve(tiles) == AmxTiles::kHardware) tiles_configure();
}

void amx_thread_end(AmxTiles tiles) {
  if (resolve(tiles) == AmxTiles::kHardware) tiles_release();
}

void set_amx_emulation(bool on) { g_emulate.store(on && cpu_has_avx512_bf16(), std::memory_order_relaxed); }

bool amx_emulation() { return g_emulate.load(std::memory_order_relaxed); }

void set_amx_prefetch(bool on) { g_prefetch.store(on, std::memory_order_relaxed); }

void set_amx_rows_split(bool on) { g_rows_split.store(on, std::memory_order_relaxed); }

}  // namespace lathe::cpu
