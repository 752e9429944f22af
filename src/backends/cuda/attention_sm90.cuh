// Hopper warpgroup tensor-core products (wgmma, sm_90a) for the attention
// kernels: 64-row bf16 tiles in shared memory with the 128-byte swizzle,
// their matrix descriptors, the m64n64 and m64n128 instructions, the
// fences around them, and the backward's per-tile steps. Shared by the
// wgmma backward (attention_bwd_sm90.cu), the warp-specialized one
// (attention_bwd_ws.cu) and the forwards (attention_fwd.cu,
// attention_fwd_sm90.cu).
//
// A tile is 64 rows × D columns stored as D/64 panels of 64 rows × 128
// bytes, the 16-byte chunks of row r permuted by XOR with r % 8, 1024-byte
// aligned. The same tile serves as a K-major operand (its rows are M or N,
// its columns the reduction) and as an MN-major one (its rows are the
// reduction). The accumulator of an m64nN product holds, in warp w, rows
// 16w.. with the mma.sync C layout repeated over N/8 column tiles, and the
// register A operand has the mma.sync A layout for the warp's 16 rows, so
// c_to_a turns scores into operands as in the other kernels.
#pragma once

#include "backends/cuda/attention_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LATHE_SM90A_DEVICE 1
#else
#define LATHE_SM90A_DEVICE 0
#endif

// Named, not anonymous: the sm_80 pass uses none of it and would warn.
namespace lathe::cuda::attn::sm90 {

constexpr int kPanelBytes = kBlockRows * 128;  // 64 rows of 64 bf16

template <int D>
constexpr int tile_bytes() {
  return kBlockRows * D * 2;
}

// Byte offset of 16-byte chunk ch (columns 8ch .. 8ch + 7) of row r.
__device__ __forceinline__ uint32_t sw_offset(int r, int ch) {
  return uint32_t((ch / 8) * kPanelBytes + r * 128 + (((ch % 8) ^ (r % 8)) * 16));
}

// Rows [row0, row0 + 64) of head h of a [rows, heads, D] tensor into a
// swizzled tile through cp.async, by the block's kBlockThreads threads;
// rows at or past n_rows become zero.
template <int D, int kBlockThreads = kThreads>
__device__ __forceinline__ void load_tile_sw(unsigned char* s, const bf16* g, int64_t base_row, int row0,
                                             int n_rows, int heads, int h) {
  constexpr int kVec = D / 8;
  for (int i = threadIdx.x; i < kBlockRows * kVec; i += kBlockThreads) {
    const int r = i / kVec, c = i % kVec;
    const bool valid = row0 + r < n_rows;
    const bf16* src = valid ? g + ((base_row + row0 + r) * heads + h) * D + c * 8 : g;
    cp_async16(s + sw_offset(r, c), src, valid);
  }
}

// Shared-memory matrix descriptor: start address, leading and stride byte
// offsets (all in 16-byte units), 128-byte swizzle (mode 1, bits 62-63).
__device__ __forceinline__ uint64_t sw128_desc(const unsigned char* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}
// K-major operand: the 64 rows of the tile, columns k0 .. k0 + 15 (8-row
// groups 1024 bytes apart; inside a swizzle row the start moves 32 bytes per
// 16 columns).
__device__ __forceinline__ uint64_t desc_k(const unsigned char* tile, int k0) {
  return sw128_desc(tile + (k0 / 64) * kPanelBytes + (k0 % 64) * 2, 16, 1024);
}
// MN-major operand: rows k0 .. k0 + 15 are the reduction, all columns the N
// index (panels of 64 columns kPanelBytes apart, 8-row groups 1024 apart).
__device__ __forceinline__ uint64_t desc_mn(const unsigned char* tile, int k0) {
  return sw128_desc(tile + k0 * 128, kPanelBytes, 1024);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes this thread's completed cp.async writes visible to wgmma's reads.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of accumulator registers across
// the wgmma fence / wait around them.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for register A operands: computed before the fence, not after.
template <int M>
__device__ __forceinline__ void pin(uint32_t (&a)[M][4]) {
#pragma unroll
  for (int i = 0; i < 4 * M; ++i) asm volatile("" : "+r"(a[i / 4][i % 4])::"memory");
}

#define LATHE_WG_F8(i)                                                                                         \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define LATHE_WG_F32 LATHE_WG_F8(0), LATHE_WG_F8(8), LATHE_WG_F8(16), LATHE_WG_F8(24)
#define LATHE_WG_F64 LATHE_WG_F32, LATHE_WG_F8(32), LATHE_WG_F8(40), LATHE_WG_F8(48), LATHE_WG_F8(56)
#define LATHE_WG_R32                                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LATHE_WG_R64                                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d[64×64] = A[64×16]·B[16×64] (+ d when accumulate), both K-major
// descriptors.
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LATHE_WG_R32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : LATHE_WG_F32
      : "l"(a), "l"(b), "r"(accumulate));
}

// d[64×N] += A[64×16]·B[16×N], A from registers (c_to_a layout per warp),
// B an MN-major descriptor.
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t b) {
  static_assert(N == 64 || N == 128);
  if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LATHE_WG_R32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : LATHE_WG_F32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LATHE_WG_R64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : LATHE_WG_F64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}

// d[64×64] = A[64×16]·B[16×64] (+ d when accumulate), A from registers
// (c_to_a layout per warp), B a K-major descriptor (its rows are the N
// index: the K of Q·Kᵀ).
__device__ __forceinline__ void wgmma_rs_n64_kmajor(float (&d)[32], const uint32_t a[4], uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LATHE_WG_R32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : LATHE_WG_F32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// This warp's A fragments (the mma.sync A layout of its 16 rows, 16w..) of
// a whole 64-row tile, one per 16 columns: what a score product reads from
// registers instead of shared memory.
template <int D>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[D / 16][4], const unsigned char* tile) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4, r = threadIdx.x % 128 / 32 * 16 + g;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    a[kk][0] = *reinterpret_cast<const uint32_t*>(tile + sw_offset(r, 2 * kk) + 4 * c);
    a[kk][1] = *reinterpret_cast<const uint32_t*>(tile + sw_offset(r + 8, 2 * kk) + 4 * c);
    a[kk][2] = *reinterpret_cast<const uint32_t*>(tile + sw_offset(r, 2 * kk + 1) + 4 * c);
    a[kk][3] = *reinterpret_cast<const uint32_t*>(tile + sw_offset(r + 8, 2 * kk + 1) + 4 * c);
  }
}

// issue_scores with A from registers (load_a_frags).
template <int D>
__device__ __forceinline__ void issue_scores_rs(float (&s)[32], const uint32_t (*a)[4], const unsigned char* b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) wgmma_rs_n64_kmajor(s, a[kk], desc_k(b, kk * 16), kk > 0);
}

// s[64×64] = A·Bᵀ over D columns, both tiles K-major (the first step
// overwrites s). Issues only: the caller fences before and commits after.
template <int D>
__device__ __forceinline__ void issue_scores(float (&s)[32], const unsigned char* a, const unsigned char* b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) wgmma_ss_n64(s, desc_k(a, kk * 16), desc_k(b, kk * 16), kk > 0);
}

// acc += A·B over 64 reduction rows: A the four k16 register fragments,
// B the tile's 64 rows MN-major. Issues only (the caller commits and waits).
template <int D>
__device__ __forceinline__ void accumulate_rows(float (&acc)[D / 2], const uint32_t (*a)[4], const unsigned char* b) {
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) wgmma_rs<D>(acc, a[kc], desc_mn(b, kc * 16));
}

// The backward's steps for one tile pair, shared by its wgmma kernels
// (attention_bwd_sm90.cu) and the warp-specialized ones (attention_bwd_ws.cu).

// Both score products of one tile pair, s = A1·B1ᵀ and dp = A2·B2ᵀ over D,
// all four tiles K-major (the first step overwrites s and dp), as two
// groups: after wg_wait<1>() s is ready while dp is still being computed.
template <int D>
__device__ __forceinline__ void issue_score_products(float (&s)[32], float (&dp)[32], const unsigned char* a1,
                                                     const unsigned char* b1, const unsigned char* a2,
                                                     const unsigned char* b2) {
  wg_fence();
  issue_scores<D>(s, a1, b1);
  wg_commit();
  issue_scores<D>(dp, a2, b2);
  wg_commit();
}

// issue_score_products with both A operands from registers.
template <int D>
__device__ __forceinline__ void issue_score_products_rs(float (&s)[32], float (&dp)[32], const uint32_t (*a1)[4],
                                                        const unsigned char* b1, const uint32_t (*a2)[4],
                                                        const unsigned char* b2) {
  wg_fence();
  issue_scores_rs<D>(s, a1, b1);
  wg_commit();
  issue_scores_rs<D>(dp, a2, b2);
  wg_commit();
}

// dq for one K/V tile from the moment S and dP are in flight (issued by
// issue_score_products) to the issue of dQ += dS·K, left in flight (a[]
// holds dS, its operand, until it completes): this thread's query rows
// row_a, row_b (= row_a + 8).
template <int D>
__device__ __forceinline__ void dq_tile_step(float (&dq)[D / 2], float (&s)[32], float (&dp)[32], uint32_t (&a)[4][4],
                                             const unsigned char* sK, bool masked, int kt, int row_a, int row_b, int n,
                                             int window, float sl2, const float lse2[2], const float dlt[2]) {
  const int c = threadIdx.x % 4;
  wg_wait<1>();
  pin(s);
#pragma unroll
  for (int j = 0; j < 8; ++j)  // P, while dP is computed
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = kt + j * 8 + 2 * c + (e & 1), i = 4 * j + e;
      const bool vis = !masked || visible(key, e < 2 ? row_a : row_b, n, window);
      s[i] = vis ? fast_exp2(fmaf(s[i], sl2, -lse2[e / 2])) : 0.f;
    }
  wg_wait<0>();
  pin(dp);
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = s[i] * (dp[i] - dlt[i % 4 / 2]);  // dS
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) c_to_a(a[kc], reinterpret_cast<const float(*)[4]>(s), kc);
  pin(a);
  pin(dq);
  wg_fence();
  accumulate_rows<D>(dq, a, sK);
  wg_commit();
}

// dq for one K/V tile, all of it.
template <int D>
__device__ __forceinline__ void dq_tile(float (&dq)[D / 2], const unsigned char* sQ, const unsigned char* sO,
                                        const unsigned char* sK, const unsigned char* sV, bool masked, int kt,
                                        int row_a, int row_b, int n, int window, float sl2, const float lse2[2],
                                        const float dlt[2]) {
  float s[32], dp[32];
  uint32_t a[4][4];
  issue_score_products<D>(s, dp, sQ, sK, sO, sV);
  dq_tile_step<D>(dq, s, dp, a, sK, masked, kt, row_a, row_b, n, window, sl2, lse2, dlt);
  wg_wait<0>();
  pin(dq);
}

// dkdv for one query tile: this thread's keys key_a, key_b (= key_a + 8).
template <int D>
__device__ __forceinline__ void dkdv_tile(float (&dk)[D / 2], float (&dv)[D / 2], const unsigned char* sK,
                                          const unsigned char* sV, const unsigned char* sQ, const unsigned char* sO,
                                          const float* sL, const float* sD, bool masked, int qt, int key_a,
                                          int key_b, int n, int window, float sl2) {
  const int c = threadIdx.x % 4;
  float s[32], dp[32];
  issue_score_products<D>(s, dp, sK, sQ, sV, sO);
  wg_wait<1>();
  pin(s);
#pragma unroll
  for (int j = 0; j < 8; ++j)  // Pᵀ, while dPᵀ is computed
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = j * 8 + 2 * c + (e & 1), qi = qt + col, i = 4 * j + e;
      const bool vis = !masked || (qi < n && visible(e < 2 ? key_a : key_b, qi, n, window));
      s[i] = vis ? fast_exp2(fmaf(s[i], sl2, -sL[col] * kLog2e)) : 0.f;
    }
  wg_wait<0>();
  pin(dp);
#pragma unroll
  for (int i = 0; i < 32; ++i) dp[i] = s[i] * (dp[i] - sD[i / 4 * 8 + 2 * c + i % 2]);  // dSᵀ
  uint32_t pa[4][4], da[4][4];
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    c_to_a(pa[kc], reinterpret_cast<const float(*)[4]>(s), kc);
    c_to_a(da[kc], reinterpret_cast<const float(*)[4]>(dp), kc);
  }
  pin(pa);
  pin(da);
  pin(dv);
  pin(dk);
  wg_fence();
  accumulate_rows<D>(dv, pa, sO);
  accumulate_rows<D>(dk, da, sQ);
  wg_commit();
  wg_wait<0>();
  pin(dv);
  pin(dk);
}

// The dynamic shared memory rounded up to the 1024-byte alignment of the
// swizzle pattern (the launch asks for 1 KiB more).
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

}  // namespace lathe::cuda::attn::sm90
