#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/env.h"

namespace lathe {
namespace {
LogLevel parse_level(const std::string& s) {
  if (s == "debug") return LogLevel::kDebug;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  if (s == "off") return LogLevel::kOff;
  return LogLevel::kInfo;
}
std::atomic<int>& level_slot() {
  static std::atomic<int> level{static_cast<int>(parse_level(env::log_level()))};
  return level;
}
}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_slot().load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { level_slot().store(static_cast<int>(level)); }

void log_message(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  static const char* kNames[] = {"debug", "info", "warn", "error", "off"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[lathe %s] %s\n", kNames[static_cast<int>(level)], msg.c_str());
}

}  // namespace lathe
