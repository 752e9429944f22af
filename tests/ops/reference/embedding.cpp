// Reference embedding: out[t] = table[tokens[t]].
#include "ops/reference/reference.h"

namespace lathe::ref {

void embedding_forward(const EmbeddingArgs& a) {
  const int64_t n = a.tokens.shape[0], dim = a.table.shape[1];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i)
      put(a.out, t * dim + i, at(a.table, a.tokens.ptr<const int32_t>()[t] * dim + i));
}

}  // namespace lathe::ref
