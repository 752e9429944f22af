#include "core/parallel.h"

#include <omp.h>

#include "core/env.h"

namespace lathe {

void init_threads() {
  static bool done = false;
  if (done) return;
  done = true;
  omp_set_num_threads(env::num_threads());
}

int num_threads() { return omp_get_max_threads(); }
void set_num_threads(int n) { omp_set_num_threads(n > 0 ? n : 1); }

}  // namespace lathe
