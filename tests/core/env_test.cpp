// The GPU switches read from the environment: a value outside what a
// switch takes is an error naming the variable, never a silent default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/scoped_env.h"

namespace lathe {
namespace {

using testing::ScopedEnv;

TEST(Env, AttentionBackwardStreams) {
  {
    ScopedEnv unset("LATHE_ATTN_BWD_STREAMS", "");
    auto n = env::attn_bwd_streams();
    ASSERT_TRUE(n.is_ok()) << n.status().message();
    EXPECT_EQ(*n, 2);
  }
  {
    ScopedEnv one("LATHE_ATTN_BWD_STREAMS", "1");
    auto n = env::attn_bwd_streams();
    ASSERT_TRUE(n.is_ok()) << n.status().message();
    EXPECT_EQ(*n, 1);
  }
  for (const char* bad : {"3", "0", "two"}) {
    ScopedEnv b("LATHE_ATTN_BWD_STREAMS", bad);
    auto n = env::attn_bwd_streams();
    ASSERT_FALSE(n.is_ok()) << bad;
    EXPECT_NE(n.status().message().find("LATHE_ATTN_BWD_STREAMS"), std::string::npos) << n.status().message();
  }
}

TEST(Env, LoraOverlap) {
  ScopedEnv bad("LATHE_CUDA_LORA_OVERLAP", "5");
  auto n = env::cuda_lora_overlap();
  ASSERT_FALSE(n.is_ok());
  EXPECT_NE(n.status().message().find("LATHE_CUDA_LORA_OVERLAP"), std::string::npos) << n.status().message();
}

// One count for every decode GEMV, or five (q|k|v, o, gate|up, down, LM head).
TEST(Env, DecodeL2Prefetch) {
  using Units = std::vector<int64_t>;
  for (auto [value, want] : {std::pair<const char*, Units>{"", {-1, -1, -1, -1, -1}}, {"3", {3, 3, 3, 3, 3}},
                             {"0,1,2,64,1", {0, 1, 2, 64, 1}}}) {
    ScopedEnv set("LATHE_CUDA_DECODE_L2_PREFETCH", value);
    auto units = env::cuda_decode_l2_prefetch();
    ASSERT_TRUE(units.is_ok()) << value << ": " << units.status().message();
    EXPECT_EQ(*units, want) << value;
  }
  for (const char* bad : {"65", "-1", "1,2", "1,2,3,4,5,6", "3,,3,3,3", "all", "1,2,3,4,5,"}) {
    ScopedEnv set("LATHE_CUDA_DECODE_L2_PREFETCH", bad);
    auto units = env::cuda_decode_l2_prefetch();
    ASSERT_FALSE(units.is_ok()) << bad;
    EXPECT_NE(units.status().message().find("LATHE_CUDA_DECODE_L2_PREFETCH"), std::string::npos)
        << units.status().message();
  }
}

TEST(Env, DecodeL2PrefetchLag) {
  for (auto [value, want] : {std::pair<const char*, int64_t>{"", 1}, {"-1", -1}, {"0", 0}, {"64", 64}}) {
    ScopedEnv set("LATHE_CUDA_DECODE_L2_PREFETCH_LAG", value);
    auto lag = env::cuda_decode_l2_prefetch_lag();
    ASSERT_TRUE(lag.is_ok()) << value << ": " << lag.status().message();
    EXPECT_EQ(*lag, want) << value;
  }
  for (const char* bad : {"-2", "65", "soon", "1,2"}) {
    ScopedEnv set("LATHE_CUDA_DECODE_L2_PREFETCH_LAG", bad);
    auto lag = env::cuda_decode_l2_prefetch_lag();
    ASSERT_FALSE(lag.is_ok()) << bad;
    EXPECT_NE(lag.status().message().find("LATHE_CUDA_DECODE_L2_PREFETCH_LAG"), std::string::npos)
        << lag.status().message();
  }
}

}  // namespace
}  // namespace lathe
