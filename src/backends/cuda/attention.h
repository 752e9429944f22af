// Attention on the GPU: the flash-style kernels for training (packed
// variable-length documents, forward and backward) and for generation (query
// rows at positions pos0.. against a contiguous KV cache). The semantics are
// those of ops/attention.h — causal, grouped-query (head h reads KV head
// h / (n_head / n_head_kv)), optional sliding window, softmax in fp32 — with
// bf16 tensors on the device and fp32 log-sum-exp. The [seq × seq] score
// matrix is never stored: each block of 64 to 192 query rows walks its
// visible keys 64 (or 128) at a time with a running max and sum.
//
// Arguments are raw device pointers plus sizes (the kernels borrow, never
// allocate); `stream` is a cudaStream_t (nullptr: the legacy stream). Only
// head_dim 32, 64 and 128 are compiled; other sizes are refused. In a build
// without CUDA every call returns "no CUDA" (attention_stub.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace lathe::cuda {

// Which forward kernel runs where the call leaves it open (simple false,
// warp_rows 0, wgmma false).
enum class AttnFwdKernels {
  kAuto,   // what LATHE_ATTN_FWD names (mma | wgmma | ws | ws-persistent; env.h), else the compiled default: the
           // warp-specialized kernel where it runs (Hopper, head_dim 64 and 128; LATHE_ATTN_FWD_WS_AUTO=0 builds
           // without), else mma.sync. The Hopper ones fall back to mma.sync where they do not run (another
           // device, head_dim 32)
  kMma,    // the mma.sync kernel (warp_rows rows per warp)
  kWgmma,  // the Hopper kernel of one or two warpgroups (wgmma_rows); refused where it does not run
  kWs,     // the warp-specialized Hopper kernel (ws_rows, ws_keys); refused where it does not run
};

// Training forward over packed documents: document d holds token rows
// [cu_seqlens[d], cu_seqlens[d + 1]) of q, k, v, out and lse. out's rows may
// be ld_out elements apart (the first n_head·head_dim columns of a wider
// matrix; an even stride).
struct AttentionVarlenFwdArgs {
  const void* q = nullptr;              // bf16 [n_tokens, n_head, head_dim]
  const void* k = nullptr;              // bf16 [n_tokens, n_head_kv, head_dim]
  const void* v = nullptr;              // bf16 [n_tokens, n_head_kv, head_dim]
  void* out = nullptr;                  // bf16 [n_tokens, n_head, head_dim]
  float* lse = nullptr;                 // f32 [n_tokens, n_head]; may be null when not training
  const int32_t* cu_seqlens = nullptr;  // device i32 [n_docs + 1]: 0, ..., n_tokens
  int n_docs = 0;
  int max_seqlen = 0;  // >= the longest document (sizes the launch grid)
  int n_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int window = 0;  // sliding window in tokens; 0: none
  float scale = 1.0f;
  void* stream = nullptr;
  bool simple = false;  // the plain single-buffered kernel, kept as an oracle for the pipelined one
  int warp_rows = 0;    // query rows per warp of the fast kernel (16 or 32); 0: the compiled default (32)
  bool wgmma = false;   // the Hopper (wgmma) kernel instead: head_dim 64 or 128 on compute capability 9.x
  int wgmma_rows = 0;   // its query rows per thread block (64 or 128); 0: the compiled default
  int64_t ld_out = 0;   // out's row stride in elements; 0: n_head·head_dim
  AttnFwdKernels kernels = AttnFwdKernels::kAuto;  // ignored when simple, warp_rows or wgmma is set
  // The warp-specialized kernel (head_dim 64 or 128 on compute capability 9.x): query rows per thread
  // block, 128 (two consumer warpgroups) or 192 (three; head_dim 64 only), and keys per K/V tile, 64 or
  // 128; 0: the compiled defaults.
  int ws_rows = 0;
  int ws_keys = 0;
  // Its grid: one block per SM, each taking query tiles in turn (1), or a block per tile (0); -1: the
  // compiled default.
  int ws_persistent = -1;
};
Status attention_varlen_forward(const AttentionVarlenFwdArgs& a);

// Backward: d_q, d_k, d_v are overwritten. d_k/d_v of a KV head sum over the
// query heads sharing it inside one thread block (no atomics), so the result
// is deterministic. workspace holds D = rowsum(d_out ⊙ out) per row and head.
// The fast kernels come in four builds: mma.sync (every device, every
// compiled head_dim; d_q in a kernel of its own), wgmma (Hopper, head_dim 64
// and 128; the same split), warp-specialized (the same on Hopper, fed by
// TMA) and fused (mma.sync, one kernel: each key tile's
// block also adds its share of d_q into an f32 copy in the workspace, the
// blocks of one query tile taking turns in a fixed order, so the bits do not
// depend on timing either).
enum class AttnBwdKernels {
  kAuto,   // the compiled default (kWsDs where it runs, else mma.sync; LATHE_ATTN_BWD_WS_AUTO=0: mma.sync;
           // LATHE_ATTN_BWD_FUSED_AUTO=64: fused up to head_dim 64; LATHE_ATTN_BWD_SM90_AUTO=1: wgmma where it
           // runs), or what the environment names: LATHE_ATTN_BWD=mma|wgmma|fused|ws|ws-ds (env.h)
  kMma,    // the mma.sync kernels
  kWgmma,  // the Hopper kernels; refused where they do not run
  kFused,  // the one-kernel backward (its workspace is larger: see below)
  kWs,     // the warp-specialized Hopper kernels (attention_bwd_ws.cu: TMA producer, consumer warpgroups holding
           // their accumulators, d_q beside dk/dv as with kMma); head_dim 64 and 128; refused where they do not run
  kWsDs,   // kWs whose dk/dv kernel also stores each tile pair's dS (bf16) in the workspace, d_q then one product
           // of those tiles with K instead of a kernel recomputing S and dP; without a window and where the
           // workspace holds the batch's pairs (attention_varlen_backward_workspace_bytes with max_seqlen), else kWs
};
struct AttentionVarlenBwdArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;    // bf16, from the forward (rows ld_out apart)
  const float* lse = nullptr;   // f32, from the forward
  const void* d_out = nullptr;  // bf16 [n_tokens, n_head, head_dim]
  void* d_q = nullptr;          // bf16 [n_tokens, n_head, head_dim]
  void* d_k = nullptr;          // bf16 [n_tokens, n_head_kv, head_dim]
  void* d_v = nullptr;          // bf16 [n_tokens, n_head_kv, head_dim]
  const int32_t* cu_seqlens = nullptr;
  void* workspace = nullptr;  // >= attention_varlen_backward_workspace_bytes(n_tokens, n_head, head_dim, kernels)
  int n_docs = 0, max_seqlen = 0;
  int n_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int window = 0;
  float scale = 1.0f;
  void* stream = nullptr;
  bool simple = false;  // the plain kernels, kept as an oracle for the fast ones
  AttnBwdKernels kernels = AttnBwdKernels::kAuto;  // which fast kernels (ignored when simple)
  int wgmma_rows = 0;  // query / key rows per thread block of the wgmma kernels: 64, 128; 0: the compiled default
  int64_t ld_out = 0;  // out's row stride in elements; 0: n_head·head_dim
  bool fused_load_store = false;  // fused: add the d_q shares by load, add, store (default: reductions in L2)
  size_t workspace_bytes = 0;  // the workspace's size (kWsDs: whether this batch's dS tiles fit; 0: they do not)
  // kWsDs: up to two regions of memory that nothing reads or writes during the call, 16-byte aligned, where
  // the first dS tiles go (whole 8 KiB tiles: region 0's, then region 1's; the rest in the workspace); may
  // be null.
  void* ds_spare[2] = {nullptr, nullptr};
  size_t ds_spare_bytes[2] = {0, 0};
};
// The workspace for `kernels` (kAuto resolved as the backward resolves it):
// the fused kernel adds an f32 [n_tokens, n_head, head_dim] d_q and a turn
// counter per row and head; head_dim 0 sizes for the largest compiled (128).
// kWsDs with max_seqlen > 0 adds the dS tiles (8 KiB each, per head) of
// any batch of n_tokens rows whose documents are at most max_seqlen long
// and number at most max_docs (0: ceil(n_tokens / max_seqlen)); more
// documents fit when they are shorter (attention_ds_pair_bound), less the
// tiles the spare regions of AttentionVarlenBwdArgs::ds_spare hold
// (attention_ds_spare_tiles of their sizes).
size_t attention_varlen_backward_workspace_bytes(int64_t n_tokens, int n_head, int head_dim = 0,
                                                 AttnBwdKernels kernels = AttnBwdKernels::kAuto,
                                                 int64_t max_seqlen = 0, int64_t max_docs = 0,
                                                 int64_t ds_spare_tiles = 0);
// The dS tiles (8 KiB each) a spare region of `bytes` holds.
inline int64_t attention_ds_spare_tiles(size_t bytes) { return int64_t(bytes / 8192); }
// kWsDs: at most how many (64-row query tile, 64-key tile) pairs a batch of
// n_tokens rows in n_docs documents of at most max_seqlen rows sees. A
// document of n rows has t = ceil(n/64) ≤ t_max query tiles and t(t + 1)/2
// pairs, and the t sum to at most s = floor((n_tokens + 63·n_docs)/64);
// t(t + 1)/2 being convex, the sum is largest with as many documents as
// possible at t_max and one holding the rest.
inline int64_t attention_ds_pair_bound(int64_t n_tokens, int64_t n_docs, int64_t max_seqlen) {
  const int64_t t_max = (max_seqlen + 63) / 64, s = (n_tokens + 63 * n_docs) / 64;
  if (t_max <= 0) return 0;
  const int64_t full = s / t_max, rest = s % t_max;
  return full * (t_max * (t_max + 1) / 2) + rest * (rest + 1) / 2;
}
Status attention_varlen_backward(const AttentionVarlenBwdArgs& a);
// The backward's first kernel alone (for benches and tests): D =
// rowsum(d_out ⊙ out) per token and head into the workspace's first
// n_tokens·n_head floats; reads only out, d_out, ld_out, the shape, simple
// (the one-warp-per-row kernel) and stream.
Status attention_varlen_backward_delta(const AttentionVarlenBwdArgs& a);

// A check of the two tensor-core products the wgmma backward is built from,
// on one pair of row-major bf16 [64, head_dim] matrices A and B (Hopper,
// head_dim 64 or 128): s[0:4096] = A·Bᵀ and s[4096:8192] = B·Aᵀ (row-major
// f32 [64, 64]), o = bf16(A·Bᵀ)·B (row-major f32 [64, head_dim]), and
// where s_regs is set, A·Bᵀ again with A's operand read from registers (the
// warp-specialized backward's score products). A test compares them with
// host products, so a layout fault shows by itself.
struct AttentionWgmmaCheckArgs {
  const void* a = nullptr;  // bf16 [64, head_dim], device
  const void* b = nullptr;  // bf16 [64, head_dim], device
  float* s = nullptr;       // f32 [2, 64, 64], device
  float* o = nullptr;       // f32 [64, head_dim], device
  int head_dim = 0;
  void* stream = nullptr;
  float* s_regs = nullptr;  // f32 [64, 64], device; optional
};
Status attention_wgmma_check(const AttentionWgmmaCheckArgs& a);

// Generation: query row i sits at position pos0 + i and sees cache rows
// 0 .. pos0 + i (and only j > pos − window with a window). One token is
// split over the context in chunks whose partial results are merged by a
// second kernel; several tokens (prefill into the cache) take the tensor-core
// kernel of the training forward.
struct AttentionDecodeArgs {
  const void* q = nullptr;        // bf16 [n_tokens, n_head, head_dim]
  const void* k_cache = nullptr;  // bf16 [n_ctx, n_head_kv, head_dim], rows 0 .. pos0 + n_tokens − 1 written
  const void* v_cache = nullptr;  // bf16 [n_ctx, n_head_kv, head_dim]
  void* out = nullptr;            // bf16 [n_tokens, n_head, head_dim]
  float* lse = nullptr;           // f32 [n_tokens, n_head]; may be null
  void* workspace = nullptr;      // >= attention_decode_workspace_bytes() bytes
  int n_tokens = 0, n_ctx = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int pos0 = 0;
  int window = 0;
  float scale = 1.0f;
  void* stream = nullptr;
  AttnFwdKernels prefill_kernels = AttnFwdKernels::kAuto;  // the forward kernel of several tokens
};
size_t attention_decode_workspace_bytes(int n_tokens, int n_head, int head_dim);
Status attention_decode(const AttentionDecodeArgs& a);

// One new token for each of n_seqs sequences, each with its own cache (as
// above) and position; everything the kernels read lies on the device, so
// a captured CUDA graph replays for any positions up to max_ctx. Sequence s
// attends with query row s of q to rows 0 .. pos[s] of its cache.
// Workspace: attention_decode_workspace_bytes(n_seqs, n_head, head_dim),
// zeroed before the first call (the split-K kernel counts its blocks there
// and leaves the counts zero; attention_decode() does not touch them). One
// kernel; `overlap`: a programmatic dependent launch (decode_ops.h). Under
// `overlap` the cluster kernel reads pos and each cache's rows before pos[s]
// before it waits for the previous kernel: that kernel may write q and row
// pos[s], never those.
//
// Kernels: kCluster (sm_90+, head_dim 64 or 128, up to
// kDecodeClusterMaxSeqs sequences and a context that fits its registers:
// attention_decode_cluster_fits, decode_ops.h): one cluster of blocks per (sequence, kv
// head), each block a share of the keys for cluster_heads query heads of
// the group, merged through distributed shared memory; kSplitK: blocks per
// (sequence, head, chunk of keys), the last merging through the workspace.
// kAuto takes kCluster where it runs. A sequence's result depends on the
// kernel (and its split), never on the other sequences of the batch.
enum class DecodeKernel : uint8_t { kAuto, kSplitK, kCluster };
inline constexpr int kDecodeClusterMaxSeqs = 4;
struct AttentionDecodeBatchArgs {
  const void* q = nullptr;                // bf16 [n_seqs, n_head, head_dim]
  const void* const* k_caches = nullptr;  // device array of n_seqs device pointers, 16-byte aligned
  const void* const* v_caches = nullptr;  // device array of n_seqs device pointers
  const int32_t* pos = nullptr;           // device i32 [n_seqs]: 0 <= pos[s] < max_ctx
  void* out = nullptr;                    // bf16 [n_seqs, n_head, head_dim]
  float* lse = nullptr;                   // f32 [n_seqs, n_head]; may be null
  void* workspace = nullptr;
  int n_seqs = 0, max_ctx = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int window = 0;
  float scale = 1.0f;
  void* stream = nullptr;
  bool overlap = false;
  DecodeKernel kernel = DecodeKernel::kAuto;
  // kCluster: query heads per block at most, 1, 2 or 4 (the most of those dividing the group; 0: 1 at head_dim 64,
  // else 2).
  int cluster_heads = 0;
};
Status attention_decode_batch(const AttentionDecodeBatchArgs& a);

}  // namespace lathe::cuda
