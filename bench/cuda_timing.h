// Timing for the CUDA benches: seconds per call of a launcher, best of five
// batches after a warm-up batch, with the device synchronized around each
// batch. A launcher that fails ends the bench with its message.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "backends/cuda/cuda_ops.h"

namespace lathe::bench {

inline double time_calls(const char* bench, cuda::CudaContext& ctx, int calls, const std::function<Status()>& fn) {
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      Status st = fn();
      if (!st.is_ok()) {
        std::fprintf(stderr, "%s: %s\n", bench, st.message().c_str());
        std::exit(1);
      }
    }
    if (!ctx.synchronize().is_ok()) std::exit(1);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    if (rep > 0 && s < best) best = s;
  }
  return best;
}

}  // namespace lathe::bench
