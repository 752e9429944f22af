// Naive, obviously-right twins of the ops: scalar loops, double accumulation,
// no threads, no tricks. They share only the Args structs with the backends,
// so one bug cannot pass both sides of a comparison. Inputs are assumed valid.
#pragma once

#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace lathe::ref {

// Reads element i of a float view of any float dtype.
double at(const TensorView& v, int64_t i);

void linear_forward(const LinearArgs& a);
void rms_norm_forward(const RmsNormArgs& a);
void rope_tables(const RopeTablesArgs& a);
void rope_forward(const RopeArgs& a);
void attention_forward(const AttentionArgs& a);
void swiglu_forward(const SwigluArgs& a);
void embedding_forward(const EmbeddingArgs& a);

}  // namespace lathe::ref
