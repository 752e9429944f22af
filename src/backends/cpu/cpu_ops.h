// The CPU backend: every op of src/ops on the host, fp32 compute. Each
// function validates its args (a bad call is a Status starting with the op's
// name), borrows every view, allocates nothing and parallelizes with OpenMP.
// GEMMs call OpenBLAS per tile inside OpenMP tasks; the first GEMM sets
// OpenBLAS to one thread so two thread pools never compete for the cores.
// Callable from any thread; calls on disjoint outputs may run concurrently.
#pragma once

#include <span>

#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace lathe::cpu {

Status linear_forward(const LinearArgs& a);
// Up to kMaxLinearGroup linears with disjoint outputs (q/k/v, gate/up) as
// one parallel region when they take the GEMV path; same results as calling
// linear_forward() on each in turn.
constexpr size_t kMaxLinearGroup = 4;
Status linear_forward_group(std::span<const LinearArgs> group);
Status rms_norm_forward(const RmsNormArgs& a);
Status rope_tables(const RopeTablesArgs& a);
Status rope_forward(const RopeArgs& a);
Status attention_forward(const AttentionArgs& a);
Status swiglu_forward(const SwigluArgs& a);
Status embedding_forward(const EmbeddingArgs& a);

// Training: packed varlen attention and the backward of every op.
Status attention_varlen_forward(const AttentionVarlenArgs& a);
Status attention_varlen_backward(const AttentionVarlenBackwardArgs& a);
Status linear_backward(const LinearBackwardArgs& a);
Status rms_norm_backward(const RmsNormBackwardArgs& a);
Status swiglu_backward(const SwigluBackwardArgs& a);
Status embedding_backward(const EmbeddingBackwardArgs& a);
// RoPE's backward is rope_forward with inverse = true on the gradient.
// The LM head fused with cross-entropy, loss and (optionally) gradients.
// A frozen bf16 head may come packed (gemm_bf16.h): then both of its GEMMs
// read the packing; it must hold a.w's data and shape.
class PackedBf16Weight;
Result<CrossEntropyStats> cross_entropy(const CrossEntropyArgs& a, const PackedBf16Weight* packed_head = nullptr);

// True when the vectorized (AVX2 + FMA + F16C) kernels run on this machine.
bool has_avx2();
// True when AVX-512 F and DQ kernels may run (false while the portable
// kernels are forced).
bool has_avx512();
// True when the AVX512-BF16 GEMM (gemm_bf16.h) runs on this machine; false
// also while the portable kernels are forced.
bool has_avx512_bf16();
// Forces the portable kernels (tests compare both paths).
void set_portable_only(bool on);

}  // namespace lathe::cpu
