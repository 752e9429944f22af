// Validation of the swiglu op contract (src/ops/swiglu.h).
#include "ops/swiglu.h"

#include "ops/arg_checks.h"

namespace lathe {
using namespace ops_detail;

Status validate(const SwigluArgs& a) {
  const char* op = "swiglu";
  LATHE_TRY(check_rank(op, "gate", a.gate, 2));
  LATHE_TRY(check_dtype(op, "gate", a.gate, DType::F32));
  LATHE_TRY(check_dtype(op, "up", a.up, DType::F32));
  LATHE_TRY(check_dtype(op, "out", a.out, DType::F32));
  LATHE_TRY(check_shape(op, "up", a.up, a.gate.shape));
  LATHE_TRY(check_shape(op, "out", a.out, a.gate.shape));
  return Status::ok();
}

}  // namespace lathe
