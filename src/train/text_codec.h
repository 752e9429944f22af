// The TextCodec of a real tokenizer and chat template: the one place where
// building training examples meets src/io. Kept apart from the masking logic
// so that logic is tested with small fakes as well as with real tokenizers.
#pragma once

#include <optional>
#include <string>

#include "core/status.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "train/example.h"

namespace lathe {

// tok and chat are copied (both share their immutable state, so copies are
// cheap); the codec may be used from many threads. chat: std::nullopt when the
// model has no chat template (then {messages} records are errors).
TextCodec make_text_codec(const Tokenizer& tok, const std::optional<ChatTemplate>& chat);

// Loads the tokenizer in dir (a tokenizer.json or its directory) and, when
// tokenizer_config.json has a chat template, that template.
Result<TextCodec> load_text_codec(const std::string& dir);

}  // namespace lathe
