// CUDA attention against the naive double references of tests/ops/reference:
// packed training forward (out, lse) and backward (d_q, d_k, d_v), and
// generation against a KV cache (one token through the split-K kernel,
// several through the tensor-core prefill, a batch of caches at once).
// Inputs are rounded to bf16 once; the reference sees exactly the values the
// GPU sees. Tolerances, as max|got − want| / max|want| over a whole tensor:
// out 1e-2 (bf16 output and bf16 probabilities in P·V), lse 1e-3 (fp32
// throughout), gradients 2e-2 (P and dS rounded to bf16 before their
// products). Forward and backward each run both kernels (fast and simple);
// the fast kernels also in their Hopper builds where the device runs them
// (the forward's wgmma and warp-specialized kernels, the latter for prefill
// too; the backward's wgmma kernels), and the one-kernel (fused) backward, whose run-to-run bits
// are checked too. A strided output is checked bitwise against the packed one.
// Without a GPU the kernel tests skip themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/attention.h"
#include "backends/cuda/device.h"
#include "core/dtype.h"
#include "ops/op_test_util.h"
#include "ops/reference/reference.h"

namespace lathe {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA in this build)"

// The wgmma kernels run on Hopper at head_dim 64 and 128 only.
bool wgmma_runs(int head_dim) {
  auto info = cuda::device_info(0);
  return info.is_ok() && info.value().sm_major == 9 && (head_dim == 64 || head_dim == 128);
}

// A bf16 device copy of a host tensor plus its bf16-rounded f32 twin.
struct Bf16Input {
  Tensor host;  // f32, already rounded to bf16
  cuda::DeviceBuffer dev;
};

Bf16Input upload(Shape shape, uint32_t seed) {
  Tensor b = testing::random_tensor(DType::BF16, shape, seed);
  Bf16Input in{b.to_f32(), {}};
  auto buf = cuda::DeviceBuffer::alloc(0, size_t(b.nbytes()));
  EXPECT_TRUE(buf.is_ok()) << buf.status().message();
  in.dev = std::move(buf.value());
  EXPECT_TRUE(in.dev.copy_from_host(b.raw(), size_t(b.nbytes())).is_ok());
  return in;
}

// A device buffer with every byte `fill`.
cuda::DeviceBuffer device_zeros(size_t bytes, unsigned char fill = 0) {
  auto buf = cuda::DeviceBuffer::alloc(0, bytes);
  EXPECT_TRUE(buf.is_ok()) << buf.status().message();
  std::vector<unsigned char> zeros(bytes, fill);
  EXPECT_TRUE(buf.value().copy_from_host(zeros.data(), bytes).is_ok());
  return std::move(buf.value());
}

// Device bf16 (or f32) buffer back to an f32 host tensor.
Tensor download(const cuda::DeviceBuffer& buf, DType dt, Shape shape) {
  Tensor t = Tensor::empty(dt, shape);
  EXPECT_TRUE(buf.copy_to_host(t.raw(), size_t(t.nbytes())).is_ok());
  return dt == DType::F32 ? t : t.to_f32();
}

struct VarlenCase {
  std::vector<int32_t> lengths;
  int n_head, n_head_kv, head_dim, window;
};

const VarlenCase kVarlenCases[] = {
    {{1}, 8, 2, 64, 0},              // one row
    {{100, 1, 37}, 8, 2, 128, 0},    // uneven documents, one longer than a tile
    {{130}, 4, 4, 64, 0},            // MHA, three tiles
    {{70, 150, 5}, 8, 2, 128, 50},   // sliding window spanning tiles
    {{200}, 4, 1, 64, 17},           // narrow window, all heads on one KV head
    {{64, 64, 65}, 2, 1, 128, 0},    // exact tile edges
    {{90, 33}, 4, 4, 32, 0},         // head_dim 32 (the built-in tiny model's 4 heads)
    {{150, 7}, 4, 2, 32, 40},        // head_dim 32, grouped, windowed
};

struct VarlenData {
  int64_t n = 0;
  Tensor cu_host;
  cuda::DeviceBuffer cu;
  Bf16Input q, k, v;
};

VarlenData make_varlen(const VarlenCase& c, uint32_t seed) {
  VarlenData d;
  std::vector<int32_t> cu{0};
  for (int32_t len : c.lengths) cu.push_back(cu.back() + len);
  d.n = cu.back();
  d.cu_host = Tensor::empty(DType::I32, {int64_t(cu.size())});
  std::copy(cu.begin(), cu.end(), d.cu_host.data<int32_t>());
  d.cu = device_zeros(cu.size() * sizeof(int32_t));
  EXPECT_TRUE(d.cu.copy_from_host(cu.data(), cu.size() * sizeof(int32_t)).is_ok());
  d.q = upload({d.n, c.n_head, c.head_dim}, seed);
  d.k = upload({d.n, c.n_head_kv, c.head_dim}, seed + 1);
  d.v = upload({d.n, c.n_head_kv, c.head_dim}, seed + 2);
  return d;
}

int max_len(const VarlenCase& c) {
  int m = 0;
  for (int32_t len : c.lengths) m = std::max(m, int(len));
  return m;
}

// The forward kernels: the simple one; mma.sync with 16 or 32 rows per
// warp; wgmma with 64 or 128 rows per block; the warp-specialized one with
// (rows per block, keys per tile), a block per query tile or (persistent)
// one per SM taking tiles in turn: Hopper, head_dim 64 and 128, 192 rows at
// 64 only.
struct FwdKind {
  const char* name;
  bool simple = false;
  int warp_rows = 0, wgmma_rows = 0, ws_rows = 0, ws_keys = 0, ws_persistent = 0;
};
const FwdKind kFwdKinds[] = {
    {"simple", true},
    {"mma w16", false, 16},
    {"mma w32", false, 32},
    {"wgmma 64", false, 0, 64},
    {"wgmma 128", false, 0, 128},
    {"ws 128x64", false, 0, 0, 128, 64},
    {"ws 128x128", false, 0, 0, 128, 128},
    {"ws 192x64", false, 0, 0, 192, 64},
    {"ws 192x128", false, 0, 0, 192, 128},
    {"ws 128x128 persistent", false, 0, 0, 128, 128, 1},
    {"ws 192x64 persistent", false, 0, 0, 192, 64, 1},
};
bool fwd_runs(const FwdKind& k, int head_dim) {
  if (k.ws_rows == 192 && head_dim != 64) return false;
  return (k.wgmma_rows == 0 && k.ws_rows == 0) || wgmma_runs(head_dim);
}
void set_kind(cuda::AttentionVarlenFwdArgs& a, const FwdKind& k) {
  a.simple = k.simple, a.warp_rows = k.warp_rows, a.wgmma = k.wgmma_rows != 0, a.wgmma_rows = k.wgmma_rows;
  a.kernels = k.ws_rows != 0 ? cuda::AttnFwdKernels::kWs : cuda::AttnFwdKernels::kAuto;
  a.ws_rows = k.ws_rows, a.ws_keys = k.ws_keys, a.ws_persistent = k.ws_persistent;
}

// Forward-only cases for the kernels with larger tiles: documents longer
// than 192 rows and 128 keys, odd lengths, grouped heads, windows.
const VarlenCase kFwdCases[] = {
    {{300, 5, 257}, 8, 2, 64, 0},    // three documents across several 192-row blocks
    {{400, 129}, 4, 2, 128, 100},    // window inside a 128-key tile
    {{385, 2, 191}, 6, 3, 64, 130},  // window longer than a tile, tile edges ± 1
};

// The forward of `kind` over d on the device (window and scale as given),
// downloaded: out as [n, n_head, head_dim], lse as [n, n_head].
void run_forward(const VarlenData& d, const VarlenCase& c, const FwdKind& kind, int window, float scale, Tensor* out,
                 Tensor* lse) {
  cuda::DeviceBuffer o = device_zeros(size_t(d.n * c.n_head * c.head_dim * 2));
  cuda::DeviceBuffer l = device_zeros(size_t(d.n * c.n_head * 4));
  cuda::AttentionVarlenFwdArgs a{d.q.dev.data(), d.k.dev.data(), d.v.dev.data(), o.data(),
                                 static_cast<float*>(l.data()), static_cast<const int32_t*>(d.cu.data()),
                                 int(c.lengths.size()), max_len(c), int(d.n), c.n_head, c.n_head_kv, c.head_dim,
                                 window, scale, nullptr};
  set_kind(a, kind);
  Status st = cuda::attention_varlen_forward(a);
  ASSERT_TRUE(st.is_ok()) << st.message();
  *out = download(o, DType::BF16, {d.n, c.n_head, c.head_dim});
  *lse = download(l, DType::F32, {d.n, c.n_head});
}

TEST(CudaAttention, VarlenForwardMatchesReference) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 500;
  std::vector<VarlenCase> cases(std::begin(kVarlenCases), std::end(kVarlenCases));
  cases.insert(cases.end(), std::begin(kFwdCases), std::end(kFwdCases));
  for (const VarlenCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "docs=" << c.lengths.size() << " heads=" << c.n_head << "/" << c.n_head_kv
                                      << " d=" << c.head_dim << " window=" << c.window);
    VarlenData d = make_varlen(c, seed += 3);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    Tensor want = Tensor::zeros(DType::F32, {d.n, c.n_head, c.head_dim});
    Tensor want_lse = Tensor::zeros(DType::F32, {d.n, c.n_head});
    AttentionVarlenArgs r{.q = d.q.host, .k = d.k.host, .v = d.v.host, .out = want, .lse = want_lse,
                          .cu_seqlens = d.cu_host, .window = c.window, .scale = scale};
    ref::attention_varlen_forward(r);
    for (const FwdKind& kind : kFwdKinds) {
      if (!fwd_runs(kind, c.head_dim)) continue;
      SCOPED_TRACE(kind.name);
      Tensor got, got_lse;
      run_forward(d, c, kind, c.window, scale, &got, &got_lse);
      if (HasFatalFailure()) return;
      EXPECT_LE(testing::rel_error(got, want), 1e-2);
      EXPECT_LE(testing::rel_error(got_lse, want_lse), 1e-3);
    }
  }
}

// At training length, where the double reference would be slow, the
// pipelined kernels (16 and 32 rows per warp, and the Hopper ones where they
// run) must agree with the simple one: the same arithmetic (the Hopper
// kernels sum their fp32 products in another order, and with 128-key tiles
// rescale the running sums at other points), so at most a rare bf16
// rounding flip (or an fp32 ulp of lse) apart.
TEST(CudaAttention, PipelinedForwardMatchesSimpleAtLength) {
  SKIP_WITHOUT_GPU();
  // Enough query tiles (> 132) that a persistent block takes several in turn.
  for (const VarlenCase& c : {VarlenCase{{1500, 700, 1}, 8, 2, 128, 0}, VarlenCase{{1100, 1029}, 16, 4, 64, 0}}) {
    SCOPED_TRACE(::testing::Message() << "d=" << c.head_dim);
    VarlenData d = make_varlen(c, 4242 + uint32_t(c.head_dim));
    Tensor out0, lse0;
    for (const FwdKind& kind : kFwdKinds) {  // the simple kernel first
      if (!fwd_runs(kind, c.head_dim)) continue;
      SCOPED_TRACE(kind.name);
      Tensor got, got_lse;
      run_forward(d, c, kind, 0, 1.0f / std::sqrt(float(c.head_dim)), &got, &got_lse);
      if (HasFatalFailure()) return;
      if (kind.simple) {
        out0 = std::move(got), lse0 = std::move(got_lse);
        continue;
      }
      EXPECT_LE(testing::rel_error(got, out0), 5e-3);
      EXPECT_LE(testing::rel_error(got_lse, lse0), 1e-5);
    }
  }
}

// Forward on the device, then the backward (one of its kernel sets) into
// freshly zeroed d_q, d_k, d_v, downloaded as f32.
struct VarlenGrads {
  Tensor dq, dk, dv;
};

// The wgmma kernels with 64 rows (one warpgroup) and 128 rows (two) per block;
// kFused: the one-kernel backward (mma.sync, d_q summed in a fixed order);
// kWs: the warp-specialized Hopper kernels (kWsDs: d_q from the dS tiles
// dk/dv keeps).
enum class Bwd { kSimple, kMma, kWgmma64, kWgmma128, kFused, kFusedLoadStore, kWs, kWsDs };
const char* bwd_name(Bwd k) {
  switch (k) {
    case Bwd::kSimple: return "simple kernels";
    case Bwd::kMma: return "mma.sync kernels";
    case Bwd::kWgmma64: return "wgmma kernels, 64 rows per block";
    case Bwd::kWgmma128: return "wgmma kernels, 128 rows per block";
    case Bwd::kFused: return "fused kernel";
    case Bwd::kFusedLoadStore: return "fused kernel, load-add-store";
    case Bwd::kWs: return "warp-specialized kernels";
    case Bwd::kWsDs: return "warp-specialized kernels, d_q from the stored dS";
  }
  return "?";
}
bool is_wgmma(Bwd k) { return k == Bwd::kWgmma64 || k == Bwd::kWgmma128; }
bool is_ds(Bwd k) { return k == Bwd::kWsDs; }
bool is_ws(Bwd k) { return k == Bwd::kWs || is_ds(k); }
bool runs(Bwd k, int head_dim) { return !(is_wgmma(k) || is_ws(k)) || wgmma_runs(head_dim); }
cuda::AttnBwdKernels kernels_of(Bwd k) {
  return is_ds(k)      ? cuda::AttnBwdKernels::kWsDs
         : is_ws(k)    ? cuda::AttnBwdKernels::kWs
         : is_wgmma(k) ? cuda::AttnBwdKernels::kWgmma
                     : k == Bwd::kFused || k == Bwd::kFusedLoadStore ? cuda::AttnBwdKernels::kFused
                                                                      : cuda::AttnBwdKernels::kMma;
}

// `fill`: the byte d_q, d_k, d_v and the workspace hold before the call;
// ws_after: the workspace after it (kWsDs sizes it for this batch's dS,
// less the tiles of spare regions of spare_tiles[r] tiles each).
VarlenGrads device_backward(const VarlenCase& c, VarlenData& d, const Bf16Input& d_out, Bwd kind,
                            unsigned char fill = 0, std::vector<unsigned char>* ws_after = nullptr,
                            std::array<int64_t, 2> spare_tiles = {0, 0}) {
  const size_t q_bytes = size_t(d.n * c.n_head * c.head_dim * 2);
  const size_t kv_bytes = size_t(d.n * c.n_head_kv * c.head_dim * 2);
  cuda::DeviceBuffer out = device_zeros(q_bytes), lse = device_zeros(size_t(d.n * c.n_head * 4));
  cuda::DeviceBuffer dq = device_zeros(q_bytes, fill), dk = device_zeros(kv_bytes, fill);
  cuda::DeviceBuffer dv = device_zeros(kv_bytes, fill);
  const int n_docs = int(c.lengths.size());
  const size_t ws_bytes = cuda::attention_varlen_backward_workspace_bytes(
      d.n, c.n_head, c.head_dim, kernels_of(kind), max_len(c), n_docs, spare_tiles[0] + spare_tiles[1]);
  cuda::DeviceBuffer spare0 = device_zeros(size_t(spare_tiles[0]) * 8192 + 16, fill);
  cuda::DeviceBuffer spare1 = device_zeros(size_t(spare_tiles[1]) * 8192 + 16, fill);
  cuda::DeviceBuffer ws = device_zeros(ws_bytes, fill);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  const auto* cu = static_cast<const int32_t*>(d.cu.data());
  cuda::AttentionVarlenFwdArgs f{d.q.dev.data(), d.k.dev.data(), d.v.dev.data(), out.data(),
                                 static_cast<float*>(lse.data()), cu, n_docs, max_len(c), int(d.n), c.n_head,
                                 c.n_head_kv, c.head_dim, c.window, scale, nullptr};
  Status st = cuda::attention_varlen_forward(f);
  EXPECT_TRUE(st.is_ok()) << st.message();
  cuda::AttentionVarlenBwdArgs b{d.q.dev.data(), d.k.dev.data(), d.v.dev.data(), out.data(),
                                 static_cast<const float*>(lse.data()), d_out.dev.data(), dq.data(), dk.data(),
                                 dv.data(), cu, ws.data(), n_docs, max_len(c), int(d.n), c.n_head, c.n_head_kv,
                                 c.head_dim, c.window, scale, nullptr, kind == Bwd::kSimple, kernels_of(kind),
                                 kind == Bwd::kWgmma128 ? 128 : 64};
  b.fused_load_store = kind == Bwd::kFusedLoadStore;
  b.workspace_bytes = ws_bytes;
  if (spare_tiles[0] > 0) b.ds_spare[0] = spare0.data(), b.ds_spare_bytes[0] = size_t(spare_tiles[0]) * 8192 + 16;
  if (spare_tiles[1] > 0) b.ds_spare[1] = spare1.data(), b.ds_spare_bytes[1] = size_t(spare_tiles[1]) * 8192 + 16;
  st = cuda::attention_varlen_backward(b);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (ws_after) {
    ws_after->resize(ws_bytes);
    EXPECT_TRUE(ws.copy_to_host(ws_after->data(), ws_bytes).is_ok());
  }
  return {download(dq, DType::BF16, {d.n, c.n_head, c.head_dim}),
          download(dk, DType::BF16, {d.n, c.n_head_kv, c.head_dim}),
          download(dv, DType::BF16, {d.n, c.n_head_kv, c.head_dim})};
}

TEST(CudaAttention, VarlenBackwardMatchesReference) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 900;
  for (const VarlenCase& c : kVarlenCases) {
    SCOPED_TRACE(::testing::Message() << "docs=" << c.lengths.size() << " heads=" << c.n_head << "/" << c.n_head_kv
                                      << " d=" << c.head_dim << " window=" << c.window);
    VarlenData d = make_varlen(c, seed += 4);
    Bf16Input d_out = upload({d.n, c.n_head, c.head_dim}, seed + 3);
    Tensor want_dq = Tensor::zeros(DType::F32, {d.n, c.n_head, c.head_dim});
    Tensor want_dk = Tensor::zeros(DType::F32, {d.n, c.n_head_kv, c.head_dim}), want_dv = want_dk.clone();
    AttentionVarlenBackwardArgs r{.q = d.q.host, .k = d.k.host, .v = d.v.host, .cu_seqlens = d.cu_host,
                                  .d_out = d_out.host, .d_q = want_dq, .d_k = want_dk, .d_v = want_dv,
                                  .window = c.window, .scale = 1.0f / std::sqrt(float(c.head_dim))};
    ref::attention_varlen_backward(r);
    for (Bwd kind : {Bwd::kMma, Bwd::kWgmma64, Bwd::kWgmma128, Bwd::kWs, Bwd::kWsDs, Bwd::kFused,
                     Bwd::kFusedLoadStore, Bwd::kSimple}) {
      if (!runs(kind, c.head_dim)) continue;
      SCOPED_TRACE(bwd_name(kind));
      VarlenGrads got = device_backward(c, d, d_out, kind);
      EXPECT_LE(testing::rel_error(got.dq, want_dq), 2e-2);
      EXPECT_LE(testing::rel_error(got.dk, want_dk), 2e-2);
      EXPECT_LE(testing::rel_error(got.dv, want_dv), 2e-2);
    }
  }
}

// At training length the fast backwards must agree with the simple one: the
// same arithmetic (the wgmma kernels sum the fp32 products in another
// order), so at most a rare bf16 rounding flip apart (as for the forward
// above). Grouped heads and a document that is not a whole number of tiles
// exercise the unmasked interior tiles and the masked edges together. Each
// must also be deterministic: a second run gives the same bits.
TEST(CudaAttention, FastBackwardMatchesSimpleAtLength) {
  SKIP_WITHOUT_GPU();
  for (int head_dim : {32, 64, 128}) {
    const VarlenCase c{{1500, 700, 1}, 8, 2, head_dim, 0};
    VarlenData d = make_varlen(c, 5151);
    Bf16Input d_out = upload({d.n, c.n_head, c.head_dim}, 5155);
    const VarlenGrads simple = device_backward(c, d, d_out, Bwd::kSimple);
    for (Bwd kind : {Bwd::kMma, Bwd::kWgmma64, Bwd::kWgmma128, Bwd::kWs, Bwd::kWsDs, Bwd::kFused}) {
      if (!runs(kind, head_dim)) continue;
      SCOPED_TRACE(::testing::Message() << "d=" << head_dim << " " << bwd_name(kind));
      const VarlenGrads fast = device_backward(c, d, d_out, kind), again = device_backward(c, d, d_out, kind);
      EXPECT_LE(testing::rel_error(fast.dq, simple.dq), 5e-3);
      EXPECT_LE(testing::rel_error(fast.dk, simple.dk), 5e-3);
      EXPECT_LE(testing::rel_error(fast.dv, simple.dv), 5e-3);
      EXPECT_EQ(testing::rel_error(again.dq, fast.dq), 0.0);
      EXPECT_EQ(testing::rel_error(again.dk, fast.dk), 0.0);
      EXPECT_EQ(testing::rel_error(again.dv, fast.dv), 0.0);
    }
  }
}

// The warp-specialized kernels against the simple ones where their ring
// turns over many times: a KV group of four heads (the dkdv block walks
// every head's query tiles through one ring), documents ending inside a
// tile and one shorter than a tile, with and without a window that spans
// tiles; deterministic as well.
TEST(CudaAttention, WsBackwardMatchesSimpleAcrossDocuments) {
  SKIP_WITHOUT_GPU();
  if (!wgmma_runs(64)) GTEST_SKIP() << "needs a Hopper device";
  for (int head_dim : {64, 128})
    for (int window : {0, 150}) {
      const VarlenCase c{{333, 40, 700, 257}, 8, 2, head_dim, window};
      SCOPED_TRACE(::testing::Message() << "d=" << head_dim << " window=" << window);
      VarlenData d = make_varlen(c, 6161 + head_dim + window);
      Bf16Input d_out = upload({d.n, c.n_head, c.head_dim}, 6167 + head_dim + window);
      const VarlenGrads simple = device_backward(c, d, d_out, Bwd::kSimple);
      for (Bwd kind : {Bwd::kWs, Bwd::kWsDs}) {
        SCOPED_TRACE(bwd_name(kind));
        const VarlenGrads ws = device_backward(c, d, d_out, kind, 0xff);
        const VarlenGrads again = device_backward(c, d, d_out, kind);
        EXPECT_LE(testing::rel_error(ws.dq, simple.dq), 5e-3);
        EXPECT_LE(testing::rel_error(ws.dk, simple.dk), 5e-3);
        EXPECT_LE(testing::rel_error(ws.dv, simple.dv), 5e-3);
        EXPECT_EQ(testing::rel_error(again.dq, ws.dq), 0.0);
        EXPECT_EQ(testing::rel_error(again.dk, ws.dk), 0.0);
        EXPECT_EQ(testing::rel_error(again.dv, ws.dv), 0.0);
      }
    }
}

// kWsDs keeps the dS of every tile pair the keys see in the workspace, each
// document's pairs after those of the documents before it: over a
// workspace filled with 0xff, every word of those tiles must be written (an
// all-ones word would be two bf16 NaNs, which dS never holds) and each
// document's first pair must be the sum of the pairs before it, so the
// d_q product read only tiles this call wrote.
TEST(CudaAttention, WsDsBackwardWritesEveryTilePair) {
  SKIP_WITHOUT_GPU();
  if (!wgmma_runs(64)) GTEST_SKIP() << "needs a Hopper device";
  for (int head_dim : {64, 128}) {
    const VarlenCase c{{1000, 130, 64, 1, 700}, 8, 2, head_dim, 0};
    SCOPED_TRACE(::testing::Message() << "d=" << head_dim);
    VarlenData d = make_varlen(c, 7171 + uint32_t(head_dim));
    Bf16Input d_out = upload({d.n, c.n_head, c.head_dim}, 7177);
    std::vector<unsigned char> ws;
    const VarlenGrads got = device_backward(c, d, d_out, Bwd::kWsDs, 0xff, &ws);
    const VarlenGrads simple = device_backward(c, d, d_out, Bwd::kSimple);
    EXPECT_LE(testing::rel_error(got.dq, simple.dq), 5e-3);
    auto round16 = [](size_t b) { return (b + 15) / 16 * 16; };
    const size_t pair_base_at = round16(size_t(d.n) * size_t(c.n_head) * 4);
    const size_t tiles_at = pair_base_at + round16((size_t(d.n) + 1) * 4);
    int64_t pairs = 0;
    for (size_t doc = 0; doc < c.lengths.size(); ++doc) {
      int32_t base = 0;
      std::memcpy(&base, ws.data() + pair_base_at + 4 * doc, 4);
      EXPECT_EQ(base, pairs) << "document " << doc;
      const int64_t t = (c.lengths[doc] + 63) / 64;
      pairs += t * (t + 1) / 2;
    }
    const size_t tile_bytes = size_t(pairs) * size_t(c.n_head) * 64 * 64 * 2;
    ASSERT_LE(tiles_at + tile_bytes, ws.size());
    size_t unwritten = 0;
    for (size_t at = tiles_at; at < tiles_at + tile_bytes; at += 4) {
      uint32_t word;
      std::memcpy(&word, ws.data() + at, 4);
      unwritten += word == 0xffffffffu;
    }
    EXPECT_EQ(unwritten, 0u) << "of " << tile_bytes / 4 << " words";
    // With the first tiles in two spare regions (13 and 29 tiles, the rest
    // in a smaller workspace): the same products on the same tiles, so the
    // same bits.
    std::vector<unsigned char> small;
    const VarlenGrads split = device_backward(c, d, d_out, Bwd::kWsDs, 0xff, &small, {13, 29});
    EXPECT_EQ(small.size() + 42 * 8192, ws.size());
    EXPECT_EQ(testing::rel_error(split.dq, got.dq), 0.0);
    EXPECT_EQ(testing::rel_error(split.dk, got.dk), 0.0);
    EXPECT_EQ(testing::rel_error(split.dv, got.dv), 0.0);
  }
}

// The fused backward sums each d_q tile's shares across thread blocks in a
// fixed order, so it must give the same bits on every run whatever the
// buffers held before (the workspace's turn counters included): three runs
// over garbage-filled buffers, compared with memcmp, at training length
// with many key tiles per query tile, grouped heads, a window, documents of
// every remainder; and agree with the two-kernel backward (same arithmetic,
// another order of the fp32 sums for d_k and d_v, so a rare bf16 flip).
TEST(CudaAttention, FusedBackwardIsBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const VarlenCase cases[] = {{{2048, 1000, 130, 1}, 8, 2, 64, 0},
                              {{1500, 700, 65}, 8, 2, 128, 300},
                              {{1000, 3}, 4, 4, 32, 0}};
  for (const VarlenCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "d=" << c.head_dim << " window=" << c.window);
    VarlenData d = make_varlen(c, 6161 + uint32_t(c.head_dim));
    Bf16Input d_out = upload({d.n, c.n_head, c.head_dim}, 6166);
    const VarlenGrads mma = device_backward(c, d, d_out, Bwd::kMma);
    for (Bwd kind : {Bwd::kFused, Bwd::kFusedLoadStore}) {
      SCOPED_TRACE(bwd_name(kind));
      const VarlenGrads first = device_backward(c, d, d_out, kind, 0x00);
      EXPECT_LE(testing::rel_error(first.dq, mma.dq), 5e-3);
      EXPECT_LE(testing::rel_error(first.dk, mma.dk), 5e-3);
      EXPECT_LE(testing::rel_error(first.dv, mma.dv), 5e-3);
      for (unsigned char fill : {0xff, 0x5a}) {
        SCOPED_TRACE(::testing::Message() << "buffers filled with " << int(fill));
        const VarlenGrads again = device_backward(c, d, d_out, kind, fill);
        EXPECT_EQ(std::memcmp(again.dq.raw(), first.dq.raw(), size_t(first.dq.nbytes())), 0);
        EXPECT_EQ(std::memcmp(again.dk.raw(), first.dk.raw(), size_t(first.dk.nbytes())), 0);
        EXPECT_EQ(std::memcmp(again.dv.raw(), first.dv.raw(), size_t(first.dv.nbytes())), 0);
      }
    }
  }
}

// `out` with a row stride (the trainer keeps the attention output in a wider
// row, LoRA columns after it): every forward kernel writes bitwise the
// packed call's values into the first n_head·head_dim columns and leaves
// the rest alone; the backward reads it back with the stride (for
// D = rowsum(dO ⊙ O)) and gives bitwise the packed call's gradients.
TEST(CudaAttention, StridedOutputIsThePackedOne) {
  SKIP_WITHOUT_GPU();
  for (const VarlenCase& c : {VarlenCase{{100, 1, 37}, 8, 2, 128, 0}, VarlenCase{{90, 33}, 4, 2, 64, 20}}) {
    SCOPED_TRACE(::testing::Message() << "d=" << c.head_dim);
    VarlenData d = make_varlen(c, 7100 + c.head_dim);
    Bf16Input d_out = upload({d.n, c.n_head, c.head_dim}, 7177);
    const int64_t row = int64_t(c.n_head) * c.head_dim, ld = row + 136;
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    const auto* cu = static_cast<const int32_t*>(d.cu.data());
    for (const FwdKind& kind : kFwdKinds) {
      if (!fwd_runs(kind, c.head_dim)) continue;
      SCOPED_TRACE(kind.name);
      cuda::DeviceBuffer packed = device_zeros(size_t(d.n * row * 2));
      std::vector<uint16_t> pad(size_t(d.n * ld), f32_to_bf16(5.0f));
      cuda::DeviceBuffer wide = device_zeros(pad.size() * 2);
      ASSERT_TRUE(wide.copy_from_host(pad.data(), pad.size() * 2).is_ok());
      cuda::DeviceBuffer lse1 = device_zeros(size_t(d.n * c.n_head * 4)), lse2 = device_zeros(size_t(d.n * c.n_head * 4));
      cuda::AttentionVarlenFwdArgs f{.q = d.q.dev.data(), .k = d.k.dev.data(), .v = d.v.dev.data(),
                                     .out = packed.data(), .lse = static_cast<float*>(lse1.data()), .cu_seqlens = cu,
                                     .n_docs = int(c.lengths.size()), .max_seqlen = max_len(c), .n_tokens = int(d.n),
                                     .n_head = c.n_head, .n_head_kv = c.n_head_kv, .head_dim = c.head_dim,
                                     .window = c.window, .scale = scale};
      set_kind(f, kind);
      ASSERT_TRUE(cuda::attention_varlen_forward(f).is_ok());
      f.out = wide.data(), f.lse = static_cast<float*>(lse2.data()), f.ld_out = ld;
      ASSERT_TRUE(cuda::attention_varlen_forward(f).is_ok());
      std::vector<uint16_t> p(size_t(d.n * row)), w(pad.size());
      ASSERT_TRUE(packed.copy_to_host(p.data(), p.size() * 2).is_ok());
      ASSERT_TRUE(wide.copy_to_host(w.data(), w.size() * 2).is_ok());
      for (int64_t t = 0; t < d.n; ++t)
        for (int64_t j = 0; j < ld; ++j)
          ASSERT_EQ(w[size_t(t * ld + j)], j < row ? p[size_t(t * row + j)] : f32_to_bf16(5.0f)) << t << "," << j;
      EXPECT_EQ(testing::rel_error(download(lse2, DType::F32, {d.n, c.n_head}), download(lse1, DType::F32, {d.n, c.n_head})),
                0.0);
      // The backward from each.
      // The backward from each, by the default kernels (k < 2) and the fused one.
      Tensor grads[4][3];
      for (int k = 0; k < 4; ++k) {
        const bool strided = k % 2 == 1;
        const cuda::AttnBwdKernels kernels = k < 2 ? cuda::AttnBwdKernels::kAuto : cuda::AttnBwdKernels::kFused;
        const size_t q_bytes = size_t(d.n * row * 2), kv_bytes = size_t(d.n * c.n_head_kv * c.head_dim * 2);
        cuda::DeviceBuffer dq = device_zeros(q_bytes), dk = device_zeros(kv_bytes), dv = device_zeros(kv_bytes);
        cuda::DeviceBuffer ws =
            device_zeros(cuda::attention_varlen_backward_workspace_bytes(d.n, c.n_head, c.head_dim, kernels));
        cuda::AttentionVarlenBwdArgs b{.q = d.q.dev.data(), .k = d.k.dev.data(), .v = d.v.dev.data(),
                                       .out = strided ? wide.data() : packed.data(),
                                       .lse = static_cast<const float*>(lse1.data()), .d_out = d_out.dev.data(),
                                       .d_q = dq.data(), .d_k = dk.data(), .d_v = dv.data(), .cu_seqlens = cu,
                                       .workspace = ws.data(), .n_docs = int(c.lengths.size()),
                                       .max_seqlen = max_len(c), .n_tokens = int(d.n), .n_head = c.n_head,
                                       .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .window = c.window,
                                       .scale = scale, .kernels = kernels, .ld_out = strided ? ld : 0};
        Status st = cuda::attention_varlen_backward(b);
        ASSERT_TRUE(st.is_ok()) << st.message();
        grads[k][0] = download(dq, DType::BF16, {d.n, c.n_head, c.head_dim});
        grads[k][1] = download(dk, DType::BF16, {d.n, c.n_head_kv, c.head_dim});
        grads[k][2] = download(dv, DType::BF16, {d.n, c.n_head_kv, c.head_dim});
      }
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(testing::rel_error(grads[1][i], grads[0][i]), 0.0) << "gradient " << i;
        EXPECT_EQ(testing::rel_error(grads[3][i], grads[2][i]), 0.0) << "fused, gradient " << i;
      }
    }
  }
}

// The two wgmma products alone (cuda::attention_wgmma_check) against host
// sums: a fault in the shared-memory layout, its descriptors or the register
// fragments shows as wrong elements, the first few printed with their place.
size_t report_mismatches(const Tensor& got, const Tensor& want, int cols, const char* what) {
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  float max_ref = 0.f;
  for (int64_t i = 0; i < want.numel(); ++i) max_ref = std::max(max_ref, std::abs(w[i]));
  size_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (!(std::abs(g[i] - w[i]) <= 1e-4f * max_ref)) {
      if (++bad <= 6)
        ADD_FAILURE() << what << " [" << i / cols << ", " << i % cols << "]: got " << g[i] << ", want " << w[i];
    }
  }
  return bad;
}

TEST(CudaAttention, WgmmaProductsMatchHost) {
  SKIP_WITHOUT_GPU();
  for (int d : {64, 128}) {
    if (!wgmma_runs(d)) continue;
    SCOPED_TRACE(::testing::Message() << "d=" << d);
    Bf16Input a = upload({64, d}, 7000 + uint32_t(d)), b = upload({64, d}, 7001 + uint32_t(d));
    cuda::DeviceBuffer s = device_zeros(2 * 64 * 64 * 4), o = device_zeros(size_t(64 * d * 4));
    cuda::DeviceBuffer sr = device_zeros(64 * 64 * 4);
    Status st = cuda::attention_wgmma_check({a.dev.data(), b.dev.data(), static_cast<float*>(s.data()),
                                             static_cast<float*>(o.data()), d, nullptr,
                                             static_cast<float*>(sr.data())});
    ASSERT_TRUE(st.is_ok()) << st.message();
    Tensor got_s = download(s, DType::F32, {2, 64, 64}), got_o = download(o, DType::F32, {64, d});
    const float* pa = a.host.data<float>();
    const float* pb = b.host.data<float>();
    Tensor want_s = Tensor::zeros(DType::F32, {2, 64, 64}), want_o = Tensor::zeros(DType::F32, {64, d});
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        double ab = 0, ba = 0;
        for (int k = 0; k < d; ++k) {
          ab += double(pa[i * d + k]) * pb[j * d + k];
          ba += double(pb[i * d + k]) * pa[j * d + k];
        }
        want_s.data<float>()[i * 64 + j] = float(ab);
        want_s.data<float>()[4096 + i * 64 + j] = float(ba);
      }
    for (int i = 0; i < 64; ++i)  // o from the device's own s, rounded to bf16 as the kernel does
      for (int n = 0; n < d; ++n) {
        double acc = 0;
        for (int j = 0; j < 64; ++j)
          acc += double(bf16_to_f32(f32_to_bf16(got_s.data<float>()[i * 64 + j]))) * pb[j * d + n];
        want_o.data<float>()[i * d + n] = float(acc);
      }
    EXPECT_EQ(report_mismatches(got_s, want_s, 64, "A·Bᵀ then B·Aᵀ (rows 64..127)"), 0u);
    EXPECT_EQ(report_mismatches(got_o, want_o, d, "bf16(A·Bᵀ)·B"), 0u);
    Tensor got_sr = download(sr, DType::F32, {64, 64}), want_sr = Tensor::zeros(DType::F32, {64, 64});
    std::memcpy(want_sr.data<float>(), want_s.data<float>(), 64 * 64 * sizeof(float));
    EXPECT_EQ(report_mismatches(got_sr, want_sr, 64, "A·Bᵀ, A from registers"), 0u);
  }
}

struct DecodeCase {
  int n, pos0, n_head, n_head_kv, head_dim, window;
};

const DecodeCase kDecodeCases[] = {
    {1, 0, 8, 2, 64, 0},      // first token: one key
    {1, 300, 8, 2, 128, 0},   // three splits
    {1, 5000, 8, 2, 64, 0},   // many splits
    {1, 1000, 4, 1, 128, 100},  // window shorter than the context
    {5, 130, 4, 2, 64, 0},    // prefill through the tensor-core kernel
    {70, 10, 8, 2, 128, 33},  // prefill longer than a tile, with a window
    {300, 77, 4, 2, 64, 0},   // prefill over several 128-key tiles and 192-row blocks
    {1, 200, 4, 4, 32, 0},    // head_dim 32: one token, two splits
    {12, 90, 4, 4, 32, 0},    // head_dim 32 prefill
};

TEST(CudaAttention, DecodeMatchesReference) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1300;
  for (const DecodeCase& c : kDecodeCases) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " pos0=" << c.pos0 << " heads=" << c.n_head << "/"
                                      << c.n_head_kv << " d=" << c.head_dim << " window=" << c.window);
    const int64_t n_ctx = c.pos0 + c.n + 3;  // spare cache rows must be ignored
    Bf16Input q = upload({c.n, c.n_head, c.head_dim}, seed++);
    Bf16Input k = upload({n_ctx, c.n_head_kv, c.head_dim}, seed++);
    Bf16Input v = upload({n_ctx, c.n_head_kv, c.head_dim}, seed++);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    Tensor want = Tensor::zeros(DType::F32, {c.n, c.n_head, c.head_dim});
    Tensor want_lse = Tensor::zeros(DType::F32, {c.n, c.n_head});
    AttentionArgs r{.q = q.host, .k = k.host, .v = v.host, .out = want, .lse = want_lse, .pos0 = c.pos0,
                    .window = c.window, .scale = scale};
    ref::attention_forward(r);
    // Prefill also through the warp-specialized kernel where it runs.
    for (auto kernels : {cuda::AttnFwdKernels::kAuto, cuda::AttnFwdKernels::kWs}) {
      if (kernels == cuda::AttnFwdKernels::kWs && (c.n == 1 || !wgmma_runs(c.head_dim))) continue;
      SCOPED_TRACE(kernels == cuda::AttnFwdKernels::kWs ? "warp-specialized prefill" : "default kernels");
      cuda::DeviceBuffer out = device_zeros(size_t(c.n * c.n_head * c.head_dim * 2));
      cuda::DeviceBuffer lse = device_zeros(size_t(c.n * c.n_head * 4));
      cuda::DeviceBuffer ws = device_zeros(cuda::attention_decode_workspace_bytes(c.n, c.n_head, c.head_dim));
      cuda::AttentionDecodeArgs a{q.dev.data(), k.dev.data(), v.dev.data(), out.data(),
                                  static_cast<float*>(lse.data()), ws.data(), c.n, int(n_ctx), c.n_head, c.n_head_kv,
                                  c.head_dim, c.pos0, c.window, scale, nullptr, kernels};
      Status st = cuda::attention_decode(a);
      ASSERT_TRUE(st.is_ok()) << st.message();
      EXPECT_LE(testing::rel_error(download(out, DType::BF16, {c.n, c.n_head, c.head_dim}), want), 1e-2);
      EXPECT_LE(testing::rel_error(download(lse, DType::F32, {c.n, c.n_head}), want_lse), 1e-3);
    }
  }
}

// A batch of sequences, each with its own cache and position, in one launch.
TEST(CudaAttention, DecodeBatchMatchesReference) {
  SKIP_WITHOUT_GPU();
  const int n_head = 8, n_head_kv = 2, d = 128;
  const std::vector<int32_t> pos{0, 77, 700, 5};
  const int n = int(pos.size()), max_ctx = 701;
  const float scale = 1.0f / std::sqrt(float(d));
  for (int window : {0, 50}) {
    SCOPED_TRACE(::testing::Message() << "window=" << window);
    uint32_t seed = 1700 + uint32_t(window);
    Bf16Input q = upload({n, n_head, d}, seed++);
    std::vector<Bf16Input> k, v;
    std::vector<const void*> k_ptrs, v_ptrs;
    for (int s = 0; s < n; ++s) {
      k.push_back(upload({pos[size_t(s)] + 2, n_head_kv, d}, seed++));
      v.push_back(upload({pos[size_t(s)] + 2, n_head_kv, d}, seed++));
      k_ptrs.push_back(k.back().dev.data());
      v_ptrs.push_back(v.back().dev.data());
    }
    cuda::DeviceBuffer k_dev = device_zeros(k_ptrs.size() * sizeof(void*));
    cuda::DeviceBuffer v_dev = device_zeros(v_ptrs.size() * sizeof(void*));
    cuda::DeviceBuffer pos_dev = device_zeros(pos.size() * sizeof(int32_t));
    ASSERT_TRUE(k_dev.copy_from_host(k_ptrs.data(), k_ptrs.size() * sizeof(void*)).is_ok());
    ASSERT_TRUE(v_dev.copy_from_host(v_ptrs.data(), v_ptrs.size() * sizeof(void*)).is_ok());
    ASSERT_TRUE(pos_dev.copy_from_host(pos.data(), pos.size() * sizeof(int32_t)).is_ok());
    cuda::DeviceBuffer out = device_zeros(size_t(n * n_head * d * 2)), lse = device_zeros(size_t(n * n_head * 4));
    cuda::DeviceBuffer ws = device_zeros(cuda::attention_decode_workspace_bytes(n, n_head, d));
    cuda::AttentionDecodeBatchArgs a{q.dev.data(),
                                     static_cast<const void* const*>(k_dev.data()),
                                     static_cast<const void* const*>(v_dev.data()),
                                     static_cast<const int32_t*>(pos_dev.data()),
                                     out.data(),
                                     static_cast<float*>(lse.data()),
                                     ws.data(),
                                     n,
                                     max_ctx,
                                     n_head,
                                     n_head_kv,
                                     d,
                                     window,
                                     scale,
                                     nullptr};
    Status st = cuda::attention_decode_batch(a);
    ASSERT_TRUE(st.is_ok()) << st.message();
    Tensor got = download(out, DType::BF16, {n, n_head, d});
    Tensor got_lse = download(lse, DType::F32, {n, n_head});
    Tensor want = Tensor::zeros(DType::F32, {n, n_head, d}), want_lse = Tensor::zeros(DType::F32, {n, n_head});
    for (int s = 0; s < n; ++s) {
      AttentionArgs r{.q = q.host.view().slice_rows(s, s + 1), .k = k[size_t(s)].host, .v = v[size_t(s)].host,
                      .out = want.view().slice_rows(s, s + 1), .lse = want_lse.view().slice_rows(s, s + 1),
                      .pos0 = pos[size_t(s)], .window = window, .scale = scale};
      ref::attention_forward(r);
    }
    EXPECT_LE(testing::rel_error(got, want), 1e-2);
    EXPECT_LE(testing::rel_error(got_lse, want_lse), 1e-3);
  }
}

// Refusals come before any device work, so they hold in every build.
TEST(CudaAttention, RejectsUncompiledHeadDimAndBadGroups) {
  cuda::AttentionVarlenFwdArgs f;
  f.n_tokens = 4, f.n_docs = 1, f.max_seqlen = 4, f.n_head = 4, f.n_head_kv = 2, f.head_dim = 96;
  EXPECT_FALSE(cuda::attention_varlen_forward(f).is_ok());
  f.head_dim = 64, f.n_head_kv = 3;
  EXPECT_FALSE(cuda::attention_varlen_forward(f).is_ok());
  f.n_head_kv = 2, f.warp_rows = 24;
  EXPECT_FALSE(cuda::attention_varlen_forward(f).is_ok());
  // The warp-specialized kernel's shapes: 192 rows only at head_dim 64, 64 or 128 keys.
  f.warp_rows = 0, f.head_dim = 128, f.ws_rows = 192;
  Status st = cuda::attention_varlen_forward(f);
  EXPECT_FALSE(st.is_ok());
#ifdef LATHE_HAVE_CUDA
  EXPECT_NE(st.message().find("ws_rows 192"), std::string::npos) << st.message();
#endif
  f.ws_rows = 0, f.ws_keys = 96;
  st = cuda::attention_varlen_forward(f);
  EXPECT_FALSE(st.is_ok());
#ifdef LATHE_HAVE_CUDA
  EXPECT_NE(st.message().find("ws_keys 96"), std::string::npos) << st.message();
#endif
  cuda::AttentionDecodeArgs d;
  d.n_tokens = 1, d.n_ctx = 4, d.pos0 = 4, d.n_head = 2, d.n_head_kv = 1, d.head_dim = 64;
  EXPECT_FALSE(cuda::attention_decode(d).is_ok());  // pos0 + n_tokens > n_ctx
  cuda::AttentionVarlenBwdArgs b;
  b.n_tokens = 4, b.n_docs = 1, b.max_seqlen = 4, b.n_head = 4, b.n_head_kv = 2, b.head_dim = 80;
  EXPECT_FALSE(cuda::attention_varlen_backward(b).is_ok());
}

}  // namespace
}  // namespace lathe
