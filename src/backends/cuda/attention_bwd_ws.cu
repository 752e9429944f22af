// The attention backward on Hopper (sm_90a), warp-specialized
// (AttnBwdKernels::kWs): the dq / dkdv split of attention_bwd.cu with the
// per-tile arithmetic of the wgmma kernels (sm90::dq_tile, sm90::dkdv_tile:
// P and dS rounded to bf16 before their products, fp32 accumulation, no
// atomics), fed the way the warp-specialized forward is fed. A thread block
// has NC + 1 warpgroups. The first produces: its first warp issues TMA
// copies (attention_tma.cuh) into a ring of kStages stages in shared
// memory, each fill counted on a "full" mbarrier, and refills a stage once
// every consumer warp has arrived on its "empty" one. The other NC
// warpgroups consume, 64 rows each, without ever waiting for one another,
// so one's exponentials and conversions run while the other's products
// occupy the tensor cores:
//   dkdv: a block owns NC·64 keys of one KV head; K and V arrive once, then
//         for every query tile its keys see, and for each query head of
//         the group, the producer streams the Q and dO tiles (TMA) and the
//         tile's lse and D rows (the producer warp's lanes, plain loads,
//         each lane arriving on the full barrier after its stores);
//   dq:   a block owns NC·64 query rows of one head; Q and dO arrive once,
//         then the K and V tiles the rows see stream through the ring; each
//         thread keeps its two rows' lse and D in registers.
// Every accumulator (dK and dV, or dQ) lives in its warpgroup's registers
// for the whole walk and is written once, so the result does not depend on
// timing. dq runs on the backward's second stream beside dkdv, as with the
// other kernels; or (AttnBwdKernels::kWsDs) dkdv also stores each tile
// pair's dS, and d_q is one product of those with K after it (dq_ds). Work items are ordered with the longest first (dkdv: the
// first key tiles, which the most query rows see; dq: the last query tiles),
// the heads of one KV group side by side so their K/V tiles meet in L2.
// Inside a consumer the products of a tile go out in two groups (Sᵀ and
// dPᵀ, or S and dP), the exponentials run while the second is in flight,
// and dkdv issues dV += Pᵀ·dO before it forms dSᵀ. (Issuing the next
// tile's score products behind a tile's last product was slower: at
// head_dim 128 the extra live registers spill, and ptxas then serializes
// the products, warning C7514.)
//
// Rows past a document inside the packed tensors arrive as the next
// document's rows (past the tensors' end as zeros); the masks drop them
// (visible(), and zero lse / D rows past the end in dkdv), and nothing past
// a document is stored.
#include "backends/cuda/attention_bwd_ws.cuh"

#include <type_traits>

namespace lathe::cuda::attn::wsb {

#if LATHE_SM90A_DEVICE
// A consumer's walk over the ring's n fills: the run first .. last − 1 it
// works on (score products issued, the tile's arithmetic, its last product
// waited for, then done), the others given back unread.
template <class R, class Issue, class Tile, class Done>
__device__ __forceinline__ void walk_run(const R& ring_, int first, int last, int n, Issue&& issue, Tile&& tile,
                                         Done&& done) {
  for (int it = 0; it < first; ++it) {
    ring_.wait_full(it);
    ring_.release(it);
  }
  for (int it = first; it < last; ++it) {
    issue(it);
    tile(it);
    sm90::wg_wait<0>();
    done(it);
  }
  for (int it = last; it < n; ++it) {
    ring_.wait_full(it);
    ring_.release(it);
  }
}

// The query tiles a dkdv block walks per head: from its first key's tile to
// the last query row that sees one of its keys.
template <int kRows>
__device__ __forceinline__ int dkdv_query_tiles(const BwdParams& p, const WsBwdItem& b) {
  const int q_last = p.window > 0 ? min(b.n - 1, min(b.r0 + kRows, b.n) - 1 + p.window - 1) : b.n - 1;
  return (q_last - b.r0) / kBlockRows + 1;
}

// dkdv's producer warp: K and V once, then for every (head of the group,
// query tile) the Q and dO tiles (lane 0, TMA) and the lse and D rows (every
// lane two rows; zeros past the document).
template <int D, int NC>
__device__ __forceinline__ void dkdv_produce(const BwdMaps& maps, const BwdParams& p, unsigned char* smem,
                                             const WsBwdItem& b) {
  using L = WsBwdLayout<D, NC>;
  const uint32_t s0 = ring::smem_addr(smem);
  const Ring<L> ring_{s0 + L::kBars};
  const int lane = threadIdx.x % 32, group = p.n_head / p.n_head_kv;
  if (lane == 0) {
    const uint32_t bar = ring_.bars + 8 * L::kResFull;
    ring::mbar_expect(bar, 2 * NC * L::kT);
    for (int w = 0; w < NC; ++w) {
      load_tile_tma<D>(s0 + w * L::kT, &maps.k, b.h, b.base + b.r0 + w * kBlockRows, bar);
      load_tile_tma<D>(s0 + L::kRes1 + w * L::kT, &maps.v, b.h, b.base + b.r0 + w * kBlockRows, bar);
    }
  }
  const int n_qt = dkdv_query_tiles<L::kRows>(p, b), n_iter = group * n_qt;
  float* sL = reinterpret_cast<float*>(smem + L::kLse);
  float* sD = reinterpret_cast<float*>(smem + L::kDelta);
  for (int it = 0; it < n_iter; ++it) {
    const int h = b.h * group + it % group, qt = b.r0 + it / group * kBlockRows, st = ring_.stage(it);
    ring_.wait_empty(it);
    float lse[2], dlt[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = qt + lane + 32 * r;
      const int64_t at = (b.base + q) * p.n_head + h;
      lse[r] = q < b.n ? p.lse[at] : 0.f;
      dlt[r] = q < b.n ? p.delta[at] : 0.f;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sL[st * kBlockRows + lane + 32 * r] = lse[r];
      sD[st * kBlockRows + lane + 32 * r] = dlt[r];
    }
    const uint32_t bar = ring_.full(it);
    if (lane == 0) {
      ring::mbar_expect(bar, 2 * L::kT);  // lane 0's arrival, after its stores
      load_tile_tma<D>(s0 + L::kStream0 + st * L::kT, &maps.q, h, b.base + qt, bar);
      load_tile_tma<D>(s0 + L::kStream1 + st * L::kT, &maps.d_out, h, b.base + qt, bar);
    } else {
      ring::mbar_arrive(bar);
    }
  }
}

// An 8×8 block of bf16 held as one register per thread (row lane/4,
// columns 2(lane%4) and + 1), transposed across the warp.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t v) {
  uint32_t t;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(t) : "r"(v));
  return t;
}

// dkdv's dSᵀ operand of one tile pair (a[kc]: this warp's 16 keys, 16w ..,
// by query columns 16kc .. 16kc + 15) stored as the d_q product's dS
// operand: the warp of query rows 16kc .. reads, for its key chunk w, the
// four A registers i (rows + 8 in bit 0, columns + 8 in bit 1) of each
// lane at word ((kc·4 + w)·32 + lane)·4 + i. Each 8×8 block is transposed
// (movmatrix), which swaps its row and column offsets, so register i comes
// from a[kc][i with its two bits swapped]. A thread stores 16 contiguous
// bytes per chunk, a warp 512.
__device__ __forceinline__ void store_ds_tile(uint32_t* tile, const uint32_t (&a)[4][4]) {
  const int w = threadIdx.x % attn::kThreads / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int kc = 0; kc < 4; ++kc)
    *reinterpret_cast<uint4*>(tile + ((kc * 4 + w) * 32 + lane) * 4) =
        make_uint4(transpose8x8(a[kc][0]), transpose8x8(a[kc][2]), transpose8x8(a[kc][1]), transpose8x8(a[kc][3]));
}

// dkdv for one query tile (sm90::dkdv_tile's arithmetic, its products
// reordered to hold fewer registers, which the register split leaves 240),
// from the moment Sᵀ and dPᵀ are in flight (issued by issue_score_products)
// to the issue of dK += dSᵀ·Q, left in flight: once Sᵀ lands, Pᵀ is made
// and dV += Pᵀ·dO issued at once, so it runs while dPᵀ finishes and dSᵀ is
// formed. Pᵀ in fp32 stays for dSᵀ, its bf16 copy feeds the product.
template <int D>
__device__ __forceinline__ void dkdv_tile_ws(float (&dk)[D / 2], float (&dv)[D / 2], float (&s)[32], float (&dp)[32],
                                             uint32_t (&a)[4][4], const unsigned char* sQ, const unsigned char* sO,
                                             const float* sL, const float* sD, bool masked, int qt, int key_a,
                                             int key_b, int n, int window, float sl2) {
  using namespace sm90;
  const int c = threadIdx.x % 4;
  wg_wait<1>();
  pin(s);
#pragma unroll
  for (int j = 0; j < 8; ++j)  // Pᵀ, while dPᵀ is computed
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = j * 8 + 2 * c + (e & 1), qi = qt + col, i = 4 * j + e;
      const bool vis = !masked || (qi < n && visible(e < 2 ? key_a : key_b, qi, n, window));
      s[i] = vis ? fast_exp2(fmaf(s[i], sl2, -sL[col] * kLog2e)) : 0.f;
    }
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) c_to_a(a[kc], reinterpret_cast<const float(*)[4]>(s), kc);
  pin(a);
  pin(dv);
  wg_fence();
  accumulate_rows<D>(dv, a, sO);
  wg_commit();
  wg_wait<1>();  // dPᵀ (dV += Pᵀ·dO may still run)
  pin(dp);
#pragma unroll
  for (int i = 0; i < 32; ++i) dp[i] = s[i] * (dp[i] - sD[i / 4 * 8 + 2 * c + i % 2]);  // dSᵀ
  wg_wait<0>();  // the product reading a[] is done before a[] is rewritten
  pin(dv);
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) c_to_a(a[kc], reinterpret_cast<const float(*)[4]>(dp), kc);
  pin(a);
  pin(dk);
  wg_fence();
  accumulate_rows<D>(dk, a, sQ);
  wg_commit();
}

// dkdv's consumer warpgroup c: keys r0 + 64c .. of the item. The ring
// brings the query tiles in turn, each with the group's heads side by side
// (dkdv_produce), so the tiles these keys see form one run, first ..
// last − 1; the others are given back unread. Each product is
// issued from one place in a loop whose branches are the same across the
// warpgroup: ptxas then keeps them asynchronous (branching per tile around
// the issue made it serialize every wgmma, warnings C7515 / C7518).
template <int D, int NC, bool kDs>
__device__ __forceinline__ void dkdv_consume(const BwdParams& p, const unsigned char* smem, const WsBwdItem& b,
                                             int c, const DsArgs& ds) {
  using L = WsBwdLayout<D, NC>;
  const Ring<L> ring_{ring::smem_addr(smem) + L::kBars};
  const int t = threadIdx.x % attn::kThreads, group = p.n_head / p.n_head_kv, n = b.n;
  const int w0 = b.r0 + c * kBlockRows, w_last = min(w0 + kBlockRows, n) - 1;  // this warpgroup's keys
  const int key_a = w0 + t / 32 * 16 + t % 32 / 4, key_b = key_a + 8;
  const int n_qt = dkdv_query_tiles<L::kRows>(p, b), n_iter = group * n_qt;
  const float sl2 = p.scale * kLog2e;
  const unsigned char* sK = smem + c * L::kT;
  const unsigned char* sV = smem + L::kRes1 + c * L::kT;
  const float* sL = reinterpret_cast<const float*>(smem + L::kLse);
  const float* sD = reinterpret_cast<const float*>(smem + L::kDelta);
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int doc_pairs = kDs ? __ldg(ds.pair_base + b.doc) : 0;
  wait_consumer(ring_.bars + 8 * L::kResFull, 0);  // also where no key is used: no copy may land after the exit
  auto qt_of = [&](int it) { return b.r0 + it / group * kBlockRows; };
  auto seen = [&](int it) {
    const int qt = qt_of(it);
    return w0 < n && qt + kBlockRows - 1 >= w0 && (p.window <= 0 || qt <= w_last + p.window - 1);
  };
  int first = 0;
  while (first < n_iter && !seen(first)) ++first;
  int last = first;
  while (last < n_iter && seen(last)) ++last;
  float s[32], dp[32];
  uint32_t a[4][4];  // the bf16 operand of dV's and dK's products (dK's outlives tile())
  auto issue = [&](int it) {  // tile it's score products, once its stage has landed
    const int st = ring_.stage(it);
    ring_.wait_full(it);
    sm90::issue_score_products<D>(s, dp, sK, smem + L::kStream0 + st * L::kT, sV, smem + L::kStream1 + st * L::kT);
  };
  auto tile = [&](int it) {  // from the score products in flight to dK's product issued
    const int qt = qt_of(it), st = ring_.stage(it);
    const bool masked = p.window > 0 || qt < w0 + kBlockRows - 1 || qt + kBlockRows > n;
    dkdv_tile_ws<D>(dk, dv, s, dp, a, smem + L::kStream0 + st * L::kT, smem + L::kStream1 + st * L::kT,
                    sL + st * kBlockRows, sD + st * kBlockRows, masked, qt, key_a, key_b, n, p.window, sl2);
    if constexpr (kDs)
      store_ds_tile(ds_head(ds, doc_pairs, p, b, b.h * group + it % group).pair(qt / kBlockRows, w0 / kBlockRows), a);
  };
  auto done = [&](int it) {  // after dK's product of tile it has completed
    sm90::pin(dk);
    sm90::pin(a);
    ring_.release(it);
  };
  walk_run(ring_, first, last, n_iter, issue, tile, done);
  const int cc = t % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = r == 0 ? key_a : key_b;
    if (key >= n) continue;
    const int64_t off = ((b.base + key) * p.n_head_kv + b.h) * D + 2 * cc;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      *reinterpret_cast<__nv_bfloat162*>(p.d_k + off + dn * 8) =
          __floats2bfloat162_rn(dk[4 * dn + 2 * r] * p.scale, dk[4 * dn + 2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(p.d_v + off + dn * 8) =
          __floats2bfloat162_rn(dv[4 * dn + 2 * r], dv[4 * dn + 2 * r + 1]);
    }
  }
}

// The key tiles a dq block walks: from the window's first key (or 0) to its
// last row.
struct DqKeys {
  int k_first, n_tiles;
};
template <int kRows>
__device__ __forceinline__ DqKeys dq_keys(const BwdParams& p, const WsBwdItem& b) {
  const int k_last = min(b.r0 + kRows, b.n) - 1;
  const int k_first = p.window > 0 ? max(0, b.r0 - p.window + 1) : 0;
  return {k_first, (k_last - k_first) / kBlockRows + 1};
}

// dq's producer thread: Q and dO once, then K and V of every key tile.
template <int D, int NC>
__device__ __forceinline__ void dq_produce(const BwdMaps& maps, const BwdParams& p, uint32_t s0,
                                           const WsBwdItem& b) {
  using L = WsBwdLayout<D, NC>;
  const Ring<L> ring_{s0 + L::kBars};
  const int hk = b.h / (p.n_head / p.n_head_kv);
  const uint32_t res = ring_.bars + 8 * L::kResFull;
  ring::mbar_expect(res, 2 * NC * L::kT);
  for (int w = 0; w < NC; ++w) {
    load_tile_tma<D>(s0 + w * L::kT, &maps.q, b.h, b.base + b.r0 + w * kBlockRows, res);
    load_tile_tma<D>(s0 + L::kRes1 + w * L::kT, &maps.d_out, b.h, b.base + b.r0 + w * kBlockRows, res);
  }
  const DqKeys keys = dq_keys<L::kRows>(p, b);
  for (int j = 0; j < keys.n_tiles; ++j) {
    const int64_t row = b.base + keys.k_first + j * kBlockRows;
    const int st = ring_.stage(j);
    ring_.wait_empty(j);
    ring::mbar_expect(ring_.full(j), 2 * L::kT);
    load_tile_tma<D>(s0 + L::kStream0 + st * L::kT, &maps.k, hk, row, ring_.full(j));
    load_tile_tma<D>(s0 + L::kStream1 + st * L::kT, &maps.v, hk, row, ring_.full(j));
  }
}

// dq's consumer warpgroup c: query rows r0 + 64c .. of the item; the key
// tiles these rows see form one run, walked as in dkdv_consume.
template <int D, int NC>
__device__ __forceinline__ void dq_consume(const BwdParams& p, const unsigned char* smem, const WsBwdItem& b, int c) {
  using L = WsBwdLayout<D, NC>;
  const Ring<L> ring_{ring::smem_addr(smem) + L::kBars};
  const int t = threadIdx.x % attn::kThreads, n = b.n;
  const int w0 = b.r0 + c * kBlockRows, w_last = min(w0 + kBlockRows, n) - 1;  // this warpgroup's rows
  const int row_a = w0 + t / 32 * 16 + t % 32 / 4, row_b = row_a + 8;
  const float sl2 = p.scale * kLog2e;
  float lse2[2] = {0.f, 0.f}, dlt[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    if (row >= n) continue;
    lse2[r] = p.lse[(b.base + row) * p.n_head + b.h] * kLog2e;
    dlt[r] = p.delta[(b.base + row) * p.n_head + b.h];
  }
  const unsigned char* sQ = smem + c * L::kT;
  const unsigned char* sO = smem + L::kRes1 + c * L::kT;
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;
  const DqKeys keys = dq_keys<L::kRows>(p, b);
  wait_consumer(ring_.bars + 8 * L::kResFull, 0);  // also where no row is used: no copy may land after the exit
  auto seen = [&](int j) {
    const int kt = keys.k_first + j * kBlockRows;
    return w0 < n && kt <= w_last && (p.window <= 0 || kt + kBlockRows - 1 > w0 - p.window);
  };
  int first = 0;
  while (first < keys.n_tiles && !seen(first)) ++first;
  int last = first;
  while (last < keys.n_tiles && seen(last)) ++last;
  float s[32], dp[32];
  uint32_t a[4][4];  // dS as the operand of dQ's product (which outlives tile())
  auto issue = [&](int j) {
    const int st = ring_.stage(j);
    ring_.wait_full(j);
    sm90::issue_score_products<D>(s, dp, sQ, smem + L::kStream0 + st * L::kT, sO, smem + L::kStream1 + st * L::kT);
  };
  auto tile = [&](int j) {
    const int kt = keys.k_first + j * kBlockRows;
    const bool masked = p.window > 0 || kt + kBlockRows - 1 > w0;
    sm90::dq_tile_step<D>(dq, s, dp, a, smem + L::kStream0 + ring_.stage(j) * L::kT, masked, kt, row_a, row_b, n,
                          p.window, sl2, lse2, dlt);
  };
  auto done = [&](int j) {
    sm90::pin(dq);
    sm90::pin(a);
    ring_.release(j);
  };
  walk_run(ring_, first, last, keys.n_tiles, issue, tile, done);
  store_dq_rows<D>(p, b, dq, row_a);
}

// Barrier set-up shared by both kernels: the resident tiles' barrier and
// the full ones count `full_count` arrivals, the empty ones the NC·4
// consumer warps.
template <typename L, int NC>
__device__ __forceinline__ void init_barriers(uint32_t bars, int full_count) {
  if (threadIdx.x == 0) {
    ring::mbar_init(bars + 8 * L::kResFull, 1);
    for (int s = 0; s < L::kStages; ++s) {
      ring::mbar_init(bars + 8 * (L::kFull + s), full_count);
      ring::mbar_init(bars + 8 * (L::kEmpty + s), NC * 4);
    }
    ring::fence_barrier_init();
  }
  __syncthreads();
}
#endif  // LATHE_SM90A_DEVICE

// One block per item (a KV head's NC·64 keys of one document). Separate
// paths after the register split: ptxas gives each side its budget only
// when no code after it is shared.
template <int D, int NC, bool kDs>
__global__ void __launch_bounds__(WsBwdLayout<D, NC>::kThreads, 1)
    dkdv_ws_kernel(const __grid_constant__ BwdMaps maps, const BwdParams p, int docs, int tiles, DsArgs ds) {
#if LATHE_SM90A_DEVICE
  using L = WsBwdLayout<D, NC>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = sm90::aligned_smem(smem_raw);
  WsBwdItem b;
  if (!bwd_item<L::kRows, false>(p, docs, p.n_head_kv, tiles, blockIdx.x, b)) return;
  init_barriers<L, NC>(ring::smem_addr(smem) + L::kBars, 32);
  if (threadIdx.x < attn::kThreads) {
    regs_release<L::kProducerRegs>();
    if (threadIdx.x < 32) dkdv_produce<D, NC>(maps, p, smem, b);
    return;
  }
  regs_claim<L::kConsumerRegs>();
  dkdv_consume<D, NC, kDs>(p, smem, b, consumer_index(), ds);
#else
  __trap();  // launched only where sm90_supported() holds
#endif
}

// One block per item (NC·64 query rows of one head of one document).
template <int D, int NC>
__global__ void __launch_bounds__(WsBwdLayout<D, NC>::kThreads, 1)
    dq_ws_kernel(const __grid_constant__ BwdMaps maps, const BwdParams p, int docs, int tiles) {
#if LATHE_SM90A_DEVICE
  using L = WsBwdLayout<D, NC>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = sm90::aligned_smem(smem_raw);
  WsBwdItem b;
  if (!bwd_item<L::kRows, true>(p, docs, p.n_head, tiles, blockIdx.x, b)) return;
  init_barriers<L, NC>(ring::smem_addr(smem) + L::kBars, 1);
  if (threadIdx.x < attn::kThreads) {
    regs_release<L::kProducerRegs>();
    if (threadIdx.x == 0) dq_produce<D, NC>(maps, p, ring::smem_addr(smem), b);
    return;
  }
  regs_claim<L::kConsumerRegs>();
  dq_consume<D, NC>(p, smem, b, consumer_index());
#else
  __trap();  // launched only where sm90_supported() holds
#endif
}

template <int D, int NC>
Status launch_ws(const BwdParams& p, int n_docs, int max_seqlen, cudaStream_t st, cudaStream_t dq_stream,
                 const DsArgs& ds) {
  using L = WsBwdLayout<D, NC>;
  constexpr const char* kWho = "attention backward (warp-specialized)";
  const tma::EncodeTiled encode = tma::tensor_map_encoder();
  if (!encode) return unsupported(kWho, ": the driver has no cuTensorMapEncodeTiled");
  BwdMaps maps;
  LATHE_TRY(tma::encode_map<D>(encode, &maps.q, p.q, p.n_head, p.n_tokens, kBlockRows, kWho, "q"));
  LATHE_TRY(tma::encode_map<D>(encode, &maps.d_out, p.d_out, p.n_head, p.n_tokens, kBlockRows, kWho, "d_out"));
  LATHE_TRY(tma::encode_map<D>(encode, &maps.k, p.k, p.n_head_kv, p.n_tokens, kBlockRows, kWho, "k"));
  LATHE_TRY(tma::encode_map<D>(encode, &maps.v, p.v, p.n_head_kv, p.n_tokens, kBlockRows, kWho, "v"));
  const int64_t tiles = (max_seqlen + L::kRows - 1) / L::kRows;
  const int64_t dkdv_items = tiles * n_docs * p.n_head_kv, dq_items = tiles * n_docs * p.n_head;
  if (dq_items > INT32_MAX) return invalid_argument(kWho, ": ", dq_items, " row tiles exceed 2^31");
  auto set_smem = [](auto* kernel, int bytes, const char* what) {
    return cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  };
  if (ds.rest) {  // dkdv leaves dS; d_q after it on st (attention_bwd_ds.cu)
    auto* dkdv = dkdv_ws_kernel<D, NC, true>;
    LATHE_TRY(set_smem(dkdv, L::kSmem, "cudaFuncSetAttribute(dkdv_ws)"));
    LATHE_TRY(launch_ds_pair_base(p.cu, n_docs, ds.pair_base, st));
    dkdv<<<unsigned(dkdv_items), L::kThreads, L::kSmem, st>>>(maps, p, n_docs, int(tiles), ds);
    LATHE_TRY(cuda_check(cudaGetLastError(), "attention dkdv_ws launch"));
    return launch_dq_ds<D, NC>(maps, p, n_docs, int(tiles), ds, st);
  }
  auto* dkdv = dkdv_ws_kernel<D, NC, false>;
  auto* dq = dq_ws_kernel<D, NC>;
  LATHE_TRY(set_smem(dkdv, L::kSmem, "cudaFuncSetAttribute(dkdv_ws)"));
  LATHE_TRY(set_smem(dq, L::kSmem, "cudaFuncSetAttribute(dq_ws)"));
  dkdv<<<unsigned(dkdv_items), L::kThreads, L::kSmem, st>>>(maps, p, n_docs, int(tiles), DsArgs{});
  LATHE_TRY(cuda_check(cudaGetLastError(), "attention dkdv_ws launch"));
  dq<<<unsigned(dq_items), L::kThreads, L::kSmem, dq_stream>>>(maps, p, n_docs, int(tiles));
  return cuda_check(cudaGetLastError(), "attention dq_ws launch");
}

}  // namespace lathe::cuda::attn::wsb

namespace lathe::cuda::attn {

Status launch_backward_ws(const BwdParams& p, int d, int n_docs, int max_seqlen, cudaStream_t st,
                          const DsTiles& tiles) {
  if (d != 64 && d != 128)
    return unsupported("attention backward (warp-specialized): head_dim ", d, " (64 and 128 are compiled)");
  if (p.n_tokens <= 0) return invalid_argument("attention backward (warp-specialized): n_tokens is not set");
  const wsb::DsArgs ds{static_cast<uint32_t*>(tiles.tiles),
                       tiles.pair_base,
                       {static_cast<uint32_t*>(tiles.spare[0]), static_cast<uint32_t*>(tiles.spare[1])},
                       {tiles.end[0], tiles.end[1]}};
  const SideStream* side = nullptr;
  if (!ds.rest) {  // d_q from dS runs after dkdv, on st
    LATHE_ASSIGN_OR_RETURN(side, side_stream_for(st));
  }
  const cudaStream_t dq_stream = side ? side->stream : st;
  constexpr int kNc64 = LATHE_ATTN_BWD_WS_NC_64 == 3 ? 3 : 2;
  auto run = [&](auto d_c, auto nc_c) {
    return wsb::launch_ws<decltype(d_c)::value, decltype(nc_c)::value>(p, n_docs, max_seqlen, st, dq_stream, ds);
  };

  Status launched = d == 128 ? run(std::integral_constant<int, 128>{}, std::integral_constant<int, 2>{})
                             : run(std::integral_constant<int, 64>{}, std::integral_constant<int, kNc64>{});
  if (!side) return launched;
  Status joined = join_side_stream(*side, st);  // also after a failed launch: the fork is never left open
  return launched.is_ok() ? joined : launched;
}

}  // namespace lathe::cuda::attn
