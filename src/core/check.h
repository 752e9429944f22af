// LATHE_CHECK: invariants. A failed check is a bug in lathe, not bad input:
// it prints file:line and the message, then aborts, in every build type.
#pragma once

#include <sstream>
#include <string>

namespace lathe::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace lathe::detail

#define LATHE_CHECK(cond, ...)                                                          \
  do {                                                                                  \
    if (!(cond)) [[unlikely]]                                                           \
      ::lathe::detail::check_failed(__FILE__, __LINE__, #cond,                          \
                                    ::lathe::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
