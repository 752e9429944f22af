// The CUDA backend in a build without nvcc: every call reports that this build
// has no CUDA, so callers need no #ifdef.
#include <utility>

#include "backends/cuda/device.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
Result<DeviceInfo> device_info(int) { return no_cuda(); }

Result<CudaStream> CudaStream::create(int) { return no_cuda(); }
CudaStream::CudaStream(CudaStream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)), device_(o.device_) {}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  std::swap(stream_, o.stream_);
  return *this;
}
CudaStream::~CudaStream() = default;
Status CudaStream::synchronize() const { return no_cuda(); }

Result<DeviceBuffer> DeviceBuffer::alloc(int, size_t) { return no_cuda(); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  return *this;
}
DeviceBuffer::~DeviceBuffer() = default;
Status DeviceBuffer::copy_from_host(const void*, size_t, const CudaStream*) { return no_cuda(); }
Status DeviceBuffer::copy_to_host(void*, size_t, const CudaStream*) const { return no_cuda(); }

}  // namespace lathe::cuda
