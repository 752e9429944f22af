// Checkpoint saving: how long the training loop is blocked per save (the
// staging copy, measured around CheckpointManager::save()) and how fast the
// background writer gets the checkpoint onto storage (shards, small files,
// metadata.json, COMMITTED and `last`, fsync'ed), beside `dd` writing the
// same number of bytes to the same directory with conv=fsync in the same
// call (the disk's own rate, the baseline).
// Two states, synthesized with the real shapes' sizes:
//   adapter: LoRA of Llama-3.1-8B size, 28 M parameters in 32 x 7 A/B pairs,
//            plus two AdamW moments: 84 M floats (336 MB)
//   full:    full-SFT state, --full-params parameters (default 1e9) plus two
//            moments; the manager needs twice that in RAM (state + staging)
// dd runs right before each save (the disk's rate drifts on a shared
// machine); the table compares the medians.
// Usage: bench_checkpoint [--dir PATH|s3://bucket/prefix] [--case adapter|full|all]
//                         [--full-params N] [--repeats N]
// The directory's checkpoints are deleted afterwards.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "train/checkpoint_manager.h"

namespace {

using namespace lathe;
using Clock = std::chrono::steady_clock;

struct BenchState {
  std::vector<std::vector<float>> tensors;  // weights, then exp_avg, then exp_avg_sq of each
  CheckpointSnapshot snapshot;
  int64_t bytes = 0;
};

void fill(std::vector<float>& v, uint64_t seed) {
  parallel_for(int64_t(v.size()), 1 << 20, [&](int64_t b, int64_t e) {
    std::mt19937 rng(uint32_t(seed * 7919 + uint64_t(b)));
    for (int64_t i = b; i < e; ++i) v[size_t(i)] = float(rng() & 0xFFFF) * 1e-5f;
  });
}

// shapes: one entry per trainable tensor.
BenchState make_state(const std::vector<Shape>& shapes) {
  BenchState s;
  s.tensors.reserve(shapes.size() * 3);
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (int k = 0; k < 3; ++k) {
      s.tensors.emplace_back(size_t(shapes[i].numel()));
      fill(s.tensors.back(), i * 3 + size_t(k));
      s.bytes += shapes[i].numel() * 4;
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "t" + std::to_string(i);
    s.snapshot.model.push_back({name, shapes[i], s.tensors[i * 3]});
    s.snapshot.optim.push_back({name + ".exp_avg", shapes[i], s.tensors[i * 3 + 1]});
    s.snapshot.optim.push_back({name + ".exp_avg_sq", shapes[i], s.tensors[i * 3 + 2]});
  }
  s.snapshot.trainer_state_json = "{}";
  return s;
}

// Llama-3.1-8B: 32 layers, hidden 4096, kv 1024, ffn 14336; r chosen so the
// adapter has ~28 M parameters (84 M floats with its moments).
std::vector<Shape> adapter_shapes() {
  const int64_t r = 11, H = 4096, KV = 1024, F = 14336;
  const std::pair<int64_t, int64_t> proj[] = {{H, H}, {H, KV}, {H, KV}, {H, H}, {H, F}, {H, F}, {F, H}};
  std::vector<Shape> out;
  for (int l = 0; l < 32; ++l) {
    for (auto [in, o] : proj) {
      out.push_back({r, in});
      out.push_back({o, r});
    }
  }
  return out;
}

// A Llama-3.2-1B-like layout scaled to n parameters: embedding plus equal blocks.
std::vector<Shape> full_shapes(int64_t n) {
  std::vector<Shape> out;
  const int64_t emb = std::min<int64_t>(n / 5, 128256LL * 2048);
  out.push_back({emb / 2048, 2048});
  const int64_t per = (n - emb) / 16;
  for (int l = 0; l < 16; ++l) out.push_back({per / 2048, 2048});
  return out;
}

// dd of the same size into dir with conv=fsync; MB/s, or 0 when not measurable.
double dd_mb_per_s(const std::string& dir, int64_t bytes) {
  const std::string file = dir + "/dd.bin";
  const int64_t count = std::max<int64_t>(1, bytes / (8 << 20));
  const std::string cmd = "dd if=/dev/zero of='" + file + "' bs=8M count=" + std::to_string(count) +
                          " conv=fsync 2>&1";
  const Clock::time_point t0 = Clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
  }
  const int rc = pclose(p);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::filesystem::remove(file);
  return rc == 0 ? double(count) * 8.0 * 1048576.0 / 1e6 / s : 0.0;
}

void run_case(const std::string& label, const std::vector<Shape>& shapes, const std::string& dir, int repeats) {
  BenchState st = make_state(shapes);
  CheckpointPolicy policy;
  policy.dir = dir;
  policy.save_top_k = 1;
  policy.monitor = "train_loss";
  auto mgr = CheckpointManager::open(policy, {});
  if (!mgr.is_ok()) {
    std::fprintf(stderr, "%s\n", mgr.status().message().c_str());
    std::exit(1);
  }
  int64_t n_floats = 0;
  for (const auto& t : st.tensors) n_floats += int64_t(t.size());
  (*mgr)->reserve(n_floats);  // as the trainer does at setup
  // The disk's rate drifts on a shared machine: dd runs right before each save, medians are compared.
  std::vector<double> stalls, rates, dds;
  for (int i = 0; i < repeats; ++i) {
    st.snapshot.step = i + 1;
    st.snapshot.metrics["train_loss"] = 1.0 / (i + 1);
    if (!is_s3_url(dir)) dds.push_back(dd_mb_per_s(dir, st.bytes));
    const Clock::time_point t0 = Clock::now();
    Status s = (*mgr)->save(st.snapshot);
    const double stall = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!s.is_ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      std::exit(1);
    }
    if (Status w = (*mgr)->wait(); !w.is_ok()) {
      std::fprintf(stderr, "%s\n", w.message().c_str());
      std::exit(1);
    }
    const SaveTiming t = (*mgr)->last_timing();
    stalls.push_back(stall);
    rates.push_back(double(t.bytes) / 1e6 / t.write_s);
    std::printf("  %-8s save %d: stall %8.1f ms, write %6.2f s, %7.0f MB/s (dd just before: %.0f MB/s)\n", label.c_str(),
                i + 1, stall, t.write_s, rates.back(), dds.empty() ? 0.0 : dds.back());
  }
  std::sort(dds.begin(), dds.end());
  const double dd = dds.empty() ? 0.0 : dds[dds.size() / 2];
  std::vector<double> steady(stalls.begin() + (stalls.size() > 1 ? 1 : 0), stalls.end());
  std::sort(steady.begin(), steady.end());
  std::sort(rates.begin(), rates.end());
  const double rate = rates[rates.size() / 2];
  std::printf("| %-8s | %8.0f MB | %8.1f ms | %8.1f ms | %8.0f MB/s | %8.0f MB/s | %5.0f%% |\n", label.c_str(),
              double(st.bytes) / 1e6, stalls[0], steady[steady.size() / 2], rate, dd, dd > 0 ? 100.0 * rate / dd : 0.0);
  std::fflush(stdout);
  auto storage = open_storage(dir);
  if (storage.is_ok()) (void)(*storage)->remove_prefix("");
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/lathe_checkpoint_bench", which = "all";
  int64_t full_params = 1000000000;
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--case") which = v;
    else if (k == "--full-params") full_params = std::atoll(v.c_str());
    else if (k == "--repeats") repeats = std::max(1, std::atoi(v.c_str()));
  }
  init_threads();
  std::printf("checkpoint saves to %s, %d threads, %d saves per case (staging reserved up front)\n",
              dir.c_str(), num_threads(), repeats);
  std::printf("| case     |      state | 1st stall  | stall (median) | write (median) |   dd fsync  | vs dd |\n");
  if (which == "adapter" || which == "all") run_case("adapter", adapter_shapes(), dir, repeats);
  if (which == "full" || which == "all") run_case("full", full_shapes(full_params), dir, repeats);
  return 0;
}
