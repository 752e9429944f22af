#include "nn/arena.h"

#include <algorithm>

namespace lathe {

namespace {
constexpr int64_t kAlign = 64;
constexpr int64_t kMinBlockBytes = 1 << 20;
}  // namespace

TensorView Arena::alloc(DType dtype, Shape shape) {
  const int64_t bytes = (dtype_bytes(dtype, shape.numel()) + kAlign - 1) / kAlign * kAlign;
  while (block_ < blocks_.size() && used_ + bytes > blocks_[block_].nbytes()) {
    ++block_;
    used_ = 0;
  }
  if (block_ == blocks_.size()) {
    int64_t size = std::max({bytes, kMinBlockBytes, blocks_.empty() ? 0 : blocks_.back().nbytes()});
    blocks_.push_back(Tensor::empty(DType::U8, {size}));
    used_ = 0;
  }
  TensorView v{static_cast<char*>(blocks_[block_].raw()) + used_, dtype, shape, Device::cpu()};
  used_ += bytes;
  return v;
}

void Arena::reset() {
  if (blocks_.size() > 1) {
    int64_t total = capacity_bytes();
    blocks_.clear();
    blocks_.push_back(Tensor::empty(DType::U8, {total}));
  }
  block_ = 0;
  used_ = 0;
}

int64_t Arena::capacity_bytes() const {
  int64_t total = 0;
  for (const Tensor& b : blocks_) total += b.nbytes();
  return total;
}

}  // namespace lathe
