// What the warp-specialized Hopper attention backward's two files share
// (attention_bwd_ws.cu: the dk/dv and d_q kernels; attention_bwd_ds.cu: the
// d_q product from the stored dS tiles of AttnBwdKernels::kWsDs): the
// tensor maps, the block layout and its work items, where a tile pair's dS
// lives, and on the device the TMA tile copy, the ring of mbarriers, the
// consumer warpgroup's index and the store of a d_q accumulator.
#pragma once

#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_sm90.cuh"
#include "backends/cuda/attention_tma.cuh"
#include "backends/cuda/gemv_ring.cuh"  // the mbarrier helpers

// Consumer warpgroups per block (64 keys or query rows each) at head_dim
// 64: 2 or 3 (head_dim 128: 2, its dK and dV accumulators take 128
// registers a thread).
#ifndef LATHE_ATTN_BWD_WS_NC_64
#define LATHE_ATTN_BWD_WS_NC_64 2
#endif

// Named, not anonymous: the sm_80 pass uses little of it and would warn.
namespace lathe::cuda::attn::wsb {

// The tensor maps of q, d_out (n_head heads) and k, v (n_head_kv), one
// kernel parameter.
struct BwdMaps {
  CUtensorMap q, d_out, k, v;
};

// kWsDs (attention.h): where dkdv leaves the dS of every tile pair its keys
// see (bf16, 64 query rows × 64 keys, in the order store_ds_tile gives):
// pairs below end[0] in spare[0], then below end[1] in spare[1], the others
// in `rest`; and each document's first pair (ds_pair_base_kernel). A
// document's pairs follow those of the documents before it, head by head,
// and a head's by query tile: (qi, ki ≤ qi) is pair qi(qi + 1)/2 + ki.
struct DsArgs {
  uint32_t* rest = nullptr;
  int* pair_base = nullptr;
  uint32_t* spare[2] = {nullptr, nullptr};
  int64_t end[2] = {0, 0};
};
constexpr int kDsTileWords = kDsTileBytes / 4;


// Shared memory of a block: NC resident tiles of each of two tensors (dkdv:
// K, V; dq: Q, dO), kStages stages of each of the two streamed ones (dkdv:
// Q, dO; dq: K, V), dkdv's lse and D rows per stage, then the barriers
// (resident: one; full and empty per stage), from a 1024-byte aligned base.
template <int D, int NC>
struct WsBwdLayout {
  static constexpr int kStages = 3;
  static constexpr int kRows = NC * kBlockRows;
  static constexpr int kThreads = (NC + 1) * attn::kThreads;
  static constexpr int kT = sm90::tile_bytes<D>();
  static constexpr int kRes1 = NC * kT;                    // the second resident tensor
  static constexpr int kStream0 = 2 * NC * kT;             // the first streamed tensor's stages
  static constexpr int kStream1 = kStream0 + kStages * kT;  // the second's
  static constexpr int kLse = kStream1 + kStages * kT;     // kStages × 64 f32 (dkdv)
  static constexpr int kDelta = kLse + kStages * kBlockRows * 4;
  static constexpr int kBars = kDelta + kStages * kBlockRows * 4;
  static constexpr int kResFull = 0, kFull = 1, kEmpty = 1 + kStages, kBarriers = 1 + 2 * kStages;
  static constexpr int kSmem = kBars + kBarriers * 8 + 1024;  // + room to align the base
  // Registers per thread after the split: the producer's and the consumers'
  // ((NC + 1)·128 threads share 64 Ki).
  static constexpr int kProducerRegs = NC == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = NC == 2 ? 240 : 160;
  static_assert(NC == 2 || NC == 3);
  static_assert(kSmem <= 227 * 1024);
  static_assert(128 * kProducerRegs + NC * 128 * kConsumerRegs <= 65536);
};

// A block's work: its document's first row and length, the head (dq) or KV
// head (dkdv), and its first row (dq: query, dkdv: key).
struct WsBwdItem {
  int64_t base;
  int n, h, r0, doc;
};
// Item w of the grid: the row tiles ordered as the header says; false
// when the tile lies past its document's end.
template <int kRows, bool kLastFirst>
__device__ __forceinline__ bool bwd_item(const BwdParams& p, int docs, int heads, int tiles, int w, WsBwdItem& b) {
  const int tile = w / (docs * heads), doc = w / heads % docs;
  b.h = w % heads;
  b.doc = doc;
  b.base = p.cu[doc];
  b.n = p.cu[doc + 1] - p.cu[doc];
  b.r0 = (kLastFirst ? tiles - 1 - tile : tile) * kRows;
  return b.r0 < b.n;
}

// The pairs of one item's document and head (the first one's index), and a
// pair's tile.
struct DsHead {
  const DsArgs* ds;
  int64_t base;
  __device__ __forceinline__ uint32_t* pair(int qi, int ki) const {
    const int64_t at = base + int64_t(qi) * (qi + 1) / 2 + ki;
    if (at < ds->end[0]) return ds->spare[0] + at * kDsTileWords;
    if (at < ds->end[1]) return ds->spare[1] + (at - ds->end[0]) * kDsTileWords;
    return ds->rest + (at - ds->end[1]) * kDsTileWords;
  }
};
// doc_pairs: ds.pair_base[b.doc], read once by the caller.
__device__ __forceinline__ DsHead ds_head(const DsArgs& ds, int doc_pairs, const BwdParams& p, const WsBwdItem& b,
                                          int h) {
  const int64_t t = (b.n + kBlockRows - 1) / kBlockRows;
  return {&ds, int64_t(doc_pairs) * p.n_head + int64_t(h) * (t * (t + 1) / 2)};
}

#if LATHE_SM90A_DEVICE
using namespace tma;  // tma_load, regs_release / regs_claim, mbar_wait

// D/64 boxes of 64 rows (one 64-column panel each) of head `head` from row
// `row` into the tile at dst, counted on bar.
template <int D>
__device__ __forceinline__ void load_tile_tma(uint32_t dst, const CUtensorMap* map, int head, int64_t row,
                                              uint32_t bar) {
#pragma unroll
  for (int pn = 0; pn < D / 64; ++pn) tma_load(dst + pn * sm90::kPanelBytes, map, pn * 64, head, int(row), bar);
}

// The consumers' wait: tma::mbar_wait with its bounded slow path a call.
// Inlined into the consumer loops, the slow path's trap made ptxas spill
// the dkdv accumulators (680 bytes at head_dim 128) and serialize wgmma.
static __device__ __noinline__ void wait_slow(uint32_t bar, uint32_t parity) { mbar_wait_slow(bar, parity); }
__device__ __forceinline__ void wait_consumer(uint32_t bar, uint32_t parity) {
  if (!mbar_try(bar, parity)) wait_slow(bar, parity);
}

// The ring's stage of fill `it` (the it-th streamed tile of the block), and
// the parity its waits name.
template <typename L>
struct Ring {
  uint32_t bars;  // shared address of barrier 0
  __device__ __forceinline__ int stage(int it) const { return it % L::kStages; }
  __device__ __forceinline__ uint32_t full(int it) const { return bars + 8 * (L::kFull + stage(it)); }
  __device__ __forceinline__ uint32_t empty(int it) const { return bars + 8 * (L::kEmpty + stage(it)); }
  __device__ __forceinline__ void wait_full(int it) const { wait_consumer(full(it), (it / L::kStages) & 1); }
  // The producer, before refilling: the consumers gave back the fill before.
  __device__ __forceinline__ void wait_empty(int it) const {
    if (it >= L::kStages) mbar_wait(empty(it), ((it / L::kStages) & 1) ^ 1);
  }
  // One arrival per consumer warp (its products reading the stage completed).
  __device__ __forceinline__ void release(int it) const {
    if (threadIdx.x % 32 == 0) ring::mbar_arrive(empty(it));
  }
};

// A consumer warpgroup's d_q accumulator (this thread's rows row_a and
// row_a + 8), scaled, as bf16 rows of head b.h; nothing past the document.
template <int D>
__device__ __forceinline__ void store_dq_rows(const BwdParams& p, const WsBwdItem& b, const float (&dq)[D / 2],
                                              int row_a) {
  const int cc = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_a + 8 * r;
    if (row >= b.n) continue;
    bf16* dst = p.d_q + ((b.base + row) * p.n_head + b.h) * D + 2 * cc;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
      *reinterpret_cast<__nv_bfloat162*>(dst + dn * 8) =
          __floats2bfloat162_rn(dq[4 * dn + 2 * r] * p.scale, dq[4 * dn + 2 * r + 1] * p.scale);
  }
}

// This thread's consumer warpgroup, 0 .. NC − 1, as a value ptxas knows to
// be the same across the warp (a shuffle from lane 0). Computed from
// threadIdx directly, every branch on it (the keys or rows a warpgroup
// sees) counts as divergent, and ptxas then serializes each wgmma behind
// the one before it (warning C7518), which cost the kernels most of their
// overlap of products and exponentials.
__device__ __forceinline__ int consumer_index() {
  return __shfl_sync(0xffffffffu, int(threadIdx.x / attn::kThreads) - 1, 0);
}
#endif  // LATHE_SM90A_DEVICE

// attention_bwd_ds.cu: each document's first tile pair into ds.pair_base,
// and d_q = scale·dS·K from the tiles dkdv stored, on st.
Status launch_ds_pair_base(const int32_t* cu, int n_docs, int* pair_base, cudaStream_t st);
template <int D, int NC>
Status launch_dq_ds(const BwdMaps& maps, const BwdParams& p, int n_docs, int tiles, const DsArgs& ds,
                    cudaStream_t st);

}  // namespace lathe::cuda::attn::wsb
