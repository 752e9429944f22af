// CudaContext (stream, cuBLASLt handle, workspace, GEMM plan cache) and the
// device arena: one cudaMalloc per arena, bump allocation, reset per step.
#include <utility>

#include "backends/cuda/context_impl.h"

namespace lathe::cuda {

CudaContext::Impl::~Impl() {
  for (auto& [key, p] : plans) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  if (workspace) cudaFree(workspace);
  if (lt) cublasLtDestroy(lt);
  if (stream) cudaStreamDestroy(stream);
}

CudaContext::CudaContext() = default;
CudaContext::CudaContext(CudaContext&&) noexcept = default;
CudaContext& CudaContext::operator=(CudaContext&&) noexcept = default;
CudaContext::~CudaContext() = default;

Result<CudaContext> CudaContext::create(int device, size_t workspace_bytes) {
  LATHE_CU_TRY(cudaSetDevice(device));
  CudaContext ctx;
  ctx.impl_ = std::make_unique<Impl>();
  Impl& im = *ctx.impl_;
  im.device = device;
  LATHE_CU_TRY(cudaStreamCreateWithFlags(&im.stream, cudaStreamNonBlocking));
  LATHE_CUBLAS_TRY(cublasLtCreate(&im.lt));
  if (workspace_bytes) {
    cudaError_t err = cudaMalloc(&im.workspace, workspace_bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return error(StatusCode::kOutOfMemory, "cuda: cuBLASLt workspace of ", workspace_bytes, " bytes: ",
                   cudaGetErrorString(err));
    }
  }
  im.workspace_bytes = workspace_bytes;
  return std::move(ctx);
}

int CudaContext::device() const { return impl_ ? impl_->device : -1; }
void* CudaContext::stream() const { return impl_ ? impl_->stream : nullptr; }

Status CudaContext::synchronize() const {
  if (!impl_) return invalid_argument("cuda: synchronize on an empty context");
  return cuda_check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
}

Status CudaContext::check_launch(const char* what) const { return cuda_check(cudaGetLastError(), what); }

Status copy_to_device(CudaContext& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(ctx)), "copy_to_device");
}

Status copy_async(CudaContext& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(ctx)), "copy_async");
}

Status copy_to_device_2d(CudaContext& ctx, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                         size_t width_bytes, size_t rows) {
  if (width_bytes == 0 || rows == 0) return Status::ok();
  return cuda_check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, rows, cudaMemcpyHostToDevice,
                                      stream_of(ctx)),
                    "copy_to_device_2d");
}

Status copy_to_host(CudaContext& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  LATHE_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(ctx)));
  return ctx.synchronize();
}

Status fill_zero(CudaContext& ctx, void* dst, size_t bytes) {
  if (bytes == 0) return Status::ok();
  return cuda_check(cudaMemsetAsync(dst, 0, bytes, stream_of(ctx)), "fill_zero");
}

size_t ArenaPlan::add(size_t bytes) {
  const size_t off = total_;
  total_ += (bytes + kAlign - 1) / kAlign * kAlign;
  return off;
}

Result<DeviceArena> DeviceArena::create(int device, size_t bytes) {
  DeviceArena arena;
  LATHE_ASSIGN_OR_RETURN(arena.buffer_, DeviceBuffer::alloc(device, bytes));
  return std::move(arena);
}

Result<void*> DeviceArena::alloc(size_t bytes, const char* what) {
  const size_t rounded = (bytes + ArenaPlan::kAlign - 1) / ArenaPlan::kAlign * ArenaPlan::kAlign;
  if (rounded > capacity() - used_) {
    return error(StatusCode::kOutOfMemory, "cuda arena: ", what, " needs ", bytes, " bytes but ", capacity() - used_,
                 " of ", capacity(), " are left (plan the arena larger)");
  }
  void* p = static_cast<char*>(buffer_.data()) + used_;
  used_ += rounded;
  if (used_ > high_water_) high_water_ = used_;
  return p;
}

}  // namespace lathe::cuda
