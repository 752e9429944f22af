// StopMatcher: a scan for the earliest complete stop string, then the
// longest suffix that is a proper prefix of one is held back.
#include "engine/stop_matcher.h"

#include <algorithm>

namespace lathe {

namespace {

// Length of the longest proper prefix of some stop string that text ends with.
size_t held_suffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    size_t max_k = std::min(s.size() - 1, text.size());
    for (size_t k = max_k; k > best; --k) {
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

}  // namespace

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_ += text;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  size_t keep = held_suffix(pending_, stops_);
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace lathe
