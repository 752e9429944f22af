// One decode step of one sequence as one persistent kernel (decode_fused.h).
//
// Why: the kernel-per-stage step (gemv_bulk.cu's ring GEMVs, the decode
// attention, programmatic dependent launches) leaves the DRAM idle at every
// boundary: a kernel's blocks start streaming only once the previous
// kernel's have left the SM, and the attention streams almost nothing.
// Measured on the H200 with the outputs made wrong on purpose, that step
// stays at 84-85% of the bandwidth floor at Llama-3.2-1B even with no
// stage waiting for another (bench/RESULTS.md). Here one block per SM runs
// the whole step: its producer warp streams the weights of every GEMV of
// every layer through the block's ring (gemv_ring.cuh) one after the other
// and never waits for an activation, so the ring keeps filling while the
// consumers wait for a stage's inputs.
//
// Order: one counter. Every block adds one to it when it has finished a
// stage (the epilogue warp after its last tile of a GEMV; the consumer
// warps after their attention work), and a stage's consumers start once the
// counter has reached the stage's index times the grid: every block has
// finished every earlier stage. Stage s's signals therefore all precede
// stage s + 1's. The block adding the step's last signal sets it back to
// zero. Each writer fences before it counts and one consumer thread polls
// with acquire loads before the block's consumers sync, so what a stage
// reads from an earlier one (written by other blocks of this kernel) is
// read with ordinary loads, which the memory model orders after that
// acquire, or through L2 (ld.global.cg), never through the read-only path,
// whose lines may be stale within a kernel. Each role copies a stage's
// arguments into registers once: read from the table after every wait,
// each field was an L2 round trip in a chain (the q|k|v stage's epilogue
// tail 5.5 → 1.9 us).
//
// The producer keeps at most DecodeFusedArgs::in_flight units requested and
// not landed. With the whole ring requested, a block's last units of one
// stage queue in DRAM behind every block's requests for the next, and the
// whole grid waits for them. (H200, 2026-12-01, eight 1B layers of the four
// GEMVs with a grid barrier before each (bench --chain 1): 35.2 us a layer
// with the ring requested at once, 32.4 with two units in flight, against
// 33.6 as a ring kernel each.)
//
// The attention: block b takes kv head b / P's chunk b mod P of the
// context (P = grid / n_head_kv), the chunk at least kMinKeys keys; its
// consumer threads take head_dim / 8 lanes per key and every query head of
// the group (K and V rows read once for them), a running max, sum and
// output per key slot, merged over the warp's slots by shuffles and over
// the warps in shared memory. The rows older than the step are loaded
// before the stage waits for q. Each block writes its chunk's partial
// result and counts itself in the group's count; the block that completes
// the count merges the chunks (log-sum-exp weights, in chunk order) and
// writes the group's heads.
//
// Measured (H200, 2026-12-01, bench_generate_cuda, prompt 512, 256 tokens,
// CUDA graphs): Llama-3.2-1B 1,048.6 tok/s (61% of the floor) against
// 1,362.0 for the kernel-per-stage step; 8B 211.7 against 271.8. So it is
// off by default (CudaModelOptions::fused_decode). Where the time goes
// (LATHE_CUDA_FUSED_TRACE, 1B, us per layer, the stage's wall from the last
// signal of the stage before to its own last): q|k|v 7.7 (its weights'
// floor at 4.3 TB/s 2.9), attention 10.4, o 5.1 (1.95), gate|up 18.6
// (15.6), down 9.7 (7.8); LM head 128 (122). Every stage waits ~0.4-0.7 us
// for the count to be seen, then for its slowest block and that block's
// epilogue (the signals of one stage spread over 0.7-2 us, 14 at the LM
// head). With the outputs made wrong on purpose: no attention 1,256 tok/s;
// no stage waiting 1,256; neither 1,570 (91% of the floor). The ring (192
// KiB an SM, ~6 us of the SM's share of the DRAM) hides only that much of
// a layer's chain of waits (five all-to-all stages, each two or three L2
// round trips of ~1 us under the weight stream, and the attention's
// five), so the DRAM idles for the rest. Two blocks per SM (96 KiB rings,
// 96 registers, spilling): 556.5 tok/s.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/cuda/decode_fused.h"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/gemv_ring.cuh"

namespace lathe::cuda {
namespace {

using namespace ring;

constexpr int kFusedSlots = 6;  // 192 KiB of ring; the attention's scratch and the sums beside
constexpr int kMaxGroup = 4;    // query heads per kv head at most
constexpr int kAttnMax = kMaxGroup * 128;
constexpr int kMinKeys = 16;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void stamp(unsigned long long* trace, int s, int what) {
  if (trace) trace[(int64_t(s) * gridDim.x + blockIdx.x) * 3 + what] = now_ns();
}

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void wait_count(const unsigned* counter, unsigned target) {
  while (ld_acquire(counter) < target) {
  }
}

template <int kWidth>  // query heads of a group × head_dim at most
struct AttnScratch {
  float o[kConsumerWarps][kWidth];
  float m[kConsumerWarps][kMaxGroup], l[kConsumerWarps][kMaxGroup];
  int last;
};

// This block's attention item: kv head g (−1: none), chunk c of n_chunks,
// keys [j0, j1); the same for every layer of the step (the position is the step's).
struct AttnItem {
  int g = -1, c = 0, G = 0, j0 = 0, j1 = 0, n_chunks = 0, pos = 0, per_group = 1;
};
__device__ __forceinline__ AttnItem plan_item(const FusedAttention& p) {
  AttnItem it;
  it.per_group = static_cast<int>(gridDim.x) / p.n_head_kv;
  const int g = static_cast<int>(blockIdx.x) / it.per_group, c = static_cast<int>(blockIdx.x) % it.per_group;
  if (g >= p.n_head_kv) return it;
  const int pos = p.pos[0];
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int n = pos + 1 - lo;
  const int chunk = max(kMinKeys, (n + it.per_group - 1) / it.per_group);
  it.n_chunks = (n + chunk - 1) / chunk;
  if (c >= it.n_chunks) return it;
  it.g = g, it.c = c, it.G = p.n_head / p.n_head_kv, it.pos = pos;
  it.j0 = lo + c * chunk, it.j1 = min(pos + 1, it.j0 + chunk);
  return it;
}

// The K and V chunks of a thread's first kPreRounds keys older than the
// step, loaded before the stage waits for the q|k|v projection (they were
// written by earlier steps): the newest row alone is read after the wait.
constexpr int kPreRounds = 2;
struct KvPre {
  uint4 k[kPreRounds], v[kPreRounds];
};
template <int D>
__device__ __forceinline__ void prefetch_kv(const FusedAttention& p, const AttnItem& it, KvPre& pre) {
  constexpr int L = D / 8, kSlots = kConsumers / L;
  const int key = threadIdx.x / L, d0 = threadIdx.x % L * 8;
#pragma unroll
  for (int r = 0; r < kPreRounds; ++r) {
    const int j = it.j0 + r * kSlots + key;
    pre.k[r] = pre.v[r] = make_uint4(0, 0, 0, 0);
    if (j < it.j1 && j < it.pos) {
      const int64_t row = (int64_t(j) * p.n_head_kv + it.g) * D + d0;
      pre.k[r] = __ldcg(reinterpret_cast<const uint4*>(p.k_cache + row));
      pre.v[r] = __ldcg(reinterpret_cast<const uint4*>(p.v_cache + row));
    }
  }
}

// The attention item of this block (see the top), by the consumer threads.
template <int D, int kWidth>
__device__ void attention_item(const FusedAttention& p, const AttnItem& it, const KvPre& pre,
                               AttnScratch<kWidth>& sc) {
  constexpr int L = D / 8, kSlots = kConsumers / L, kMaxG = kMaxGroup;
  if (it.g < 0) return;
  const int g = it.g, c = it.c, G = it.G, j0 = it.j0, j1 = it.j1, n_chunks = it.n_chunks;
  const int t = threadIdx.x, key = t / L, d0 = t % L * 8, warp = t >> 5, lane = t & 31;
  const float q_scale = p.scale * 1.4426950408889634f;  // scores in log2 units
  float q[kMaxG][8], o[kMaxG][8], m[kMaxG], l[kMaxG];
#pragma unroll
  for (int h = 0; h < kMaxG; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[h][i] = 0.0f, q[h][i] = 0.0f;
    if (h < G) {
      unpack8(__ldcg(reinterpret_cast<const uint4*>(p.q + int64_t(g * G + h) * D + d0)), q[h]);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[h][i] *= q_scale;
    }
  }
  // One round: key jb + key of every key slot; every lane runs every round (the shuffles).
  auto round = [&](int jb, bool have, const uint4& kp, const uint4& vp) {
    const int j = jb + key;
    const bool valid = j < j1;
    float kf[8] = {}, vf[8] = {};
    if (valid) {
      if (have && j < it.pos) {
        unpack8(kp, kf), unpack8(vp, vf);
      } else {
        const int64_t row = (int64_t(j) * p.n_head_kv + g) * D + d0;
        unpack8(__ldcg(reinterpret_cast<const uint4*>(p.k_cache + row)), kf);
        unpack8(__ldcg(reinterpret_cast<const uint4*>(p.v_cache + row)), vf);
      }
    }
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {
      if (h >= G) break;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) s = fmaf(q[h][i], kf[i], s);
#pragma unroll
      for (int off = L / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (!valid) continue;
      const float mn = fmaxf(m[h], s), corr = exp2f(m[h] - mn), pr = exp2f(s - mn);
      l[h] = fmaf(l[h], corr, pr);
#pragma unroll
      for (int i = 0; i < 8; ++i) o[h][i] = fmaf(o[h][i], corr, pr * vf[i]);
      m[h] = mn;
    }
  };
  static_assert(kPreRounds == 2, "the prefetched rounds below");
  if (j0 < j1) round(j0, true, pre.k[0], pre.v[0]);
  if (j0 + kSlots < j1) round(j0 + kSlots, true, pre.k[1], pre.v[1]);
  for (int jb = j0 + kPreRounds * kSlots; jb < j1; jb += kSlots) round(jb, false, pre.k[0], pre.v[0]);
  // The warp's key slots merged (lanes L apart hold the same dims).
#pragma unroll
  for (int off = L; off < 32; off <<= 1) {
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {
      if (h >= G) break;
      const float mo = __shfl_xor_sync(0xffffffffu, m[h], off), lo2 = __shfl_xor_sync(0xffffffffu, l[h], off);
      const float mn = fmaxf(m[h], mo);
      const float a = m[h] == -INFINITY ? 0.0f : exp2f(m[h] - mn), b = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
      l[h] = l[h] * a + lo2 * b;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[h][i] = o[h][i] * a + __shfl_xor_sync(0xffffffffu, o[h][i], off) * b;
      m[h] = mn;
    }
  }
  if (lane < L) {
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {
      if (h >= G) break;
#pragma unroll
      for (int i = 0; i < 8; ++i) sc.o[warp][h * D + d0 + i] = o[h][i];
      if (lane == 0) sc.m[warp][h] = m[h], sc.l[warp][h] = l[h];
    }
  }
  consumers_sync();
  // The block's partial result over its chunk: the warps merged in order.
  float* records = p.part + int64_t(g * it.per_group) * G * (D + 2);
  for (int e = t; e < G * D; e += kConsumers) {
    const int h = e / D, d = e % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) mx = fmaxf(mx, sc.m[w][h]);
    float acc = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) {
      const float a = sc.m[w][h] == -INFINITY ? 0.0f : exp2f(sc.m[w][h] - mx);
      acc = fmaf(sc.o[w][e], a, acc);
      sum = fmaf(sc.l[w][h], a, sum);
    }
    float* rec = records + int64_t(c * G + h) * (D + 2);
    rec[d] = acc;
    if (d == 0) rec[D] = mx, rec[D + 1] = sum;
  }
  __threadfence();
  consumers_sync();
  if (t == 0) sc.last = atomicAdd(&p.counts[g], 1u) == unsigned(n_chunks - 1);
  consumers_sync();
  if (!sc.last) return;
  // The group's last chunk to finish: every chunk merged in chunk order, a
  // running max, the loads of several chunks in flight at once.
  for (int e = t; e < G * D; e += kConsumers) {
    const int h = e / D, d = e % D;
    float mx = -INFINITY, acc = 0.0f, sum = 0.0f;
#pragma unroll 16
    for (int k = 0; k < n_chunks; ++k) {
      const float* rec = records + int64_t(k * G + h) * (D + 2);
      const float mk = __ldcg(rec + D), lk = __ldcg(rec + D + 1), ok = __ldcg(rec + d);
      const float mn = fmaxf(mx, mk), a = exp2f(mx - mn), b = exp2f(mk - mn);
      acc = acc * a + ok * b, sum = sum * a + lk * b, mx = mn;
    }
    dev::st(p.out, int64_t(g * G + h) * D + d, sum > 0.0f ? acc / sum : 0.0f);
  }
  if (t == 0) p.counts[g] = 0u;  // for the next layer, several stages later
}

// f(std::integral_constant<GemvEpilogue, E>{}) for the stages' epilogues.
template <class F>
__device__ __forceinline__ void with_stage_epilogue(GemvEpilogue e, F&& f) {
  using E = GemvEpilogue;
  switch (e) {
    case E::kRopeAppend: f(std::integral_constant<E, E::kRopeAppend>{}); break;
    case E::kAddF32: f(std::integral_constant<E, E::kAddF32>{}); break;
    case E::kSwigluF32: f(std::integral_constant<E, E::kSwigluF32>{}); break;
    default: f(std::integral_constant<E, E::kStoreF32>{}); break;
  }
}

// kPerSm blocks per SM: one with a 192 KiB ring, or two with 96 KiB each
// (and attention groups up to 256 wide).
template <int kPerSm>
__global__ void __launch_bounds__(kBulkThreads, kPerSm)
    decode_fused_kernel(const DecodeStage* __restrict__ stages, int n_stages, unsigned* counter,
                        const __grid_constant__ GemvPick pick, int in_flight,
                        unsigned long long* trace) {
  extern __shared__ __align__(128) unsigned char s_ring[];
  constexpr int kSlots = kPerSm == 1 ? kFusedSlots : kFusedSlots / 2;
  __shared__ __align__(8) uint64_t s_full[kSlots], s_empty[kSlots];
  __shared__ RingSums<1> s_sums;
  __shared__ AttnScratch<kAttnMax / kPerSm> s_attn;
  const unsigned grid = gridDim.x;
  if (threadIdx.x == kProducer0) s_sums.init();
  const Ring ring = make_ring(s_ring, s_full, s_empty, kSlots, kProducer0);
  int64_t c_begin, c_end;
  if (threadIdx.x >= kEpilogue0) {
    const int lane = threadIdx.x & 31;
    ring_ready_wait();
    wait_prior_grid();  // the epilogues read the step's inputs (positions, RoPE tables, token bits)
    SumPos<RingSums<1>::kSumSlots> sp;
    for (int s = 0; s < n_stages; ++s) {
      const DecodeStage& st = stages[s];
      if (st.kind == DecodeStageKind::kGemv) {
        // The arguments in registers, loaded together once: read from the
        // table after every wait, each is an L2 round trip in a chain.
        GemvArgs a = st.gemv;
        if (st.take_pick) a.pick = pick;
        block_columns(a, &c_begin, &c_end);
        if (c_begin >= c_end) wait_count(counter, unsigned(s) * grid);  // no tile: count only after stage s − 1
        with_stage_epilogue(a.epilogue,
                            [&](auto e) { finish_tiles<1, decltype(e)::value>(a, c_begin, c_end, s_sums, sp); });
        __threadfence();
        __syncwarp();
        if (lane == 0) stamp(trace, s, 2);
        if (lane == 0 && atomicAdd(counter, 1u) + 1 == unsigned(n_stages) * grid) atomicExch(counter, 0u);
      }
    }
    return;
  }
  if (threadIdx.x >= kProducer0) {
    __syncwarp();
    ring_ready_arrive();
    RingPos pos;
    for (int s = 0; s < n_stages; ++s) {
      const DecodeStage& st = stages[s];
      if (st.kind != DecodeStageKind::kGemv) continue;
      const GemvArgs a = st.gemv;  // in registers, not reloaded from global memory after every wait
      block_columns(a, &c_begin, &c_end);
      with_stage_epilogue(a.epilogue, [&](auto e) {
        produce_units<decltype(e)::value>(a, c_begin, c_end, ring, pos, in_flight);
      });
    }
    return;
  }
  ring_ready_wait();
  wait_prior_grid();  // the first stage's x comes from the step's inputs
  RingPos pos;
  SumPos<RingSums<1>::kSumSlots> sp;
  for (int s = 0; s < n_stages; ++s) {
    const DecodeStage& st = stages[s];
    FusedAttention at;
    AttnItem item;
    KvPre pre;
    if (st.kind == DecodeStageKind::kAttention) {  // before the wait: the plan and the older K/V rows
      at = st.attention;
      item = plan_item(at);
      if (item.g >= 0) {
        if (at.head_dim == 64) prefetch_kv<64>(at, item, pre);
        else prefetch_kv<128>(at, item, pre);
      }
    }
    if (s > 0) {
      if (threadIdx.x == 0) wait_count(counter, unsigned(s) * grid);
      consumers_sync();
    }
    if (threadIdx.x == 0) stamp(trace, s, 0);
    if (st.kind == DecodeStageKind::kGemv) {
      const GemvArgs a = st.gemv;
      block_columns(a, &c_begin, &c_end);
      with_stage_epilogue(a.epilogue, [&](auto e) {
        consume_units<1, decltype(e)::value, true>(a, c_begin, c_end, ring, pos, s_sums, sp);
      });
      if (threadIdx.x == 0) stamp(trace, s, 1);
      continue;
    }
    if (at.head_dim == 64) attention_item<64>(at, item, pre, s_attn);
    else attention_item<128>(at, item, pre, s_attn);
    __threadfence();
    consumers_sync();
    if (threadIdx.x == 0) stamp(trace, s, 1), stamp(trace, s, 2), atomicAdd(counter, 1u);
  }
}

// LATHE_CUDA_FUSED_TRACE=1: the 50th eager step's timestamps (the blocks'
// globaltimer as each stage's consumers start and end and as each block
// counts itself), summarized by stage of a layer on stderr. A diagnostic.
void print_trace(const std::vector<unsigned long long>& tr, int n_stages, int grid) {
  auto at = [&](int s, int b, int w) { return double(tr[(size_t(s) * grid + b) * 3 + w]); };
  const char* names[5] = {"qkv", "attn", "o", "gu", "down"};
  double dur[6] = {}, spread[6] = {}, lag_first[6] = {}, lag_last[6] = {}, wall[6] = {};
  int count[6] = {};
  for (int s = 1; s < n_stages; ++s) {
    const int kind = s == n_stages - 1 ? 5 : s % 5;
    double d = 0, smin = 1e30, smax = 0, st_min = 1e30, st_max = 0, prev_max = 0;
    for (int b = 0; b < grid; ++b) {
      d += at(s, b, 1) - at(s, b, 0);
      smin = std::min(smin, at(s, b, 2)), smax = std::max(smax, at(s, b, 2));
      st_min = std::min(st_min, at(s, b, 0)), st_max = std::max(st_max, at(s, b, 0));
      prev_max = std::max(prev_max, at(s - 1, b, 2));
    }
    dur[kind] += d / grid, spread[kind] += smax - smin, lag_first[kind] += st_min - prev_max;
    lag_last[kind] += st_max - prev_max, wall[kind] += smax - prev_max, ++count[kind];
  }
  std::fprintf(stderr,
               "fused trace (us, mean over layers): stage | consumers' time | signals' spread | first start after "
               "the last signal before | last start | stage wall\n");
  for (int k = 0; k < 6; ++k) {
    if (!count[k]) continue;
    const double n = count[k] * 1e3;
    std::fprintf(stderr, "  %s | %.2f | %.2f | %.2f | %.2f | %.2f\n", k == 5 ? "lm head" : names[k], dur[k] / n,
                 spread[k] / n, lag_first[k] / n, lag_last[k] / n, wall[k] / n);
  }
  std::fprintf(stderr, "  step: %.1f us\n", (at(n_stages - 1, 0, 2) - at(0, 0, 0)) / 1e3);
  std::fflush(stderr);
}

}  // namespace

bool decode_fused_supports(int n_head, int n_head_kv, int head_dim, int device) {
  if (!has_bulk_copies(device) || n_head_kv <= 0 || n_head % n_head_kv != 0) return false;
  if (head_dim != 64 && head_dim != 128) return false;
  return n_head / n_head_kv <= kMaxGroup && n_head_kv <= sm_count(device);
}

int64_t decode_fused_part_floats(int device) {
  // Per block its group's records: G · (head_dim + 2) floats, at most kAttnMax / per_sm + 2 · kMaxGroup.
  return int64_t(sm_count(device)) * std::max(kAttnMax + 2 * kMaxGroup, 2 * (kAttnMax / 2 + 2 * kMaxGroup));
}

Status decode_fused(CudaContext& ctx, const DecodeFusedArgs& a) {
  if (!a.stages || a.n_stages < 1 || !a.counter) return invalid_argument("cuda decode_fused: no stages or no counter");
  if (a.blocks_per_sm != 1 && a.blocks_per_sm != 2)
    return invalid_argument("cuda decode_fused: blocks_per_sm ", a.blocks_per_sm, " is not 1 or 2");
  const int slots = a.blocks_per_sm == 1 ? kFusedSlots : kFusedSlots / 2;
  if (a.in_flight < 1 || a.in_flight > slots)
    return invalid_argument("cuda decode_fused: in_flight ", a.in_flight, " is outside [1, ", slots, "]");
  if (a.attention_width < 1 || a.attention_width > kAttnMax / a.blocks_per_sm)
    return invalid_argument("cuda decode_fused: attention groups ", a.attention_width, " wide; at most ",
                            kAttnMax / a.blocks_per_sm, " at ", a.blocks_per_sm, " blocks per SM");
  const int device = ctx.device();
  if (!has_bulk_copies(device)) return unsupported("cuda decode_fused: needs sm_90+ (bulk copies)");
  static bool raised[64][2] = {};
  if (device < 0 || device >= 64) return invalid_argument("cuda decode_fused: device ", device);
  auto* kernel = a.blocks_per_sm == 1 ? decode_fused_kernel<1> : decode_fused_kernel<2>;
  const size_t smem = size_t(slots) * kStageBytes;
  if (!raised[device][a.blocks_per_sm - 1]) {
    LATHE_CU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised[device][a.blocks_per_sm - 1] = true;
  }
  // Every block must be resident at once (they wait for each other): a cooperative launch.
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(a.blocks_per_sm * sm_count(device)));
  cfg.blockDim = dim3(kBulkThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream_of(ctx);
  cfg.attrs = attrs;
  cfg.numAttrs = a.overlap ? 2 : 1;
  static const bool trace_on = [] {
    const char* v = std::getenv("LATHE_CUDA_FUSED_TRACE");
    return v && std::atoi(v) > 0;
  }();
  static unsigned long long* trace = nullptr;
  static int calls = 0;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(cfg.stream, &cap);
  const bool tracing = trace_on && cap == cudaStreamCaptureStatusNone && ++calls == 50;
  const size_t trace_n = size_t(a.n_stages) * cfg.gridDim.x * 3;
  if (tracing && !trace) LATHE_CU_TRY(cudaMalloc(&trace, trace_n * 8));
  LATHE_TRY(cuda_check(cudaLaunchKernelEx(&cfg, kernel, a.stages, a.n_stages, a.counter, a.pick,
                                          a.in_flight, tracing ? trace : nullptr),
                       "decode_fused launch"));
  if (tracing) {
    std::vector<unsigned long long> host(trace_n);
    LATHE_CU_TRY(cudaMemcpyAsync(host.data(), trace, trace_n * 8, cudaMemcpyDeviceToHost, cfg.stream));
    LATHE_CU_TRY(cudaStreamSynchronize(cfg.stream));
    print_trace(host, a.n_stages, int(cfg.gridDim.x));
  }
  return Status::ok();
}

}  // namespace lathe::cuda
