// The GPU LoRA trainer's side stream: the backward's LoRA weight gradients
// (dB = dyᵀ·(s·u), dA = duᵀ·x, and the x·Aᵀ a recomputation reruns only for
// them) run on a second context's stream while the main stream runs what
// the next steps need: du (an input of the dx GEMM), the dx GEMMs and the
// row kernels between them. CudaTrainOptions::lora_overlap
// (LATHE_CUDA_LORA_OVERLAP): 2 (the default) with the side stream at the
// device's greatest priority, 1 at the default priority, 0 off.
//
// Measured (H200, bench_train_cuda, 2026-11-30): at the 1B shape the LoRA
// phase on the main stream drops from 17.3 to 12.1 ms a step, but the base
// GEMMs and the attention backward slow by nearly as much (the persistent
// base GEMMs hold one block per SM, a whole SM's registers, for their whole
// run, so the side's kernels mostly fill their tails and the gaps between
// small kernels): +0.3 to 0.4% tokens/s, in every one of 3 alternated
// pairs. At the 8B shape (selective) no gain (±0.2%, noise). Deferring
// gate|up's and o's gradients to run beside the attention backward gained
// nothing more and was dropped. Cost: the side's cuBLASLt workspace,
// 64 MiB outside the arena (the 8B run stays within 37.25 GiB); its scratch
// lies over tmp_h (below), no arena bytes.
//
// Ordering, by events (backends/cuda/stream_fork.h), all decided by the host
// as it enqueues:
//   - fork: before side work, the side stream waits for the main stream's
//     work so far (the inputs: dy, x_ext; du before dA);
//   - before a group's dx GEMM the main stream waits for the previous
//     group's side work, so the side runs at most one group behind. From a
//     group's fork to the next group's dx the main stream writes none of
//     what the group's side work reads (its dy_ext and x_ext) — except where
//     dx itself overlays them (down's dx over the recomputed silu(gate)·up):
//     there dx waits for all side work;
//   - a recomputation rewrites shared inputs (xn1, xn2, q|k|v's dy_ext): it
//     waits for all side work first, and so does the end of the backward,
//     so the gradients are complete in main-stream order for clip, AdamW
//     and reads.
// The side has its own scratch (x.lora_side_f32, as large as the main
// one's x.lora_f32, over tmp_h: the side runs only in the backward, where
// tmp_h is written only inside a recomputation, which starts by waiting
// for all side work and ends before side work is forked again) and its own
// cuBLASLt workspace of the main one's size: each GEMM plans the same
// algorithm on either stream, and every kernel and reduction order is the
// same, so results are bitwise those of the serial order
// (tests/cuda_train/cuda_lora_overlap_test.cpp). The step is not captured
// in a CUDA graph today; the fork/join pattern would capture as it is (the
// final join brings the side stream back before the pass returns).
//
// Phase timing (CudaTrainableModel::set_phase_timing) cuts the MAIN
// stream's timeline: its "LoRA" phase is then the LoRA work left on the
// main stream (x·Aᵀ of the forward, du) plus the time the main stream
// stalls waiting for the side; the side's kernels are counted only as far
// as they slow or stall the main stream (the phases still add up to the
// step).
#include "train/cuda_model_impl.h"

namespace lathe {

Status CudaModelImpl::side_start() {
  if (overlap_mode == 0) return Status::ok();
  LATHE_ASSIGN_OR_RETURN(cuda::CudaContext c, cuda::create_side_context(ctx, overlap_mode == 2));
  for (cuda::CudaEvent* e : {&side.fork, &side.join, &side.done[0], &side.done[1]}) {
    LATHE_ASSIGN_OR_RETURN(*e, cuda::CudaEvent::create());
  }
  side.ctx.emplace(std::move(c));
  return Status::ok();
}

Status CudaModelImpl::side_fork() {
  LATHE_TRY(side.fork.record(ctx));
  LATHE_TRY(side.fork.wait(*side.ctx));
  side.busy = true;
  return Status::ok();
}

Status CudaModelImpl::side_join() {
  if (!side.busy) return Status::ok();
  LATHE_TRY(phase(kPhLora));  // a stall here is the LoRA branch's
  LATHE_TRY(side.join.record(*side.ctx));
  LATHE_TRY(side.join.wait(ctx));
  side.busy = false;
  side.prev = -1;
  return Status::ok();
}

bool CudaModelImpl::dx_overlays(const bf16p dx, int64_t in, const bf16p xe, int64_t ldx, const bf16p dye,
                                int64_t ld_dy, int64_t n) const {
  const auto* lo = reinterpret_cast<const char*>(dx);
  const auto* hi = reinterpret_cast<const char*>(dx + n * in);
  auto overlays = [&](const bf16p p, int64_t ld) {
    return lo < reinterpret_cast<const char*>(p + n * ld) && reinterpret_cast<const char*>(p) < hi;
  };
  return overlays(xe, ldx) || overlays(dye, ld_dy);
}

Status CudaModelImpl::side_before_dx(bool on_side, bool overlay) {
  if (!overlap()) return Status::ok();
  if (!on_side || overlay) return side_join();
  LATHE_TRY(phase(kPhLora));  // a stall here is the LoRA branch's
  if (side.prev >= 0) LATHE_TRY(side.done[side.prev].wait(ctx));
  LATHE_TRY(side.done[side.slot].record(*side.ctx));
  side.prev = side.slot;
  side.slot ^= 1;
  return Status::ok();
}

Status CudaModelImpl::lora_u_for_grads(int64_t l, int g, bf16p xe, int64_t n) {
  if (!overlap() || blocks[size_t(l)].g[size_t(g)].loras.empty()) return lora_u(l, g, xe, n);
  LATHE_TRY(phase(kPhLora));
  LATHE_TRY(side_fork());
  return lora_u_on(*side.ctx, x.lora_side_f32, l, g, xe, n);
}

}  // namespace lathe
