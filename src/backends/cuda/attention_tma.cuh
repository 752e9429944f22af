// The tensor-memory-accelerator pieces of the warp-specialized Hopper
// attention kernels (the forward, attention_fwd_sm90.cu, and the backward,
// attention_bwd_ws.cu): the 3-D tile copy into shared memory counted on an
// mbarrier, the register hand-over between producer and consumer
// warpgroups (setmaxnreg), an mbarrier wait that traps after a bound
// instead of hanging the device, and on the host the tensor maps of the
// [rows, heads, D] bf16 tensors in 64-column boxes with the 128-byte
// swizzle, which lands a box as one panel of the tile layout of
// attention_sm90.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap; the encoder is fetched from the driver at run time

#include <cstdint>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_sm90.cuh"

namespace lathe::cuda::attn::tma {

#if LATHE_SM90A_DEVICE
// One box (64 columns × 1 head × rows) of a 3-D tensor map into shared
// memory, its bytes counted on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int col, int head, int row,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(row), "r"(bar)
      : "memory");
}

template <int N>
__device__ __forceinline__ void regs_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ring::mbar_wait with a bound: a phase that has not completed after
// kWaitLimitNs is a broken protocol, and the kernel traps (the launch
// fails with an error) instead of hanging the device.
constexpr uint64_t kWaitLimitNs = 4'000'000'000ull;
__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void mbar_wait_slow(uint32_t bar, uint32_t parity) {
  const uint64_t t0 = now_ns();
  while (!mbar_try(bar, parity))
    if (now_ns() - t0 > kWaitLimitNs) __trap();
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (!mbar_try(bar, parity)) mbar_wait_slow(bar, parity);
}
#endif  // LATHE_SM90A_DEVICE

// cuTensorMapEncodeTiled, from the driver (the program links the runtime
// only), looked up once; null when the driver lacks it.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return EncodeTiled(nullptr);
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// The map of a [rows, heads, D] bf16 tensor in boxes of 64 columns of one
// head by box_rows rows, 128-byte swizzled; zeros past `rows`. `who` names
// the kernel in the error.
template <int D>
Status encode_map(EncodeTiled encode, CUtensorMap* map, const bf16* base, int heads, int64_t rows, int box_rows,
                  const char* who, const char* what) {
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(heads), cuuint64_t(rows)};
  const cuuint64_t strides[2] = {cuuint64_t(D) * 2, cuuint64_t(heads) * D * 2};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(base), dims, strides, box,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return error(StatusCode::kInternal, who, ": the tensor map of ", what, " was refused (CUresult ", int(r), ")");
  return Status::ok();
}

}  // namespace lathe::cuda::attn::tma
