// The state of a CudaCausalLM (cuda_causal_lm.h), shared by the files that
// implement it: cuda_causal_lm_load.cpp (planning the two device arenas and
// filling the weights) and cuda_causal_lm.cpp (prefill, the decode step and
// the public calls). Private to src/models.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/generation_ops.h"
#include "backends/cuda/stream_fork.h"
#include "models/cuda_causal_lm.h"
#include "models/weight_loader.h"

namespace lathe {

using cuda::bf16_bits;

namespace cuda_lm {

constexpr int kMaxBatch = 256;      // sequences one model holds at most
constexpr int64_t kFusedNormRows = 4;  // decode rows whose pre-norm runs inside the GEMV

struct LayerWeights {
  bf16_bits* qkv_w = nullptr;      // [q_dim + 2·kv_dim, hidden]: q_proj, k_proj, v_proj rows
  bf16_bits* qkv_b = nullptr;      // [q_dim + 2·kv_dim] or null
  bf16_bits* o_w = nullptr;        // [hidden, q_dim]
  bf16_bits* o_b = nullptr;        // [hidden] or null
  bf16_bits* q_norm = nullptr;     // [head_dim] or null
  bf16_bits* k_norm = nullptr;     // [head_dim] or null
  bf16_bits* gu_w = nullptr;       // [2·ffn, hidden]: gate_proj, up_proj rows
  bf16_bits* gu_b = nullptr;       // [2·ffn] or null
  bf16_bits* down_w = nullptr;     // [hidden, ffn]
  bf16_bits* down_b = nullptr;     // [hidden] or null
  bf16_bits* attn_norm = nullptr;  // [hidden]
  bf16_bits* mlp_norm = nullptr;   // [hidden]
};

// Activations and per-step inputs, each sized for R = max(max_forward_tokens,
// max_batch) rows unless said otherwise.
struct StateBuffers {
  int32_t* tokens = nullptr;     // [R]
  int32_t* positions = nullptr;  // [R] right after tokens (one upload); prefill: the pass's; decode: sequence s's
  float* cos = nullptr;          // [R, head_dim / 2]
  float* sin = nullptr;          // [R, head_dim / 2]
  float* h = nullptr;            // [R, hidden] the residual stream (f32)
  float* delta = nullptr;        // [R, hidden] prefill's attention or MLP output (f32)
  bf16_bits* normed = nullptr;   // [R, hidden]
  bf16_bits* qkv = nullptr;      // [R, q_dim + 2·kv_dim] prefill: [q | k | v] by part; decode: by row
  bf16_bits* q = nullptr;        // [max_batch, q_dim] decode: q after RoPE
  bf16_bits* attn = nullptr;     // [R, q_dim]
  bf16_bits* gu = nullptr;       // [R, 2·ffn] prefill: [gate | up] by part, then silu(gate)·up
  float* act = nullptr;          // [max_batch, ffn] decode: silu(gate)·up, f32
  float* qkv32 = nullptr;        // [max_batch, q_dim + 2·kv_dim] decode: the projection by row, f32
  float* gu32 = nullptr;         // [max_batch, 2·ffn] decode through cuBLASLt (cublas_decode_rows): gate | up, f32
  bf16_bits* act16 = nullptr;    // [max_batch, ffn] the same: silu(gate)·up rounded to bf16 for down's GEMM
  float* logits = nullptr;       // [max(max_logit_rows, max_batch), vocab]
  void* attn_workspace = nullptr;
  int32_t* next_token = nullptr;  // [max_batch] greedy picks
  uint32_t* seen = nullptr;       // [max_batch, seen_words] the tokens each sequence holds, a bit per id
  cuda::GemvPickSlot* pick_slots = nullptr;  // [cuda::kGemvPickSlots] the LM head's fused greedy pick
  unsigned* pick_count = nullptr;            // its count (zero between steps)
  // Per layer 2·S slots (S = max_batch rounded up to even): sequence s's k
  // cache at slot s, its v cache at S + s (the pointer arrays of
  // attention_decode_batch and rope_append, each 16-byte aligned).
  bf16_bits** cache_ptrs = nullptr;
  // Above kFusedNormRows sequences: the split-k scratch of the decode GEMVs
  // whose grid splits (CudaGemvGrid::split); zero between calls.
  cuda::GemvSplit split{};
};

// One layout walked twice: without an arena it sizes the plan, with one it
// hands out the buffers in the same order.
class Carver {
 public:
  explicit Carver(cuda::DeviceArena* arena) : arena_(arena) {}
  template <class T>
  Result<T*> take(int64_t n, const char* what) {
    if (!arena_) {
      plan_.add(static_cast<size_t>(n) * sizeof(T));
      return static_cast<T*>(nullptr);
    }
    return arena_->alloc_n<T>(n, what);
  }
  size_t planned_bytes() const { return plan_.total_bytes(); }

 private:
  cuda::DeviceArena* arena_;
  cuda::ArenaPlan plan_;
};

}  // namespace cuda_lm

// CudaCausalLM::start_decode()'s state: steps issued and taken, each
// sequence's length at the start, the ring of picks in mapped pinned memory
// ([max_batch, kDecodeDepth]; the pick of the token at position p in slot p
// mod kDecodeDepth) and an event per slot.
struct DecodeChain {
  bool active = false;
  int b = 0;
  int64_t issued = 0, taken = 0, limit = 0;
  std::vector<int32_t> pending;  // host-fed fallback: the next step's input
  std::vector<int> len0;
  cuda::PinnedBuffer ring;
  std::vector<cuda::CudaEvent> done;
  std::vector<cuda::CudaGraph> graphs;  // [max_batch + 1] by B: the step and its pick with the feed
  CudaSampling sampling;                // how the picks are made
  CudaSampling captured;                // what the graphs were captured with
};

class CudaCausalLmImpl {
 public:
  ModelConfig cfg;
  FamilyQuirks quirks;
  std::vector<float> inv_freq;
  CudaModelOptions opts;
  int64_t hidden = 0, hd = 0, half = 0, q_dim = 0, kv_dim = 0, qkv_dim = 0, ffn = 0, vocab = 0;
  int n_layer = 0, max_tokens = 0;  // max_tokens: one pass's most tokens
  bool flash = true;                // head_dim 64/128 and no simple_attention
  int64_t n_params = 0;

  cuda::CudaContext ctx;
  cuda::DeviceArena weight_arena, state_arena;
  std::vector<cuda_lm::LayerWeights> layers;
  bf16_bits* embed = nullptr;       // [vocab, hidden]
  bf16_bits* final_norm = nullptr;  // [hidden]
  bf16_bits* lm_head = nullptr;     // [vocab, hidden] (embed when tied)
  float* inv_freq_dev = nullptr;    // [half]
  std::vector<bf16_bits*> k_cache, v_cache;  // per layer [max_batch, max_seq, n_head_kv, head_dim]
  cuda_lm::StateBuffers buf;
  int ptr_slots = 2;       // S above
  int64_t seen_words = 0;  // ceil(vocab / 32)
  bool decode_gemv = true;  // the decode step's shapes suit gemv(); otherwise decode runs the prefill path
  bool overlap = false;     // decode kernels as programmatic dependent launches
  CudaL2PrefetchUnits env_l2_prefetch{};  // LATHE_CUDA_DECODE_L2_PREFETCH, read at load (-1: unset)
  int env_l2_prefetch_lag = -1;            // LATHE_CUDA_DECODE_L2_PREFETCH_LAG, read at load

  std::vector<int> seq_len;             // [max_batch] tokens in each sequence's cache
  std::vector<bool> decoded_eagerly;    // [max_batch + 1] by B: an eager step of B ran
  std::vector<cuda::CudaGraph> graphs;  // [max_batch + 1] by B
  std::vector<int32_t> host_step;       // staging [2·R]: tokens at 0, positions at R (buf.tokens' layout)
  DecodeChain chain;

  Status init(const ModelHeader& header, const CudaModelOptions& options);
  Status allocate();
  Status lay_out_weights(cuda_lm::Carver& c);
  Status lay_out_state(cuda_lm::Carver& c);
  Status upload_weights(WeightLoader& wl, const std::string& dir);
  Status upload_layer(WeightLoader& wl, int i);
  Status random_weights(uint64_t seed, float init_range);

  bf16_bits* k_at(int l, int seq) const { return k_cache[l] + int64_t(seq) * opts.max_seq * kv_dim; }
  bf16_bits* v_at(int l, int seq) const { return v_cache[l] + int64_t(seq) * opts.max_seq * kv_dim; }
  bf16_bits* const* k_ptrs(int l) const { return buf.cache_ptrs + int64_t(l) * 2 * ptr_slots; }
  bf16_bits* const* v_ptrs(int l) const { return k_ptrs(l) + ptr_slots; }

  // Prefill: n tokens of one sequence.
  Status project(const bf16_bits* x, int64_t k, const bf16_bits* w, const bf16_bits* b, bf16_bits* out, int64_t n,
                 std::initializer_list<int64_t> parts);
  Status prefill_attention(int l, int64_t n, int seq, int pos0, const bf16_bits* q);
  Status prefill_layer(int l, int64_t n, int seq, int pos0);
  Status pass(int64_t n, int seq, int pos0, int64_t logit_rows);
  Status run(int seq, std::span<const int32_t> tokens, int64_t logit_rows);
  Status check_tokens(int seq, std::span<const int32_t> tokens) const;
  Status upload_step(std::span<const int32_t> tokens, const std::function<int32_t(int64_t)>& position);
  // Decode: one token for each of sequences 0..b−1.
  Status norm_gemv(const bf16_bits* norm_w, cuda::GemvArgs g);
  cuda::GemvArgs with_grid(cuda::GemvArgs g, CudaGemvGrid grid) const;
  const CudaDecodeShapes& decode_grids(int b) const;
  cuda::GemvArgs qkv_gemv(int l, int b) const;  // layer l's q|k|v projection as the step launches it
  cuda::GemvArgs lm_head_gemv(int b) const;
  // g with the L2 prefetch of next's first units as the options ask of g's
  // source (the member of CudaL2PrefetchUnits).
  cuda::GemvArgs prefetching(cuda::GemvArgs g, const cuda::GemvArgs& next, int CudaL2PrefetchUnits::*source) const;
  Status decode_attention(int l, int b);
  // Whether decode layer l (-1: the LM head) of a b-sequence step runs its projections through cuBLASLt.
  bool decode_gemms(int l, int b) const;
  Status decode_layer_gemms(int l, int b);
  Status decode_layer(int l, int b);
  // With `pick`, the LM head picks greedily as enqueue_pick would (fused_pick()).
  Status decode_step(int b, const cuda::GemvPick* pick = nullptr);
  // The greedy pick of enqueue_pick(b, fed, sa) fused into the LM head, when
  // sa is greedy and the LM head runs on the ring; else pick.next is null.
  cuda::GemvPick fused_pick(int b, bool fed, const CudaSampling& sa) const;
  Status decode(std::span<const int32_t> tokens);
  Status enqueue_step(int b);  // eagerly, or as this b's graph (captured on its second step)
  // The pick of the step's logits under sa (greedy_pick or sample_pick),
  // feeding the next step when fed; salt for an unfed draw.
  Status enqueue_pick(int b, bool fed, const CudaSampling& sa, int64_t salt = 0);
  cuda::GreedyFeed pick_feed(bool fed) const;  // a pick's feed of the next step (none unless fed)
  Status clear_seen_of_empty(int b);  // zeroes the token bitmaps of sequences 0..b−1 that hold nothing yet
  Status enqueue_chain_step();  // one more step of the chain, then its event
  void drop_graphs();
  void end_chain();  // waits for the queued steps; every call that touches a cache runs it first
};

}  // namespace lathe
