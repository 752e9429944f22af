// Arena: aligned bump allocation, scopes that rewind, and growth folded into
// one block at reset so steady-state passes never allocate.
#include <gtest/gtest.h>

#include "nn/arena.h"

namespace lathe {
namespace {

TEST(Arena, AlignsAndRewindsScopes) {
  Arena a;
  TensorView x = a.alloc(DType::F32, {3});
  TensorView y = a.alloc(DType::BF16, {5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(y.data) % 64, 0u);
  EXPECT_NE(x.data, y.data);
  void* z_data = nullptr;
  {
    Arena::Scope s(a);
    z_data = a.alloc(DType::F32, {100}).data;
  }
  EXPECT_EQ(a.alloc(DType::F32, {100}).data, z_data);  // the scope gave its bytes back
}

TEST(Arena, GrowthIsFoldedIntoOneBlockAtReset) {
  Arena a;
  a.alloc(DType::U8, {1 << 20});
  a.alloc(DType::U8, {3 << 20});  // outgrows the first block: a second one is chained
  const int64_t grown = a.capacity_bytes();
  EXPECT_GE(grown, int64_t(4) << 20);
  a.reset();
  EXPECT_EQ(a.capacity_bytes(), grown);
  TensorView p = a.alloc(DType::U8, {1 << 20});
  TensorView q = a.alloc(DType::U8, {3 << 20});
  EXPECT_EQ(static_cast<char*>(q.data) - static_cast<char*>(p.data), 1 << 20);  // one block now
  EXPECT_EQ(a.capacity_bytes(), grown);
}

}  // namespace
}  // namespace lathe
