// LM head fused with cross-entropy, chunked over tokens so only one chunk's
// [chunk_rows, vocab] logits exist at a time. Per chunk: a GEMM writes f32
// logits into the workspace; one block per row finds max and Σ exp (in one
// online pass), adds the
// row's loss to device counters and writes the bf16 gradient
// grad_scale·(softmax − onehot) (zeros for ignored rows); two GEMMs then give
// d_hidden for the chunk and accumulate d_w. Ignored rows still go through the
// GEMMs (simple first; gathering supervised rows is the next step). A target
// outside [0, vocab) that is not the ignore index is counted on the device
// and reported as an error after the call.
// Chunk size: every chunk's GEMMs read the whole [vocab, dim] head, so the
// CPU's cache-sized chunks (~65 rows at vocab 128256) would read it ~130
// times per pass on the device; here a chunk is as many rows as fit in about
// 768 MiB of workspace (960 rows at vocab 128256), which keeps the GEMMs
// compute-bound.
#include <algorithm>

#include "backends/cuda/context_impl.h"
#include "core/env.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 512;
constexpr size_t kAlign = 256;

size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Rows per chunk when the caller leaves it to us: f32 logits + bf16 gradient
// (6 bytes a cell) in about 768 MiB, a multiple of 64, between 64 and 4096;
// LATHE_CUDA_CE_CHUNK_ROWS (core/env.h) overrides it for benchmarks.
int64_t device_chunk_rows(int64_t vocab) {
  const int64_t forced = env::cuda_ce_chunk_rows();
  const int64_t rows = forced > 0 ? forced : (int64_t{768} << 20) / (6 * std::max<int64_t>(vocab, 1));
  return std::clamp<int64_t>(rows / 64 * 64, 64, 4096);
}

struct Stats {
  double loss_sum;
  unsigned long long n_valid;
  unsigned long long n_bad;
};

struct RowArgs {
  const float* logits;  // [rows, vocab]
  bf16_bits* grad;      // [rows, vocab] or null
  const int32_t* targets;  // [rows], this chunk's
  Stats* stats;
  int64_t vocab;
  float grad_scale;
};

__global__ void ce_rows(RowArgs a) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* l = a.logits + row * a.vocab;
  const int32_t t = a.targets[row];
  const bool ignored = t == kCrossEntropyIgnore;
  const bool bad = !ignored && (t < 0 || t >= a.vocab);
  if (ignored || bad) {
    if (a.grad) {
      for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) a.grad[row * a.vocab + j] = 0;
    }
    if (bad && threadIdx.x == 0) atomicAdd(&a.stats->n_bad, 1ull);
    return;
  }
  // One pass: each thread keeps a running max and a sum of exp relative to
  // it, rescaled when the max grows; then the block's max, and each thread's
  // sum moved onto it.
  float m_t = -INFINITY, s_t = 0.0f;
  for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) {
    const float v = l[j];
    if (v > m_t) {
      s_t = s_t * expf(m_t - v) + 1.0f;
      m_t = v;
    } else if (v > -INFINITY) {
      s_t += expf(v - m_t);
    }
  }
  const float mx = dev::block_max(m_t, scratch);
  const float sum = dev::block_sum(m_t == -INFINITY ? 0.0f : s_t * expf(m_t - mx), scratch);
  const float lse = mx + logf(sum);
  if (threadIdx.x == 0) {
    atomicAdd(&a.stats->loss_sum, static_cast<double>(lse - l[t]));
    atomicAdd(&a.stats->n_valid, 1ull);
  }
  if (!a.grad) return;
  for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) {
    const float p = expf(l[j] - lse) - (j == t ? 1.0f : 0.0f);
    dev::st(a.grad, row * a.vocab + j, a.grad_scale * p);
  }
}

Status check_args(const CrossEntropyCudaArgs& a) {
  if (a.n < 0 || a.vocab <= 0 || a.dim <= 0 || a.chunk_rows < 0) {
    return invalid_argument("cuda cross_entropy: bad shape n=", a.n, " vocab=", a.vocab, " dim=", a.dim,
                            " chunk_rows=", a.chunk_rows);
  }
  if (!a.hidden || !a.w || !a.targets || !a.workspace) {
    return invalid_argument("cuda cross_entropy: hidden, w, targets and workspace are required");
  }
  if (a.d_w && !a.d_hidden) return invalid_argument("cuda cross_entropy: d_w needs d_hidden");
  return Status::ok();
}

}  // namespace

size_t cross_entropy_workspace_bytes(int64_t vocab, int64_t chunk_rows) {
  if (chunk_rows <= 0) chunk_rows = device_chunk_rows(vocab);
  const size_t cells = static_cast<size_t>(vocab) * static_cast<size_t>(chunk_rows);
  return aligned(sizeof(Stats)) + aligned(cells * sizeof(float)) + aligned(cells * sizeof(bf16_bits));
}

Result<CrossEntropyStats> cross_entropy(CudaContext& ctx, const CrossEntropyCudaArgs& a) {
  LATHE_TRY(check_args(a));
  const int64_t chunk = a.chunk_rows > 0 ? a.chunk_rows : device_chunk_rows(a.vocab);
  char* ws = static_cast<char*>(a.workspace);
  Stats* stats = reinterpret_cast<Stats*>(ws);
  float* logits = reinterpret_cast<float*>(ws + aligned(sizeof(Stats)));
  bf16_bits* grad = reinterpret_cast<bf16_bits*>(
      ws + aligned(sizeof(Stats)) + aligned(static_cast<size_t>(a.vocab) * chunk * sizeof(float)));
  cudaStream_t s = stream_of(ctx);
  LATHE_CU_TRY(cudaMemsetAsync(stats, 0, sizeof(Stats), s));
  const bool want_grad = a.d_hidden != nullptr;
  for (int64_t r0 = 0; r0 < a.n; r0 += chunk) {
    const int64_t rows = std::min(chunk, a.n - r0);
    const bf16_bits* h = a.hidden + r0 * a.dim;
    GemmArgs lg{.a = h, .b = a.w, .c = logits, .m = rows, .n = a.vocab, .k = a.dim, .trans_b = true,
                .c_dtype = DType::F32};
    LATHE_TRY(gemm(ctx, lg));
    RowArgs ra{logits, want_grad ? grad : nullptr, a.targets + r0, stats, a.vocab, a.grad_scale};
    ce_rows<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(ra);
    LATHE_TRY(ctx.check_launch("cross_entropy rows"));
    if (!want_grad) continue;
    GemmArgs dh{.a = grad, .b = a.w, .c = a.d_hidden + r0 * a.dim, .m = rows, .n = a.dim, .k = a.vocab,
                .c_dtype = DType::BF16};
    LATHE_TRY(gemm(ctx, dh));
    if (a.d_w) {
      GemmArgs dw{.a = grad, .b = h, .c = a.d_w, .m = a.vocab, .n = a.dim, .k = rows, .trans_a = true,
                  .c_dtype = DType::F32, .beta = 1.0f};
      LATHE_TRY(gemm(ctx, dw));
    }
  }
  Stats host{};
  LATHE_CU_TRY(cudaMemcpyAsync(&host, stats, sizeof(Stats), cudaMemcpyDeviceToHost, s));
  LATHE_CU_TRY(cudaStreamSynchronize(s));
  if (host.n_bad > 0) {
    return invalid_argument("cuda cross_entropy: ", host.n_bad, " target(s) outside [0, ", a.vocab,
                            ") that are not the ignore index ", kCrossEntropyIgnore);
  }
  return CrossEntropyStats{host.loss_sum, static_cast<int64_t>(host.n_valid)};
}

}  // namespace lathe::cuda
