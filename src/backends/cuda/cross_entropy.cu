// LM head fused with cross-entropy, chunked over tokens so only one chunk's
// [chunk_rows, vocab] logits exist at a time. Per chunk: a GEMM writes the
// logits into the workspace; one block per row finds max and Σ exp in one
// online pass, writes the row's loss to a per-row buffer and the bf16
// gradient grad_scale·(softmax − onehot) (zeros for ignored rows); a
// one-block kernel adds the chunk's row losses in a fixed order to a double
// counter (no float atomics: the loss is repeatable bit for bit); two GEMMs
// then give d_hidden for the chunk and accumulate d_w. Ignored rows still go
// through the GEMMs. A target outside [0, vocab) that is not the ignore
// index is counted on the device and reported when the counters are read.
// The counters can stay on the device (cross_entropy_enqueue) so a training
// pass reads them once at its end instead of draining the stream mid-pass.
// Logits (CeLogits): bf16 by default, one rounding of the f32 accumulation as
// a bf16 lm_head returns them, the gradient written over them in place (2
// bytes a cell; a row's block reads all of it before any thread writes); or
// f32 with the gradient in a buffer beside them (6 bytes a cell). The bf16
// kernel keeps 96 KiB of its row in shared memory between its passes (two
// blocks per SM). Measured on H200 (bench_cuda_ops, random inputs, 8192
// tokens, vocab 128256): d2048 f32 16.0 ms (66% of the 810 TFLOP/s GEMM
// peak), bf16 13.2 (80%); d4096 28.6 / 25.5 ms (74 / 83%); the chunk GEMMs
// alone run at 79-90%, so bf16 leaves ~0.5 ms of 13.2 to the row kernels.
// In the training step: 1B 34.8 -> 27.2 ms of the head (77.7k -> 79.8k
// tokens/s), 8B 29.8 -> 26.1 ms. A second stream running chunk i's rows
// beside chunk i+1's GEMMs gained < 1%, so there is none.
// Chunk size: every chunk's GEMMs read the whole [vocab, dim] head, so a
// chunk is as many rows as fit in about 768 MiB of f32 workspace or 512 MiB
// of bf16 (1024 / 2048 rows at vocab 128256), which keeps the GEMMs
// compute-bound (bf16 at 2048 rows: 5% faster than 1024, 4096 no better);
// the bf16 workspace stays under the trainer's layer scratch
// that it overlays at the Llama 1B and 8B shapes.
#include <algorithm>

#include "backends/cuda/context_impl.h"
#include "core/env.h"

namespace lathe::cuda {
namespace {

constexpr int kRowThreads = 512;
constexpr int kVecThreads = 1024;
constexpr int kSumThreads = 256;
constexpr int64_t kKeptKib = 96;
constexpr size_t kAlign = 256;

size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

Result<bool> bf16_logits(CeLogits logits) {
  if (logits != CeLogits::kAuto) return logits == CeLogits::kBf16;
  const std::string v = env::cuda_ce();
  if (v.empty() || v == "bf16") return true;
  if (v == "f32") return false;
  return invalid_argument("cuda cross_entropy: LATHE_CUDA_CE=", v, " (want bf16 or f32)");
}

// Rows per chunk when the caller leaves it to us, a multiple of 64 between
// 64 and 4096: f32 logits + bf16 gradient (6 bytes a cell) in about
// 768 MiB, or bf16 logits (2 bytes) in 512 MiB. LATHE_CUDA_CE_CHUNK_ROWS
// (core/env.h) overrides it for benchmarks.
int64_t device_chunk_rows(int64_t vocab, bool bf16) {
  const int64_t forced = env::cuda_ce_chunk_rows();
  const int64_t v = std::max<int64_t>(vocab, 1);
  const int64_t rows = forced > 0 ? forced : bf16 ? (int64_t{512} << 20) / (2 * v) : (int64_t{768} << 20) / (6 * v);
  return std::clamp<int64_t>(rows / 64 * 64, 64, 4096);
}

struct Stats {
  double loss_sum;
  unsigned long long n_valid;
  unsigned long long n_bad;
};

// The workspace: the counters of a waiting call, then a chunk's logits, its
// bf16 gradient (f32 logits only) and its row losses.
struct Layout {
  int64_t chunk = 0;
  size_t logits_bytes = 0, grad_bytes = 0, loss_bytes = 0;
  size_t total() const { return aligned(sizeof(Stats)) + logits_bytes + grad_bytes + loss_bytes; }
};

Layout layout_of(int64_t vocab, int64_t chunk_rows, bool bf16) {
  Layout L;
  L.chunk = chunk_rows > 0 ? chunk_rows : device_chunk_rows(vocab, bf16);
  const size_t cells = static_cast<size_t>(vocab) * static_cast<size_t>(L.chunk);
  L.logits_bytes = aligned(cells * (bf16 ? sizeof(bf16_bits) : sizeof(float)));
  L.grad_bytes = bf16 ? 0 : aligned(cells * sizeof(bf16_bits));
  L.loss_bytes = aligned(static_cast<size_t>(L.chunk) * sizeof(float));
  return L;
}

struct RowArgs {
  const void* logits;      // [rows, vocab] f32 or bf16
  bf16_bits* grad;         // [rows, vocab]: beside f32 logits, the bf16 logits themselves, or null
  const int32_t* targets;  // [rows], this chunk's
  float* row_loss;         // [rows]: lse − logit[target], 0 for ignored rows
  Stats* stats;
  int64_t vocab;
  float grad_scale;
};

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const bf16_bits* p, int64_t i) { return dev::ld(p, i); }

// Zeros an ignored (or bad) row's gradient and loss; false when the row is
// supervised.
__device__ __forceinline__ bool skip_row(const RowArgs& a, int64_t row, int32_t t) {
  const bool ignored = t == kCrossEntropyIgnore;
  const bool bad = !ignored && (t < 0 || t >= a.vocab);
  if (!ignored && !bad) return false;
  if (a.grad) {
    for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) a.grad[row * a.vocab + j] = 0;
  }
  if (threadIdx.x == 0) {
    a.row_loss[row] = 0.0f;
    if (bad) atomicAdd(&a.stats->n_bad, 1ull);
  }
  return true;
}

// The block's log Σ exp from each thread's running max m and its sum s of
// exp(x − m); records the row's loss.
__device__ __forceinline__ float finish_lse(const RowArgs& a, int64_t row, float m, float s, float target_logit,
                                            float* scratch) {
  const float mx = dev::block_max(m, scratch);
  const float sum = dev::block_sum(m == -INFINITY ? 0.0f : s * expf(m - mx), scratch);
  const float lse = mx + logf(sum);
  if (threadIdx.x == 0) {
    a.row_loss[row] = lse - target_logit;
    atomicAdd(&a.stats->n_valid, 1ull);
  }
  return lse;
}

// One row per block, element by element: f32 logits, or bf16 ones whose
// width is not a multiple of 8. The gradient may overwrite the logits: every
// read of the first pass (and of the target's logit) precedes the
// reductions' barriers, and the second pass reads and writes each element
// from the same thread.
template <class T>
__global__ void __launch_bounds__(kRowThreads) ce_rows(RowArgs a) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* l = static_cast<const T*>(a.logits) + row * a.vocab;
  const int32_t t = a.targets[row];
  if (skip_row(a, row, t)) return;
  const float target_logit = load(l, t);
  float m_t = -INFINITY, s_t = 0.0f;
  for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) {
    const float v = load(l, j);
    if (v > m_t) {
      s_t = s_t * expf(m_t - v) + 1.0f;
      m_t = v;
    } else if (v > -INFINITY) {
      s_t += expf(v - m_t);
    }
  }
  const float lse = finish_lse(a, row, m_t, s_t, target_logit, scratch);
  if (!a.grad) return;
  for (int64_t j = threadIdx.x; j < a.vocab; j += blockDim.x) {
    const float p = expf(load(l, j) - lse) - (j == t ? 1.0f : 0.0f);
    dev::st(a.grad, row * a.vocab + j, a.grad_scale * p);
  }
}

__device__ __forceinline__ void unpack8(const uint4& q, float (&x)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&q);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  uint4 q;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&q);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
  return q;
}
// Adds eight logits to a running (max, Σ exp) pair.
__device__ __forceinline__ void online8(const uint4& q, float& m, float& s) {
  float x[8];
  unpack8(q, x);
  float m8 = x[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) m8 = fmaxf(m8, x[i]);
  if (m8 == -INFINITY) return;
  if (m8 > m) {
    s *= expf(m - m8);  // 0 on the first: expf(−inf)
    m = m8;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) s += expf(x[i] - m);
}

// One row per block of bf16 logits, vocab a multiple of 8, eight at a time.
// The row's first `kept` vectors stay in shared memory between the passes;
// the gradient overwrites the row in place (a.grad is the logits or null).
__global__ void __launch_bounds__(kVecThreads) ce_rows_bf16x8(RowArgs a, int64_t kept) {
  extern __shared__ uint4 kept_row[];  // [kept]
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x, n_vec = a.vocab / 8, step = blockDim.x;
  const uint4* l = static_cast<const uint4*>(a.logits) + row * n_vec;
  const int32_t t = a.targets[row];
  if (skip_row(a, row, t)) return;
  const float target_logit = dev::ld(static_cast<const bf16_bits*>(a.logits), row * a.vocab + t);
  float m_t = -INFINITY, s_t = 0.0f;
  for (int64_t v0 = threadIdx.x; v0 < n_vec; v0 += 2 * step) {
    const int64_t v1 = v0 + step;
    const uint4 q0 = l[v0];
    const uint4 q1 = v1 < n_vec ? l[v1] : uint4{};
    if (v0 < kept) kept_row[v0] = q0;
    online8(q0, m_t, s_t);
    if (v1 < n_vec) {
      if (v1 < kept) kept_row[v1] = q1;
      online8(q1, m_t, s_t);
    }
  }
  const float lse = finish_lse(a, row, m_t, s_t, target_logit, scratch);
  if (!a.grad) return;
  uint4* g = reinterpret_cast<uint4*>(a.grad) + row * n_vec;
  for (int64_t v = threadIdx.x; v < n_vec; v += step) {
    float x[8];
    unpack8(v < kept ? kept_row[v] : l[v], x);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = a.grad_scale * (expf(x[i] - lse) - (v * 8 + i == t ? 1.0f : 0.0f));
    g[v] = pack8(x);
  }
}

// stats.loss_sum += Σ row_loss, in one fixed order (strided per thread, then
// a tree): the same bits on every run.
__global__ void __launch_bounds__(kSumThreads) sum_row_losses(const float* row_loss, int64_t rows, Stats* stats) {
  __shared__ double part[kSumThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += kSumThreads) s += static_cast<double>(row_loss[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int o = kSumThreads / 2; o > 0; o >>= 1) {
    if (static_cast<int>(threadIdx.x) < o) part[threadIdx.x] += part[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) stats->loss_sum += part[0];
}

// The row kernel and the loss sum for one chunk.
Status reduce_rows(CudaContext& ctx, const RowArgs& ra, int64_t rows, bool bf16) {
  cudaStream_t st = stream_of(ctx);
  const unsigned grid = static_cast<unsigned>(rows);
  if (!bf16) {
    ce_rows<float><<<grid, kRowThreads, 0, st>>>(ra);
  } else if (ra.vocab % 8 != 0) {
    ce_rows<bf16_bits><<<grid, kRowThreads, 0, st>>>(ra);
  } else {
    // 96 KiB of the row (LATHE_CUDA_CE_KEPT_KIB for benchmarks), at most
    // what a block's shared memory holds less the static scratch and the
    // 1 KiB the SM reserves per block.
    int optin = 0;
    LATHE_CU_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device()));
    const int64_t kib = env::cuda_ce_kept_kib();
    const int64_t cap = std::min<int64_t>(std::max(optin - 2048, 0), (kib >= 0 ? kib : kKeptKib) * 1024) / 16;
    const int64_t kept = std::min(ra.vocab / 8, cap);
    const size_t smem = static_cast<size_t>(kept) * 16;
    LATHE_CU_TRY(cudaFuncSetAttribute(ce_rows_bf16x8, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    ce_rows_bf16x8<<<grid, kVecThreads, smem, st>>>(ra, kept);
  }
  LATHE_TRY(ctx.check_launch("cross_entropy rows"));
  sum_row_losses<<<1, kSumThreads, 0, st>>>(ra.row_loss, rows, ra.stats);
  return ctx.check_launch("cross_entropy loss sum");
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

// One chunk: the logits GEMM, the rows and loss sum, the gradient GEMMs.
Status run_chunk(CudaContext& ctx, const CrossEntropyCudaArgs& a, const Layout& L, bool bf16, Stats* stats,
                 int64_t r0) {
  const int64_t rows = std::min(L.chunk, a.n - r0);
  char* logits = static_cast<char*>(a.workspace) + aligned(sizeof(Stats));
  bf16_bits* grad = reinterpret_cast<bf16_bits*>(logits + (bf16 ? 0 : L.logits_bytes));
  const bf16_bits* h = a.hidden + r0 * a.dim;
  GemmArgs lg{.a = h, .b = a.w, .c = logits, .m = rows, .n = a.vocab, .k = a.dim, .trans_b = true,
              .c_dtype = bf16 ? DType::BF16 : DType::F32};
  LATHE_TRY(gemm(ctx, lg));
  RowArgs ra{logits, a.d_hidden ? grad : nullptr, a.targets + r0,
             reinterpret_cast<float*>(logits + L.logits_bytes + L.grad_bytes), stats, a.vocab, a.grad_scale};
  LATHE_TRY(reduce_rows(ctx, ra, rows, bf16));
  if (!a.d_hidden) return Status::ok();
  GemmArgs dh{.a = grad, .b = a.w, .c = a.d_hidden + r0 * a.dim, .m = rows, .n = a.dim, .k = a.vocab,
              .c_dtype = DType::BF16};
  LATHE_TRY(gemm(ctx, dh));
  if (!a.d_w) return Status::ok();
  GemmArgs dw{.a = grad, .b = h, .c = a.d_w, .m = a.vocab, .n = a.dim, .k = rows, .trans_a = true,
              .c_dtype = DType::F32, .beta = 1.0f};
  return gemm(ctx, dw);
}

}  // namespace

size_t cross_entropy_workspace_bytes(int64_t vocab, int64_t chunk_rows, CeLogits logits) {
  const Result<bool> bf16 = bf16_logits(logits);
  return layout_of(vocab, chunk_rows, bf16.is_ok() && *bf16).total();  // unknown LATHE_CUDA_CE: f32, the larger
}

size_t cross_entropy_counter_bytes() { return sizeof(Stats); }

Status cross_entropy_enqueue(CudaContext& ctx, const CrossEntropyCudaArgs& a, void* counters) {
  LATHE_TRY(check_args(a));
  if (!counters) return invalid_argument("cuda cross_entropy: counters are required");
  LATHE_ASSIGN_OR_RETURN(const bool bf16, bf16_logits(a.logits));
  const Layout L = layout_of(a.vocab, a.chunk_rows, bf16);
  Stats* stats = static_cast<Stats*>(counters);
  LATHE_CU_TRY(cudaMemsetAsync(stats, 0, sizeof(Stats), stream_of(ctx)));
  for (int64_t r0 = 0; r0 < a.n; r0 += L.chunk) LATHE_TRY(run_chunk(ctx, a, L, bf16, stats, r0));
  return Status::ok();
}

Result<CrossEntropyStats> cross_entropy_counters(CudaContext& ctx, const void* counters, int64_t vocab) {
  Stats host{};
  LATHE_TRY(copy_to_host(ctx, &host, counters, sizeof(Stats)));
  if (host.n_bad > 0) {
    return invalid_argument("cuda cross_entropy: ", host.n_bad, " target(s) outside [0, ", vocab,
                            ") that are not the ignore index ", kCrossEntropyIgnore);
  }
  return CrossEntropyStats{host.loss_sum, static_cast<int64_t>(host.n_valid)};
}

Result<CrossEntropyStats> cross_entropy(CudaContext& ctx, const CrossEntropyCudaArgs& a) {
  LATHE_TRY(cross_entropy_enqueue(ctx, a, a.workspace));
  return cross_entropy_counters(ctx, a.workspace, a.vocab);
}

}  // namespace lathe::cuda
