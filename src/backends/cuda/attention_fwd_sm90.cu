// The attention forward on Hopper (sm_90a), warp-specialized: the fast build
// of attention_varlen_forward there (AttnFwdKernels::kWs). A thread block
// takes NC·64 query rows of one head of one document and has NC + 1
// warpgroups. The first produces: one thread issues TMA copies of the
// block's Q tiles (once) and of its K and V tiles (KN keys each) into a
// two-stage ring in shared memory, each copy counted on a "full" mbarrier,
// and refills a stage's K (or V) once every consumer warp has arrived on its
// "empty" barrier. The other NC warpgroups consume, 64 query rows each, and
// never wait for one another: each walks the key tiles its rows see with
// S = Q·Kᵀ (wgmma, both tiles in shared memory), the fp32 online softmax of
// attention_common.cuh, and O += P·V (P from registers). Inside a consumer
// the products overlap the softmax: the scores of tile j and P·V of tile
// j − 1 are issued together, the softmax of j runs while P·V(j − 1) is in
// flight, and O is rescaled after it lands. K is released as soon as the
// scores are read, V one tile later, so with two stages each copy has about
// a tile's time to arrive. The producer gives registers back (setmaxnreg)
// for the consumers' S, P and O.
//
// Tiles are the 128-byte-swizzled layout of attention_sm90.cuh with a
// panel of KN (or 64, for Q) rows per 64 columns: what TMA's 128-byte
// swizzle writes. Rows past the end of the tensors arrive as zeros (the
// tensor maps end there; with a KV cache at the last written row); rows of
// the next document are masked like keys past the diagonal. The work items
// (a query tile of one head of one document) are ordered with the last
// tiles (the most keys) first, so the short ones fill the tail; a block
// takes one, or (persistent) one block per SM takes every gridDim-th in
// turn, loading the next while it finishes the last.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_sm90.cuh"
#include "backends/cuda/attention_tma.cuh"  // the TMA copies, setmaxnreg, the bounded mbarrier wait, the tensor maps
#include "backends/cuda/gemv_ring.cuh"  // the mbarrier helpers

// The defaults of the run-time knobs (AttentionVarlenFwdArgs::ws_rows,
// ws_keys): query rows per block (two or three consumer warpgroups) and
// keys per K/V tile, per head_dim.
#ifndef LATHE_ATTN_FWD_WS_ROWS_64
#define LATHE_ATTN_FWD_WS_ROWS_64 192
#endif
#ifndef LATHE_ATTN_FWD_WS_KEYS_64  // (H200, 8 × 2048 causal: 192×128 290 TFLOP/s, 192×64 272, 128×128 256)
#define LATHE_ATTN_FWD_WS_KEYS_64 128
#endif
#ifndef LATHE_ATTN_FWD_WS_KEYS_128  // (H200: 128×128 404 TFLOP/s, 128×64 361)
#define LATHE_ATTN_FWD_WS_KEYS_128 128
#endif
// One block per SM taking the work items in turn (1), or a block per item.
#ifndef LATHE_ATTN_FWD_WS_PERSISTENT
#define LATHE_ATTN_FWD_WS_PERSISTENT 0
#endif

// Named, not anonymous: the sm_80 pass uses little of it and would warn.
namespace lathe::cuda::attn::ws {

// The tensor maps of q, k and v, one kernel parameter.
struct WsMaps {
  CUtensorMap q, k, v;
};

// Shared memory of one block: NC Q tiles, two K stages, two V stages, then
// the barriers (q_full per consumer; k_full, v_full, k_empty, v_empty per
// stage; q_empty), all from a 1024-byte aligned base.
template <int D, int NC, int KN>
struct WsLayout {
  static constexpr int kStages = 2;
  static constexpr int kRows = NC * kBlockRows;
  static constexpr int kThreads = (NC + 1) * attn::kThreads;
  static constexpr int kQBytes = kBlockRows * D * 2;  // one consumer's Q tile (panels of 64 rows × 128 bytes)
  static constexpr int kKvBytes = KN * D * 2;          // one K or V stage (panels of KN rows × 128 bytes)
  static constexpr int kK = NC * kQBytes;
  static constexpr int kV = kK + kStages * kKvBytes;
  static constexpr int kBars = kV + kStages * kKvBytes;
  static constexpr int kSmem = kBars + (NC + 4 * kStages + 1) * 8 + 1024;  // + room to align the base
  // Barrier indices: the full ones (the producer's arrivals), then the empty ones.
  static constexpr int kQFull = 0, kKFull = NC, kVFull = NC + kStages, kKEmpty = NC + 2 * kStages,
                       kVEmpty = NC + 3 * kStages, kQEmpty = NC + 4 * kStages, kBarriers = kQEmpty + 1;
  // Registers per thread after the split: the producer's and the consumers'.
  static constexpr int kProducerRegs = NC == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = NC == 2 ? 232 : 160;  // (NC + 1)·launch registers in all
  static_assert(KN == 64 || KN == 128);
  static_assert(NC == 2 || NC == 3);
  static_assert(kSmem <= 227 * 1024);
};

#if LATHE_SM90A_DEVICE
using namespace tma;  // tma_load, regs_release / regs_claim, mbar_wait (attention_tma.cuh)

// d[64×128] = A[64×16]·B[16×128] (+ d when accumulate), both K-major
// descriptors (the n64 form is sm90::wgmma_ss_n64).
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LATHE_WG_R64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : LATHE_WG_F64
      : "l"(a), "l"(b), "r"(accumulate));
}

// S[64×KN] = Q·Kᵀ over D columns: Q a 64-row tile, K a KN-row one, both
// K-major. Issues only (the caller fences and commits).
template <int D, int KN>
__device__ __forceinline__ void issue_scores(float (&s)[KN / 2], const unsigned char* q, const unsigned char* k) {
  using sm90::sw128_desc;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t a = sw128_desc(q + (kk / 4) * (kBlockRows * 128) + (kk % 4) * 32, 16, 1024);
    const uint64_t b = sw128_desc(k + (kk / 4) * (KN * 128) + (kk % 4) * 32, 16, 1024);
    if constexpr (KN == 64) {
      sm90::wgmma_ss_n64(s, a, b, kk > 0);
    } else {
      wgmma_ss_n128(s, a, b, kk > 0);
    }
  }
}

// O[64×D] += P·V over KN keys: P the KN/16 register fragments, V the KN-row
// tile MN-major (panels of 64 columns KN·128 bytes apart). Issues only.
template <int D, int KN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (*pa)[4], const unsigned char* v) {
#pragma unroll
  for (int kc = 0; kc < KN / 16; ++kc)
    sm90::wgmma_rs<D>(o, pa[kc], sm90::sw128_desc(v + kc * 16 * 128, KN * 128, 1024));
}
// P for the next product: the score tile's C fragments as bf16 A fragments.
template <int KN>
__device__ __forceinline__ void scores_to_operand(uint32_t (*pa)[4], const float (*s)[4]) {
#pragma unroll
  for (int kc = 0; kc < KN / 16; ++kc) c_to_a(pa[kc], s, kc);
}
// sm90::pin for KN/16 register A fragments.
template <int N>
__device__ __forceinline__ void pin_operand(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < 4 * N; ++i) asm volatile("" : "+r"(a[i / 4][i % 4])::"memory");
}

// One work item of a block (a query tile of one head of one document): its
// sequence, head, first query row and the key tiles (n_tiles of KN keys
// from k_first) its rows see together; g0 counts the K/V tiles of the
// block's earlier items, n_done those items.
struct WsBlock {
  BlockSeq seq;
  int h, hk, i0, k_first, n_tiles, g0, n_done;
};

// Work item w of the grid-wide list, the query tiles with the most keys
// first (then document, then head); false when the tile lies past its
// document's end.
template <int kRows, int KN>
__device__ __forceinline__ bool ws_item(const FwdParams& p, int w, WsBlock& b) {
  const int docs = p.cu ? p.n_docs : 1, tiles = (p.max_q + kRows - 1) / kRows;
  const int tile = w / (docs * p.n_head), doc = w / p.n_head % docs;
  b.h = w % p.n_head;
  b.hk = b.h / (p.n_head / p.n_head_kv);
  b.seq = block_seq(p, doc);
  b.i0 = (tiles - 1 - tile) * kRows;
  if (b.i0 >= b.seq.n_q) return false;
  const int last_row = min(b.i0 + kRows, b.seq.n_q) - 1;
  const int k_last = min(b.seq.n_k - 1, last_row + p.q_pos0);
  b.k_first = p.window > 0 ? max(0, b.i0 + p.q_pos0 - p.window + 1) : 0;
  b.n_tiles = (k_last - b.k_first) / KN + 1;
  return true;
}

// The ring's barriers: K/V tile g of the block (g0 + j: tile j of the
// current item) lives in stage g % 2 and is that stage's fill g / 2, whose
// parity the waits name.
template <typename L>
struct WsBars {
  uint32_t base;  // shared address of barrier 0
  int g0;         // the block's K/V tiles before the current item
  __device__ __forceinline__ uint32_t at(int kind, int j) const {
    return base + 8 * (kind + (g0 + j) % L::kStages);
  }
  // Byte offset of tile j's stage in the K (or V) ring.
  __device__ __forceinline__ int stage(int j) const { return (g0 + j) % L::kStages * L::kKvBytes; }
  __device__ __forceinline__ void wait_full(int kind, int j) const {
    mbar_wait(at(kind, j), ((g0 + j) / L::kStages) & 1);
  }
  // One arrival per consumer warp (the caller's wgmma reading the tile completed).
  __device__ __forceinline__ void release(int kind, int j) const {
    if (threadIdx.x % 32 == 0) ring::mbar_arrive(at(kind, j));
  }
};

// The producer thread, for one item: Q tiles once the consumers are done
// with the last item's, then K(j), V(j) for every tile, each into its stage
// once the consumers gave back the tile two before it.
template <int D, int NC, int KN>
__device__ __forceinline__ void ws_produce(const WsMaps& maps, uint32_t smem, const WsBlock& b) {
  using L = WsLayout<D, NC, KN>;
  const WsBars<L> bars{smem + L::kBars, b.g0};
  if (b.n_done > 0) mbar_wait(bars.base + 8 * L::kQEmpty, (b.n_done - 1) & 1);
  for (int c = 0; c < NC; ++c) {
    const uint32_t bar = bars.base + 8 * (L::kQFull + c);
    ring::mbar_expect(bar, L::kQBytes);
    const int row = int(b.seq.q_base) + b.i0 + c * kBlockRows;
#pragma unroll
    for (int pn = 0; pn < D / 64; ++pn)
      tma_load(smem + c * L::kQBytes + pn * kBlockRows * 128, &maps.q, pn * 64, b.h, row, bar);
  }
  for (int j = 0; j < b.n_tiles; ++j) {
    const int row = int(b.seq.k_base) + b.k_first + j * KN;
    const int g = b.g0 + j;
    const uint32_t stage = bars.stage(j);
    if (g >= L::kStages) mbar_wait(bars.at(L::kKEmpty, j), ((g / L::kStages) & 1) ^ 1);
    ring::mbar_expect(bars.at(L::kKFull, j), L::kKvBytes);
#pragma unroll
    for (int pn = 0; pn < D / 64; ++pn)
      tma_load(smem + L::kK + stage + pn * KN * 128, &maps.k, pn * 64, b.hk, row, bars.at(L::kKFull, j));
    if (g >= L::kStages) mbar_wait(bars.at(L::kVEmpty, j), ((g / L::kStages) & 1) ^ 1);
    ring::mbar_expect(bars.at(L::kVFull, j), L::kKvBytes);
#pragma unroll
    for (int pn = 0; pn < D / 64; ++pn)
      tma_load(smem + L::kV + stage + pn * KN * 128, &maps.v, pn * 64, b.hk, row, bars.at(L::kVFull, j));
  }
}

// The tiles t_begin .. t_end of one item for consumer warpgroup c (Q has
// landed): S(j) = Q·K(j)ᵀ, the online softmax, O += P·V, the products of
// tile j and P·V of j − 1 in flight together; o, m, l start empty. Gives
// each K and V tile back once read, and Q after the last scores.
template <int D, int NC, int KN>
__device__ __forceinline__ void ws_attend(const FwdParams& p, const unsigned char* smem, const WsBlock& b, int c,
                                          int t_begin, int t_end, int row_a, float (&o)[D / 2], float (&m)[2],
                                          float (&l)[2]) {
  using L = WsLayout<D, NC, KN>;
  constexpr int kNt = KN / 8;  // 8-key column tiles of S
  const WsBars<L> bars{ring::smem_addr(smem) + L::kBars, b.g0};
  const int pos0 = b.i0 + c * kBlockRows + p.q_pos0, n_k = b.seq.n_k;  // pos0: the warpgroup's first row
  const unsigned char* sQ = smem + c * L::kQBytes;
  const unsigned char* sK = smem + L::kK;
  const unsigned char* sV = smem + L::kV;
  const float sl2 = p.scale * kLog2e;
  const int pos_a = row_a + p.q_pos0, pos_b = row_a + 8 + p.q_pos0;
  auto* o4 = reinterpret_cast<float(*)[4]>(o);
  float s[KN / 2], alpha[2];
  uint32_t pa[KN / 16][4];
#pragma unroll
  for (int i = 0; i < KN / 2; ++i) s[i] = 0.f;
  auto* s4 = reinterpret_cast<float(*)[4]>(s);
  auto softmax = [&](int j) {  // the mask only on tiles that need it: a branch, not predicated tests
    const int kt = b.k_first + j * KN;
    if (p.window > 0 || kt + KN - 1 > pos0) {
      softmax_scores<kNt, kMaskAlways>(s4, m, l, alpha, true, kt, pos_a, pos_b, n_k, p.window, sl2);
    } else {
      softmax_scores<kNt, kMaskNever>(s4, m, l, alpha, false, kt, pos_a, pos_b, n_k, p.window, sl2);
    }
  };

  // The first tile: its scores alone.
  int j = t_begin;
  bars.wait_full(L::kKFull, j);
  sm90::wg_fence();
  issue_scores<D, KN>(s, sQ, sK + bars.stage(j));
  sm90::wg_commit();
  sm90::wg_wait<0>();
  sm90::pin(s);
  bars.release(L::kKEmpty, j);
  softmax(j);
  // Then the scores of j with P·V of j − 1 behind them; the softmax of j
  // runs while P·V(j − 1) is in flight, and the wait for it opens the next
  // iteration (a wait in the same basic block as the softmax is scheduled
  // above it by ptxas, which serializes the two).
  for (++j; j <= t_end; ++j) {
    sm90::wg_wait<0>();  // P·V(j − 2)
    sm90::pin(o);
    if (j - 2 >= t_begin) bars.release(L::kVEmpty, j - 2);
    rescale_rows<D>(o4, alpha);
    scores_to_operand<KN>(pa, s4);
    bars.wait_full(L::kKFull, j);
    bars.wait_full(L::kVFull, j - 1);
    pin_operand(pa);
    sm90::pin(o);
    sm90::wg_fence();
    issue_scores<D, KN>(s, sQ, sK + bars.stage(j));
    sm90::wg_commit();
    issue_pv<D, KN>(o, pa, sV + bars.stage(j - 1));
    sm90::wg_commit();
    sm90::wg_wait<1>();  // the scores
    sm90::pin(s);
    bars.release(L::kKEmpty, j);
    softmax(j);
  }
  sm90::wg_wait<0>();
  sm90::pin(o);
  if (threadIdx.x % 32 == 0) ring::mbar_arrive(bars.base + 8 * L::kQEmpty);  // every product with Q is done
  if (t_end - 1 >= t_begin) bars.release(L::kVEmpty, t_end - 1);
  rescale_rows<D>(o4, alpha);
  scores_to_operand<KN>(pa, s4);
  // The last tile's P·V.
  bars.wait_full(L::kVFull, t_end);
  pin_operand(pa);
  sm90::pin(o);
  sm90::wg_fence();
  issue_pv<D, KN>(o, pa, sV + bars.stage(t_end));
  sm90::wg_commit();
  sm90::wg_wait<0>();
  sm90::pin(o);
  bars.release(L::kVEmpty, t_end);
}

// Consumer warpgroup c, for one item: rows i0 + 64c .. of it. Tiles its
// rows do not see are taken and given back at once (every consumer warp
// arrives on every empty barrier, in tile order), then the rows are stored.
template <int D, int NC, int KN>
__device__ __forceinline__ void ws_consume(const FwdParams& p, const unsigned char* smem, const WsBlock& b, int c) {
  using L = WsLayout<D, NC, KN>;
  const WsBars<L> bars{ring::smem_addr(smem) + L::kBars, b.g0};
  const int t = threadIdx.x % attn::kThreads;
  const int w0 = b.i0 + c * kBlockRows, pos0 = w0 + p.q_pos0;
  const int row_a = w0 + t / 32 * 16 + t % 32 / 4;
  const int n_q = b.seq.n_q, n_k = b.seq.n_k;
  int t_begin = b.n_tiles, t_end = b.n_tiles - 1;  // the tiles these rows see
  if (w0 < n_q) {
    const int first_key = p.window > 0 ? max(0, pos0 - p.window + 1) : 0;
    const int last_key = min(n_k - 1, min(w0 + kBlockRows, n_q) - 1 + p.q_pos0);
    t_begin = (first_key - b.k_first) / KN;
    t_end = (last_key - b.k_first) / KN;
  }
  auto pass = [&](int j) {
    bars.wait_full(L::kKFull, j);
    bars.release(L::kKEmpty, j);
    bars.wait_full(L::kVFull, j);
    bars.release(L::kVEmpty, j);
  };
  // Q first, also where no row is used: no copy may still be landing when the block exits.
  mbar_wait(bars.base + 8 * (L::kQFull + c), b.n_done & 1);
  if (t_begin > t_end && threadIdx.x % 32 == 0) ring::mbar_arrive(bars.base + 8 * L::kQEmpty);
  for (int j = 0; j < t_begin; ++j) pass(j);
  float o[D / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  if (t_begin <= t_end) ws_attend<D, NC, KN>(p, smem, b, c, t_begin, t_end, row_a, o, m, l);
  for (int j = t_end + 1; j < b.n_tiles; ++j) pass(j);
  store_rows<D>(p, reinterpret_cast<const float(*)[4]>(o), m, l, b.seq.q_base, row_a, row_a + 8, n_q, b.h);
}
#endif  // LATHE_SM90A_DEVICE

// A block takes the items blockIdx.x, blockIdx.x + gridDim.x, ...: one each
// when the grid covers them all, several in turn when it is one block per
// SM (persistent: the producer then loads an item while the consumers
// finish and store the one before).
template <int D, int NC, int KN, bool kPersistent>
__global__ void __launch_bounds__(WsLayout<D, NC, KN>::kThreads, 1)
    flash_forward_ws_kernel(const __grid_constant__ WsMaps maps, const FwdParams p, int n_items) {
#if LATHE_SM90A_DEVICE
  using L = WsLayout<D, NC, KN>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = sm90::aligned_smem(smem_raw);
  const uint32_t bars = ring::smem_addr(smem) + L::kBars;
  if (threadIdx.x == 0) {
    for (int i = 0; i < L::kKEmpty; ++i) ring::mbar_init(bars + 8 * i, 1);  // the full barriers: the producer
    for (int i = L::kKEmpty; i < L::kBarriers; ++i) ring::mbar_init(bars + 8 * i, NC * 4);  // the consumer warps
    ring::fence_barrier_init();
  }
  __syncthreads();
  // Separate loops: ptxas gives each side its register budget only when
  // no code after the split is shared.
  WsBlock b;
  b.g0 = 0, b.n_done = 0;
  if (threadIdx.x < attn::kThreads) {
    regs_release<L::kProducerRegs>();
    if (threadIdx.x != 0) return;
    for (int w = blockIdx.x; w < n_items; w += gridDim.x) {
      if (!ws_item<L::kRows, KN>(p, w, b)) continue;
      ws_produce<D, NC, KN>(maps, ring::smem_addr(smem), b);
      if constexpr (!kPersistent) break;  // (g0 and n_done stay 0: fewer registers)
      b.g0 += b.n_tiles, ++b.n_done;
    }
    return;
  }
  regs_claim<L::kConsumerRegs>();
  for (int w = blockIdx.x; w < n_items; w += gridDim.x) {
    if (!ws_item<L::kRows, KN>(p, w, b)) continue;
    ws_consume<D, NC, KN>(p, smem, b, threadIdx.x / attn::kThreads - 1);
    if constexpr (!kPersistent) break;
    b.g0 += b.n_tiles, ++b.n_done;
  }
#else
  __trap();  // launched only where sm90_supported() holds
#endif
}

template <int D, int NC, int KN>
Status launch_ws(const FwdParams& p, cudaStream_t stream) {
  using L = WsLayout<D, NC, KN>;
  const tma::EncodeTiled encode = tma::tensor_map_encoder();
  if (!encode) return unsupported("attention forward (warp-specialized): the driver has no cuTensorMapEncodeTiled");
  if (p.cu && p.n_tokens <= 0) return invalid_argument("attention forward (warp-specialized): n_tokens is not set");
  // q holds n_tokens rows (packed documents) or n_q (prefill); k and v the
  // same, or the cache's rows written so far.
  const int64_t q_rows = p.cu ? p.n_tokens : p.n_q;
  const int64_t kv_rows = p.cu ? p.n_tokens : int64_t(p.q_pos0) + p.n_q;
  WsMaps maps;
  constexpr const char* kWho = "attention forward (warp-specialized)";
  LATHE_TRY(tma::encode_map<D>(encode, &maps.q, p.q, p.n_head, q_rows, kBlockRows, kWho, "q"));
  LATHE_TRY(tma::encode_map<D>(encode, &maps.k, p.k, p.n_head_kv, kv_rows, KN, kWho, "k"));
  LATHE_TRY(tma::encode_map<D>(encode, &maps.v, p.v, p.n_head_kv, kv_rows, KN, kWho, "v"));
  const int64_t tiles = (p.max_q + L::kRows - 1) / L::kRows, docs = p.cu ? p.n_docs : 1;
  const int64_t n_items = tiles * docs * p.n_head;
  if (n_items > INT32_MAX)
    return invalid_argument("attention forward (warp-specialized): ", n_items, " query tiles exceed 2^31");
  int64_t grid = n_items;
  const bool persistent = p.ws_persistent > 0 || (p.ws_persistent < 0 && LATHE_ATTN_FWD_WS_PERSISTENT);
  if (persistent) {
    int dev = 0, sms = 0;
    LATHE_TRY(cuda_check(cudaGetDevice(&dev), "cudaGetDevice"));
    LATHE_TRY(cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                         "cudaDeviceGetAttribute(multiprocessors)"));
    grid = std::min<int64_t>(n_items, sms);
  }
  auto* kernel = persistent ? flash_forward_ws_kernel<D, NC, KN, true> : flash_forward_ws_kernel<D, NC, KN, false>;
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmem),
                       "cudaFuncSetAttribute(flash_forward_ws)"));
  kernel<<<unsigned(grid), L::kThreads, L::kSmem, stream>>>(maps, p, int(n_items));
  return cuda_check(cudaGetLastError(), "flash_forward_ws launch");
}

}  // namespace lathe::cuda::attn::ws

namespace lathe::cuda::attn {

Status launch_forward_ws(const FwdParams& p, void* stream) {
  using ws::launch_ws;
  auto st = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 128) {
    if (p.ws_rows != 0 && p.ws_rows != 128)
      return invalid_argument("attention forward (warp-specialized): ws_rows ", p.ws_rows, " at head_dim 128 (128)");
    const int keys = p.ws_keys != 0 ? p.ws_keys : LATHE_ATTN_FWD_WS_KEYS_128;
    return keys == 64 ? launch_ws<128, 2, 64>(p, st) : launch_ws<128, 2, 128>(p, st);
  }
  if (p.head_dim == 64) {
    const int rows = p.ws_rows != 0 ? p.ws_rows : LATHE_ATTN_FWD_WS_ROWS_64;
    const int keys = p.ws_keys != 0 ? p.ws_keys : LATHE_ATTN_FWD_WS_KEYS_64;
    if (rows == 192) return keys == 64 ? launch_ws<64, 3, 64>(p, st) : launch_ws<64, 3, 128>(p, st);
    return keys == 64 ? launch_ws<64, 2, 64>(p, st) : launch_ws<64, 2, 128>(p, st);
  }
  return unsupported("attention forward (warp-specialized): head_dim ", p.head_dim, " (64 and 128 are compiled)");
}

}  // namespace lathe::cuda::attn
