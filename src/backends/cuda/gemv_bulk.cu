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
// its whole ring (kGemvBulkRingKib, 96 KiB by default) without waiting for
// the previous kernel (only the consumers wait, griddepcontrol.wait, before
// reading x), and the ring is sized so that this kernel's block and the
// next kernel's fit on an SM together: under a programmatic dependent
// launch the next GEMV's blocks become resident as soon as this one's are
// all running, and pull their first 96 KiB while this one streams.
//
// Shape: a block per SM (GemvArgs::blocks_per_sm), each taking an equal
// run of output columns (pairs for SwiGLU and RoPE), so the blocks end
// together; the run goes in tiles of 8 weight rows, and a tile's k in
// stages of 2048 (a thread's 16-byte chunk per row). The units (tile,
// stage) flow through the ring in order, unit u in slot u mod S. A
// producer warp only issues copies: it refills a slot once the 8 consumer
// warps have each arrived on the slot's "empty" barrier; consumers wait on
// its "full" barrier (the bulk copies' byte count) and never on each other
// except at a tile's end (the block's sums). The first version had the
// whole block sync every stage and a warp issue the refills: measured
// ~1.4 TB/s at any ring size (each stage's latencies in series). Each
// consumer loads the next unit's x while it multiplies the current one.
//
// Measured on the H200 (8B, batch 1, per call back to back): one block per
// SM still leaves the consumers short (gate|up 64.6 us = 85% with 96 KiB,
// down 92%); two blocks per SM (two 96 KiB rings fill the SM) reach gate|up
// 56.7 us = 96%, down 96%, q|k|v 76%, o 79%, the LM head at the bandwidth,
// and beat every register-ring shape at 1B too, so the decode step runs
// that (kCudaDecodeShapes). Ordinary launches cost 3-15% against
// programmatic dependent ones. A 96 KiB ring at one block per SM chained
// worse than its calls' sum (the next kernel's blocks share the SM), a
// 160 KiB one (no sharing) as its sum.
//
// Thread t sums chunks t, t + 256, ... of each row (k in order), the block
// adds its warps in order: the sums do not depend on the number of x rows
// nor on the grid or ring.
#include <algorithm>

#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/gemv_bulk.h"
#include "backends/cuda/gemv_common.cuh"

namespace lathe::cuda {
namespace {

using namespace gemv_detail;

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kBulkThreads = kConsumers + 32;  // + the producer warp
constexpr int kBulkRows = 8;                   // weight rows per tile
constexpr int kStageK = kConsumers * 8;        // k per stage: a 16-byte chunk per consumer thread and row
constexpr int kStageBytes = kBulkRows * kStageK * 2;
constexpr int kMaxStages = 7;                  // 224 KiB
constexpr int kMaxRingBytes = kMaxStages * kStageBytes;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The bulk copies and their barriers exist from sm_90 on; gemv() never
// launches this kernel below (the helpers are empty there, so it compiles).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LATHE_BULK_ASM(...) asm volatile(__VA_ARGS__)
#else
#define LATHE_BULK_ASM(...) (void)0
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  LATHE_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the bulk copies (the async proxy).
__device__ __forceinline__ void fence_barrier_init() {
  LATHE_BULK_ASM("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
// One arrival that also expects `bytes` more bytes in this phase.
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  LATHE_BULK_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  LATHE_BULK_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 1;
  do {
    LATHE_BULK_ASM(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16) from global src to shared dst, counted on bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                          uint64_t policy) {
  LATHE_BULK_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// The consumer warps' own barrier (the producer warp never joins it).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

// The units in order: stage of k, ring slot and its fill round's parity,
// and the tile's first output column, advanced without divisions.
template <GemvEpilogue E>
struct UnitCursor {
  static constexpr int64_t kTileCols = tile_columns<kBulkRows, E>();
  int64_t u0;
  int stage = 0, slot = 0;
  uint32_t parity = 0;
  __device__ void next(int k_stages, int n_slots) {
    if (++slot == n_slots) slot = 0, parity ^= 1;
    if (++stage == k_stages) stage = 0, u0 += kTileCols;
  }
};

// The x chunk a consumer thread needs for one unit, as loaded (bf16 or f32,
// and the norm weights' chunk), so its loads are in flight during the
// previous unit's products.
template <int B>
struct XRaw {
  uint4 v[B][2];  // bf16: v[b][0]; f32: two float4 as bits
  uint4 norm;
};
template <int B>
__device__ __forceinline__ void load_x(const GemvArgs& a, int rows, int64_t c, XRaw<B>& x) {
  if (c >= a.k / 8) return;
#pragma unroll
  for (int b = 0; b < B; ++b) {
    if (b >= rows) break;
    if (a.x_f32) {
      const uint4* p = reinterpret_cast<const uint4*>(a.x_f32 + int64_t(b) * a.k + c * 8);
      x.v[b][0] = __ldg(p), x.v[b][1] = __ldg(p + 1);
    } else {
      x.v[b][0] = __ldg(reinterpret_cast<const uint4*>(a.x + int64_t(b) * a.k + c * 8));
    }
  }
  if (a.norm_w) x.norm = __ldg(reinterpret_cast<const uint4*>(a.norm_w + c * 8));
}
// x_chunk()'s arithmetic on a loaded chunk: 8 inputs of row b as floats
// (times the norm weights, their squares added to *ss).
template <int B>
__device__ __forceinline__ void use_x(const GemvArgs& a, const XRaw<B>& x, int b, float* xf, float* ss) {
  if (!a.x_f32) {
    unpack8(x.v[b][0], xf);
    return;
  }
  const uint4 h0 = x.v[b][0], h1 = x.v[b][1];
  const uint32_t u[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) xf[i] = __uint_as_float(u[i]);
  if (!a.norm_w) return;
  float w[8];
  unpack8(x.norm, w);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    *ss = fmaf(xf[i], xf[i], *ss);
    xf[i] *= w[i];
  }
}

// The producer warp: every unit's copies (a lane per weight row), each
// slot refilled once the consumers have emptied it. It never reads what
// the previous kernel writes, so it never waits for it.
template <GemvEpilogue E>
__device__ void produce(const GemvArgs& a, int64_t c_begin, int64_t c_end, int64_t n_units, int k_stages,
                        int n_slots, uint32_t ring, uint32_t full, uint32_t empty) {
  const int lane = threadIdx.x & 31;
  const uint64_t policy = evict_first_policy();
  UnitCursor<E> cur{c_begin};
  for (int64_t u = 0; u < n_units; ++u, cur.next(k_stages, n_slots)) {
    if (u >= n_slots) mbar_wait(empty + 8 * cur.slot, cur.parity ^ 1);
    const int64_t k0 = int64_t(cur.stage) * kStageK;
    const uint32_t bytes = static_cast<uint32_t>(min(int64_t(kStageK), a.k - k0) * 2);
    const int64_t t_end = min(c_end, cur.u0 + UnitCursor<E>::kTileCols);
    const int64_t row = lane < kBulkRows ? tile_row<kBulkRows, E>(a, cur.u0, t_end, lane) : -1;
    const unsigned valid = __ballot_sync(0xffffffffu, row >= 0);
    if (lane == 0) mbar_expect(full + 8 * cur.slot, __popc(valid) * bytes);
    __syncwarp();
    if (row >= 0)
      bulk_copy(ring + cur.slot * kStageBytes + lane * (kStageK * 2), a.w + row * a.k + k0, bytes,
                full + 8 * cur.slot, policy);
  }
}

template <int B, GemvEpilogue E>
__global__ void __launch_bounds__(kBulkThreads, 1) gemv_bulk_kernel(GemvArgs a, int n_slots) {
  constexpr int R = kBulkRows, kW = kConsumerWarps;
  constexpr int64_t kTileCols = tile_columns<R, E>();
  extern __shared__ __align__(128) unsigned char s_ring[];
  __shared__ __align__(8) uint64_t s_full[kMaxStages], s_empty[kMaxStages];
  __shared__ float s_part[2][kW][R * B];  // by tile parity: a warp may start the next tile's sums early
  __shared__ float s_ss[2][kW][B];
  const int rows = static_cast<int>(a.rows), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t columns = gemv_columns(a);
  const int64_t c_begin = columns * blockIdx.x / gridDim.x, c_end = columns * (blockIdx.x + 1) / gridDim.x;
  const int k_stages = static_cast<int>((a.k + kStageK - 1) / kStageK);
  const int64_t n_units = (c_end - c_begin + kTileCols - 1) / kTileCols * k_stages;
  const uint32_t ring = smem_addr(s_ring), full = smem_addr(s_full), empty = smem_addr(s_empty);
  if (threadIdx.x == 0) {
    for (int i = 0; i < n_slots; ++i) {
      mbar_init(full + 8 * i, 1);
      mbar_init(empty + 8 * i, kW);
    }
    fence_barrier_init();
  }
  __syncthreads();
  allow_next_grid();
  if (warp == kW) {
    produce<E>(a, c_begin, c_end, n_units, k_stages, n_slots, ring, full, empty);
    return;
  }
  wait_prior_grid();  // x comes from the previous kernel, and the epilogue may write what it reads
  float acc[R][B], ss[B];
  XRaw<B> x_next;
  load_x<B>(a, rows, threadIdx.x, x_next);
  UnitCursor<E> cur{c_begin};
  int tile_parity = 0;
  for (int64_t u = 0; u < n_units; ++u) {
    if (cur.stage == 0) {
#pragma unroll
      for (int b = 0; b < B; ++b) {
        ss[b] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][b] = 0.0f;
      }
    }
    const bool have = int64_t(cur.stage) * kConsumers + threadIdx.x < a.k / 8;
    const XRaw<B> x = x_next;
    const int next_stage = cur.stage + 1 == k_stages ? 0 : cur.stage + 1;
    if (u + 1 < n_units) load_x<B>(a, rows, int64_t(next_stage) * kConsumers + threadIdx.x, x_next);
    mbar_wait(full + 8 * cur.slot, cur.parity);
    if (have) {
      float xf[B][8];
#pragma unroll
      for (int b = 0; b < B; ++b)
        if (b < rows) use_x<B>(a, x, b, xf[b], &ss[b]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[8];
        unpack8(lds128(ring + cur.slot * kStageBytes + r * (kStageK * 2) + threadIdx.x * 16), wf);
#pragma unroll
        for (int b = 0; b < B; ++b) {
          if (b >= rows) break;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[i], xf[b][i], acc[r][b]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * cur.slot);  // this warp is done with the slot
    const int64_t u0 = cur.u0;
    const bool tile_done = cur.stage == k_stages - 1;
    cur.next(k_stages, n_slots);
    if (!tile_done) continue;
    // The tile's sums: each warp's, then the block's in warp order, and the epilogue.
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float s = dev::warp_sum(acc[r][b]);
        if (lane == 0) s_part[tile_parity][warp][r * B + b] = s;
      }
    if (a.norm_w) {
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float s = dev::warp_sum(ss[b]);
        if (lane == 0) s_ss[tile_parity][warp][b] = s;
      }
    }
    consumers_sync();
    const int t = threadIdx.x, r = t / B, b = t % B;
    if (t < R * B && b < rows) {
      const float scale = row_scale<kW>(a, &s_ss[tile_parity][0][b], B);
      finish_tile_slot<R, E>(a, u0, min(c_end, u0 + kTileCols), r, b, scale, [&](int rr) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kW; ++w) sum += s_part[tile_parity][w][rr * B + b];
        return sum;
      });
    }
    tile_parity ^= 1;
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
