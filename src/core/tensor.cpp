#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace lathe {

std::string Device::str() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Shape::Shape(std::initializer_list<int64_t> dims) {
  LATHE_CHECK(dims.size() <= kMaxDims, "shape has ", dims.size(), " dims, max ", kMaxDims);
  for (int64_t d : dims) dims_[static_cast<size_t>(rank_++)] = d;
}

Shape::Shape(const std::vector<int64_t>& dims) {
  LATHE_CHECK(dims.size() <= kMaxDims, "shape has ", dims.size(), " dims, max ", kMaxDims);
  for (int64_t d : dims) dims_[static_cast<size_t>(rank_++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < rank_; ++i) os << (i ? ", " : "") << dims_[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

TensorView TensorView::slice_rows(int64_t begin, int64_t end) const {
  LATHE_CHECK(shape.rank() >= 1 && 0 <= begin && begin <= end && end <= shape[0], "slice_rows [", begin,
              ", ", end, ") of ", shape.str());
  int64_t row = shape[0] ? numel() / shape[0] : 0;
  TensorView v = *this;
  v.shape[0] = end - begin;
  v.data = static_cast<char*>(data) + dtype_bytes(dtype, begin * row);
  return v;
}

TensorView TensorView::reshape(Shape s) const {
  LATHE_CHECK(s.numel() == numel(), "reshape ", shape.str(), " to ", s.str());
  TensorView v = *this;
  v.shape = s;
  return v;
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  Tensor t;
  size_t bytes = static_cast<size_t>(dtype_bytes(dtype, shape.numel()));
  size_t padded = (bytes + 63) / 64 * 64;
  void* p = padded ? std::aligned_alloc(64, padded) : nullptr;
  LATHE_CHECK(padded == 0 || p != nullptr, "out of host memory allocating ", bytes, " bytes");
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.view_ = TensorView{p, dtype, shape, Device::cpu()};
  t.has_storage_ = true;
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, shape);
  if (t.nbytes()) std::memset(t.raw(), 0, static_cast<size_t>(t.nbytes()));
  return t;
}

Tensor Tensor::wrap(void* data, DType dtype, Shape shape, std::shared_ptr<void> keepalive, Device device) {
  Tensor t;
  t.storage_ = std::move(keepalive);
  t.view_ = TensorView{data, dtype, shape, device};
  t.has_storage_ = true;
  return t;
}

Tensor Tensor::reshape(Shape s) const {
  Tensor t = *this;
  t.view_ = view_.reshape(s);
  return t;
}

Tensor Tensor::clone() const {
  LATHE_CHECK(device().is_cpu(), "clone of a ", device().str(), " tensor");
  Tensor t = empty(dtype(), shape());
  if (nbytes()) std::memcpy(t.raw(), raw(), static_cast<size_t>(nbytes()));
  return t;
}

Tensor Tensor::to_f32() const { return to(DType::F32); }

Tensor Tensor::to(DType dt) const {
  LATHE_CHECK(device().is_cpu(), "conversion of a ", device().str(), " tensor");
  if (dt == dtype()) return clone();
  Tensor out = empty(dt, shape());
  if (dt == DType::F32) {
    convert_to_f32(raw(), dtype(), out.data<float>(), numel());
  } else if (dtype() == DType::F32) {
    convert_from_f32(data<float>(), out.raw(), dt, numel());
  } else {
    Tensor tmp = to_f32();
    convert_from_f32(tmp.data<float>(), out.raw(), dt, numel());
  }
  return out;
}

}  // namespace lathe
