// greedy_pick (decode_ops.h): the greedy token of each logits row, and with
// a feed the next decode step's input, written on the device.
//
// One block walking a row would take 128,256 logits (513 KB) through one
// SM's loads. Here a cluster of kPickSplit blocks takes a row (sm_90+),
// each an equal run of columns, and block 0 merges their winners through
// distributed shared memory, so the row is read by kPickSplit SMs at once
// and the launch overlaps the LM head's tail (programmatic dependent
// launch). Before sm_90 one block takes a row.
//
// The rule: the largest value wins, the first column of equals, NaN never
// (a row of NaN gives 0). A thread keeps the first of
// its equals (it walks its columns in order), warps and blocks merge by
// (value, then lower column), so the result does not depend on the split.
#include <cooperative_groups.h>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/pick_common.cuh"

namespace lathe::cuda {
namespace {

constexpr int kPickThreads = 512;
constexpr int kPickWarps = kPickThreads / 32;
constexpr int kPickSplit = 8;  // blocks per row on sm_90+ (a portable cluster)

using Best = PickBest;

__device__ __forceinline__ Best warp_best(Best b) { return pick_shuffle(b, 31); }

// The best of columns [c0, c1) of row r, merged over the block (every thread gets it).
__device__ Best block_best(const float* row, int64_t c0, int64_t c1, Best* s_warp, const SeenPenalty& pen,
                           int64_t r) {
  Best b{-INFINITY, -1};
  auto consider = [&](float v, int64_t j) { pick_consider(b, penalized(pen, r, j, v), j); };
  // float4 loads where the run is 16-byte aligned, 4 in flight per thread.
  int64_t a0 = c0;
  while (a0 < c1 && (reinterpret_cast<uintptr_t>(row + a0) & 15) != 0) ++a0;
  const int64_t n4 = (c1 - a0) / 4;
  const float4* row4 = reinterpret_cast<const float4*>(row + a0);
  for (int64_t j = c0 + threadIdx.x; j < a0; j += kPickThreads) consider(row[j], j);
  for (int64_t q0 = threadIdx.x; q0 < n4; q0 += 4 * kPickThreads) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t q = q0 + u * kPickThreads;
      v[u] = q < n4 ? __ldg(row4 + q) : make_float4(NAN, NAN, NAN, NAN);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t j = a0 + 4 * (q0 + u * kPickThreads);
      consider(v[u].x, j);
      consider(v[u].y, j + 1);
      consider(v[u].z, j + 2);
      consider(v[u].w, j + 3);
    }
  }
  for (int64_t j = a0 + 4 * n4 + threadIdx.x; j < c1; j += kPickThreads) consider(row[j], j);
  b = warp_best(b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) s_warp[warp] = b;
  __syncthreads();
  b = lane < kPickWarps ? s_warp[lane] : Best{-INFINITY, -1};
  return warp_best(b);
}

// Row r's pick to next (and the feed), by the row's block 0.
__device__ void finish(const GreedyPickArgs& a, int64_t r, const Best& b) {
  write_pick(a.next, a.feed, r, static_cast<int32_t>(b.i < 0 ? 0 : b.i));
}

template <bool kCluster>
__global__ void __launch_bounds__(kPickThreads) greedy_pick_kernel(GreedyPickArgs a) {
  __shared__ Best s_warp[kPickWarps];
  __shared__ Best s_block;
  allow_next_grid();
  wait_prior_grid();  // the logits come from the previous kernel
  const int64_t r = blockIdx.y;
  const float* row = a.logits + r * a.vocab;
  if constexpr (!kCluster) {
    const Best b = block_best(row, 0, a.vocab, s_warp, a.penalty, r);
    if (threadIdx.x == 0) finish(a, r, b);
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int64_t rank = cluster.block_rank(), n = cluster.num_blocks();
    const int64_t per = (a.vocab + n - 1) / n;
    const int64_t c0 = min(a.vocab, rank * per), c1 = min(a.vocab, c0 + per);
    const Best b = block_best(row, c0, c1, s_warp, a.penalty, r);
    if (threadIdx.x == 0) s_block = b;
    cluster.sync();  // every block's winner is in its shared memory
    if (rank == 0 && threadIdx.x == 0) {
      Best m{-INFINITY, -1};
      for (int k = 0; k < n; ++k) {  // in column order: a later block wins only when strictly better
        const Best o = *cluster.map_shared_rank(&s_block, k);
        if (pick_better(o, m)) m = o;
      }
      finish(a, r, m);
    }
    cluster.sync();  // no block leaves while block 0 reads its shared memory
#endif
  }
}

}  // namespace

Status greedy_pick(CudaContext& ctx, const GreedyPickArgs& a) {
  LATHE_TRY(check_pick("cuda greedy_pick: ", a.logits, a.next, a.rows, a.vocab, a.feed));
  if (a.rows == 0) return Status::ok();
  const cudaStream_t st = stream_of(ctx);
  if (supports_overlap(ctx.device()) && a.vocab >= int64_t(kPickSplit) * kPickThreads) {
    return cuda_check(launch_overlapped_cluster(greedy_pick_kernel<true>, dim3(kPickSplit, unsigned(a.rows)),
                                                dim3(kPickThreads), kPickSplit, st, a.overlap, a),
                      "greedy_pick launch");
  }
  return cuda_check(launch_overlapped(greedy_pick_kernel<false>, dim3(1, unsigned(a.rows)), dim3(kPickThreads), st,
                                      a.overlap && supports_overlap(ctx.device()), a),
                    "greedy_pick launch");
}

}  // namespace lathe::cuda
