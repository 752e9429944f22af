// TextCodec over lathe's tokenizer and chat template (see text_codec.h).
#include "train/text_codec.h"

#include <filesystem>

namespace lathe {

TextCodec make_text_codec(const Tokenizer& tok, const std::optional<ChatTemplate>& chat) {
  TextCodec codec;
  codec.encode = [tok](std::string_view text, bool add_special) { return tok.encode(text, add_special); };
  codec.is_special = [tok](int32_t id) { return tok.is_special(id); };
  if (chat) {
    codec.render_chat = [tmpl = *chat](const nlohmann::ordered_json& messages, bool add_generation_prompt) {
      return tmpl.render(messages, add_generation_prompt);
    };
  }
  codec.eos_id = tok.eos_token_id();
  codec.vocab_size = tok.vocab_size();
  return codec;
}

Result<TextCodec> load_text_codec(const std::string& dir) {
  LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(dir));
  std::optional<ChatTemplate> chat;
  if (!tok.chat_template().empty()) {
    std::filesystem::path p(dir);
    std::filesystem::path config = std::filesystem::is_directory(p) ? p : p.parent_path();
    LATHE_ASSIGN_OR_RETURN(chat, ChatTemplate::from_tokenizer_config(config.string()));
  }
  return make_text_codec(tok, chat);
}

}  // namespace lathe
