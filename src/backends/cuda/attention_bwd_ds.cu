// AttnBwdKernels::kWsDs's d_q product (attention.h): the dk/dv kernel of
// attention_bwd_ws.cu has stored each visible tile pair's dS (bf16, 64
// query rows × 64 keys, in the order its d_q operand takes), and d_q =
// scale·dS·K is one product of those tiles with K here, instead of a
// kernel recomputing S and dP; plus the scan that places each document's
// pairs.
#include "backends/cuda/attention_bwd_ws.cuh"

#include <algorithm>

namespace lathe::cuda::attn::wsb {

// kWsDs's d_q kernel (dq_ds_consume below): a ring of stages, each K's tile
// and one dS tile per consumer warpgroup.
template <int D, int NC>
struct DsLayout {
  static constexpr int kStages = 4;
  static constexpr int kT = sm90::tile_bytes<D>();
  static constexpr int kStage = kT + NC * kDsTileBytes;  // K's tile, then each warpgroup's dS tile
  static constexpr int kBars = kStages * kStage;
  static constexpr int kFull = 0, kEmpty = kStages, kBarriers = 2 * kStages;
  static constexpr int kSmem = kBars + kBarriers * 8 + 1024;
  static constexpr int kRows = NC * kBlockRows;
  static constexpr int kThreads = (NC + 1) * attn::kThreads;
  static_assert(kSmem <= 227 * 1024 && kStage % 1024 == 0);
};

#if LATHE_SM90A_DEVICE
using namespace tma;  // regs_release / regs_claim

// kWsDs's d_q product, d_q = scale·dS·K, from the tiles dkdv left: a block
// per NC·64 query rows of one head (the dq kernel's items), its producer
// thread streaming each key tile of K (TMA) and, for every consumer
// warpgroup whose rows see it, that pair's dS tile (a 1-D bulk copy,
// evict-first: each is read once) into one ring stage; the consumers take
// their A fragments from it and accumulate with K as the MN-major operand.
//
// The key tiles a d_q block walks (0 .. its last query tile), and whether
// warpgroup c's rows see key tile j (its query tile is in the document and
// not before j).
template <int kRows>
__device__ __forceinline__ int ds_key_tiles(const WsBwdItem& b) {
  return (min(b.r0 + kRows, b.n) - 1) / kBlockRows + 1;
}
__device__ __forceinline__ bool ds_sees(const WsBwdItem& b, int c, int j) {
  const int w0 = b.r0 + c * kBlockRows;
  return w0 < b.n && j <= w0 / kBlockRows;
}

template <int D, int NC>
__device__ __forceinline__ void dq_ds_produce(const BwdMaps& maps, const BwdParams& p, const DsArgs& ds, uint32_t s0,
                                              const WsBwdItem& b, int g0) {
  using L = DsLayout<D, NC>;
  const Ring<L> ring_{s0 + L::kBars};
  const int hk = b.h / (p.n_head / p.n_head_kv), qi0 = b.r0 / kBlockRows;
  const DsHead head = ds_head(ds, __ldg(ds.pair_base + b.doc), p, b, b.h);
  const uint64_t policy = gemv_detail::evict_first_policy();
  const int n_kt = ds_key_tiles<L::kRows>(b);
  for (int j = 0; j < n_kt; ++j) {
    const int g = g0 + j;  // the ring's fill
    const uint32_t stage = s0 + ring_.stage(g) * L::kStage;
    ring_.wait_empty(g);
    int uses = 0;
#pragma unroll
    for (int c = 0; c < NC; ++c) uses += ds_sees(b, c, j);
    ring::mbar_expect(ring_.full(g), L::kT + uses * kDsTileBytes);
    load_tile_tma<D>(stage, &maps.k, hk, b.base + int64_t(j) * kBlockRows, ring_.full(g));
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (ds_sees(b, c, j))
        ring::bulk_copy(stage + L::kT + c * kDsTileBytes, head.pair(qi0 + c, j), kDsTileBytes, ring_.full(g), policy);
  }
}

template <int D, int NC>
__device__ __forceinline__ void dq_ds_consume(const BwdParams& p, const unsigned char* smem, const WsBwdItem& b,
                                              int c, int g0) {
  using L = DsLayout<D, NC>;
  const uint32_t s0 = ring::smem_addr(smem);
  const Ring<L> ring_{s0 + L::kBars};
  const int t = threadIdx.x % attn::kThreads, lane = t % 32;
  const int n_kt = ds_key_tiles<L::kRows>(b);
  // This thread's 16 bytes of each k16 chunk of its warp's rows (store_ds_tile's order).
  const uint32_t frag = L::kT + c * kDsTileBytes + (t / 32 * 4 * 32 + lane) * 16;
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;
  uint32_t a[4][4];
  for (int j = 0; j < n_kt; ++j) {
    ring_.wait_full(g0 + j);
    if (ds_sees(b, c, j)) {
      const int st = ring_.stage(g0 + j);
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        const uint4 v = ring::lds128(s0 + st * L::kStage + frag + kc * 32 * 16);
        a[kc][0] = v.x, a[kc][1] = v.y, a[kc][2] = v.z, a[kc][3] = v.w;
      }
      sm90::pin(a);
      sm90::pin(dq);
      sm90::wg_fence();
      sm90::accumulate_rows<D>(dq, a, smem + st * L::kStage);
      sm90::wg_commit();
      sm90::wg_wait<0>();
      sm90::pin(dq);
      sm90::pin(a);
    }
    ring_.release(g0 + j);
  }
  store_dq_rows<D>(p, b, dq, b.r0 + c * kBlockRows + t / 32 * 16 + lane / 4);
}
#endif  // LATHE_SM90A_DEVICE

// kWsDs's d_q product (dq_ds_consume): one block per SM, each taking the
// dq kernel's items in turn (longest first), its ring running on from one
// item to the next, so no item waits for a block to start.
template <int D, int NC>
__global__ void __launch_bounds__(DsLayout<D, NC>::kThreads, 1)
    dq_ds_kernel(const __grid_constant__ BwdMaps maps, const BwdParams p, int docs, int tiles, DsArgs ds) {
#if LATHE_SM90A_DEVICE
  using L = DsLayout<D, NC>;
  using R = WsBwdLayout<D, NC>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = sm90::aligned_smem(smem_raw);
  const uint32_t bars = ring::smem_addr(smem) + L::kBars;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      ring::mbar_init(bars + 8 * (L::kFull + s), 1);
      ring::mbar_init(bars + 8 * (L::kEmpty + s), NC * 4);
    }
    ring::fence_barrier_init();
  }
  __syncthreads();
  const int n_items = tiles * docs * p.n_head;
  WsBwdItem b;
  int g = 0;  // fills of the ring so far
  if (threadIdx.x < attn::kThreads) {
    regs_release<R::kProducerRegs>();
    if (threadIdx.x != 0) return;
    for (int w = blockIdx.x; w < n_items; w += gridDim.x) {
      if (!bwd_item<L::kRows, true>(p, docs, p.n_head, tiles, w, b)) continue;
      dq_ds_produce<D, NC>(maps, p, ds, ring::smem_addr(smem), b, g);
      g += ds_key_tiles<L::kRows>(b);
    }
    return;
  }
  regs_claim<R::kConsumerRegs>();
  const int c = consumer_index();
  for (int w = blockIdx.x; w < n_items; w += gridDim.x) {
    if (!bwd_item<L::kRows, true>(p, docs, p.n_head, tiles, w, b)) continue;
    dq_ds_consume<D, NC>(p, smem, b, c, g);
    g += ds_key_tiles<L::kRows>(b);
  }
#else
  __trap();  // launched only where sm90_supported() holds
#endif
}

// kWsDs: each document's first tile pair (DsArgs), one warp scanning the
// documents 32 at a time.
__global__ void ds_pair_base_kernel(const int32_t* cu, int n_docs, int* pair_base) {
  const int lane = threadIdx.x;
  int carry = 0;
  for (int d0 = 0; d0 < n_docs; d0 += 32) {
    const int d = d0 + lane;
    int pairs = 0;
    if (d < n_docs) {
      const int t = (cu[d + 1] - cu[d] + kBlockRows - 1) / kBlockRows;
      pairs = t * (t + 1) / 2;
    }
    int sum = pairs;  // inclusive prefix over the warp
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, sum, o);
      if (lane >= o) sum += v;
    }
    if (d < n_docs) pair_base[d] = carry + sum - pairs;
    carry += __shfl_sync(0xffffffffu, sum, 31);
  }
}

Status launch_ds_pair_base(const int32_t* cu, int n_docs, int* pair_base, cudaStream_t st) {
  ds_pair_base_kernel<<<1, 32, 0, st>>>(cu, n_docs, pair_base);
  return cuda_check(cudaGetLastError(), "attention ds_pair_base launch");
}

// One block per SM (or per item where there are fewer).
template <int D, int NC>
Status launch_dq_ds(const BwdMaps& maps, const BwdParams& p, int n_docs, int tiles, const DsArgs& ds,
                    cudaStream_t st) {
  using L = DsLayout<D, NC>;
  auto* kernel = dq_ds_kernel<D, NC>;
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmem),
                       "cudaFuncSetAttribute(dq_ds)"));
  int dev = 0, sms = 0;
  LATHE_TRY(cuda_check(cudaGetDevice(&dev), "cudaGetDevice"));
  LATHE_TRY(cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                       "cudaDeviceGetAttribute(multiprocessors)"));
  const int64_t items = int64_t(tiles) * n_docs * p.n_head;
  const unsigned grid = unsigned(std::min<int64_t>(items, std::max(sms, 1)));
  kernel<<<grid, L::kThreads, L::kSmem, st>>>(maps, p, n_docs, tiles, ds);
  return cuda_check(cudaGetLastError(), "attention dq_ds launch");
}

template Status launch_dq_ds<64, LATHE_ATTN_BWD_WS_NC_64 == 3 ? 3 : 2>(const BwdMaps&, const BwdParams&, int, int,
                                                                       const DsArgs&, cudaStream_t);
template Status launch_dq_ds<128, 2>(const BwdMaps&, const BwdParams&, int, int, const DsArgs&, cudaStream_t);

}  // namespace lathe::cuda::attn::wsb
