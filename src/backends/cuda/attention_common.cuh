// Shared pieces of the attention kernels: the m16n8k16 bf16 tensor-core
// instruction and the fragment loads from shared memory it needs, written
// once so the forward, backward and decode kernels agree on the layouts.
//
// Fragment layout of mma.sync.m16n8k16 (g = lane / 4, c = lane % 4):
//   A (16×16, row-major): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16×8, k × n):      b0 (k 2c..2c+1, n g), b1 (k 2c+8..2c+9, n g)
//   C (16×8, f32):        c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// The lower 16 bits of a packed register hold the element of smaller index.
// Shared tiles are row-major bf16 with a row stride of head_dim + 8 elements
// so the 8 rows a fragment load touches fall in different banks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention.h"
#include "core/status.h"

namespace lathe::cuda::attn {

constexpr int kBlockRows = 64;  // query rows (or keys) per thread block
constexpr int kThreads = 128;   // four warps of 16 rows each
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_raw(bf16 lo, bf16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}

// A fragment of the 16×16 block at (row0, col0) of a row-major tile.
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16* s, int stride, int row0, int col0) {
  const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  const bf16* p = s + (row0 + g) * stride + col0 + 2 * c;
  a[0] = *reinterpret_cast<const uint32_t*>(p);
  a[1] = *reinterpret_cast<const uint32_t*>(p + 8 * stride);
  a[2] = *reinterpret_cast<const uint32_t*>(p + 8);
  a[3] = *reinterpret_cast<const uint32_t*>(p + 8 * stride + 8);
}

// B fragment where B[k][n] = M[n0 + n][k0 + k] (M row-major, its rows are
// the n index: the K of Q·Kᵀ): two contiguous pairs.
__device__ __forceinline__ void load_b_rows(uint32_t b[2], const bf16* s, int stride, int n0, int k0) {
  const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  const bf16* p = s + (n0 + g) * stride + k0 + 2 * c;
  b[0] = *reinterpret_cast<const uint32_t*>(p);
  b[1] = *reinterpret_cast<const uint32_t*>(p + 8);
}

// B fragment where B[k][n] = M[k0 + k][n0 + n] (the V of P·V): pairs down a
// column, gathered element by element.
__device__ __forceinline__ void load_b_cols(uint32_t b[2], const bf16* s, int stride, int k0, int n0) {
  const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  const bf16* p = s + (k0 + 2 * c) * stride + n0 + g;
  b[0] = pack_raw(p[0], p[stride]);
  b[1] = pack_raw(p[8 * stride], p[9 * stride]);
}

// ldmatrix: the same fragments in one instruction for two 8-wide n tiles.
// Lanes 8i..8i+7 give the row addresses of 8×8 matrix i; each lane receives
// (row g, columns 2c..2c+1) of every matrix, or with .trans (rows 2c..2c+1,
// column g). Row addresses must be 16-byte aligned (the padded stride is).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// load_b_rows for the n tiles n0 and n0 + 8 at once: matrices (n0, k0),
// (n0, k0+8), (n0+8, k0), (n0+8, k0+8).
__device__ __forceinline__ void load_b_rows_x2(uint32_t b0[2], uint32_t b1[2], const bf16* s, int stride, int n0,
                                               int k0) {
  const int lane = threadIdx.x % 32, mi = lane / 8;
  uint32_t r[4];
  ldmatrix_x4(r, s + (n0 + (mi / 2) * 8 + lane % 8) * stride + k0 + (mi % 2) * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// load_b_cols for the n tiles n0 and n0 + 8 at once: transposed matrices
// (k0, n0), (k0+8, n0), (k0, n0+8), (k0+8, n0+8).
__device__ __forceinline__ void load_b_cols_x2(uint32_t b0[2], uint32_t b1[2], const bf16* s, int stride, int k0,
                                               int n0) {
  const int lane = threadIdx.x % 32, mi = lane / 8;
  uint32_t r[4];
  ldmatrix_x4_trans(r, s + (k0 + (mi % 2) * 8 + lane % 8) * stride + n0 + (mi / 2) * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// load_a through ldmatrix: matrices (row0, col0), (row0+8, col0),
// (row0, col0+8), (row0+8, col0+8) land in a0..a3.
__device__ __forceinline__ void load_a_x4(uint32_t a[4], const bf16* s, int stride, int row0, int col0) {
  const int lane = threadIdx.x % 32, mi = lane / 8;
  ldmatrix_x4(a, s + (row0 + (mi % 2) * 8 + lane % 8) * stride + col0 + (mi / 2) * 8);
}

// The fragment loads with the instruction picked at compile time: kLdmatrix
// through ldmatrix, otherwise element by element (the simple kernels).
// Both give the same registers.
template <bool kLdmatrix>
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16* s, int stride, int row0, int col0) {
  if constexpr (kLdmatrix) {
    load_a_x4(a, s, stride, row0, col0);
  } else {
    load_a(a, s, stride, row0, col0);
  }
}
template <bool kLdmatrix>
__device__ __forceinline__ void frag_b_rows2(uint32_t b0[2], uint32_t b1[2], const bf16* s, int stride, int n0,
                                             int k0) {
  if constexpr (kLdmatrix) {
    load_b_rows_x2(b0, b1, s, stride, n0, k0);
  } else {
    load_b_rows(b0, s, stride, n0, k0);
    load_b_rows(b1, s, stride, n0 + 8, k0);
  }
}
template <bool kLdmatrix>
__device__ __forceinline__ void frag_b_cols2(uint32_t b0[2], uint32_t b1[2], const bf16* s, int stride, int k0,
                                             int n0) {
  if constexpr (kLdmatrix) {
    load_b_cols_x2(b0, b1, s, stride, k0, n0);
  } else {
    load_b_cols(b0, s, stride, k0, n0);
    load_b_cols(b1, s, stride, k0, n0 + 8);
  }
}

// The A fragment for keys kc*16 .. kc*16+15 built from C fragments of the
// 8-column tiles 2kc and 2kc+1 (a score tile feeding the next product).
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float (*s)[4], int kc) {
  a[0] = pack_bf16(s[2 * kc][0], s[2 * kc][1]);
  a[1] = pack_bf16(s[2 * kc][2], s[2 * kc][3]);
  a[2] = pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]);
  a[3] = pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3]);
}

// acc[16 rows × D] += S·T for a warp: S the 16×64 score tile in C fragments
// (8 n tiles of 8 keys, rounded to bf16 here), T the 64 rows × D shared tile
// whose rows are the keys (V in the forward's P·V, K in dS·K, dO and Q in
// Pᵀ·dO and dSᵀ·Q). Each accumulator sums its keys in ascending order.
template <int D, bool kLdmatrix>
__device__ __forceinline__ void scores_times_tile(float (*acc)[4], const float (*s)[4], const bf16* tile) {
  constexpr int kS = D + 8;
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    uint32_t a[4];
    c_to_a(a, s, kc);
#pragma unroll
    for (int dn = 0; dn < D / 8; dn += 2) {
      uint32_t b0[2], b1[2];
      frag_b_cols2<kLdmatrix>(b0, b1, tile, kS, kc * 16, dn * 8);
      mma_bf16(acc[dn], a, b0);
      mma_bf16(acc[dn + 1], a, b1);
    }
  }
}

// Copies rows [row0, row0 + 64) of a [rows, heads, D] tensor's head `h` into
// a shared tile; rows at or past `n_rows` become zero. 16-byte accesses.
template <int D>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int64_t base_row, int row0, int n_rows, int heads,
                                          int h) {
  constexpr int kVec = D / 8;  // uint4 per row
  for (int i = threadIdx.x; i < kBlockRows * kVec; i += kThreads) {
    const int r = i / kVec, c = i % kVec;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < n_rows) v = *reinterpret_cast<const uint4*>(g + ((base_row + row0 + r) * heads + h) * D + c * 8);
    *reinterpret_cast<uint4*>(s + r * (D + 8) + c * 8) = v;
  }
}

// 16-byte global → shared copy that bypasses registers; rows past the end
// are zero-filled (source size 0) from a valid address.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// The same for one 4-byte word (a float of lse or delta).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// load_tile through cp.async (the caller commits and waits).
template <int D>
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* g, int64_t base_row, int row0, int n_rows,
                                                int heads, int h) {
  constexpr int kVec = D / 8;
  for (int i = threadIdx.x; i < kBlockRows * kVec; i += kThreads) {
    const int r = i / kVec, c = i % kVec;
    const bool valid = row0 + r < n_rows;
    const bf16* src = valid ? g + ((base_row + row0 + r) * heads + h) * D + c * 8 : g;
    cp_async16(s + r * (D + 8) + c * 8, src, valid);
  }
}

// load_tile or load_tile_async, picked at compile time.
template <int D, bool kAsync>
__device__ __forceinline__ void stage_tile(bf16* s, const bf16* g, int64_t base_row, int row0, int n_rows, int heads,
                                           int h) {
  if constexpr (kAsync) {
    load_tile_async<D>(s, g, base_row, row0, n_rows, heads, h);
  } else {
    load_tile<D>(s, g, base_row, row0, n_rows, heads, h);
  }
}

// 2^x in one MUFU instruction: ex2.approx with results below 2^-126 flushed
// to zero (exp2f also rescales to keep those denormals, three more
// instructions per score for values that vanish beside the row's sum).
// exp2(-inf) = 0. LATHE_ATTN_FAST_EXP2=0 builds exp2f instead.
#ifndef LATHE_ATTN_FAST_EXP2
#define LATHE_ATTN_FAST_EXP2 1
#endif
__device__ __forceinline__ float fast_exp2(float x) {
#if LATHE_ATTN_FAST_EXP2
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Key j of a sequence is visible to the query at position `pos`.
__device__ __forceinline__ bool visible(int j, int pos, int n_k, int window) {
  return j <= pos && j < n_k && (window <= 0 || j > pos - window);
}

// Forward launch shared by training and prefill-into-cache (attention_fwd.cu).
// With cu_seqlens null there is one sequence: n_q query rows at positions
// q_pos0.., keys 0 .. q_pos0 + n_q − 1 from k/v (which may have other strides
// of rows than q: both are [rows, heads, D]).
// The head sizes the kernels are compiled for, and a dispatch from the
// run-time size to the template: f(std::integral_constant<int, D>{}).
inline bool head_dim_compiled(int d) { return d == 32 || d == 64 || d == 128; }
#define LATHE_ATTN_HEAD_DIMS "32, 64 and 128"
template <typename F>
Status with_head_dim(int d, F&& f) {
  switch (d) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return unsupported("attention: head_dim ", d, " is not compiled (" LATHE_ATTN_HEAD_DIMS " are)");
  }
}

struct FwdParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* out;
  float* lse;
  const int32_t* cu;
  int n_docs, max_q, n_q, q_pos0;
  int n_head, n_head_kv, head_dim, window;
  float scale;
  bool simple = false;  // the unpipelined kernel
  int warp_rows = 0;     // query rows per warp of the fast kernel: 16, 32; 0: the compiled default
  bool wgmma = false;    // the Hopper kernel (sm90_supported(head_dim) must hold)
  int wgmma_rows = 0;    // its query rows per block: 64, 128; 0: the compiled default
  int64_t ld_out = 0;    // out's row stride in elements; 0: n_head·head_dim
  int n_tokens = 0;      // rows of q, k, v with cu set (the warp-specialized kernel's tensor maps need them)
  int ws_rows = 0;       // the warp-specialized kernel's query rows per block: 128, 192; 0: its default
  int ws_keys = 0;       // its keys per K/V tile: 64, 128; 0: its default
  AttnFwdKernels kernels = AttnFwdKernels::kAuto;  // when simple, warp_rows and wgmma leave it open
  int ws_persistent = -1;  // the warp-specialized kernel's grid: one block per SM (1), per item (0), the default (-1)
};
// Picks the kernel (simple, the fields, kernels, LATHE_ATTN_FWD, the
// compiled default) and launches it.
Status launch_flash_forward(const FwdParams& p, void* stream);
// The warp-specialized Hopper kernel (attention_fwd_sm90.cu); the caller
// checked sm90_supported(p.head_dim).
Status launch_forward_ws(const FwdParams& p, void* stream);

// Pieces of the forward kernels (attention_fwd.cu, attention_fwd_sm90.cu).
// The score half of the online softmax of one 16-row tile s (NT n tiles of
// 8 keys, C fragments) against the running (m, l): mask, new max, P in
// place of S, l rescaled and grown; alpha is the factor the caller scales
// its output rows by (rescale_rows). m is kept in scaled log2 units, so
// P = exp2(S·scale·log2e − m) is one FMA and one exp2 per score. `masked`
// false: every key of the tile is visible to every row (the caller
// checked), so the test is skipped. kMask: the test always (kMaskAlways),
// never (kMaskNever) or as `masked` says (kMaskFlag, the default; the
// compiler predicates the test, so its instructions issue either way).
enum MaskMode { kMaskFlag, kMaskAlways, kMaskNever };
template <int NT, MaskMode kMask = kMaskFlag>
__device__ __forceinline__ void softmax_scores(float (*s)[4], float m[2], float l[2], float alpha[2], bool masked,
                                               int kt, int pos_a, int pos_b, int n_k, int window, float sl2) {
  const int c = threadIdx.x % 4;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (kMask == kMaskAlways || (kMask == kMaskFlag && masked)) {
        const int j = kt + n * 8 + 2 * c + (e & 1);
        if (!visible(j, e < 2 ? pos_a : pos_b, n_k, window)) s[n][e] = -INFINITY;
      }
      mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
    }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(m[r], quad_max(mx[r]) * sl2);
    base[r] = m_new == -INFINITY ? 0.f : m_new;
    alpha[r] = fast_exp2(m[r] - base[r]);  // 0 when m was -inf
    m[r] = m_new;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = fast_exp2(fmaf(s[n][e], sl2, -base[e / 2]));
      l[e / 2] += s[n][e];
    }
}

// Output rows (C fragments of D/8 column tiles) times alpha of their row.
template <int D>
__device__ __forceinline__ void rescale_rows(float (*o)[4], const float alpha[2]) {
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    o[dn][0] *= alpha[0];
    o[dn][1] *= alpha[0];
    o[dn][2] *= alpha[1];
    o[dn][3] *= alpha[1];
  }
}

// The whole online softmax of a 64-key tile: the scores, then the output.
template <int D>
__device__ __forceinline__ void online_softmax(float (*s)[4], float (*o)[4], float m[2], float l[2], bool masked,
                                               int kt, int pos_a, int pos_b, int n_k, int window, float sl2) {
  float alpha[2];
  softmax_scores<8>(s, m, l, alpha, masked, kt, pos_a, pos_b, n_k, window, sl2);
  rescale_rows<D>(o, alpha);
}

// Writes a warp's 16 finished rows (row_a: this thread's upper row, row_b =
// row_a + 8): out = o / l in bf16 and lse = (m + log2 l)·ln 2.
template <int D>
__device__ __forceinline__ void store_rows(const FwdParams& p, const float (*o)[4], const float m[2],
                                           const float l[2], int64_t q_base, int row_a, int row_b, int n_q, int h) {
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    const float sum = quad_sum(l[r]);
    if (row >= n_q) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int64_t ld = p.ld_out ? p.ld_out : int64_t(p.n_head) * D;
    bf16* dst = p.out + (q_base + row) * ld + h * D + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
      *reinterpret_cast<__nv_bfloat162*>(dst + dn * 8) =
          __floats2bfloat162_rn(o[dn][2 * r] * inv, o[dn][2 * r + 1] * inv);
    if (p.lse && c == 0) p.lse[(q_base + row) * p.n_head + h] = sum > 0.f ? (m[r] + log2f(sum)) * kLn2 : -INFINITY;
  }
}

// The sequence a block works on: its rows of q (and keys of k, v) start at
// q_base (k_base); n_q query rows, n_k keys.
struct BlockSeq {
  int64_t q_base = 0, k_base = 0;
  int n_q = 0, n_k = 0;
};
// `doc`: the document's index (ignored without cu_seqlens).
__device__ __forceinline__ BlockSeq block_seq(const FwdParams& p, int doc) {
  BlockSeq b{0, 0, p.n_q, p.q_pos0 + p.n_q};
  if (p.cu) {
    b.q_base = b.k_base = p.cu[doc];
    b.n_q = b.n_k = p.cu[doc + 1] - p.cu[doc];
  }
  return b;
}
// The mma.sync and wgmma kernels take the document from blockIdx.z.
__device__ __forceinline__ BlockSeq block_seq(const FwdParams& p) { return block_seq(p, blockIdx.z); }


// Backward arguments shared by the mma.sync kernels (attention_bwd.cu) and
// the Hopper ones (attention_bwd_sm90.cu); delta = rowsum(dO ⊙ O).
struct BwdParams {
  const bf16 *q, *k, *v, *out, *d_out;
  const float* lse;
  float* delta;
  bf16 *d_q, *d_k, *d_v;
  const int32_t* cu;
  int n_tokens, n_head, n_head_kv, window;
  float scale;
  int64_t ld_out = 0;  // out's row stride in elements; 0: n_head·head_dim
  // (Kept at 120 bytes: grown past 128, the kernels that take it by value
  // lost their unswitched loops in some builds and ran a quarter slower. The
  // fused kernel takes its extra pointers as arguments of their own.)
};
// Rows qt .. qt + 63 of head h's lse and delta into sL, sD through cp.async
// (zero past the document's n rows); the block's kN threads share the rows.
template <int kN>
__device__ __forceinline__ void stage_lse_delta(const BwdParams& p, float* sL, float* sD, int64_t base, int qt, int n,
                                                int h) {
  for (int r = threadIdx.x; r < kBlockRows; r += kN) {
    const bool in = qt + r < n;
    const int64_t at = in ? (base + qt + r) * p.n_head + h : 0;
    cp_async4(sL + r, p.lse + at, in);
    cp_async4(sD + r, p.delta + at, in);
  }
}

// True when the current device runs the wgmma kernels (the Hopper forward
// and backward) at head_dim d: compute capability 9.x, d 64 or 128.
bool sm90_supported(int d);
// Its dq and dkdv kernels, 64 or 128 rows (queries, keys) per thread block;
// delta must already be in p.delta.
Status launch_backward_sm90(const BwdParams& p, int d, int rows, int n_docs, int max_seqlen, cudaStream_t st);
// The warp-specialized Hopper kernels (attention_bwd_ws.cu; the caller
// checked sm90_supported(d)): dkdv on st, dq on the side stream beside it
// (or on st: LATHE_ATTN_BWD_STREAMS=1), joined back to st; delta must
// already be in p.delta and p.n_tokens set.
//
// kWsDs's dS tiles: spare[0] holds tiles 0 .. end[0] − 1, spare[1] the
// next ones up to end[1] (memory the caller gives for the call), `tiles`
// (the workspace's) the rest; each document's first pair in pair_base.
// tiles null: none.
struct DsTiles {
  void* tiles = nullptr;
  int* pair_base = nullptr;
  void* spare[2] = {nullptr, nullptr};
  int64_t end[2] = {0, 0};
};
constexpr int kDsTileBytes = kBlockRows * kBlockRows * 2;  // one tile pair's dS, bf16
// ds.tiles set (AttnBwdKernels::kWsDs): dkdv also leaves each tile pair's
// dS there and d_q is a product of those after it, on st; ds.pair_base
// holds n_docs ints (each document's first pair, written here).
Status launch_backward_ws(const BwdParams& p, int d, int n_docs, int max_seqlen, cudaStream_t st,
                          const DsTiles& ds = {});
// The backward's first kernel (attention_delta.cu): p.delta = rowsum(dO ⊙ O)
// per row and head at head_dim d, and turn[row] = 0 where turn is set (the
// fused kernel's counters). simple: the one-warp-per-row kernel (the simple
// path's); otherwise the 16-byte streaming one wherever out allows it.
// n_tokens·n_head < 2^31 and d_out 16-byte aligned (the caller checks).
Status launch_delta(const BwdParams& p, int d, int* turn, bool simple, cudaStream_t st);

Status cuda_check(cudaError_t err, const char* what);

// The stream the backward's dq kernel runs on beside dkdv
// (LATHE_ATTN_BWD_STREAMS=2, the default; attention_streams.cu): one per
// device, made on first use and kept, with the events that fork it from the
// caller's stream and join it back. Works under stream capture (the side
// stream joins the capture through the fork event). One backward per device
// at a time shares these events.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
// nullptr when LATHE_ATTN_BWD_STREAMS=1; else the device's side stream,
// forked from st (it waits for everything st has queued so far); an error
// naming the variable when it holds anything else.
Result<const SideStream*> side_stream_for(cudaStream_t st);
// st waits for everything queued on the side stream so far.
Status join_side_stream(const SideStream& side, cudaStream_t st);

}  // namespace lathe::cuda::attn
