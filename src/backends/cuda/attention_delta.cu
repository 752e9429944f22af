// The attention backward's first kernel: D = rowsum(dO ⊙ O), one f32 per
// (token, head), which the dq and dk/dv kernels read back per query tile.
// It is pure streaming (two bf16 tensors in, 4 bytes per row out), so the
// fast kernel is shaped for the memory system alone: head_dim / 8 lanes
// share a row with one 16-byte load each of dO and O, and a warp covers
// 256 / head_dim rows per access. The one-warp-per-row kernel it replaced
// (2-byte loads; ~30% of the bandwidth floor on the H200 in the 1B
// training step) stays as the simple path's and as the fallback for an out
// whose rows are not 16-byte aligned. The two sum in different orders
// (f32), so they agree to rounding, not to the bit; each is deterministic.
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"

namespace lathe::cuda {
namespace attn {
namespace {

// One warp per (token, head); lanes stride over head_dim.
__global__ void delta_kernel(BwdParams p, int d, int* turn) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= int64_t(p.n_tokens) * p.n_head) return;
  float s = 0.f;
  const int64_t t = row / p.n_head, h = row % p.n_head;
  const bf16* o = p.out + t * (p.ld_out ? p.ld_out : int64_t(p.n_head) * d) + h * d;
  for (int i = threadIdx.x % 32; i < d; i += 32)
    s += __bfloat162float(p.d_out[row * d + i]) * __bfloat162float(o[i]);
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (threadIdx.x % 32 == 0) {
    p.delta[row] = s;
    if (turn) turn[row] = 0;
  }
}

// D / 8 neighbouring lanes per row, 8 elements each: every lane sums its
// 8 products in order, then the row's lanes fold pairwise.
template <int D>
__global__ void delta_vec_kernel(BwdParams p, int* turn) {
  constexpr int kLanes = D / 8;
  static_assert(kLanes >= 1 && kLanes <= 32 && 32 % kLanes == 0, "delta_vec_kernel: head_dim / 8 must divide 32");
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int rows = p.n_tokens * p.n_head;  // < 2^31 (checked by the callers)
  const int row = int(i / kLanes), c = int(i % kLanes) * 8;
  float s = 0.f;
  if (row < rows) {
    const int t = row / p.n_head, h = row - t * p.n_head;
    const int64_t ld = p.ld_out ? p.ld_out : int64_t(p.n_head) * D;
    const uint4 dw = *reinterpret_cast<const uint4*>(p.d_out + int64_t(row) * D + c);
    const uint4 ow = *reinterpret_cast<const uint4*>(p.out + int64_t(t) * ld + h * D + c);
    const auto* dv = reinterpret_cast<const __nv_bfloat162*>(&dw);
    const auto* ov = reinterpret_cast<const __nv_bfloat162*>(&ow);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = __bfloat1622float2(dv[e]), b = __bfloat1622float2(ov[e]);
      s += a.x * b.x;
      s += a.y * b.y;
    }
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (row < rows && c == 0) {
    p.delta[row] = s;
    if (turn) turn[row] = 0;
  }
}

template <int D>
void launch_vec(const BwdParams& p, int* turn, cudaStream_t st) {
  constexpr int kThreads = 256;
  const int64_t threads = int64_t(p.n_tokens) * p.n_head * (D / 8);
  delta_vec_kernel<D><<<unsigned((threads + kThreads - 1) / kThreads), kThreads, 0, st>>>(p, turn);
}

}  // namespace

Status launch_delta(const BwdParams& p, int d, int* turn, bool simple, cudaStream_t st) {
  const bool vec = !simple && (d == 32 || d == 64 || d == 128) &&
                   (reinterpret_cast<uintptr_t>(p.out) & 15) == 0 && p.ld_out % 8 == 0;
  if (!vec) {
    const int rows = p.n_tokens * p.n_head;
    delta_kernel<<<(rows + 3) / 4, 128, 0, st>>>(p, d, turn);
  } else if (d == 32) {
    launch_vec<32>(p, turn, st);
  } else if (d == 64) {
    launch_vec<64>(p, turn, st);
  } else {
    launch_vec<128>(p, turn, st);
  }
  return cuda_check(cudaGetLastError(), "attention delta launch");
}

}  // namespace attn

Status attention_varlen_backward_delta(const AttentionVarlenBwdArgs& a) {
  const char* kName = "attention_varlen_backward_delta: ";
  if (!attn::head_dim_compiled(a.head_dim))
    return unsupported(kName, "head_dim ", a.head_dim, " is not compiled (" LATHE_ATTN_HEAD_DIMS " are)");
  if (a.n_tokens < 0 || a.n_head <= 0) return invalid_argument(kName, "bad shape tokens=", a.n_tokens, " heads=", a.n_head);
  if (int64_t(a.n_tokens) * a.n_head > INT32_MAX) return invalid_argument(kName, "n_tokens × n_head exceeds 2^31");
  if (a.ld_out != 0 && a.ld_out < int64_t(a.n_head) * a.head_dim)
    return invalid_argument(kName, "ld_out ", a.ld_out, " is shorter than a row (", int64_t(a.n_head) * a.head_dim, ")");
  if (!a.out || !a.d_out || !a.workspace) return invalid_argument(kName, "out, d_out and workspace must be set");
  if ((reinterpret_cast<uintptr_t>(a.d_out) & 15) != 0) return invalid_argument(kName, "d_out must be 16-byte aligned");
  if (a.n_tokens == 0) return Status::ok();
  attn::BwdParams p{};
  p.out = static_cast<const attn::bf16*>(a.out);
  p.d_out = static_cast<const attn::bf16*>(a.d_out);
  p.delta = static_cast<float*>(a.workspace);
  p.n_tokens = a.n_tokens;
  p.n_head = a.n_head;
  p.ld_out = a.ld_out;
  return attn::launch_delta(p, a.head_dim, nullptr, a.simple, static_cast<cudaStream_t>(a.stream));
}

}  // namespace lathe::cuda
