// Embedding backward on the CPU: scatter-add of d_out rows into d_table.
// Threads split the columns, so repeated token ids never race.
#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"

namespace lathe::cpu {

Status embedding_backward(const EmbeddingBackwardArgs& a) {
  LATHE_TRY(validate(a));
  const int64_t n = a.tokens.shape[0], dim = a.d_table.shape[1];
  const int32_t* ids = a.tokens.ptr<const int32_t>();
  const float* d = a.d_out.ptr<const float>();
  float* table = a.d_table.ptr<float>();
  parallel_for(dim, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = 0; t < n; ++t) {
      float* row = table + int64_t(ids[t]) * dim;
      for (int64_t i = b; i < e; ++i) row[i] += d[t * dim + i];
    }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
