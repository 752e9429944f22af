// Where a stream's time goes, by phase: mark(p) records a CUDA event and
// says that what is enqueued from now on belongs to phase p, so the stream's
// timeline is cut into back-to-back intervals with no gaps and nothing
// counted twice. Events come from a fixed pool; when it fills, the timer
// waits for the stream and folds the intervals into its totals (profiling
// runs only: it synchronizes). Threads: one thread drives one timer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

class PhaseTimer {
 public:
  static Result<PhaseTimer> create(std::vector<std::string> phase_names, int pool = 4096);
  PhaseTimer();
  PhaseTimer(PhaseTimer&&) noexcept;
  PhaseTimer& operator=(PhaseTimer&&) noexcept;
  ~PhaseTimer();

  Status mark(CudaContext& ctx, int phase);
  // Waits for the stream; milliseconds per phase since the last reset (the
  // interval after the last mark is closed by an event recorded now).
  Result<std::vector<double>> totals_ms(CudaContext& ctx);
  void reset();
  const std::vector<std::string>& names() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lathe::cuda
