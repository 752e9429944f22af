// Logging to stderr with a level set once from LATHE_LOG_LEVEL (see env.h).
// LATHE_LOG(kInfo, "loaded ", n, " tensors from ", path);
#pragma once

#include <sstream>
#include <string>

#include "core/check.h"  // detail::concat

namespace lathe {

enum class LogLevel : uint8_t { kDebug, kInfo, kWarn, kError, kOff };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const std::string& msg);

}  // namespace lathe

// Every argument is streamed in order: LATHE_LOG(kInfo, "read ", n, " rows").
#define LATHE_LOG(level, ...)                                                              \
  do {                                                                                     \
    if (::lathe::LogLevel::level >= ::lathe::log_level()) {                                \
      ::lathe::log_message(::lathe::LogLevel::level, ::lathe::detail::concat(__VA_ARGS__)); \
    }                                                                                      \
  } while (0)
