// bf16 GEMM through cuBLASLt, fp32 accumulation. cuBLASLt is column-major;
// a row-major matrix X[r, c] is the column-major Xᵀ, so row-major
// C = op(A)·op(B) is computed as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B goes
// in as cuBLAS's first operand, A as its second, and m and n swap. Each
// shape's descriptors and heuristic algorithm are made once and cached in the
// context, keyed also by pointer alignment (the heuristic may pick kernels
// that need 16-byte alignment) and by the row strides (a row-major row
// stride is cuBLAS's leading dimension). Split-K reductions of a bf16 output
// happen in f32. Note: with a bf16 C and beta != 0 the product is rounded to
// bf16 before beta·C is added (measured on the H200: D = bf16(bf16(α·A·B) +
// β·C)), so accumulating into a bf16 output rounds twice; a bias goes in
// through the bias epilogue instead (added to the f32 accumulator, rounded
// once with it). The epilogue is part of the cached plan; the bias pointer
// is set on the plan's descriptor at each call (one thread per context).
#include <algorithm>
#include <cstdint>

#include "backends/cuda/context_impl.h"

namespace lathe::cuda {
namespace {

int alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % a) != 0) a /= 2;
  return a;
}

Status layout(cublasLtMatrixLayout_t* out, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
  return cublas_check(cublasLtMatrixLayoutCreate(out, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
                      "cublasLtMatrixLayoutCreate");
}

Status make_plan(CudaContext::Impl& im, const GemmArgs& g, const GemmKey& key, GemmPlan* plan) {
  // cuBLAS's first operand is our B: op(B)ᵀ is [n, k] column-major.
  const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t ct = g.c_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  LATHE_CUBLAS_TRY(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LATHE_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  LATHE_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  if (g.bias) {
    // Column-major D is [n, m]: the bias runs along its rows, one value per
    // row-major output column.
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = CUDA_R_16BF;
    LATHE_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    LATHE_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    LATHE_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  }
  // Stored shapes, column-major: B is [n, k] (ld n) or, transposed, [k, n] (ld k).
  if (g.trans_b) {
    LATHE_TRY(layout(&plan->a, CUDA_R_16BF, g.k, g.n, std::get<11>(key)));
  } else {
    LATHE_TRY(layout(&plan->a, CUDA_R_16BF, g.n, g.k, std::get<11>(key)));
  }
  // A is [k, m] (ld k) or, transposed, [m, k] (ld m).
  if (g.trans_a) {
    LATHE_TRY(layout(&plan->b, CUDA_R_16BF, g.m, g.k, std::get<10>(key)));
  } else {
    LATHE_TRY(layout(&plan->b, CUDA_R_16BF, g.k, g.m, std::get<10>(key)));
  }
  LATHE_TRY(layout(&plan->c, ct, g.n, g.m, std::get<12>(key)));

  cublasLtMatmulPreference_t pref = nullptr;
  LATHE_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = im.workspace_bytes;
  const uint32_t al_b = static_cast<uint32_t>(std::get<7>(key)), al_a = static_cast<uint32_t>(std::get<8>(key)),
                 al_c = static_cast<uint32_t>(std::get<9>(key));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b, sizeof(al_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof(al_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
  // A split-K algorithm reducing "in place" or "in the output type" adds its
  // partial sums in bf16 when C is bf16 (one more rounding per part); with
  // bf16 output only the f32 ("compute type") reduction is allowed.
  if (g.c_dtype == DType::BF16) {
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(im.lt, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                                     &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  LATHE_TRY(cublas_check(st, "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) {
    return error(StatusCode::kUnsupported, "cuda gemm: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k,
                 " trans_a=", g.trans_a, " trans_b=", g.trans_b);
  }
  plan->algo = result.algo;
  return Status::ok();
}

void destroy_plan(GemmPlan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
}

Status check_args(const GemmArgs& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0) {
    return invalid_argument("cuda gemm: negative size m=", g.m, " n=", g.n, " k=", g.k);
  }
  if (g.c_dtype != DType::BF16 && g.c_dtype != DType::F32) {
    return invalid_argument("cuda gemm: output dtype must be bf16 or f32, got ", dtype_name(g.c_dtype));
  }
  if ((g.m && g.n && !g.c) || (g.m && g.n && g.k && (!g.a || !g.b))) {
    return invalid_argument("cuda gemm: null operand for m=", g.m, " n=", g.n, " k=", g.k);
  }
  // A stored row holds k (or m when transposed) elements, B's n (or k), C's n.
  const int64_t row_a = g.trans_a ? g.m : g.k, row_b = g.trans_b ? g.k : g.n;
  if ((g.lda && g.lda < row_a) || (g.ldb && g.ldb < row_b) || (g.ldc && g.ldc < g.n) || g.lda < 0 || g.ldb < 0 ||
      g.ldc < 0) {
    return invalid_argument("cuda gemm: row stride shorter than a row: lda=", g.lda, " ldb=", g.ldb, " ldc=", g.ldc,
                            " for m=", g.m, " n=", g.n, " k=", g.k);
  }
  if (g.bias && (g.c_dtype != DType::BF16 || g.beta != 0.0f)) {
    return invalid_argument("cuda gemm: a bias needs a bf16 output and beta = 0 (got ", dtype_name(g.c_dtype),
                            ", beta ", g.beta, ")");
  }
  return Status::ok();
}

// Row strides with 0 resolved to the packed length.
int64_t ld_a(const GemmArgs& g) { return g.lda ? g.lda : (g.trans_a ? g.m : g.k); }
int64_t ld_b(const GemmArgs& g) { return g.ldb ? g.ldb : (g.trans_b ? g.k : g.n); }
int64_t ld_c(const GemmArgs& g) { return g.ldc ? g.ldc : g.n; }

}  // namespace

Status gemm(CudaContext& ctx, const GemmArgs& g) {
  LATHE_TRY(check_args(g));
  if (g.m == 0 || g.n == 0) return Status::ok();
  if (g.k == 0) {
    return unsupported("cuda gemm: k = 0 (scale C by beta instead) for m=", g.m, " n=", g.n);
  }
  CudaContext::Impl& im = *ctx.impl();
  const GemmKey key{g.m, g.n, g.k, g.trans_a, g.trans_b, static_cast<int>(g.c_dtype), g.beta != 0.0f,
                    alignment_of(g.b), alignment_of(g.a), alignment_of(g.c), ld_a(g), ld_b(g), ld_c(g),
                    g.bias ? 1 : 0, g.bias ? alignment_of(g.bias) : 0};
  auto it = im.plans.find(key);
  if (it == im.plans.end()) {
    GemmPlan plan;
    Status st = make_plan(im, g, key, &plan);
    if (!st.is_ok()) {
      destroy_plan(plan);
      return st;
    }
    it = im.plans.emplace(key, plan).first;
  }
  const GemmPlan& p = it->second;
  if (g.bias) {
    LATHE_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  }
  return cublas_check(cublasLtMatmul(im.lt, p.desc, &g.alpha, g.b, p.a, g.a, p.b, &g.beta, g.c, p.c, g.c, p.c, &p.algo,
                                     im.workspace, im.workspace_bytes, im.stream),
                      "cublasLtMatmul");
}

}  // namespace lathe::cuda
