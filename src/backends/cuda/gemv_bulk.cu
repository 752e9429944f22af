// The skinny GEMM's shared-memory ring (GemvArgs::shape kGemvBulkShape, up
// to 4 x rows): the same products and epilogues as gemv.cu's CUDA-core
// path, with the weights brought in by Hopper bulk copies
// (cp.async.bulk, one per weight row per stage, completing on an mbarrier)
// instead of register loads.
//
// Why: the weights never depend on the previous kernel, and a register
// ring holds ~32 KB per block, so at every kernel boundary (the ragged end
// of one GEMV, the decode attention that leaves DRAM idle for microseconds)
// little of the next kernel's bytes are on their way. Here a block fills
// its whole ring (kGemvBulkRingKib, 96 KiB by default) before it waits for
// the previous kernel (griddepcontrol.wait), and the ring is sized so that
// this kernel's block and the next kernel's fit on an SM together: under a
// programmatic dependent launch the next GEMV's blocks become resident as
// soon as this one's are all running, and pull their first 96 KiB while
// this one streams.
//
// Shape: a block of 128 threads per SM (GemvArgs::blocks_per_sm), each
// taking an equal run of output columns (pairs for SwiGLU and RoPE), so the
// blocks end together; the run goes in tiles of 8 weight rows, and a tile's
// k in stages of 1024 (a thread's 16-byte chunk per row). The units (tile,
// stage) flow through the ring in order: unit u lands in slot u mod S; when
// every thread has used it (a __syncthreads) warp 0 refills the slot with
// unit u + S, whose copies may be of the next tile. Thread t sums chunks
// t, t + 128, ... of each row (k in order), the block adds its warps in
// order: the sums do not depend on the number of x rows nor on the grid.
#include <algorithm>

#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/gemv_bulk.h"
#include "backends/cuda/gemv_common.cuh"

namespace lathe::cuda {
namespace {

using namespace gemv_detail;

constexpr int kBulkThreads = 128;
constexpr int kBulkRows = 8;                   // weight rows per tile
constexpr int kStageK = kBulkThreads * 8;      // k per stage: a 16-byte chunk per thread and row
constexpr int kStageBytes = kBulkRows * kStageK * 2;
constexpr int kMaxStages = 14;                 // 224 KiB
constexpr int kMaxRingBytes = kMaxStages * kStageBytes;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the bulk copies (the async proxy).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
// One arrival that also expects `bytes` more bytes in this phase.
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16) from global src to shared dst, counted on bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// The block's plan: output columns [c_begin, c_end) in tiles of kTileCols,
// each tile's k in k_stages stages; n_units = tiles × k_stages.
template <GemvEpilogue E>
struct BulkPlan {
  static constexpr int64_t kTileCols = tile_columns<kBulkRows, E>();
  int64_t c_begin, c_end, n_units;
  int k_stages;
  __device__ BulkPlan(const GemvArgs& a) {
    const int64_t columns = gemv_columns(a);
    c_begin = columns * blockIdx.x / gridDim.x;
    c_end = columns * (blockIdx.x + 1) / gridDim.x;
    k_stages = static_cast<int>((a.k + kStageK - 1) / kStageK);
    n_units = (c_end - c_begin + kTileCols - 1) / kTileCols * k_stages;
  }
  __device__ int64_t tile_begin(int64_t u) const { return c_begin + u / k_stages * kTileCols; }
  __device__ int64_t tile_end(int64_t u) const { return min(c_end, tile_begin(u) + kTileCols); }
};

// Warp 0: the copies of unit u into ring slot `slot` (a lane per weight row).
template <GemvEpilogue E>
__device__ __forceinline__ void issue_unit(const GemvArgs& a, const BulkPlan<E>& plan, int64_t u, int slot,
                                           uint32_t ring, uint32_t bars, uint64_t policy) {
  const int lane = threadIdx.x & 31;
  const int64_t k0 = u % plan.k_stages * int64_t(kStageK);
  const uint32_t bytes = static_cast<uint32_t>(min(int64_t(kStageK), a.k - k0) * 2);
  const int64_t row = lane < kBulkRows ? tile_row<kBulkRows, E>(a, plan.tile_begin(u), plan.tile_end(u), lane) : -1;
  const unsigned valid = __ballot_sync(0xffffffffu, row >= 0);
  const uint32_t bar = bars + 8 * slot;
  if (lane == 0) mbar_expect(bar, __popc(valid) * bytes);
  __syncwarp();
  if (row >= 0)
    bulk_copy(ring + slot * kStageBytes + lane * (kStageK * 2), a.w + row * a.k + k0, bytes, bar, policy);
}

template <int B, GemvEpilogue E>
__global__ void __launch_bounds__(kBulkThreads, 1) gemv_bulk_kernel(GemvArgs a, int n_slots) {
  constexpr int R = kBulkRows, kW = kBulkThreads / 32;
  extern __shared__ __align__(128) unsigned char s_ring[];
  __shared__ __align__(8) uint64_t s_bar[kMaxStages];
  __shared__ float s_part[kW][R * B];
  __shared__ float s_ss[kW][B];
  const BulkPlan<E> plan(a);
  const int rows = static_cast<int>(a.rows), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t ring = smem_addr(s_ring), bars = smem_addr(s_bar);
  if (threadIdx.x == 0) {
    for (int i = 0; i < n_slots; ++i) mbar_init(bars + 8 * i, 1);
    fence_barrier_init();
  }
  __syncthreads();
  const uint64_t policy = evict_first_policy();
  allow_next_grid();
  // The weights never depend on the previous kernel: the whole ring goes out before waiting for it.
  if (warp == 0)
    for (int64_t u = 0; u < min(int64_t(n_slots), plan.n_units); ++u)
      issue_unit<E>(a, plan, u, static_cast<int>(u), ring, bars, policy);
  wait_prior_grid();
  const int64_t n_chunks = a.k / 8;
  float acc[R][B], ss[B];
  for (int64_t u = 0; u < plan.n_units; ++u) {
    const int stage = static_cast<int>(u % plan.k_stages), slot = static_cast<int>(u % n_slots);
    if (stage == 0) {
#pragma unroll
      for (int b = 0; b < B; ++b) {
        ss[b] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][b] = 0.0f;
      }
    }
    const int64_t c = int64_t(stage) * (kStageK / 8) + threadIdx.x;
    const bool have = c < n_chunks;
    float xf[B][8] = {};
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (have && b < rows) x_chunk(a, b, c * 8, xf[b], &ss[b]);
    mbar_wait(bars + 8 * slot, static_cast<uint32_t>(u / n_slots) & 1);
    if (have) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[8];
        unpack8(lds128(ring + slot * kStageBytes + r * (kStageK * 2) + threadIdx.x * 16), wf);
#pragma unroll
        for (int b = 0; b < B; ++b) {
          if (b >= rows) break;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[i], xf[b][i], acc[r][b]);
        }
      }
    }
    __syncthreads();  // every thread is done with the slot
    if (warp == 0 && u + n_slots < plan.n_units) issue_unit<E>(a, plan, u + n_slots, slot, ring, bars, policy);
    if (stage != plan.k_stages - 1) continue;
    // The tile's last stage: the block's sums, then the epilogue (s_part is
    // next written a unit later, after that unit's __syncthreads).
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float s = dev::warp_sum(acc[r][b]);
        if (lane == 0) s_part[warp][r * B + b] = s;
      }
    if (a.norm_w) {
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float s = dev::warp_sum(ss[b]);
        if (lane == 0) s_ss[warp][b] = s;
      }
    }
    __syncthreads();
    const int t = threadIdx.x, r = t / B, b = t % B;
    if (t < R * B && b < rows) {
      const float scale = row_scale<kW>(a, &s_ss[0][b], B);
      finish_tile_slot<R, E>(a, plan.tile_begin(u), plan.tile_end(u), r, b, scale, [&](int rr) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kW; ++w) sum += s_part[w][rr * B + b];
        return sum;
      });
    }
  }
}

template <int B, GemvEpilogue E>
cudaError_t launch_bulk_kernel(const GemvArgs& a, cudaStream_t st, int device) {
  // Once per device: the kernel may take up to kMaxRingBytes of dynamic shared memory.
  static bool raised[64] = {};
  if (device < 0 || device >= 64) return cudaErrorInvalidDevice;
  if (!raised[device]) {
    const cudaError_t err = cudaFuncSetAttribute(gemv_bulk_kernel<B, E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 kMaxRingBytes);
    if (err != cudaSuccess) return err;
    raised[device] = true;
  }
  const int kib = a.ring_kib > 0 ? a.ring_kib : kGemvBulkRingKib;
  const int slots = std::clamp(kib * 1024 / kStageBytes, 2, kMaxStages);
  const int64_t tiles = (gemv_columns(a) + tile_columns<kBulkRows, E>() - 1) / tile_columns<kBulkRows, E>();
  const int64_t blocks = std::min<int64_t>(tiles, int64_t(std::max<int>(1, a.blocks_per_sm)) * sm_count(device));
  return launch_overlapped_smem(gemv_bulk_kernel<B, E>, dim3(static_cast<unsigned>(blocks)), dim3(kBulkThreads),
                                size_t(slots) * kStageBytes, st, a.overlap, a, slots);
}

template <int B>
cudaError_t launch_bulk_rows(const GemvArgs& a, cudaStream_t st, int device) {
  return with_epilogue(a.epilogue, [&](auto e) { return launch_bulk_kernel<B, decltype(e)::value>(a, st, device); });
}

}  // namespace

cudaError_t launch_gemv_bulk(const GemvArgs& a, cudaStream_t st, int device) {
  if (a.rows == 1) return launch_bulk_rows<1>(a, st, device);
  if (a.rows == 2) return launch_bulk_rows<2>(a, st, device);
  return launch_bulk_rows<4>(a, st, device);
}

}  // namespace lathe::cuda
