// The persistent decode step (decode_persistent.h): one launch runs every
// layer's stages and the LM head; grid-wide barriers stand where kernel
// boundaries stood.
//
// Why: at batch 1 on a small model each kernel boundary of the decode step
// costs a few microseconds (the last blocks' ragged end, the next kernel's
// ramp-up) and the attention leaves DRAM idle for its whole run; measured
// on Llama-3.2-1B, 47.5 us per layer against 28.3 us of weights. Here each
// block's producer warp walks the weights of every stage of every layer in
// order (gemv_ring.cuh: bulk copies into the block's ring, a slot refilled
// once the consumers free it). The weights never depend on activations, so
// the producer is never told about barriers: while the consumers wait at
// one, or run the attention, the ring fills with the next stage's rows.
//
// Grid: exactly the blocks that are resident at once (the occupancy API, at
// most two per SM: two 96 KiB rings fill an SM), so a block spinning at a
// barrier never keeps another from being scheduled. The barrier is a
// counter in global memory: each block's first consumer thread adds one
// (a release: it publishes its block's writes) and spins until the counter
// reaches the barrier's number times the grid (then an acquire); the last block out
// of the kernel resets it for the next launch. Activations written during
// the kernel are read through L2 (ld.global.cg), never the read-only path.
//
// Stages per layer: q|k|v with RMSNorm folded in and RoPE + KV append in
// the epilogue; attention; o + residual; RMSNorm + gate|up + SwiGLU; down
// + residual. The GEMV stages are gemv_ring.cuh's consumer loop with each
// block owning columns [C·i/G, C·(i+1)/G), as the ring GEMV's blocks do, so
// each output is bitwise what gemv() on the ring gives for the same input.
// The attention splits each (sequence, head)'s keys over up to 2·SMs /
// heads blocks (not the rows nor the grid: a sequence's result does not
// depend on the batch); each block's 256 consumer threads take a key
// per head_dim / 8 lanes, the block's key groups merge in shared memory,
// and the last block of a (sequence, head) to finish (a count in the
// workspace, as attention_decode.cu) merges the splits with log-sum-exp
// weights.
//
// Measured on the H200 (batch 1): correct (the CPU's logits and greedy
// tokens within the tolerances, bitwise across graph replay, launch modes
// and batch sizes) but about half the speed of the kernel-per-stage step:
// Llama-3.2-1B 572-645 tok/s against 1,145, 8B 121-149 against 256. The
// per-stage trace (bench_generate_cuda's "persistent step stages") shows
// every block's GEMV work, not the barriers (~1 us each) nor their skew,
// taking ~2.2x the standalone kernels' time, at one block per SM as at two
// (a first build ran one: 112 registers, and registers go to warps in
// fours). Changed since, not yet measured: x loads cached in L1 without
// the barrier's spin invalidating it on every poll, and a one-stage GEMV
// loading x once. L2 prefetch of the weights ahead of the ring
// (CudaModelOptions::decode_l2_ahead) measured slower (484 vs 572 tok/s).
// So the step stays opt-in (CudaModelOptions::persistent_decode).
#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_persistent.h"
#include "backends/cuda/gemv_ring.cuh"

namespace lathe::cuda {
namespace {

using namespace ring;

constexpr int kMaxSplits = 64;   // the workspace record of attention_decode.cu
constexpr int kMinKeys = 32;     // keys per attention block at least
constexpr int kAttnBatch = 4;    // key groups whose K/V rows one attention thread loads at once
constexpr int kMaxBlocksPerSm = 2;
constexpr int kRingKibOnePerSm = 192;  // the default ring of the one-block-per-SM kernel
constexpr int kMaxSlots = 6;           // 192 KiB: with the static shared memory, under the SM's 227 KiB
// Registers per thread that let two blocks of kBulkThreads share an SM:
// registers go to warps in groups of four, so a block of 9 warps holds the
// registers of 12 (65536 / (2 · 384), rounded down to 8). Measured: at 112
// the occupancy API, rightly, gave one block per SM.
constexpr int kMaxRegisters = 80;
constexpr float kLog2e = 1.4426950408889634f;
constexpr long long kBarrierTimeoutCycles = 20'000'000'000LL;  // ~10 s at 2 GHz

__host__ __device__ constexpr int64_t record_floats(int d) { return int64_t(kMaxSplits) * (d + 2) + 1; }

// GemvArgs as raw shared storage (its default member initializers forbid a
// __shared__ GemvArgs), filled by n threads from the stage list with the
// step's rows.
struct alignas(16) ArgsSlot {
  unsigned char bytes[sizeof(GemvArgs)];
  __device__ const GemvArgs& get() const { return *reinterpret_cast<const GemvArgs*>(bytes); }
};
__device__ __forceinline__ void load_args(ArgsSlot& dst, const GemvArgs* src, int rows, int tid, int n) {
  static_assert(sizeof(GemvArgs) % 4 == 0 && offsetof(GemvArgs, rows) % 8 == 0);
  constexpr int kWords = sizeof(GemvArgs) / 4, kRows = offsetof(GemvArgs, rows) / 4;
  const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst.bytes);
  for (int i = tid; i < kWords; i += n) d[i] = i == kRows ? uint32_t(rows) : i == kRows + 1 ? 0u : __ldg(s + i);
}

// The barrier's spin reads relaxed and acquires once (a fence) when it has
// seen the count: an acquire per read invalidates the SM's L1 each time
// (CCTL.IVALL), which the other block on the SM reads its x from.
__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#endif
  return v;
}
// One arrival that publishes the block's writes (the consumers synced before it).
__device__ __forceinline__ void arrive_release(unsigned* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
#endif
}
__device__ __forceinline__ void fence_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
}

__device__ __forceinline__ void trace_event(const PersistentDecodeArgs& p, int event) {
  if (!p.trace || threadIdx.x != 0) return;
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  p.trace[int64_t(event) * gridDim.x + blockIdx.x] = ns;
}

// Barrier number `epoch` (1, 2, ...) of this launch, for the consumer
// threads. A barrier still open after ~10 s of clock cycles means a block
// was never scheduled (the grid outgrew what is resident): the kernel traps,
// so the step fails with an error instead of hanging.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned epoch) {
  consumers_sync();
  if (threadIdx.x == 0) {
    arrive_release(counter);
    const unsigned target = epoch * gridDim.x;
    const long long start = clock64();
    while (ld_relaxed(counter) < target) {
      if (clock64() - start > kBarrierTimeoutCycles) __trap();
    }
    fence_acquire();
  }
  consumers_sync();
}

template <int D>
struct AttnScratch {
  static constexpr int kLanes = D / 8, kGroups = kConsumers / kLanes;
  float o[kGroups][D];
  float m[kGroups], l[kGroups];
  float split_m[kMaxSplits], split_l[kMaxSplits];
  int last;
};

// The log-sum-exp merge of (sequence t, head h)'s n splits into out.
template <int D>
__device__ void merge_splits(const float* rec, int n, bf16_bits* out, AttnScratch<D>& s) {
  for (int i = threadIdx.x; i < n; i += kConsumers) {
    s.split_m[i] = __ldcg(rec + i * (D + 2) + D);
    s.split_l[i] = __ldcg(rec + i * (D + 2) + D + 1);
  }
  consumers_sync();
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = fmaxf(mx, s.split_m[i]);
  const float base = mx == -INFINITY ? 0.f : mx;
  for (int d = threadIdx.x; d < D; d += kConsumers) {
    float acc = 0.f, sum = 0.f;
#pragma unroll 8
    for (int i = 0; i < n; ++i) {
      const float w = exp2f(s.split_m[i] - base);
      acc += __ldcg(rec + i * (D + 2) + d) * w;
      sum += s.split_l[i] * w;
    }
    dev::st(out, d, sum > 0.f ? acc / sum : 0.f);
  }
}

// One block's share of one split: keys [j_begin, j_end) of (sequence t,
// head h) into its record slot, the last split's block merging.
template <int D>
__device__ void attend_split(const GemvRope& r, const PersistentDecodeArgs& p, int t, int h, int split, int n_used,
                             int j_begin, int j_end, AttnScratch<D>& s) {
  constexpr int kLanes = AttnScratch<D>::kLanes, kGroups = AttnScratch<D>::kGroups;
  const int grp = threadIdx.x / kLanes, d0 = threadIdx.x % kLanes * 8, hk = h / (r.n_head / r.n_head_kv);
  const bf16_bits* k_rows = r.k_caches[t];
  const bf16_bits* v_rows = r.v_caches[t];
  float q[8], o[8] = {};
  {
    float raw[8];
    unpack8(__ldcg(reinterpret_cast<const uint4*>(r.q_out + (int64_t(t) * r.n_head + h) * D + d0)), raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = raw[i] * p.scale * kLog2e;
  }
  float m = -INFINITY, l = 0.f;
  // kBatch key groups' K and V rows in flight at once (one load latency for
  // up to kBatch·kGroups keys: under the weights' stream each costs microseconds).
  for (int jb = j_begin; jb < j_end; jb += kGroups * kAttnBatch) {  // the same trip count for every thread
    uint4 kr[kAttnBatch], vr[kAttnBatch];
#pragma unroll
    for (int i = 0; i < kAttnBatch; ++i) {
      const int j = jb + i * kGroups + grp;
      kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
      if (j >= j_end) continue;
      const int64_t off = (int64_t(j) * r.n_head_kv + hk) * D + d0;
      kr[i] = __ldcg(reinterpret_cast<const uint4*>(k_rows + off));
      vr[i] = __ldcg(reinterpret_cast<const uint4*>(v_rows + off));
    }
#pragma unroll
    for (int i = 0; i < kAttnBatch; ++i) {
      if (jb + i * kGroups >= j_end) break;  // the same for every thread: the shuffles stay converged
      const int j = jb + i * kGroups + grp;
      float kf[8], vf[8];
      unpack8(kr[i], kf);
      unpack8(vr[i], vf);
      float sc = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) sc += q[e] * kf[e];
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2) sc += __shfl_xor_sync(0xffffffffu, sc, off);
      if (j >= j_end) continue;
      if (sc > m) {
        const float alpha = exp2f(m - sc);
        l *= alpha;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] *= alpha;
        m = sc;
      }
      const float pr = exp2f(sc - m);
      l += pr;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] += pr * vf[e];
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) s.o[grp][d0 + i] = o[i];
  if (threadIdx.x % kLanes == 0) s.m[grp] = m, s.l[grp] = l;
  consumers_sync();
  float* rec = p.workspace + (int64_t(t) * r.n_head + h) * record_floats(D);
  float mx = -INFINITY;
  for (int g = 0; g < kGroups; ++g) mx = fmaxf(mx, s.m[g]);
  const float base = mx == -INFINITY ? 0.f : mx;
  float* dst = rec + split * (D + 2);
  for (int d = threadIdx.x; d < D; d += kConsumers) {
    float acc = 0.f;
    for (int g = 0; g < kGroups; ++g) acc += s.o[g][d] * exp2f(s.m[g] - base);
    dst[d] = acc;
  }
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int g = 0; g < kGroups; ++g) sum += s.l[g] * exp2f(s.m[g] - base);
    dst[D] = mx;
    dst[D + 1] = sum;
  }
  __threadfence();  // this block's record is visible to every block before it is counted
  consumers_sync();
  int* count = reinterpret_cast<int*>(rec + kMaxSplits * (D + 2));
  if (threadIdx.x == 0) s.last = atomicAdd(count, 1) == n_used - 1;
  consumers_sync();
  if (s.last) {
    __threadfence();
    if (threadIdx.x == 0) atomicExch(count, 0);  // for the next layer and the next launch
    merge_splits<D>(rec, n_used, p.attn_out + (int64_t(t) * r.n_head + h) * D, s);
  }
  consumers_sync();  // s is reused by the next item
}

// Keys [j_begin, j_end) of item `item` of (sequence, head, split), or
// false when the item has no keys.
struct AttnItem {
  int t, h, split, n_used, j_begin, j_end;
};
__device__ __forceinline__ bool attn_item(const GemvRope& r, const PersistentDecodeArgs& p, int splits, int item,
                                          AttnItem* it) {
  it->split = item % splits;
  const int pair = item / splits;
  it->t = pair / r.n_head, it->h = pair % r.n_head;
  const int pos = r.pos[it->t];
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int len = pos + 1 - lo;
  const int chunk = max(p.min_keys > 0 ? p.min_keys : kMinKeys, (len + splits - 1) / splits);
  it->n_used = (len + chunk - 1) / chunk;
  it->j_begin = lo + it->split * chunk;
  it->j_end = min(pos + 1, it->j_begin + chunk);
  return it->split < it->n_used;
}

// Before the q|k|v stage's barrier: the K and V rows of this block's
// attention items are pulled into L2 (the rows of earlier steps are final;
// the one this step appends is written to L2 over the prefetched line), so
// the attention after the barrier does not wait on DRAM under the weights' stream.
template <int D>
__device__ __noinline__ void prefetch_keys(const GemvRope& r, const PersistentDecodeArgs& p, int splits) {
  constexpr int kLines = D * 2 / 128;  // 128-byte lines per K or V row
  const int n_items = p.rows * r.n_head * splits;
  for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
    AttnItem it;
    if (!attn_item(r, p, splits, item, &it)) continue;
    const int hk = it.h / (r.n_head / r.n_head_kv);
    const bf16_bits* rows[2] = {r.k_caches[it.t], r.v_caches[it.t]};
    const int n = (it.j_end - it.j_begin) * 2 * kLines;
    for (int i = threadIdx.x; i < n; i += kConsumers) {
      const int j = it.j_begin + i / (2 * kLines), kv = i / kLines % 2, line = i % kLines;
      const bf16_bits* at = rows[kv] + (int64_t(j) * r.n_head_kv + hk) * D + line * 64;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
    }
  }
}

// The attention of every (sequence, head), items (sequence, head, split)
// dealt to the blocks in turn.
template <int D>
__device__ __noinline__ void attention_stage(const GemvRope& r, const PersistentDecodeArgs& p, int splits,
                                             AttnScratch<D>& s) {
  const int n_items = p.rows * r.n_head * splits;
  for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
    AttnItem it;
    if (attn_item(r, p, splits, item, &it))
      attend_split<D>(r, p, it.t, it.h, it.split, it.n_used, it.j_begin, it.j_end, s);
  }
}

// The producer warp: every GEMV stage's units in the consumers' order.
__device__ void produce_all(const PersistentDecodeArgs& p, const Ring& ring, ArgsSlot& slot) {
  RingPos pos;
  const int lane = threadIdx.x & 31;
  auto stage = [&](int i, auto e) {
    __syncwarp();
    load_args(slot, p.gemvs + i, p.rows, lane, 32);
    __syncwarp();
    int64_t c_begin, c_end;
    block_columns(slot.get(), &c_begin, &c_end);
    produce_units<decltype(e)::value>(slot.get(), c_begin, c_end, ring, pos, p.l2_ahead);
  };
  using E = GemvEpilogue;
  for (int l = 0; l < p.n_layer; ++l) {
    stage(4 * l, std::integral_constant<E, E::kRopeAppend>{});
    stage(4 * l + 1, std::integral_constant<E, E::kAddF32>{});
    stage(4 * l + 2, std::integral_constant<E, E::kSwigluF32>{});
    stage(4 * l + 3, std::integral_constant<E, E::kAddF32>{});
  }
  stage(4 * p.n_layer, std::integral_constant<E, E::kStoreF32>{});
}

// One GEMV stage's consumer loop, compiled on its own: inlined into the
// step's body it shared the registers with everything live across the
// stages and kept its sums in local memory.
template <int B, GemvEpilogue E>
__device__ __noinline__ void consume_stage(const GemvArgs& a, const Ring& ring, RingPos& pos, RingSums<B>& s) {
  int64_t c_begin, c_end;
  block_columns(a, &c_begin, &c_end);
  consume_units<B, E, true>(a, c_begin, c_end, ring, pos, s);
}

// The step's body, for the kernels below.
template <int B, int D>
__device__ __forceinline__ void run_step(const PersistentDecodeArgs& p, int n_slots, int splits) {
  extern __shared__ __align__(128) unsigned char s_ring[];
  __shared__ __align__(8) uint64_t s_full[kMaxStages], s_empty[kMaxStages];
  __shared__ RingSums<B> s_sums;
  __shared__ AttnScratch<D> s_attn;
  __shared__ ArgsSlot s_args[2];  // the consumers', the producer's
  const Ring ring = make_ring(s_ring, s_full, s_empty, n_slots);
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    produce_all(p, ring, s_args[1]);
    return;
  }
  wait_prior_grid();  // h, the RoPE tables and positions come from the kernels before
  trace_event(p, 10 * p.n_layer + 1);
  RingPos pos;
  unsigned epoch = 0;
  const GemvArgs& a = s_args[0].get();
  auto barrier = [&] {
    if (p.gemv_only) return;
    trace_event(p, 2 * int(epoch));
    grid_barrier(p.barrier, ++epoch);
    trace_event(p, 2 * int(epoch) - 1);
  };
  auto gemv_work = [&](int i, auto e) {
    // The previous stage's last epilogue threads may still read its args:
    // a barrier's sync covers that, a GEMV-only run (no barriers) needs this.
    if (p.gemv_only) consumers_sync();
    load_args(s_args[0], p.gemvs + i, p.rows, threadIdx.x, kConsumers);
    consumers_sync();
    consume_stage<B, decltype(e)::value>(a, ring, pos, s_sums);
  };
  auto gemv_stage = [&](int i, auto e) {
    gemv_work(i, e);
    barrier();
  };
  using E = GemvEpilogue;
  for (int l = 0; l < p.n_layer; ++l) {
    gemv_work(4 * l, std::integral_constant<E, E::kRopeAppend>{});
    if (!p.gemv_only) {
      prefetch_keys<D>(a.rope, p, splits);
      barrier();
      attention_stage<D>(a.rope, p, splits, s_attn);
      barrier();
    }
    gemv_stage(4 * l + 1, std::integral_constant<E, E::kAddF32>{});
    gemv_stage(4 * l + 2, std::integral_constant<E, E::kSwigluF32>{});
    gemv_stage(4 * l + 3, std::integral_constant<E, E::kAddF32>{});
  }
  if (p.gemv_only) consumers_sync();
  load_args(s_args[0], p.gemvs + 4 * p.n_layer, p.rows, threadIdx.x, kConsumers);
  consumers_sync();
  consume_stage<B, E::kStoreF32>(a, ring, pos, s_sums);
  trace_event(p, 10 * p.n_layer);
  // Every block has passed every barrier once all have counted themselves here: the last resets both counters.
  if (threadIdx.x == 0 && atomicAdd(p.barrier + 1, 1u) == gridDim.x - 1) {
    atomicExch(p.barrier, 0u);
    atomicExch(p.barrier + 1, 0u);
  }
}

// One sequence: two blocks per SM (registers capped so that they fit, two
// 96 KiB rings fill the SM). Two to four: the products of four x rows need
// more registers than two blocks leave, so one block per SM with a larger ring.
template <int D>
__global__ void __maxnreg__(kMaxRegisters)
    decode_persistent_kernel_x2(PersistentDecodeArgs p, int n_slots, int splits) {
  run_step<1, D>(p, n_slots, splits);
}
template <int B, int D>
__global__ void __launch_bounds__(kBulkThreads, 1)
    decode_persistent_kernel_x1(PersistentDecodeArgs p, int n_slots, int splits) {
  run_step<B, D>(p, n_slots, splits);
}

using KernelFn = void (*)(PersistentDecodeArgs, int, int);

template <int D>
KernelFn kernel_for_rows(int rows) {
  if (rows == 1) return decode_persistent_kernel_x2<D>;
  if (rows == 2) return decode_persistent_kernel_x1<2, D>;
  return decode_persistent_kernel_x1<4, D>;
}

// The expected epilogue of stage i of n_layer layers.
GemvEpilogue stage_epilogue(int i, int n_layer) {
  using E = GemvEpilogue;
  if (i == 4 * n_layer) return E::kStoreF32;
  constexpr E kOrder[4] = {E::kRopeAppend, E::kAddF32, E::kSwigluF32, E::kAddF32};
  return kOrder[i % 4];
}

Status check_stages(const PersistentDecodeArgs& a, const GemvArgs* g) {
  const char* kName = "cuda decode_persistent: ";
  const GemvRope& r0 = g[0].rope;
  for (int i = 0; i <= 4 * a.n_layer; ++i) {
    const GemvArgs& s = g[i];
    if (s.epilogue != stage_epilogue(i, a.n_layer))
      return invalid_argument(kName, "stage ", i, " has epilogue ", int(s.epilogue), ", expected ",
                              int(stage_epilogue(i, a.n_layer)));
    if (s.n <= 0 || s.k <= 0 || (!s.x && !s.x_f32) || !s.w || (!s.out && s.epilogue != GemvEpilogue::kRopeAppend))
      return invalid_argument(kName, "stage ", i, ": bad shape or null argument");
    if (!gemv_supports(s.x_f32 ? s.w : s.x, s.w, s.k) ||
        (s.x_f32 && (reinterpret_cast<uintptr_t>(s.x_f32) & 15)) ||
        (s.norm_w && (reinterpret_cast<uintptr_t>(s.norm_w) & 15)))
      return invalid_argument(kName, "stage ", i, ": k (", s.k, ") must be a multiple of 8 and x, w 16-byte aligned");
    if (s.epilogue == GemvEpilogue::kRopeAppend) {
      const GemvRope& r = s.rope;
      if (r.head_dim != r0.head_dim || r.n_head != r0.n_head || r.n_head_kv != r0.n_head_kv || r.n_head_kv <= 0 ||
          r.n_head % r.n_head_kv != 0 || s.n != int64_t(r.n_head + 2 * r.n_head_kv) * r.head_dim || !r.q_out ||
          !r.k_caches || !r.v_caches || !r.pos || !r.cos || !r.sin)
        return invalid_argument(kName, "stage ", i, ": bad RoPE fields");
    }
  }
  return Status::ok();
}

// The kernel, ring and blocks per SM (at most kMaxBlocksPerSm, from the
// occupancy API) of a step: worked out once per device, head_dim, rows and
// ring, before any capture (decode_persistent_prepare), as a captured step
// must not set kernel attributes.
struct LaunchPlan {
  KernelFn kernel = nullptr;
  int slots = 0;
  size_t smem = 0;
  int per_sm = 0;
};
Result<LaunchPlan> plan_launch(int device, int head_dim, int rows, int ring_kib) {
  struct Entry {
    int device, head_dim, rows, ring_kib;
    LaunchPlan plan;
  };
  static std::mutex mu;
  static std::vector<Entry> known;
  std::lock_guard<std::mutex> lock(mu);
  for (const Entry& e : known)
    if (e.device == device && e.head_dim == head_dim && e.rows == rows && e.ring_kib == ring_kib) return e.plan;
  LaunchPlan p;
  p.kernel = head_dim == 64 ? kernel_for_rows<64>(rows) : kernel_for_rows<128>(rows);
  const int kib = ring_kib > 0 ? ring_kib : rows == 1 ? kGemvBulkRingKib : kRingKibOnePerSm;
  p.slots = std::clamp(kib * 1024 / kStageBytes, 2, kMaxSlots);
  p.smem = size_t(p.slots) * kStageBytes;
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(p.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kMaxSlots * kStageBytes),
                       "decode_persistent attribute"));
  LATHE_TRY(cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p.per_sm, p.kernel, kBulkThreads, p.smem),
                       "decode_persistent occupancy"));
  p.per_sm = std::min(p.per_sm, kMaxBlocksPerSm);
  if (p.per_sm < 1) return unsupported("cuda decode_persistent: a ", kib, " KiB ring leaves no block resident");
  known.push_back({device, head_dim, rows, ring_kib, p});
  return p;
}

}  // namespace

bool decode_persistent_supported(int device, int head_dim) {
  return (head_dim == 64 || head_dim == 128) && gemv_detail::has_bulk_copies(device);
}

int decode_persistent_grid(int device, int head_dim, int rows, int ring_kib) {
  if (!decode_persistent_supported(device, head_dim) || rows < 1 || rows > 4) return 0;
  auto plan = plan_launch(device, head_dim, rows, ring_kib);
  return plan.is_ok() ? plan->per_sm * gemv_detail::sm_count(device) : 0;
}

Status decode_persistent_prepare(int device, int head_dim, int rows, int ring_kib) {
  if (!decode_persistent_supported(device, head_dim))
    return unsupported("cuda decode_persistent: needs sm_90 and head_dim 64 or 128 (head_dim ", head_dim, ")");
  if (rows < 1 || rows > 4) return invalid_argument("cuda decode_persistent: rows ", rows, " (1..4)");
  return plan_launch(device, head_dim, rows, ring_kib).status();
}

Status decode_persistent(CudaContext& ctx, const PersistentDecodeArgs& a, const GemvArgs* host_gemvs) {
  const char* kName = "cuda decode_persistent: ";
  if (a.rows < 1 || a.rows > 4 || a.n_layer < 1)
    return invalid_argument(kName, "rows ", a.rows, " (1..4) or n_layer ", a.n_layer, " out of range");
  if (!a.gemvs || !host_gemvs || !a.attn_out || !a.workspace || !a.barrier || a.window < 0 || a.min_keys < 0 ||
      a.l2_ahead < 0)
    return invalid_argument(kName, "null argument, or negative window, min_keys or l2_ahead");
  LATHE_TRY(check_stages(a, host_gemvs));
  const int head_dim = host_gemvs[0].rope.head_dim, device = ctx.device();
  if (!decode_persistent_supported(device, head_dim))
    return unsupported(kName, "needs sm_90 and head_dim 64 or 128 (head_dim ", head_dim, ")");
  LATHE_ASSIGN_OR_RETURN(const LaunchPlan plan, plan_launch(device, head_dim, a.rows, a.ring_kib));
  // Key splits per (sequence, head): from the SM count and heads only, so
  // that a sequence's attention does not depend on the batch's size.
  const int n_head = host_gemvs[0].rope.n_head;
  const int splits = std::clamp(kMaxBlocksPerSm * gemv_detail::sm_count(device) / n_head, 1, kMaxSplits);
  // Every block must be resident at once: the grid barrier waits for all of them.
  const dim3 grid(static_cast<unsigned>(plan.per_sm * gemv_detail::sm_count(device)));
  LATHE_TRY(cuda_check(launch_overlapped_smem(plan.kernel, grid, dim3(kBulkThreads), plan.smem, stream_of(ctx),
                                              a.overlap, a, plan.slots, splits),
                       "decode_persistent launch"));
  return ctx.check_launch("decode_persistent");
}

}  // namespace lathe::cuda
