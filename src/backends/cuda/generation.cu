// Generation's small kernels (see generation_ops.h): each is one plain
// kernel, sized for clarity over speed (kv_append and add_bias are a few
// kilobytes per token). attention_simple is the obviously-right attention:
// one warp walks the visible keys one at a time with an online softmax.
#include <utility>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/generation_ops.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSimpleHeadDim = 256;  // 8 elements per lane

__global__ void add_bias_kernel(bf16_bits* y, const bf16_bits* b, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  dev::st(y, i, dev::ld(y, i) + dev::ld(b, i % cols));
}

__global__ void kv_append_kernel(KvAppendArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.row_elems) return;
  const int64_t row = *a.pos0 + i / a.row_elems;
  if (row < 0 || row >= a.max_rows) return;
  const int64_t dst = row * a.row_elems + i % a.row_elems;
  a.k_cache[dst] = a.k[i];
  a.v_cache[dst] = a.v[i];
}

__global__ void attention_simple_kernel(SimpleAttentionArgs a) {
  constexpr int kPer = kMaxSimpleHeadDim / 32;
  const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int hk = h / (a.n_head / a.n_head_kv);
  const int pos = *a.pos0 + t;
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int64_t q_base = (static_cast<int64_t>(t) * a.n_head + h) * a.head_dim;
  float q[kPer], acc[kPer];
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < a.head_dim ? dev::ld(a.q, q_base + d) * a.scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = lo; j <= pos; ++j) {
    const int64_t kv_base = (static_cast<int64_t>(j) * a.n_head_kv + hk) * a.head_dim;
    float s = 0.0f;
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + 32 * i;
      if (d < a.head_dim) s += q[i] * dev::ld(a.k_cache, kv_base + d);
    }
    s = dev::warp_sum(s);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = −inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + 32 * i;
      const float v = d < a.head_dim ? dev::ld(a.v_cache, kv_base + d) : 0.0f;
      acc[i] = acc[i] * corr + p * v;
    }
    m = m_new;
  }
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    if (d < a.head_dim) dev::st(a.out, q_base + d, l > 0.0f ? acc[i] / l : 0.0f);
  }
}

__global__ void fill_random_kernel(bf16_bits* dst, int64_t n, uint64_t seed, float mean, float stddev) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint64_t r = dev::mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i));
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  dev::st(dst, i, mean + stddev * 1.7320508f * (2.0f * u - 1.0f));
}

}  // namespace

Status add_bias(CudaContext& ctx, bf16_bits* y, const bf16_bits* b, int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0) return invalid_argument("cuda add_bias: bad shape ", rows, "x", cols);
  if (!y || !b) return invalid_argument("cuda add_bias: null argument");
  if (rows == 0) return Status::ok();
  add_bias_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, stream_of(ctx)>>>(y, b, rows, cols);
  return ctx.check_launch("add_bias");
}

Status kv_append(CudaContext& ctx, const KvAppendArgs& a) {
  if (a.n_tokens < 0 || a.row_elems <= 0 || a.max_rows <= 0)
    return invalid_argument("cuda kv_append: bad shape tokens=", a.n_tokens, " row=", a.row_elems, " rows=", a.max_rows);
  if (!a.k || !a.v || !a.k_cache || !a.v_cache || !a.pos0) return invalid_argument("cuda kv_append: null argument");
  if (a.n_tokens == 0) return Status::ok();
  kv_append_kernel<<<blocks_for(a.n_tokens * a.row_elems, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("kv_append");
}

Status attention_simple(CudaContext& ctx, const SimpleAttentionArgs& a) {
  if (a.head_dim <= 0 || a.head_dim > kMaxSimpleHeadDim)
    return unsupported("cuda attention_simple: head_dim ", a.head_dim, " (1..", kMaxSimpleHeadDim, " are supported)");
  if (a.n_tokens < 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    return invalid_argument("cuda attention_simple: bad heads ", a.n_head, "/", a.n_head_kv, " or tokens ", a.n_tokens);
  if (!a.q || !a.k_cache || !a.v_cache || !a.out || !a.pos0) return invalid_argument("cuda attention_simple: null argument");
  if (a.n_tokens == 0) return Status::ok();
  attention_simple_kernel<<<dim3(a.n_tokens, a.n_head), 32, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("attention_simple");
}

Status fill_random_bf16(CudaContext& ctx, bf16_bits* dst, int64_t n, uint64_t seed, float mean, float stddev) {
  if (n < 0) return invalid_argument("cuda fill_random_bf16: negative size ", n);
  if (n == 0) return Status::ok();
  if (!dst) return invalid_argument("cuda fill_random_bf16: null argument");
  fill_random_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(dst, n, seed, mean, stddev);
  return ctx.check_launch("fill_random_bf16");
}

// ---- CudaGraph -------------------------------------------------------------

Result<CudaGraph> CudaGraph::capture(CudaContext& ctx, const std::function<Status()>& body) {
  cudaStream_t st = stream_of(ctx);
  LATHE_CU_TRY(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  Status inner = body();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(st, &graph);  // always ends the capture
  if (!inner.is_ok()) {
    if (graph) cudaGraphDestroy(graph);
    return inner.with_context("cuda graph capture");
  }
  LATHE_TRY(cuda_check(end, "cudaStreamEndCapture"));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  if (inst != cudaSuccess) {
    cudaGraphDestroy(graph);
    return cuda_check(inst, "cudaGraphInstantiate");
  }
  CudaGraph g;
  g.graph_ = graph;
  g.exec_ = exec;
  return std::move(g);
}

CudaGraph::CudaGraph(CudaGraph&& o) noexcept
    : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  std::swap(graph_, o.graph_);
  std::swap(exec_, o.exec_);
  return *this;
}
CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

Status CudaGraph::launch(CudaContext& ctx) const {
  if (!exec_) return invalid_argument("cuda graph: launch of an empty graph");
  LATHE_CU_TRY(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream_of(ctx)));
  return Status::ok();
}

}  // namespace lathe::cuda
