// The batched decode attention's two kernels (attention.h, DecodeKernel)
// against the naive double reference of tests/ops/reference: the cluster
// kernel at head_dim 64 and 128, query groups of 1, 2, 3, 4 and 8 heads (a
// block taking 1, 2 or 4 of them), with and without a sliding window, at
// contexts from one key to the longest that takes two rounds of its
// registers, and the split-K kernel on the same inputs. Tolerances as
// attention_test.cpp: out 1e-2, lse 1e-3 (max|got − want| / max|want|).
// A sequence's result must not depend on the batch it is decoded in
// (bitwise, alone against with three others), and refusals name the field.
// Without a GPU the kernel tests skip themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/attention.h"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/device.h"
#include "ops/op_test_util.h"
#include "ops/reference/reference.h"

namespace lathe {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA in this build)"

cuda::DeviceBuffer device_bytes(const void* src, size_t bytes) {
  auto buf = cuda::DeviceBuffer::alloc(0, bytes);
  EXPECT_TRUE(buf.is_ok()) << buf.status().message();
  EXPECT_TRUE(buf.value().copy_from_host(src, bytes).is_ok());
  return std::move(buf.value());
}
cuda::DeviceBuffer device_zeros(size_t bytes) { return device_bytes(std::vector<unsigned char>(bytes).data(), bytes); }

Tensor download(const cuda::DeviceBuffer& buf, DType dt, Shape shape) {
  Tensor t = Tensor::empty(dt, shape);
  EXPECT_TRUE(buf.copy_to_host(t.raw(), size_t(t.nbytes())).is_ok());
  return dt == DType::F32 ? t : t.to_f32();
}

// n_seqs sequences, each with its own cache of pos[s] + 2 rows (the spare
// rows must be ignored), q rows and the device arrays the kernels read.
struct Batch {
  int n_head = 0, n_head_kv = 0, d = 0;
  std::vector<int32_t> pos;
  Tensor q;                   // f32 (bf16-rounded) [n_seqs, n_head, d]
  std::vector<Tensor> k, v;   // f32 (bf16-rounded) [pos + 2, n_head_kv, d]
  std::vector<cuda::DeviceBuffer> caches;
  cuda::DeviceBuffer q_dev, k_ptrs, v_ptrs, pos_dev;
};

Batch make_batch(int n_head, int n_head_kv, int d, std::vector<int32_t> pos, uint32_t seed) {
  Batch b;
  b.n_head = n_head, b.n_head_kv = n_head_kv, b.d = d, b.pos = std::move(pos);
  const int n = int(b.pos.size());
  Tensor q = testing::random_tensor(DType::BF16, {n, n_head, d}, seed++);
  b.q = q.to_f32();
  b.q_dev = device_bytes(q.raw(), size_t(q.nbytes()));
  std::vector<const void*> kp, vp;
  for (int s = 0; s < n; ++s) {
    for (std::vector<Tensor>* dst : {&b.k, &b.v}) {
      Tensor t = testing::random_tensor(DType::BF16, {b.pos[size_t(s)] + 2, n_head_kv, d}, seed++);
      dst->push_back(t.to_f32());
      b.caches.push_back(device_bytes(t.raw(), size_t(t.nbytes())));
      (dst == &b.k ? kp : vp).push_back(b.caches.back().data());
    }
  }
  b.k_ptrs = device_bytes(kp.data(), kp.size() * sizeof(void*));
  b.v_ptrs = device_bytes(vp.data(), vp.size() * sizeof(void*));
  b.pos_dev = device_bytes(b.pos.data(), b.pos.size() * sizeof(int32_t));
  return b;
}

struct Result2 {
  Tensor out, lse;  // f32 [n_seqs, n_head, d], [n_seqs, n_head]
};

// Sequences [first, first + count) of b through the kernel.
Result2 run(const Batch& b, int first, int count, int max_ctx, int window, cuda::DecodeKernel kernel, int heads,
            Status* status) {
  cuda::DeviceBuffer out = device_zeros(size_t(count) * b.n_head * b.d * 2);
  cuda::DeviceBuffer lse = device_zeros(size_t(count) * b.n_head * 4);
  cuda::DeviceBuffer ws = device_zeros(cuda::attention_decode_workspace_bytes(count, b.n_head, b.d));
  cuda::AttentionDecodeBatchArgs a{
      .q = static_cast<const char*>(b.q_dev.data()) + size_t(first) * b.n_head * b.d * 2,
      .k_caches = static_cast<const void* const*>(b.k_ptrs.data()) + first,
      .v_caches = static_cast<const void* const*>(b.v_ptrs.data()) + first,
      .pos = static_cast<const int32_t*>(b.pos_dev.data()) + first,
      .out = out.data(),
      .lse = static_cast<float*>(lse.data()),
      .workspace = ws.data(),
      .n_seqs = count,
      .max_ctx = max_ctx,
      .n_head = b.n_head,
      .n_head_kv = b.n_head_kv,
      .head_dim = b.d,
      .window = window,
      .scale = 1.0f / std::sqrt(float(b.d)),
      .kernel = kernel,
      .cluster_heads = heads};
  *status = cuda::attention_decode_batch(a);
  if (!status->is_ok()) return {};
  return {download(out, DType::BF16, {count, b.n_head, b.d}), download(lse, DType::F32, {count, b.n_head})};
}

Result2 reference(const Batch& b, int window) {
  const int n = int(b.pos.size());
  Result2 r{Tensor::zeros(DType::F32, {n, b.n_head, b.d}), Tensor::zeros(DType::F32, {n, b.n_head})};
  for (int s = 0; s < n; ++s) {
    AttentionArgs a{.q = b.q.view().slice_rows(s, s + 1), .k = b.k[size_t(s)], .v = b.v[size_t(s)],
                    .out = r.out.view().slice_rows(s, s + 1), .lse = r.lse.view().slice_rows(s, s + 1),
                    .pos0 = b.pos[size_t(s)], .window = window, .scale = 1.0f / std::sqrt(float(b.d))};
    ref::attention_forward(a);
  }
  return r;
}

bool cluster_runs() {
  auto info = cuda::device_info(0);
  return info.is_ok() && info.value().sm_major >= 9;
}

struct ClusterCase {
  int n_head, n_head_kv, d, window, heads;
  std::vector<int32_t> pos;
};

TEST(CudaAttentionDecode, ClusterAndSplitKMatchReference) {
  SKIP_WITHOUT_GPU();
  if (!cluster_runs()) GTEST_SKIP() << "the cluster kernel runs on sm_90+";
  const ClusterCase cases[] = {
      {8, 2, 64, 0, 4, {0, 77, 700, 5}},       // group 4, a block per group; one key to two splits' worth
      {8, 2, 128, 0, 4, {1, 300, 639, 95}},    // four heads per block
      {8, 2, 128, 50, 0, {0, 77, 700, 5}},     // window shorter than most contexts; the default two heads
      {8, 8, 64, 0, 0, {2047, 1024, 13, 0}},   // group 1; two rounds of registers
      {16, 2, 64, 0, 4, {400, 3}},             // group 8: two blocks of 4 heads
      {6, 2, 128, 0, 0, {1535, 200}},          // group 3: a head per block; two rounds
      {8, 2, 64, 0, 0, {640, 641, 642, 643}},  // the default: one head per block
      {8, 2, 64, 0, 2, {640, 1, 642, 100}},    // two heads per block
      {4, 2, 64, 0, 4, {33, 500}},             // four asked, the group of two taken
  };
  uint32_t seed = 2100;
  for (const ClusterCase& c : cases) {
    Batch b = make_batch(c.n_head, c.n_head_kv, c.d, c.pos, seed);
    seed += 20;
    int max_ctx = 0;
    for (int32_t p : c.pos) max_ctx = std::max(max_ctx, p + 1);
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_head << "/" << c.n_head_kv << " d=" << c.d << " window="
                                      << c.window << " heads per block " << c.heads << " max_ctx " << max_ctx);
    const Result2 want = reference(b, c.window);
    Status st;
    const Result2 cl = run(b, 0, int(c.pos.size()), max_ctx, c.window, cuda::DecodeKernel::kCluster, c.heads, &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_LE(testing::rel_error(cl.out, want.out), 1e-2);
    EXPECT_LE(testing::rel_error(cl.lse, want.lse), 1e-3);
    const Result2 sk = run(b, 0, int(c.pos.size()), max_ctx, c.window, cuda::DecodeKernel::kSplitK, 0, &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_LE(testing::rel_error(sk.out, want.out), 1e-2);
    EXPECT_LE(testing::rel_error(sk.lse, want.lse), 1e-3);
  }
}

// A sequence decoded alone and as the last of four: the same bits (the
// kernel's split depends on max_ctx and the sequence's position only).
TEST(CudaAttentionDecode, ClusterResultDoesNotDependOnTheBatch) {
  SKIP_WITHOUT_GPU();
  if (!cluster_runs()) GTEST_SKIP() << "the cluster kernel runs on sm_90+";
  for (int d : {64, 128}) {
    Batch b = make_batch(32, 8, d, {5, 600, 100, 333}, 2400 + uint32_t(d));
    Status st;
    const Result2 all = run(b, 0, 4, 769, 0, cuda::DecodeKernel::kAuto, 0, &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    const Result2 last = run(b, 3, 1, 769, 0, cuda::DecodeKernel::kAuto, 0, &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    const size_t row = size_t(32) * d;
    EXPECT_EQ(std::memcmp(all.out.data<float>() + 3 * row, last.out.data<float>(), row * sizeof(float)), 0) << d;
    EXPECT_EQ(std::memcmp(all.lse.data<float>() + 3 * 32, last.lse.data<float>(), 32 * sizeof(float)), 0) << d;
  }
}

// What the cluster kernel does not take: an error naming why, no launch.
TEST(CudaAttentionDecode, ClusterRefusalsAreClearErrors) {
  SKIP_WITHOUT_GPU();
  if (!cluster_runs()) GTEST_SKIP() << "the cluster kernel runs on sm_90+";
  Batch b = make_batch(8, 2, 64, {10, 10, 10, 10, 10}, 2600);
  Status st;
  run(b, 0, 5, 11, 0, cuda::DecodeKernel::kCluster, 0, &st);  // more than kDecodeClusterMaxSeqs
  EXPECT_NE(st.message().find("n_seqs 5"), std::string::npos) << st.message();
  run(b, 0, 1, 5000, 0, cuda::DecodeKernel::kCluster, 0, &st);  // longer than two rounds of registers
  EXPECT_NE(st.message().find("keys 5000"), std::string::npos) << st.message();
  run(b, 0, 1, 11, 0, cuda::DecodeKernel::kCluster, 3, &st);  // 3 heads per block
  EXPECT_NE(st.message().find("cluster_heads 3"), std::string::npos) << st.message();
  run(b, 0, 5, 11, 0, cuda::DecodeKernel::kAuto, 0, &st);  // kAuto falls back to split-K
  EXPECT_TRUE(st.is_ok()) << st.message();
}

}  // namespace
}  // namespace lathe
