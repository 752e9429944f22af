// StopMatcher: cuts streamed text at the first stop string. Text that could
// still be the beginning of a stop string is held back until the next piece
// settles it, so a client never sees part of a stop string.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lathe {

// Holds back text that could be the start of a stop string and cuts text at
// the first complete one.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stop_strings) : stops_(std::move(stop_strings)) {}
  // Appends text; returns what is now safe to emit. Once a stop string is
  // seen, returns the text before it and stopped() turns true.
  std::string push(std::string_view text);
  // The held-back rest, at the end of generation.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace lathe
