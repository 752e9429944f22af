// Validation of the linear op contract (src/ops/linear.h).
#include "ops/linear.h"

#include "ops/arg_checks.h"

namespace lathe {
using namespace ops_detail;

int64_t linear_workspace_floats(int64_t n, int64_t in, DType w_dtype, int n_threads) {
  if (w_dtype == DType::F32) return 0;
  // GEMV on bf16 reads x with even and odd elements split per 16-block.
  if (n <= kLinearGemvMaxRows) return w_dtype == DType::BF16 ? n * in : 0;
  return kLinearTileRows * in * (n_threads > 0 ? n_threads : 1);
}

Status validate(const LinearArgs& a) {
  const char* op = "linear";
  LATHE_TRY(check_rank(op, "x", a.x, 2));
  LATHE_TRY(check_rank(op, "w", a.w, 2));
  LATHE_TRY(check_dtype(op, "x", a.x, DType::F32));
  LATHE_TRY(check_dtype(op, "y", a.y, DType::F32));
  LATHE_TRY(check_weight_dtype(op, "w", a.w));
  int64_t n = a.x.shape[0], in = a.x.shape[1], out = a.w.shape[0];
  if (a.w.shape[1] != in)
    return invalid_argument("linear: w has shape ", a.w.shape.str(), " but x has ", in, " features");
  LATHE_TRY(check_shape(op, "y", a.y, Shape{n, out}));
  if (!a.bias.empty()) {
    LATHE_TRY(check_weight_dtype(op, "bias", a.bias));
    LATHE_TRY(check_shape(op, "bias", a.bias, Shape{out}));
  }
  if (overlaps(a.x, a.y)) return invalid_argument("linear: y overlaps x");
  int64_t need = linear_workspace_floats(n, in, a.w.dtype, 1);
  if (need > 0 && (a.workspace.empty() || a.workspace.dtype != DType::F32 || a.workspace.numel() < need))
    return invalid_argument("linear: workspace holds ", a.workspace.numel(), " f32, needs ", need);
  return Status::ok();
}

Status validate(const LinearBackwardArgs& a) {
  const char* op = "linear_backward";
  LATHE_TRY(check_rank(op, "w", a.w, 2));
  LATHE_TRY(check_rank(op, "dy", a.dy, 2));
  LATHE_TRY(check_dtype(op, "w", a.w, DType::F32));
  LATHE_TRY(check_dtype(op, "dy", a.dy, DType::F32));
  const int64_t n = a.dy.shape[0], out = a.w.shape[0], in = a.w.shape[1];
  LATHE_TRY(check_shape(op, "dy", a.dy, Shape{n, out}));
  if (!a.dx.empty()) {
    LATHE_TRY(check_dtype(op, "dx", a.dx, DType::F32));
    LATHE_TRY(check_shape(op, "dx", a.dx, Shape{n, in}));
    if (overlaps(a.dx, a.dy)) return invalid_argument("linear_backward: dx overlaps dy");
  }
  if (!a.dw.empty()) {
    LATHE_TRY(check_dtype(op, "x", a.x, DType::F32));
    LATHE_TRY(check_shape(op, "x", a.x, Shape{n, in}));
    LATHE_TRY(check_dtype(op, "dw", a.dw, DType::F32));
    LATHE_TRY(check_shape(op, "dw", a.dw, a.w.shape));
  }
  if (!a.db.empty()) {
    LATHE_TRY(check_dtype(op, "db", a.db, DType::F32));
    LATHE_TRY(check_shape(op, "db", a.db, Shape{out}));
  }
  return Status::ok();
}

}  // namespace lathe
