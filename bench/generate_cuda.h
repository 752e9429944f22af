// bench_generate_cuda's two files: the model runs and A/B lines
// (generate_cuda.cpp) and the decode step's kernels one at a time with the
// persistent-chain diagnostic (generate_cuda_kernels.cpp).
#pragma once

#include "io/hf_config.h"

namespace lathe::bench_generate {

struct Shape {
  const char* name;
  ModelConfig cfg;
};

// How the decode step runs its GEMVs: cuda_decode_shapes() (persistent as
// CudaModelOptions::persistent_gemv) or every one on the shared-memory ring.
struct StepGemvs {
  bool persistent = true, registers = false, bulk = false;
  int ring_kib = 0, per_sm = 0, attention_min_chunk = 0;
  bool split_k_attention = false;
};


// The table of the decode step's kernels at `batch` sequences and mean
// context mean_ctx, beside the step measured (step_s seconds).
void bench_kernels(const Shape& s, int batch, int mean_ctx, bool overlap, const StepGemvs& step, double step_s);
// --chain 1: layers of the shape's four decode GEMVs through one persistent ring kernel.
void bench_chain(const Shape& s);

}  // namespace lathe::bench_generate
