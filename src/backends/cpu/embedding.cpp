// Embedding lookup on the CPU: one row copy (or widening) per token.
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"

namespace lathe::cpu {

Status embedding_forward(const EmbeddingArgs& a) {
  LATHE_TRY(validate(a));
  const int64_t n = a.tokens.shape[0], dim = a.table.shape[1];
  const int32_t* ids = a.tokens.ptr<const int32_t>();
  const char* table = static_cast<const char*>(a.table.data);
  const int64_t row_bytes = dtype_bytes(a.table.dtype, dim);
  float* out = a.out.ptr<float>();
  parallel_for(n, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      convert_to_f32(table + ids[t] * row_bytes, a.table.dtype, out + t * dim, dim);
  });
  return Status::ok();
}

}  // namespace lathe::cpu
