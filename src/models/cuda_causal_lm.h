// A Llama-family causal LM on one NVIDIA GPU, for generation: bf16 weights
// (f32/f16 files converted at load, a PEFT adapter merged at load as on the
// CPU), up to max_batch sequences each with its own bf16 KV cache and
// length, prefill (the flash forward over a prompt into one sequence's
// cache) and decode: one token for each of sequences 0..B−1 in one step.
// Every device buffer is planned and allocated at load from the options'
// sizes; a forward pass allocates nothing. A decode step runs as a captured
// CUDA graph (one per B): the token ids, positions and cache pointers it
// reads live in device memory, so one capture replays for every later step.
//
// Same families and quirks as CausalLM (family.h). head_dim 64 and 128 take
// the flash kernels; other head dims (up to 256) take the plain attention
// kernel (head_dim 32 too: on the Qwen3 fixture the flash kernels' bf16
// probabilities leave too little margin under Hugging Face's own error). Threads: one thread drives a CudaCausalLM (it owns its stream).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "io/hf_config.h"
#include "models/family.h"

namespace lathe {

// The decode step's GEMV grids up to 4 sequences, by projection: block
// shape (GemvArgs::shape; 4 = kGemvBulkShape: the shared-memory ring of
// ring_kib KiB, 0: its default, with per_sm blocks per SM, 0: 1) and
// whether persistent (GemvArgs::persistent, unless
// CudaModelOptions::persistent_gemv is off); above 4 sequences every one
// takes kCudaDecodeShapesMany (below). kCudaDecodeShapes, the fastest in the bench's kernel table
// (bench_generate_cuda) on the H200: the ring of 96 KiB, two blocks per SM,
// for every projection (8B: q|k|v 15.3 us, o 9.8, gate|up 56.7 (96% of the
// bandwidth), down 28.4, the LM head 234). kCudaDecodeRegisterShapes, the
// fastest before the ring (CudaModelOptions::register_gemv): 16-row blocks
// (shape 3) for the projections of k = hidden (8B: q|k|v 17.0, gate|up
// 67.0, the LM head 255), 256-thread blocks (shape 2) for o (12.1) and down
// (32.3); no persistent grid won. Those were measured at one sequence: at
// 2-4 the ring's products need more registers (125 at 2 rows, 168 at 4)
// than two blocks per SM leave, so its grid of 2/SM runs as two waves.
// Measured whole steps (tok/s, 1B / 8B): 2 sequences, kCudaDecodeShapes
// 1385 / 346, the ring of 96 KiB at one block per SM 1521 / 369, the
// register grids 1371 / 330; 4 sequences 1951 / 461, 2056 / 475 and 2233 /
// 492. So cuda_decode_shapes(rows): kCudaDecodeShapes for one sequence,
// kCudaDecodeShapes2 (the ring at one block per SM) for two to four: the
// ring's sums do not depend on its grid, so a sequence decoded in a batch
// on the ring keeps the logits it has alone, bitwise (the register grids
// sum in another order). From 3 sequences on the decode step takes
// cuBLASLt by default instead (CudaModelOptions::cublas_decode_rows), so
// by default the ring runs one or two.
struct CudaGemvGrid {
  uint8_t shape = 0;
  bool persistent = true;
  uint16_t ring_kib = 0;
  uint8_t per_sm = 0;
  bool split = false;  // k split over several blocks of a row tile (GemvArgs::split)
};
struct CudaDecodeShapes {
  CudaGemvGrid qkv, o, gate_up, down, lm_head;
};
inline constexpr CudaGemvGrid kCudaRing96x2{4, false, 96, 2};
inline constexpr CudaDecodeShapes kCudaDecodeShapes{kCudaRing96x2, kCudaRing96x2, kCudaRing96x2, kCudaRing96x2,
                                                    kCudaRing96x2};
inline constexpr CudaDecodeShapes kCudaDecodeRegisterShapes{{3, false}, {2, false}, {3, false}, {2, false}, {3, false}};
inline constexpr CudaGemvGrid kCudaRing96x1{4, false, 96, 1};
inline constexpr CudaDecodeShapes kCudaDecodeShapes2{kCudaRing96x1, kCudaRing96x1, kCudaRing96x1, kCudaRing96x1,
                                                     kCudaRing96x1};
// Above 4 sequences (the tensor cores, 16 weight rows a block by default):
// down and the LM head at 64 rows a block with k split. H200, 2026-12-02,
// 16 sequences, per call (us; bench_generate_cuda --kernels 1, against the
// default block shape measured second, the first measured ran ~7% slow):
// 1B down 30.9 → 22.6, 8B down 63.5 → 59.6; the LM head about even (1B 157.6
// → 154.0-157.4, 8B 291.3 → 285.9-292.0 in two calls). Other shapes were
// within noise or slower somewhere
// (gate|up at 64 rows: 1B 25.4 → 23.6, 8B 71.7 → 75.6; split q|k|v, o and
// gate|up slower at both).
inline constexpr CudaGemvGrid kCudaMma64Split{2, false, 0, 0, true};
inline constexpr CudaDecodeShapes kCudaDecodeShapesMany{{0, false}, {0, false}, {0, false}, kCudaMma64Split,
                                                        kCudaMma64Split};
// The grids a decode step of `rows` sequences takes by default.
inline constexpr const CudaDecodeShapes& cuda_decode_shapes(int64_t rows) {
  return rows <= 1 ? kCudaDecodeShapes : rows <= 4 ? kCudaDecodeShapes2 : kCudaDecodeShapesMany;
}

// CudaModelOptions::l2_prefetch_each: units of its successor each decode
// GEMV pulls into L2, by source (-1: CudaModelOptions::l2_prefetch_units).
struct CudaL2PrefetchUnits {
  int qkv = -1, o = -1, gate_up = -1, down = -1, lm_head = -1;
};

struct CudaModelOptions {
  int device = 0;                // CUDA device index
  int max_seq = 0;               // KV cache rows: prompt + generated tokens (> 0)
  int max_forward_tokens = 0;    // most tokens one pass runs (longer inputs go in chunks); 0: max_seq
  int max_logit_rows = 1;        // most rows of logits one forward() returns (all_logits)
  int max_batch = 1;             // sequences held at once (decode_batch), each a KV cache of max_seq rows
  bool use_graphs = true;        // decode steps as a CUDA graph replay
  bool simple_attention = false;  // the plain attention kernel for every head_dim (a slow twin for tests)
  bool overlap_launches = true;   // decode kernels as programmatic dependent launches where the GPU has them (sm_90+)
  bool persistent_gemv = true;    // persistent GEMV grids where kCudaDecodeShapes picks them (none today)
  bool register_gemv = false;  // the decode GEMVs on kCudaDecodeRegisterShapes (the grids before the ring)
  // Every decode GEMV up to 4 sequences on the shared-memory ring
  // (GemvArgs::shape kGemvBulkShape, gemv_bulk.cu) with bulk_ring_kib KiB
  // and bulk_per_sm blocks per SM (0: the table's values, else the ring's
  // defaults).
  bool bulk_gemv = false;
  int bulk_ring_kib = 0, bulk_per_sm = 0;
  int attention_min_chunk = 0;  // decode attention up to 4 sequences: keys per block at least (0: its default)
  // Decode attention up to 4 sequences on the split-K kernel instead of the
  // cluster kernel (attention.h, DecodeKernel), and the cluster kernel's
  // query heads per block at most: 1, 2 or 4, fewer where the group is
  // smaller (0: its default, 1 at head_dim 64, else 2).
  bool split_k_attention = false;
  int attention_cluster_heads = 0;
  // Decode GEMVs on the shared-memory ring (up to 4 sequences) pull the
  // first l2_prefetch_units units of each block of the next GEMV into L2
  // (cuda::GemvPrefetch) once their consumers have finished all but their
  // last LATHE_CUDA_DECODE_L2_PREFETCH_LAG units (default 1): q|k|v the o
  // projection's, o gate|up's, gate|up down's, down the next layer's q|k|v
  // (the last layer's: the LM head's), the LM head layer 0's q|k|v (the
  // next step's); l2_prefetch_each's counts, where >= 0, for one source
  // each. -1: LATHE_CUDA_DECODE_L2_PREFETCH, and where that is unset 1
  // unit at one sequence (H200, 1B decode: 0-2% faster than none, 8B the
  // same; gemv_bulk.cu), none at 2-4 (not measured there).
  int l2_prefetch_units = -1;
  CudaL2PrefetchUnits l2_prefetch_each{};
  // The ring GEMVs launched with the largest shared-memory carveout (GemvArgs::max_carveout).
  bool ring_max_carveout = false;
  // The ring GEMVs' producers issue their whole ring at once, not their first unit alone first
  // (GemvArgs::ring_fill_at_once; the default measured faster on the H200: gemv_bulk.cu).
  bool ring_fill_at_once = false;
  // > 0: the ring GEMVs' producers keep at most this many units requested and
  // not landed (GemvArgs::ring_in_flight); 0: the first unit alone, then the
  // whole ring; -1: 2 units at one sequence, 0 at 2-4 (not measured there).
  // H200, 2026-12-01, one sequence: 2 units 1B 1,357.4 / 1,356.5 against
  // 1,350.7 / 1,350.4 tok/s with 0, 8B 266.5 against 264.7; 1 unit 1,334.9,
  // 3 units 1,350.8.
  int ring_in_flight = -1;
  // From this many sequences on (at least 2; 0: never), a decode layer
  // whose projections have no bias runs them through cuBLASLt (cuda::gemm:
  // q|k|v and gate|up into f32, o and down added into the f32 residual with
  // beta 1) after a norm kernel, with RoPE + cache append and SwiGLU as
  // kernels of their own, and so does the LM head; below it, the GEMVs
  // with those fused (the ring up to 4 sequences, above that the tensor-core
  // GEMVs of kCudaDecodeShapesMany, whose inputs are bf16 too: the same
  // roundings, the sums in another order). Through cuBLASLt a sequence's
  // logits depend on how many others share its step (within the bf16
  // tolerance); on the ring up to 4 sequences they do not (bitwise).
  // H200, 2026-12-02, decode tok/s (graph), GEMVs → cuBLASLt, same call:
  // 1B at 2 / 3 / 4 / 8 / 16 / 32 sequences 2,178 → 1,852 / 2,184 → 2,683
  // / 2,654 → 3,464 / 6,388 → 6,445 / 9,790 → 11,322 / 10,428 → 18,484; 8B
  // 416 → 426 / 467 → 618 / 556 → 814 / 1,426 → 1,523 / 2,278 → 2,814 /
  // 2,372 → 4,885. So from 3 sequences on: at 2 the ring is faster at 1B
  // and within 2.5% at 8B.
  int cublas_decode_rows = 3;
  std::string adapter_dir;       // PEFT LoRA adapter merged at load; empty: none
};

// What CudaCausalLM picks decoded tokens with (cuda::greedy_pick and
// sample_pick): temperature 0 is greedy; top_k 0, top_p 1, min_p 0 and
// repetition_penalty 1 are off. The penalty covers every token the
// sequence holds (prompt and generated), as the CPU sampler's context.
struct CudaSampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  bool operator==(const CudaSampling&) const = default;
};

class CudaCausalLmImpl;

class CudaCausalLM {
 public:
  // Reads config.json and the safetensors of dir. Errors name the file and
  // tensor (as CausalLM::load), or the option / device that does not fit.
  static Result<std::unique_ptr<CudaCausalLM>> load(const std::string& dir, const CudaModelOptions& opts);
  // Random bf16 weights made on the device (benchmarks): linear and embedding
  // weights of standard deviation init_range, norms one, biases zero.
  static Result<std::unique_ptr<CudaCausalLM>> random(const ModelHeader& header, const CudaModelOptions& opts,
                                                      uint64_t seed, float init_range = 0.02f);
  ~CudaCausalLM();

  const ModelConfig& config() const;
  int64_t n_params() const;
  size_t device_bytes() const;  // weights + cache + activations
  int n_tokens(int seq = 0) const;  // tokens in sequence seq's cache
  int max_seq() const;
  int max_batch() const;
  void clear();                 // empties every sequence's cache (the next forward starts at position 0)
  void clear(int seq);          // empties one sequence's cache
  void set_use_graphs(bool on);  // drops a captured graph when turned off
  void set_persistent_gemv(bool on);  // CudaModelOptions::persistent_gemv; drops captured graphs
  // opts' register_gemv, bulk_gemv, bulk_ring_kib, bulk_per_sm, attention_min_chunk, split_k_attention,
  // attention_cluster_heads, l2_prefetch_units (-1: the variable's again), l2_prefetch_each,
  // ring_max_carveout, ring_fill_at_once, ring_in_flight; drops captured graphs.
  void set_decode_gemvs(const CudaModelOptions& opts);

  // Appends tokens to the sequence and runs them; logits (host, f32) receive
  // [rows, vocab] with rows = tokens.size() when all_logits (at most
  // max_logit_rows), else 1 (the last token's). Errors when the cache would
  // overflow or an id is outside the vocabulary.
  Status forward(std::span<const int32_t> tokens, std::span<float> logits, bool all_logits = false);
  // Like forward(), but picks the last token's argmax on the device and
  // returns it (greedy decoding without copying the logits to the host).
  Result<int32_t> forward_greedy(std::span<const int32_t> tokens);
  // forward() on sequence seq (0 <= seq < max_batch); forward() is sequence 0.
  Status forward_seq(int seq, std::span<const int32_t> tokens, std::span<float> logits, bool all_logits = false);

  // One decode step for sequences 0..B−1, B = tokens.size() <= max_batch:
  // token s is appended to sequence s (each at its own length) and logits
  // [B, vocab] receive each sequence's next-token logits; the greedy form
  // writes each one's argmax to next [B] instead. Errors when a cache would
  // overflow or an id is outside the vocabulary (nothing is appended then).
  Status decode_batch(std::span<const int32_t> tokens, std::span<float> logits);
  Status decode_batch_greedy(std::span<const int32_t> tokens, std::span<int32_t> next);

  // Decoding fed on the device, for sequences 0..B−1 (B = tokens.size()):
  // greedy (sampling.temperature 0), or drawn on the device by
  // cuda::sample_pick under sampling's options, either with sampling's
  // repetition penalty (drawing and the penalty: samples_on_device()).
  // start_decode() checks the request as decode_batch_greedy() does and room
  // for max_steps steps in every cache; each step appends one token to each
  // sequence (tokens first, then the previous step's picks) and its picks
  // become the next step's input on the device, so the host copies nothing
  // between steps and keeps up to kDecodeDepth steps queued. next_tokens()
  // waits for the next step's picks [B] and returns them in order; a
  // sequence then holds the inputs of the steps whose picks were returned.
  // Greedy, it gets the ids of the same decode_batch_greedy() calls; drawn,
  // the token after position p is drawn with salt p (the same seed and
  // inputs, the same tokens). stop_decode() ends it (any other call on the
  // model also does): the queued steps beyond those are dropped (they wrote
  // only cache rows past each sequence's length). With no decode step for
  // these shapes (see decode_batch()), each greedy next_tokens() is a
  // decode_batch_greedy() instead (drawing is refused there).
  static constexpr int kDecodeDepth = 4;
  Status start_decode(std::span<const int32_t> tokens, int max_steps, const CudaSampling& sampling = {});
  Status next_tokens(std::span<int32_t> picks);
  void stop_decode();
  // Whether drawing (temperature > 0) and the repetition penalty run on this
  // device and model (sm_90+, a vocabulary of at most 262,144, the decode
  // step's shapes); greedy without a penalty always does.
  bool samples_on_device() const;
  // forward() on sequence 0, then its next token picked on the device as
  // start_decode() would (greedy, or drawn with salt = the last token's position).
  Result<int32_t> forward_pick(std::span<const int32_t> tokens, const CudaSampling& sampling);

 private:
  explicit CudaCausalLM(std::unique_ptr<CudaCausalLmImpl> impl);
  std::unique_ptr<CudaCausalLmImpl> impl_;
};

}  // namespace lathe
