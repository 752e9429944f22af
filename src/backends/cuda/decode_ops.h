// The kernels of a decode step: one new token for each of a few sequences
// (rows 1..16 at a time). A decode step reads every weight once and does
// little arithmetic per byte, so its matrix products are a skinny GEMM of
// our own (gemv.cu: 16-byte weight loads spread over every SM, fp32
// accumulation, the bias / residual add / SwiGLU done in the same kernel)
// rather than cuBLASLt, which stays for prefill. The residual stream is f32
// (rounding it to bf16 after every add is where bf16 inference loses most),
// so the norm here adds an f32 delta into an f32 stream. RoPE, the optional
// q/k norm and the KV-cache append are one kernel that writes each
// sequence's k and v at its own position; without the q/k norm they are the
// q|k|v GEMV's epilogue instead (kRopeAppend). Every per-step input (token ids,
// positions, cache pointers) is a device pointer, so one captured CUDA
// graph replays for every step. Stubs in decode_stub.cpp.
//
// `overlap` (sm_90+) launches a kernel as a programmatic dependent launch:
// its blocks may start while the previous kernel on the stream finishes,
// and wait for it (griddepcontrol.wait) only before reading what it wrote;
// the skinny GEMM issues its first weight loads before that wait. Every
// kernel here lets the next one start early, which is harmless when the
// next one is launched the ordinary way.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

// out[r, j] ⊕= Σ_k x[r, k]·w[j, k] (+ bias[j]) for every row r of x, with
// ⊕ by epilogue:
//   kStoreBf16: out bf16 [rows, n]  = bf16(acc + bias)
//   kStoreF32:  out f32  [rows, n]  = acc + bias          (logits)
//   kAddF32:    out f32  [rows, n] += acc + bias          (the residual stream)
//   kSwigluBf16: w holds 2·n rows (gate rows, then up rows), bias 2·n
//                entries; out bf16 [rows, n] = bf16(silu(g)·u) from the f32
//                gate and up sums.
//   kSwigluF32:  the same, out f32 [rows, n] (unrounded).
//   kRopeAppend: w is one decode step's stacked q|k|v projection (n =
//                (n_head + 2·n_head_kv)·head_dim rows, out unused) and the
//                epilogue is rope_append()'s without q/k norm: the f32 sums
//                (+ bias) of rows p and p + head_dim/2 of a head are rotated
//                together (q, k; v as is), rounded once to bf16 and written
//                to rope.q_out and row rope.pos[r] of x row r's caches.
// k must be a multiple of 8 and x, w 16-byte aligned (refused otherwise: the
// caller takes cuBLASLt). 1..4 rows are summed with f32 FMAs, 5..16 on the
// tensor cores when k is a multiple of 32 (f32 accumulation either way);
// rows beyond 16 are taken 16 at a time (the weights are read once per 16
// rows). out must not alias x.
enum class GemvEpilogue : uint8_t { kStoreBf16, kStoreF32, kAddF32, kSwigluBf16, kSwigluF32, kRopeAppend };
// Scratch for splitting k over several blocks of a row tile: partial sums
// and a count per tile. The counts must be
// zero before the first call; every call leaves them zero. Calls on one
// stream may share it.
struct GemvSplit {
  int* counts = nullptr;  // [count_capacity]
  float* part = nullptr;  // [part_capacity]
  int64_t count_capacity = 0, part_capacity = 0;
};
// Capacities that let every decode GEMV split as it wants (gemv.cu: at most
// 8 slices, and only grids under 4 waves of resident blocks).
constexpr int64_t kGemvSplitCounts = 16384, kGemvSplitFloats = int64_t(1) << 20;

// Where kRopeAppend puts x row r's q, k and v (RopeAppendArgs' fields, the
// sequence being x row r).
struct GemvRope {
  bf16_bits* q_out = nullptr;            // [rows, n_head, head_dim]
  bf16_bits* const* k_caches = nullptr;  // device [rows] → [max_ctx, n_head_kv, head_dim]
  bf16_bits* const* v_caches = nullptr;  // device [rows] → [max_ctx, n_head_kv, head_dim]
  const int32_t* pos = nullptr;          // device [rows]; outside [0, max_ctx): no cache row is written
  const float* cos = nullptr;            // [rows, head_dim / 2]
  const float* sin = nullptr;            // [rows, head_dim / 2]
  int n_head = 0, n_head_kv = 0, head_dim = 0, max_ctx = 0;
};
// GemvArgs::shape of the shared-memory ring and its default size: two
// blocks of it fit in an SM's 228 KiB.
constexpr uint8_t kGemvBulkShape = 4;
constexpr int kGemvBulkRingKib = 96;
// Weights the next kernel on the stream reads first, pulled into L2 by a
// GEMV on the ring (its producer warps, once they have issued their own
// copies; bulk prefetches, nothing waits for them): the first `units` units
// (a tile of 8 weight rows × one stage of up to 2048 k, gemv_bulk.cu) of
// every block of the ring GEMV over w (n outputs, k inputs, `epilogue`,
// head_dim for kRopeAppend) on `grid` blocks, each block of this GEMV
// taking its share of those blocks. Why: the next GEMV's blocks become
// resident only when this one's leave the SMs' shared memory, and then
// wait a DRAM round trip for their first bytes: the DRAM idles at every
// boundary. gemv_l2_prefetch() fills it from the next GEMV's arguments.
// `lag` times the prefetch: -1, as soon as the producer has issued its own
// copies (they then queue in DRAM with this GEMV's last ~25 MB and land
// with them); n >= 0, once the block's consumers have finished all but its
// last n units, so that the prefetch reaches the DRAM as this GEMV's own
// copies drain. Changes when bytes move, never what is computed.
struct GemvPrefetch {
  const bf16_bits* w = nullptr;
  int64_t n = 0, k = 0, grid = 0;
  int units = 0, head_dim = 0, lag = -1;
  GemvEpilogue epilogue = GemvEpilogue::kStoreBf16;
};
// The pick's feed (greedy_pick below says what it writes).
struct GreedyFeed {
  int32_t* tokens = nullptr;     // [rows] device
  int32_t* positions = nullptr;  // [rows] device
  int32_t* host_ring = nullptr;  // [rows, ring_slots] mapped host memory (device address)
  int ring_slots = 0;
};
// Hugging Face's repetition penalty before a pick: a logit of a token in
// row r's bitmap (seen + r·stride words, as embedding_f32 sets them) is
// divided by penalty when positive, multiplied when negative (the CPU's
// apply_repetition_penalty). Off when seen is null or penalty is 1.
struct SeenPenalty {
  const uint32_t* seen = nullptr;
  int64_t stride = 0;
  float penalty = 1.0f;
};
// greedy_pick()'s pick (its rule, penalty and feed) fused into a ring GEMV
// whose kStoreF32 outputs are the logits (GemvArgs::pick): each block's
// epilogue warp keeps its rows' best logits as it writes them, puts them in
// `slots` [block · 4 + row], and the last block to count itself in `count`
// merges them and writes the picks (gemv_fuses_pick() says when a GEMV
// takes it). count must be zero before the first call; every call leaves
// it zero. The picks are greedy_pick()'s on the stored logits.
struct alignas(8) GemvPickSlot {  // read back as one 8-byte word
  float v;
  int32_t i;  // -1: none
};
constexpr int64_t kGemvPickSlots = 8192;
struct GemvPick {
  int32_t* next = nullptr;  // [rows]; null: no pick
  GreedyFeed feed{};
  SeenPenalty penalty{};
  GemvPickSlot* slots = nullptr;  // [kGemvPickSlots]
  unsigned* count = nullptr;
};
struct GemvArgs {
  const bf16_bits* x = nullptr;     // [rows, k]
  const bf16_bits* w = nullptr;     // [n, k] (kSwigluBf16: [2·n, k])
  const bf16_bits* bias = nullptr;  // [n] (kSwigluBf16: [2·n]) or null
  void* out = nullptr;              // [rows, n], bf16 or f32 by epilogue
  int64_t rows = 0, n = 0, k = 0;
  GemvEpilogue epilogue = GemvEpilogue::kStoreBf16;
  bool overlap = false;
  // With x_f32 set (x unused) the input is f32: used as is on the CUDA
  // cores (up to 4 rows), rounded to bf16 on the tensor cores. With norm_w
  // too, the input rows are the RMSNorm of x_f32's, x_f32·rstd·norm_w with
  // rstd = rsqrt(mean(x_f32²) + eps) in f32, computed inside the kernel:
  // the sums run over x_f32·norm_w (f32 on the CUDA cores, rounded to bf16
  // on the tensor cores) and are scaled by rstd before the bias, so the
  // sum of squares is taken in the same pass as the products.
  const float* x_f32 = nullptr;       // [rows, k], 16-byte aligned, not written while the kernel runs
  const bf16_bits* norm_w = nullptr;  // [k] or null
  float eps = 1e-6f;
  GemvRope rope{};                    // kRopeAppend only
  // The block shape (gemv.cu). CUDA cores: 0, the default, 128 threads, 8
  // weight rows per block, 2 chunks of each in flight per thread; 1: 128
  // threads, 4 rows, 4 in flight; 2: 256 threads, 8 rows, 1 in flight;
  // 3: 128 threads, 16 rows, 1 in flight (half the blocks of 0, each twice
  // as long); kGemvBulkShape (4, up to 4 rows on sm_90+; else shape 0): the
  // weights stream into a ring of shared memory through bulk copies
  // (gemv_bulk.cu), a block per SM. Tensor cores: 16 (the default), 32 or
  // 64 weight rows per block (shape 3 and 4 are the default there). Shapes
  // differ only in the order of the f32 sums; the bench compares their
  // speed.
  uint8_t shape = 0;
  // kGemvBulkShape: the ring's shared memory per block in KiB (0:
  // kGemvBulkRingKib), all of it filled before the kernel waits for the
  // previous one, and the blocks per SM (0: 1).
  uint16_t ring_kib = 0;
  uint8_t blocks_per_sm = 0;
  // With split set, a grid of under 4 waves of resident blocks (n small for
  // the SM count) splits k into up to 8 slices, the last block of a tile
  // adding the slices' sums in order (deterministic; up to 4 rows the slice
  // count depends on n, k and the device, not on the rows). The decode step
  // sets it above 4 rows where its grid says so (CudaGemvGrid::split).
  GemvSplit split{};
  // Up to 4 rows on the CUDA cores (ignored otherwise, with split and with
  // kRopeAppend, whose epilogue leaves no registers for the loop):
  // one block per resident slot (blocks per SM × SMs) instead of one per
  // row tile, each taking an equal run of output columns tile after tile,
  // so every block ends at about the same time (measured no faster on the
  // H200; the bench keeps comparing). The same sums in the same order:
  // bitwise the results without it.
  bool persistent = false;
  // kGemvBulkShape: launch with the largest shared-memory carveout, so that
  // the next kernel's blocks fit beside this one's where the ring leaves
  // room (a 64 KiB ring at two blocks per SM leaves a third's worth).
  bool max_carveout = false;
  // kGemvBulkShape: what the next kernel reads first, pulled into L2.
  GemvPrefetch prefetch{};
  // kGemvBulkShape: a block's producer issues its whole ring at once. By
  // default it issues its first unit alone and the rest of the ring once
  // that unit has landed (gemv_bulk.cu): the same bytes, sooner at first.
  bool ring_fill_at_once = false;
  // kGemvBulkShape: > 0, a block's producer keeps at most this many units
  // requested and not landed (at most the ring's slots), from the first
  // unit on; ring_fill_at_once is then ignored. Changes when bytes move,
  // never a sum.
  uint8_t ring_in_flight = 0;
  // With pick.next set: the greedy pick of each row's outputs (GemvPick);
  // refused unless gemv_fuses_pick().
  GemvPick pick{};
};
Status gemv(CudaContext& ctx, const GemvArgs& a);  // messages start with "cuda gemv: "
// Whether gemv() takes this shape and these pointers.
bool gemv_supports(const bf16_bits* x, const bf16_bits* w, int64_t k);
// Whether gemv() on device can fuse a pick (GemvArgs::pick) into a: the
// ring (kGemvBulkShape on sm_90+), kStoreF32, 1..4 rows.
bool gemv_fuses_pick(const GemvArgs& a, int device);
// The prefetch (GemvArgs::prefetch) of the first `units` units of every
// block of `next` as gemv() would launch it on `device`; empty (nothing
// prefetched) unless next runs on the ring (kGemvBulkShape, up to 4 rows,
// sm_90+) or units <= 0.
GemvPrefetch gemv_l2_prefetch(const GemvArgs& next, int units, int device, int lag = -1);
// The (byte offset into p.w, bytes) ranges that block `block` of a ring
// GEMV of `grid` blocks pulls into L2 for p, in the order it issues them.
std::vector<std::pair<int64_t, int64_t>> gemv_l2_prefetch_ranges(const GemvPrefetch& p, int64_t block, int64_t grid);

// y[r, c] = b[c] for a row-major [rows, cols] bf16 y: a bias laid out for a
// GEMM with beta = 1, which then adds it before its one rounding.
Status broadcast_rows(CudaContext& ctx, bf16_bits* y, const bf16_bits* b, int64_t rows, int64_t cols);

// h[r] = table[tokens[r]] in f32 (the start of the residual stream). Ids are
// checked on the host; one outside [0, vocab) yields a zero row.
// With seen set, each row's token also sets its bit in that row's bitmap of
// the tokens a sequence holds (seen + r·seen_stride words; seen_stride 0
// when every row belongs to one sequence): what a repetition penalty reads.
struct EmbeddingF32Args {
  const int32_t* tokens = nullptr;   // [n]
  const bf16_bits* table = nullptr;  // [vocab, dim]
  float* out = nullptr;              // [n, dim]
  int64_t n = 0, vocab = 0, dim = 0;
  uint32_t* seen = nullptr;  // bit id of word id / 32
  int64_t seen_stride = 0;
};
Status embedding_f32(CudaContext& ctx, const EmbeddingF32Args& a);

// A decode step's inputs in one kernel: embedding_f32's rows (and seen
// bits) and rope_tables' cos/sin of the step's positions, bitwise what the
// two ops write. With overlap it is a programmatic dependent launch that
// lets the next kernel start only after its own wait, so a kernel that reads
// the positions before its wait (the decode attention) sees what the
// previous kernel (the last step's pick) wrote there.
struct DecodeInputsArgs {
  EmbeddingF32Args embedding;
  RopeTablesCudaArgs rope;
  bool overlap = false;
};
Status decode_inputs(CudaContext& ctx, const DecodeInputsArgs& a);

// The f32 residual stream's pre-norm: h += delta + bias (when delta is set;
// bias only with delta), then y = bf16(h·rstd·w) with rstd =
// rsqrt(mean(h²) + eps), everything in f32.
struct ResidualNormArgs {
  float* h = nullptr;                 // [rows, dim] the residual stream, updated in place
  const float* delta = nullptr;       // [rows, dim] or null
  const bf16_bits* bias = nullptr;    // [dim] or null
  const bf16_bits* w = nullptr;       // [dim]
  bf16_bits* y = nullptr;             // [rows, dim]
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
  bool overlap = false;
};
Status residual_norm(CudaContext& ctx, const ResidualNormArgs& a);

// One decode step's q/k/v for n_seqs sequences, row s of qkv (f32, as the
// projection left it) belonging to sequence s at position pos[s]: optional
// per-head RMSNorm of q and k, rotate_half RoPE with the tables of cos/sin
// row s, all in f32 and rounded to bf16 once, then q to q_out and k, v to
// row pos[s] of sequence s's caches (a position outside [0, max_ctx) writes
// no cache row). One warp per (sequence, head); head_dim even and <= 256.
struct RopeAppendArgs {
  const float* qkv = nullptr;              // [n_seqs, (n_head + 2·n_head_kv)·head_dim]: [q | k | v]
  bf16_bits* q_out = nullptr;              // [n_seqs, n_head, head_dim]
  bf16_bits* const* k_caches = nullptr;    // device [n_seqs] → [max_ctx, n_head_kv, head_dim]
  bf16_bits* const* v_caches = nullptr;    // device [n_seqs] → [max_ctx, n_head_kv, head_dim]
  const int32_t* pos = nullptr;            // device [n_seqs]
  const float* cos = nullptr;              // [n_seqs, head_dim / 2]
  const float* sin = nullptr;              // [n_seqs, head_dim / 2]
  const bf16_bits* q_norm = nullptr;       // [head_dim] or null
  const bf16_bits* k_norm = nullptr;       // [head_dim] or null (set with q_norm)
  int n_seqs = 0, n_head = 0, n_head_kv = 0, head_dim = 0, max_ctx = 0;
  float eps = 1e-6f;
  bool overlap = false;
};
Status rope_append(CudaContext& ctx, const RopeAppendArgs& a);

// out[r, j] = bf16(silu(g)·u) for g = gu[r, j], u = gu[r, n + j] (gate |
// up by row, f32, as a GEMM leaves the stacked projection), in f32 with
// the GEMV epilogue's formula: the decode step's SwiGLU where its gate|up
// and down run through cuBLASLt (CudaModelOptions::cublas_decode_rows).
struct SwigluRowsArgs {
  const float* gu = nullptr;  // [rows, 2·n]
  bf16_bits* out = nullptr;   // [rows, n]
  int64_t rows = 0, n = 0;
  bool overlap = false;
};
Status swiglu_rows(CudaContext& ctx, const SwigluRowsArgs& a);

// attention_decode_batch (attention.h) with chunks of at least min_chunk
// keys per block (0: its default, 32 keys below 256 (sequence, head) pairs,
// 128 from there): fewer, longer blocks leave room on the SMs for the next
// kernel's blocks, which fill their weight rings meanwhile (gemv_bulk.cu).
struct AttentionDecodeBatchArgs;
Status attention_decode_batch_chunked(const AttentionDecodeBatchArgs& a, int min_chunk);
// Whether attention_decode_batch takes the cluster kernel for a (its
// kernel field aside: what kAuto picks) on the current device.
bool attention_decode_cluster_fits(const AttentionDecodeBatchArgs& a);

// next[r] = the column of the largest logits[r, :] (the first of equals;
// NaN never wins; a row of NaN gives 0), a cluster of
// blocks per row on sm_90+. With feed.tokens set, the pick also becomes the
// next decode step's input on the device: tokens[r] = next[r],
// positions[r] += 1, and host_ring[r·ring_slots + p mod ring_slots] =
// next[r] for the position p the row's token had (mapped pinned memory the
// host reads once the step's event has completed). Greedy decoding then
// needs nothing from the host between steps.
// (GreedyFeed and SeenPenalty are declared above GemvArgs.)
struct GreedyPickArgs {
  const float* logits = nullptr;  // [rows, vocab]
  int32_t* next = nullptr;        // [rows]
  int64_t rows = 0, vocab = 0;
  GreedyFeed feed{};
  bool overlap = false;
  SeenPenalty penalty{};
};
Status greedy_pick(CudaContext& ctx, const GreedyPickArgs& a);

// next[r] = a token drawn from logits row r (sm_90+; vocabularies up to
// 262,144): x = logit · inv_temperature, then top-k (0: off), the softmax,
// top-p (1: off) and min-p (0: off) as the CPU sampler applies them
// (engine/sampler.h), and the draw by inverse CDF over the survivors in id
// order with u from (seed, r, salt), where salt is the row's position when
// fed (feed.positions[r] before the step moves it), else `salt`. The same
// inputs give the same token. The feed as greedy_pick's.
struct SampleArgs {
  const float* logits = nullptr;  // [rows, vocab]
  int32_t* next = nullptr;        // [rows]
  int64_t rows = 0, vocab = 0;
  float inv_temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f;
  uint64_t seed = 0;
  int64_t salt = 0;
  GreedyFeed feed{};
  bool overlap = false;
  SeenPenalty penalty{};  // applied before the temperature, as the CPU does
};
Status sample_pick(CudaContext& ctx, const SampleArgs& a);

// Whether device supports `overlap` (compute capability 9.0 or later).
bool supports_overlap(int device);

}  // namespace lathe::cuda
