// Decoders and post-processors of tokenizer.json. A decoder rewrites the list
// of token strings (some steps per token, some fusing them all); the decoded
// text is the concatenation of what the chain leaves. A post-processor adds
// the special tokens of a template around the encoded ids.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace lathe::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Called only when special tokens are requested.
  virtual void apply(std::vector<int32_t>& ids) const = 0;
};

Result<std::unique_ptr<Decoder>> parse_decoder(const nlohmann::json& j, const std::string& where);
Result<std::unique_ptr<PostProcessor>> parse_post_processor(const nlohmann::json& j, const std::string& where);

}  // namespace lathe::tok
