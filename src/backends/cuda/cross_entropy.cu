// LM head fused with cross-entropy, chunked over tokens so only one chunk's
// [chunk_rows, vocab] logits exist at a time (two with overlap). Per chunk: a
// GEMM writes the logits into the workspace; one block per row finds max and
// Σ exp in one online pass, writes the row's loss to a per-row buffer and the
// bf16 gradient grad_scale·(softmax − onehot) (zeros for ignored rows); a
// one-block kernel adds the chunk's row losses in a fixed order to a double
// (no float atomics: the loss is repeatable bit for bit); two GEMMs then give
// d_hidden for the chunk and accumulate d_w. Ignored rows still go through
// the GEMMs. A target outside [0, vocab) that is not the ignore index is
// counted on the device and reported as an error after the call.
// Logits (CeLogits): f32 logits with the gradient in a buffer beside them
// (6 bytes a cell), or bf16 logits, one rounding of the f32 accumulation as a
// bf16 lm_head returns them, with the gradient written over them in place (2
// bytes a cell; a row's block reads all of it before any thread writes). The
// bf16 kernel keeps as much of its row in shared memory as fits (~224 KiB of
// the 256 KiB a 128256-wide row takes), so its second pass reads the rest
// from global memory only: one block per SM.
// Overlap (CeOverlap): chunk i's row kernel and loss sum run on a second
// stream while the main stream runs chunk i+1's logits GEMM and chunk i's
// gradient GEMMs (events fork and join; two workspace halves). The same
// kernels read the same data, so the results are the serialized order's bits.
// Chunk size: every chunk's GEMMs read the whole [vocab, dim] head, so a
// chunk is as many rows as fit in about 768 MiB of f32 workspace or 512 MiB
// of bf16 (two halves; 1024 rows at vocab 128256 either way), which keeps
// the GEMMs compute-bound.
#include <algorithm>

#include "backends/cuda/context_impl.h"
#include "core/env.h"

namespace lathe::cuda {
namespace {

constexpr int kRowThreads = 512;
constexpr int kVecThreads = 1024;
constexpr int kSumThreads = 256;
constexpr size_t kAlign = 256;

size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

struct Mode {
  bool bf16 = false;
  bool overlap = false;
};

Result<Mode> resolve(CeLogits logits, CeOverlap overlap) {
  Mode m;
  if (logits == CeLogits::kAuto) {
    const std::string v = env::cuda_ce();
    if (v == "bf16") {
      m.bf16 = true;
    } else if (!v.empty() && v != "f32") {
      return invalid_argument("cuda cross_entropy: LATHE_CUDA_CE=", v, " (want f32 or bf16)");
    }
  } else {
    m.bf16 = logits == CeLogits::kBf16;
  }
  m.overlap = overlap == CeOverlap::kAuto ? env::cuda_ce_overlap() : overlap == CeOverlap::kOn;
  return m;
}

// Rows per chunk when the caller leaves it to us, a multiple of 64 between
// 64 and 4096: f32 logits + bf16 gradient (6 bytes a cell) in about 768 MiB,
// or two halves of bf16 logits (4 bytes a cell) in 512 MiB.
// LATHE_CUDA_CE_CHUNK_ROWS (core/env.h) overrides it for benchmarks.
int64_t device_chunk_rows(int64_t vocab, bool bf16) {
  const int64_t forced = env::cuda_ce_chunk_rows();
  const int64_t v = std::max<int64_t>(vocab, 1);
  const int64_t rows = forced > 0 ? forced : bf16 ? (int64_t{512} << 20) / (4 * v) : (int64_t{768} << 20) / (6 * v);
  return std::clamp<int64_t>(rows / 64 * 64, 64, 4096);
}

struct Stats {
  double loss_sum;
  unsigned long long n_valid;
  unsigned long long n_bad;
};

// The workspace: the counters, then one half (two with overlap), each a
// chunk's logits, its bf16 gradient (f32 logits only) and its row losses.
struct Layout {
  int64_t chunk = 0;
  int halves = 1;
  size_t logits_bytes = 0, grad_bytes = 0, loss_bytes = 0;
  size_t half_bytes() const { return logits_bytes + grad_bytes + loss_bytes; }
  size_t total() const { return aligned(sizeof(Stats)) + size_t(halves) * half_bytes(); }
};

Layout layout_of(int64_t vocab, int64_t chunk_rows, Mode m) {
  Layout L;
  L.chunk = chunk_rows > 0 ? chunk_rows : device_chunk_rows(vocab, m.bf16);
  L.halves = m.overlap ? 2 : 1;
  const size_t cells = static_cast<size_t>(vocab) * static_cast<size_t>(L.chunk);
  L.logits_bytes = aligned(cells * (m.bf16 ? sizeof(bf16_bits) : sizeof(float)));
  L.grad_bytes = m.bf16 ? 0 : aligned(cells * sizeof(bf16_bits));
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

// The row kernel and the loss sum for one chunk on stream st.
Status reduce_rows(CudaContext& ctx, cudaStream_t st, const RowArgs& ra, int64_t rows, bool bf16) {
  const unsigned grid = static_cast<unsigned>(rows);
  if (!bf16) {
    ce_rows<float><<<grid, kRowThreads, 0, st>>>(ra);
  } else if (ra.vocab % 8 != 0) {
    ce_rows<bf16_bits><<<grid, kRowThreads, 0, st>>>(ra);
  } else {
    // As much of the row as the block's shared memory holds, less the
    // static scratch and the 1 KiB the SM reserves per block
    // (LATHE_CUDA_CE_KEPT_KIB caps it for benchmarks).
    int optin = 0;
    LATHE_CU_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device()));
    int64_t cap = std::max(optin - 2048, 0) / 16;
    if (const int64_t kib = env::cuda_ce_kept_kib(); kib >= 0) cap = std::min(cap, kib * 1024 / 16);
    const int64_t kept = std::min(ra.vocab / 8, cap);
    const size_t smem = static_cast<size_t>(kept) * 16;
    LATHE_CU_TRY(cudaFuncSetAttribute(ce_rows_bf16x8, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    ce_rows_bf16x8<<<grid, kVecThreads, smem, st>>>(ra, kept);
  }
  LATHE_TRY(ctx.check_launch("cross_entropy rows"));
  sum_row_losses<<<1, kSumThreads, 0, st>>>(ra.row_loss, rows, ra.stats);
  return ctx.check_launch("cross_entropy loss sum");
}

// The context's second stream and events, made on first use.
Result<cudaStream_t> side_stream(CudaContext& ctx) {
  CudaContext::Impl& im = *ctx.impl();
  if (!im.ce_stream) {
    LATHE_CU_TRY(cudaStreamCreateWithFlags(&im.ce_stream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : im.ce_events) LATHE_CU_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return im.ce_stream;
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

// One call's chunks. stage_logits(j): chunk j's logits GEMM on the main
// stream, its rows and loss sum on the side stream (the main one without
// overlap); stage_grad(j): chunk j's gradient GEMMs on the main stream. With
// overlap the main stream runs stage_logits(j + 1) before stage_grad(j).
struct Pass {
  CudaContext& ctx;
  const CrossEntropyCudaArgs& a;
  Mode mode;
  Layout L;
  char* halves;
  Stats* stats;
  cudaStream_t main, side;
  cudaEvent_t* logits_ready;  // [2]
  cudaEvent_t* rows_done;     // [2]

  int64_t rows_of(int64_t j) const { return std::min(L.chunk, a.n - j * L.chunk); }
  char* half(int64_t j) const { return halves + (j % L.halves) * L.half_bytes(); }
  bf16_bits* grad_of(int64_t j) const {
    return reinterpret_cast<bf16_bits*>(half(j) + (mode.bf16 ? 0 : L.logits_bytes));
  }

  Status stage_logits(int64_t j) {
    const int64_t rows = rows_of(j);
    char* h = half(j);
    if (mode.overlap && j >= 2) LATHE_CU_TRY(cudaStreamWaitEvent(main, rows_done[j % 2], 0));
    GemmArgs lg{.a = a.hidden + j * L.chunk * a.dim, .b = a.w, .c = h, .m = rows, .n = a.vocab, .k = a.dim,
                .trans_b = true, .c_dtype = mode.bf16 ? DType::BF16 : DType::F32};
    LATHE_TRY(gemm(ctx, lg));
    if (mode.overlap) {
      LATHE_CU_TRY(cudaEventRecord(logits_ready[j % 2], main));
      LATHE_CU_TRY(cudaStreamWaitEvent(side, logits_ready[j % 2], 0));
    }
    RowArgs ra{h, a.d_hidden ? grad_of(j) : nullptr, a.targets + j * L.chunk,
               reinterpret_cast<float*>(h + L.logits_bytes + L.grad_bytes), stats, a.vocab, a.grad_scale};
    LATHE_TRY(reduce_rows(ctx, side, ra, rows, mode.bf16));
    if (mode.overlap) LATHE_CU_TRY(cudaEventRecord(rows_done[j % 2], side));
    return Status::ok();
  }

  Status stage_grad(int64_t j) {
    if (!a.d_hidden) return Status::ok();
    const int64_t rows = rows_of(j);
    if (mode.overlap) LATHE_CU_TRY(cudaStreamWaitEvent(main, rows_done[j % 2], 0));
    const bf16_bits* g = grad_of(j);
    GemmArgs dh{.a = g, .b = a.w, .c = a.d_hidden + j * L.chunk * a.dim, .m = rows, .n = a.dim, .k = a.vocab,
                .c_dtype = DType::BF16};
    LATHE_TRY(gemm(ctx, dh));
    if (!a.d_w) return Status::ok();
    GemmArgs dw{.a = g, .b = a.hidden + j * L.chunk * a.dim, .c = a.d_w, .m = a.vocab, .n = a.dim, .k = rows,
                .trans_a = true, .c_dtype = DType::F32, .beta = 1.0f};
    return gemm(ctx, dw);
  }

  Status run() {
    const int64_t n_chunks = (a.n + L.chunk - 1) / L.chunk, ahead = mode.overlap ? 1 : 0;
    for (int64_t j = 0; j < std::min(ahead, n_chunks); ++j) LATHE_TRY(stage_logits(j));
    for (int64_t i = 0; i < n_chunks; ++i) {
      if (i + ahead < n_chunks) LATHE_TRY(stage_logits(i + ahead));
      LATHE_TRY(stage_grad(i));
    }
    if (mode.overlap && n_chunks > 0) LATHE_CU_TRY(cudaStreamWaitEvent(main, rows_done[(n_chunks - 1) % 2], 0));
    return Status::ok();
  }
};

}  // namespace

size_t cross_entropy_workspace_bytes(int64_t vocab, int64_t chunk_rows, CeLogits logits, CeOverlap overlap) {
  const Result<Mode> mode = resolve(logits, overlap);
  // An unknown LATHE_CUDA_CE fails the call; size for the larger layout.
  const Mode m = mode.is_ok() ? *mode : Mode{.bf16 = false, .overlap = env::cuda_ce_overlap()};
  return layout_of(vocab, chunk_rows, m).total();
}

Result<CrossEntropyStats> cross_entropy(CudaContext& ctx, const CrossEntropyCudaArgs& a) {
  LATHE_TRY(check_args(a));
  LATHE_ASSIGN_OR_RETURN(const Mode mode, resolve(a.logits, a.overlap));
  char* ws = static_cast<char*>(a.workspace);
  CudaContext::Impl& im = *ctx.impl();
  Pass pass{.ctx = ctx, .a = a, .mode = mode, .L = layout_of(a.vocab, a.chunk_rows, mode),
            .halves = ws + aligned(sizeof(Stats)), .stats = reinterpret_cast<Stats*>(ws), .main = stream_of(ctx),
            .side = stream_of(ctx), .logits_ready = im.ce_events, .rows_done = im.ce_events + 2};
  if (mode.overlap) {
    LATHE_ASSIGN_OR_RETURN(pass.side, side_stream(ctx));
  }
  LATHE_CU_TRY(cudaMemsetAsync(pass.stats, 0, sizeof(Stats), pass.main));
  LATHE_TRY(pass.run());
  Stats host{};
  LATHE_CU_TRY(cudaMemcpyAsync(&host, pass.stats, sizeof(Stats), cudaMemcpyDeviceToHost, pass.main));
  LATHE_CU_TRY(cudaStreamSynchronize(pass.main));
  if (host.n_bad > 0) {
    return invalid_argument("cuda cross_entropy: ", host.n_bad, " target(s) outside [0, ", a.vocab,
                            ") that are not the ignore index ", kCrossEntropyIgnore);
  }
  return CrossEntropyStats{host.loss_sum, static_cast<int64_t>(host.n_valid)};
}

}  // namespace lathe::cuda
