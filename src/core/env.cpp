#include "core/env.h"

#include <cstdlib>
#include <thread>

namespace lathe::env {

std::string get(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

std::string log_level() { return get("LATHE_LOG_LEVEL", "info"); }

int num_threads() {
  for (const char* name : {"LATHE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    std::string v = get(name);
    if (!v.empty()) {
      int n = std::atoi(v.c_str());
      if (n > 0) return n;
    }
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

}  // namespace lathe::env
