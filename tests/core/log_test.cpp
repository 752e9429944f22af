#include <gtest/gtest.h>

#include "core/log.h"

namespace lathe {
namespace {

TEST(Log, StreamsEveryArgumentInOrder) {
  testing::internal::CaptureStderr();
  LATHE_LOG(kError, "read ", 3, " rows from ", "a.jsonl");
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("read 3 rows from a.jsonl"), std::string::npos) << err;
}

TEST(Log, BelowTheLevelPrintsNothing) {
  LogLevel old = log_level();
  set_log_level(LogLevel::kWarn);
  testing::internal::CaptureStderr();
  LATHE_LOG(kInfo, "hidden");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  set_log_level(old);
}

}  // namespace
}  // namespace lathe
