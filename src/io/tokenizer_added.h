// Added tokens (special or not) matched in text before the model sees it:
// leftmost-longest over all token contents with a byte trie, then the
// single_word / lstrip / rstrip rules of the reference library. Tokens with
// normalized=false are matched in the raw text; normalized=true ones in each
// normalized piece, against their normalized content.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lathe::tok {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A part of the input: an added token (id >= 0) or plain text (id == -1).
struct Segment {
  size_t begin, end;
  int32_t id;
};

class AddedMatcher {
 public:
  // patterns[i] is matched and yields tokens[i]; tokens are borrowed and must
  // outlive the matcher.
  void build(const std::vector<std::string>& patterns, const std::vector<const AddedToken*>& tokens);
  bool empty() const { return tokens_.empty(); }
  // Splits text into segments covering it in order; plain segments may be
  // empty only when text is.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  // Longest pattern starting at text[i]: its index and length, or -1.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t i) const;

  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t pattern = -1;
  };
  std::vector<Node> nodes_;
  std::vector<const AddedToken*> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace lathe::tok
