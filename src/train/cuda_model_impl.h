// Internal to CudaTrainableModel: device pointers into the one arena (the
// frozen base, the flat LoRA parameters, per-layer activations, scratch)
// shared by cuda_model.cpp (planning, weights, optimizer) and
// cuda_model_pass.cpp (forward and backward).
//
// Projections are fused by input: q|k|v, o, gate|up and down are one GEMM
// each (a group's weights are its members' stacked by rows, so one output
// row is [q | k | v] or [gate | up]), and the LoRA terms ride in that GEMM's
// K dimension, so each projection rounds once. A group with LoRA members
// (lw = n_lora·4r columns of 4-term copies, lora_ops.h, 4r per member in
// slot order) keeps ONE extended weight, rows ldw apart: rows [0, out) hold
// W (columns [0, in)) with the B4 of the member owning the row beside it,
// rows [out, out + lw) the members' A4 planes (columns [0, in)):
//
//   forward   y  = x_ext · [W | B4 slots]ᵀ   = x·Wᵀ + s·u·Bᵀ   (K: in + LoRA columns)
//   backward  dx = dy_ext · [W ; A4 planes]  = dy·W + du·A     (K = out + lw)
//
// where the GEMM input x_ext = x plus the 4-term split of s·u (u = x·Aᵀ in
// f32, from x·A4ᵀ), rows ldx = in + lw apart, and dy_ext = [dy | du4] with
// du = s·dy·B (f32, from dy·B4) split the same way; u's and du's GEMMs read
// A4 and B4 inside the extended weight, and dB = dyᵀ·(s·u), dA = duᵀ·x read
// the hi and lo terms back out of x_ext and dy_ext.
//   With one LoRA member x_ext = [x | u4], B4 sits at columns [in, in + 4r)
// and the forward is one GEMM, K = in + 4r. With several, the first
// member's u4 sits LEFT of x: x_ext = [u4₀ | x | u4₁ …] (x at column
// x_col = 4r), its B4 left of W's row (columns [−4r, 0) from W's column 0),
// the others' right of it as above; the forward is two GEMMs over row
// blocks ("sections"): rows up to the end of member 0 over x_ext columns
// [0, 4r + in), the rest over [4r, in + lw). Member 0's rows then need no
// zero slot for the others' u and the others none for its u (a row's other
// slots within its section are zeros); ldw = in + max(4r, lw − 4r), which
// for gate|up is in + 4r: no block-diagonal zeros at all. A group without
// LoRA has lw = 0 (ldw = ldx = in). The buffers a GEMM reads as x_ext (xn1,
// attn, xn2, act) and dy_ext (the q|k|v scratch, gate|up, dh_bf) are
// allocated with the extra columns; their producers write rows with a
// stride (at x_col). With LoRA dropout the A products leave the fused
// GEMMs (each member reads its own masked x): cuda_model_dropout.cpp.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/lora_ops.h"
#include "backends/cuda/phase_timer.h"
#include "backends/cuda/stream_fork.h"
#include "models/family.h"
#include "train/cuda_model.h"

namespace lathe {

using bf16p = cuda::bf16_bits*;

// The flat f32 tables (LoRA parameters, full-SFT masters) start each tensor
// on a multiple of 16 floats.
inline constexpr int64_t kAlignFloats = 16;
inline int64_t aligned_floats(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

enum CudaProj : int { kCq, kCk, kCv, kCo, kCgate, kCup, kCdown, kCnumProj };
enum CudaGroup : int { kGqkv, kGo, kGgu, kGdown, kGnum };
inline constexpr CudaGroup kGroupOf[kCnumProj] = {kGqkv, kGqkv, kGqkv, kGo, kGgu, kGgu, kGdown};

// What the phase timer (CudaTrainableModel::set_phase_timing) charges time to.
enum CudaPhase : int {
  kPhGemmFwd, kPhGemmBwd, kPhLora, kPhAttnFwd, kPhAttnBwd, kPhElementwise, kPhHead, kPhOptimizer, kPhInput,
  kPhNum
};
inline const char* const kCudaPhaseNames[kPhNum] = {
    "base GEMM fwd", "base GEMM bwd", "LoRA (f32 branch)", "attention fwd", "attention bwd",
    "norms, RoPE, SwiGLU, casts", "LM head + CE", "clip + AdamW + LoRA copies", "batch upload + embedding"};

// The f32 floats one member's dB or dA partial products take in the LoRA
// scratch when a group's members are summed in one launch
// (cuda_model_pass.cpp): each block starts a multiple of 64 floats (256
// bytes) from the scratch's start, so every GEMM's output keeps the
// alignment, and so the cuBLASLt plan and the bits, it has at the start.
inline int64_t lora_part_floats(int64_t n) { return (n + 63) / 64 * 64; }

// Part sums gathered for one lora_sum_parts_many call: a group's dB and dA
// (at most two per projection).
struct CPartSums {
  std::array<cuda::LoraPartsArgs, 2 * kCnumProj> job;
  int n = 0;
  void add(const cuda::LoraPartsArgs& a) { job[size_t(n++)] = a; }
  Status flush(cuda::CudaContext& c) {
    const int count = n;
    n = 0;
    return cuda::lora_sum_parts_many(c, job.data(), count);
  }
};

// A forward GEMM of a group: output rows [row0, row0 + rows) over x_ext's
// columns [k0, k0 + k).
struct CSection {
  int64_t row0 = 0, rows = 0, k0 = 0, k = 0;
};

// One fused projection: y[T, out] = x[T, in]·wᵀ [+ bias] + Σ LoRA members.
struct CGroup {
  bf16p w = nullptr;     // W's row 0, column 0 inside the extended weight (above; rows ldw apart)
  bf16p bias = nullptr;  // [out] (the bias epilogue); null without bias
  int64_t out = 0, in = 0;
  int64_t lw = 0;     // the LoRA columns: loras.size()·4r
  int64_t ldw = 0;    // the extended weight's row stride
  int64_t ldx = 0;    // x_ext's row stride: in + lw
  int64_t x_col = 0;  // x's first column in x_ext (4r when member 0's u4 sits left of it)
  std::vector<CSection> sections;  // the forward's GEMMs
  std::vector<int> loras;  // indices into loras, in slot order
  bf16p a4() const { return w + out * ldw; }  // [lw, in] (row stride ldw): the members' A copies stacked
  int64_t ext_numel() const { return x_col + (out + lw) * ldw; }  // the extended weight, from w − x_col
};

struct CLora {
  float *a = nullptr, *b = nullptr, *da = nullptr, *db = nullptr;  // fp32 masters and grads
  // 4-term bf16 copies (lora_ops.h) inside the group's w (row stride ldw):
  // A4 [4r, in] and B4 [out, 4r].
  bf16p a4 = nullptr, b4 = nullptr;
  int64_t r = 0, in = 0, out = 0;
  int64_t col = 0;   // first column of the member in its group's output
  int64_t slot = 0;  // position among the group's LoRA members
  int64_t u_col = 0;  // first column of its s·u4 in the group's x_ext
  int64_t layer = 0;  // where it sits: its dropout mask's seed derives from both
  int proj = 0;       // HF order q, k, v, o, gate, up, down
};

struct CBlock {
  bf16p attn_norm = nullptr, mlp_norm = nullptr, q_norm = nullptr, k_norm = nullptr;
  std::array<CGroup, kGnum> g;
};

// One layer's forward as its backward reads it (the layer input is hs[l]).
// Which buffers are per layer and which one shared copy is recomputed in
// the backward depends on the recompute mode (cuda_model.h). The GEMM
// inputs xn1, attn, xn2 and act point at x_ext rows (row stride the group's
// ldx: x at column x_col, the 4-term s·u of the group's LoRA members around
// it).
struct CActs {
  bf16p xn1 = nullptr, q_raw = nullptr, k_raw = nullptr, q = nullptr, k = nullptr, v = nullptr, attn = nullptr;
  bf16p h_mid = nullptr, xn2 = nullptr;
  bf16p gu = nullptr;   // [T, 2F] = [gate | up], row stride CudaModelImpl::ld_gu (then dy_ext of gate|up)
  bf16p act = nullptr;  // silu(gate)·up [T, F]: kept with none, else the scratch's act (recomputed)
  float *rstd1 = nullptr, *q_rstd = nullptr, *k_rstd = nullptr, *lse = nullptr, *rstd2 = nullptr;
};

// Buffers every layer reuses, and the batch's inputs.
struct CScratch {
  bf16p qkv = nullptr;  // [T, q|k|v] (row stride ld_qkv): the fused projection's output, then dy_ext
  bf16p tmp_h = nullptr, d_xn = nullptr, d_attn = nullptr;
  bf16p act = nullptr;  // silu(gate)·up x_ext when not kept, then its gradient (packed)
  bf16p dq = nullptr, dk = nullptr, dv = nullptr, xf = nullptr, d_xf = nullptr;
  bf16p dh_bf = nullptr;  // dh rounded to bf16 by the norm backward that made dh (row stride ld_dh_bf)
  float* lora_f32 = nullptr;  // a LoRA GEMM's partial products, summed by lora_sum_parts
  float* lora_side_f32 = nullptr;  // the same for the LoRA side stream (CLoraSide; over tmp_h); null without it
  // LoRA dropout only (else null), [drop_cap, max_lora_in()] each: rows of a
  // group's input gradient summed in f32, and of a member's f32 du·A or,
  // before it, of its masked input (bf16, packed).
  float *drop_acc = nullptr, *drop_tmp = nullptr;
  float *dh = nullptr, *rstd_f = nullptr, *cos = nullptr, *sin = nullptr, *inv_freq = nullptr;
  void *ce_ws = nullptr, *attn_ws = nullptr;  // ce_ws overlays the layers' scratch (cuda_model.cpp)
  size_t attn_ws_bytes = 0;
  void* ce_counters = nullptr;  // the head's loss counters, read at the end of a pass
  int32_t *tokens = nullptr, *targets = nullptr, *positions = nullptr, *cu_seqlens = nullptr;
};

// Full SFT (cuda_model_sft.cpp): where the backward adds each weight's
// gradient (into the flat f32 grads, the host table's layout), and each
// master's bf16 copy (the weight the passes read).
struct CSftBlock {
  std::array<float*, kCnumProj> dw{}, db{};  // db null without a bias
  float *attn_norm = nullptr, *mlp_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
};
struct CSftCopy {
  float* master = nullptr;
  bf16p bf16 = nullptr;
  int64_t n = 0;
};
struct CSft {
  std::vector<CSftBlock> blocks;
  float *embed = nullptr, *lm_head = nullptr, *final_norm = nullptr;  // lm_head == embed when tied
  std::vector<CSftCopy> copies;  // per table entry
  float* col_ws = nullptr;       // column_grad's workspace
  int32_t* emb_index = nullptr;  // [3·max_tokens + 1]: the batch's tokens sorted (sft_embedding_grad)
  std::vector<int32_t> host_index;
};

// The backward's LoRA side stream (cuda_model_overlap.cpp): a second
// context on which each group's dB and dA (and, where the backward reruns
// it, the x·Aᵀ only they read) run while the main stream runs the base
// GEMMs. Events: fork (the side waits for the main stream's work so far),
// done[2] (a group's side work, alternately), join (all side work).
struct CLoraSide {
  std::optional<cuda::CudaContext> ctx;  // set when the overlap is on
  cuda::CudaEvent fork, join, done[2];
  int slot = 0;       // the done event the next group records
  int prev = -1;      // a done event the main stream has not waited for yet; −1: none
  bool busy = false;  // side work enqueued since the main stream last waited for all of it
};

// [gate | up] of some layers in pinned host memory between forward and
// backward (CudaTrainOptions::offload_layers; cuda_model_offload.cpp).
// Events: used[s] (the main stream is done with staging buffer s), free[s]
// (its copy to the host has run), ready[s] (a layer's copy back has).
struct COffload {
  std::vector<int> slot;                 // [n_layer]: −1 on the device, else the staging buffer (0, 1)
  bf16p stage[2] = {nullptr, nullptr};   // [max_tokens, ld_gu] each
  std::vector<cuda::PinnedBuffer> host;  // [n_layer]; empty where not offloaded
  std::optional<cuda::CudaContext> ctx;  // the copy stream
  cuda::CudaEvent used[2], free[2], ready[2];
  int64_t count() const;
  int of(int64_t l) const;  // layer l's staging buffer, −1 when on the device
};

struct CudaModelImpl;
void sft_lay_out(CudaModelImpl& m);                 // the full-SFT table (n_flat, table)
int64_t sft_column_ws_floats(const CudaModelImpl& m);
Status sft_check_fits(const CudaModelImpl& m, size_t arena_bytes);  // refuses what the device cannot hold

struct CudaModelImpl {
  CudaModelShape s;
  CudaTrainOptions o;
  cuda::CudaContext ctx;
  cuda::DeviceArena arena;
  bf16p embed = nullptr, lm_head = nullptr, final_norm = nullptr;
  std::vector<CBlock> blocks;
  std::vector<CLora> loras;
  // Row strides of the dy_ext buffers: the q|k|v scratch and gate|up (out +
  // lw of their group), dh_bf (dy of o and down: hidden + the larger lw).
  int64_t ld_qkv = 0, ld_gu = 0, ld_dh_bf = 0;
  // A group's shape (every layer has the same).
  const CGroup& group(int g) const { return blocks[0].g[size_t(g)]; }
  // Where x starts in an x_ext row of group g.
  bf16p x_of(bf16p x_ext, int g) const { return x_ext + group(g).x_col; }
  std::vector<bf16p> hs;     // [n_layer + 1]: layer inputs, then the last layer's output
  std::vector<CActs> acts;   // [n_layer]; shared buffers repeat the same pointer
  // The last layer whose forward writes the shared buffers: they still hold
  // its activations when the backward reaches it, so it recomputes nothing
  // (-1: nothing shared).
  int64_t last_shared = -1;
  // Selective: layers [0, keep_layers) keep q/k/v, h_mid and their LoRA u
  // (planned from CudaTrainOptions::max_arena_bytes) and rerun no GEMM.
  int64_t keep_layers = 0;
  CScratch x;
  float* params = nullptr;   // flat LoRA masters
  float* grads = nullptr;
  // master → 4-term copy inside the groups' w, per factor (dst counts from
  // the arena's base)
  std::vector<cuda::LoraSplitFactor> factors;
  cuda::LoraSplitFactor* split_table = nullptr;  // device copy of factors
  int64_t max_factor_numel = 0;
  int64_t n_flat = 0;
  std::vector<ParamInfo> table;
  // A base tensor on the device: rows × cols, rows ld elements apart (a
  // projection's rows inside its group's extended weight).
  struct BaseTensor {
    bf16p p = nullptr;
    int64_t rows = 0, cols = 0, ld = 0;
    void* host = nullptr;  // the host's address of p when it is pinned host memory (packed rows); else null
    int64_t numel() const { return rows * cols; }
  };
  std::map<std::string, BaseTensor> base;
  std::optional<cuda::CudaAdamW> adamw;
  // CudaTrainOptions::host_embedding resolved: embed points into embed_host.
  bool host_embed = false;
  // LATHE_CUDA_ACT_FROM_BWD: down's backward in down_backward's order (LoRA
  // without dropout, not full SFT).
  bool act_from_bwd = true;
  cuda::PinnedBuffer embed_host;
  CSft sft;  // full SFT only
  // CudaTrainOptions::lora_overlap resolved (0 with dropout or full SFT).
  int overlap_mode = 0;
  CLoraSide side;
  COffload off;
  Status offload_start();                         // pinned buffers, copy stream, events
  Status offload_before_write(int64_t l);         // forward: l's staging buffer is free to write
  Status offload_after_forward(int64_t l, int64_t n);  // forward: copy l's [gate | up] to the host
  Status offload_copy(int64_t l, int64_t n, bool to_host, cuda::CudaEvent& done);
  Status offload_begin_backward(int64_t n);       // backward: the two highest offloaded layers' copies back
  Status offload_before_backward(int64_t l);      // backward: wait for it
  Status offload_after_backward(int64_t l, int64_t n);  // backward: the buffer is free; fetch the next
  // LATHE_CUDA_LORA_SUMS=separate: a group's dB sums right after dB's GEMMs,
  // not joined with dA's (cuda_model_pass.cpp; the same bits).
  bool separate_lora_sums = false;
  // The side stream runs this pass's LoRA gradients (not with dropout).
  bool overlap() const { return side.ctx.has_value() && !dropout(); }
  std::optional<cuda::PhaseTimer> timer;  // set while phase timing is on
  // LoRA dropout (cuda_model_dropout.cpp): passes run so far (training and
  // evaluation alike, as TrainableModel counts them) and this pass's base
  // of the masks' seeds.
  uint64_t passes = 0, dropout_base = 0;
  // The dropout path runs over the tokens in chunks: as many rows of a
  // group's input as its scratch holds (drop_floats f32 each buffer; rows
  // of the widest input: drop_cap), or drop_rows when set (tests).
  int64_t drop_floats = 0, drop_cap = 0, drop_rows = 0;
  int64_t chunk_rows(const CGroup& G) const {
    return drop_rows > 0 ? drop_rows : std::max<int64_t>(1, drop_floats / G.in);
  }
  // LoRA dropout acts in training passes only; an evaluation pass (no
  // backward) runs the adapter whole, as PEFT's eval mode does. It still
  // counts as a pass, so the masks of later training passes do not move.
  bool dropout() const { return o.lora_dropout > 0.0f && !o.full_sft && training_pass; }
  // What the attention backward of a layer may use for its dS tiles: its
  // gate|up (region 0) and h_mid (region 1), both read for the last time
  // by the MLP's backward (the LoRA side stream's reads of gate|up are
  // waited for by o's backward before it), except with LoRA dropout or
  // full SFT, whose reads of them are not ordered that way.
  std::array<size_t, 2> ds_spare_bytes() const {
    if (o.lora_dropout > 0.0f || o.full_sft) return {0, 0};
    return {size_t(o.max_tokens) * size_t(ld_gu) * 2, size_t(o.max_tokens) * size_t(s.hidden) * 2};
  }
  bool training_pass = true;  // set by run()
  int64_t max_lora_in() const;  // the widest input of a group with LoRA members
  void start_pass();            // draws dropout_base, counts the pass
  cuda::LoraDropoutMask mask_of(const CLora& a) const;
  // Charges what is enqueued from here on to phase p (no-op without a timer).
  Status phase(CudaPhase p) { return timer ? timer->mark(ctx, p) : Status::ok(); }

  CActs& act_of(int64_t l) { return acts[size_t(l)]; }
  Result<PassLoss> run(const MicroBatch& mb, float loss_scale, bool backward);
  Status side_start();  // the LoRA side stream's context and events (with overlap_mode > 0)
  Status refresh_split();  // the 4-term copies from the masters (full SFT: the bf16 copies)
  // The LoRA scratch (x.lora_f32, and the side stream's) a group's backward
  // needs for `tokens` rows: du's parts (tokens × lw), then every member's
  // dB and dA parts (lora_part_floats each), all live until one sum.
  int64_t lora_batch_floats(int64_t tokens) const;
  std::vector<cuda::CudaAdamWParam> adamw_params() const;  // every table entry

  // Full SFT (cuda_model_sft.cpp).
  Status sft_bind();  // sft's pointers, after the arena is carved and the base named
  Status sft_refresh();
  Status sft_masters_from_copies();
  Status sft_group_grads(int64_t l, int g, const bf16p xe, const bf16p dy, int64_t ld_dy, int64_t n);
  Status sft_norm_grad(float* dw, const bf16p dy, const bf16p h, const float* rstd, int64_t rows, int64_t dim);
  Status sft_embedding_grad(const MicroBatch& mb);

 private:
  Status upload_batch(const MicroBatch& mb, int* n_docs, int* max_seqlen);
  Status attention_inputs(int64_t l, int64_t n);
  Status layer_forward(int64_t l, int64_t n, int n_docs, int max_seqlen);
  Status recompute(int64_t l, int64_t n, int n_docs, int max_seqlen);
  Status layer_backward(int64_t l, int64_t n, int n_docs, int max_seqlen);
  // down's backward with its LoRA weight gradients after dx and SwiGLU's
  // backward, which gives back silu(gate)·up (cuda_model_pass.cpp).
  Status down_backward(int64_t l, int64_t n);
  Status attention_backward(int64_t l, int64_t n, int n_docs, int max_seqlen);
  Status lora_u(int64_t l, int g, bf16p x_ext, int64_t n);
  Status lora_u_on(cuda::CudaContext& c, float* part, int64_t l, int g, bf16p x_ext, int64_t n);
  // The LoRA side stream (cuda_model_overlap.cpp).
  Status side_fork();  // the side stream waits for what the main stream enqueued so far
  Status side_join();  // the main stream waits for all side work
  // Whether dx (packed [n, in]) overlays n rows of x_ext or dy_ext.
  bool dx_overlays(const bf16p dx, int64_t in, const bf16p x_ext, int64_t ldx, const bf16p dy_ext, int64_t ld_dy,
                   int64_t n) const;
  // Before a group's dx GEMM: the main stream waits for the previous
  // group's side work, and for this group's too when dx overlays what it
  // reads (`overlay`) or when this group ran nothing there (`on_side` false).
  Status side_before_dx(bool on_side, bool overlay);
  // lora_u for a backward that only the LoRA gradients read (on the side
  // stream when overlapping).
  Status lora_u_for_grads(int64_t l, int g, bf16p x_ext, int64_t n);
  // dB's and dA's GEMMs into the members' blocks from `part` (left past
  // the last); their sums are added to `sums` (the caller launches them).
  Status lora_db(cuda::CudaContext& c, float*& part, const CGroup& G, const bf16p x_ext, const bf16p dy_ext,
                 int64_t ld_dy, int64_t n, CPartSums& sums);
  Status lora_du(const CGroup& G, const bf16p dy_ext, int64_t ld_dy, int64_t n);  // du's split into dy_ext
  Status lora_da(cuda::CudaContext& c, float*& part, const CGroup& G, const bf16p x_ext, const bf16p dy_ext,
                 int64_t ld_dy, int64_t n, CPartSums& sums);
  // With dropout (cuda_model_dropout.cpp): the members' x·A4ᵀ on their own
  // masked inputs into x.lora_f32; their dA; and dx = dy·W + Σ masked du·A.
  Status lora_u_dropout_products(const CGroup& G, const bf16p x_ext, int64_t n);
  Status lora_da_dropout(const CGroup& G, const bf16p x_ext, const bf16p dy_ext, int64_t ld_dy, int64_t n);
  Status lora_dx_dropout(const CGroup& G, const bf16p dy_ext, int64_t ld_dy, bf16p dx, int64_t n);
  Status group_forward(int64_t l, int g, bf16p x_ext, bf16p y, int64_t ld_y, int64_t n, bool u_kept = false);
  Status group_backward(int64_t l, int g, bf16p x_ext, bf16p dy_ext, int64_t ld_dy, bf16p dx, int64_t n);
  Status norm(const bf16p x, const bf16p residual, bf16p h_out, const bf16p w, bf16p y, float* rstd, int64_t rows,
              int64_t dim, int64_t ld_y = 0);
};

}  // namespace lathe
