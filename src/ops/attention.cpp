// Validation of the attention op contract (src/ops/attention.h).
#include "ops/attention.h"

#include <algorithm>
#include <tuple>

#include "ops/arg_checks.h"

namespace lathe {
using namespace ops_detail;

int64_t attention_workspace_floats(int64_t n_ctx, int n_threads) { return n_ctx * (n_threads > 0 ? n_threads : 1); }

Status validate(const AttentionArgs& a) {
  const char* op = "attention";
  LATHE_TRY(check_rank(op, "q", a.q, 3));
  LATHE_TRY(check_rank(op, "k", a.k, 3));
  for (auto [name, v] : {std::pair{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}})
    LATHE_TRY(check_dtype(op, name, *v, DType::F32));
  int64_t n = a.q.shape[0], n_head = a.q.shape[1], head_dim = a.q.shape[2];
  int64_t n_ctx = a.k.shape[0], n_head_kv = a.k.shape[1];
  if (a.k.shape[2] != head_dim)
    return invalid_argument("attention: k has shape ", a.k.shape.str(), ", head_dim differs from q's ", head_dim);
  if (n_head_kv <= 0 || n_head % n_head_kv != 0)
    return invalid_argument("attention: ", n_head, " query heads are not a multiple of ", n_head_kv, " kv heads");
  LATHE_TRY(check_shape(op, "v", a.v, a.k.shape));
  LATHE_TRY(check_shape(op, "out", a.out, a.q.shape));
  if (a.pos0 < 0 || a.pos0 + n > n_ctx)
    return invalid_argument("attention: positions [", a.pos0, ", ", a.pos0 + n, ") exceed the ", n_ctx,
                            " cached keys");
  if (a.window < 0) return invalid_argument("attention: window ", a.window, " is negative");
  if (!a.lse.empty()) {
    LATHE_TRY(check_dtype(op, "lse", a.lse, DType::F32));
    LATHE_TRY(check_shape(op, "lse", a.lse, Shape{n, n_head}));
  }
  if (overlaps(a.q, a.out)) return invalid_argument("attention: out overlaps q");
  if (a.workspace.dtype != DType::F32 || a.workspace.numel() < attention_workspace_floats(n_ctx, 1))
    return invalid_argument("attention: workspace holds ", a.workspace.numel(), " f32, needs at least ", n_ctx);
  return Status::ok();
}

int64_t attention_varlen_workspace_floats(int64_t max_seqlen, int n_threads) {
  return (2 * kAttentionBlockRows * std::max<int64_t>(max_seqlen, 1) + kAttentionBlockRows) *
         (n_threads > 0 ? n_threads : 1);
}

namespace {

// Shapes, dtypes and cu_seqlens shared by the varlen forward and backward.
Status check_varlen(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& lse, const TensorView& cu, const TensorView& ws) {
  LATHE_TRY(check_rank(op, "q", q, 3));
  LATHE_TRY(check_rank(op, "k", k, 3));
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}, {"workspace", &ws}})
    LATHE_TRY(check_dtype(op, name, *t, DType::F32));
  const int64_t n = q.shape[0], n_head = q.shape[1], head_dim = q.shape[2], n_head_kv = k.shape[1];
  if (k.shape[0] != n || k.shape[2] != head_dim)
    return invalid_argument(op, ": k has shape ", k.shape.str(), ", expected [", n, ", n_head_kv, ", head_dim, "]");
  if (n_head_kv <= 0 || n_head % n_head_kv != 0)
    return invalid_argument(op, ": ", n_head, " query heads are not a multiple of ", n_head_kv, " kv heads");
  LATHE_TRY(check_shape(op, "v", v, k.shape));
  LATHE_TRY(check_shape(op, "out", out, q.shape));
  LATHE_TRY(check_shape(op, "lse", lse, Shape{n, n_head}));
  LATHE_TRY(check_rank(op, "cu_seqlens", cu, 1));
  LATHE_TRY(check_dtype(op, "cu_seqlens", cu, DType::I32));
  const int32_t* c = cu.ptr<const int32_t>();
  const int64_t n_docs = cu.shape[0] - 1;
  if (n_docs < 0 || c[0] != 0 || c[n_docs] != n)
    return invalid_argument(op, ": cu_seqlens must run from 0 to the ", n, " tokens");
  int64_t longest = 0;
  for (int64_t d = 0; d < n_docs; ++d) {
    if (c[d + 1] < c[d]) return invalid_argument(op, ": cu_seqlens decreases at index ", d + 1);
    longest = std::max<int64_t>(longest, c[d + 1] - c[d]);
  }
  if (ws.numel() < attention_varlen_workspace_floats(longest, 1))
    return invalid_argument(op, ": workspace holds ", ws.numel(), " f32, needs at least ",
                            attention_varlen_workspace_floats(longest, 1));
  return Status::ok();
}

}  // namespace

Status validate(const AttentionVarlenArgs& a) {
  const char* op = "attention_varlen";
  LATHE_TRY(check_varlen(op, a.q, a.k, a.v, a.out, a.lse, a.cu_seqlens, a.workspace));
  if (a.window < 0) return invalid_argument("attention_varlen: window ", a.window, " is negative");
  if (overlaps(a.out, a.q) || overlaps(a.out, a.k) || overlaps(a.out, a.v))
    return invalid_argument("attention_varlen: out overlaps q, k or v");
  return Status::ok();
}

Status validate(const AttentionVarlenBackwardArgs& a) {
  const char* op = "attention_varlen_backward";
  LATHE_TRY(check_varlen(op, a.q, a.k, a.v, a.out, a.lse, a.cu_seqlens, a.workspace));
  if (a.window < 0) return invalid_argument("attention_varlen_backward: window ", a.window, " is negative");
  for (auto [name, t, like] : {std::tuple{"d_out", &a.d_out, &a.q}, {"d_q", &a.d_q, &a.q}, {"d_k", &a.d_k, &a.k},
                               {"d_v", &a.d_v, &a.k}}) {
    LATHE_TRY(check_dtype(op, name, *t, DType::F32));
    LATHE_TRY(check_shape(op, name, *t, like->shape));
  }
  for (const TensorView* g : {&a.d_q, &a.d_k, &a.d_v})
    for (const TensorView* in : {&a.q, &a.k, &a.v, &a.out, &a.d_out})
      if (overlaps(*g, *in)) return invalid_argument("attention_varlen_backward: a gradient overlaps an input");
  return Status::ok();
}

}  // namespace lathe
