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
// its "full" barrier (the bulk copies' byte count) and never on each other;
// at a tile's end each hands its sums to the epilogue warp. The first version had the
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
// At Llama-3.2-1B's widths (k = 2048: a tile is one unit) the consumers,
// not DRAM, set the pace: under ncu (base clock 1.46 GHz) gate|up ran at
// 57% of the DRAM bandwidth with the schedulers issuing every 1.9 cycles,
// and its time followed the SM clock. Two cuts (H200, 2026-12-01): a tile's
// 8 row sums in one 9-shuffle exchange (warp_sum8) instead of 8 × 5
// shuffles, and x read, normed and squared once when k fits one stage (up
// to 2 rows). 1B gate|up 19.3 → 17.8 us (88% of 4.3 TB/s), q|k|v 7.2 →
// 6.8, a chained layer 44.1 → 41.7 us; decode 1,214 → 1,254 tok/s at batch
// 1, 2,406 at batch 4; 8B 257.7 → 259.6.
//
// A block's producer warp initializes the ring's barriers and issues its
// first copies without waiting for the consumer warps (a named barrier
// tells them the ring is ready). With GemvArgs::prefetch it then pulls its
// share of the next GEMV's first units into L2, by default once the
// consumers have emptied all but the block's last unit (GemvPrefetch::lag
// 1): those copies then reach the DRAM as this GEMV's own drain, and keep
// it busy while this kernel's blocks finish and the next one's start (they
// cannot start earlier: two rings fill an SM's shared memory). H200,
// 2026-12-01, 1B decode at batch 1, two calls: 1,291 and 1,291 tok/s
// against 1,265-1,273 with no prefetch; 1,284 and 1,297 against 1,287 and
// 1,287 (a gain of 0-2%); in the first call 1,223 with the prefetch issued
// after the block's last unit (lag 0), 1,270 / 1,258 at lag 2 / 3, 1,125
// with 2 units at lag 0; 8B 260.3 against 261.2, 264.9 against 265.7
// (noise). The producer-first start: 1,265-1,276 against 1,263-1,270 for
// the block-wide sync before the first copy (noise or a little better).
//
// The producer issues a block's first unit alone and the rest of its ring
// once that unit has landed (GemvArgs::ring_fill_at_once turns it off):
// with every block's whole ring requested at once (~25 MB at one sequence)
// the DRAM serves the first units with all the others, so the consumers
// start late and multiply in a burst at the end; requested alone, the first
// units land early and the products overlap the stream. H200, 2026-12-01,
// two calls: 1B decode at one sequence 1,340.7 / 1,341.1 tok/s against
// 1,324.4 / 1,325.4 for the ring at once, then 1,336.0 / 1,336.2 against
// 1,324.3 / 1,324.9 (the build before, carried beside); 8B 264.9 and 265.1
// against 261.5; 1B at 4 sequences 2,537 against 2,486; the first two
// units alone first: 1,328.
//
// A tile's epilogue (the warps' sums added, the norm scale, SwiGLU, RoPE and
// the cache append, the residual add) runs in a warp of its own, so the
// consumer warps never wait for it; before, 8 threads of the first consumer
// warp ran it between two units, and the 8 warps met at a block barrier
// every tile. H200, 2026-12-01, the build before carried beside, three
// calls: 1B decode at one sequence 1,337.2 / 1,336.9 → 1,347.0 / 1,347.0
// tok/s, 1,318.0 / 1,318.9 → 1,318.4 / 1,318.4, 1,349.4 / 1,349.4 → 1,360.1
// / 1,359.3; at 4 sequences 2,544 → 2,590; 8B 264.4 → 264.0 (noise).
//
// What the consumers' work still costs at one sequence (1B decode, builds
// with a part removed, results wrong, each beside this one in one call):
// no epilogue at all 1,341 against 1,318 (and the same 1,341 with only each
// block's last tile's skipped: what is left is the block's end, before the
// next kernel's block may take its place); the loads from the ring without
// the products 1,377 against 1,347, the products without the loads 1,340;
// nothing at all (a consumer only waits and gives the slot back) 1,453
// (84% of the floor). Measured and not kept: each consumer warp taking its
// unit's weights into registers and giving the slot back before the
// products (registers capped at 96 for two blocks per SM, a few spilled):
// 1,261 with the epilogue warp, 1,308 without, against 1,349; the epilogue
// warp loading a tile's inputs (the residual, RoPE's factors and rows) two
// tiles ahead, from the previous kernel's end: 1,347.2 against 1,347.0;
// the products on the tensor cores (mma.sync m16n8k16, the unit's 8 rows as
// B, x as hi and lo bf16 rows of A): at n = 8 with 2 of 16 rows used they
// take more tensor-core time (~0.5 us per SM and 64 KB) than the CUDA
// cores' FMAs do issue slots (~0.27 us); a first build (its outputs wrong,
// the bug not looked for) ran 1,278 against 1,350.
//
// Thread t sums chunks t, t + 256, ... of each row (k in order), the block
// adds its warps in order: the sums do not depend on the number of x rows
// nor on the grid or ring. The producer and consumer loops are
// gemv_ring.cuh's.
#include <algorithm>

#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/gemv_bulk.h"
#include "backends/cuda/gemv_ring.cuh"

namespace lathe::cuda {
namespace {

using namespace ring;

// One x row: two blocks per SM (the registers of 2 × 10 warps).
template <int B, GemvEpilogue E>
__global__ void __launch_bounds__(kBulkThreads, B == 1 ? 2 : 1) gemv_bulk_kernel(GemvArgs a, int n_slots) {
  extern __shared__ __align__(128) unsigned char s_ring[];
  __shared__ __align__(8) uint64_t s_full[kMaxStages], s_empty[kMaxStages];
  __shared__ RingSums<B> s_sums;
  allow_next_grid();
  int64_t c_begin, c_end;
  block_columns(a, &c_begin, &c_end);
  // The producer warp initializes the ring itself and issues its first
  // copies without waiting for the other warps.
  if (threadIdx.x == kProducer0) s_sums.init();
  const Ring ring = make_ring(s_ring, s_full, s_empty, n_slots, kProducer0);
  RingPos pos;
  if (threadIdx.x >= kEpilogue0) {
    ring_ready_wait();
    wait_prior_grid();  // the epilogue may read and write what the previous kernel wrote
    SumPos<RingSums<B>::kSumSlots> sp;
    finish_tiles<B, E>(a, c_begin, c_end, s_sums, sp);
    return;
  }
  if (threadIdx.x >= kProducer0) {
    __syncwarp();
    ring_ready_arrive();
    // The producer never reads what the previous kernel writes, so it never waits for it.
    const int64_t n_units = produce_units<E>(a, c_begin, c_end, ring, pos, a.ring_in_flight);
    if constexpr (E == GemvEpilogue::kRopeAppend) {
      // One sequence: its K and V cache rows before this step, which the
      // attention reads next (its blocks do not fit beside this kernel's
      // two on an SM, so they load them only when these leave), into L2, a
      // share a block. Only a hint: a stale position (none here: the step's
      // inputs kernel releases q|k|v only after the pick) would change no
      // result.
      // H200, 2026-12-02, three alternations in one call: Llama-3.2-1B
      // decode 1,377.6 → 1,385.8 tok/s; 8B 267.6 → 267.8.
      if (B == 1 && a.rope.pos) {
        const int rows_before = min(__ldg(a.rope.pos), a.rope.max_ctx);
        const int64_t bytes = int64_t(rows_before) * a.rope.n_head_kv * a.rope.head_dim * 2;
        const int64_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
        const int64_t at = per * blockIdx.x;
        const int64_t n = at < bytes ? min(per, bytes - at) : 0;
        if (n > 0 && (threadIdx.x & 31) < 2) {
          const bf16_bits* base = (threadIdx.x & 31) == 0 ? a.rope.k_caches[0] : a.rope.v_caches[0];
          bulk_prefetch_l2(reinterpret_cast<const char*>(base) + at, static_cast<uint32_t>(n));
        }
      }
    }
    if (a.prefetch.units > 0 && a.prefetch.lag >= 0 && a.prefetch.lag < n_units)
      wait_consumed(ring, pos, min(a.prefetch.lag + 1, ring.n_slots));
    prefetch_next_units(a.prefetch);
    return;
  }
  ring_ready_wait();
  wait_prior_grid();  // x comes from the previous kernel
  SumPos<RingSums<B>::kSumSlots> sp;
  consume_units<B, E>(a, c_begin, c_end, ring, pos, s_sums, sp);
}

// A diagnostic for the bench (bench_generate_cuda --chain 1): every GEMV of
// a chain (GemvChain) through one persistent kernel, the producer running
// on from one GEMV's weights to the next's, nothing between them (their x
// never changes) or, with GemvChain::barrier, a grid barrier before each
// GEMV's products. H200, 2026-12-01, 8 layers of Llama-3.2-1B's q|k|v, o,
// gate|up and down: 27.2-27.3 us a layer (104% of 4.3 TB/s) against
// 33.0-33.6 (84-86%) as a ring kernel each; with the barriers 36.0-36.4
// (78%), at one block per SM with a 224 KiB ring 34.4-34.9 (81-82%). So the
// ring streams a step's weights at the bandwidth when nothing interrupts
// it, and a barrier costs the stream what a kernel boundary does (likely:
// the producers run ahead, so the slowest block's last units of one GEMV
// queue behind the other blocks' requests for the next, and every block
// waits for them). The GEMVs take no norm: a one-stage GEMV's consumers
// write its sums of squares to every RingSums slot at its start, which in a
// chain would have to wait for the previous GEMV's last epilogue.
__global__ void __launch_bounds__(kBulkThreads, 2) gemv_chain_kernel(const __grid_constant__ GemvChain c, int n_slots) {
  extern __shared__ __align__(128) unsigned char s_ring[];
  __shared__ __align__(8) uint64_t s_full[kMaxStages], s_empty[kMaxStages];
  __shared__ RingSums<1> s_sums;
  constexpr GemvEpilogue E = GemvEpilogue::kStoreF32;
  if (threadIdx.x == kProducer0) s_sums.init();
  const Ring ring = make_ring(s_ring, s_full, s_empty, n_slots, kProducer0);
  auto args = [&](int i) {
    GemvArgs a;
    a.x = c.x, a.w = c.w[i], a.out = c.out, a.rows = 1, a.n = c.n[i], a.k = c.k[i], a.epilogue = E;
    a.ring_fill_at_once = c.fill_at_once;
    return a;
  };
  int64_t c_begin, c_end;
  if (threadIdx.x >= kEpilogue0) {
    ring_ready_wait();
    SumPos<RingSums<1>::kSumSlots> sp;
    for (int i = 0; i < c.count; ++i) {
      const GemvArgs a = args(i);
      block_columns(a, &c_begin, &c_end);
      finish_tiles<1, E>(a, c_begin, c_end, s_sums, sp);
      if (c.barrier) {  // this block's outputs of GEMV i are written: count it
        __threadfence();
        __syncwarp();
        if ((threadIdx.x & 31) == 0) atomicAdd(c.barrier, 1u);
      }
    }
    return;
  }
  RingPos pos;
  if (threadIdx.x >= kProducer0) {
    __syncwarp();
    ring_ready_arrive();
    for (int i = 0; i < c.count; ++i) {
      const GemvArgs a = args(i);
      block_columns(a, &c_begin, &c_end);
      produce_units<E>(a, c_begin, c_end, ring, pos, c.in_flight);
    }
    return;
  }
  ring_ready_wait();
  SumPos<RingSums<1>::kSumSlots> sp;
  for (int i = 0; i < c.count; ++i) {
    if (c.barrier && i > 0) {  // every block's outputs of GEMV i − 1 are written (the next x, in a step)
      if (threadIdx.x == 0) {
        const unsigned target = unsigned(i) * gridDim.x;
        unsigned v = 0;
        do {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c.barrier) : "memory");
        } while (v < target);
      }
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
    }
    const GemvArgs a = args(i);
    block_columns(a, &c_begin, &c_end);
    consume_units<1, E>(a, c_begin, c_end, ring, pos, s_sums, sp);
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
  return launch_overlapped_carveout(gemv_bulk_kernel<B, E>, dim3(static_cast<unsigned>(gemv_bulk_grid(a, device))),
                                    dim3(kBulkThreads), size_t(slots) * kStageBytes, st, a.overlap, a.max_carveout, a,
                                    slots);
}

template <int B>
cudaError_t launch_bulk_rows(const GemvArgs& a, cudaStream_t st, int device) {
  return with_epilogue(a.epilogue, [&](auto e) { return launch_bulk_kernel<B, decltype(e)::value>(a, st, device); });
}

}  // namespace

int64_t gemv_bulk_grid(const GemvArgs& a, int device) {
  const int64_t tile_cols = paired(a.epilogue) ? kBulkRows / 2 : kBulkRows;
  const int64_t tiles = (gemv_columns(a) + tile_cols - 1) / tile_cols;
  return std::min<int64_t>(tiles, int64_t(std::max<int>(1, a.blocks_per_sm)) * sm_count(device));
}

GemvPrefetch gemv_l2_prefetch(const GemvArgs& next, int units, int device, int lag) {
  if (units <= 0 || next.shape != kGemvBulkShape || next.rows < 1 || next.rows > 4 || !next.w || next.k % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(next.w) & 15) != 0 || !has_bulk_copies(device))
    return {};
  return {.w = next.w, .n = next.n, .k = next.k, .grid = gemv_bulk_grid(next, device), .units = units,
          .head_dim = next.rope.head_dim, .lag = lag, .epilogue = next.epilogue};
}

std::vector<std::pair<int64_t, int64_t>> gemv_l2_prefetch_ranges(const GemvPrefetch& p, int64_t block, int64_t grid) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for_prefetch_rows(p, block, grid, 0, 1, [&](int64_t off, int64_t bytes) { ranges.emplace_back(off, bytes); });
  return ranges;
}

cudaError_t launch_gemv_chain(const GemvChain& c, int per_sm, cudaStream_t st, int device) {
  static bool raised[64] = {};
  // Every block must be resident at once (a barrier waits for all of them): at most 2 per SM.
  if (device < 0 || device >= 64 || c.count < 1 || c.count > kGemvChainMax || per_sm < 1 || per_sm > 2)
    return cudaErrorInvalidValue;
  if (!raised[device]) {
    const cudaError_t err =
        cudaFuncSetAttribute(gemv_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxStages * kStageBytes);
    if (err != cudaSuccess) return err;
    raised[device] = true;
  }
  const int slots = std::clamp((c.ring_kib > 0 ? c.ring_kib : kGemvBulkRingKib) * 1024 / kStageBytes, 2, kMaxStages);
  gemv_chain_kernel<<<unsigned(per_sm * sm_count(device)), kBulkThreads, size_t(slots) * kStageBytes, st>>>(c, slots);
  return cudaGetLastError();
}

cudaError_t launch_gemv_bulk(const GemvArgs& a, cudaStream_t st, int device) {
  if (a.rows == 1) return launch_bulk_rows<1>(a, st, device);
  if (a.rows == 2) return launch_bulk_rows<2>(a, st, device);
  return launch_bulk_rows<4>(a, st, device);
}

}  // namespace lathe::cuda
