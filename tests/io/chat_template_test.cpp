// Whole conversations through ChatTemplate, compared byte for byte with
// transformers' apply_chat_template(tokenize=False): the real templates of
// ../shared/tokenizers/{llama3,qwen3} and the templates in
// tests/data/chat_templates/*.jinja (expected.json, made by
// tools/make_chat_template_fixtures.py).
#include "io/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace lathe {
namespace {

const std::string kData = std::string(LATHE_TEST_DATA) + "/chat_templates";
const std::string kTokenizers = std::string(LATHE_SOURCE_DIR) + "/../shared/tokenizers";

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<ChatTemplate> template_for(const nlohmann::ordered_json& c) {
  if (c["template_file"].is_null()) return ChatTemplate::from_tokenizer_config(kTokenizers + "/" + c["tokenizer"].get<std::string>());
  LATHE_ASSIGN_OR_RETURN(ChatTemplate ct, ChatTemplate::parse(read(kData + "/" + c["template_file"].get<std::string>())));
  for (auto it = c["special_tokens"].begin(); it != c["special_tokens"].end(); ++it)
    if (it.value().is_string()) ct.set_special_token(it.key(), it.value().get<std::string>());
  return ct;
}

TEST(ChatTemplate, MatchesTransformersOnEveryConversation) {
  if (!std::filesystem::exists(kTokenizers)) GTEST_SKIP() << "no " << kTokenizers;
  auto cases = nlohmann::ordered_json::parse(read(kData + "/expected.json"));
  ASSERT_GT(cases.size(), 50u);
  int errors_seen = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    Result<ChatTemplate> ct = template_for(c);
    ASSERT_TRUE(ct.is_ok()) << ct.status().message();
    std::vector<std::pair<size_t, size_t>> spans;
    Result<std::string> out =
        ct->render_with_generation_spans(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"], &spans);
    if (c.contains("expected")) {
      ASSERT_TRUE(out.is_ok()) << out.status().message();
      EXPECT_EQ(*out, c["expected"].get<std::string>());
      // {% generation %} blocks: the same text as transformers' assistant-mask tracker.
      std::vector<std::string> got;
      for (auto [b, e] : spans) got.push_back(out->substr(b, e - b));
      std::vector<std::string> want;
      if (c.contains("generation_texts")) want = c["generation_texts"].get<std::vector<std::string>>();
      EXPECT_EQ(got, want);
    } else {
      ++errors_seen;
      ASSERT_FALSE(out.is_ok()) << "transformers raised " << c["error"];
      // raise_exception's text reaches the caller unchanged.
      EXPECT_NE(out.status().message().find(c["error"].get<std::string>()), std::string::npos)
          << out.status().message();
    }
  }
  EXPECT_GE(errors_seen, 3);
}

TEST(ChatTemplate, ReadsSpecialTokensFromTokenizerConfig) {
  if (!std::filesystem::exists(kTokenizers)) GTEST_SKIP();
  Result<ChatTemplate> ct = ChatTemplate::from_tokenizer_config(kTokenizers + "/llama3/tokenizer_config.json");
  ASSERT_TRUE(ct.is_ok()) << ct.status().message();
  EXPECT_EQ(ct->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(ct->eos_token(), "<|end_of_text|>");
}

TEST(ChatTemplate, MissingTemplateIsAClearError) {
  if (!std::filesystem::exists(kTokenizers)) GTEST_SKIP();
  Result<ChatTemplate> ct = ChatTemplate::from_tokenizer_config(kTokenizers + "/mistral");
  ASSERT_FALSE(ct.is_ok());
  EXPECT_NE(ct.status().message().find("no chat_template"), std::string::npos) << ct.status().message();
  EXPECT_FALSE(ChatTemplate::from_tokenizer_config("/nonexistent/dir").is_ok());
}

TEST(ChatTemplate, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  auto dir = std::filesystem::temp_directory_path() / "lathe_chat_template_named";
  std::filesystem::create_directories(dir);
  nlohmann::ordered_json cfg = {
      {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
      {"chat_template",
       {{{"name", "default"}, {"template", "{{ bos_token }}plain"}}, {{"name", "tool_use"}, {"template", "tools:{{ tools | length }}"}}}}};
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  Result<ChatTemplate> ct = ChatTemplate::from_tokenizer_config(dir.string());
  ASSERT_TRUE(ct.is_ok()) << ct.status().message();
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(*ct->render(msgs, false), "<s>plain");
  nlohmann::ordered_json extra = {{"tools", nlohmann::ordered_json::array({{{"name", "f"}}})}};
  EXPECT_EQ(*ct->render(msgs, false, extra), "tools:1");
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplate, FallsBackToChatTemplateJinjaBesideTheConfig) {
  auto dir = std::filesystem::temp_directory_path() / "lathe_chat_template_jinja_file";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>", "bos_token": null})";
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}\n";
  Result<ChatTemplate> ct = ChatTemplate::from_tokenizer_config(dir.string());
  ASSERT_TRUE(ct.is_ok()) << ct.status().message();
  EXPECT_EQ(ct->bos_token(), "");
  auto msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(*ct->render(msgs, false), "user:x</s>");
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplate, RejectsBadMessages) {
  Result<ChatTemplate> ct = ChatTemplate::parse("{% for m in messages %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(ct.is_ok());
  EXPECT_FALSE(ct->render(nlohmann::ordered_json::array(), true).is_ok());
  EXPECT_FALSE(ct->render(nlohmann::ordered_json::parse("[1, 2]"), true).is_ok());
  EXPECT_FALSE(ct->render(nlohmann::ordered_json::parse("{\"role\": \"user\"}"), true).is_ok());
}

TEST(ChatTemplate, DropsNullFieldsLikeTransformers) {
  Result<ChatTemplate> ct = ChatTemplate::parse("{{ messages[0] | tojson }}|{{ messages[0].content is defined }}");
  ASSERT_TRUE(ct.is_ok());
  auto msgs = nlohmann::ordered_json::parse(R"([{"role": "assistant", "content": null, "reasoning": "r"}])");
  Result<std::string> out = ct->render(msgs, false);
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, R"({"thinking": "r", "role": "assistant", "reasoning": "r", "reasoning_content": "r"}|False)");
}

TEST(ChatTemplate, SyntaxErrorNamesPosition) {
  Result<ChatTemplate> ct = ChatTemplate::parse("ok\n{% if x %}\n{{ y }");
  ASSERT_FALSE(ct.is_ok());
  EXPECT_NE(ct.status().message().find("line 3"), std::string::npos) << ct.status().message();
}

}  // namespace
}  // namespace lathe
