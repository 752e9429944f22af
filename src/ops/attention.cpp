// Validation of the attention op contract (src/ops/attention.h).
#include "ops/attention.h"

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

}  // namespace lathe
