// Side contexts and fork/join events (stream_fork.h).
#include <utility>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/stream_fork.h"

namespace lathe::cuda {

Result<CudaContext> create_side_context(const CudaContext& like, bool high_priority) {
  if (!like.impl()) return invalid_argument("cuda: a side context of an empty context");
  LATHE_ASSIGN_OR_RETURN(CudaContext side, CudaContext::create(like.device(), like.impl()->workspace_bytes));
  if (high_priority) {
    int least = 0, greatest = 0;
    LATHE_CU_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    LATHE_CU_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    CudaContext::Impl& im = *side.impl();
    LATHE_CU_TRY(cudaStreamDestroy(im.stream));
    im.stream = s;
  }
  return std::move(side);
}

Result<CudaEvent> CudaEvent::create() {
  CudaEvent e;
  cudaEvent_t ev = nullptr;
  LATHE_CU_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  e.event_ = ev;
  return std::move(e);
}

CudaEvent::CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  std::swap(event_, o.event_);
  return *this;
}
CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

Status CudaEvent::record(const CudaContext& ctx) {
  if (!event_) return invalid_argument("cuda: record of an empty event");
  return cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event_), stream_of(ctx)), "cudaEventRecord");
}

Status CudaEvent::wait(const CudaContext& ctx) const {
  if (!event_) return invalid_argument("cuda: wait on an empty event");
  return cuda_check(cudaStreamWaitEvent(stream_of(ctx), static_cast<cudaEvent_t>(event_), 0), "cudaStreamWaitEvent");
}

Status CudaEvent::synchronize() const {
  if (!event_) return invalid_argument("cuda: synchronize on an empty event");
  return cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "cudaEventSynchronize");
}

}  // namespace lathe::cuda
