// The decode step's small kernels (decode_ops.h) besides the skinny GEMM:
// the bias broadcast for a GEMM's beta = 1, the f32 embedding (alone, or
// with the RoPE tables as a step's inputs), the f32 residual stream's
// pre-norm and the fused q/k norm + RoPE + KV append. Each is one plain
// kernel; they move a few kilobytes per token, so launch count matters
// more than their speed: the norm takes up to 1024 threads for a row so a
// lone decode row is not walked by a quarter of them.
#include <algorithm>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/gemv_common.cuh"
#include "backends/cuda/rope_table.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 256;

__global__ void broadcast_rows_kernel(bf16_bits* y, const bf16_bits* b, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] = b[i % cols];
}

// Element i of embedding_f32 (and the row's seen bit).
__device__ __forceinline__ void embedding_f32_entry(const EmbeddingF32Args& a, int64_t i) {
  const int64_t r = i / a.dim, j = i % a.dim;
  const int32_t id = a.tokens[r];
  a.out[i] = id >= 0 && id < a.vocab ? dev::ld(a.table, int64_t(id) * a.dim + j) : 0.0f;
  if (a.seen && j == 0 && id >= 0 && id < a.vocab) atomicOr(a.seen + r * a.seen_stride + id / 32, 1u << (id % 32));
}

__global__ void embedding_f32_kernel(EmbeddingF32Args a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < a.n * a.dim) embedding_f32_entry(a, i);
}

// The next kernel may start only once this one has waited: the decode
// attention reads the positions before its own wait, and they may come from
// the previous kernel (the pick of the step before).
__global__ void decode_inputs_kernel(EmbeddingF32Args e, RopeTablesCudaArgs r) {
  wait_prior_grid();
  allow_next_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < e.n * e.dim) embedding_f32_entry(e, i);
  if (i < r.n_tokens * r.half) rope_table_entry(r, i);
}

__global__ void residual_norm_kernel(ResidualNormArgs a) {
  __shared__ float scratch[32];
  const int64_t base = int64_t(blockIdx.x) * a.dim;
  allow_next_grid();
  wait_prior_grid();
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    float h = a.h[base + j];
    if (a.delta) {
      h += a.delta[base + j] + (a.bias ? dev::ld(a.bias, j) : 0.0f);
      a.h[base + j] = h;
    }
    ss += h * h;
  }
  ss = dev::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(a.dim) + a.eps);
  // Each thread reads back only the elements it wrote.
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) dev::st(a.y, base + j, a.h[base + j] * rstd * dev::ld(a.w, j));
}

// blockIdx.x: head (q heads, then k heads, then v heads); blockIdx.y: sequence.
__global__ void rope_append_kernel(RopeAppendArgs a) {
  __shared__ float s_x[kMaxHeadDim];
  allow_next_grid();
  wait_prior_grid();
  const int head = blockIdx.x, s = blockIdx.y, lane = threadIdx.x;
  const int hd = a.head_dim, half = hd / 2;
  const int qkv_dim = (a.n_head + 2 * a.n_head_kv) * hd;
  const float* src = a.qkv + int64_t(s) * qkv_dim + int64_t(head) * hd;
  const int pos = a.pos[s];
  bf16_bits* dst;
  const bf16_bits* norm_w = nullptr;
  bool rotate = true;
  if (head < a.n_head) {
    dst = a.q_out + (int64_t(s) * a.n_head + head) * hd;
    norm_w = a.q_norm;
  } else {
    if (pos < 0 || pos >= a.max_ctx) return;
    const bool is_k = head < a.n_head + a.n_head_kv;
    const int hk = head - a.n_head - (is_k ? 0 : a.n_head_kv);
    dst = (is_k ? a.k_caches[s] : a.v_caches[s]) + (int64_t(pos) * a.n_head_kv + hk) * hd;
    norm_w = is_k ? a.k_norm : nullptr;
    rotate = is_k;
  }
  float ss = 0.0f;
  for (int d = lane; d < hd; d += 32) {
    const float x = src[d];
    s_x[d] = x;
    ss += x * x;
  }
  if (norm_w) {
    const float rstd = rsqrtf(dev::warp_sum(ss) / static_cast<float>(hd) + a.eps);
    for (int d = lane; d < hd; d += 32) s_x[d] = s_x[d] * rstd * dev::ld(norm_w, d);
  }
  __syncwarp();
  if (!rotate) {
    for (int d = lane; d < hd; d += 32) dev::st(dst, d, s_x[d]);
    return;
  }
  for (int p = lane; p < half; p += 32) {
    const float c = a.cos[int64_t(s) * half + p], sn = a.sin[int64_t(s) * half + p];
    const float x1 = s_x[p], x2 = s_x[p + half];
    dev::st(dst, p, x1 * c - x2 * sn);
    dev::st(dst, p + half, x2 * c + x1 * sn);
  }
}

// Four outputs a thread (n a multiple of 4: 16-byte loads) or one.
template <int V>
__global__ void swiglu_rows_kernel(SwigluRowsArgs a) {
  allow_next_grid();
  wait_prior_grid();
  const int64_t per_row = a.n / V;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.rows * per_row) return;
  const int64_t r = i / per_row, j = i % per_row * V;
  const float* g = a.gu + r * 2 * a.n + j;
  const float* u = g + a.n;
  float gv[V], uv[V];
  if constexpr (V == 4) {
    const float4 g4 = *reinterpret_cast<const float4*>(g), u4 = *reinterpret_cast<const float4*>(u);
    gv[0] = g4.x, gv[1] = g4.y, gv[2] = g4.z, gv[3] = g4.w;
    uv[0] = u4.x, uv[1] = u4.y, uv[2] = u4.z, uv[3] = u4.w;
  } else {
    gv[0] = g[0], uv[0] = u[0];
  }
#pragma unroll
  for (int e = 0; e < V; ++e) dev::st(a.out, r * a.n + j + e, gemv_detail::silu(gv[e]) * uv[e]);  // the GEMVs' formula
}

}  // namespace

Status broadcast_rows(CudaContext& ctx, bf16_bits* y, const bf16_bits* b, int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0) return invalid_argument("cuda broadcast_rows: bad shape ", rows, "x", cols);
  if (!y || !b) return invalid_argument("cuda broadcast_rows: null argument");
  if (rows == 0) return Status::ok();
  broadcast_rows_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, stream_of(ctx)>>>(y, b, rows, cols);
  return ctx.check_launch("broadcast_rows");
}

Status embedding_f32(CudaContext& ctx, const EmbeddingF32Args& a) {
  if (a.n < 0 || a.vocab <= 0 || a.dim <= 0)
    return invalid_argument("cuda embedding_f32: bad shape n=", a.n, " vocab=", a.vocab, " dim=", a.dim);
  if (!a.tokens || !a.table || !a.out) return invalid_argument("cuda embedding_f32: null argument");
  if (a.n == 0) return Status::ok();
  embedding_f32_kernel<<<blocks_for(a.n * a.dim, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("embedding_f32");
}

Status decode_inputs(CudaContext& ctx, const DecodeInputsArgs& a) {
  const EmbeddingF32Args& e = a.embedding;
  const RopeTablesCudaArgs& r = a.rope;
  if (e.n < 0 || e.vocab <= 0 || e.dim <= 0 || r.n_tokens < 0 || r.half <= 0)
    return invalid_argument("cuda decode_inputs: bad shape n=", e.n, " vocab=", e.vocab, " dim=", e.dim,
                            " rope tokens=", r.n_tokens, " half=", r.half);
  if (!e.tokens || !e.table || !e.out || !r.inv_freq || !r.positions || !r.cos || !r.sin)
    return invalid_argument("cuda decode_inputs: null argument");
  const int64_t n = std::max(e.n * e.dim, r.n_tokens * r.half);
  if (n == 0) return Status::ok();
  LATHE_TRY(cuda_check(launch_overlapped(decode_inputs_kernel, dim3(blocks_for(n, kThreads)), dim3(kThreads),
                                         stream_of(ctx), a.overlap, e, r),
                       "decode_inputs launch"));
  return ctx.check_launch("decode_inputs");
}

Status residual_norm(CudaContext& ctx, const ResidualNormArgs& a) {
  if (a.rows < 0 || a.dim <= 0) return invalid_argument("cuda residual_norm: bad shape ", a.rows, "x", a.dim);
  if (!a.h || !a.w || !a.y) return invalid_argument("cuda residual_norm: null argument");
  if (a.bias && !a.delta) return invalid_argument("cuda residual_norm: a bias needs a delta");
  if (a.rows == 0) return Status::ok();
  const int threads = a.rows <= 132 && a.dim >= 2048 ? 1024 : kThreads;
  LATHE_TRY(cuda_check(launch_overlapped(residual_norm_kernel, dim3(static_cast<unsigned>(a.rows)), dim3(threads),
                                         stream_of(ctx), a.overlap, a),
                       "residual_norm launch"));
  return ctx.check_launch("residual_norm");
}

Status rope_append(CudaContext& ctx, const RopeAppendArgs& a) {
  if (a.head_dim <= 0 || a.head_dim % 2 != 0 || a.head_dim > kMaxHeadDim)
    return unsupported("cuda rope_append: head_dim ", a.head_dim, " (even sizes up to ", kMaxHeadDim, " are supported)");
  if (a.n_seqs < 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.max_ctx <= 0)
    return invalid_argument("cuda rope_append: bad shape seqs=", a.n_seqs, " heads=", a.n_head, "/", a.n_head_kv,
                            " max_ctx=", a.max_ctx);
  if (!a.qkv || !a.q_out || !a.k_caches || !a.v_caches || !a.pos || !a.cos || !a.sin)
    return invalid_argument("cuda rope_append: null argument");
  if (!a.q_norm != !a.k_norm) return invalid_argument("cuda rope_append: q_norm and k_norm go together");
  if (a.n_seqs == 0) return Status::ok();
  LATHE_TRY(cuda_check(launch_overlapped(rope_append_kernel, dim3(a.n_head + 2 * a.n_head_kv, a.n_seqs), dim3(32),
                                         stream_of(ctx), a.overlap, a),
                       "rope_append launch"));
  return ctx.check_launch("rope_append");
}

Status swiglu_rows(CudaContext& ctx, const SwigluRowsArgs& a) {
  if (a.rows < 0 || a.n <= 0) return invalid_argument("cuda swiglu_rows: bad shape ", a.rows, "x", a.n);
  if (!a.gu || !a.out) return invalid_argument("cuda swiglu_rows: null argument");
  if (a.rows == 0) return Status::ok();
  const bool vec = a.n % 4 == 0 && reinterpret_cast<uintptr_t>(a.gu) % 16 == 0;
  const int64_t threads = a.rows * a.n / (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>((threads + kThreads - 1) / kThreads));
  LATHE_TRY(cuda_check(vec ? launch_overlapped(swiglu_rows_kernel<4>, grid, dim3(kThreads), stream_of(ctx), a.overlap, a)
                           : launch_overlapped(swiglu_rows_kernel<1>, grid, dim3(kThreads), stream_of(ctx), a.overlap, a),
                       "swiglu_rows launch"));
  return ctx.check_launch("swiglu_rows");
}

bool supports_overlap(int device) {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
}

}  // namespace lathe::cuda
