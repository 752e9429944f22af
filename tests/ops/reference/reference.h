// Naive, obviously-right twins of the ops: scalar loops, double accumulation,
// no threads, no tricks. They share only the Args structs with the backends,
// so one bug cannot pass both sides of a comparison. Inputs are assumed valid.
#pragma once

#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace lathe::ref {

// Reads element i of a float view of any float dtype.
double at(const TensorView& v, int64_t i);
// Writes (adds to) element i of an f32 or f64 view: the references run in
// f64 end to end for the finite-difference checks.
void put(const TensorView& v, int64_t i, double x);
inline void add(const TensorView& v, int64_t i, double x) { put(v, i, at(v, i) + x); }

void linear_forward(const LinearArgs& a);
void rms_norm_forward(const RmsNormArgs& a);
void rope_tables(const RopeTablesArgs& a);
void rope_forward(const RopeArgs& a);
void attention_forward(const AttentionArgs& a);
void swiglu_forward(const SwigluArgs& a);
void embedding_forward(const EmbeddingArgs& a);

// Training: packed varlen attention and the backward of every op, by the
// textbook formulas (attention recomputes its softmax from scratch, not
// from lse). Accept f32 or f64 views.
void attention_varlen_forward(const AttentionVarlenArgs& a);
void attention_varlen_backward(const AttentionVarlenBackwardArgs& a);
void linear_backward(const LinearBackwardArgs& a);
void rms_norm_backward(const RmsNormBackwardArgs& a);
void swiglu_backward(const SwigluBackwardArgs& a);
void embedding_backward(const EmbeddingBackwardArgs& a);
// Materializes every logit; ignores workspace and chunk_rows.
CrossEntropyStats cross_entropy(const CrossEntropyArgs& a);

}  // namespace lathe::ref
