// The fused-projection kernels of train_fused.h. The q|k|v split and merge
// take one warp per token with 16-byte loads and stores when head_dim is a
// multiple of 16 dividing 512 and the pointers are 16-byte aligned (the
// trainer's case; QkvSplitArgs::thread_per_8_pairs: the earlier kernel,
// one thread per (token, head, 8 rotation pairs)), else one thread per
// (token, head, pair); all
// rotate with vec8.cuh's rotate (the products rounded, no fused
// multiply-add). SwiGLU on [gate | up] rows takes one thread per 8 features
// (16-byte loads and stores; the trainer's sizes are multiples of 8), else
// one per feature.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/train_fused.h"
#include "backends/cuda/vec8.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

// Where head slot h (of n_head + 2·n_head_kv: q heads, k heads, v heads)
// of token t moves: from its place in the fused row (rows `row` apart) to
// its dense tensor (split), or back (merge).
struct QkvMove {
  const bf16_bits* src;
  bf16_bits* dst;
  int64_t from, to;
};
template <bool kMerge>
__device__ __forceinline__ QkvMove qkv_move(const QkvSplitArgs& a, int64_t t, int64_t h, int64_t row) {
  bf16_bits* dense;
  int64_t head, heads;
  if (h < a.n_head) {
    dense = a.q, head = h, heads = a.n_head;
  } else if (h < a.n_head + a.n_head_kv) {
    dense = a.k, head = h - a.n_head, heads = a.n_head_kv;
  } else {
    dense = a.v, head = h - a.n_head - a.n_head_kv, heads = a.n_head_kv;
  }
  const int64_t fused = t * row + h * a.head_dim, plain = (t * heads + head) * a.head_dim;
  return kMerge ? QkvMove{dense, a.qkv, plain, fused} : QkvMove{a.qkv, dense, fused, plain};
}

// Thread i: token t, head slot h, pair p of hd / 2. Elements p and p + half
// of that head.
template <bool kMerge>
__global__ void qkv_kernel(QkvSplitArgs a) {
  const int64_t half = a.head_dim / 2, slots = a.n_head + 2 * a.n_head_kv;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * slots * half) return;
  const int64_t p = i % half, th = i / half, t = th / slots, h = th % slots;
  const QkvMove m = qkv_move<kMerge>(a, t, h, a.ld_qkv ? a.ld_qkv : slots * a.head_dim);
  float x1 = dev::ld(m.src, m.from + p), x2 = dev::ld(m.src, m.from + p + half);
  if (a.cos && h < a.n_head + a.n_head_kv) {
    const float c = a.cos[t * half + p];
    const float s = kMerge ? -a.sin[t * half + p] : a.sin[t * half + p];
    dev::rotate(x1, x2, c, s, &x1, &x2);
  }
  dev::st(m.dst, m.to + p, x1);
  dev::st(m.dst, m.to + p + half, x2);
}

// Pairs p..p + 7 of head slot h of token t, rotated by c, s when rotate.
template <bool kMerge>
__device__ __forceinline__ void qkv_move8(const QkvMove& m, int64_t p, int64_t half, bool rotate,
                                          const float (&c)[8], const float (&s)[8]) {
  float x1[8], x2[8];
  dev::ld8(m.src, m.from + p, x1);
  dev::ld8(m.src, m.from + p + half, x2);
  if (rotate) {
#pragma unroll
    for (int e = 0; e < 8; ++e) dev::rotate(x1[e], x2[e], c[e], kMerge ? -s[e] : s[e], &x1[e], &x2[e]);
  }
  dev::st8(m.dst, m.to + p, x1);
  dev::st8(m.dst, m.to + p + half, x2);
}

// As qkv_kernel with thread i owning pairs p..p + 7 of its head.
template <bool kMerge>
__global__ void qkv_kernel8(QkvSplitArgs a) {
  const int64_t half = a.head_dim / 2, per = half / 8, slots = a.n_head + 2 * a.n_head_kv;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * slots * per) return;
  const int64_t p = i % per * 8, th = i / per, t = th / slots, h = th % slots;
  const QkvMove m = qkv_move<kMerge>(a, t, h, a.ld_qkv ? a.ld_qkv : slots * a.head_dim);
  const bool rotate = a.cos && h < a.n_head + a.n_head_kv;
  float c[8], s[8];
  if (rotate) {
    dev::ld8(a.cos, t * half + p, c);
    dev::ld8(a.sin, t * half + p, s);
  }
  qkv_move8<kMerge>(m, p, half, rotate, c, s);
}

// One warp per token: head_dim / 16 neighbouring lanes share a head (8
// pairs each, 16-byte loads and stores), the warp's 32 / (head_dim / 16)
// heads side by side, stepping over the row's heads. A lane loads its cos
// and sin once per token for every head it rotates (qkv_kernel8 reloaded
// them per head: as many table bytes as data bytes through L1) and no
// index needs a 64-bit division. The arithmetic is qkv_kernel8's: the same
// bits.
template <bool kMerge>
__global__ void qkv_warp_kernel(QkvSplitArgs a) {
  const int per = int(a.head_dim / 16), lane = int(threadIdx.x % 32);
  const int heads_per_pass = 32 / per, j = lane / per;
  const int64_t half = a.head_dim / 2, p = (lane % per) * 8;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= a.n_tokens || j >= heads_per_pass) return;
  const int slots = int(a.n_head + 2 * a.n_head_kv), n_qk = int(a.n_head + a.n_head_kv);
  const int64_t row = a.ld_qkv ? a.ld_qkv : slots * a.head_dim;
  float c[8], s[8];
  if (a.cos) {
    dev::ld8(a.cos, t * half + p, c);
    dev::ld8(a.sin, t * half + p, s);
  }
  for (int h = j; h < slots; h += heads_per_pass)
    qkv_move8<kMerge>(qkv_move<kMerge>(a, t, h, row), p, half, a.cos && h < n_qk, c, s);
}

using dev::Bf16x8;

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__global__ void swiglu_rows_fwd(SwigluRowsArgs a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.inter) return;
  const int64_t t = i / a.inter, f = i % a.inter, base = t * (a.ld_gu ? a.ld_gu : 2 * a.inter) + f;
  dev::st(a.out, t * (a.ld_out ? a.ld_out : a.inter) + f, silu_times(dev::ld(a.gu, base), dev::ld(a.gu, base + a.inter)));
}

__global__ void swiglu_rows_fwd8(SwigluRowsArgs a) {
  const int64_t per_row = a.inter / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * per_row) return;
  const int64_t t = i / per_row, f = (i % per_row) * 8, base = t * (a.ld_gu ? a.ld_gu : 2 * a.inter) + f;
  Bf16x8 g, u, o;
  g.word = *reinterpret_cast<const uint4*>(a.gu + base);
  u.word = *reinterpret_cast<const uint4*>(a.gu + base + a.inter);
  for (int k = 0; k < 8; ++k)
    o.h[k] = __float2bfloat16_rn(silu_times(__bfloat162float(g.h[k]), __bfloat162float(u.h[k])));
  *reinterpret_cast<uint4*>(a.out + t * (a.ld_out ? a.ld_out : a.inter) + f) = o.word;
}

// d_gate and d_up of one feature (swiglu.cu's formulas).
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float* dg, float* du) {
  const float s = 1.0f / (1.0f + expf(-g));
  *du = d * g * s;
  *dg = d * u * s * (1.0f + g * (1.0f - s));
}

__global__ void swiglu_rows_bwd(SwigluRowsBackwardArgs a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.inter) return;
  const int64_t t = i / a.inter, f = i % a.inter, base = t * (a.ld_gu ? a.ld_gu : 2 * a.inter) + f;
  const int64_t dbase = t * (a.ld_d_gu ? a.ld_d_gu : 2 * a.inter) + f;
  float dg, du;
  swiglu_grad(dev::ld(a.gu, base), dev::ld(a.gu, base + a.inter), dev::ld(a.d_out, i), &dg, &du);
  dev::st(a.d_gu, dbase + a.inter, du);
  dev::st(a.d_gu, dbase, dg);
}

__global__ void swiglu_rows_bwd8(SwigluRowsBackwardArgs a) {
  const int64_t per_row = a.inter / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * per_row) return;
  const int64_t t = i / per_row, f = (i % per_row) * 8, base = t * (a.ld_gu ? a.ld_gu : 2 * a.inter) + f;
  const int64_t dbase = t * (a.ld_d_gu ? a.ld_d_gu : 2 * a.inter) + f;
  Bf16x8 g, u, d, og, ou;
  g.word = *reinterpret_cast<const uint4*>(a.gu + base);
  u.word = *reinterpret_cast<const uint4*>(a.gu + base + a.inter);
  d.word = *reinterpret_cast<const uint4*>(a.d_out + t * a.inter + f);
  for (int k = 0; k < 8; ++k) {
    float dg, du;
    swiglu_grad(__bfloat162float(g.h[k]), __bfloat162float(u.h[k]), __bfloat162float(d.h[k]), &dg, &du);
    og.h[k] = __float2bfloat16_rn(dg);
    ou.h[k] = __float2bfloat16_rn(du);
  }
  *reinterpret_cast<uint4*>(a.d_gu + dbase) = og.word;
  *reinterpret_cast<uint4*>(a.d_gu + dbase + a.inter) = ou.word;
}

// 16-byte accesses need every row start aligned.
bool vec8_ok(const void* p, const void* q, const void* r, int64_t inter) {
  auto al = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  return inter % 8 == 0 && al(p) && al(q) && al(r);
}

Status check_qkv(const QkvSplitArgs& a, const char* what) {
  if (a.n_tokens < 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.head_dim <= 0 || a.head_dim % 2 != 0)
    return invalid_argument("cuda ", what, ": bad shape tokens=", a.n_tokens, " heads=", a.n_head, "/", a.n_head_kv,
                            " head_dim=", a.head_dim);
  if (!a.qkv || !a.q || !a.k || !a.v || (a.cos == nullptr) != (a.sin == nullptr))
    return invalid_argument("cuda ", what, ": null argument");
  if (a.ld_qkv != 0 && a.ld_qkv < (a.n_head + 2 * a.n_head_kv) * a.head_dim)
    return invalid_argument("cuda ", what, ": ld_qkv ", a.ld_qkv, " is shorter than a row");
  return Status::ok();
}

template <bool kMerge>
Status launch_qkv(CudaContext& ctx, const QkvSplitArgs& a, const char* what) {
  LATHE_TRY(check_qkv(a, what));
  const int64_t n = a.n_tokens * (a.n_head + 2 * a.n_head_kv) * (a.head_dim / 2);
  if (n == 0) return Status::ok();
  if (a.head_dim % 16 == 0 && a.ld_qkv % 8 == 0 && aligned16(a.qkv, a.q, a.k, a.v, a.cos, a.sin)) {
    if (!a.thread_per_8_pairs && 32 % (a.head_dim / 16) == 0)
      qkv_warp_kernel<kMerge><<<blocks_for(a.n_tokens, kThreads / 32), kThreads, 0, stream_of(ctx)>>>(a);
    else
      qkv_kernel8<kMerge><<<blocks_for(n / 8, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    qkv_kernel<kMerge><<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch(what);
}

}  // namespace

Status qkv_split(CudaContext& ctx, const QkvSplitArgs& a) { return launch_qkv<false>(ctx, a, "qkv_split"); }
Status qkv_merge(CudaContext& ctx, const QkvSplitArgs& a) { return launch_qkv<true>(ctx, a, "qkv_merge"); }

Status swiglu_rows_forward(CudaContext& ctx, const SwigluRowsArgs& a) {
  if (a.n_tokens < 0 || a.inter < 0) return invalid_argument("cuda swiglu_rows: negative size");
  const int64_t n = a.n_tokens * a.inter;
  if (n == 0) return Status::ok();
  if (!a.gu || !a.out) return invalid_argument("cuda swiglu_rows: null argument");
  if ((a.ld_gu && a.ld_gu < 2 * a.inter) || (a.ld_out && a.ld_out < a.inter))
    return invalid_argument("cuda swiglu_rows: row stride shorter than a row (ld_gu ", a.ld_gu, ", ld_out ", a.ld_out,
                            ", inter ", a.inter, ")");
  if (vec8_ok(a.gu, a.out, a.out, a.inter) && a.ld_gu % 8 == 0 && a.ld_out % 8 == 0) {
    swiglu_rows_fwd8<<<blocks_for(n / 8, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    swiglu_rows_fwd<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("swiglu_rows_fwd");
}

Status swiglu_rows_backward(CudaContext& ctx, const SwigluRowsBackwardArgs& a) {
  if (a.n_tokens < 0 || a.inter < 0) return invalid_argument("cuda swiglu_rows_backward: negative size");
  const int64_t n = a.n_tokens * a.inter;
  if (n == 0) return Status::ok();
  if (!a.gu || !a.d_out || !a.d_gu) return invalid_argument("cuda swiglu_rows_backward: null argument");
  if ((a.ld_gu && a.ld_gu < 2 * a.inter) || (a.ld_d_gu && a.ld_d_gu < 2 * a.inter))
    return invalid_argument("cuda swiglu_rows_backward: row stride shorter than a row (ld_gu ", a.ld_gu,
                            ", ld_d_gu ", a.ld_d_gu, ", inter ", a.inter, ")");
  if (static_cast<const void*>(a.gu) == a.d_gu && a.ld_gu != a.ld_d_gu)
    return invalid_argument("cuda swiglu_rows_backward: d_gu aliases gu with another row stride");
  if (vec8_ok(a.gu, a.d_out, a.d_gu, a.inter) && a.ld_gu % 8 == 0 && a.ld_d_gu % 8 == 0) {
    swiglu_rows_bwd8<<<blocks_for(n / 8, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    swiglu_rows_bwd<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("swiglu_rows_bwd");
}

}  // namespace lathe::cuda
