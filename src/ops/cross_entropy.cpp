// Validation of the fused LM head + cross-entropy contract (src/ops/cross_entropy.h),
// including the range of every target: labels come from users' data.
#include "ops/cross_entropy.h"

#include <algorithm>

#include "ops/arg_checks.h"

namespace lathe {
using namespace ops_detail;

int64_t cross_entropy_chunk_rows(int64_t vocab) {
  return std::clamp<int64_t>((int64_t{8} << 20) / std::max<int64_t>(vocab, 1), 16, 256);
}

int64_t cross_entropy_workspace_floats(int64_t vocab, int64_t dim, int64_t chunk_rows) {
  return chunk_rows * (vocab + 2 * dim + 2);
}

Status validate(const CrossEntropyArgs& a) {
  const char* op = "cross_entropy";
  LATHE_TRY(check_rank(op, "hidden", a.hidden, 2));
  LATHE_TRY(check_rank(op, "w", a.w, 2));
  LATHE_TRY(check_dtype(op, "hidden", a.hidden, DType::F32));
  if (a.w.dtype != DType::F32 && !(a.w.dtype == DType::BF16 && a.d_w.empty()))
    return invalid_argument("cross_entropy: w has dtype ", dtype_name(a.w.dtype),
                            ", expected f32 (or bf16 for a frozen head, without d_w)");
  LATHE_TRY(check_dtype(op, "targets", a.targets, DType::I32));
  const int64_t n = a.hidden.shape[0], dim = a.hidden.shape[1], vocab = a.w.shape[0];
  if (a.w.shape[1] != dim)
    return invalid_argument("cross_entropy: w has shape ", a.w.shape.str(), " but hidden has ", dim, " features");
  LATHE_TRY(check_shape(op, "targets", a.targets, Shape{n}));
  if (!a.d_hidden.empty()) {
    LATHE_TRY(check_dtype(op, "d_hidden", a.d_hidden, DType::F32));
    LATHE_TRY(check_shape(op, "d_hidden", a.d_hidden, a.hidden.shape));
    if (overlaps(a.d_hidden, a.hidden)) return invalid_argument("cross_entropy: d_hidden overlaps hidden");
  }
  if (!a.d_w.empty()) {
    if (a.d_hidden.empty()) return invalid_argument("cross_entropy: d_w needs d_hidden");
    LATHE_TRY(check_dtype(op, "d_w", a.d_w, DType::F32));
    LATHE_TRY(check_shape(op, "d_w", a.d_w, a.w.shape));
  }
  if (a.chunk_rows < 0) return invalid_argument("cross_entropy: chunk_rows ", a.chunk_rows, " is negative");
  const int64_t chunk = a.chunk_rows > 0 ? a.chunk_rows : cross_entropy_chunk_rows(vocab);
  const int64_t need = cross_entropy_workspace_floats(vocab, dim, chunk);
  if (a.workspace.dtype != DType::F32 || a.workspace.numel() < need)
    return invalid_argument("cross_entropy: workspace holds ", a.workspace.numel(), " f32, needs ", need);
  const int32_t* t = a.targets.ptr<const int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (t[i] != kCrossEntropyIgnore && (t[i] < 0 || t[i] >= vocab))
      return invalid_argument("cross_entropy: target ", t[i], " at row ", i, " is out of range [0, ", vocab,
                              ") and not the ignore index ", kCrossEntropyIgnore);
  return Status::ok();
}

}  // namespace lathe
