// Validation of the embedding op contract (src/ops/embedding.h), including
// the range of every token id: ids come from users.
#include "ops/embedding.h"

#include "ops/arg_checks.h"

namespace lathe {
using namespace ops_detail;

Status validate(const EmbeddingArgs& a) {
  const char* op = "embedding";
  LATHE_TRY(check_rank(op, "tokens", a.tokens, 1));
  LATHE_TRY(check_dtype(op, "tokens", a.tokens, DType::I32));
  LATHE_TRY(check_rank(op, "table", a.table, 2));
  LATHE_TRY(check_weight_dtype(op, "table", a.table));
  LATHE_TRY(check_dtype(op, "out", a.out, DType::F32));
  int64_t n = a.tokens.shape[0], vocab = a.table.shape[0];
  LATHE_TRY(check_shape(op, "out", a.out, Shape{n, a.table.shape[1]}));
  const int32_t* ids = a.tokens.ptr<const int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return invalid_argument("embedding: token id ", ids[i], " at index ", i, " is out of range [0, ", vocab, ")");
  return Status::ok();
}

Status validate(const EmbeddingBackwardArgs& a) {
  const char* op = "embedding_backward";
  LATHE_TRY(check_rank(op, "tokens", a.tokens, 1));
  LATHE_TRY(check_dtype(op, "tokens", a.tokens, DType::I32));
  LATHE_TRY(check_rank(op, "d_table", a.d_table, 2));
  LATHE_TRY(check_dtype(op, "d_table", a.d_table, DType::F32));
  LATHE_TRY(check_dtype(op, "d_out", a.d_out, DType::F32));
  int64_t n = a.tokens.shape[0], vocab = a.d_table.shape[0];
  LATHE_TRY(check_shape(op, "d_out", a.d_out, Shape{n, a.d_table.shape[1]}));
  const int32_t* ids = a.tokens.ptr<const int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return invalid_argument("embedding_backward: token id ", ids[i], " at index ", i, " is out of range [0, ",
                              vocab, ")");
  return Status::ok();
}

}  // namespace lathe
