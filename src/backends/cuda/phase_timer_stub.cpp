// PhaseTimer (phase_timer.h) in a build without nvcc: creation reports that
// this build has no CUDA, so no timer ever exists to be called.
#include "backends/cuda/phase_timer.h"

namespace lathe::cuda {

struct PhaseTimer::Impl {
  std::vector<std::string> names;
};
PhaseTimer::PhaseTimer() = default;
PhaseTimer::PhaseTimer(PhaseTimer&&) noexcept = default;
PhaseTimer& PhaseTimer::operator=(PhaseTimer&&) noexcept = default;
PhaseTimer::~PhaseTimer() = default;
Result<PhaseTimer> PhaseTimer::create(std::vector<std::string>, int) {
  return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)");
}
Status PhaseTimer::mark(CudaContext&, int) { return unsupported("cuda: no CUDA"); }
Result<std::vector<double>> PhaseTimer::totals_ms(CudaContext&) { return unsupported("cuda: no CUDA"); }
void PhaseTimer::reset() {}
const std::vector<std::string>& PhaseTimer::names() const { return impl_->names; }

}  // namespace lathe::cuda
