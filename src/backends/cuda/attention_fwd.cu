// Flash-style attention forward on tensor cores (mma.sync m16n8k16 bf16).
// One thread block takes 64 query rows of one head of one document; each of
// its four warps owns 16 rows and keeps their Q fragments, the fp32 output
// accumulator and the running max / sum in registers. K and V tiles of 64
// keys are staged in shared memory; S = Q·Kᵀ and O += P·V run on tensor
// cores, the softmax in fp32 in the exp2 domain. Only the key tiles a block
// can see (causal, window) are visited. The same kernel serves prefill into
// a KV cache: one sequence whose queries start at position q_pos0.
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"

#include <cmath>

namespace lathe::cuda {
namespace attn {

Status cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return error(StatusCode::kInternal, "cuda: ", what, ": ", cudaGetErrorString(err));
}

namespace {

template <int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(FwdParams p) {
  constexpr int kS = D + 8;  // shared row stride
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kBlockRows * kS;
  bf16* sV = sK + kBlockRows * kS;

  const int h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  int64_t q_base = 0, k_base = 0;
  int n_q = p.n_q, n_k = p.q_pos0 + p.n_q;
  if (p.cu) {
    q_base = k_base = p.cu[blockIdx.z];
    n_q = n_k = p.cu[blockIdx.z + 1] - p.cu[blockIdx.z];
  }
  const int i0 = blockIdx.x * kBlockRows;
  if (i0 >= n_q) return;

  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  const int row_a = i0 + warp * 16 + g, row_b = row_a + 8;  // local query rows of this thread
  const int pos_a = row_a + p.q_pos0, pos_b = row_b + p.q_pos0;
  const int last_row = min(i0 + kBlockRows, n_q) - 1;
  const int k_last = min(n_k - 1, last_row + p.q_pos0);
  const int k_first = p.window > 0 ? max(0, i0 + p.q_pos0 - p.window + 1) : 0;
  const float sl2 = p.scale * kLog2e;

  load_tile<D>(sQ, p.q, q_base, i0, n_q, p.n_head, h);
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(qf[kk], sQ, kS, warp * 16, kk * 16);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int kt = k_first; kt <= k_last; kt += kBlockRows) {
    __syncthreads();  // everyone is done with the previous K/V tile
    load_tile<D>(sK, p.k, k_base, kt, k_last + 1, p.n_head_kv, hk);
    load_tile<D>(sV, p.v, k_base, kt, k_last + 1, p.n_head_kv, hk);
    __syncthreads();

    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        uint32_t b[2];
        load_b_rows(b, sK, kS, n * 8, kk * 16);
        mma_bf16(s[n], qf[kk], b);
      }

    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kt + n * 8 + 2 * c + (e & 1);
        const bool vis = visible(j, e < 2 ? pos_a : pos_b, n_k, p.window);
        s[n][e] = vis ? s[n][e] * sl2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      base[r] = m_new == -INFINITY ? 0.f : m_new;
      alpha[r] = exp2f(m[r] - base[r]);  // 0 when m was -inf
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - base[e / 2]);
        l[e / 2] += s[n][e];
      }
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      o[dn][0] *= alpha[0];
      o[dn][1] *= alpha[0];
      o[dn][2] *= alpha[1];
      o[dn][3] *= alpha[1];
    }
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      uint32_t a[4];
      c_to_a(a, s, kc);
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        uint32_t b[2];
        load_b_cols(b, sV, kS, kc * 16, dn * 8);
        mma_bf16(o[dn], a, b);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    const float sum = quad_sum(l[r]);
    if (row >= n_q) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    bf16* dst = p.out + ((q_base + row) * p.n_head + h) * D + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
      *reinterpret_cast<__nv_bfloat162*>(dst + dn * 8) =
          __floats2bfloat162_rn(o[dn][2 * r] * inv, o[dn][2 * r + 1] * inv);
    if (p.lse && c == 0) p.lse[(q_base + row) * p.n_head + h] = sum > 0.f ? (m[r] + log2f(sum)) * kLn2 : -INFINITY;
  }
}

template <int D>
Status launch(const FwdParams& p, void* stream) {
  const int smem = 3 * kBlockRows * (D + 8) * int(sizeof(bf16));
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(flash_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                       "cudaFuncSetAttribute(flash_forward)"));
  const dim3 grid((p.max_q + kBlockRows - 1) / kBlockRows, p.n_head, p.cu ? p.n_docs : 1);
  flash_forward_kernel<D><<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  return cuda_check(cudaGetLastError(), "flash_forward launch");
}

}  // namespace

Status launch_flash_forward(const FwdParams& p, void* stream) {
  if (p.max_q <= 0) return Status::ok();
  return p.head_dim == 64 ? launch<64>(p, stream) : launch<128>(p, stream);
}

}  // namespace attn

namespace {
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
}  // namespace

Status attention_varlen_forward(const AttentionVarlenFwdArgs& a) {
  if (a.head_dim != 64 && a.head_dim != 128)
    return unsupported("attention_varlen_forward: head_dim ", a.head_dim, " is not compiled (64 and 128 are)");
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    return invalid_argument("attention_varlen_forward: n_head ", a.n_head, " is not a multiple of n_head_kv ",
                            a.n_head_kv);
  if (a.n_docs < 0 || a.max_seqlen < 0 || a.n_tokens < 0 || a.window < 0)
    return invalid_argument("attention_varlen_forward: negative n_docs, max_seqlen, n_tokens or window");
  if (a.n_tokens == 0 || a.n_docs == 0) return Status::ok();
  if (!a.q || !a.k || !a.v || !a.out || !a.cu_seqlens)
    return invalid_argument("attention_varlen_forward: q, k, v, out and cu_seqlens must be set");
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v) || !aligned16(a.out))
    return invalid_argument("attention_varlen_forward: q, k, v and out must be 16-byte aligned");
  attn::FwdParams p{static_cast<const attn::bf16*>(a.q), static_cast<const attn::bf16*>(a.k),
                    static_cast<const attn::bf16*>(a.v), static_cast<attn::bf16*>(a.out), a.lse, a.cu_seqlens,
                    a.n_docs, a.max_seqlen, 0, 0, a.n_head, a.n_head_kv, a.head_dim, a.window, a.scale};
  return attn::launch_flash_forward(p, a.stream);
}

}  // namespace lathe::cuda
