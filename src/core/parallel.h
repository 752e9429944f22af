// CPU parallelism through OpenMP. Thread count comes from env::num_threads()
// (LATHE_NUM_THREADS / OMP_NUM_THREADS) and is applied once by init_threads().
#pragma once

#include <cstdint>

namespace lathe {

// Applies env::num_threads() to OpenMP and OpenBLAS. Safe to call repeatedly.
void init_threads();
int num_threads();
void set_num_threads(int n);

// Calls fn(begin, end) on contiguous chunks of [0, n) across threads.
// fn must be thread-safe for disjoint ranges. grain: minimum chunk size.
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  if (n <= grain) {
    fn(int64_t{0}, n);
    return;
  }
  int64_t chunks = (n + grain - 1) / grain;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = c * grain;
    int64_t e = b + grain < n ? b + grain : n;
    fn(b, e);
  }
}

}  // namespace lathe
