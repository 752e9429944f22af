// Side contexts and events (stream_fork.h) in a build without nvcc: creation
// reports that this build has no CUDA, so no event ever exists to be used.
#include <utility>

#include "backends/cuda/stream_fork.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

Result<CudaContext> create_side_context(const CudaContext&, bool) { return no_cuda(); }
Result<CudaEvent> CudaEvent::create() { return no_cuda(); }
CudaEvent::CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  std::swap(event_, o.event_);
  return *this;
}
CudaEvent::~CudaEvent() = default;
Status CudaEvent::record(const CudaContext&) { return no_cuda(); }
Status CudaEvent::wait(const CudaContext&) const { return no_cuda(); }
Status CudaEvent::synchronize() const { return no_cuda(); }

}  // namespace lathe::cuda
