// sample_pick (decode_ops.h): a token drawn from each logits row under
// temperature, top-k, top-p and min-p, on the device, and with a feed the
// next decode step's input (as greedy_pick).
//
// The warpers are the CPU sampler's (engine/sampler.h, Hugging Face's
// order): x = logit / T; top-k keeps x at or above the k-th largest (ties
// stay); the softmax of what is left; top-p keeps the most probable tokens
// until their mass reaches top_p (the one that crosses it included, equal
// probabilities taken in id order); min-p drops p < min_p · max p; then the
// token is drawn by inverse CDF over the survivors in id order. The sums run
// in double; p is exp(x − max) in f32 (the CPU takes it in double, so a
// token at a boundary may fall the other way, never a token far from it).
//
// One cluster of S blocks takes a row: 16 where the device runs such a
// (non-portable) cluster, else 8; block b holds the ids [b·per, (b+1)·per),
// thread t a run of E consecutive ids in registers. The k-th largest x and
// the top-p threshold are found by searching the float's order-preserving
// 32-bit key (11 rounds of cluster-wide counts or masses at 7 thresholds
// each: exact, no sort). Every reduction adds the blocks in rank order and
// the threads in a fixed tree: the draw depends only on the logits, the
// options, the seed and the row's salt (its position with a feed).
//
// Few survivors (at most kGather, as after top-k 50) leave the cluster:
// the top-k search stops as soon as at most kGather values lie at or above
// its lower bound (the top-p search, without top-k, once at most kGather
// tokens can hold the mass above its bound), block 0 gathers those and
// finishes the row alone (finish_in_block0: the exact k-th largest among
// them, the softmax, top-p, min-p, the draw). Where the time went (H200, Llama-3.2-1B vocabulary,
// top-k 50 with top-p 0.9 / with min-p 0.05, ncu at base clocks): the
// rounds' fixed costs, not the ids. With 8 blocks (32 ids a thread) 140 /
// 85 us; 16 blocks (16 ids a thread) and a warp skipping the ids below a
// round's range together 115 / 64 us; each threshold's cluster total added
// once, by one thread, instead of by every thread of every block (112
// shared loads a thread a round) and the counts' warp sums in f32 90 / 50
// us; the survivors finished in block 0 (no top-p search, no cluster sums
// after top-k) 47 / 45 us; the top-k search stopping at 256 survivors 29 /
// 26 us. lathe generate, 512 tokens, temperature 0.7, top-k 50, top-p 0.9:
// 1,140 → 1,280 tok/s (greedy 1,303); top-p 0.9 alone (a flat row, its
// search to the end) 92 → 77 us.
#include <cooperative_groups.h>

#include <type_traits>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/pick_common.cuh"

namespace lathe::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / 32;
// Blocks per row: a cluster of 16 where the device runs one (more warps,
// fewer ids each), else 8 (a portable cluster).
constexpr int kSampleSplitWide = 16;
constexpr int kSampleSplit = 8;

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

template <int S>
struct SampleShared {
  double slot[2][kSampleWarps];           // a reduction's warp totals (two rounds in flight)
  double block[2];                        // the block's total, read by the cluster (double-buffered)
  double gathered[2][S];       // every block's total, in rank order
  double ways[2][8][kSampleWarps];        // search_key: each threshold's warp weights
  double ways_block[2][8];                // search_key: the block's weight per threshold
  double ways_total[2][8];                // search_key: the cluster's weight per threshold
  int found;                              // the drawn id in this block, or -1
  int last_kept;                          // the block's largest kept id, or -1
};

// The survivors block 0 finishes alone (finish_in_block0): each block's list
// and block 0's gathered copy.
constexpr int kGather = 256;  // at most kSampleThreads: a survivor a thread
struct Gathered {
  float x[kGather];  // this block's kept x, in id order
  int id[kGather];
  int n, total;
  int counts[kSampleSplitWide];
  float gx[kGather];  // block 0: the cluster's, in id order, then p
  int gid[kGather];
  float p[kGather];
  uint16_t order[kGather];  // by p descending, id ascending
  uint8_t kept[kGather];
};

// The cluster pieces below compile from sm_90 on (the kernel is empty before).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Every block's value `own` (thread 0's) into s.gathered[r], in rank order:
// one remote read per block and thread 0..S−1.
template <int S>
__device__ const double* cluster_gather(double own, SampleShared<S>& s, cg::cluster_group& cluster, int& round) {
  const int r = round & 1;
  ++round;
  if (threadIdx.x == 0) s.block[r] = own;
  cluster.sync();  // every block's value is written; the other buffer's readers are done
  if (threadIdx.x < S) s.gathered[r][threadIdx.x] = cluster.map_shared_rank(&s, threadIdx.x)->block[r];
  __syncthreads();
  return s.gathered[r];
}

// The block's total of v over its threads (thread 0 gets it): a fixed
// shuffle tree per warp, the warps in order.
template <int S, class Op>
__device__ double block_total(double v, Op op, double init, SampleShared<S>& s, int r) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (threadIdx.x % 32 == 0) s.slot[r][threadIdx.x / 32] = v;
  __syncthreads();
  double b = init;
  if (threadIdx.x == 0)
    for (int w = 0; w < kSampleWarps; ++w) b = op(b, s.slot[r][w]);
  return b;
}

// The cluster's sum of v (every thread of every block gets it), the blocks
// added in rank order.
template <int S>
__device__ double cluster_sum(double v, SampleShared<S>& s, cg::cluster_group& cluster, int& round) {
  auto add = [](double a, double b) { return a + b; };
  const double* g = cluster_gather(block_total(v, add, 0.0, s, round & 1), s, cluster, round);
  double total = 0.0;
#pragma unroll
  for (int k = 0; k < S; ++k) total += g[k];
  return total;
}
template <int S>
__device__ float cluster_max(float v, SampleShared<S>& s, cg::cluster_group& cluster, int& round) {
  auto mx = [](double a, double b) { return fmax(a, b); };
  const double* g = cluster_gather(block_total(double(v), mx, -INFINITY, s, round & 1), s, cluster, round);
  double m = -INFINITY;
#pragma unroll
  for (int k = 0; k < S; ++k) m = fmax(m, g[k]);
  return static_cast<float>(m);
}
// The sum over the blocks of lower rank of each block's `own` (thread 0's).
template <int S>
__device__ double cluster_prefix(double own, SampleShared<S>& s, cg::cluster_group& cluster, int& round) {
  const double* g = cluster_gather(own, s, cluster, round);
  double before = 0.0;
  for (unsigned k = 0; k < cluster.block_rank(); ++k) before += g[k];
  return before;
}
// Exclusive prefix of v over the block's threads in order (threads hold
// consecutive ids); the block's total to *total.
__device__ double block_exclusive(double v, double* total) {
  __shared__ double warp_tot[kSampleWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double incl = v;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const double o = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += o;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kSampleWarps; ++w) {
    if (w < warp) before += warp_tot[w];
    all += warp_tot[w];
  }
  *total = all;
  __syncthreads();  // warp_tot is reused by the next call
  return before + incl - v;
}

constexpr int kWays = 8;  // the key search splits its range in 8 per round: 11 rounds for 32 bits

// The largest key v such that the kept values with order_key >= v weigh at
// least `target` (weight 1 each, or the value itself when weighted), over
// the cluster; *at_lo: what they weigh (`all`: every kept value). With a
// window, the first such v found where at most `window` values lie at or
// above it (not the largest then; weighted, where their mass over v's own
// weight is at most `window`; *n_at_lo: that bound, or the count). Each
// round weighs 7 thresholds splitting [lo, hi] at once (f32 within a
// thread, f64 across threads, the blocks in rank order).
template <int E, int S>
__device__ uint32_t search_key(const float* v, uint64_t keep, bool weighted, double target, double all,
                               double* at_lo, SampleShared<S>& s, cg::cluster_group& cluster, int& round,
                               double window = 0.0, double* n_at_lo = nullptr) {
  uint32_t lo = 0, hi = 0xffffffffu;
  double lo_weight = all;                         // what the values at or above lo weigh
  double lo_count = weighted ? INFINITY : all;    // how many they are at most
  while (lo < hi) {
    uint32_t t[kWays];  // t[0] = lo; t[j] the j-th threshold above it
    const uint64_t span = uint64_t(hi) - lo + 1;
#pragma unroll
    for (int j = 0; j < kWays; ++j) t[j] = lo + uint32_t((span * j + kWays - 1) / kWays);
    float w[kWays] = {};
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const uint32_t k = order_key(v[e]);
      const bool in = ((keep >> e) & 1u) && k >= t[1];
      // Once the range narrows most values lie below it: a warp whose lanes
      // all do skips the thresholds together (a branch, not predicated work).
      if (!__any_sync(0xffffffffu, in)) continue;
      const float we = !in ? 0.0f : weighted ? v[e] : 1.0f;
#pragma unroll
      for (int j = 1; j < kWays; ++j) w[j] += k >= t[j] ? we : 0.0f;
    }
    const int r = round & 1;
    ++round;
#pragma unroll
    for (int j = 1; j < kWays; ++j) {
      double d = w[j];
      if (weighted) {
#pragma unroll
        for (int off = 16; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
      } else {  // counts: exact in f32 (at most 32 · 64 a warp)
        float f = w[j];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) f += __shfl_xor_sync(0xffffffffu, f, off);
        d = f;
      }
      if (threadIdx.x % 32 == 0) s.ways[r][j][threadIdx.x / 32] = d;
    }
    __syncthreads();
    if (threadIdx.x >= 1 && threadIdx.x < kWays) {
      double b = 0.0;
      for (int wp = 0; wp < kSampleWarps; ++wp) b += s.ways[r][threadIdx.x][wp];
      s.ways_block[r][threadIdx.x] = b;
    }
    cluster.sync();  // every block's weights are written; the other buffer's readers are done
    // Thread j adds threshold j's weights over the blocks, in rank order.
    if (threadIdx.x >= 1 && threadIdx.x < kWays) {
      double total = 0.0;
#pragma unroll
      for (int k = 0; k < S; ++k) total += cluster.map_shared_rank(&s, k)->ways_block[r][threadIdx.x];
      s.ways_total[r][threadIdx.x] = total;
    }
    __syncthreads();
    int best = 0;  // the highest threshold still weighing enough (t[0] = lo always does)
#pragma unroll
    for (int j = 1; j < kWays; ++j)
      if (t[j] > t[j - 1] && s.ways_total[r][j] >= target) best = j;
    const uint32_t new_hi = best + 1 < kWays && t[best + 1] > t[best] ? t[best + 1] - 1 : hi;
    if (best > 0) {  // weighted: each value at or above t[best] weighs at least key_float(t[best])
      lo_weight = s.ways_total[r][best];
      lo_count = !weighted ? lo_weight : lo_weight / double(key_float(t[best]));
    }
    lo = t[best];
    hi = new_hi;
    if (lo_count <= window) break;  // few enough at or above lo: the caller finishes exactly
  }
  *at_lo = lo_weight;
  if (n_at_lo) *n_at_lo = lo_count;
  return lo;
}


// u in [0, 1) for row r's draw, from the seed, the row and its salt (the
// row's position with a feed).
__device__ double draw_u(const SampleArgs& a, int64_t r) {
  const uint64_t salt = a.feed.positions ? uint64_t(uint32_t(a.feed.positions[r])) : uint64_t(a.salt);
  const uint64_t bits =
      dev::mix64(a.seed ^
                 dev::mix64(0x9e3779b97f4a7c15ull * (uint64_t(r) + 1) ^ dev::mix64(salt + 0x632be59bd9b4e019ull)));
  return double(bits >> 11) * 0x1.0p-53;
}

// Few survivors (at most kGather, as when the top-k search stops early):
// every block lists its kept values in id order, block 0 takes the lists
// and finishes the row alone, a survivor a thread: the exact top-k among
// them (ties at the k-th kept), the softmax, top-p by rank (p descending,
// id ascending: the CPU's order), min-p and the draw in id order. Replaces
// the last top-k rounds, top-p's 11 and the cluster sums after them.
template <int E, int S>
__device__ void finish_in_block0(const SampleArgs& a, int64_t r, const float* x, uint64_t keep, int64_t id0,
                                 float mx, double z_all, SampleShared<S>& s, Gathered& g,
                                 cg::cluster_group& cluster) {
  double listed = 0.0;
  int at = int(block_exclusive(double(__popcll(keep)), &listed));
#pragma unroll
  for (int e = 0; e < E; ++e)
    if ((keep >> e) & 1u) g.x[at] = x[e], g.id[at] = int(id0 + e), ++at;
  if (threadIdx.x == 0) g.n = int(listed);
  cluster.sync();  // every block's list is written
  if (cluster.block_rank() == 0) {
    if (threadIdx.x < S) g.counts[threadIdx.x] = cluster.map_shared_rank(&g, threadIdx.x)->n;
    __syncthreads();
    int n = 0, k = 0, base = 0;
    for (int b = 0; b < S; ++b) n += g.counts[b];
    if (int(threadIdx.x) < n) {
      while (int(threadIdx.x) >= base + g.counts[k]) base += g.counts[k++];
      const Gathered* o = cluster.map_shared_rank(&g, k);
      g.gx[threadIdx.x] = o->x[threadIdx.x - base], g.gid[threadIdx.x] = o->id[threadIdx.x - base];
    }
    if (threadIdx.x == 0) g.total = n;
  }
  cluster.sync();  // block 0 has read every list: the others may leave
  if (cluster.block_rank() != 0) return;
  const int n = g.total, t = threadIdx.x;
  const bool have = t < n;
  const float x_t = have ? g.gx[t] : -INFINITY;
  const bool given_p = z_all >= 0.0;  // the values are p already, the row's softmax sum z_all
  bool kept = have;
  if (!given_p && a.top_k > 0 && n > a.top_k) {  // the search stopped early: the exact top-k, ties kept
    int greater = 0;
    for (int q = 0; q < n; ++q) greater += g.gx[q] > x_t;
    kept = have && greater < a.top_k;
  }
  const float p = !kept ? 0.f : given_p ? x_t : expf(x_t - mx);
  double z = z_all;
  double n_kept = 0.0;
  block_exclusive(double(kept), &n_kept);
  if (!given_p) block_exclusive(double(p), &z);
  if (a.top_p < 1.0f) {  // kept while the mass before a token (in the order above) is short of top_p · z
    if (have) g.p[t] = kept ? p : -1.0f;  // below every kept p, equal to none
    __syncthreads();
    if (kept) {
      int rank = 0;
      for (int q = 0; q < n; ++q) rank += g.p[q] > p || (g.p[q] == p && q < t);
      g.order[rank] = uint16_t(t);
    }
    __syncthreads();
    const bool sorted = t < int(n_kept);
    const float ps = sorted ? g.p[g.order[t]] : 0.f;  // thread t: the t-th in that order
    double total = 0.0;
    const double before = block_exclusive(double(ps), &total);
    if (sorted) g.kept[g.order[t]] = t == 0 || before < double(a.top_p) * z;
    __syncthreads();
    kept = kept && g.kept[t];
  }
  if (a.min_p > 0.0f && p < a.min_p) kept = false;  // the largest p is exp(0) = 1
  const float pk = kept ? p : 0.f;
  double mass = 0.0;
  const double start = block_exclusive(double(pk), &mass);
  const double target = draw_u(a, r) * mass;
  if (t == 0) s.found = -1, s.last_kept = -1;
  __syncthreads();
  if (kept) {
    atomicMax(&s.last_kept, g.gid[t]);
    if (start <= target && target < start + pk) s.found = g.gid[t];
  }
  __syncthreads();
  if (t == 0) write_pick(a.next, a.feed, r, s.found >= 0 ? s.found : s.last_kept >= 0 ? s.last_kept : 0);
}

#endif  // __CUDA_ARCH__ >= 900

template <int S, int E>
__global__ void __launch_bounds__(kSampleThreads) sample_pick_kernel(SampleArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ SampleShared<S> s;
  __shared__ Gathered g;
  cg::cluster_group cluster = cg::this_cluster();
  allow_next_grid();
  wait_prior_grid();  // the logits come from the previous kernel
  int round = 0;
  const int64_t r = blockIdx.y;
  const int64_t per = int64_t(kSampleThreads) * E;
  const int64_t id0 = int64_t(cluster.block_rank()) * per + int64_t(threadIdx.x) * E;
  const float* row = a.logits + r * a.vocab;
  float x[E];
  uint64_t keep = 0;  // bit e: id0 + e survives so far
  auto kept = [&](int e) { return ((keep >> e) & 1u) != 0; };
  int n_mine = 0;
  // The run's loads all in flight at once: 16-byte loads where the run is whole and aligned.
  if (id0 + E <= a.vocab && (reinterpret_cast<uintptr_t>(row + id0) & 15) == 0) {
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(row + id0 + e));
      x[e] = q.x, x[e + 1] = q.y, x[e + 2] = q.z, x[e + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = id0 + e < a.vocab ? __ldg(row + id0 + e) : -INFINITY;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float v = (id0 + e < a.vocab ? penalized(a.penalty, r, id0 + e, x[e]) : x[e]) * a.inv_temperature;
    const bool ok = v > -INFINITY;  // NaN and -inf never survive (as the CPU's candidate list)
    keep |= uint64_t(ok) << e;
    x[e] = ok ? v : -INFINITY;
    n_mine += ok;
  }
  float local_max = -INFINITY;
#pragma unroll
  for (int e = 0; e < E; ++e) local_max = fmaxf(local_max, x[e]);
  const float mx = cluster_max(local_max, s, cluster, round);
  const double n_valid = cluster_sum(double(n_mine), s, cluster, round);
  // top-k: the largest key v with at least k keys >= v (the k-th largest x).
  double n_kept = n_valid;
  if (a.top_k > 0 && double(a.top_k) < n_valid) {
    // Stops once at most kGather are at or above lo: block 0 then finds the k-th largest among them.
    const uint32_t lo = search_key<E>(x, keep, /*weighted=*/false, double(a.top_k), n_valid, &n_kept, s, cluster,
                                      round, a.top_k <= kGather ? double(kGather) : 0.0);
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (order_key(x[e]) < lo) keep &= ~(uint64_t(1) << e);
  }
  if (n_kept <= kGather) {  // the same in every block
    finish_in_block0<E>(a, r, x, keep, id0, mx, -1.0, s, g, cluster);
    return;
  }
  float* p = x;  // x becomes p = exp(x − max) in place (the registers of one array)
  float mine_f = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    p[e] = kept(e) ? expf(x[e] - mx) : 0.f;
    mine_f += p[e];
  }
  double mine = mine_f;
  double z = cluster_sum(mine, s, cluster, round);
  // top-p: the largest p (as a key) whose tokens at or above it hold top_p of the mass; among the tokens at
  // exactly that p, the first ones in id order until the mass is reached.
  if (a.top_p < 1.0f) {
    const double target = double(a.top_p) * z;
    // Stops once at most kGather tokens can hold the mass at or above lo: block 0 then takes the exact cut.
    double at_lo = 0.0, n_at_lo = 0.0;
    const uint32_t lo = search_key<E>(p, keep, /*weighted=*/true, target, z, &at_lo, s, cluster, round,
                                      double(kGather), &n_at_lo);
    if (n_at_lo <= kGather) {  // the same in every block
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (order_key(p[e]) < lo) keep &= ~(uint64_t(1) << e);
      finish_in_block0<E>(a, r, p, keep, id0, mx, z, s, g, cluster);
      return;
    }
    double above = 0.0;
    int ties = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (!kept(e)) continue;
      const uint32_t k = order_key(p[e]);
      if (k > lo) above += p[e];
      ties += k == lo;
    }
    above = cluster_sum(above, s, cluster, round);
    // Ties at the threshold: the first j in id order, j the fewest that reach the target (at least one).
    const double tau = key_float(lo);
    const int j = int(fmax(1.0, tau > 0.0 ? ceil((target - above) / tau) : 1.0));
    double tie_total = 0.0;
    const double tie_before = block_exclusive(double(ties), &tie_total);
    int rank = int(tie_before + cluster_prefix(tie_total, s, cluster, round));
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (!kept(e)) continue;
      const uint32_t k = order_key(p[e]);
      if (k < lo || (k == lo && rank++ >= j)) keep &= ~(uint64_t(1) << e);
    }
  }
  // min-p: the largest p is exp(0) = 1.
  if (a.min_p > 0.0f) {
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (p[e] < a.min_p) keep &= ~(uint64_t(1) << e);
  }
  mine = 0.0;
  int last = -1;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (kept(e)) mine += p[e], last = int(id0 + e);
  z = cluster_sum(mine, s, cluster, round);
  // The draw: u in [0, 1) from the seed, the row and its salt; the first kept id whose running mass passes u·z.
  const double target = draw_u(a, r) * z;
  double block_mass = 0.0;
  const double before = block_exclusive(mine, &block_mass);
  if (threadIdx.x == 0) s.found = -1, s.last_kept = -1;
  __syncthreads();
  const double start = cluster_prefix(block_mass, s, cluster, round) + before;
  int warp_last = last;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) warp_last = max(warp_last, __shfl_xor_sync(0xffffffffu, warp_last, off));
  if (threadIdx.x % 32 == 0 && warp_last >= 0) atomicMax(&s.last_kept, warp_last);
  if (start <= target && target < start + mine) {
    double acc = start;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (!kept(e)) continue;
      acc += p[e];
      if (target < acc) {
        s.found = int(id0 + e);
        break;
      }
    }
  }
  cluster.sync();  // every block's found / last_kept is written
  if (cluster.block_rank() == 0 && threadIdx.x == 0) {
    int id = -1, fallback = -1;
    for (unsigned k = 0; k < cluster.num_blocks(); ++k) {
      const SampleShared<S>* o = cluster.map_shared_rank(&s, k);
      if (id < 0 && o->found >= 0) id = o->found;
      if (o->last_kept >= 0) fallback = o->last_kept;
    }
    if (id < 0) id = fallback >= 0 ? fallback : 0;  // rounding past the last survivor: the CPU takes the last too
    write_pick(a.next, a.feed, r, id);
  }
  cluster.sync();  // no block leaves while block 0 reads its shared memory
#endif
}

// Allows the wide kernels' non-portable cluster on device, once; the wide
// split where one such cluster can be resident, else kSampleSplit.
int sample_split(int device) {
  static int split[64] = {};  // by device; a racing first fill computes the same value
  if (device < 0 || device >= 64) return kSampleSplit;
  if (split[device] != 0) return split[device];
  int wide = kSampleSplitWide;
  auto allow = [&](auto kernel) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) wide = 0;
  };
  allow(sample_pick_kernel<kSampleSplitWide, 8>);
  allow(sample_pick_kernel<kSampleSplitWide, 16>);
  allow(sample_pick_kernel<kSampleSplitWide, 32>);
  allow(sample_pick_kernel<kSampleSplitWide, 64>);
  if (wide != 0) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kSampleSplitWide;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(kSampleSplitWide);
    cfg.blockDim = dim3(kSampleThreads);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, sample_pick_kernel<kSampleSplitWide, 64>, &cfg) != cudaSuccess ||
        clusters < 1)
      wide = 0;
  }
  cudaGetLastError();  // a refused attribute or query leaves nothing behind
  split[device] = wide != 0 ? wide : kSampleSplit;
  return split[device];
}

}  // namespace

Status sample_pick(CudaContext& ctx, const SampleArgs& a) {
  LATHE_TRY(check_pick("cuda sample_pick: ", a.logits, a.next, a.rows, a.vocab, a.feed));
  if (!(a.inv_temperature > 0.0f) || a.top_k < 0 || !(a.top_p > 0.0f && a.top_p <= 1.0f) ||
      !(a.min_p >= 0.0f && a.min_p <= 1.0f))
    return invalid_argument("cuda sample_pick: inv_temperature must be > 0, top_k >= 0, top_p in (0, 1], min_p in "
                            "[0, 1]");
  if (!supports_overlap(ctx.device())) return unsupported("cuda sample_pick: needs sm_90 (thread block clusters)");
  if (a.rows == 0) return Status::ok();
  const int split = sample_split(ctx.device());
  const int64_t row_threads = int64_t(split) * kSampleThreads;
  const int64_t per_thread = (a.vocab + row_threads - 1) / row_threads;
  if (per_thread > 64)
    return unsupported("cuda sample_pick: a vocabulary of ", a.vocab, " (at most ", row_threads * 64, ")");
  const cudaStream_t st = stream_of(ctx);
  const dim3 grid(unsigned(split), unsigned(a.rows));
  auto go = [&](auto kernel) {
    return cuda_check(launch_overlapped_cluster(kernel, grid, dim3(kSampleThreads), unsigned(split), st, a.overlap, a),
                      "sample_pick launch");
  };
  auto by_ids = [&](auto split_c) {
    constexpr int S = decltype(split_c)::value;
    if (per_thread <= 8) return go(sample_pick_kernel<S, 8>);
    if (per_thread <= 16) return go(sample_pick_kernel<S, 16>);
    if (per_thread <= 32) return go(sample_pick_kernel<S, 32>);
    return go(sample_pick_kernel<S, 64>);
  };
  if (split == kSampleSplitWide) return by_ids(std::integral_constant<int, kSampleSplitWide>{});
  return by_ids(std::integral_constant<int, kSampleSplit>{});
}

}  // namespace lathe::cuda
