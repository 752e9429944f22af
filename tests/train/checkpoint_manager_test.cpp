// The checkpoint manager: top-k by monitor plus last, `last` always naming a
// committed checkpoint, the staging copy (the caller may change its buffers
// right after save()), and a failing background write: reported by the
// next save()/wait(), its partial directory gone, `last` untouched.
#include "train/checkpoint_manager.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <optional>

namespace lathe {
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("lathe_ckptmgr_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

// Local storage whose writers fail for paths containing `poison`.
class FailingStorage final : public Storage {
 public:
  FailingStorage(std::unique_ptr<Storage> base, std::string poison) : base_(std::move(base)), poison_(std::move(poison)) {}
  std::string url() const override { return base_->url(); }
  Result<std::unique_ptr<StorageWriter>> open_writer(const std::string& path) override {
    if (!poison_.empty() && path.find(poison_) != std::string::npos) return io_error("injected failure writing ", path);
    return base_->open_writer(path);
  }
  Result<std::vector<uint8_t>> read(const std::string& p) override { return base_->read(p); }
  Result<std::vector<uint8_t>> read_range(const std::string& p, int64_t o, int64_t n) override {
    return base_->read_range(p, o, n);
  }
  Result<int64_t> size(const std::string& p) override { return base_->size(p); }
  Result<std::vector<StorageEntry>> list(const std::string& p) override { return base_->list(p); }
  Result<std::vector<std::string>> list_dirs(const std::string& p) override { return base_->list_dirs(p); }
  Status remove(const std::string& p) override { return base_->remove(p); }
  Status remove_prefix(const std::string& p) override { return base_->remove_prefix(p); }
  std::string poison_;

 private:
  std::unique_ptr<Storage> base_;
};

struct State {
  std::vector<float> w = std::vector<float>(12), m = std::vector<float>(12), v = std::vector<float>(12);
  CheckpointSnapshot snapshot(int64_t step, std::optional<double> val_loss) {
    std::iota(w.begin(), w.end(), float(step));
    CheckpointSnapshot s;
    s.step = step;
    s.metrics["train_loss"] = 1.0;
    if (val_loss) s.metrics["val_loss"] = *val_loss;
    s.model = {{"w", {3, 4}, w}};
    s.optim = {{"w.exp_avg", {3, 4}, m}, {"w.exp_avg_sq", {3, 4}, v}};
    s.trainer_state_json = "{\"step\": " + std::to_string(step) + "}";
    return s;
  }
};

std::string read_last(const fs::path& root) {
  auto s = open_storage(root.string());
  auto t = (*s)->read_text(kCheckpointLastFile);
  return t.is_ok() ? *t : std::string();
}

FILE* devnull() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

CheckpointPolicy policy(const fs::path& dir, int64_t top_k = 2, bool save_last = true, bool async = true) {
  CheckpointPolicy p;
  p.dir = dir.string();
  p.save_top_k = top_k;
  p.save_last = save_last;
  p.async_save = async;
  p.log = devnull();
  return p;
}

}  // namespace

TEST(CheckpointManager, KeepsTopKByMonitorPlusLast) {
  const fs::path root = fresh_dir("topk");
  auto m = CheckpointManager::open(policy(root, 2), {});
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  State st;
  const double losses[] = {3.0, 1.0, 2.0, 4.0, 0.5, 5.0};
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE((*m)->save(st.snapshot(i + 1, losses[i])).is_ok());
    std::fill(st.w.begin(), st.w.end(), -1.0f);  // the caller moves on at once: the save has its own copy
  }
  ASSERT_TRUE((*m)->wait().is_ok());
  // Best two: 0.5 (step 5), 1.0 (step 2); plus the newest (step 6).
  EXPECT_EQ((*m)->kept(), (std::vector<std::string>{"step=000002-val_loss=1.0000", "step=000005-val_loss=0.5000",
                                                    "step=000006-val_loss=5.0000"}));
  std::vector<std::string> on_disk;
  for (const auto& e : fs::directory_iterator(root)) if (e.is_directory()) on_disk.push_back(e.path().filename());
  std::sort(on_disk.begin(), on_disk.end());
  EXPECT_EQ(on_disk, (*m)->kept());
  EXPECT_EQ(read_last(root), "step=000006-val_loss=5.0000\n");
  auto w = load_checkpoint_model(root.string());
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  EXPECT_EQ((*w)[0].second.data<float>()[11], 6.0f + 11.0f);

  // A new manager on the same root ranks the existing ones too.
  auto again = CheckpointManager::open(policy(root, 1, false), {});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ((*again)->newest_committed(), (root / "step=000006-val_loss=5.0000").string());
  ASSERT_TRUE((*again)->save(st.snapshot(7, 0.7)).is_ok());
  ASSERT_TRUE((*again)->wait().is_ok());
  EXPECT_EQ((*again)->kept(), (std::vector<std::string>{"step=000005-val_loss=0.5000"}));
  EXPECT_EQ(read_last(root), "step=000005-val_loss=0.5000\n");  // moved to the newest one kept
  fs::remove_all(root);
}

TEST(CheckpointManager, FailedWriteIsReportedAndLastStaysCommitted) {
  const fs::path root = fresh_dir("fail");
  auto base = open_storage(root.string());
  ASSERT_TRUE(base.is_ok());
  auto failing = std::make_unique<FailingStorage>(std::move(base).value(), "");
  FailingStorage* fs_ptr = failing.get();
  auto m = CheckpointManager::open(policy(root), {}, std::move(failing));
  ASSERT_TRUE(m.is_ok());
  State st;
  ASSERT_TRUE((*m)->save(st.snapshot(1, 2.0)).is_ok());
  ASSERT_TRUE((*m)->wait().is_ok());
  fs_ptr->poison_ = "step=000002";
  fs_ptr->poison_ += "-val_loss=1.0000/optim";
  ASSERT_TRUE((*m)->save(st.snapshot(2, 1.0)).is_ok());  // async: the failure shows later
  Status next = (*m)->save(st.snapshot(3, 3.0));
  ASSERT_FALSE(next.is_ok());
  EXPECT_NE(next.message().find("injected failure"), std::string::npos) << next.message();
  EXPECT_NE(next.message().find("step=000002"), std::string::npos) << next.message();
  EXPECT_FALSE(fs::exists(root / "step=000002-val_loss=1.0000"));
  EXPECT_EQ(read_last(root), "step=000001-val_loss=2.0000\n");
  ASSERT_TRUE((*m)->wait().is_ok());
  fs::remove_all(root);
}

TEST(CheckpointManager, RemovesUncommittedDirectories) {
  const fs::path root = fresh_dir("partial");
  fs::create_directories(root / "step=000004");
  { auto s = open_storage(root.string()); ASSERT_TRUE((*s)->write_text("step=000004/model-rank00000.safetensors", "x").is_ok()); }
  auto m = CheckpointManager::open(policy(root), {});
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ((*m)->newest_committed(), "");
  auto removed = (*m)->remove_uncommitted();
  ASSERT_TRUE(removed.is_ok());
  EXPECT_EQ(*removed, std::vector<std::string>{"step=000004"});
  EXPECT_FALSE(fs::exists(root / "step=000004"));
  fs::remove_all(root);
}

TEST(CheckpointManager, SynchronousSaveReturnsItsOwnError) {
  const fs::path root = fresh_dir("sync");
  auto base = open_storage(root.string());
  auto failing = std::make_unique<FailingStorage>(std::move(base).value(), "COMMITTED");
  auto m = CheckpointManager::open(policy(root, 2, true, false), {}, std::move(failing));
  ASSERT_TRUE(m.is_ok());
  State st;
  Status s = (*m)->save(st.snapshot(1, std::nullopt));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("COMMITTED"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(root / "step=000001"));
  EXPECT_EQ(read_last(root), "");
  fs::remove_all(root);
}

}  // namespace lathe
