// The CUDA backend in a build without nvcc: every call reports that this build
// has no CUDA, so callers need no #ifdef.
#include <utility>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
Result<DeviceInfo> device_info(int) { return no_cuda(); }
Result<size_t> free_bytes(int) { return no_cuda(); }

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
Result<PinnedBuffer> PinnedBuffer::alloc(int, size_t) { return no_cuda(); }
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), dev_(std::exchange(o.dev_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(dev_, o.dev_);
  std::swap(bytes_, o.bytes_);
  return *this;
}
PinnedBuffer::~PinnedBuffer() = default;
Status DeviceBuffer::copy_from_host(const void*, size_t, const CudaStream*) { return no_cuda(); }
Status DeviceBuffer::copy_to_host(void*, size_t, const CudaStream*) const { return no_cuda(); }

struct CudaContext::Impl {};
CudaContext::CudaContext() = default;
CudaContext::CudaContext(CudaContext&&) noexcept = default;
CudaContext& CudaContext::operator=(CudaContext&&) noexcept = default;
CudaContext::~CudaContext() = default;
Result<CudaContext> CudaContext::create(int, size_t) { return no_cuda(); }
int CudaContext::device() const { return -1; }
void* CudaContext::stream() const { return nullptr; }
Status CudaContext::synchronize() const { return no_cuda(); }
Status CudaContext::check_launch(const char*) const { return no_cuda(); }

Status copy_to_device(CudaContext&, void*, const void*, size_t) { return no_cuda(); }
Status copy_to_host(CudaContext&, void*, const void*, size_t) { return no_cuda(); }
Status copy_async(CudaContext&, void*, const void*, size_t) { return no_cuda(); }
Status copy_to_device_2d(CudaContext&, void*, size_t, const void*, size_t, size_t, size_t) { return no_cuda(); }
Status fill_zero(CudaContext&, void*, size_t) { return no_cuda(); }

size_t ArenaPlan::add(size_t bytes) {
  const size_t off = total_;
  total_ += (bytes + kAlign - 1) / kAlign * kAlign;
  return off;
}
Result<DeviceArena> DeviceArena::create(int, size_t) { return no_cuda(); }
Result<void*> DeviceArena::alloc(size_t, const char*) { return no_cuda(); }

Status gemm(CudaContext&, const GemmArgs&) { return no_cuda(); }
Status rms_norm_residual_forward(CudaContext&, const RmsNormResidualArgs&) { return no_cuda(); }
Status rms_norm_residual_backward(CudaContext&, const RmsNormResidualBackwardArgs&) { return no_cuda(); }
Status rope_tables(CudaContext&, const RopeTablesCudaArgs&) { return no_cuda(); }
Status rope_apply(CudaContext&, const RopeCudaArgs&) { return no_cuda(); }
Status swiglu_forward(CudaContext&, const SwigluCudaArgs&) { return no_cuda(); }
Status swiglu_backward(CudaContext&, const SwigluBackwardCudaArgs&) { return no_cuda(); }
Status swiglu_rows_backward_act(CudaContext&, const SwigluRowsBackwardActArgs&) { return no_cuda(); }
Status embedding_forward(CudaContext&, const EmbeddingCudaArgs&) { return no_cuda(); }
Status embedding_backward(CudaContext&, const EmbeddingBackwardCudaArgs&) { return no_cuda(); }
size_t cross_entropy_workspace_bytes(int64_t, int64_t, CeLogits) { return 0; }
size_t cross_entropy_counter_bytes() { return 0; }
Status cross_entropy_enqueue(CudaContext&, const CrossEntropyCudaArgs&, void*) { return no_cuda(); }
Result<CrossEntropyStats> cross_entropy_counters(CudaContext&, const void*, int64_t) { return no_cuda(); }
Result<CrossEntropyStats> cross_entropy(CudaContext&, const CrossEntropyCudaArgs&) { return no_cuda(); }
Result<CudaAdamW> CudaAdamW::create(CudaContext&, const CudaAdamWConfig&, std::vector<CudaAdamWParam>) {
  return no_cuda();
}
Status CudaAdamW::step(CudaContext&, double) { return no_cuda(); }
Result<double> CudaAdamW::clip_grad_norm(CudaContext&, double) { return no_cuda(); }
Status CudaAdamW::read_moments(CudaContext&, size_t, std::vector<float>*, std::vector<float>*) const {
  return no_cuda();
}
Status CudaAdamW::write_moments(CudaContext&, size_t, std::span<const float>, std::span<const float>) {
  return no_cuda();
}
Status bf16_to_f32(CudaContext&, const bf16_bits*, float*, int64_t) { return no_cuda(); }
Status f32_to_bf16(CudaContext&, const float*, bf16_bits*, int64_t) { return no_cuda(); }

}  // namespace lathe::cuda
