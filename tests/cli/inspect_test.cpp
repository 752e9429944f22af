// `lathe inspect` run as a user runs it: the built binary on a directory
// holding the real Qwen3-0.6B config and tiny weights; text and --json
// agree with the files, and a missing directory fails naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "io/safetensors.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

const std::string kLathe = std::string(LATHE_BINARY_DIR) + "/bin/lathe";

int run(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string model_dir() {
  fs::path d = fs::path(testing::TempDir()) / ("lathe_inspect_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  fs::copy_file(std::string(LATHE_TEST_DATA) + "/configs/v4/qwen3-0.6b.json", d / "config.json");
  std::vector<std::pair<std::string, Tensor>> t = {
      {"model.embed_tokens.weight", Tensor::zeros(DType::BF16, {6, 4})},
      {"model.norm.weight", Tensor::zeros(DType::F32, {4})},
  };
  EXPECT_TRUE(write_weights(d.string(), t).is_ok());
  return d.string();
}

TEST(CliInspect, PrintsConfigAndWeightSummary) {
  if (!fs::exists(kLathe)) GTEST_SKIP() << kLathe << " not built";
  std::string dir = model_dir();
  std::string out;
  ASSERT_EQ(run(kLathe + " inspect " + dir, &out), 0) << out;
  for (const char* want : {"Qwen3ForCausalLM (qwen3)", "layers           28", "heads            16 (kv heads 8, head_dim 128)",
                           "vocab            151936", "theta 1e+06, no scaling", "qk-norm yes",
                           "parameters       28 ", "eos token ids    151645", "bf16: 1", "f32: 1", "total bytes      64 ", "tokenizer        none"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << out;
  }
}

TEST(CliInspect, JsonHasTheSameFacts) {
  if (!fs::exists(kLathe)) GTEST_SKIP() << kLathe << " not built";
  std::string dir = model_dir();
  std::string out;
  ASSERT_EQ(run(kLathe + " inspect --json " + dir, &out), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["architecture"], "Qwen3ForCausalLM");
  EXPECT_EQ(j["head_dim"], 128);
  EXPECT_EQ(j["rope"]["theta"], 1e6);
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);  // shortest decimal, as in config.json
  EXPECT_EQ(j["weights"]["parameters"], 28);
  EXPECT_EQ(j["weights"]["tensors_by_dtype"]["bf16"], 1);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["chat_template"], nullptr);
}

TEST(CliInspect, MissingDirectoryOrConfigFailsNamingThePath) {
  if (!fs::exists(kLathe)) GTEST_SKIP() << kLathe << " not built";
  std::string out;
  EXPECT_EQ(run(kLathe + " inspect /nonexistent/lathe-model", &out), 2);
  EXPECT_NE(out.find("lathe inspect: /nonexistent/lathe-model"), std::string::npos) << out;
  std::string dir = model_dir();
  fs::remove(dir + "/config.json");
  out.clear();
  EXPECT_EQ(run(kLathe + " inspect " + dir, &out), 2);
  EXPECT_NE(out.find(dir + "/config.json"), std::string::npos) << out;
}

}  // namespace
}  // namespace lathe
