// Logging to stderr with a level set once from LATHE_LOG_LEVEL (see env.h).
// LATHE_LOG(kInfo, "loaded ", n, " tensors from ", path);
#pragma once

#include <sstream>
#include <string>

namespace lathe {

enum class LogLevel : uint8_t { kDebug, kInfo, kWarn, kError, kOff };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const std::string& msg);

}  // namespace lathe

#define LATHE_LOG(level, ...)                                       \
  do {                                                              \
    if (::lathe::LogLevel::level >= ::lathe::log_level()) {         \
      std::ostringstream lathe_log_os_;                             \
      (lathe_log_os_ << __VA_ARGS__);                               \
      ::lathe::log_message(::lathe::LogLevel::level, lathe_log_os_.str()); \
    }                                                               \
  } while (0)
