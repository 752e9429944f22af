// One decode step of one sequence as a single persistent kernel
// (decode_fused.cu): every stage of every layer (the q|k|v GEMV with its
// norm and RoPE + cache append, the attention, o, gate|up, down, the LM
// head and its pick) run by one block per SM, the stages ordered by one
// counter in device memory instead of kernel boundaries. Each block's
// producer warp streams the weights of every GEMV of the step into its
// shared-memory ring without ever waiting for an activation, so the DRAM
// stays busy across the stages' dependencies. Stubs in decode_stub.cpp.
#pragma once

#include <cstdint>

#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {

// One layer's attention of the new token (one sequence): q after RoPE, the
// caches holding rows [0, pos] (row pos written by the q|k|v stage), out
// the bf16 [n_head, head_dim] that o reads. part and counts are the
// kernel's scratch (decode_fused_part_floats floats; n_head_kv counts, zero
// between steps and left zero).
struct FusedAttention {
  const bf16_bits* q = nullptr;        // [n_head, head_dim]
  const bf16_bits* k_cache = nullptr;  // [max_ctx, n_head_kv, head_dim]
  const bf16_bits* v_cache = nullptr;  // [max_ctx, n_head_kv, head_dim]
  const int32_t* pos = nullptr;        // device [1]
  bf16_bits* out = nullptr;            // [n_head, head_dim]
  float* part = nullptr;
  unsigned* counts = nullptr;
  int n_head = 0, n_head_kv = 0, head_dim = 0, window = 0, max_ctx = 0;
  float scale = 1.0f;
};

enum class DecodeStageKind : uint8_t { kGemv, kAttention };
// A stage: a GEMV on the ring (one x row; kRopeAppend, kAddF32, kSwigluF32
// or kStoreF32, k a multiple of 8) or an attention. Stage s starts once
// every block has finished stage s − 1.
struct DecodeStage {
  DecodeStageKind kind = DecodeStageKind::kGemv;
  bool take_pick = false;  // the GEMV takes DecodeFusedArgs::pick (the LM head)
  GemvArgs gemv{};
  FusedAttention attention{};
};

struct DecodeFusedArgs {
  const DecodeStage* stages = nullptr;  // device [n_stages]
  int n_stages = 0;
  unsigned* counter = nullptr;  // device; zero between steps, left zero
  GemvPick pick{};              // for the stage with take_pick (pick.next null: none)
  // Units a producer keeps requested and not yet landed (1..6): enough for
  // the DRAM's bandwidth, few enough that a stage's last units are not
  // queued behind the next stage's.
  int in_flight = 2;
  // 1: a block per SM with a 192 KiB ring; 2: two with 96 KiB each (in_flight
  // at most 3, attention_width at most 256).
  int blocks_per_sm = 1;
  int attention_width = 0;  // query heads per kv head × head_dim of the attention stages (at most 512)
  bool overlap = false;     // a programmatic dependent launch after the step's inputs
};

// Whether decode_fused() takes an attention of this shape on device (sm_90+).
bool decode_fused_supports(int n_head, int n_head_kv, int head_dim, int device);
// The floats of FusedAttention::part on device.
int64_t decode_fused_part_floats(int device);
// Checks the stage count and the launch; messages start with "cuda decode_fused: ".
Status decode_fused(CudaContext& ctx, const DecodeFusedArgs& a);

}  // namespace lathe::cuda
