// Masks of each record kind, with the fake codec whose tokens are known by
// hand: which tokens are targets, EOS handling, chat turn spans, and the
// errors of malformed records.
#include <gtest/gtest.h>

#include "train/example.h"
#include "train/fake_codec.h"

namespace lathe {
namespace {

using testing::fake_codec;
using testing::fake_encode;
using json = nlohmann::ordered_json;

int32_t ch(char c) { return 10 + static_cast<unsigned char>(c); }
int32_t sp(char c) { return 300 + static_cast<unsigned char>(c); }  // " c"

TEST(PromptTemplate, SplitsAtTheLabel) {
  auto t = PromptTemplate::parse("Q: {question}\nA:{answer} {{ok}}", "answer");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  auto r = t->render(json{{"question", "why"}, {"answer", "because"}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt, "Q: why\nA:");
  EXPECT_EQ(r->full, "Q: why\nA:because {ok}");
}

TEST(PromptTemplate, RejectsBadTemplates) {
  EXPECT_FALSE(PromptTemplate::parse("{input}").is_ok());                    // no label
  EXPECT_FALSE(PromptTemplate::parse("{input} {output} {output}").is_ok());  // label twice
  EXPECT_FALSE(PromptTemplate::parse("{in put} {output}").is_ok());
  EXPECT_FALSE(PromptTemplate::parse("{input} } {output}").is_ok());
  EXPECT_FALSE(PromptTemplate::parse("{input {output}").is_ok());
}

TEST(PromptTemplate, NamesMissingAndNonStringFields) {
  auto t = PromptTemplate::parse("{input} {output}");
  ASSERT_TRUE(t.is_ok());
  auto missing = t->render(json{{"input", "x"}});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("\"output\" is missing"), std::string::npos);
  auto wrong = t->render(json{{"input", 3}, {"output", "y"}});
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("\"input\" must be a string"), std::string::npos);
}

TEST(PromptExample, TargetsAreOutputAndEos) {
  auto t = PromptTemplate::parse("{input} {output}");
  auto text = t->render(json{{"input", "Hi?"}, {"output", "Yo"}});
  ASSERT_TRUE(text.is_ok());
  auto ex = build_prompt_example(*text, fake_codec());
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  // "Hi? Yo": BOS H i ? " Y" o EOS; " Y" straddles the boundary and carries output.
  std::vector<int32_t> ids = {1, ch('H'), ch('i'), ch('?'), sp('Y'), ch('o'), 2};
  std::vector<uint8_t> mask = {0, 0, 0, 0, 1, 1, 1};
  EXPECT_EQ(ex->input_ids, ids);
  EXPECT_EQ(ex->loss_mask, mask);
  EXPECT_EQ(ex->n_targets(), 3);
}

TEST(PromptExample, SeparatorTokenIsATargetAndEmptyOutput) {
  // The "\n" separator is a token of its own: it is the first target, so the
  // bare input is the context generation starts from.
  auto t = PromptTemplate::parse("{input}\n{output}");
  auto ex = build_prompt_example(*t->render(json{{"input", "a"}, {"output", "bc"}}), fake_codec());
  ASSERT_TRUE(ex.is_ok());
  EXPECT_EQ(ex->input_ids, (std::vector<int32_t>{1, ch('a'), ch('\n'), ch('b'), ch('c'), 2}));
  EXPECT_EQ(ex->loss_mask, (std::vector<uint8_t>{0, 0, 1, 1, 1, 1}));
  auto empty = build_prompt_example(*t->render(json{{"input", "a"}, {"output", ""}}), fake_codec());
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty->loss_mask, (std::vector<uint8_t>{0, 0, 1, 1}));  // the separator and EOS
}

TEST(PromptExample, SpaceSeparatorOfItsOwnIsATarget) {
  // "a  x": the template's space comes before the output's own " x", so it
  // does not merge and is a token of its own; it is still a target.
  auto t = PromptTemplate::parse("{input} {output}");
  auto ex = build_prompt_example(*t->render(json{{"input", "a"}, {"output", " x"}}), fake_codec());
  ASSERT_TRUE(ex.is_ok());
  EXPECT_EQ(ex->input_ids, (std::vector<int32_t>{1, ch('a'), ch(' '), sp('x'), 2}));
  EXPECT_EQ(ex->loss_mask, (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  // Whitespace inside the prompt stays in it; the whole trailing run (here
  // the input's own "\n" too) is trimmed.
  auto inner = build_prompt_example(*t->render(json{{"input", "a b\n"}, {"output", "c"}}), fake_codec());
  ASSERT_TRUE(inner.is_ok());
  EXPECT_EQ(inner->input_ids, (std::vector<int32_t>{1, ch('a'), sp('b'), ch('\n'), sp('c'), 2}));
  EXPECT_EQ(inner->loss_mask, (std::vector<uint8_t>{0, 0, 0, 1, 1, 1}));
}

TEST(PromptExample, NeedsEos) {
  TextCodec c = fake_codec();
  c.eos_id.reset();
  auto t = PromptTemplate::parse("{input} {output}");
  EXPECT_FALSE(build_prompt_example(*t->render(json{{"input", "a"}, {"output", "b"}}), c).is_ok());
}

// Expected mask from the rendered text: targets are every token of an
// assistant turn after "<|assistant|>" through its "<|end|>".
std::vector<uint8_t> chatml_mask(const std::vector<int32_t>& ids) {
  std::vector<uint8_t> m(ids.size(), 0);
  bool in_turn = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (in_turn) m[i] = 1;
    if (ids[i] == 5) in_turn = true;
    if (ids[i] == 3) in_turn = false;
  }
  return m;
}

TEST(ChatExample, AssistantTurnsOnly) {
  json msgs = json::array({{{"role", "system"}, {"content", "be kind"}},
                           {{"role", "user"}, {"content", "hi"}},
                           {{"role", "assistant"}, {"content", "hello there"}},
                           {{"role", "user"}, {"content", "bye"}},
                           {{"role", "assistant"}, {"content", "ok"}}});
  using testing::ChatQuirk;
  for (ChatQuirk quirk : {ChatQuirk::kNone, ChatQuirk::kAlwaysGenPrompt, ChatQuirk::kThinkLast}) {
    auto ex = build_chat_example(msgs, fake_codec(quirk));
    ASSERT_TRUE(ex.is_ok()) << ex.status().message();
    std::string full = *testing::fake_render(msgs, false, quirk);
    EXPECT_EQ(ex->input_ids, fake_encode(full, false));
    std::vector<uint8_t> want = chatml_mask(ex->input_ids);
    if (quirk == ChatQuirk::kAlwaysGenPrompt) want.back() = 0;  // the trailing generation prompt opens no turn
    EXPECT_EQ(ex->loss_mask, want) << "quirk " << static_cast<int>(quirk);
    // "hello there" + <|end|> and "ok" + <|end|> (+ "<t></t>" before "ok").
    int64_t think = quirk == ChatQuirk::kThinkLast ? 7 : 0;
    EXPECT_EQ(ex->n_targets(), 11 - 1 + 1 + 2 + 1 + think) << "quirk " << static_cast<int>(quirk);
  }
}

TEST(ChatExample, NoAssistantMeansNoTargets) {
  json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto ex = build_chat_example(msgs, fake_codec());
  ASSERT_TRUE(ex.is_ok());
  EXPECT_EQ(ex->n_targets(), 0);
}

TEST(ChatExample, RejectsMalformedMessages) {
  EXPECT_FALSE(build_chat_example(json::object(), fake_codec()).is_ok());
  EXPECT_FALSE(build_chat_example(json::array(), fake_codec()).is_ok());
  EXPECT_FALSE(build_chat_example(json::array({1}), fake_codec()).is_ok());
  EXPECT_FALSE(build_chat_example(json::array({{{"content", "x"}}}), fake_codec()).is_ok());
  auto bad_role = build_chat_example(json::array({{{"role", "robot"}, {"content", "x"}}}), fake_codec());
  ASSERT_FALSE(bad_role.is_ok());
  EXPECT_NE(bad_role.status().message().find("robot"), std::string::npos);
  TextCodec no_template = fake_codec();
  no_template.render_chat = nullptr;
  EXPECT_FALSE(build_chat_example(json::array({{{"role", "user"}, {"content", "x"}}}), no_template).is_ok());
}

TEST(PretokenizedExample, KeepsIdsAndMask) {
  auto ex = build_pretokenized_example(json{{"input_ids", {5, 6, 7, 8}}, {"loss_mask", {1, 0, true, 1}}}, fake_codec());
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  EXPECT_EQ(ex->input_ids, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(ex->loss_mask, (std::vector<uint8_t>{0, 0, 1, 1}));  // the first token is never a target
}

TEST(PretokenizedExample, ErrorsNameTheProblem) {
  struct Case {
    json record;
    const char* reason;
  };
  std::vector<Case> cases = {
      {json{{"input_ids", {1, 2}}, {"loss_mask", {0}}}, "has 1 entries but \"input_ids\" has 2"},
      {json{{"input_ids", {1, 600}}, {"loss_mask", {0, 1}}}, "input_ids[1] = 600 is outside the vocabulary"},
      {json{{"input_ids", {1, -1}}, {"loss_mask", {0, 1}}}, "input_ids[1] = -1 is outside"},
      {json{{"input_ids", {1, "a"}}, {"loss_mask", {0, 1}}}, "input_ids[1] must be an integer"},
      {json{{"input_ids", {1, 2}}, {"loss_mask", {0, 2}}}, "loss_mask[1] must be 0 or 1"},
      {json{{"input_ids", {1, 2}}}, "\"loss_mask\" is missing"},
      {json{{"input_ids", 3}, {"loss_mask", {0}}}, "\"input_ids\" must be an array"},
  };
  for (const Case& c : cases) {
    auto ex = build_pretokenized_example(c.record, fake_codec());
    ASSERT_FALSE(ex.is_ok()) << c.record.dump();
    EXPECT_NE(ex.status().message().find(c.reason), std::string::npos) << ex.status().message();
  }
}

}  // namespace
}  // namespace lathe
