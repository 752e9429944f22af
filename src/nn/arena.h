// Arena: bump allocation for activations and kernel workspaces. A forward
// pass allocates its intermediates here and reset()s at the start of the next
// one, so after the first call of a given size nothing touches the heap:
// when a pass outgrows the arena it chains another block, and the next reset()
// folds all blocks into one big enough for the whole pass.
//
// Views handed out stay valid until reset() or until a Scope that was open
// when they were made closes. Not thread-safe: one arena per concurrent pass.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace lathe {

class Arena {
 public:
  Arena() = default;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Uninitialized, 64-byte aligned.
  TensorView alloc(DType dtype, Shape shape);
  void reset();
  int64_t capacity_bytes() const;

  // Rewinds the arena to where it stood at construction (for workspaces that
  // live for one call).
  class Scope {
   public:
    explicit Scope(Arena& a) : arena_(a), block_(a.block_), used_(a.used_) {}
    ~Scope() {
      arena_.block_ = block_;
      arena_.used_ = used_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Arena& arena_;
    size_t block_;
    int64_t used_;
  };

 private:
  std::vector<Tensor> blocks_;  // U8 buffers
  size_t block_ = 0;            // block being filled
  int64_t used_ = 0;            // bytes used in blocks_[block_]
};

}  // namespace lathe
