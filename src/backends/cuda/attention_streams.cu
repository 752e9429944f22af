// The attention backward's second stream (declared in attention_common.cuh):
// its dq kernel runs there beside dkdv, which fills the SMs the causal
// dkdv blocks' ragged tail leaves idle. Host code only.
#include <map>
#include <mutex>

#include "backends/cuda/attention_common.cuh"
#include "core/env.h"

namespace lathe::cuda::attn {

Result<const SideStream*> side_stream_for(cudaStream_t st) {
  static const Result<int64_t> streams = env::attn_bwd_streams();  // read once
  if (!streams.is_ok()) return streams.status();
  if (*streams < 2) return static_cast<const SideStream*>(nullptr);
  static std::mutex mu;
  static std::map<int, SideStream> per_device;
  int device = 0;
  LATHE_TRY(cuda_check(cudaGetDevice(&device), "cudaGetDevice"));
  std::lock_guard<std::mutex> lock(mu);
  SideStream& side = per_device[device];
  if (!side.stream) {
    LATHE_TRY(cuda_check(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking), "attention side stream"));
    LATHE_TRY(cuda_check(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming), "attention fork event"));
    LATHE_TRY(cuda_check(cudaEventCreateWithFlags(&side.join, cudaEventDisableTiming), "attention join event"));
  }
  LATHE_TRY(cuda_check(cudaEventRecord(side.fork, st), "attention fork record"));
  LATHE_TRY(cuda_check(cudaStreamWaitEvent(side.stream, side.fork, 0), "attention fork wait"));
  return static_cast<const SideStream*>(&side);
}

Status join_side_stream(const SideStream& side, cudaStream_t st) {
  LATHE_TRY(cuda_check(cudaEventRecord(side.join, side.stream), "attention join record"));
  return cuda_check(cudaStreamWaitEvent(st, side.join, 0), "attention join wait");
}

}  // namespace lathe::cuda::attn
