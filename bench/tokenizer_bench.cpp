// Tokenizer throughput on one thread: encodes a whole text file as one string
// `repeat` times and prints the best MB/s. With --ids-out it also writes the
// ids (one JSON array) so bench/tokenizer_bench.py can check them against the
// reference library in the same run.
//
//   bench_tokenizer --tokenizer DIR --file TEXT [--repeat 3] [--ids-out F] [--add-special-tokens]
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "io/tokenizer.h"

int main(int argc, char** argv) {
  std::string tok_path, file, ids_out;
  int repeat = 3;
  bool special = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--tokenizer") tok_path = next();
    else if (a == "--file") file = next();
    else if (a == "--repeat") repeat = std::max(1, std::atoi(next().c_str()));
    else if (a == "--ids-out") ids_out = next();
    else if (a == "--add-special-tokens") special = true;
    else {
      std::fprintf(stderr, "usage: bench_tokenizer --tokenizer DIR --file TEXT [--repeat N] [--ids-out F]\n");
      return 2;
    }
  }
  auto tok = lathe::Tokenizer::load(tok_path);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", tok.status().message().c_str());
    return 1;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: cannot open %s\n", file.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();

  // Wall time is the figure; thread CPU time shows what a busy machine hides.
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  };
  double best_s = 1e30, best_cpu_s = 1e30;
  std::vector<int32_t> ids;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_now();
    ids = tok->encode(text, special);
    best_cpu_s = std::min(best_cpu_s, cpu_now() - c0);
    best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double mb = double(text.size()) / 1e6;
  std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"mb_per_s\": %.3f, \"cpu_mb_per_s\": %.3f}\n",
              text.size(), ids.size(), best_s, mb / best_s, mb / best_cpu_s);
  if (!ids_out.empty()) {
    std::ofstream out(ids_out);
    out << '[';
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
    out << "]\n";
  }
  return 0;
}
