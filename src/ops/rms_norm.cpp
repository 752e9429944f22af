// Validation of the rms_norm op contract (src/ops/rms_norm.h).
#include "ops/rms_norm.h"

#include "ops/arg_checks.h"

namespace lathe {
using namespace ops_detail;

Status validate(const RmsNormArgs& a) {
  const char* op = "rms_norm";
  LATHE_TRY(check_rank(op, "x", a.x, 2));
  LATHE_TRY(check_dtype(op, "x", a.x, DType::F32));
  LATHE_TRY(check_dtype(op, "y", a.y, DType::F32));
  LATHE_TRY(check_weight_dtype(op, "w", a.w));
  LATHE_TRY(check_shape(op, "w", a.w, Shape{a.x.shape[1]}));
  LATHE_TRY(check_shape(op, "y", a.y, a.x.shape));
  if (!a.rstd.empty()) {
    LATHE_TRY(check_dtype(op, "rstd", a.rstd, DType::F32));
    LATHE_TRY(check_shape(op, "rstd", a.rstd, Shape{a.x.shape[0]}));
  }
  if (!(a.eps >= 0.0f)) return invalid_argument("rms_norm: eps ", a.eps, " is negative");
  if (a.y.data != a.x.data && overlaps(a.x, a.y)) return invalid_argument("rms_norm: y partially overlaps x");
  return Status::ok();
}

Status validate(const RmsNormBackwardArgs& a) {
  const char* op = "rms_norm_backward";
  LATHE_TRY(check_rank(op, "x", a.x, 2));
  for (auto [name, v] : {std::pair{"x", &a.x}, {"w", &a.w}, {"rstd", &a.rstd}, {"dy", &a.dy}, {"dx", &a.dx}})
    LATHE_TRY(check_dtype(op, name, *v, DType::F32));
  LATHE_TRY(check_shape(op, "w", a.w, Shape{a.x.shape[1]}));
  LATHE_TRY(check_shape(op, "rstd", a.rstd, Shape{a.x.shape[0]}));
  LATHE_TRY(check_shape(op, "dy", a.dy, a.x.shape));
  LATHE_TRY(check_shape(op, "dx", a.dx, a.x.shape));
  if (!a.dw.empty()) {
    LATHE_TRY(check_dtype(op, "dw", a.dw, DType::F32));
    LATHE_TRY(check_shape(op, "dw", a.dw, a.w.shape));
  }
  bool same = a.dx.data == a.dy.data;
  if ((same && a.accumulate) || (!same && overlaps(a.dx, a.dy)))
    return invalid_argument("rms_norm_backward: dx overlaps dy (only an exact alias without accumulate is allowed)");
  if (overlaps(a.dx, a.x)) return invalid_argument("rms_norm_backward: dx overlaps x");
  return Status::ok();
}

}  // namespace lathe
