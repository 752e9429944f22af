// StopMatcher: text before a stop string streams out, text that may begin
// one is held back, and nothing of a stop string is ever emitted.
#include <gtest/gtest.h>

#include "engine/stop_matcher.h"

namespace lathe {
namespace {

TEST(StopMatcher, WithoutStopStringsEverythingPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("hello "), "hello ");
  EXPECT_EQ(m.push("world"), "world");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, HoldsBackAPossibleStartAndCutsBeforeTheMatch) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("abc E"), "abc ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("Dxyz"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesHeldTextWhenTheStopDoesNotFollow) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("xEN"), "x");
  EXPECT_EQ(m.push("Ox"), "ENOx");
  EXPECT_EQ(m.push("E"), "");
  EXPECT_EQ(m.flush(), "E");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, TheEarliestMatchWinsAcrossStopStrings) {
  StopMatcher m({"bc", "ab"});
  EXPECT_EQ(m.push("xabc"), "x");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, FindsAMatchThatOverlapsAFalseStart) {
  StopMatcher m({"aab"});
  EXPECT_EQ(m.push("aa"), "");
  EXPECT_EQ(m.push("a"), "a");  // "aaa": only the last "aa" can still start "aab"
  EXPECT_EQ(m.push("b!"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, HoldsTheLongestPossibleStartOfAnyStopString) {
  StopMatcher m({"\n\nUser:", "###"});
  EXPECT_EQ(m.push("Answer.\n\nUs"), "Answer.");
  EXPECT_EQ(m.push("ually"), "\n\nUsually");
  EXPECT_EQ(m.push(" #"), " ");
  EXPECT_EQ(m.push("##"), "");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace lathe
