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
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"

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
  const int len = a.window > 0 ? std::min(a.window, std::max(1, a.max_ctx)) : std::max(1, a.max_ctx);
  int chunk = 0, n_splits = 0;
  attn::plan_splits(len, a.n_seqs * a.n_head, &chunk, &n_splits, min_chunk);
  attn::DecodeParams p{static_cast<const bf16*>(a.q), nullptr, nullptr, static_cast<bf16*>(a.out), a.lse,
                       static_cast<float*>(a.workspace), a.n_head, a.n_head_kv, 0, a.window, chunk, n_splits,
                       a.scale, reinterpret_cast<const bf16* const*>(a.k_caches),
                       reinterpret_cast<const bf16* const*>(a.v_caches), a.pos};
  p.fused_merge = true;
  auto st = static_cast<cudaStream_t>(a.stream);
  return attn::with_head_dim(a.head_dim, [&](auto d) {
    return attn::launch_decode<decltype(d)::value>(p, a.n_seqs, st, a.overlap);
  });
}

}  // namespace lathe::cuda
