// config.json / generation_config.json: published configs (4.x spelling) and
// the same configs re-saved by transformers 5.x parse to what transformers
// itself reads from them (tests/data/configs/expected.json, made by
// tools/config_fixtures.py); configs lathe writes load back in transformers;
// bad configs fail naming the file and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kConfigs = std::string(LATHE_TEST_DATA) + "/configs";

json expected() {
  std::ifstream in(kConfigs + "/expected.json");
  return json::parse(in);
}

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("lathe_cfg_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

void expect_matches(const ModelConfig& c, const json& w) {
  EXPECT_EQ(c.model_type, w["model_type"]);
  if (!w["architecture"].get<std::string>().empty()) EXPECT_EQ(c.architecture, w["architecture"]);
  EXPECT_EQ(c.vocab_size, w["vocab_size"]);
  EXPECT_EQ(c.hidden_size, w["hidden_size"]);
  EXPECT_EQ(c.intermediate_size, w["intermediate_size"]);
  EXPECT_EQ(c.num_hidden_layers, w["num_hidden_layers"]);
  EXPECT_EQ(c.num_attention_heads, w["num_attention_heads"]);
  EXPECT_EQ(c.num_key_value_heads, w["num_key_value_heads"]);
  EXPECT_EQ(c.head_dim, w["head_dim"]);
  EXPECT_EQ(c.max_position_embeddings, w["max_position_embeddings"]);
  EXPECT_EQ(c.rms_norm_eps, w["rms_norm_eps"].get<float>());
  EXPECT_EQ(c.rope_theta, w["rope_theta"].get<float>());
  EXPECT_EQ(c.rope_scaling.type, w["rope_type"]);
  if (!c.rope_scaling.type.empty()) EXPECT_EQ(c.rope_scaling.factor, w["rope_factor"].get<float>());
  if (c.rope_scaling.type == "llama3") {
    EXPECT_EQ(c.rope_scaling.low_freq_factor, w["rope_low_freq_factor"].get<float>());
    EXPECT_EQ(c.rope_scaling.high_freq_factor, w["rope_high_freq_factor"].get<float>());
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, w["rope_original_max_position_embeddings"]);
  }
  EXPECT_EQ(c.tie_word_embeddings, w["tie_word_embeddings"]);
  EXPECT_EQ(c.hidden_act, w["hidden_act"]);
  EXPECT_EQ(c.torch_dtype, w["torch_dtype"]);
  EXPECT_EQ(c.bos_token_id, w["bos_token_id"]);
  EXPECT_EQ(c.eos_token_ids, w["eos_token_ids"].get<std::vector<int>>());
  EXPECT_EQ(c.pad_token_id, w["pad_token_id"]);
  EXPECT_EQ(c.sliding_window, w["sliding_window"]);
  EXPECT_EQ(c.attention_bias, w["attention_bias"]);
  EXPECT_EQ(c.attention_out_bias, w["attention_out_bias"]);
  EXPECT_EQ(c.mlp_bias, w["mlp_bias"]);
  EXPECT_EQ(c.qk_norm, w["qk_norm"]);
}

TEST(HfConfig, ParsesPublishedConfigsInBothSpellingsAsTransformersDoes) {
  json want = expected();
  int n = 0;
  for (const auto& [name, w] : want.items()) {
    if (name.rfind("generation/", 0) == 0) continue;
    SCOPED_TRACE(name);
    auto c = load_model_config(kConfigs + "/" + name);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    expect_matches(*c, w);
    ++n;
  }
  EXPECT_EQ(n, 18);  // 9 models x {4.x, 5.x}
}

TEST(HfConfig, FiveXSpellingReallyUsesRopeParametersAndDtype) {
  // Guards the fixtures: the 5.x files must not carry the 4.x keys.
  std::ifstream in(kConfigs + "/v5/llama-3.2-1b.json");
  json j = json::parse(in);
  EXPECT_TRUE(j.contains("rope_parameters"));
  EXPECT_TRUE(j.contains("dtype"));
  EXPECT_FALSE(j.contains("rope_scaling"));
  EXPECT_FALSE(j.contains("rope_theta"));
  EXPECT_FALSE(j.contains("torch_dtype"));
}

TEST(HfConfig, LoadsFromTheModelDirectory) {
  std::string dir = fresh_dir("dir");
  fs::copy_file(kConfigs + "/v4/qwen3-0.6b.json", dir + "/config.json");
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->model_type, "qwen3");
  auto missing = load_model_config(dir + "/nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find(dir + "/nope"), std::string::npos);
}

TEST(HfConfig, UnsupportedArchitecturesNameFileArchitectureAndSupportedOnes) {
  for (const char* f : {"pythia-70m.json", "gemma-2b.json"}) {
    std::string path = kConfigs + "/unsupported/" + f;
    auto c = load_model_config(path);
    ASSERT_FALSE(c.is_ok());
    const std::string& m = c.status().message();
    EXPECT_EQ(c.status().code(), StatusCode::kUnsupported);
    EXPECT_EQ(m.rfind(path + ": unsupported architecture '", 0), 0u) << m;
    EXPECT_NE(m.find(std::string(f) == "pythia-70m.json" ? "GPTNeoXForCausalLM" : "GemmaForCausalLM"),
              std::string::npos) << m;
    for (const char* s : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
      EXPECT_NE(m.find(s), std::string::npos) << m;
    }
  }
  auto t = parse_model_config(R"({"model_type":"gemma","vocab_size":8})", "x.json");
  EXPECT_NE(t.status().message().find("model_type 'gemma'"), std::string::npos) << t.status().message();
}

// Parses a variant of Llama-3.2-1B's config with one field changed.
Result<ModelConfig> with_field(const std::string& key, const json& value) {
  std::ifstream in(kConfigs + "/v4/llama-3.2-1b.json");
  json j = json::parse(in);
  if (value.is_discarded()) j.erase(key);
  else j[key] = value;
  return parse_model_config(j.dump(), "cfg.json");
}

void expect_error(const Result<ModelConfig>& r, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(r.is_ok());
  for (const auto& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos) << "missing '" << p << "' in " << r.status().message();
  }
}

TEST(HfConfig, BadFieldsAreErrorsNamingFileAndField) {
  json drop(json::value_t::discarded);
  expect_error(with_field("hidden_size", "2048"), {"cfg.json", "\"hidden_size\" must be an integer"});
  expect_error(with_field("hidden_size", 2048.5), {"cfg.json", "\"hidden_size\" must be an integer"});
  expect_error(with_field("hidden_size", drop), {"cfg.json", "missing field \"hidden_size\""});
  expect_error(with_field("num_hidden_layers", 0), {"cfg.json", "\"num_hidden_layers\" must be positive"});
  expect_error(with_field("vocab_size", 1LL << 40), {"cfg.json", "\"vocab_size\" must be an integer within 32 bits"});
  expect_error(with_field("num_key_value_heads", 5), {"cfg.json", "not a multiple of num_key_value_heads 5"});
  expect_error(with_field("rms_norm_eps", -1.0), {"cfg.json", "rms_norm_eps"});
  expect_error(with_field("tie_word_embeddings", 1), {"cfg.json", "\"tie_word_embeddings\" must be true or false"});
  expect_error(with_field("eos_token_id", json::array({1, "x"})), {"cfg.json", "\"eos_token_id\""});
  expect_error(with_field("hidden_act", "gelu"), {"cfg.json", "hidden_act"});
  expect_error(with_field("rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}}),
               {"cfg.json", "\"rope_scaling.rope_type\" is 'yarn'", "llama3"});
  expect_error(with_field("rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}}),
               {"cfg.json", "missing field \"rope_scaling.low_freq_factor\""});
  expect_error(with_field("rope_scaling", json{{"type", "linear"}}), {"missing field \"rope_scaling.factor\""});
  expect_error(with_field("rope_scaling", 3), {"\"rope_scaling\" must be an object"});
  expect_error(with_field("architectures", json::array({"MistralForCausalLM"})),
               {"architecture 'MistralForCausalLM' does not match model_type 'llama'"});
  expect_error(parse_model_config("{", "cfg.json"), {"cfg.json: not valid JSON"});
  expect_error(parse_model_config("[]", "cfg.json"), {"cfg.json: must be a JSON object"});
}

TEST(HfConfig, DefaultsFollowTheTransformersClasses) {
  // Only the sizes: everything else takes the family's defaults.
  auto c = parse_model_config(R"({"model_type":"mistral","vocab_size":32,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4})", "m.json");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_TRUE(c->eos_token_ids.empty());
  auto q = parse_model_config(R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":32,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"attention_bias":false})", "q.json");
  ASSERT_TRUE(q.is_ok()) << q.status().message();
  EXPECT_TRUE(q->attention_bias);  // Qwen2 ignores the key: q/k/v always biased
  EXPECT_FALSE(q->attention_out_bias);
}

TEST(HfConfig, WrittenConfigParsesBackIdentically) {
  json want = expected();
  for (const auto& [name, w] : want.items()) {
    if (name.rfind("v4/", 0) != 0) continue;
    SCOPED_TRACE(name);
    ModelConfig c = load_model_config(kConfigs + "/" + name).value();
    auto back = parse_model_config(model_config_to_json(c), "written.json");
    ASSERT_TRUE(back.is_ok()) << back.status().message();
    expect_matches(*back, w);
  }
}

TEST(HfConfig, WrittenConfigLoadsInTransformersAsTheSameModel) {
  if (std::system("python3 -c 'import transformers, torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with transformers + torch not installed";
  }
  std::string dir = fresh_dir("written");
  std::string args;
  for (const auto& ent : fs::directory_iterator(kConfigs + "/v4")) {
    ModelConfig c = load_model_config(ent.path().string()).value();
    std::string out = dir + "/" + ent.path().filename().string();
    std::ofstream(out) << model_config_to_json(c);
    args += " " + ent.path().string() + " " + out;
  }
  std::string cmd = "python3 " LATHE_SOURCE_DIR "/tools/config_fixtures.py check" + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
}

TEST(GenerationConfig, ParsesPublishedFilesAsTransformersDoes) {
  json want = expected();
  int n = 0;
  for (const auto& [name, w] : want.items()) {
    if (name.rfind("generation/", 0) != 0) continue;
    SCOPED_TRACE(name);
    auto g = load_generation_config(kConfigs + "/" + name);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    EXPECT_EQ(g->eos_token_ids, w["eos_token_ids"].get<std::vector<int>>());
    EXPECT_EQ(g->bos_token_id, w["bos_token_id"]);
    EXPECT_EQ(g->pad_token_id, w["pad_token_id"]);
    EXPECT_EQ(g->do_sample, w["do_sample"]);
    EXPECT_EQ(g->temperature, w["temperature"].get<float>());
    EXPECT_EQ(g->top_k, w["top_k"]);
    EXPECT_EQ(g->top_p, w["top_p"].get<float>());
    EXPECT_EQ(g->min_p, w["min_p"].get<float>());
    EXPECT_EQ(g->repetition_penalty, w["repetition_penalty"].get<float>());
    EXPECT_EQ(g->max_new_tokens, w["max_new_tokens"]);
    auto back = parse_generation_config(generation_config_to_json(*g), "back.json");
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->eos_token_ids, g->eos_token_ids);
    EXPECT_EQ(back->top_p, g->top_p);
    EXPECT_EQ(back->temperature, g->temperature);
    ++n;
  }
  EXPECT_EQ(n, 3);
}

TEST(GenerationConfig, MissingFileGivesDefaultsAndBadFileNamesIt) {
  std::string dir = fresh_dir("gen");
  auto g = load_generation_config(dir);
  ASSERT_TRUE(g.is_ok());
  EXPECT_TRUE(g->eos_token_ids.empty());
  EXPECT_EQ(g->top_k, 50);
  EXPECT_FALSE(g->do_sample);
  std::ofstream(dir + "/generation_config.json") << R"({"temperature": "hot"})";
  auto bad = load_generation_config(dir);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(dir + "/generation_config.json: field \"temperature\" must be a number"),
            std::string::npos) << bad.status().message();
  auto range = parse_generation_config(R"({"top_p": 1.5})", "g.json");
  EXPECT_NE(range.status().message().find("g.json: top_p"), std::string::npos);
  EXPECT_FALSE(parse_generation_config("nope", "g.json").is_ok());
}

}  // namespace
}  // namespace lathe
