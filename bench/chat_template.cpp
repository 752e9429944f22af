// Chat template rendering: lathe's interpreter against transformers'
// apply_chat_template(tokenize=False) (jinja2, compiled to Python bytecode
// and cached), same template, same conversations, measured in the same run
// by bench/chat_template.py. Rendering sits on every serving request, so the
// table shows microseconds per render for 2 to 200 messages, and the one-off
// parse time.
// Usage: bench_chat_template [tokenizer dir, default ../shared/tokenizers/qwen3]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "io/chat_template.h"

namespace {

using Clock = std::chrono::steady_clock;

nlohmann::ordered_json conversation(int n) {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  msgs.push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  for (int i = 0; i < n - 1; ++i) {
    msgs.push_back({{"role", i % 2 == 0 ? "user" : "assistant"},
                    {"content", "Message " + std::to_string(i) +
                                    ": 오늘 날씨가 좋네요. The quick brown fox jumps over the lazy dog."}});
  }
  return msgs;
}

// Runs the Python baseline; returns n_messages → microseconds (empty if unavailable).
std::map<int, double> python_baseline(const std::string& dir, const std::vector<int>& sizes) {
  std::string script = (std::filesystem::path(__FILE__).parent_path() / "chat_template.py").string();
  std::string cmd = "python3 '" + script + "' '" + dir + "'";
  for (int n : sizes) cmd += " " + std::to_string(n);
  cmd += " 2>/dev/null";
  std::map<int, double> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  int n;
  double us;
  while (std::fscanf(p, "%d %lf", &n, &us) == 2) out[n] = us;
  pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "../shared/tokenizers/qwen3";
  auto t0 = Clock::now();
  auto ct = lathe::ChatTemplate::from_tokenizer_config(dir);
  double parse_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (!ct.is_ok()) {
    std::fprintf(stderr, "%s\n", ct.status().message().c_str());
    return 1;
  }
  std::vector<int> sizes = {2, 20, 200};
  std::map<int, double> py = python_baseline(dir, sizes);
  std::printf("chat template: %s (load + parse %.0f us)\n", dir.c_str(), parse_us);
  std::printf("%10s %12s %14s %14s %9s\n", "messages", "out bytes", "lathe us", "transformers us", "speedup");
  for (int n : sizes) {
    nlohmann::ordered_json msgs = conversation(n);
    size_t bytes = 0;
    int reps = std::max(20, 20000 / n);
    auto t1 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      auto out = ct->render(msgs, true);
      if (!out.is_ok()) {
        std::fprintf(stderr, "%s\n", out.status().message().c_str());
        return 1;
      }
      bytes = out->size();
    }
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t1).count() / reps;
    if (py.count(n))
      std::printf("%10d %12zu %14.1f %14.1f %8.1fx\n", n, bytes, us, py[n], py[n] / us);
    else
      std::printf("%10d %12zu %14.1f %14s %9s\n", n, bytes, us, "n/a", "");
  }
  return 0;
}
