// PhaseTimer (phase_timer.h): a pool of CUDA events recorded on the
// context's stream; elapsed times between consecutive events are added to
// the phase the earlier event opened.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/phase_timer.h"

namespace lathe::cuda {

struct PhaseTimer::Impl {
  std::vector<std::string> names;
  std::vector<cudaEvent_t> events;
  std::vector<int> phase_of;  // per recorded event: the phase it opens
  int used = 0;
  std::vector<double> totals;
  ~Impl() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  // Folds events [0, used) into totals and keeps the last one open.
  Status fold() {
    if (used == 0) return Status::ok();
    LATHE_CU_TRY(cudaEventSynchronize(events[size_t(used - 1)]));
    for (int k = 1; k < used; ++k) {
      float ms = 0;
      LATHE_CU_TRY(cudaEventElapsedTime(&ms, events[size_t(k - 1)], events[size_t(k)]));
      totals[size_t(phase_of[size_t(k - 1)])] += ms;
    }
    std::swap(events[0], events[size_t(used - 1)]);
    phase_of[0] = phase_of[size_t(used - 1)];
    used = 1;
    return Status::ok();
  }
};

PhaseTimer::PhaseTimer() = default;
PhaseTimer::PhaseTimer(PhaseTimer&&) noexcept = default;
PhaseTimer& PhaseTimer::operator=(PhaseTimer&&) noexcept = default;
PhaseTimer::~PhaseTimer() = default;

Result<PhaseTimer> PhaseTimer::create(std::vector<std::string> phase_names, int pool) {
  if (phase_names.empty() || pool < 2) return invalid_argument("cuda phase timer: no phases or a pool under 2");
  PhaseTimer t;
  t.impl_ = std::make_unique<Impl>();
  t.impl_->names = std::move(phase_names);
  t.impl_->totals.assign(t.impl_->names.size(), 0.0);
  t.impl_->phase_of.assign(size_t(pool), 0);
  for (int i = 0; i < pool; ++i) {
    cudaEvent_t e = nullptr;
    LATHE_CU_TRY(cudaEventCreate(&e));
    t.impl_->events.push_back(e);
  }
  return std::move(t);
}

Status PhaseTimer::mark(CudaContext& ctx, int phase) {
  Impl& im = *impl_;
  if (phase < 0 || size_t(phase) >= im.names.size()) return invalid_argument("cuda phase timer: phase ", phase);
  if (im.used == int(im.events.size())) LATHE_TRY(im.fold());
  LATHE_CU_TRY(cudaEventRecord(im.events[size_t(im.used)], stream_of(ctx)));
  im.phase_of[size_t(im.used)] = phase;
  ++im.used;
  return Status::ok();
}

Result<std::vector<double>> PhaseTimer::totals_ms(CudaContext& ctx) {
  Impl& im = *impl_;
  if (im.used > 0) LATHE_TRY(mark(ctx, im.phase_of[size_t(im.used - 1)]));
  LATHE_TRY(im.fold());
  return im.totals;
}

void PhaseTimer::reset() {
  impl_->used = 0;
  impl_->totals.assign(impl_->names.size(), 0.0);
}

const std::vector<std::string>& PhaseTimer::names() const { return impl_->names; }

}  // namespace lathe::cuda
