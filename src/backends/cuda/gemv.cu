// The decode step's skinny GEMM (decode_ops.h): out = x·Wᵀ for 1..16 rows
// of x. Memory-bound: the weights are read once, so the kernel is shaped to
// keep every SM's loads in flight, not to reuse data, and to spend as
// little as possible before the first load and after the last.
//
// A block of T threads owns R weight rows and splits their k dimension
// over all its threads: thread t reads 16-byte chunks t, t + T, ... of
// each of its rows (no L1 allocation: each weight byte is used once)
// through a ring of D chunks per row, so D·R loads are in flight per
// thread while it does the arithmetic of the oldest; the first ring is
// issued before waiting for the previous kernel under `overlap`. By
// default (GemvArgs::shape 0) T = 128, D = 2, R = 8 for 1-2 input rows (4
// for 3-4, 2 above, to bound registers): 16 loads in flight per thread, at
// k = 2048 all of the block's weights; the registers are capped so that 3
// blocks fit on an SM. Shape 1 halves R and doubles D (twice the blocks,
// the same bytes in flight; at k = 4096 all the block's weights at once),
// shape 2 is 256 threads with D = 1, shape 3 doubles R and halves D (half
// the blocks, each twice as long: a 6144-row projection in one wave). x chunks are read cached (all blocks
// share x). The block sums each of its R × B
// products over its threads (warp shuffles, then shared memory) and the
// first R·B threads apply the epilogue, so every output element is written
// by one thread (the residual add needs no atomics).
//
// A grid of few blocks per SM loses much of its time to the last, partly
// filled wave (measured: a 4096 × 4096 projection in 512 blocks ran at 56%
// of the bandwidth). Given scratch (GemvArgs::split), such a grid splits k
// into slices, each block of a row tile taking one: the blocks write their
// sums to the tile's record, and the last to arrive (a count per tile)
// adds the slices in order and runs the epilogue. The slice count comes
// from n, k and the SM count only, so a row's result stays the same for
// any number of rows. Grid: ⌈n / R⌉ blocks, 768 for a 6144-row projection.
//
// From 5 rows on (k a multiple of 32) f32 FMAs would cost as much time as
// the weight reads, so the products go to the tensor cores instead
// (mma.sync m16n8k16, bf16 in, f32 accumulate): a block owns 16 weight rows
// (by default; 32 or 64 with GemvArgs::shape 1 or 2, each x fragment then
// feeding 2 or 4 m-tiles) and its 8 warps split k, each taking 32 k per
// step. The sum over k does
// not care in which order k is taken, so lane (g, t) loads 16 contiguous
// bytes, k 8t..8t+7 of the step, of weight rows g and g + 8 and of x rows
// g (and g + 8), and the step's two k16 instructions read those bytes as
// their fragment slots {2t, 2t+1, 2t+8, 2t+9}: the same k for the weight
// (A) and x (B) operands, so every product pairs the right elements. The
// warps' 16 × rows partial sums meet in shared memory for the epilogue.
//
// Weights are loaded with an evict-first L2 policy: read once per step,
// they are the lines to give up (measured 2-5% faster per GEMV than the
// default policy). Pulling the next kernel's first weights into L2 ahead
// (cp.async.bulk.prefetch) was measured slower at every size: those lines
// did not survive until the next kernel.
//
// With GemvArgs::persistent (up to 4 rows) the grid is one block per
// resident slot and each block takes an equal run of output columns, tile
// after tile, so the blocks end together. Measured on the H200 it was no
// faster than a block per tile: what a grid of many short blocks loses is
// each block's own ramp-up and reduction, which shape 3's 16-row blocks
// halve (8B gate|up 66.9 us against 72.9; the LM head at 96% of the
// bandwidth).
//
// Shape 4 (kGemvBulkShape, up to 4 rows) is gemv_bulk.cu: the weights
// stream through a ring of shared memory filled by bulk copies, the whole
// ring issued before the kernel waits for the previous one. The helpers
// both files share (x chunks, epilogues, slot rows) are gemv_common.cuh.
//
// With x_f32 the input is f32 and, on the CUDA cores, used unrounded; with
// norm_w too its rows are RMSNorm'd in the kernel (the norm before a
// projection costs no launch of its own, nor a pass of its own): the
// products run over x_f32·norm_w while the threads that read each x chunk
// also sum its squares, and the block's reduction carries those sums beside
// the products, so the epilogue scales each sum by its row's rstd. The
// tensor cores round x_f32·norm_w to bf16 as they load it.
//
// Paired epilogues (SwiGLU, RoPE) need two weight rows' sums in one thread:
// a block's slots [0, R/2) hold the first rows of R/2 pairs and [R/2, R)
// their partners (gate j and up j; rows p and p + head_dim/2 of a head).
#include <algorithm>
#include <type_traits>

#include <cuda_bf16.h>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/gemv_bulk.h"
#include "backends/cuda/gemv_common.cuh"
#include "backends/cuda/pick_common.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;  // tensor-core path
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;  // x rows per launch

// The CUDA-core path's block shapes (GemvArgs::shape): threads per block,
// ring depth (chunks per weight row in flight per thread), the blocks per
// SM the registers are capped for (up to 4 x rows), and weight rows per
// block for 1-2 and 3-4 x rows (2 above).
struct RowsShape {
  int threads, depth, min_blocks, rows_12, rows_34;
};
constexpr RowsShape kRowsShapes[] = {{128, 2, 3, 8, 4}, {128, 4, 3, 4, 2}, {256, 1, 2, 8, 4}, {128, 1, 3, 16, 8}};
constexpr int kNumRowsShapes = 4;

using namespace gemv_detail;


template <int B, int S>
constexpr int rows_per_block() {
  return B <= 2 ? kRowsShapes[S].rows_12 : B <= 4 ? kRowsShapes[S].rows_34 : 2;
}

// Split k (gridDim.y slices of a row tile): the block's per-warp sums
// (s_part [kW][R·B], s_ss [kW][B]) go to the tile's record as one value per
// slot (warps added in order), and the last slice's block to count itself
// adds the records in slice order and applies the epilogue, resetting the
// count: the result depends on the slice count, never on which block ends
// last.
template <int R, int B, GemvEpilogue E, int kW>
__device__ void finish_split(const GemvArgs& a, const float* s_part, const float* s_ss, int rows) {
  __shared__ bool s_last;
  constexpr int kVals = R * B + B;  // the slots' sums, then each row's sum of squares
  const int64_t n_slices = gridDim.y;
  float* tile = a.split.part + int64_t(blockIdx.x) * n_slices * kVals;
  for (int i = threadIdx.x; i < kVals; i += blockDim.x) {
    float v = 0.0f;
    if (i < R * B) {
#pragma unroll
      for (int w = 0; w < kW; ++w) v += s_part[w * R * B + i];
    } else if (a.norm_w) {
#pragma unroll
      for (int w = 0; w < kW; ++w) v += s_ss[w * B + i - R * B];
    }
    tile[blockIdx.y * kVals + i] = v;
  }
  __threadfence();  // the record is visible to every block before this one is counted
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(a.split.counts + blockIdx.x, 1) == n_slices - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (threadIdx.x == 0) a.split.counts[blockIdx.x] = 0;  // for the next call
  for (int i = threadIdx.x; i < R * B; i += blockDim.x) {
    const int r = i / B, b = i % B;
    if (b >= rows) continue;
    float scale = 1.0f;
    if (a.norm_w) {
      float ss = 0.0f;
      for (int64_t sl = 0; sl < n_slices; ++sl) ss += __ldcg(tile + sl * kVals + R * B + b);
      scale = rsqrtf(ss / static_cast<float>(a.k) + a.eps);
    }
    finish_slot<R, E>(a, r, b, scale, [&](int rr) {
      float v = 0.0f;
      for (int64_t sl = 0; sl < n_slices; ++sl) v += __ldcg(tile + sl * kVals + rr * B + b);
      return v;
    });
  }
}

// S: kRowsShapes[S]. Several blocks per SM up to 4 rows, so one block's
// loads stay in flight through another's reduction and epilogue (more rows
// want their registers for the x chunks). A block takes one tile of R
// slots, or with `persistent` (a grid of one block per resident slot) an
// equal run of all output columns, tile after tile (not with RoPE).
template <int B, GemvEpilogue E, int S>
__global__ void __launch_bounds__(kRowsShapes[S].threads, B <= 4 ? kRowsShapes[S].min_blocks : 1)
    gemv_kernel(GemvArgs a, bool persistent) {
  constexpr int R = rows_per_block<B, S>();
  constexpr int kT = kRowsShapes[S].threads, kW = kT / 32, kDepth = kRowsShapes[S].depth;
  constexpr int64_t kTileCols = tile_columns<R, E>();
  // RoPE's epilogue leaves no registers for a loop over tiles (it would spill): one tile per block.
  constexpr bool kLoops = E != GemvEpilogue::kRopeAppend;
  __shared__ float s_part[kW][R * B];
  __shared__ float s_ss[kW][B];
  const int rows = static_cast<int>(a.rows);
  // This block's slice of k (all of it unless split): chunks [c_begin, c_end).
  const int64_t n_chunks = a.k / 8, n_slices = gridDim.y;
  const int64_t c_begin = n_chunks * blockIdx.y / n_slices, c_end = n_chunks * (blockIdx.y + 1) / n_slices;
  // This block's output columns (pairs when paired): [u0, u_end) in tiles
  // of kTileCols, persistent blocks' first one shortened by blockIdx.x mod
  // kTileCols columns so the blocks do not all change tiles at once.
  const int64_t columns = gemv_columns(a);
  persistent = kLoops && persistent;
  int64_t u0 = persistent ? columns * blockIdx.x / gridDim.x : int64_t(blockIdx.x) * kTileCols;
  const int64_t u_end = persistent ? columns * (blockIdx.x + 1) / gridDim.x : min(columns, u0 + kTileCols);
  int64_t t_end = min(u_end, u0 + kTileCols - (persistent ? blockIdx.x % kTileCols : 0));  // this tile's end
  const bf16_bits* w_row[R];  // null past the end; indexed by constants only (unrolled), so in registers
  // The ring: w_buf[u] holds chunk c + u·kT of the current pass.
  uint4 w_buf[kDepth][R];
  const uint64_t policy = evict_first_policy();
  // Points w_row at the rows of the tile [u0, t_end) and loads their first ring.
  auto start_tile = [&]() {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = tile_row<R, E>(a, u0, t_end, r);
      w_row[r] = row < 0 ? nullptr : a.w + row * a.k;
    }
#pragma unroll
    for (int u = 0; u < kDepth; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        w_buf[u][r] = load_weights(w_row[r], w_row[r] != nullptr, c_begin + threadIdx.x + u * kT, c_end, policy);
  };
  allow_next_grid();
  start_tile();  // weights never depend on the previous kernel: the first ring goes out before waiting for it
  wait_prior_grid();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (;;) {
    float acc[R][B], ss[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      ss[b] = 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][b] = 0.0f;
    }
    for (int64_t c0 = c_begin + threadIdx.x; c0 < c_end; c0 += kDepth * kT) {
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const int64_t c = c0 + u * kT;
        if (c >= c_end) break;
        float xf[B][8];
#pragma unroll
        for (int b = 0; b < B; ++b)
          if (b < rows) x_chunk(a, b, c * 8, xf[b], &ss[b]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float wf[8];
          unpack8(w_buf[u][r], wf);
          w_buf[u][r] = load_weights(w_row[r], w_row[r] != nullptr, c + kDepth * kT, c_end, policy);
#pragma unroll
          for (int b = 0; b < B; ++b) {
            if (b >= rows) break;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[i], xf[b][i], acc[r][b]);
          }
        }
      }
    }
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

    if (n_slices > 1) {  // split k: one tile per block
      finish_split<R, B, E, kW>(a, &s_part[0][0], &s_ss[0][0], rows);
      return;
    }
    const int t = threadIdx.x, r = t / B, b = t % B;
    if (t < R * B && b < rows) {
      const float scale = row_scale<kW>(a, &s_ss[0][b], B);
      finish_tile_slot<R, E>(a, u0, t_end, r, b, scale, [&](int rr) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kW; ++w) sum += s_part[w][rr * B + b];
        return sum;
      });
    }
    if (!kLoops || t_end >= u_end) return;
    u0 = t_end;
    t_end = min(u_end, u0 + kTileCols);
    // The next tile's first ring (not earlier: its registers would spill
    // through the epilogue; the SM's other blocks keep loads in flight).
    start_tile();
    __syncthreads();  // the next tile refills s_part and s_ss
  }
}

// ---- Tensor-core path ---------------------------------------------------------

constexpr int kTile = 16;   // weight rows per block
constexpr int kStepK = 32;  // k per warp step
constexpr int kUnroll = 4;  // steps per warp whose loads are in flight together

__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// NT: n-tiles of 8 x rows (1: up to 8 rows, 2: up to 16); MT: m-tiles of
// 16 weight rows per block, each x fragment feeding all of them (the x rows
// are read from L2 once per block, so more weight rows per block read less
// of x per weight byte). Slot mt·16 + r is m-tile mt's row r of
// slot_row<16·MT, E>.
template <int NT, int MT, GemvEpilogue E>
__global__ void __launch_bounds__(kThreads) gemv_mma_kernel(GemvArgs a) {
  constexpr int kB = 8 * NT, kR = kTile * MT, kU = MT == 1 ? kUnroll : 8 / MT;  // kU: steps in flight
  __shared__ float s_c[kWarps][kR][kB];
  __shared__ float s_ss[kWarps][kB];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rows = static_cast<int>(a.rows);
  const bf16_bits* w_lo[MT];  // null past the end
  const bf16_bits* w_hi[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int64_t lo = slot_row<kR, E>(a, mt * kTile + g), hi = slot_row<kR, E>(a, mt * kTile + g + 8);
    w_lo[mt] = lo < 0 ? nullptr : a.w + lo * a.k + 8 * t;
    w_hi[mt] = hi < 0 ? nullptr : a.w + hi * a.k + 8 * t;
  }
  const bool x_lo_ok = g < rows, x_hi_ok = NT == 2 && g + 8 < rows;
  // This block's slice of the k steps (all of them unless split): [s_begin, s_end).
  const int n_steps_all = static_cast<int>(a.k / kStepK), n_slices = static_cast<int>(gridDim.y);
  const int s_begin = static_cast<int>(int64_t(n_steps_all) * blockIdx.y / n_slices);
  const int n_steps = static_cast<int>(int64_t(n_steps_all) * (blockIdx.y + 1) / n_slices);  // the slice's end
  const int64_t n_chunks = int64_t(n_steps) * (kStepK / 8);
  float c[MT][NT][4] = {};
  float ss_lo = 0.0f, ss_hi = 0.0f;  // with norm_w: squares of x rows g and g + 8 over this lane's chunks
  uint4 wl[kU][MT], wh[kU][MT];
  const uint64_t policy = evict_first_policy();
  auto load_w = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t chunk = int64_t(s0 + u * kWarps) * (kStepK / 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        wl[u][mt] = load_weights(w_lo[mt], w_lo[mt] != nullptr, chunk, n_chunks, policy);
        wh[u][mt] = load_weights(w_hi[mt], w_hi[mt] != nullptr, chunk, n_chunks, policy);
      }
    }
  };
  allow_next_grid();
  load_w(s_begin + warp);  // weights never depend on the previous kernel
  wait_prior_grid();
  for (int s0 = s_begin + warp; s0 < n_steps; s0 += kWarps * kU) {
    if (s0 != s_begin + warp) load_w(s0);
    uint4 xl[kU], xh[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int step = s0 + u * kWarps;
      const int64_t off = int64_t(step) * kStepK + 8 * t;
      xl[u] = x_lo_ok && step < n_steps ? x_chunk_bf16(a, g, off, &ss_lo) : make_uint4(0, 0, 0, 0);
      xh[u] = x_hi_ok && step < n_steps ? x_chunk_bf16(a, g + 8, off, &ss_hi) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (s0 + u * kWarps >= n_steps) break;  // the same for the whole warp
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4& l = wl[u][mt];
        const uint4& h = wh[u][mt];
        mma_bf16(c[mt][0], l.x, h.x, l.y, h.y, xl[u].x, xl[u].y);
        mma_bf16(c[mt][0], l.z, h.z, l.w, h.w, xl[u].z, xl[u].w);
        if constexpr (NT == 2) {
          mma_bf16(c[mt][1], l.x, h.x, l.y, h.y, xh[u].x, xh[u].y);
          mma_bf16(c[mt][1], l.z, h.z, l.w, h.w, xh[u].z, xh[u].w);
        }
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int b = nt * 8 + 2 * t, r = mt * kTile + g;
      s_c[warp][r][b] = c[mt][nt][0];
      s_c[warp][r][b + 1] = c[mt][nt][1];
      s_c[warp][r + 8][b] = c[mt][nt][2];
      s_c[warp][r + 8][b + 1] = c[mt][nt][3];
    }
  if (a.norm_w) {
    // The 4 lanes of group g read x rows g and g + 8's chunks of every step of this warp.
    ss_lo += __shfl_xor_sync(0xffffffffu, ss_lo, 1);
    ss_lo += __shfl_xor_sync(0xffffffffu, ss_lo, 2);
    ss_hi += __shfl_xor_sync(0xffffffffu, ss_hi, 1);
    ss_hi += __shfl_xor_sync(0xffffffffu, ss_hi, 2);
    if (t == 0) {
      s_ss[warp][g] = ss_lo;
      if constexpr (NT == 2) s_ss[warp][g + 8] = ss_hi;
    }
  }
  __syncthreads();
  if (n_slices > 1) {
    finish_split<kR, kB, E, kWarps>(a, &s_c[0][0][0], &s_ss[0][0], rows);
    return;
  }
  for (int i = threadIdx.x; i < kR * kB; i += kThreads) {
    const int r = i / kB, b = i % kB;
    if (b >= rows) continue;
    const float scale = row_scale<kWarps>(a, &s_ss[0][b], kB);
    finish_slot<kR, E>(a, r, b, scale, [&](int rr) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += s_c[w][rr][b];
      return sum;
    });
  }
}


template <int NT, int MT>
cudaError_t launch_mma_tiles(const GemvArgs& a, cudaStream_t st, int device) {
  const int64_t per_block = paired(a.epilogue) ? kTile * MT / 2 : kTile * MT;
  const int64_t tiles = (gemv_columns(a) + per_block - 1) / per_block;
  // Split k as the CUDA-core path does (2 blocks of 256 resident per SM; a step per warp at least).
  int64_t slices = 1;
  const int64_t waves4 = 4 * 2 * int64_t(sm_count(device)), by_k = a.k / kStepK / kWarps;
  if (a.split.counts && a.split.part && tiles < waves4)
    slices = std::max<int64_t>(1, std::min<int64_t>({(waves4 + tiles - 1) / tiles, by_k, 8}));
  if (tiles > a.split.count_capacity || tiles * slices * (kTile * MT * 8 * NT + 8 * NT) > a.split.part_capacity)
    slices = 1;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slices));
  return with_epilogue(a.epilogue, [&](auto e) {
    return launch_overlapped(gemv_mma_kernel<NT, MT, decltype(e)::value>, grid, kThreads, st, a.overlap, a);
  });
}
// Shape s: 2^s m-tiles per block.
template <int NT>
cudaError_t launch_mma(const GemvArgs& a, cudaStream_t st, int device) {
  if (a.shape == 1) return launch_mma_tiles<NT, 2>(a, st, device);
  if (a.shape == 2) return launch_mma_tiles<NT, 4>(a, st, device);
  return launch_mma_tiles<NT, 1>(a, st, device);
}


// Slices of k for a grid of `tiles` row tiles at 1-2 x rows (so the same for
// any row count: a row's sums do not depend on the batch): enough for 4
// waves of resident blocks, each slice at least a chunk per thread, 8 at
// most; 1 without a workspace.
template <int S>
int split_slices(const GemvArgs& a, int device) {
  if (!a.split.counts || !a.split.part) return 1;
  constexpr int R1 = kRowsShapes[S].rows_12;
  const int64_t per_block = paired(a.epilogue) ? R1 / 2 : R1;
  const int64_t tiles = (gemv_columns(a) + per_block - 1) / per_block;
  const int64_t waves4 = 4 * int64_t(kRowsShapes[S].min_blocks) * sm_count(device);
  if (tiles >= waves4) return 1;
  const int64_t by_k = a.k / 8 / kRowsShapes[S].threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({(waves4 + tiles - 1) / tiles, by_k, 8})));
}

template <int B, int S>
cudaError_t launch_rows_shape(const GemvArgs& a, cudaStream_t st, int device) {
  constexpr int R = rows_per_block<B, S>();
  const int64_t per_block = paired(a.epilogue) ? R / 2 : R;
  const int64_t tiles = (gemv_columns(a) + per_block - 1) / per_block;
  int slices = B <= 4 ? split_slices<S>(a, device) : 1;
  if (tiles > a.split.count_capacity || tiles * slices * (R * B + B) > a.split.part_capacity) slices = 1;
  // Persistent: one block per resident slot (the blocks per SM the registers are capped for).
  const int64_t slots = int64_t(kRowsShapes[S].min_blocks) * sm_count(device);
  const bool persistent =
      a.persistent && B <= 4 && slices == 1 && tiles > slots && a.epilogue != GemvEpilogue::kRopeAppend;
  const dim3 grid(static_cast<unsigned>(persistent ? slots : tiles), static_cast<unsigned>(slices));
  return with_epilogue(a.epilogue, [&](auto e) {
    return launch_overlapped(gemv_kernel<B, decltype(e)::value, S>, grid, kRowsShapes[S].threads, st, a.overlap, a,
                             persistent);
  });
}
// Up to 4 rows any shape; above, shape 0 only (the tensor cores take those rows when k allows).
template <int B>
cudaError_t launch_rows(const GemvArgs& a, cudaStream_t st, int device) {
  if constexpr (B <= 4) {
    if (a.shape == 1) return launch_rows_shape<B, 1>(a, st, device);
    if (a.shape == 2) return launch_rows_shape<B, 2>(a, st, device);
    if (a.shape == 3) return launch_rows_shape<B, 3>(a, st, device);
  }
  return launch_rows_shape<B, 0>(a, st, device);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

Status check_rope(const GemvArgs& a) {
  const GemvRope& r = a.rope;
  if (r.head_dim <= 0 || r.head_dim % 2 != 0 || r.n_head <= 0 || r.n_head_kv <= 0 || r.max_ctx <= 0)
    return invalid_argument("cuda gemv: rope head_dim ", r.head_dim, " (must be even), heads ", r.n_head, "/",
                            r.n_head_kv, ", max_ctx ", r.max_ctx);
  if (a.n != int64_t(r.n_head + 2 * r.n_head_kv) * r.head_dim)
    return invalid_argument("cuda gemv: rope projection has ", a.n, " rows, expected (", r.n_head, " + 2·",
                            r.n_head_kv, ")·", r.head_dim);
  if (!r.q_out || !r.k_caches || !r.v_caches || !r.pos || !r.cos || !r.sin)
    return invalid_argument("cuda gemv: rope pointers must be set");
  return Status::ok();
}

}  // namespace

bool gemv_supports(const bf16_bits* x, const bf16_bits* w, int64_t k) {
  return k > 0 && k % 8 == 0 && aligned16(x) && aligned16(w);
}

bool gemv_fuses_pick(const GemvArgs& a, int device) {
  return a.epilogue == GemvEpilogue::kStoreF32 && a.shape == kGemvBulkShape && a.rows >= 1 && a.rows <= 4 &&
         has_bulk_copies(device) && gemv_bulk_grid(a, device) * 4 <= kGemvPickSlots;
}

Status gemv(CudaContext& ctx, const GemvArgs& a) {
  if (a.rows < 0 || a.n <= 0 || a.k <= 0) return invalid_argument("cuda gemv: bad shape ", a.rows, "x", a.n, "x", a.k);
  if (a.pick.next) {
    if (!gemv_fuses_pick(a, ctx.device()))
      return invalid_argument("cuda gemv: a fused pick needs the shared-memory ring (sm_90+), kStoreF32 and 1-4 rows");
    if (!a.pick.slots || !a.pick.count) return invalid_argument("cuda gemv: a fused pick needs slots and a count");
    LATHE_TRY(check_pick("cuda gemv: ", static_cast<const float*>(a.out), a.pick.next, a.rows, a.n, a.pick.feed));
  }
  const bool rope = a.epilogue == GemvEpilogue::kRopeAppend;
  if ((!a.x && !a.x_f32) || !a.w || (!a.out && !rope)) return invalid_argument("cuda gemv: null argument");
  if (rope) LATHE_TRY(check_rope(a));
  if (a.norm_w && !a.x_f32) return invalid_argument("cuda gemv: norm_w goes with x_f32");
  if (!gemv_supports(a.x_f32 ? a.w : a.x, a.w, a.k) || (a.x_f32 && !aligned16(a.x_f32)) ||
      (a.norm_w && !aligned16(a.norm_w)))
    return invalid_argument("cuda gemv: k (", a.k, ") must be a multiple of 8 and x, w 16-byte aligned");
  if (a.n > int64_t(kThreads) * 0x7fffffff) return invalid_argument("cuda gemv: n ", a.n, " is too large");
  if (a.shape >= kNumRowsShapes && a.shape != kGemvBulkShape)
    return invalid_argument("cuda gemv: shape ", int(a.shape), " does not exist");
  const size_t out_elem = a.epilogue == GemvEpilogue::kStoreBf16 || a.epilogue == GemvEpilogue::kSwigluBf16
                              ? sizeof(bf16_bits)
                              : sizeof(float);
  cudaStream_t st = stream_of(ctx);
  for (int64_t r0 = 0; r0 < a.rows; r0 += kMaxRows) {
    GemvArgs c = a;
    c.rows = std::min<int64_t>(kMaxRows, a.rows - r0);
    if (a.x_f32) c.x_f32 = a.x_f32 + r0 * a.k;
    else c.x = a.x + r0 * a.k;
    if (a.out) c.out = static_cast<char*>(a.out) + r0 * a.n * out_elem;
    if (rope) {
      const int half = a.rope.head_dim / 2;
      c.rope.q_out += r0 * a.rope.n_head * a.rope.head_dim;
      c.rope.k_caches += r0;
      c.rope.v_caches += r0;
      c.rope.pos += r0;
      c.rope.cos += r0 * half;
      c.rope.sin += r0 * half;
    }
    if (c.shape == kGemvBulkShape && (c.rows > 4 || !has_bulk_copies(ctx.device()))) c.shape = 0;
    cudaError_t err;
    if (c.shape == kGemvBulkShape) err = launch_gemv_bulk(c, st, ctx.device());
    else if (c.rows > 4 && a.k % kStepK == 0)
      err = c.rows <= 8 ? launch_mma<1>(c, st, ctx.device()) : launch_mma<2>(c, st, ctx.device());
    else if (c.rows == 1) err = launch_rows<1>(c, st, ctx.device());
    else if (c.rows == 2) err = launch_rows<2>(c, st, ctx.device());
    else if (c.rows <= 4) err = launch_rows<4>(c, st, ctx.device());
    else if (c.rows <= 8) err = launch_rows<8>(c, st, ctx.device());
    else err = launch_rows<16>(c, st, ctx.device());
    LATHE_TRY(cuda_check(err, "gemv launch"));
  }
  return ctx.check_launch("gemv");
}

}  // namespace lathe::cuda
