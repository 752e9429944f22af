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

Status validate(const SwigluBackwardArgs& a) {
  const char* op = "swiglu_backward";
  LATHE_TRY(check_rank(op, "gate", a.gate, 2));
  for (auto [name, v] : {std::pair{"gate", &a.gate}, {"up", &a.up}, {"d_out", &a.d_out}, {"d_gate", &a.d_gate},
                         {"d_up", &a.d_up}}) {
    LATHE_TRY(check_dtype(op, name, *v, DType::F32));
    LATHE_TRY(check_shape(op, name, *v, a.gate.shape));
  }
  if (a.d_gate.data == a.d_up.data) return invalid_argument("swiglu_backward: d_gate and d_up are the same buffer");
  return Status::ok();
}

}  // namespace lathe
