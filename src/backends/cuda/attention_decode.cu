// Attention for generation against a contiguous KV cache. One new token is
// memory-bound: its context is split into chunks (split-K), one thread block
// per (chunk, head) streams its K/V rows with 16-byte loads — head_dim / 8
// lanes per key, so a warp reads 2 or 4 keys at once — keeping a running
// max, sum and fp32 output per key group; the groups merge in shared memory
// and the chunks merge with log-sum-exp weights: in a second kernel for one
// sequence, and for the batched decode step (whose workspace starts zeroed)
// in the last chunk's block of each (sequence, head): every block counts
// itself in the workspace after writing its partial result, and the one that
// brings the count to the number of chunks merges and resets the count, so a
// decode step is one attention kernel. The batched kernel can be a
// programmatic dependent launch (decode_launch.cuh); its chunks can be made
// longer (attention_decode_batch_chunked, decode_ops.h) so that fewer blocks
// leave the SMs room for the next kernel's. Several new tokens
// (prefill) go to the tensor-core forward kernel with the queries offset by
// pos0.
//
// The batched decode step of up to kDecodeClusterMaxSeqs sequences takes a
// second kernel on sm_90 (kCluster, below): at batch 1 the split-K kernel is
// all latency (Llama-3.2-1B, 640 keys: 7.2 us per layer for 1.3 MB): a
// chain of the wait for the previous kernel, q, the K/V rows, the partial
// result's write, a fence, the count, and the last block's reload of every
// split. The cluster kernel loads the rows older than this step before it
// waits, reads each K/V row once for the query heads sharing it, and merges
// its blocks through distributed shared memory.
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

namespace lathe::cuda {
namespace attn {
namespace {

constexpr int kMaxSplits = 64;
// Keys per split at least: 32 while few (token, head) pairs share the GPU
// (a short context still spreads over many blocks), 128 from kManyRows on
// (enough blocks already; fewer partial results to merge).
constexpr int kMinChunk = 32, kMinChunkMany = 128, kManyRows = 256;

struct DecodeParams {
  const bf16 *q, *k, *v;
  bf16* out;
  float* lse;
  float* part;  // [n_tokens, n_head] records of record_floats(D): per split o[D], m, l (m in log2 units); a count
  int n_head, n_head_kv, pos0, window, chunk, n_splits;
  float scale;
  // Batched: blockIdx.z is a sequence with its own cache and position (device arrays).
  const bf16* const* k_seq = nullptr;
  const bf16* const* v_seq = nullptr;
  const int32_t* pos_seq = nullptr;
  // The last split block of each (token, head) merges (the records' counts are zero between calls).
  bool fused_merge = false;
};

// A (token, head)'s workspace record: kMaxSplits partial results of D + 2
// floats, then the count of split blocks done (an int), at a place that
// does not depend on the number of tokens.
__host__ __device__ constexpr int64_t record_floats(int d) { return int64_t(kMaxSplits) * (d + 2) + 1; }

// Merges the n_splits partial results of (token t, head h) into out (and
// lse): the splits' m and l come into shared memory in one round of loads
// (a thread per split), then one thread per d sums its column over the
// splits in order (loads independent of each other, so in flight together).
template <int D>
__device__ __forceinline__ void merge_splits(const DecodeParams& p, int t, int h) {
  __shared__ float s_m[kMaxSplits], s_l[kMaxSplits];
  const float* src = p.part + (int64_t(t) * p.n_head + h) * record_floats(D);
  for (int s = threadIdx.x; s < p.n_splits; s += blockDim.x) {
    s_m[s] = __ldcg(src + s * (D + 2) + D);
    s_l[s] = __ldcg(src + s * (D + 2) + D + 1);
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int s = 0; s < p.n_splits; ++s) mx = fmaxf(mx, s_m[s]);
  const float base = mx == -INFINITY ? 0.f : mx;
  const int64_t row = int64_t(t) * p.n_head + h;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f, sum = 0.f;
#pragma unroll 8
    for (int s = 0; s < p.n_splits; ++s) {
      const float w = exp2f(s_m[s] - base);
      acc += __ldcg(src + s * (D + 2) + d) * w;
      sum += s_l[s] * w;
    }
    p.out[row * D + d] = __float2bfloat16(sum > 0.f ? acc / sum : 0.f);
    if (p.lse && d == 0) p.lse[row] = sum > 0.f ? (mx + log2f(sum)) * kLn2 : -INFINITY;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(DecodeParams p) {
  constexpr int kLanes = D / 8, kGroups = kThreads / kLanes;  // lanes per key, key groups per block
  __shared__ float s_o[kGroups][D];
  __shared__ float s_m[kGroups], s_l[kGroups];
  __shared__ bool s_last;
  allow_next_grid();
  wait_prior_grid();  // q and the newest cache row come from the kernel before
  const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z, hk = h / (p.n_head / p.n_head_kv);
  const int pos = p.pos_seq ? p.pos_seq[t] : p.pos0 + t;
  const bf16* k_rows = p.k_seq ? p.k_seq[t] : p.k;
  const bf16* v_rows = p.v_seq ? p.v_seq[t] : p.v;
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int j_begin = lo + split * p.chunk, j_end = min(pos + 1, j_begin + p.chunk);
  const int grp = threadIdx.x / kLanes, d0 = threadIdx.x % kLanes * 8;

  float q[8], o[8] = {};
  {
    const uint4 raw = *reinterpret_cast<const uint4*>(p.q + (int64_t(t) * p.n_head + h) * D + d0);
    const bf16* e = reinterpret_cast<const bf16*>(&raw);
    for (int i = 0; i < 8; ++i) q[i] = __bfloat162float(e[i]) * p.scale * kLog2e;
  }
  float m = -INFINITY, l = 0.f;
  // Key j's 16 bytes of K and V for this lane (zeros past the chunk).
  auto load_kv = [&](int j, uint4& kr, uint4& vr) {
    kr = vr = make_uint4(0, 0, 0, 0);
    if (j >= j_end) return;
    const int64_t off = (int64_t(j) * p.n_head_kv + hk) * D + d0;
    kr = *reinterpret_cast<const uint4*>(k_rows + off);
    vr = *reinterpret_cast<const uint4*>(v_rows + off);
  };
  uint4 k_next, v_next;  // the next key group's rows, in flight during this group's arithmetic
  load_kv(j_begin + grp, k_next, v_next);
  // The trip count is the same for every thread so the shuffles stay converged.
  for (int jb = j_begin; jb < j_end; jb += kGroups) {
    const int j = jb + grp;
    const bool valid = j < j_end;
    const uint4 kr = k_next, vr = v_next;
    load_kv(j + kGroups, k_next, v_next);
    const bf16* ke = reinterpret_cast<const bf16*>(&kr);
    const bf16* ve = reinterpret_cast<const bf16*>(&vr);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += q[i] * __bfloat162float(ke[i]);
#pragma unroll
    for (int off2 = kLanes / 2; off2 > 0; off2 /= 2) s += __shfl_xor_sync(0xffffffffu, s, off2);
    if (!valid) continue;
    if (s > m) {
      const float alpha = exp2f(m - s);
      l *= alpha;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] *= alpha;
      m = s;
    }
    const float pr = exp2f(s - m);
    l += pr;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] += pr * __bfloat162float(ve[i]);
  }
  for (int i = 0; i < 8; ++i) s_o[grp][d0 + i] = o[i];
  if (threadIdx.x % kLanes == 0) s_m[grp] = m, s_l[grp] = l;
  __syncthreads();

  float* record = p.part + (int64_t(t) * p.n_head + h) * record_floats(D);
  float* dst = record + split * (D + 2);
  float mx = -INFINITY;
  for (int gi = 0; gi < kGroups; ++gi) mx = fmaxf(mx, s_m[gi]);
  const float base = mx == -INFINITY ? 0.f : mx;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float acc = 0.f;
    for (int gi = 0; gi < kGroups; ++gi) acc += s_o[gi][d] * exp2f(s_m[gi] - base);
    dst[d] = acc;
  }
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int gi = 0; gi < kGroups; ++gi) sum += s_l[gi] * exp2f(s_m[gi] - base);
    dst[D] = mx;
    dst[D + 1] = sum;
  }
  if (!p.fused_merge) return;
  __threadfence();  // this block's partial result is visible to every block before it is counted
  __syncthreads();
  int* count = reinterpret_cast<int*>(record + kMaxSplits * (D + 2));
  if (threadIdx.x == 0) s_last = atomicAdd(count, 1) == p.n_splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (threadIdx.x == 0) *count = 0;  // for the next call
  merge_splits<D>(p, t, h);
}

// One block of D threads per (head, token) merges the splits.
template <int D>
__global__ void decode_merge_kernel(DecodeParams p) {
  merge_splits<D>(p, blockIdx.y, blockIdx.x);
}

// ---- The cluster kernel (kCluster) ----------------------------------------
//
// One cluster of S blocks per (sequence, kv head, part of the group): block
// `split` takes keys [lo + split·chunk, ...) for H query heads that share
// the kv head, so each K and V row is read once for the H heads. Under a
// programmatic dependent launch everything a block reads that the previous
// kernel does not write (the position, the cache rows before it) is loaded
// into registers before it waits: only q and the newest row come after.
// Each key group's online softmax merges with the other groups of its warp
// by shuffles, the warps in shared memory, and the S blocks of the cluster
// in the first block: each block writes its result into that block's
// shared memory (distributed shared memory) and arrives at the cluster
// barrier, and the first block, once all have, merges and writes the H·D
// outputs while the others leave: no workspace, no fence, no count. H200,
// 2026-12-02, against every block merging a 1/S slice from all the
// others' shared memory between two cluster barriers (three alternations
// in one call): Llama-3.2-1B decode at batch 1 1,369.5 → 1,390.2 tok/s,
// 8B 273.5 → 276.0, 1B at 4 sequences 2,584.6 → 2,651.2.

constexpr int kClusterThreads = 256;
constexpr int kClusterMaxSplits = 8;  // a portable cluster
constexpr int kClusterWarps = kClusterThreads / 32;

template <int D>
struct ClusterShape {
  static constexpr int kLanes = D / 8;                      // lanes per key, 16 bytes each
  static constexpr int kGroups = kClusterThreads / kLanes;  // keys per pass of the block
  static constexpr int kPasses = D == 64 ? 4 : 6;           // passes whose rows are in registers at once
  static constexpr int kKeys = kPasses * kGroups;           // keys per block loaded before the wait
};

struct ClusterParams {
  const bf16* q;
  bf16* out;
  float* lse;
  const bf16* const* k_seq;
  const bf16* const* v_seq;
  const int32_t* pos_seq;
  int n_head, n_head_kv, window;
  float scale;
};

template <int D, int H>
struct ClusterScratch {
  float o[kClusterWarps][H][D];
  float m[kClusterWarps][H], l[kClusterWarps][H];
  // Every block's result (relative to its res_m), in the first block's shared memory.
  float res_o[kClusterMaxSplits][H][D];
  float res_m[kClusterMaxSplits][H], res_l[kClusterMaxSplits][H];
};

// The cluster's hardware barrier in two halves: arrive (release, or relaxed
// where nothing before it needs ordering) and wait (acquire).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

template <int N = 8>
__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float* f) {
  const bf16* e = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) f[i] = __bfloat162float(e[i]);
}

// Folds (m2, l2, o2) into (m, l, o): both relative to their own max (log2 units).
template <int N>
__device__ __forceinline__ void fold_softmax(float& m, float& l, float* o, float m2, float l2, const float* o2) {
  const float mn = fmaxf(m, m2);
  const float a = m == -INFINITY ? 0.f : exp2f(m - mn), b = m2 == -INFINITY ? 0.f : exp2f(m2 - mn);
  m = mn;
  l = l * a + l2 * b;
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] = o[i] * a + o2[i] * b;
}

template <int D, int H>
__global__ void __launch_bounds__(kClusterThreads) decode_cluster_kernel(ClusterParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using Sh = ClusterShape<D>;
  constexpr int kLanes = Sh::kLanes, kGroups = Sh::kGroups, kPasses = Sh::kPasses;
  __shared__ ClusterScratch<D, H> s;
  cg::cluster_group cluster = cg::this_cluster();
  cluster_arrive_relaxed();  // waited for before the first write to another block's shared memory
  const int split = static_cast<int>(cluster.block_rank()), n_split = static_cast<int>(cluster.num_blocks());
  const int group = p.n_head / p.n_head_kv, parts = group / H;
  const int hk = blockIdx.y / parts, h0 = hk * group + blockIdx.y % parts * H, t = blockIdx.z;
  const int grp = threadIdx.x / kLanes, d0 = threadIdx.x % kLanes * 8;
  allow_next_grid();
  // Before the wait: the position (set before the step) and the rows before it (earlier steps').
  const int pos = p.pos_seq[t];
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int chunk = (pos + 1 - lo + n_split - 1) / n_split;
  const int j_begin = lo + split * chunk, j_end = min(pos + 1, j_begin + chunk);
  const int n_pass = (chunk + kGroups - 1) / kGroups;  // the same in every block of the cluster
  const int64_t stride = int64_t(p.n_head_kv) * D;
  const bf16* k_rows = p.k_seq[t] + hk * D + d0;
  const bf16* v_rows = p.v_seq[t] + hk * D + d0;
  uint4 kr[kPasses], vr[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int j = j_begin + i * kGroups + grp;
    kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
    if (i < n_pass && j < j_end && j < pos) {
      kr[i] = __ldcg(reinterpret_cast<const uint4*>(k_rows + j * stride));  // L2, the point of coherence
      vr[i] = __ldcg(reinterpret_cast<const uint4*>(v_rows + j * stride));
    }
  }
  wait_prior_grid();  // q and row pos come from the kernel before
  float q[H][8];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    unpack_bf16x8(__ldcg(reinterpret_cast<const uint4*>(p.q + (int64_t(t) * p.n_head + h0 + h) * D + d0)), q[h]);
#pragma unroll
    for (int e = 0; e < 8; ++e) q[h][e] *= p.scale * kLog2e;
  }
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    if (i < n_pass && j_begin + i * kGroups + grp == pos) {
      kr[i] = __ldcg(reinterpret_cast<const uint4*>(k_rows + pos * stride));
      vr[i] = __ldcg(reinterpret_cast<const uint4*>(v_rows + pos * stride));
    }
  }
  float m[H], l[H], o[H][8];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[h][e] = 0.f;
  }
  for (int pb = 0; pb < n_pass; pb += kPasses) {  // one round for contexts up to S·kKeys keys
    if (pb > 0) {
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int j = j_begin + (pb + i) * kGroups + grp;
        kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
        if (pb + i < n_pass && j < j_end) {
          kr[i] = __ldcg(reinterpret_cast<const uint4*>(k_rows + j * stride));
          vr[i] = __ldcg(reinterpret_cast<const uint4*>(v_rows + j * stride));
        }
      }
    }
    float sc[kPasses][H];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
#pragma unroll
      for (int h = 0; h < H; ++h) sc[i][h] = -INFINITY;
      if (pb + i >= n_pass) continue;  // the same for every thread: the shuffles stay converged
      const bool valid = j_begin + (pb + i) * kGroups + grp < j_end;
      float kf[8];
      unpack_bf16x8(kr[i], kf);
#pragma unroll
      for (int h = 0; h < H; ++h) {
        float x = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) x = fmaf(q[h][e], kf[e], x);
#pragma unroll
        for (int off = kLanes / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
        if (valid) sc[i][h] = x;
      }
    }
#pragma unroll
    for (int h = 0; h < H; ++h) {
      float mb = m[h];
#pragma unroll
      for (int i = 0; i < kPasses; ++i) mb = fmaxf(mb, sc[i][h]);
      if (mb == -INFINITY || mb == m[h]) continue;
      const float alpha = m[h] == -INFINITY ? 0.f : exp2f(m[h] - mb);
      m[h] = mb;
      l[h] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] *= alpha;
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      if (pb + i >= n_pass) continue;
      float vf[8];
      unpack_bf16x8(vr[i], vf);
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const float pr = sc[i][h] == -INFINITY ? 0.f : exp2f(sc[i][h] - m[h]);
        l[h] += pr;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[h][e] = fmaf(pr, vf[e], o[h][e]);
      }
    }
  }
  // The key groups of a warp (lanes kLanes apart), then the warps.
#pragma unroll
  for (int off = kLanes; off < 32; off *= 2) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      float o2[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o2[e] = __shfl_xor_sync(0xffffffffu, o[h][e], off);
      const float m2 = __shfl_xor_sync(0xffffffffu, m[h], off), l2 = __shfl_xor_sync(0xffffffffu, l[h], off);
      fold_softmax<8>(m[h], l[h], o[h], m2, l2, o2);
    }
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < kLanes) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
#pragma unroll
      for (int e = 0; e < 8; ++e) s.o[warp][h][d0 + e] = o[h][e];
      if (d0 == 0) s.m[warp][h] = m[h], s.l[warp][h] = l[h];
    }
  }
  __syncthreads();
  cluster_wait();  // every block of the cluster has started: its shared memory may be written
  ClusterScratch<D, H>* lead = cluster.map_shared_rank(&s, 0);
  for (int e = threadIdx.x; e < H * D; e += kClusterThreads) {
    const int h = e / D, d = e % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kClusterWarps; ++w) mx = fmaxf(mx, s.m[w][h]);
    const float base = mx == -INFINITY ? 0.f : mx;
    float acc = 0.f, sum = 0.f;
#pragma unroll
    for (int w = 0; w < kClusterWarps; ++w) {
      const float wt = exp2f(s.m[w][h] - base);
      acc += s.o[w][h][d] * wt;
      sum += s.l[w][h] * wt;
    }
    lead->res_o[split][h][d] = acc;
    if (d == 0) lead->res_m[split][h] = mx, lead->res_l[split][h] = sum;
  }
  // The first block merges the cluster's results once all have written them;
  // the others leave (nothing reads their shared memory).
  cluster_arrive();
  cluster_wait();
  if (split != 0) return;
  for (int e = threadIdx.x; e < H * D; e += kClusterThreads) {
    const int h = e / D, d = e % D;
    float rm[kClusterMaxSplits], rl[kClusterMaxSplits], ro[kClusterMaxSplits];
#pragma unroll
    for (int r = 0; r < kClusterMaxSplits; ++r) {
      rm[r] = -INFINITY, rl[r] = ro[r] = 0.f;
      if (r >= n_split) continue;
      rm[r] = s.res_m[r][h], rl[r] = s.res_l[r][h], ro[r] = s.res_o[r][h][d];
    }
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < kClusterMaxSplits; ++r) mx = fmaxf(mx, rm[r]);
    const float base = mx == -INFINITY ? 0.f : mx;
    float acc = 0.f, sum = 0.f;
#pragma unroll
    for (int r = 0; r < kClusterMaxSplits; ++r) {
      const float wt = exp2f(rm[r] - base);
      acc += ro[r] * wt;
      sum += rl[r] * wt;
    }
    const int64_t row = int64_t(t) * p.n_head + h0 + h;
    p.out[row * D + d] = __float2bfloat16(sum > 0.f ? acc / sum : 0.f);
    if (p.lse && d == 0) p.lse[row] = sum > 0.f ? (mx + log2f(sum)) * kLn2 : -INFINITY;
  }
#endif
}

// Blocks per cluster for a context of len keys: the fewest (1, 2, 4, 8)
// whose blocks hold their share in one round of registers, else 8.
template <int D>
int cluster_splits(int len) {
  int n = 1;
  while (n < kClusterMaxSplits && (len + n - 1) / n > ClusterShape<D>::kKeys) n *= 2;
  return n;
}

// Query heads per block: the most of 4, 2, 1 that divide the group, at
// most `want` (0: 1 at head_dim 64, else 2). Measured on the H200
// (16:19; Llama shapes, group 4, 640 keys, per call / whole step):
// head_dim 64, 4 heads 4.5 us / 1,131 tok/s, 2 heads 3.8 / 1,164, 1 head
// 3.9 / 1,173; head_dim 128, 4 heads 254.8 tok/s, 2 heads 254.5, 1 head
// 246.2 (split-K: 7.2 us, 1,088 and 248.8 tok/s). Fewer heads per block:
// twice the blocks, each with half the registers (72 at head_dim 64 and
// one head). None fits beside two ring GEMV blocks on an SM (those take 2 ×
// 320 threads × 80 registers, leaving 14,336 of 65,536; a block here 256 ×
// 72 = 18,432; it fitted beside 288-thread ones, before the ring's
// epilogue warp), so every block starts as the q|k|v projection's leave.
// Measured and not kept (H200, 2026-12-02, 1B decode at one sequence,
// 1,387.8-1,388.6 tok/s for this kernel): 128-thread blocks (72 registers,
// one fits beside the ring blocks: 132 of 256 start early) 1,334.3-1,334.8;
// 4 blocks a cluster (128 blocks, two rounds of rows) 1,355.3-1,356.2; 2
// blocks a cluster 1,286.3-1,286.9; both 1,297.7-1,298.3; 8B, 128 threads
// 263.7 against 269.4.
int cluster_heads(int group, int want, int head_dim) {
  if (want <= 0) want = head_dim == 64 ? 1 : 2;
  for (int h : {4, 2, 1})
    if (group % h == 0 && h <= want) return h;
  return 1;
}

template <int D>
Status launch_cluster(const ClusterParams& p, int n_seqs, int len, int heads, cudaStream_t st, bool overlap) {
  const int splits = cluster_splits<D>(len), group = p.n_head / p.n_head_kv;
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.n_head_kv * (group / heads)),
                  static_cast<unsigned>(n_seqs));
  auto go = [&](auto kernel) {
    return cuda_check(launch_overlapped_cluster(kernel, grid, dim3(kClusterThreads), static_cast<unsigned>(splits), st,
                                                overlap, p),
                      "attention decode cluster launch");
  };
  if (heads == 4) return go(decode_cluster_kernel<D, 4>);
  if (heads == 2) return go(decode_cluster_kernel<D, 2>);
  return go(decode_cluster_kernel<D, 1>);
}

template <int D>
Status launch_decode(const DecodeParams& p, int n_tokens, cudaStream_t st, bool overlap) {
  LATHE_TRY(cuda_check(launch_overlapped(decode_split_kernel<D>, dim3(p.n_splits, p.n_head, n_tokens),
                                         dim3(kThreads), st, overlap, p),
                       "attention decode launch"));
  if (p.fused_merge) return Status::ok();
  decode_merge_kernel<D><<<dim3(p.n_head, n_tokens), D, 0, st>>>(p);
  return cuda_check(cudaGetLastError(), "attention decode merge launch");
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// Chunks of at least kMinChunk keys (kMinChunkMany for rows ≥ kManyRows
// (token, head) pairs; `at_least` when set), at most kMaxSplits of them, for
// `len` keys.
void plan_splits(int len, int rows, int* chunk, int* n_splits, int at_least = 0) {
  const int min_chunk = at_least > 0 ? at_least : rows >= kManyRows ? kMinChunkMany : kMinChunk;
  int n = std::min(kMaxSplits, std::max(1, (len + min_chunk - 1) / min_chunk));
  *chunk = std::max(1, (len + n - 1) / n);
  *n_splits = std::max(1, (len + *chunk - 1) / *chunk);
}

Status check_shape(const char* name, int head_dim, int n_head, int n_head_kv, int window) {
  if (!head_dim_compiled(head_dim))
    return unsupported(name, "head_dim ", head_dim, " is not compiled (" LATHE_ATTN_HEAD_DIMS " are)");
  if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0)
    return invalid_argument(name, "n_head ", n_head, " is not a multiple of n_head_kv ", n_head_kv);
  if (window < 0) return invalid_argument(name, "negative window");
  return Status::ok();
}

}  // namespace
}  // namespace attn

size_t attention_decode_workspace_bytes(int n_tokens, int n_head, int head_dim) {
  if (n_tokens <= 0 || n_head <= 0 || head_dim <= 0) return 0;
  return size_t(n_tokens) * size_t(n_head) * size_t(attn::record_floats(head_dim)) * sizeof(float);
}

Status attention_decode(const AttentionDecodeArgs& a) {
  const char* kName = "attention_decode: ";
  LATHE_TRY(attn::check_shape(kName, a.head_dim, a.n_head, a.n_head_kv, a.window));
  if (a.n_tokens < 0 || a.pos0 < 0) return invalid_argument(kName, "negative n_tokens or pos0");
  if (int64_t(a.pos0) + a.n_tokens > a.n_ctx)
    return invalid_argument(kName, "pos0 ", a.pos0, " + n_tokens ", a.n_tokens, " exceeds the cache's n_ctx ", a.n_ctx);
  if (a.n_tokens == 0) return Status::ok();
  if (!a.q || !a.k_cache || !a.v_cache || !a.out)
    return invalid_argument(kName, "q, k_cache, v_cache and out must be set");
  if (!attn::aligned16(a.q) || !attn::aligned16(a.k_cache) || !attn::aligned16(a.v_cache) || !attn::aligned16(a.out))
    return invalid_argument(kName, "q, k_cache, v_cache and out must be 16-byte aligned");
  using attn::bf16;
  if (a.n_tokens > 1) {
    attn::FwdParams p{static_cast<const bf16*>(a.q), static_cast<const bf16*>(a.k_cache),
                      static_cast<const bf16*>(a.v_cache), static_cast<bf16*>(a.out), a.lse, nullptr, 1, a.n_tokens,
                      a.n_tokens, a.pos0, a.n_head, a.n_head_kv, a.head_dim, a.window, a.scale};
    p.kernels = a.prefill_kernels;
    return attn::launch_flash_forward(p, a.stream);
  }
  if (!a.workspace) return invalid_argument(kName, "workspace must be set (attention_decode_workspace_bytes)");
  const int len = a.window > 0 ? std::min(a.window, a.pos0 + 1) : a.pos0 + 1;  // keys of the one token
  int chunk = 0, n_splits = 0;
  attn::plan_splits(len, a.n_head, &chunk, &n_splits);
  attn::DecodeParams p{static_cast<const bf16*>(a.q), static_cast<const bf16*>(a.k_cache),
                       static_cast<const bf16*>(a.v_cache), static_cast<bf16*>(a.out), a.lse,
                       static_cast<float*>(a.workspace), a.n_head, a.n_head_kv, a.pos0, a.window, chunk, n_splits,
                       a.scale};
  auto st = static_cast<cudaStream_t>(a.stream);
  return attn::with_head_dim(a.head_dim,
                             [&](auto d) { return attn::launch_decode<decltype(d)::value>(p, 1, st, false); });
}

Status attention_decode_batch(const AttentionDecodeBatchArgs& a) { return attention_decode_batch_chunked(a, 0); }

namespace {

// Keys of the longest context a batched call may see.
int decode_batch_len(const AttentionDecodeBatchArgs& a) {
  return a.window > 0 ? std::min(a.window, std::max(1, a.max_ctx)) : std::max(1, a.max_ctx);
}

// Up to two rounds of registers per block (beyond, the split-K kernel's many blocks win).
bool cluster_fits(const AttentionDecodeBatchArgs& a, int device) {
  if (a.n_seqs > kDecodeClusterMaxSeqs || (a.head_dim != 64 && a.head_dim != 128) || !supports_overlap(device))
    return false;
  const int keys = a.head_dim == 64 ? attn::ClusterShape<64>::kKeys : attn::ClusterShape<128>::kKeys;
  return decode_batch_len(a) <= 2 * attn::kClusterMaxSplits * keys;
}

}  // namespace

bool attention_decode_cluster_fits(const AttentionDecodeBatchArgs& a) {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess && cluster_fits(a, device);
}

Status attention_decode_batch_chunked(const AttentionDecodeBatchArgs& a, int min_chunk) {
  const char* kName = "attention_decode_batch: ";
  if (min_chunk < 0) return invalid_argument(kName, "negative min_chunk ", min_chunk);
  LATHE_TRY(attn::check_shape(kName, a.head_dim, a.n_head, a.n_head_kv, a.window));
  if (a.n_seqs < 0 || a.max_ctx < 0) return invalid_argument(kName, "negative n_seqs or max_ctx");
  if (a.n_seqs == 0) return Status::ok();
  if (!a.q || !a.k_caches || !a.v_caches || !a.pos || !a.out || !a.workspace)
    return invalid_argument(kName, "q, k_caches, v_caches, pos, out and workspace must be set");
  if (!attn::aligned16(a.q) || !attn::aligned16(a.out))
    return invalid_argument(kName, "q and out must be 16-byte aligned");
  using attn::bf16;
  const int len = decode_batch_len(a);
  auto st = static_cast<cudaStream_t>(a.stream);
  if (a.kernel != DecodeKernel::kSplitK) {
    int device = 0;
    LATHE_TRY(attn::cuda_check(cudaGetDevice(&device), "attention_decode_batch: device"));
    if (cluster_fits(a, device)) {
      if (a.cluster_heads != 0 && a.cluster_heads != 1 && a.cluster_heads != 2 && a.cluster_heads != 4)
        return invalid_argument(kName, "cluster_heads ", a.cluster_heads, " must be 0, 1, 2 or 4");
      const int group = a.n_head / a.n_head_kv, heads = attn::cluster_heads(group, a.cluster_heads, a.head_dim);
      const attn::ClusterParams p{static_cast<const bf16*>(a.q), static_cast<bf16*>(a.out), a.lse,
                                  reinterpret_cast<const bf16* const*>(a.k_caches),
                                  reinterpret_cast<const bf16* const*>(a.v_caches), a.pos, a.n_head, a.n_head_kv,
                                  a.window, a.scale};
      return a.head_dim == 64 ? attn::launch_cluster<64>(p, a.n_seqs, len, heads, st, a.overlap)
                              : attn::launch_cluster<128>(p, a.n_seqs, len, heads, st, a.overlap);
    }
    if (a.kernel == DecodeKernel::kCluster)
      return unsupported(kName, "the cluster kernel needs sm_90, head_dim 64 or 128, at most ", kDecodeClusterMaxSeqs,
                         " sequences and a context of at most ", 2 * attn::kClusterMaxSplits *
                         (a.head_dim == 64 ? attn::ClusterShape<64>::kKeys : attn::ClusterShape<128>::kKeys),
                         " keys (n_seqs ", a.n_seqs, ", head_dim ", a.head_dim, ", keys ", len, ")");
  }
  int chunk = 0, n_splits = 0;
  attn::plan_splits(len, a.n_seqs * a.n_head, &chunk, &n_splits, min_chunk);
  attn::DecodeParams p{static_cast<const bf16*>(a.q), nullptr, nullptr, static_cast<bf16*>(a.out), a.lse,
                       static_cast<float*>(a.workspace), a.n_head, a.n_head_kv, 0, a.window, chunk, n_splits,
                       a.scale, reinterpret_cast<const bf16* const*>(a.k_caches),
                       reinterpret_cast<const bf16* const*>(a.v_caches), a.pos};
  p.fused_merge = true;
  return attn::with_head_dim(a.head_dim, [&](auto d) {
    return attn::launch_decode<decltype(d)::value>(p, a.n_seqs, st, a.overlap);
  });
}

}  // namespace lathe::cuda
