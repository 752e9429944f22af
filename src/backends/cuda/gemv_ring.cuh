// The shared-memory weight ring of the skinny GEMM (gemv_bulk.cu) as device
// pieces: the producer warp and the consumer loop, for the ring kernel of
// one GEMV and for the persistent chain diagnostic (both gemv_bulk.cu).
//
// The ring: S slots of one unit each (8 weight rows × 2048 k, 32 KiB), a
// "full" mbarrier per slot (the bulk copies' byte count) and an "empty" one
// (the 8 consumer warps' arrivals). A producer warp issues the units of one
// GEMV after another (RingPos carries the slot and its fill round from one
// GEMV to the next), refilling a slot once the consumers emptied it; the
// consumers take the units in the same order. Nothing in the producer reads
// what an earlier kernel or stage writes, so it runs ahead of the consumers
// by the whole ring (after its first unit, which it asks for alone and waits
// to land unless GemvArgs::ring_fill_at_once: gemv_bulk.cu says why), or
// with GemvArgs::ring_in_flight by that many units requested and not
// landed (the decode step's default at one sequence: 2).
//
// Thread t sums chunks t, t + 256, ... of each row (k in order), each warp
// adds its lanes in a fixed exchange (warp_sum8) and hands its tile sums to
// an epilogue warp (RingSums: a few tiles' slots with full and empty
// mbarriers), which adds the warps in order and finishes the tile while the
// consumers go on to the next units: the sums depend neither on the number
// of x rows nor on the grid or the ring. Compiled to the bulk copies from sm_90 on;
// below, the PTX helpers are empty (the host never launches them there).
#pragma once

#include <cstdint>

#include "backends/cuda/gemv_common.cuh"
#include "backends/cuda/pick_common.cuh"

namespace lathe::cuda::ring {

using namespace gemv_detail;

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kProducer0 = kConsumers;        // the producer warp's first thread
constexpr int kEpilogue0 = kConsumers + 32;   // the epilogue warp's
constexpr int kBulkThreads = kConsumers + 64;  // + the producer and epilogue warps
constexpr int kBulkRows = 8;                   // weight rows per tile
constexpr int kStageK = kConsumers * 8;        // k per stage: a 16-byte chunk per consumer thread and row
constexpr int kStageBytes = kBulkRows * kStageK * 2;
constexpr int kMaxStages = 7;                  // 224 KiB
constexpr int kMaxRingBytes = kMaxStages * kStageBytes;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
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
// bytes (a multiple of 16) from global src into L2; nothing waits for it.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  LATHE_BULK_ASM("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// The ring's barriers are initialized: the producer warp arrives (and goes
// on to its copies), the consumer and epilogue warps wait.
__device__ __forceinline__ void ring_ready_arrive() { asm volatile("bar.arrive 2, %0;" ::"n"(kBulkThreads) : "memory"); }
__device__ __forceinline__ void ring_ready_wait() { asm volatile("bar.sync 2, %0;" ::"n"(kBulkThreads) : "memory"); }

// The ring's shared memory: slot data and the two barriers per slot.
struct Ring {
  uint32_t data, full, empty;
  int n_slots;
};
// Thread init_thread initializes the barriers; the caller syncs the
// threads that use them after.
__device__ __forceinline__ Ring make_ring(const void* data, const uint64_t* full, const uint64_t* empty, int n_slots,
                                          int init_thread = 0) {
  const Ring r{smem_addr(data), smem_addr(full), smem_addr(empty), n_slots};
  if (threadIdx.x == init_thread) {
    for (int i = 0; i < n_slots; ++i) {
      mbar_init(r.full + 8 * i, 1);
      mbar_init(r.empty + 8 * i, kConsumerWarps);
    }
    fence_barrier_init();
  }
  return r;
}

// Where a party (producer or consumers) stands in the ring: the next
// unit's slot, that slot's fill round parity and the units passed so far.
struct RingPos {
  int slot = 0;
  uint32_t parity = 0;
  int64_t units = 0;
  __device__ void next(int n_slots) {
    ++units;
    if (++slot == n_slots) slot = 0, parity ^= 1;
  }
};

// A GEMV's units in order: the stage of k and the tile's first output column.
template <GemvEpilogue E>
struct UnitCursor {
  static constexpr int64_t kTileCols = tile_columns<kBulkRows, E>();
  int64_t u0;
  int stage = 0;
  __device__ void next(int k_stages) {
    if (++stage == k_stages) stage = 0, u0 += kTileCols;
  }
};

// Block blockIdx.x's equal run [c_begin, c_end) of a's output columns
// (pairs). In 32 bits where columns × grid fits (every model's shapes; the
// same quotients): a 64-bit division is a software routine on the path
// from a block's start to its first copy. H200, 2026-12-01, timestamps in
// the blocks: this step 0.26-0.35 → 0.22-0.29 us; the same call's 1B
// decode 1,245-1,260 → 1,263-1,272 tok/s (3 runs each, alternating).
__device__ __forceinline__ void block_columns(const GemvArgs& a, int64_t* c_begin, int64_t* c_end) {
  const int64_t columns = gemv_columns(a);
  if (columns * gridDim.x <= int64_t(UINT32_MAX)) {
    const uint32_t c = static_cast<uint32_t>(columns);
    *c_begin = c * blockIdx.x / gridDim.x;
    *c_end = c * (blockIdx.x + 1) / gridDim.x;
    return;
  }
  *c_begin = columns * blockIdx.x / gridDim.x;
  *c_end = columns * (blockIdx.x + 1) / gridDim.x;
}
__device__ __forceinline__ int k_stages_of(const GemvArgs& a) {
  return static_cast<int>((a.k + kStageK - 1) / kStageK);
}
template <GemvEpilogue E>
__device__ __forceinline__ int64_t units_of(int64_t c_begin, int64_t c_end, int k_stages) {
  constexpr int64_t kTileCols = tile_columns<kBulkRows, E>();
  return (c_end - c_begin + kTileCols - 1) / kTileCols * k_stages;
}

// The x chunk a consumer thread needs for one unit, as loaded (bf16 or f32,
// and the norm weights' chunk), so its loads are in flight during the
// previous unit's products.
template <int B>
struct XRaw {
  uint4 v[B][2];  // bf16: v[b][0]; f32: two float4 as bits
  uint4 norm;
};
__device__ __forceinline__ uint4 ld_x(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
template <int B>
__device__ __forceinline__ void load_x(const GemvArgs& a, int rows, int64_t c, XRaw<B>& x) {
  if (c >= a.k / 8) return;
#pragma unroll
  for (int b = 0; b < B; ++b) {
    if (b >= rows) break;
    if (a.x_f32) {
      const uint4* p = reinterpret_cast<const uint4*>(a.x_f32 + int64_t(b) * a.k + c * 8);
      x.v[b][0] = ld_x(p), x.v[b][1] = ld_x(p + 1);
    } else {
      x.v[b][0] = ld_x(a.x + int64_t(b) * a.k + c * 8);
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

// The producer warp: the units of a's columns [c_begin, c_end) (a lane per
// weight row), each slot refilled once the consumers have emptied it. With
// in_flight > 0 (at most the ring's slots count) it keeps at most that many
// units requested and not landed, from the first unit on; else it waits
// for the first unit alone (GemvArgs::ring_fill_at_once aside). Returns the
// number of units.
template <GemvEpilogue E>
__device__ int64_t produce_units(const GemvArgs& a, int64_t c_begin, int64_t c_end, const Ring& ring, RingPos& pos,
                               int in_flight = 0) {
  const int lane = threadIdx.x & 31;
  const uint64_t policy = evict_first_policy();
  const int k_stages = k_stages_of(a);
  const int64_t n_units = units_of<E>(c_begin, c_end, k_stages);
  in_flight = min(in_flight, ring.n_slots);  // a slot's barrier tells its last fill round only
  UnitCursor<E> cur{c_begin};
  for (int64_t u = 0; u < n_units; ++u, cur.next(k_stages), pos.next(ring.n_slots)) {
    if (pos.units >= ring.n_slots) mbar_wait(ring.empty + 8 * pos.slot, pos.parity ^ 1);
    if (in_flight > 0 && pos.units >= in_flight) {  // at most in_flight units requested and not landed
      int slot = pos.slot - in_flight;
      uint32_t parity = pos.parity;
      while (slot < 0) slot += ring.n_slots, parity ^= 1;
      mbar_wait(ring.full + 8 * slot, parity);
    } else if (u == 1 && !a.ring_fill_at_once) {  // the first unit alone: wait until it has landed
      const bool wrapped = pos.slot == 0;
      mbar_wait(ring.full + 8 * (wrapped ? ring.n_slots - 1 : pos.slot - 1), wrapped ? pos.parity ^ 1 : pos.parity);
    }
    const int64_t k0 = int64_t(cur.stage) * kStageK;
    const uint32_t bytes = static_cast<uint32_t>(min(int64_t(kStageK), a.k - k0) * 2);
    const int64_t t_end = min(c_end, cur.u0 + UnitCursor<E>::kTileCols);
    const int64_t row = lane < kBulkRows ? tile_row<kBulkRows, E>(a, cur.u0, t_end, lane) : -1;
    const unsigned valid = __ballot_sync(0xffffffffu, row >= 0);
    if (lane == 0) mbar_expect(ring.full + 8 * pos.slot, __popc(valid) * bytes);
    __syncwarp();
    if (row >= 0)
      bulk_copy(ring.data + pos.slot * kStageBytes + lane * (kStageK * 2), a.w + row * a.k + k0, bytes,
                ring.full + 8 * pos.slot, policy);
  }
  return n_units;
}

// The producer, past its last unit (at pos): waits until the consumers have
// emptied the slot of the unit `back` units before pos (1: the last one;
// at most the ring's slots, and no earlier than this GEMV's first unit).
__device__ __forceinline__ void wait_consumed(const Ring& ring, const RingPos& pos, int back) {
  int slot = pos.slot - back;
  uint32_t parity = pos.parity;
  while (slot < 0) slot += ring.n_slots, parity ^= 1;
  mbar_wait(ring.empty + 8 * slot, parity);
}

// The producer warp after its own units: this block's share of what the
// next GEMV reads first (GemvPrefetch) into L2, the lanes taking its rows in turn.
__device__ __forceinline__ void prefetch_next_units(const GemvPrefetch& p) {
  static_assert(kPrefetchTileRows == kBulkRows && kPrefetchStageK == kStageK, "the prefetch walks the ring's units");
  for_prefetch_rows(p, blockIdx.x, gridDim.x, threadIdx.x & 31, 32, [&](int64_t off, int64_t bytes) {
    bulk_prefetch_l2(reinterpret_cast<const char*>(p.w) + off, static_cast<uint32_t>(bytes));
  });
}

// A warp's sums of 8 values at once, each over all 32 lanes: 9 shuffles
// instead of 8 × 5. Each step halves the values a lane holds, trading the
// other half with the lane across: lane L ends with the sum of value
// 4·L[4] + 2·L[3] + L[2] (L[i]: bit i of L). The order of the additions is
// fixed by the lanes alone.
__device__ __forceinline__ float warp_sum8(const float (&v)[8], int lane) {
  const bool h16 = lane & 16, h8 = lane & 8, h4 = lane & 4;
  float w[4], x[2];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = (h16 ? v[j + 4] : v[j]) + __shfl_xor_sync(0xffffffffu, h16 ? v[j] : v[j + 4], 16);
#pragma unroll
  for (int j = 0; j < 2; ++j)
    x[j] = (h8 ? w[j + 2] : w[j]) + __shfl_xor_sync(0xffffffffu, h8 ? w[j] : w[j + 2], 8);
  float y = (h4 ? x[1] : x[0]) + __shfl_xor_sync(0xffffffffu, h4 ? x[0] : x[1], 4);
  y += __shfl_xor_sync(0xffffffffu, y, 2);
  return y + __shfl_xor_sync(0xffffffffu, y, 1);
}
__device__ __forceinline__ int warp_sum8_row(int lane) {
  return ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
}

// The tiles' partial sums on their way from the consumer warps to the
// epilogue warp: kSumSlots tiles' worth, each slot with a "full" mbarrier
// (the 8 consumer warps' arrivals) and an "empty" one (the epilogue warp's).
template <int B>
struct RingSums {
  // One row: 4 (two blocks share an SM). More: 2, so that the largest ring
  // (kMaxRingBytes) and these fit the 227 KiB a block may have.
  static constexpr int kSumSlots = B == 1 ? 4 : 2;
  float part[kSumSlots][kConsumerWarps][kBulkRows * B];
  float ss[kSumSlots][kConsumerWarps][B];
  uint64_t full[kSumSlots], empty[kSumSlots];
  // By the thread that initializes the ring, before make_ring's fence.
  __device__ void init() {
    for (int i = 0; i < kSumSlots; ++i) {
      mbar_init(smem_addr(&full[i]), kConsumerWarps);
      mbar_init(smem_addr(&empty[i]), 1);
    }
  }
};
// A party's place in RingSums of n slots: the next tile's slot, that
// slot's round parity, tiles passed.
template <int n>
struct SumPos {
  int slot = 0;
  uint32_t parity = 0;
  int64_t tiles = 0;
  __device__ void next() {
    ++tiles;
    if (++slot == n) slot = 0, parity ^= 1;
  }
};

// The 8 consumer warps: the units of a's columns [c_begin, c_end) in the
// producer's order, each tile's sums by warp handed to the epilogue warp
// (finish_tiles). x may come from the previous kernel: under a programmatic
// dependent launch the caller has waited for it.
template <int B, GemvEpilogue E>
__device__ void consume_units(const GemvArgs& a, int64_t c_begin, int64_t c_end, const Ring& ring, RingPos& pos,
                              RingSums<B>& s, SumPos<RingSums<B>::kSumSlots>& sp) {
  constexpr int R = kBulkRows;
  const int rows = static_cast<int>(a.rows), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k_stages = k_stages_of(a);
  const int64_t n_units = units_of<E>(c_begin, c_end, k_stages);
  if (n_units == 0) return;
  static_assert(R == 8, "warp_sum8 takes a tile's 8 rows");
  float acc[R][B], ss[B];
  XRaw<B> x_next;
  load_x<B>(a, rows, threadIdx.x, x_next);
  // k in one stage: every unit reads the same x chunk, so it is read, normed
  // and its squares summed once (the same arithmetic as per unit: the same
  // bits). Up to 2 rows: at 4 the chunks kept would spill.
  const bool one_stage = B <= 2 && k_stages == 1;
  float xf1[B][8], ss1[B];
  if (one_stage) {
#pragma unroll
    for (int b = 0; b < B; ++b) {
      ss1[b] = 0.0f;
      if (b < rows && threadIdx.x < a.k / 8) use_x<B>(a, x_next, b, xf1[b], &ss1[b]);
    }
    if (a.norm_w) {
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float v = dev::warp_sum(ss1[b]);
        if (lane == 0)
          for (int i = 0; i < s.kSumSlots; ++i) s.ss[i][warp][b] = v;  // every tile's: never rewritten
      }
    }
  }
  UnitCursor<E> cur{c_begin};
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
    if (!one_stage && u + 1 < n_units)
      load_x<B>(a, rows, int64_t(next_stage) * kConsumers + threadIdx.x, x_next);
    const uint32_t slot = ring.data + pos.slot * kStageBytes;
    mbar_wait(ring.full + 8 * pos.slot, pos.parity);
    if (have) {
      float xf[B][8];
#pragma unroll
      for (int b = 0; b < B; ++b) {
        if (b >= rows) break;
        if (one_stage) {
#pragma unroll
          for (int i = 0; i < 8; ++i) xf[b][i] = xf1[b][i];
        } else {
          use_x<B>(a, x, b, xf[b], &ss[b]);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[8];
        unpack8(lds128(slot + r * (kStageK * 2) + threadIdx.x * 16), wf);
#pragma unroll
        for (int b = 0; b < B; ++b) {
          if (b >= rows) break;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[i], xf[b][i], acc[r][b]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(ring.empty + 8 * pos.slot);  // this warp is done with the slot
    const bool tile_done = cur.stage == k_stages - 1;
    cur.next(k_stages);
    pos.next(ring.n_slots);
    if (!tile_done) continue;
    // The tile's sums: each warp's into the next sums slot, once the
    // epilogue warp has finished the tile that used it before.
    if (sp.tiles >= s.kSumSlots) mbar_wait(smem_addr(&s.empty[sp.slot]), sp.parity ^ 1);
#pragma unroll
    for (int b = 0; b < B; ++b) {
      float rows_b[R];
#pragma unroll
      for (int r = 0; r < R; ++r) rows_b[r] = acc[r][b];
      const float v = warp_sum8(rows_b, lane);
      if ((lane & 3) == 0) s.part[sp.slot][warp][warp_sum8_row(lane) * B + b] = v;
    }
    if (a.norm_w && !one_stage) {
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float v = dev::warp_sum(ss[b]);
        if (lane == 0) s.ss[sp.slot][warp][b] = v;
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(&s.full[sp.slot]));
    sp.next();
  }
}

// The epilogue warp of a GEMV with a fused pick (GemvPick), after its
// tiles: lane r·B + b holds its best of row b. The block's best of each row
// goes to p.slots; the last block to count itself merges every block's and
// writes the picks, then zeroes the count for the next call.
template <int B>
__device__ void pick_block_done(const GemvPick& p, int rows, PickBest best, int lane) {
  best = pick_shuffle(best, 31 & ~(B - 1));  // over the lanes of one row b: lane b holds it
  PickBest row[B];
#pragma unroll
  for (int b = 0; b < B; ++b) row[b] = {__shfl_sync(0xffffffffu, best.v, b), __shfl_sync(0xffffffffu, best.i, b)};
  unsigned before = 0;
  if (lane == 0) {
    // The slots, then the count with release and acquire semantics (the
    // slots of the blocks counted before are visible to the one counted last).
#pragma unroll
    for (int b = 0; b < B; ++b) p.slots[int64_t(blockIdx.x) * B + b] = {row[b].v, static_cast<int32_t>(row[b].i)};
    LATHE_BULK_ASM("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(before) : "l"(p.count) : "memory");
  }
  __syncwarp();  // orders the other lanes' loads below after lane 0's acquire
  if (__shfl_sync(0xffffffffu, before, 0) != gridDim.x - 1) return;
  for (int b = 0; b < rows; ++b) {
    PickBest m{-INFINITY, -1};
    for (unsigned k = lane; k < gridDim.x; k += 32) {
      const int2 o = __ldcg(reinterpret_cast<const int2*>(p.slots) + int64_t(k) * B + b);  // {v, i}, past L1
      const PickBest c{__int_as_float(o.x), o.y};
      if (pick_better(c, m)) m = c;
    }
    m = pick_shuffle(m, 31);
    if (lane == 0) write_pick(p.next, p.feed, b, static_cast<int32_t>(m.i < 0 ? 0 : m.i));
  }
  if (lane == 0) *static_cast<volatile unsigned*>(p.count) = 0u;  // for the next call (after this kernel)
}

// The epilogue warp: each tile of a's columns [c_begin, c_end), once the
// consumer warps have handed in its sums, added over the warps in order and
// finished (norm scale, then the epilogue); the slot is then given back.
// What the epilogue reads and writes may come from the previous kernel:
// the caller has waited for it.
template <int B, GemvEpilogue E>
__device__ void finish_tiles(const GemvArgs& a, int64_t c_begin, int64_t c_end, RingSums<B>& s,
                             SumPos<RingSums<B>::kSumSlots>& sp) {
  constexpr int R = kBulkRows, kW = kConsumerWarps;
  constexpr int64_t kTileCols = tile_columns<R, E>();
  static_assert(R * B <= 32, "a lane per tile slot and x row");
  const int lane = threadIdx.x & 31, r = lane / B, b = lane % B;
  const bool mine = lane < R * B && b < a.rows;
  const bool pick = E == GemvEpilogue::kStoreF32 && a.pick.next;
  PickBest best{-INFINITY, -1};  // with a pick: this lane's best output of row b
  for (int64_t u0 = c_begin; u0 < c_end; u0 += kTileCols, sp.next()) {
    mbar_wait(smem_addr(&s.full[sp.slot]), sp.parity);
    if (mine) {
      const float scale = row_scale<kW>(a, &s.ss[sp.slot][0][b], B);
      float v = 0.0f;
      const int64_t j = finish_tile_slot<R, E>(
          a, u0, min(c_end, u0 + kTileCols), r, b, scale,
          [&](int rr) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < kW; ++w) sum += s.part[sp.slot][w][rr * B + b];
            return sum;
          },
          &v);
      if (pick && j >= 0) pick_consider(best, penalized(a.pick.penalty, b, j, v), j);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(&s.empty[sp.slot]));
  }
  if (pick) pick_block_done<B>(a.pick, static_cast<int>(a.rows), best, lane);
}

}  // namespace lathe::cuda::ring
