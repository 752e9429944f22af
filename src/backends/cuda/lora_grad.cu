// The LoRA factor gradients (lora_ops.h: lora_grad_reduce): products whose
// reduction runs over the tokens, C[r, n] = Σ_t (L_hi + L_lo)[t, :]ᵀ·R[t, :],
// skinny in r (a LoRA rank) and long in K (thousands of tokens), which a
// general GEMM tiles badly. Here a thread block owns all r rows (up to 64;
// more are further blocks) and 128 columns of one member, and a slice of
// the tokens; the slices' f32 partials go to a workspace in the output's own
// layout and one elementwise pass sums them in a fixed order into the
// gradient (deterministic, no atomics). All members of a group share one
// launch; blocks of the same column tile of different members are adjacent,
// so an R they share (the group's input x, for dA) is read from DRAM once.
//
// Both operands are token-major in memory ([t][j], [t][n]), so the m16n8k16
// fragments come through ldmatrix.trans from shared tiles of 32 tokens,
// filled three deep through cp.async (or by plain copies when a row offset
// is not 16-byte aligned: the small ranks of the test models). The hi and
// lo terms keep separate f32 accumulators, summed once at the end, as a
// GEMM writing them to separate columns would.
#include <algorithm>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/context_impl.h"
#include "backends/cuda/lora_ops.h"

namespace lathe::cuda {
namespace {

using attn::bf16;

constexpr int kThreads = 128;  // four warps, 32 columns each
constexpr int kTok = 32;       // tokens per pipeline stage
constexpr int kCols = 128;     // columns of R per block
constexpr int kStages = 3;
constexpr int kRPad = kCols + 8;

// Shared tiles for kMT 16-row tiles of r: [stage][token][hi block | lo block]
// and [stage][token][column], rows padded by 8 elements (ldmatrix rows fall
// in different banks).
template <int kMT>
struct Tiles {
  static constexpr int kLW = 2 * kMT * 16;
  static constexpr int kLPad = kLW + 8;
  static constexpr int kL = kStages * kTok * kLPad;
  static constexpr int kR = kStages * kTok * kRPad;
  static constexpr size_t kBytes = size_t(kL + kR) * sizeof(bf16);
};

struct GradParams {
  LoraGradArgs a;
  int64_t chunk = 0;  // tokens per split
  int64_t e_total = 0;
  int64_t off[kLoraMaxMembers + 1] = {};  // each member's first value in the workspace
  bool vec_l = false, vec_r = false;
  bool direct = false;  // one split: write the gradient, no workspace
};

// Stage s of L: tokens t0.., rows m0 .. m0 + 16·kMT of the hi and lo terms.
template <int kMT>
__device__ __forceinline__ void stage_l(bf16* s, const GradParams& p, const bf16* l, int64_t t0, int64_t m0) {
  using Tl = Tiles<kMT>;
  const int64_t r = p.a.r, T = p.a.tokens;
  if (p.vec_l) {
    constexpr int kChunks = Tl::kLW / 8;  // per token
    for (int i = threadIdx.x; i < kTok * kChunks; i += kThreads) {
      const int row = i / kChunks, ci = i % kChunks, block = ci / (2 * kMT), jj = (ci % (2 * kMT)) * 8;
      const int64_t t = t0 + row, j = m0 + jj;
      const bool valid = t < T && j < r;
      const bf16* src = valid ? l + t * p.a.ldl + block * r + j : l;
      attn::cp_async16(s + row * Tl::kLPad + block * kMT * 16 + jj, src, valid);
    }
    return;
  }
  for (int i = threadIdx.x; i < kTok * Tl::kLW; i += kThreads) {
    const int row = i / Tl::kLW, col = i % Tl::kLW, block = col / (kMT * 16), jj = col % (kMT * 16);
    const int64_t t = t0 + row, j = m0 + jj;
    s[row * Tl::kLPad + col] = t < T && j < r ? l[t * p.a.ldl + block * r + j] : __float2bfloat16_rn(0.0f);
  }
}

// Stage s of R: tokens t0.., columns n0 .. n0 + 128 of a member with n columns.
__device__ __forceinline__ void stage_r(bf16* s, const GradParams& p, const bf16* rhs, int64_t n, int64_t t0,
                                        int64_t n0) {
  const int64_t T = p.a.tokens;
  if (p.vec_r) {
    constexpr int kChunks = kCols / 8;
    for (int i = threadIdx.x; i < kTok * kChunks; i += kThreads) {
      const int row = i / kChunks, c = (i % kChunks) * 8;
      const int64_t t = t0 + row, col = n0 + c;
      const bool valid = t < T && col < n;
      attn::cp_async16(s + row * kRPad + c, valid ? rhs + t * p.a.ldr + col : rhs, valid);
    }
    return;
  }
  for (int i = threadIdx.x; i < kTok * kCols; i += kThreads) {
    const int row = i / kCols, c = i % kCols;
    const int64_t t = t0 + row, col = n0 + c;
    s[row * kRPad + c] = t < T && col < n ? rhs[t * p.a.ldr + col] : __float2bfloat16_rn(0.0f);
  }
}

// acc_h += L_hiᵀ·R, acc_l += L_loᵀ·R over one stage's 32 tokens; the warp's
// columns are w·32 .. w·32 + 32.
template <int kMT>
__device__ __forceinline__ void stage_mma(const bf16* sl, const bf16* sr, float (&acc_h)[kMT][4][4],
                                          float (&acc_l)[kMT][4][4]) {
  using Tl = Tiles<kMT>;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, q = lane / 8;
#pragma unroll
  for (int kk = 0; kk < kTok; kk += 16) {
    uint32_t ah[kMT][4], al[kMT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      // A[m][k] = L[k][m]: matrices (k0, m0), (k0, m0+8), (k0+8, m0), (k0+8, m0+8) transposed.
      const bf16* row = sl + (kk + (q / 2) * 8 + lane % 8) * Tl::kLPad + mi * 16 + (q % 2) * 8;
      attn::ldmatrix_x4_trans(ah[mi], row);
      attn::ldmatrix_x4_trans(al[mi], row + kMT * 16);
    }
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      uint32_t b0[2], b1[2];
      attn::load_b_cols_x2(b0, b1, sr, kRPad, kk, w * 32 + nb * 16);
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        attn::mma_bf16(acc_h[mi][2 * nb], ah[mi], b0);
        attn::mma_bf16(acc_h[mi][2 * nb + 1], ah[mi], b1);
        attn::mma_bf16(acc_l[mi][2 * nb], al[mi], b0);
        attn::mma_bf16(acc_l[mi][2 * nb + 1], al[mi], b1);
      }
    }
  }
}

// Block (x = column tile · members + member, y = token split, z = row chunk).
template <int kMT>
__global__ void __launch_bounds__(kThreads) grad_kernel(GradParams p) {
  using Tl = Tiles<kMT>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sl = reinterpret_cast<bf16*>(smem);
  bf16* sr = sl + Tl::kL;
  const int nm = p.a.n_members, k = int(blockIdx.x) % nm;
  const LoraGradMember& mem = p.a.members[k];
  const int64_t n = mem.n, n0 = int64_t(blockIdx.x / nm) * kCols, m0 = int64_t(blockIdx.z) * kMT * 16;
  if (n0 >= n) return;
  const bf16* l = reinterpret_cast<const bf16*>(mem.l);
  const bf16* rhs = reinterpret_cast<const bf16*>(mem.rhs);
  const int64_t t_begin = int64_t(blockIdx.y) * p.chunk;
  const int64_t t_end = std::min<int64_t>(p.a.tokens, t_begin + p.chunk);
  const int steps = int((t_end - t_begin + kTok - 1) / kTok);

  float acc_h[kMT][4][4] = {}, acc_l[kMT][4][4] = {};
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < steps) {
      stage_l<kMT>(sl + st * kTok * Tl::kLPad, p, l, t_begin + st * kTok, m0);
      stage_r(sr + st * kTok * kRPad, p, rhs, n, t_begin + st * kTok, n0);
    }
    attn::cp_async_commit();
  }
  for (int it = 0; it < steps; ++it) {
    attn::cp_async_wait_one();  // stage `it` has landed (one newer group may be in flight)
    __syncthreads();            // ... for every thread, and stage it − 1's buffer is free
    const int next = it + kStages - 1;
    if (next < steps) {
      const int b = next % kStages;
      stage_l<kMT>(sl + b * kTok * Tl::kLPad, p, l, t_begin + next * kTok, m0);
      stage_r(sr + b * kTok * kRPad, p, rhs, n, t_begin + next * kTok, n0);
    }
    attn::cp_async_commit();
    const int b = it % kStages;
    stage_mma<kMT>(sl + b * kTok * Tl::kLPad, sr + b * kTok * kRPad, acc_h, acc_l);
  }

  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int64_t r = p.a.r;
  float* ws = p.direct ? nullptr : p.a.workspace + int64_t(blockIdx.y) * p.e_total + p.off[k];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = m0 + mi * 16 + g + (e / 2) * 8, col = n0 + w * 32 + ni * 8 + 2 * c + e % 2;
        if (j >= r || col >= n) continue;
        const float v = acc_h[mi][ni][e] + acc_l[mi][ni][e];
        const int64_t idx = p.a.transposed ? col * r + j : j * n + col;
        if (p.direct) {
          mem.out[idx] = p.a.accumulate ? mem.out[idx] + p.a.scale * v : p.a.scale * v;
        } else {
          ws[idx] = v;
        }
      }
}

// out (+)= scale · Σ_split workspace, value by value in a fixed order.
__global__ void grad_sum_kernel(GradParams p, int n_splits) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < p.e_total;
       e += int64_t(gridDim.x) * blockDim.x) {
    int k = 0;
    while (e >= p.off[k + 1]) ++k;
    float v = 0.0f;
    for (int s = 0; s < n_splits; ++s) v += p.a.workspace[int64_t(s) * p.e_total + e];
    float* o = p.a.members[k].out + (e - p.off[k]);
    *o = p.a.accumulate ? *o + p.a.scale * v : p.a.scale * v;
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

Status check_grad_args(const LoraGradArgs& a) {
  if (a.n_members < 1 || a.n_members > kLoraMaxMembers)
    return invalid_argument("cuda lora_grad_reduce: ", a.n_members, " members (1 to ", kLoraMaxMembers, ")");
  if (a.r <= 0 || a.tokens <= 0 || a.ldl < 2 * a.r || a.workspace_floats < 0)
    return invalid_argument("cuda lora_grad_reduce: bad shape r=", a.r, " tokens=", a.tokens, " ldl=", a.ldl);
  for (int k = 0; k < a.n_members; ++k) {
    const LoraGradMember& m = a.members[k];
    if (m.n <= 0 || a.ldr < m.n)
      return invalid_argument("cuda lora_grad_reduce: member ", k, " has ", m.n, " columns, row stride ", a.ldr);
    if (!m.l || !m.rhs || !m.out) return invalid_argument("cuda lora_grad_reduce: null pointer in member ", k);
  }
  return Status::ok();
}

int sm_count(int device) {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) return 108;
  return n;
}

// Splits the tokens so that the blocks fill the GPU once (as many as fit
// at a time: the work per block is even, so a partial second wave would
// only add a tail), with no more partials than the workspace holds; then
// the launch and, with more than one split, the sum.
template <int kMT>
Status launch_grad(CudaContext& ctx, GradParams& p, int64_t grid_x, int64_t tiles, int64_t m_chunks) {
  static const cudaError_t attr = cudaFuncSetAttribute(grad_kernel<kMT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       int(Tiles<kMT>::kBytes));
  LATHE_CU_TRY(attr);
  static const int per_sm = [] {
    int n = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, grad_kernel<kMT>, kThreads,
                                                                        Tiles<kMT>::kBytes);
    return e == cudaSuccess && n > 0 ? n : 1;
  }();
  const LoraGradArgs& a = p.a;
  const int64_t wave = int64_t(per_sm) * sm_count(ctx.device());
  int64_t splits = std::max<int64_t>(1, wave / (tiles * m_chunks));
  splits = std::min(splits, (a.tokens + kTok - 1) / kTok);
  splits = a.workspace ? std::min(splits, a.workspace_floats / std::max<int64_t>(p.e_total, 1)) : 1;
  splits = std::max<int64_t>(splits, 1);
  p.chunk = ((a.tokens + splits - 1) / splits + kTok - 1) / kTok * kTok;
  splits = (a.tokens + p.chunk - 1) / p.chunk;
  p.direct = splits == 1;
  if (grid_x > int64_t(INT32_MAX) || splits > 65535 || m_chunks > 65535)
    return unsupported("cuda lora_grad_reduce: grid too large (", grid_x, " x ", splits, ")");
  const dim3 grid{unsigned(grid_x), unsigned(splits), unsigned(m_chunks)};
  grad_kernel<kMT><<<grid, kThreads, Tiles<kMT>::kBytes, stream_of(ctx)>>>(p);
  LATHE_TRY(ctx.check_launch("lora_grad_reduce"));
  if (p.direct) return Status::ok();
  const unsigned blocks = std::min<unsigned>(blocks_for(p.e_total, 256), 4096);
  grad_sum_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(p, int(splits));
  return ctx.check_launch("lora_grad_reduce (sum)");
}

}  // namespace

Status lora_grad_reduce(CudaContext& ctx, const LoraGradArgs& a) {
  LATHE_TRY(check_grad_args(a));
  GradParams p{.a = a};
  const int nm = a.n_members;
  int64_t max_tiles = 0, tiles = 0;
  p.vec_l = a.r % 8 == 0 && a.ldl % 8 == 0;
  p.vec_r = a.ldr % 8 == 0;
  for (int k = 0; k < nm; ++k) {
    const LoraGradMember& m = a.members[k];
    p.off[k + 1] = p.off[k] + a.r * m.n;
    max_tiles = std::max(max_tiles, (m.n + kCols - 1) / kCols);
    tiles += (m.n + kCols - 1) / kCols;
    p.vec_l = p.vec_l && aligned16(m.l);
    p.vec_r = p.vec_r && m.n % 8 == 0 && aligned16(m.rhs);
  }
  for (int k = nm + 1; k <= kLoraMaxMembers; ++k) p.off[k] = p.off[nm];
  p.e_total = p.off[nm];
  const int mt = int(std::min<int64_t>(4, (a.r + 15) / 16));
  const int64_t m_chunks = (a.r + mt * 16 - 1) / (mt * 16), grid_x = max_tiles * nm;
  switch (mt) {
    case 1: return launch_grad<1>(ctx, p, grid_x, tiles, m_chunks);
    case 2: return launch_grad<2>(ctx, p, grid_x, tiles, m_chunks);
    case 3: return launch_grad<3>(ctx, p, grid_x, tiles, m_chunks);
    default: return launch_grad<4>(ctx, p, grid_x, tiles, m_chunks);
  }
}

}  // namespace lathe::cuda
