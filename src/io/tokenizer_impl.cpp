// Encoding and decoding through the loaded pipeline. Encoding order follows
// the reference library: added tokens are cut out of the raw text first,
// each remaining piece is normalized on its own (so a Prepend normalizer
// applies once per piece), normalized added tokens are cut out of that,
// then pre-tokenization splits words for the model, and the post-processor
// adds the template's special tokens last.
#include "io/tokenizer_impl.h"

namespace lathe {

const std::string& TokenizerImpl::token(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && size_t(id) < id_to_token.size() ? id_to_token[size_t(id)] : kEmpty;
}

void TokenizerImpl::encode_plain(std::string_view text, bool at_origin, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  thread_local std::vector<tok::Piece> pieces;
  pieces.clear();
  pieces.push_back({text, at_origin});
  tok::PieceArena arena;
  if (pre_tokenizer) pre_tokenizer->apply(pieces, arena);
  for (const tok::Piece& p : pieces) model->tokenize(p.text, out);
}

void TokenizerImpl::encode_normalized(std::string_view text, bool at_origin, std::vector<int32_t>& out) const {
  if (!normalizer && normalized_matcher.empty()) return encode_plain(text, at_origin, out);
  std::string norm(text);
  if (normalizer) normalizer->apply(norm);
  if (normalized_matcher.empty()) return encode_plain(norm, at_origin, out);
  std::vector<tok::Segment> segs;
  normalized_matcher.split(norm, segs);
  for (const tok::Segment& s : segs) {
    if (s.id >= 0) out.push_back(s.id);
    else encode_plain(std::string_view(norm).substr(s.begin, s.end - s.begin), at_origin && s.begin == 0, out);
  }
}

void TokenizerImpl::encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const {
  out.clear();
  if (raw_matcher.empty()) {
    encode_normalized(text, true, out);
  } else {
    std::vector<tok::Segment> segs;
    raw_matcher.split(text, segs);
    for (const tok::Segment& s : segs) {
      if (s.id >= 0) out.push_back(s.id);
      else encode_normalized(text.substr(s.begin, s.end - s.begin), s.begin == 0, out);
    }
  }
  if (add_special_tokens && post_processor) post_processor->apply(out);
}

std::string TokenizerImpl::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= id_to_token.size() || !(id_flags[size_t(id)] & kKnown)) continue;
    if (skip_special_tokens && (id_flags[size_t(id)] & kSpecial)) continue;
    tokens.push_back(id_to_token[size_t(id)]);
  }
  if (!decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined.append(i ? " " : "").append(tokens[i]);
    return joined;
  }
  decoder->decode_chain(tokens);
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

}  // namespace lathe
