// The persistent decode kernel's argument checks (decode_persistent.h): a
// stage list that is not a decode step's (epilogues out of order, a k the
// ring cannot take, RoPE fields of another shape), a bad row count or a
// missing buffer is refused with a message naming the stage or field, before
// anything is launched. Its results are checked end to end against the CPU
// model in causal_lm_gen_test.cpp (PersistentDecodeMatchesCpu).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/cuda/decode_persistent.h"
#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

// A well-formed stage list of n_layer layers over placeholder device
// pointers (never dereferenced: every case below is refused on the host).
struct Stages {
  std::vector<GemvArgs> list;
  PersistentDecodeArgs args;
};
Stages well_formed(int n_layer, void* p) {
  auto* b = static_cast<bf16_bits*>(p);
  auto* f = static_cast<float*>(p);
  auto* ptrs = static_cast<bf16_bits* const*>(p);
  const int hd = 64, heads = 4, kv = 2;
  const int64_t hidden = 256, ffn = 512, qkv_n = int64_t(heads + 2 * kv) * hd;
  using E = GemvEpilogue;
  Stages s;
  for (int l = 0; l < n_layer; ++l) {
    GemvArgs qkv{.w = b, .rows = 1, .n = qkv_n, .k = hidden, .epilogue = E::kRopeAppend, .x_f32 = f, .norm_w = b};
    qkv.rope = {.q_out = b, .k_caches = ptrs, .v_caches = ptrs, .pos = static_cast<const int32_t*>(p), .cos = f,
                .sin = f, .n_head = heads, .n_head_kv = kv, .head_dim = hd, .max_ctx = 64};
    s.list.push_back(qkv);
    s.list.push_back({.x = b, .w = b, .out = f, .rows = 1, .n = hidden, .k = heads * hd, .epilogue = E::kAddF32});
    s.list.push_back({.w = b, .out = f, .rows = 1, .n = ffn, .k = hidden, .epilogue = E::kSwigluF32, .x_f32 = f,
                      .norm_w = b});
    s.list.push_back({.w = b, .out = f, .rows = 1, .n = hidden, .k = ffn, .epilogue = E::kAddF32, .x_f32 = f});
  }
  s.list.push_back({.w = b, .out = f, .rows = 1, .n = 512, .k = hidden, .epilogue = E::kStoreF32, .x_f32 = f,
                    .norm_w = b});
  s.args = {.gemvs = s.list.data(), .n_layer = n_layer, .rows = 1, .attn_out = b, .workspace = f,
            .barrier = static_cast<unsigned*>(p), .scale = 0.125f};
  return s;
}

void expect_refused(CudaContext& ctx, const Stages& s, const std::string& says) {
  const Status st = decode_persistent(ctx, s.args, s.list.data());
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
}

TEST(CudaDecodePersistent, BadStageListsAreClearErrors) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  DeviceBuffer buf = upload(ctx, std::vector<float>(64, 0.0f));  // a 16-byte aligned placeholder
  void* p = buf.data();
  {
    Stages s = well_formed(2, p);
    std::swap(s.list[1], s.list[2]);  // gate|up where o belongs
    expect_refused(ctx, s, "stage 1 has epilogue");
  }
  {
    Stages s = well_formed(2, p);
    s.list[6].k = 500;  // layer 1's gate|up: k not a multiple of 8
    expect_refused(ctx, s, "stage 6: k (500) must be a multiple of 8");
  }
  {
    Stages s = well_formed(2, p);
    s.list[4].rope.head_dim = 128;  // layer 1's q|k|v of another head size
    expect_refused(ctx, s, "stage 4: bad RoPE fields");
  }
  {
    Stages s = well_formed(1, p);
    s.args.rows = 5;
    expect_refused(ctx, s, "rows 5");
  }
  {
    Stages s = well_formed(1, p);
    s.args.barrier = nullptr;
    expect_refused(ctx, s, "null argument");
  }
  EXPECT_FALSE(decode_persistent_supported(ctx.device(), 96)) << "head_dim 96 has no attention stage";
  EXPECT_FALSE(decode_persistent_prepare(ctx.device(), 96, 1, 0).is_ok());
}

}  // namespace
}  // namespace lathe::cuda
