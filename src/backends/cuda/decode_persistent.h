// The whole decode step of up to 4 sequences in one kernel launch
// (decode_persistent.cu): every layer's q|k|v (+RoPE, KV append),
// attention, o (+residual), gate|up (+SwiGLU), down (+residual), then the
// LM head, as stages of one persistent grid separated by grid-wide
// barriers instead of kernel boundaries. Each block owns the same run of
// every projection's output columns as the ring GEMV would give it
// (gemv_bulk.cu) and streams its weights through its shared-memory ring
// without ever waiting for a stage: while the block multiplies one stage,
// waits at a barrier or runs its share of the attention, the next stages'
// weights are already on their way. Stubs in decode_stub.cpp.
#pragma once

#include <cstdint>

#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {

// The stage list: gemvs holds, per layer, the GemvArgs of q|k|v
// (kRopeAppend: its rope fields also tell the attention where q and each
// sequence's caches are), o (kAddF32 into the residual stream), gate|up
// (kSwigluF32, normed from x_f32), down (kAddF32, x_f32 = the SwiGLU
// output), then one more for the LM head (kStoreF32, normed). Each is what
// gemv() would take with rows = this step's rows, the ring shape aside.
struct PersistentDecodeArgs {
  const GemvArgs* gemvs = nullptr;  // device [4·n_layer + 1], not written while the kernel runs
  int n_layer = 0, rows = 0;        // rows 1..4 (the sequences of the step)
  bf16_bits* attn_out = nullptr;    // [rows, n_head·head_dim], the o projection's x
  float* workspace = nullptr;       // attention_decode_workspace_bytes(rows, n_head, head_dim), counts zero
  unsigned* barrier = nullptr;      // device [2], zero before the first call; every call leaves them zero
  int window = 0;                   // sliding window (0: none)
  float scale = 1.0f;               // softmax scale
  int ring_kib = 0;                 // per block (0: kGemvBulkRingKib for one row, 192 for more)
  int min_keys = 0;                 // keys per attention block at least (0: 32)
  int l2_ahead = 0;                 // weight units (32 KiB) per block pulled into L2 ahead of its ring (0: none)
  bool overlap = false;             // a programmatic dependent launch (the producer starts before the wait)
  // Diagnostics (the bench): when set, each block's first thread writes the
  // global timer (ns) to trace[e·grid + block] at event e: 2·s when stage s
  // (per layer: q|k|v, attention, o, gate|up, down) ends, 2·s + 1 when its
  // barrier lets the block go; 10·n_layer when the LM head ends;
  // 10·n_layer + 1 when the block starts (after waiting for the previous
  // kernel). grid: decode_persistent_grid().
  uint64_t* trace = nullptr;
  // Diagnostics (the bench): only the GEMV stages, no attention and no
  // barriers (the results are meaningless): what the weights' streaming
  // through the rings costs by itself.
  bool gemv_only = false;
};
// The host copy of the stage list is checked here (every GemvArgs as gemv()
// checks it, shapes of one model); a.gemvs must hold the same on the device.
Status decode_persistent(CudaContext& ctx, const PersistentDecodeArgs& a, const GemvArgs* host_gemvs);
// Sets up the kernel of (device, head_dim, rows, ring_kib) for
// decode_persistent: once before the first call, and never while a stream
// is being captured (it sets kernel attributes and asks for occupancy).
Status decode_persistent_prepare(int device, int head_dim, int rows, int ring_kib);
// The blocks of the step's grid (after decode_persistent_prepare), or 0.
int decode_persistent_grid(int device, int head_dim, int rows, int ring_kib);
// Whether the device and head_dim take the persistent step (sm_90+, head_dim 64 or 128).
bool decode_persistent_supported(int device, int head_dim);

}  // namespace lathe::cuda
