// Tensor owns its memory through a shared buffer; TensorView borrows.
// Both are dense and row-major (the last dimension is contiguous). Kernels
// take views; layers and arenas hand out views into memory they own.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace lathe {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceKind::kCuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

constexpr int kMaxDims = 6;

// A small fixed-capacity shape. Dimensions are int64.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i < 0 ? i + rank_ : i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i < 0 ? i + rank_ : i)]; }
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {dims_.begin(), dims_.begin() + rank_}; }
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3, 4]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

// A borrowed, dense view. Does not own data; the owner outlives the view.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device;

  int64_t numel() const { return shape.numel(); }
  int64_t nbytes() const { return dtype_bytes(dtype, numel()); }
  bool empty() const { return data == nullptr; }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  // Rows [begin, end) of the first dimension.
  TensorView slice_rows(int64_t begin, int64_t end) const;
  // Same bytes, another shape with the same element count.
  TensorView reshape(Shape s) const;
};

// An owning tensor. Copies share the buffer (cheap); clone() copies data.
class Tensor {
 public:
  Tensor() = default;
  // Uninitialized CPU tensor (64-byte aligned).
  static Tensor empty(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  // Wraps memory owned elsewhere; keepalive holds it alive (may be null when
  // the caller guarantees the lifetime).
  static Tensor wrap(void* data, DType dtype, Shape shape, std::shared_ptr<void> keepalive,
                     Device device = Device::cpu());

  bool defined() const { return has_storage_; }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  int64_t numel() const { return view_.numel(); }
  int64_t nbytes() const { return view_.nbytes(); }
  Device device() const { return view_.device; }
  int64_t size(int i) const { return view_.shape[i]; }
  int rank() const { return view_.shape.rank(); }

  template <class T>
  T* data() const { return static_cast<T*>(view_.data); }
  void* raw() const { return view_.data; }
  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }  // NOLINT: views borrow freely

  Tensor reshape(Shape s) const;
  Tensor clone() const;
  // f32 copy of a float tensor (f32, bf16, f16, f64).
  Tensor to_f32() const;
  // Copy converted to dt (from f32/bf16/f16 to f32/bf16/f16).
  Tensor to(DType dt) const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
  bool has_storage_ = false;
};

}  // namespace lathe
