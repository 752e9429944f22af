// Internal to the CPU backend: gemm_bf16 (gemm_bf16.h) on Intel AMX tiles,
// same contract: C[m, n] = alpha · round_bf16(A)[m, k] · op(B) (+ C), A f32,
// B bf16 ([n, k] when trans_b, else [k, n]), products exact, sums in f32.
//
// AMX is opt-in per process on Linux (arch_prctl(ARCH_REQ_XCOMP_PERM,
// XTILEDATA)); amx_bf16_available() asks for it once and says whether the
// CPU has AMX-BF16 + AMX-TILE (+ AVX512-BF16, used to pack) and the OS
// granted the tile state. The tile configuration is per thread: every
// thread that runs tiles loads it first and releases the tiles when done.
//
// AmxTiles::kEmulated runs the same packing, blocking and edge handling with
// the tile instructions done in scalar code (the instruction's documented
// arithmetic), so that everything but the three tile instructions is tested
// on machines without AMX; it needs AVX512-BF16 and is slow (tests only).
#pragma once

#include <cstdint>
#include <span>

namespace lathe::cpu {

enum class AmxTiles : uint8_t { kHardware, kEmulated };

// The operands of one gemm_bf16 call (gemm_bf16.h's arguments), which every
// kernel (gemm_bf16.cpp's and this one) extends with its own k blocking.
struct Bf16GemmProblem {
  bool trans_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const uint16_t* b;
  int64_t ldb;
  bool accumulate;
  float* c;
  int64_t ldc;
};

// True when the hardware path can run in this process. Thread-safe; the
// first call makes the arch_prctl request.
bool amx_bf16_available();

// Borrows a, b and c for the call; any thread may call it (outside a
// parallel region it uses the OpenMP threads). kHardware requires
// amx_bf16_available(), kEmulated has_avx512_bf16() (checked: abort if not).
void gemm_bf16_amx(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc,
                   AmxTiles tiles = AmxTiles::kHardware);

// B packed once ahead of many calls (a frozen weight): the tile layout the
// kernel packs per call, for all of B. Column pair q (columns 32q..32q+31)
// and k tile t (k 32t..32t+31) are two 1 KiB tiles at (q · kt + t) · 512
// words (kt = ceil(k / 32)), columns 0-15 then 16-31; row p of a tile holds,
// per column, the bf16 pair (b[2p][j], b[2p+1][j]), low half the even k;
// padding is zero. The AVX512-BF16 kernel reads the same layout.
int64_t amx_packed_b_words(int64_t n, int64_t k);
// Packs op(B) (B [n, k] when trans_b, else [k, n]) into dst, which holds
// amx_packed_b_words(n, k) words. Needs AVX512-BF16 (checked). Uses the
// OpenMP threads when parallel, else only the calling thread.
void amx_pack_b(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, uint32_t* dst,
                bool parallel = true);
// gemm_bf16_amx with B packed by amx_pack_b (for these n and k).
void gemm_bf16_amx_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                          const uint32_t* b_packed, bool accumulate, float* c, int64_t ldc,
                          AmxTiles tiles = AmxTiles::kHardware);

// A packed for the tiles by rows: row pair p (rows 32p..32p+31) and k tile
// t (k 32t..32t+31) are two tiles at (p · kt + t) · 1024 bf16, rows 0-15
// then 16-31; tile row r holds 32 consecutive k, zero past k; rows past m
// are zero. amx_packed_a_elems(m, k) bf16 in all.
int64_t amx_packed_a_elems(int64_t m, int64_t k);
// Packs a [m, k] (f32, leading dimension lda; rounded to nearest-even) into
// that layout at dst (amx_packed_a_elems(m, k) bf16), on the calling thread.
void amx_pack_a(const float* a, int64_t lda, int64_t m, int64_t k, uint16_t* dst);

// One product of a group: C[m, n] = alpha · round_bf16(A)[m, k] · B (+ C
// when accumulate), B packed by amx_pack_b for these n and k.
struct AmxGroupItem {
  int64_t n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const uint32_t* b_packed;
  bool accumulate;
  float* c;
  int64_t ldc;
};
// Runs the items in order over the same m rows in one parallel region: the
// threads take chunks of rows and run every item on their chunk before the
// next chunk, so an item may read as A the rows an earlier item wrote as C
// (row-local chains fuse: LoRA's u = x·Aᵀ, then y += u·Bᵀ), and items on
// the same A (pointer, lda and k) pack it once. Each item's results are
// those of gemm_bf16_amx_packed on it, bit for bit.
// after, when given, runs on each chunk of rows once its items are done, on
// the thread that ran them (thread: omp_get_thread_num() in the region, 0
// outside one): row-local work that reads what the items just wrote (LoRA's
// weight gradients from dy and du). before runs on each chunk of rows
// before its first item reads them (row-local preparation of the inputs).
// Neither may touch rows of other chunks.
struct AmxGroupAfter {
  void (*fn)(void* ctx, int64_t r0, int64_t rows, int thread);
  void* ctx;
};
void gemm_bf16_amx_packed_group(int64_t m, std::span<const AmxGroupItem> items,
                                AmxTiles tiles = AmxTiles::kHardware, const AmxGroupAfter* after = nullptr,
                                const AmxGroupAfter* before = nullptr);

// How gemm_bf16_amx_packed_group hands out rows (benchmarks compare): in
// chunks of chunk_pairs row pairs (default 4), dynamically, each chunk
// through every item (default); or with items_outer, each thread a fixed
// share of the chunks and every item over all of its share before the next
// item (each B read once per thread; no dynamic balance).
void set_amx_group_schedule(int chunk_pairs, bool items_outer);

// For benchmarks: the micro-kernel alone on operands that stay in L1, on the
// calling thread, `calls` times; returns GFLOP/s (the tiles' practical peak
// on one core). Requires amx_bf16_available().
double amx_tile_peak_gflops(int64_t calls);
// The same with A streaming through 1 MiB (from L2, as in a GEMM) and B in
// L1, with or without software prefetch of A.
double amx_stream_gflops(bool prefetch, int64_t calls);
// Whether the hardware kernel prefetches A (benchmarks compare). Default off.
void set_amx_prefetch(bool on);
// The micro-kernel, for other kernels of this backend (attention_amx.cpp)
// that pack their own operands in the layouts above: out[32][32] (leading
// dimension ldo) = the sum over `steps` k tiles of two A tiles (rows 0-15
// and 16-31; step s at a + s · 1024 bf16, the second at + 512) times two B
// tiles (columns 0-15 and 16-31; step s at b + s · 512 words, the second at
// + 256), in f32. Overwrites out. Call between amx_thread_begin and
// amx_thread_end on the same thread.
using AmxBlockFn = void (*)(const uint16_t* a, const uint32_t* b, int64_t steps, float* out, int64_t ldo);
AmxBlockFn amx_block_kernel(AmxTiles tiles);
// Loads (releases) the tile configuration of the calling thread; nothing
// for kEmulated.
void amx_thread_begin(AmxTiles tiles);
void amx_thread_end(AmxTiles tiles);

// Tests: while on (and the CPU has AVX512-BF16), every kHardware call runs
// the emulated tiles and bf16_gemm_path() (gemm_bf16.h) offers the AMX
// path, so whole training passes take the AMX code on any such machine.
void set_amx_emulation(bool on);
bool amx_emulation();

// Whether a GEMM on a packed-ahead B that fits L2 splits its rows over the
// threads (each packs and computes its own rows) instead of its columns
// (benchmarks compare). Default on.
void set_amx_rows_split(bool on);

}  // namespace lathe::cpu
