// Shared helpers for the validate() functions of the op contracts: each check
// names the op and the argument, so a bad call reads like
// "linear: w has shape [3, 4], expected [3, 5]".
#pragma once

#include <initializer_list>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe::ops_detail {

inline bool is_float_weight(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// The view is present, on the CPU or GPU, and of the given rank.
inline Status check_rank(const char* op, const char* name, const TensorView& v, int rank) {
  if (v.empty() && v.numel() != 0) return invalid_argument(op, ": ", name, " is missing");
  if (v.shape.rank() != rank)
    return invalid_argument(op, ": ", name, " has shape ", v.shape.str(), ", expected rank ", rank);
  return Status::ok();
}

inline Status check_dtype(const char* op, const char* name, const TensorView& v, DType want) {
  if (v.dtype != want)
    return invalid_argument(op, ": ", name, " has dtype ", dtype_name(v.dtype), ", expected ", dtype_name(want));
  return Status::ok();
}

inline Status check_weight_dtype(const char* op, const char* name, const TensorView& v) {
  if (!is_float_weight(v.dtype))
    return invalid_argument(op, ": ", name, " has dtype ", dtype_name(v.dtype), ", expected f32, bf16 or f16");
  return Status::ok();
}

inline Status check_shape(const char* op, const char* name, const TensorView& v, const Shape& want) {
  if (!(v.shape == want))
    return invalid_argument(op, ": ", name, " has shape ", v.shape.str(), ", expected ", want.str());
  return Status::ok();
}

inline bool overlaps(const TensorView& a, const TensorView& b) {
  auto* a0 = static_cast<const char*>(a.data);
  auto* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace lathe::ops_detail
