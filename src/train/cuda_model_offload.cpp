// [gate | up] of some layers in pinned host memory between the forward and
// the backward (CudaTrainOptions::offload_layers).
//
// Why: under selective recomputation each layer keeps its [gate | up]
// (2·inter bf16 per token: 448 MiB a layer at the Llama-3.1-8B shape, 4 ×
// 2048 tokens), and the arena's budget decides how many layers also keep
// q/k/v and h_mid (160 MiB) so that their backward reruns no GEMM. An
// offloaded layer's [gate | up] is written into one of two device staging
// buffers, read there by SwiGLU's forward, copied to the host on a stream
// of its own while the next layers run, and copied back into a staging
// buffer before the layer's backward (while the layers above it run theirs);
// the backward then uses it in place as before (SwiGLU's backward, gate|up's
// gradient, the attention backward's spare dS tiles). So k offloaded layers
// cost two layers' worth of device memory instead of k, and the copies (two
// ~0.47 GB transfers per offloaded layer and step at 8B) run beside the GEMMs
// on the copy engines. The bytes are copied, never converted: the results
// are bitwise those of the same step without offloading.
//
// Ordering, by events (backends/cuda/stream_fork.h), offloaded layers
// taking the staging buffers alternately (a layer and the next offloaded
// one never share one):
//   forward:  before the gate|up GEMM writes buffer s, the main stream waits
//             for free[s] (the previous layer's copy out of s has run);
//             after SwiGLU's forward, used[s] on the main stream, the copy
//             stream waits for it, copies out, records free[s];
//   backward: the two highest offloaded layers' copies back are enqueued as
//             the backward starts; before layer l's backward the main stream
//             waits for ready[s]; after it, used[s] again, and the copy
//             stream brings back the next offloaded layer below that takes
//             s, recording ready[s].
// A pass without a backward copies nothing out.
#include "train/cuda_model_impl.h"

namespace lathe {

int64_t COffload::count() const {
  return std::count_if(slot.begin(), slot.end(), [](int s) { return s >= 0; });
}

Status CudaModelImpl::offload_start() {
  if (off.count() == 0) return Status::ok();
  LATHE_ASSIGN_OR_RETURN(cuda::CudaContext c, cuda::CudaContext::create(o.device, 0));
  off.ctx.emplace(std::move(c));
  for (int i = 0; i < 2; ++i)
    for (cuda::CudaEvent* e : {&off.used[i], &off.free[i], &off.ready[i]}) {
      LATHE_ASSIGN_OR_RETURN(*e, cuda::CudaEvent::create());
    }
  off.host.resize(size_t(s.n_layer));
  const size_t bytes = size_t(o.max_tokens * ld_gu) * sizeof(cuda::bf16_bits);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    if (off.slot[size_t(l)] < 0) continue;
    LATHE_ASSIGN_OR_RETURN(off.host[size_t(l)], cuda::PinnedBuffer::alloc(o.device, bytes));
  }
  return Status::ok();
}

int COffload::of(int64_t l) const { return slot.empty() ? -1 : slot[size_t(l)]; }

// Layer l's [gate | up] between its staging buffer and the host, on the
// copy stream once the main stream is done with the buffer; `done` marks
// the copy.
Status CudaModelImpl::offload_copy(int64_t l, int64_t n, bool to_host, cuda::CudaEvent& done) {
  const int sl = off.of(l);
  void* host = off.host[size_t(l)].data();
  const size_t bytes = size_t(n * ld_gu) * sizeof(cuda::bf16_bits);
  LATHE_TRY(off.used[sl].wait(*off.ctx));
  LATHE_TRY(to_host ? cuda::copy_async(*off.ctx, host, off.stage[sl], bytes)
                    : cuda::copy_async(*off.ctx, off.stage[sl], host, bytes));
  return done.record(*off.ctx);
}

Status CudaModelImpl::offload_before_write(int64_t l) {
  return off.of(l) < 0 ? Status::ok() : off.free[off.of(l)].wait(ctx);
}

Status CudaModelImpl::offload_after_forward(int64_t l, int64_t n) {
  const int sl = off.of(l);
  if (sl < 0 || !training_pass) return Status::ok();
  LATHE_TRY(off.used[sl].record(ctx));
  return offload_copy(l, n, /*to_host=*/true, off.free[sl]);
}

Status CudaModelImpl::offload_begin_backward(int64_t n) {
  for (int64_t l = s.n_layer - 1, fetched = 0; l >= 0 && fetched < 2; --l) {
    if (off.of(l) < 0) continue;
    LATHE_TRY(offload_copy(l, n, /*to_host=*/false, off.ready[off.of(l)]));
    ++fetched;
  }
  return Status::ok();
}

Status CudaModelImpl::offload_before_backward(int64_t l) {
  return off.of(l) < 0 ? Status::ok() : off.ready[off.of(l)].wait(ctx);
}

Status CudaModelImpl::offload_after_backward(int64_t l, int64_t n) {
  const int sl = off.of(l);
  if (sl < 0) return Status::ok();
  LATHE_TRY(off.used[sl].record(ctx));
  for (int64_t below = l - 1; below >= 0; --below)
    if (off.of(below) == sl) return offload_copy(below, n, /*to_host=*/false, off.ready[sl]);
  return Status::ok();
}

}  // namespace lathe
