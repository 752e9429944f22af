// Backward passes. Two checks per op:
//  - the CPU backward against the reference backward (f32 views);
//  - the reference backward against central finite differences of the
//    reference forward, everything in f64 (so the oracle itself is checked).
// Attention is the packed varlen kind; the fused LM head + cross-entropy is
// checked with more rows than one chunk, ignored rows and a trained head.
#include <gtest/gtest.h>

#include <functional>
#include <algorithm>
#include <iterator>
#include <numeric>

#include "backends/cpu/cpu_ops.h"
#include "ops/op_test_util.h"
#include "ops/reference/reference.h"

namespace lathe {
namespace {

Tensor f64(const Tensor& t) {
  Tensor out = Tensor::empty(DType::F64, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<double>()[i] = t.data<float>()[i];
  return out;
}
Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.dtype(), t.shape()); }
Tensor i32(std::vector<int32_t> v) {
  Tensor t = Tensor::empty(DType::I32, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

// Central differences of loss() with respect to each element of x (f64,
// perturbed in place) against grad: max |fd − grad| / max |grad|.
double fd_error(const Tensor& x, const Tensor& grad, const std::function<double()>& loss) {
  const double h = 1e-5;
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& xi = x.data<double>()[i];
    const double keep = xi;
    xi = keep + h;
    const double up = loss();
    xi = keep - h;
    const double down = loss();
    xi = keep;
    max_diff = std::max(max_diff, std::abs((up - down) / (2 * h) - grad.data<double>()[i]));
    max_ref = std::max(max_ref, std::abs(grad.data<double>()[i]));
  }
  return max_diff / std::max(max_ref, 1e-30);
}
constexpr double kFdTol = 1e-7;

TEST(LinearBackward, MatchesReference) {
  uint32_t seed = 10;
  for (auto [n, in, out] : {std::tuple{1, 8, 5}, {7, 33, 20}, {70, 64, 130}}) {
    Tensor x = testing::random_tensor(DType::F32, {n, in}, seed++), w = testing::random_tensor(DType::F32, {out, in}, seed++);
    Tensor dy = testing::random_tensor(DType::F32, {n, out}, seed++);
    Tensor dx = testing::random_tensor(DType::F32, {n, in}, seed++), dw = testing::random_tensor(DType::F32, {out, in}, seed++);
    Tensor db = testing::random_tensor(DType::F32, {out}, seed++);
    Tensor dx_ref = dx.clone(), dw_ref = dw.clone(), db_ref = db.clone();
    LinearBackwardArgs args{.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw, .db = db, .accumulate_dx = true};
    ASSERT_TRUE(cpu::linear_backward(args).is_ok());
    args.dx = dx_ref, args.dw = dw_ref, args.db = db_ref;
    ref::linear_backward(args);
    EXPECT_LE(testing::rel_error(dx, dx_ref), 1e-5);
    EXPECT_LE(testing::rel_error(dw, dw_ref), 1e-5);
    EXPECT_LE(testing::rel_error(db, db_ref), 1e-5);
  }
}

TEST(LinearBackward, ReferenceMatchesFiniteDifferences) {
  Tensor x = f64(testing::random_tensor(DType::F32, {3, 5}, 1)), w = f64(testing::random_tensor(DType::F32, {4, 5}, 2));
  Tensor b = f64(testing::random_tensor(DType::F32, {4}, 3)), r = f64(testing::random_tensor(DType::F32, {3, 4}, 4));
  Tensor y = Tensor::zeros(DType::F64, {3, 4});
  auto loss = [&] {
    ref::linear_forward({.x = x, .w = w, .bias = b, .y = y});
    return dot(y, r);
  };
  Tensor dx = zeros_like(x), dw = zeros_like(w), db = zeros_like(b);
  ref::linear_backward({.x = x, .w = w, .dy = r, .dx = dx, .dw = dw, .db = db});
  EXPECT_LE(fd_error(x, dx, loss), kFdTol);
  EXPECT_LE(fd_error(w, dw, loss), kFdTol);
  EXPECT_LE(fd_error(b, db, loss), kFdTol);
}

TEST(RmsNormBackward, MatchesReferenceAliasedAndAccumulating) {
  uint32_t seed = 20;
  for (auto [rows, dim] : {std::pair{1, 64}, {9, 33}, {130, 16}}) {
    Tensor x = testing::random_tensor(DType::F32, {rows, dim}, seed++, 3.0f);
    Tensor w = testing::random_tensor(DType::F32, {dim}, seed++);
    Tensor y = Tensor::zeros(DType::F32, {rows, dim}), rstd = Tensor::zeros(DType::F32, {rows});
    ASSERT_TRUE(cpu::rms_norm_forward({.x = x, .w = w, .y = y, .rstd = rstd, .eps = 1e-5f}).is_ok());
    Tensor dy = testing::random_tensor(DType::F32, {rows, dim}, seed++);
    Tensor dx = testing::random_tensor(DType::F32, {rows, dim}, seed++), dx_ref = dx.clone();
    Tensor dw = testing::random_tensor(DType::F32, {dim}, seed++), dw_ref = dw.clone();
    RmsNormBackwardArgs args{.x = x, .w = w, .rstd = rstd, .dy = dy, .dx = dx, .dw = dw, .accumulate = true};
    ASSERT_TRUE(cpu::rms_norm_backward(args).is_ok());
    args.dx = dx_ref, args.dw = dw_ref;
    ref::rms_norm_backward(args);
    EXPECT_LE(testing::rel_error(dx, dx_ref), 1e-5);
    EXPECT_LE(testing::rel_error(dw, dw_ref), 1e-5);
    // dx written over dy.
    Tensor g = dy.clone(), g_ref = Tensor::zeros(DType::F32, {rows, dim});
    ASSERT_TRUE(cpu::rms_norm_backward({.x = x, .w = w, .rstd = rstd, .dy = g, .dx = g}).is_ok());
    ref::rms_norm_backward({.x = x, .w = w, .rstd = rstd, .dy = dy, .dx = g_ref});
    EXPECT_LE(testing::rel_error(g, g_ref), 1e-5);
  }
  Tensor x = Tensor::zeros(DType::F32, {2, 4}), w = Tensor::zeros(DType::F32, {4}), s = Tensor::zeros(DType::F32, {2});
  Status bad = cpu::rms_norm_backward({.x = x, .w = w, .rstd = s, .dy = x, .dx = x, .accumulate = true});
  EXPECT_NE(bad.message().find("rms_norm_backward: dx overlaps"), std::string::npos) << bad.message();
}

// vector_sums (bf16-mixed): the same exact terms summed in 16 double
// lanes: rstd, y, dx agree with the sequential sums to f32 rounding.
TEST(RmsNormBackward, VectorSumsAgreeWithSequentialOnes) {
  uint32_t seed = 90;
  for (auto [rows, dim] : {std::pair{3, 512}, {17, 40}, {5, 7}}) {
    Tensor x = testing::random_tensor(DType::F32, {rows, dim}, seed++, 3.0f);
    Tensor w = testing::random_tensor(DType::F32, {dim}, seed++), dy = testing::random_tensor(DType::F32, {rows, dim}, seed++);
    Tensor y[2], rstd[2], dx[2];
    for (int v = 0; v < 2; ++v) {
      y[v] = Tensor::zeros(DType::F32, {rows, dim}), rstd[v] = Tensor::zeros(DType::F32, {rows});
      dx[v] = Tensor::zeros(DType::F32, {rows, dim});
      ASSERT_TRUE(cpu::rms_norm_forward({.x = x, .w = w, .y = y[v], .rstd = rstd[v], .eps = 1e-5f, .vector_sums = v == 1})
                      .is_ok());
      ASSERT_TRUE(cpu::rms_norm_backward({.x = x, .w = w, .rstd = rstd[v], .dy = dy, .dx = dx[v], .vector_sums = v == 1})
                      .is_ok());
    }
    EXPECT_LE(testing::rel_error(rstd[1], rstd[0]), 1e-7);
    EXPECT_LE(testing::rel_error(y[1], y[0]), 1e-7);
    EXPECT_LE(testing::rel_error(dx[1], dx[0]), 1e-6);
  }
}

TEST(RmsNormBackward, ReferenceMatchesFiniteDifferences) {
  Tensor x = f64(testing::random_tensor(DType::F32, {3, 6}, 5, 2.0f)), w = f64(testing::random_tensor(DType::F32, {6}, 6));
  Tensor r = f64(testing::random_tensor(DType::F32, {3, 6}, 7));
  Tensor y = zeros_like(x), rstd = Tensor::zeros(DType::F64, {3});
  auto loss = [&] {
    ref::rms_norm_forward({.x = x, .w = w, .y = y, .rstd = rstd, .eps = 1e-5f});
    return dot(y, r);
  };
  loss();
  Tensor dx = zeros_like(x), dw = zeros_like(w);
  ref::rms_norm_backward({.x = x, .w = w, .rstd = rstd, .dy = r, .dx = dx, .dw = dw});
  EXPECT_LE(fd_error(x, dx, loss), kFdTol);
  EXPECT_LE(fd_error(w, dw, loss), kFdTol);
}

TEST(SwigluBackward, MatchesReferenceAndFiniteDifferences) {
  Tensor g = testing::random_tensor(DType::F32, {9, 50}, 30, 4.0f), u = testing::random_tensor(DType::F32, {9, 50}, 31);
  Tensor d = testing::random_tensor(DType::F32, {9, 50}, 32);
  const float extremes[] = {-100.0f, -88.0f, -30.0f, -0.0f, 0.0f, 30.0f, 88.0f, 100.0f};
  std::copy(std::begin(extremes), std::end(extremes), g.data<float>() + 17);
  Tensor dg = zeros_like(g), du = zeros_like(g), dg_ref = zeros_like(g), du_ref = zeros_like(g);
  ref::swiglu_backward({.gate = g, .up = u, .d_out = d, .d_gate = dg_ref, .d_up = du_ref});
  for (bool portable : {true, false}) {  // the vector path (where there is one) last: it runs in place below
    cpu::set_portable_only(portable);
    ASSERT_TRUE(cpu::swiglu_backward({.gate = g, .up = u, .d_out = d, .d_gate = dg, .d_up = du}).is_ok());
    EXPECT_LE(testing::rel_error(dg, dg_ref), 1e-5) << (portable ? "portable" : "vector");
    EXPECT_LE(testing::rel_error(du, du_ref), 1e-5) << (portable ? "portable" : "vector");
  }
  cpu::set_portable_only(false);
  // In place over gate and up.
  Tensor g2 = g.clone(), u2 = u.clone();
  ASSERT_TRUE(cpu::swiglu_backward({.gate = g2, .up = u2, .d_out = d, .d_gate = g2, .d_up = u2}).is_ok());
  EXPECT_LE(testing::rel_error(g2, dg_ref), 1e-5);
  EXPECT_LE(testing::rel_error(u2, du_ref), 1e-5);

  Tensor gx = f64(g.reshape({3, 150}).clone()), ux = f64(u.reshape({3, 150}).clone());
  Tensor r = f64(d.reshape({3, 150}).clone()), out = zeros_like(gx);
  auto loss = [&] {
    ref::swiglu_forward({.gate = gx, .up = ux, .out = out});
    return dot(out, r);
  };
  Tensor dgx = zeros_like(gx), dux = zeros_like(gx);
  ref::swiglu_backward({.gate = gx, .up = ux, .d_out = r, .d_gate = dgx, .d_up = dux});
  EXPECT_LE(fd_error(gx, dgx, loss), kFdTol);
  EXPECT_LE(fd_error(ux, dux, loss), kFdTol);
}

TEST(EmbeddingBackward, MatchesReferenceAndFiniteDifferences) {
  Tensor ids = i32({3, 0, 3, 5, 1, 3});
  Tensor d = testing::random_tensor(DType::F32, {6, 70}, 40);
  Tensor dt = testing::random_tensor(DType::F32, {7, 70}, 41), dt_ref = dt.clone();
  ASSERT_TRUE(cpu::embedding_backward({.tokens = ids, .d_out = d, .d_table = dt}).is_ok());
  ref::embedding_backward({.tokens = ids, .d_out = d, .d_table = dt_ref});
  EXPECT_LE(testing::rel_error(dt, dt_ref), 1e-6);
  Status bad = cpu::embedding_backward({.tokens = i32({0, 0, 0, 0, 0, 9}), .d_out = d, .d_table = dt});
  EXPECT_NE(bad.message().find("token id 9 at index 5"), std::string::npos) << bad.message();

  Tensor table = f64(testing::random_tensor(DType::F32, {7, 4}, 42)), r = f64(testing::random_tensor(DType::F32, {6, 4}, 43));
  Tensor out = Tensor::zeros(DType::F64, {6, 4});
  auto loss = [&] {
    ref::embedding_forward({.tokens = ids, .table = table, .out = out});
    return dot(out, r);
  };
  Tensor grad = zeros_like(table);
  ref::embedding_backward({.tokens = ids, .d_out = r, .d_table = grad});
  EXPECT_LE(fd_error(table, grad, loss), kFdTol);
}

TEST(RopeBackward, InverseRotationMatchesFiniteDifferences) {
  // Llama 3 scaled frequencies, positions restarting per document.
  auto inv = rope_inv_freq({.theta = 500000.0f, .type = "llama3", .factor = 8.0f, .original_max_position_embeddings = 16}, 8);
  ASSERT_TRUE(inv.is_ok());
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1};
  Tensor c = Tensor::empty(DType::F64, {5, 4}), s = c.clone();
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t i = 0; i < 4; ++i) {
      c.data<double>()[t * 4 + i] = std::cos(double(pos[size_t(t)]) * (*inv)[size_t(i)]);
      s.data<double>()[t * 4 + i] = std::sin(double(pos[size_t(t)]) * (*inv)[size_t(i)]);
    }
  Tensor x = f64(testing::random_tensor(DType::F32, {5, 2, 8}, 50)), r = f64(testing::random_tensor(DType::F32, {5, 2, 8}, 51));
  auto loss = [&] {
    Tensor y = x.clone();
    ref::rope_forward({.x = y, .cos = c, .sin = s});
    return dot(y, r);
  };
  Tensor grad = r.clone();
  ref::rope_forward({.x = grad, .cos = c, .sin = s, .inverse = true});
  EXPECT_LE(fd_error(x, grad, loss), kFdTol);
}

struct VarlenCase {
  std::vector<int32_t> cu;
  int64_t n_head, n_head_kv, head_dim;
  int window;
};

TEST(AttentionVarlen, ForwardAndBackwardMatchReference) {
  const VarlenCase cases[] = {{{0, 5}, 2, 1, 8, 0},          {{0, 3, 3, 10, 11}, 4, 2, 16, 0},
                              {{0, 70, 150}, 4, 2, 8, 0},    {{0, 20, 90}, 4, 4, 12, 7},
                              {{0, 130}, 6, 2, 4, 0}};
  uint32_t seed = 60;
  for (const VarlenCase& c : cases) {
    const int64_t n = c.cu.back();
    SCOPED_TRACE(::testing::Message() << "n=" << n << " heads=" << c.n_head << "/" << c.n_head_kv << " window=" << c.window);
    Tensor q = testing::random_tensor(DType::F32, {n, c.n_head, c.head_dim}, seed++);
    Tensor k = testing::random_tensor(DType::F32, {n, c.n_head_kv, c.head_dim}, seed++);
    Tensor v = testing::random_tensor(DType::F32, {n, c.n_head_kv, c.head_dim}, seed++);
    Tensor d_out = testing::random_tensor(DType::F32, {n, c.n_head, c.head_dim}, seed++);
    Tensor cu = i32(c.cu);
    int64_t longest = 0;
    for (size_t d = 0; d + 1 < c.cu.size(); ++d) longest = std::max<int64_t>(longest, c.cu[d + 1] - c.cu[d]);
    Tensor ws = Tensor::empty(DType::F32, {attention_varlen_workspace_floats(longest, 4)});
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    Tensor out = zeros_like(q), lse = Tensor::zeros(DType::F32, {n, c.n_head}), out_ref = out.clone(), lse_ref = lse.clone();
    AttentionVarlenArgs fa{.q = q, .k = k, .v = v, .out = out, .lse = lse, .cu_seqlens = cu, .workspace = ws,
                           .window = c.window, .scale = scale};
    ASSERT_TRUE(cpu::attention_varlen_forward(fa).is_ok());
    fa.out = out_ref, fa.lse = lse_ref;
    ref::attention_varlen_forward(fa);
    EXPECT_LE(testing::rel_error(out, out_ref), 1e-5);
    EXPECT_LE(testing::rel_error(lse, lse_ref), 1e-5);
    Tensor dq = testing::random_tensor(DType::F32, q.shape(), seed++), dk = testing::random_tensor(DType::F32, k.shape(), seed++);
    Tensor dv = testing::random_tensor(DType::F32, k.shape(), seed++);  // overwritten, not accumulated
    Tensor dq_ref = zeros_like(q), dk_ref = zeros_like(k), dv_ref = zeros_like(k);
    AttentionVarlenBackwardArgs ba{.q = q, .k = k, .v = v, .out = out, .lse = lse, .cu_seqlens = cu, .d_out = d_out,
                                   .d_q = dq, .d_k = dk, .d_v = dv, .workspace = ws, .window = c.window, .scale = scale};
    ASSERT_TRUE(cpu::attention_varlen_backward(ba).is_ok());
    ba.d_q = dq_ref, ba.d_k = dk_ref, ba.d_v = dv_ref;
    ref::attention_varlen_backward(ba);
    EXPECT_LE(testing::rel_error(dq, dq_ref), 1e-5);
    EXPECT_LE(testing::rel_error(dk, dk_ref), 1e-5);
    EXPECT_LE(testing::rel_error(dv, dv_ref), 1e-5);
  }
}

TEST(AttentionVarlen, DocumentsDoNotSeeEachOther) {
  // The second document's outputs are those of running it alone.
  Tensor q = testing::random_tensor(DType::F32, {9, 2, 8}, 70), k = testing::random_tensor(DType::F32, {9, 1, 8}, 71);
  Tensor v = testing::random_tensor(DType::F32, {9, 1, 8}, 72);
  Tensor ws = Tensor::empty(DType::F32, {attention_varlen_workspace_floats(9, 4)});
  Tensor out = zeros_like(q), lse = Tensor::zeros(DType::F32, {9, 2});
  ASSERT_TRUE(cpu::attention_varlen_forward({.q = q, .k = k, .v = v, .out = out, .lse = lse, .cu_seqlens = i32({0, 4, 9}),
                                             .workspace = ws, .scale = 0.3f}).is_ok());
  TensorView q2 = q.view().slice_rows(4, 9), k2 = k.view().slice_rows(4, 9), v2 = v.view().slice_rows(4, 9);
  Tensor out2 = Tensor::zeros(DType::F32, {5, 2, 8}), lse2 = Tensor::zeros(DType::F32, {5, 2});
  ASSERT_TRUE(cpu::attention_varlen_forward({.q = q2, .k = k2, .v = v2, .out = out2, .lse = lse2,
                                             .cu_seqlens = i32({0, 5}), .workspace = ws, .scale = 0.3f}).is_ok());
  EXPECT_EQ(testing::rel_error(out.view().slice_rows(4, 9), out2), 0.0);
  Status bad = cpu::attention_varlen_forward({.q = q, .k = k, .v = v, .out = out, .lse = lse, .cu_seqlens = i32({0, 4, 8}),
                                              .workspace = ws, .scale = 0.3f});
  EXPECT_NE(bad.message().find("attention_varlen: cu_seqlens"), std::string::npos) << bad.message();
}

TEST(AttentionVarlen, ReferenceMatchesFiniteDifferences) {
  for (int window : {0, 3}) {
    Tensor q = f64(testing::random_tensor(DType::F32, {8, 4, 4}, 80)), k = f64(testing::random_tensor(DType::F32, {8, 2, 4}, 81));
    Tensor v = f64(testing::random_tensor(DType::F32, {8, 2, 4}, 82)), r = f64(testing::random_tensor(DType::F32, {8, 4, 4}, 83));
    Tensor cu = i32({0, 3, 3, 8});
    Tensor out = zeros_like(q), lse = Tensor::zeros(DType::F64, {8, 4});
    AttentionVarlenArgs fa{.q = q, .k = k, .v = v, .out = out, .lse = lse, .cu_seqlens = cu, .window = window, .scale = 0.7f};
    auto loss = [&] {
      ref::attention_varlen_forward(fa);
      return dot(out, r);
    };
    loss();
    Tensor dq = zeros_like(q), dk = zeros_like(k), dv = zeros_like(v);
    ref::attention_varlen_backward({.q = q, .k = k, .v = v, .out = out, .lse = lse, .cu_seqlens = cu, .d_out = r,
                                    .d_q = dq, .d_k = dk, .d_v = dv, .window = window, .scale = 0.7f});
    EXPECT_LE(fd_error(q, dq, loss), kFdTol);
    EXPECT_LE(fd_error(k, dk, loss), kFdTol);
    EXPECT_LE(fd_error(v, dv, loss), kFdTol);
  }
}

TEST(CrossEntropy, ChunkedMatchesReference) {
  const int64_t n = 37, dim = 24, vocab = 300;
  Tensor h = testing::random_tensor(DType::F32, {n, dim}, 90), w = testing::random_tensor(DType::F32, {vocab, dim}, 91, 0.3f);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = i % 4 == 1 ? kCrossEntropyIgnore : int32_t((i * 37) % vocab);
  Tensor targets = i32(t);
  for (int64_t chunk : {int64_t(5), int64_t(0)}) {
    Tensor ws = Tensor::empty(DType::F32, {cross_entropy_workspace_floats(vocab, dim, chunk ? chunk : cross_entropy_chunk_rows(vocab))});
    Tensor dh = testing::random_tensor(DType::F32, {n, dim}, 92), dw = testing::random_tensor(DType::F32, {vocab, dim}, 93);
    Tensor dh_ref = dh.clone(), dw_ref = dw.clone();
    CrossEntropyArgs args{.hidden = h, .w = w, .targets = targets, .d_hidden = dh, .d_w = dw, .workspace = ws,
                          .chunk_rows = chunk, .grad_scale = 0.1f};
    auto got = cpu::cross_entropy(args);
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    args.d_hidden = dh_ref, args.d_w = dw_ref;
    CrossEntropyStats want = ref::cross_entropy(args);
    EXPECT_EQ(got->n_valid, want.n_valid);
    EXPECT_NEAR(got->loss_sum, want.loss_sum, 1e-5 * std::abs(want.loss_sum));
    EXPECT_LE(testing::rel_error(dh, dh_ref), 1e-5);
    EXPECT_LE(testing::rel_error(dw, dw_ref), 1e-5);
  }
  Tensor ws = Tensor::empty(DType::F32, {cross_entropy_workspace_floats(vocab, dim, cross_entropy_chunk_rows(vocab))});
  t[3] = vocab;
  Status bad = cpu::cross_entropy({.hidden = h, .w = w, .targets = i32(t), .workspace = ws}).status();
  EXPECT_NE(bad.message().find("cross_entropy: target 300 at row 3"), std::string::npos) << bad.message();
}

TEST(CrossEntropy, ReferenceMatchesFiniteDifferences) {
  Tensor h = f64(testing::random_tensor(DType::F32, {4, 5}, 94)), w = f64(testing::random_tensor(DType::F32, {7, 5}, 95));
  Tensor targets = i32({2, kCrossEntropyIgnore, 6, 0});
  CrossEntropyArgs args{.hidden = h, .w = w, .targets = targets, .grad_scale = 0.5f};
  auto loss = [&] { return 0.5 * ref::cross_entropy(args).loss_sum; };
  Tensor dh = zeros_like(h), dw = zeros_like(w);
  args.d_hidden = dh, args.d_w = dw;
  ref::cross_entropy(args);
  args.d_hidden = {}, args.d_w = {};
  EXPECT_LE(fd_error(h, dh, loss), kFdTol);
  EXPECT_LE(fd_error(w, dw, loss), kFdTol);
}

}  // namespace
}  // namespace lathe
