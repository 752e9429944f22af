// CUDA device basics (see device.h). Every runtime call is checked.
#include "backends/cuda/device.h"

#include <cuda_runtime.h>

#include <utility>

namespace lathe::cuda {
namespace {
Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return error(StatusCode::kInternal, "cuda: ", what, ": ", cudaGetErrorString(err));
}
}  // namespace

#define LATHE_CUDA_TRY(call) LATHE_TRY(cuda_status((call), #call))

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Result<DeviceInfo> device_info(int index) {
  cudaDeviceProp prop{};
  LATHE_CUDA_TRY(cudaGetDeviceProperties(&prop, index));
  return DeviceInfo{prop.name, prop.major, prop.minor, prop.totalGlobalMem};
}

Result<size_t> free_bytes(int index) {
  LATHE_CUDA_TRY(cudaSetDevice(index));
  size_t free_b = 0, total_b = 0;
  LATHE_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

Result<CudaStream> CudaStream::create(int device) {
  LATHE_CUDA_TRY(cudaSetDevice(device));
  CudaStream s;
  cudaStream_t st = nullptr;
  LATHE_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  s.stream_ = st;
  s.device_ = device;
  return std::move(s);
}
CudaStream::CudaStream(CudaStream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)), device_(o.device_) {}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  std::swap(stream_, o.stream_);
  std::swap(device_, o.device_);
  return *this;
}
CudaStream::~CudaStream() {
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}
Status CudaStream::synchronize() const {
  return cuda_status(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

Result<DeviceBuffer> DeviceBuffer::alloc(int device, size_t bytes) {
  LATHE_CUDA_TRY(cudaSetDevice(device));
  DeviceBuffer b;
  if (bytes) {
    cudaError_t err = cudaMalloc(&b.ptr_, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return error(StatusCode::kOutOfMemory, "cuda: cudaMalloc of ", bytes, " bytes on device ", device,
                   ": ", cudaGetErrorString(err));
    }
  }
  b.bytes_ = bytes;
  b.device_ = device;
  return std::move(b);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  std::swap(device_, o.device_);
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
Status DeviceBuffer::copy_from_host(const void* src, size_t bytes, const CudaStream* stream) {
  if (bytes > bytes_) return invalid_argument("cuda: copy_from_host of ", bytes, " bytes into a ", bytes_, "-byte buffer");
  if (stream) {
    LATHE_CUDA_TRY(cudaMemcpyAsync(ptr_, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream->handle())));
    return Status::ok();
  }
  return cuda_status(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}
Status DeviceBuffer::copy_to_host(void* dst, size_t bytes, const CudaStream* stream) const {
  if (bytes > bytes_) return invalid_argument("cuda: copy_to_host of ", bytes, " bytes from a ", bytes_, "-byte buffer");
  if (stream) {
    LATHE_CUDA_TRY(cudaMemcpyAsync(dst, ptr_, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream->handle())));
    return Status::ok();
  }
  return cuda_status(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

Result<PinnedBuffer> PinnedBuffer::alloc(int device, size_t bytes) {
  LATHE_CUDA_TRY(cudaSetDevice(device));
  PinnedBuffer b;
  if (bytes) {
    cudaError_t err = cudaHostAlloc(&b.ptr_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      b.ptr_ = nullptr;
      return error(StatusCode::kOutOfMemory, "cuda: cudaHostAlloc of ", bytes, " pinned host bytes: ",
                   cudaGetErrorString(err));
    }
    b.bytes_ = bytes;  // owned from here: the destructor frees it on any return
    LATHE_CUDA_TRY(cudaHostGetDevicePointer(&b.dev_, b.ptr_, 0));
  }
  return std::move(b);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), dev_(std::exchange(o.dev_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(dev_, o.dev_);
  std::swap(bytes_, o.bytes_);
  return *this;
}
PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

}  // namespace lathe::cuda
