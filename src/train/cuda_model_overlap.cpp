// The GPU LoRA trainer's side stream: the backward's LoRA weight gradients
// (dB = dyᵀ·(s·u), dA = duᵀ·x, and the x·Aᵀ a recomputation reruns only for
// them) run on a second context's stream while the main stream runs what
// the next steps need: du (an input of the dx GEMM), the dx GEMMs, the
// attention backward and the row kernels between them. The skinny LoRA
// GEMMs are memory-bound; the main stream's big kernels compute-bound.
//
// CudaTrainOptions::lora_overlap (LATHE_CUDA_LORA_OVERLAP): 0 off; 1 each
// group's dB and dA at once (dB from the group's start, dA once du is
// split); 3 gate|up's and o's (and a recomputation's x·Aᵀ for gate|up and
// q|k|v) deferred until o's dx is done, so that they run beside the
// attention backward (down's and q|k|v's gradients at once: their inputs
// do not live that long); 2 and 4 as 1 and 3 with the side stream at the
// device's greatest priority.
//
// Ordering, by events (backends/cuda/stream_fork.h), all decided by the host
// as it enqueues:
//   - fork: before side work, the side stream waits for the main stream's
//     work so far (the inputs: dy, x_ext; du before dA);
//   - before a group's dx GEMM the main stream waits for the side work
//     enqueued before the group's own (the previous group's, or the
//     deferred batch), so the side runs at most about a group behind. From
//     a group's fork to that wait the main stream writes none of what the
//     group's side work reads (its dy_ext and x_ext) — except where dx
//     itself overlays them (down's dx over the recomputed silu(gate)·up):
//     there dx waits for all side work enqueued. Deferred work reads
//     gate|up (kept per layer), xn1 and xn2 (rewritten only by the next
//     recomputation), the o rows of dh_bf and the attention output, none
//     written before q|k|v's dx, which waits for it (a dx that would
//     overlay deferred work's inputs enqueues and waits for it first);
//   - a recomputation rewrites shared inputs (xn1, xn2, q|k|v's dy_ext): it
//     waits for all side work first, and so does the end of the backward,
//     so the gradients are complete in main-stream order for clip, AdamW
//     and reads.
// The side has its own scratch (x.lora_side_f32, as large as the main
// one's x.lora_f32, over tmp_h: the side runs only in the backward, and
// tmp_h is written there only inside a recomputation, which starts by
// waiting for all side work and ends before side work is forked again; so
// it costs no memory) and its own
// cuBLASLt workspace of the main one's size (64 MiB, outside the arena):
// each GEMM plans the same algorithm on either stream, and every kernel
// and reduction order is the same, so results are bitwise those of the
// serial order. The step is not captured in a CUDA graph today; the
// fork/join pattern would capture as it is (the final join brings the side
// stream back before the pass returns).
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
  LATHE_ASSIGN_OR_RETURN(cuda::CudaContext c, cuda::create_side_context(ctx, overlap_mode % 2 == 0));
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

Status CudaModelImpl::side_flush() {
  if (side.later.empty()) return Status::ok();
  LATHE_TRY(side_fork());
  for (const CLoraTask& t : side.later) {
    if (t.u) {
      LATHE_TRY(lora_u_on(*side.ctx, x.lora_side_f32, t.l, t.g, t.xe, t.n));
      continue;
    }
    LATHE_TRY(lora_db(*side.ctx, x.lora_side_f32, *t.group, t.xe, t.dye, t.ld_dy, t.n));
    LATHE_TRY(lora_da(*side.ctx, x.lora_side_f32, *t.group, t.xe, t.dye, t.ld_dy, t.n));
  }
  side.later.clear();
  LATHE_TRY(side.done[side.slot].record(*side.ctx));  // covers all side work so far
  side.prev = side.slot;
  side.slot ^= 1;
  return Status::ok();
}

Status CudaModelImpl::side_fork_for(int64_t l, int g) {
  for (const CLoraTask& t : side.later)
    if (t.l == l && t.g == g) return side_flush();  // its deferred x·Aᵀ goes first (and forks)
  return side_fork();
}

Status CudaModelImpl::side_join() {
  LATHE_TRY(side_flush());
  return side_wait_all();
}

Status CudaModelImpl::side_wait_all() {
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
    return p && lo < reinterpret_cast<const char*>(p + n * ld) && reinterpret_cast<const char*>(p) < hi;
  };
  return overlays(xe, ldx) || overlays(dye, ld_dy);
}

SideRun CudaModelImpl::side_run_of(int g, int64_t n_lora, bool overlay) const {
  if (!overlap() || n_lora == 0) return SideRun::kMain;
  const bool defers = overlap_mode >= 3 && (g == kGgu || g == kGo);
  return defers && !overlay ? SideRun::kLater : SideRun::kNow;
}

Status CudaModelImpl::side_before_dx(SideRun run, bool overlay, const bf16p dx, int64_t in, int64_t n) {
  if (!overlap()) return Status::ok();
  bool hits_later = false;  // dx overlays what deferred work reads: it goes now
  for (const CLoraTask& t : side.later)
    hits_later = hits_later || dx_overlays(dx, in, t.xe, t.group->ldx, t.dye, t.ld_dy, n);
  if (hits_later) LATHE_TRY(side_flush());
  if (run == SideRun::kMain || overlay || hits_later) return side_wait_all();
  LATHE_TRY(phase(kPhLora));  // a stall here is the LoRA branch's
  if (side.prev >= 0) LATHE_TRY(side.done[side.prev].wait(ctx));
  side.prev = -1;
  if (run == SideRun::kLater) return Status::ok();
  LATHE_TRY(side.done[side.slot].record(*side.ctx));
  side.prev = side.slot;
  side.slot ^= 1;
  return Status::ok();
}

Status CudaModelImpl::side_after_dx(int g) { return overlap() && g == kGo ? side_flush() : Status::ok(); }

// A recomputation's x·Aᵀ that only the LoRA gradients read: on the side
// stream, deferred with them for q|k|v (a layer keeping q, k, v) and
// gate|up (xn1 and xn2 are next rewritten by the next recomputation, which
// waits for all side work); down's (over the recomputed silu(gate)·up,
// which down's own dx overlays) at once.
Status CudaModelImpl::lora_u_for_grads(int64_t l, int g, bf16p xe, int64_t n) {
  const CGroup& G = blocks[size_t(l)].g[size_t(g)];
  if (!overlap() || G.loras.empty()) return lora_u(l, g, xe, n);
  if (overlap_mode >= 3 && g != kGdown) {
    side.later.push_back({.group = &G, .l = l, .g = g, .u = true, .xe = xe, .n = n});
    return Status::ok();
  }
  LATHE_TRY(phase(kPhLora));
  LATHE_TRY(side_fork());
  return lora_u_on(*side.ctx, x.lora_side_f32, l, g, xe, n);
}

}  // namespace lathe
