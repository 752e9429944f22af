#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace lathe::detail {
void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "lathe: internal check failed at %s:%d: %s%s%s\n", file, line, cond,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace lathe::detail
