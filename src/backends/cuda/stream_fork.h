// Work on a second stream beside a context's own: a side context and the
// events that order one stream after the other (fork and join).
//
// The side context has its own non-blocking stream, cuBLASLt handle, plan
// cache and a workspace as large as the main context's, so a GEMM plans the
// same algorithm on either context and gives the same bits; two GEMMs never
// share a workspace while they may run at once. high_priority puts the side
// stream at the device's greatest priority (its blocks are scheduled ahead of
// the main stream's pending ones); otherwise both streams have the default.
// Events carry no timing. record() marks what a context's stream has
// enqueued so far; wait() makes another context's stream wait for that work
// (cudaStreamWaitEvent: the record current when wait() is called counts, so
// an event may be recorded again once its waits are enqueued). Both work
// inside a CUDA graph capture: a stream that waits for an event recorded in a
// capturing stream joins the capture and must be joined back before it ends.
// Threads: one thread drives the contexts and their events. Without nvcc:
// stream_fork_stub.cpp (creation fails, saying so).
#pragma once

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

Result<CudaContext> create_side_context(const CudaContext& like, bool high_priority);

class CudaEvent {
 public:
  static Result<CudaEvent> create();
  CudaEvent() = default;
  CudaEvent(CudaEvent&& o) noexcept;
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  Status record(const CudaContext& ctx);      // after what ctx's stream has enqueued so far
  Status wait(const CudaContext& ctx) const;  // ctx's stream waits for the recorded work
  // The host waits for the recorded work (a failed kernel's error comes back
  // here); what it wrote to mapped host memory is then visible to the host.
  Status synchronize() const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
};

}  // namespace lathe::cuda
