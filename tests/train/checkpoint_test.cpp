// The checkpoint format: round trip, verification (a flipped byte, a
// truncated file, a missing COMMITTED are refused naming the file),
// resharding 2→1 and 1→2, the reader API (resolve, inspect, list, load).
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "io/safetensors.h"

namespace lathe {
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("lathe_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Two tensors with distinct values everywhere, and optimizer moments.
struct Fixture {
  std::vector<float> a = std::vector<float>(6 * 5), b = std::vector<float>(7);
  std::vector<float> a_m = std::vector<float>(30), a_v = std::vector<float>(30), b_m = std::vector<float>(7),
                     b_v = std::vector<float>(7);
  Fixture() {
    std::iota(a.begin(), a.end(), 1.0f);
    std::iota(b.begin(), b.end(), 100.0f);
    std::iota(a_m.begin(), a_m.end(), 1000.0f);
    std::iota(a_v.begin(), a_v.end(), 2000.0f);
    std::iota(b_m.begin(), b_m.end(), 3000.0f);
    std::iota(b_v.begin(), b_v.end(), 4000.0f);
  }
  // Rank r of world's even share of every tensor.
  RankShard shard(int r, int world) const {
    auto slice = [&](const std::string& name, Shape shape, const std::vector<float>& v) {
      auto [lo, hi] = even_split(int64_t(v.size()), r, world);
      return TensorSlice{name, shape, lo, std::span<const float>(v.data() + lo, size_t(hi - lo))};
    };
    RankShard s;
    s.model = {slice("layers.0.a", {6, 5}, a), slice("b", {7}, b)};
    s.optim = {slice("layers.0.a.exp_avg", {6, 5}, a_m), slice("layers.0.a.exp_avg_sq", {6, 5}, a_v),
               slice("b.exp_avg", {7}, b_m), slice("b.exp_avg_sq", {7}, b_v)};
    return s;
  }
  CheckpointContents contents(int world, int64_t step = 10) const {
    CheckpointContents c;
    c.step = step;
    c.metrics = {{"val_loss", 1.5}, {"train_loss", 1.25}};
    c.lora.r = 4;
    c.lora.alpha = 8;
    c.lora.target_modules = {"q_proj", "v_proj"};
    c.base_model = {"/models/tiny", "fnv1a64:0123456789abcdef"};
    c.trainer_state_json = "{\"step\": 10}";
    c.recipe_yaml = "peft:\n  dim: 4\n";
    c.extra_files = {{"tokenizer.json", "{}"}};
    for (int r = 0; r < world; ++r) c.ranks.push_back(shard(r, world));
    return c;
  }
};

std::unique_ptr<Storage> open_dir(const fs::path& p) {
  auto s = open_storage(p.string());
  EXPECT_TRUE(s.is_ok()) << s.status().message();
  return std::move(s).value();
}

void flip_byte(const fs::path& file, int64_t pos) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(pos);
  char c = 0;
  f.get(c);
  f.seekp(pos);
  f.put(static_cast<char>(c ^ 0x01));
}

std::vector<float> flat(const std::vector<LoadedSlice>& slices, const std::string& name) {
  for (const LoadedSlice& s : slices) if (s.name == name) return s.data;
  return {};
}

}  // namespace

TEST(Checkpoint, NamesAndSteps) {
  EXPECT_EQ(checkpoint_name(500, {{"val_loss", 1.23449}}), "step=000500-val_loss=1.2345");
  EXPECT_EQ(checkpoint_name(7, {{"train_loss", 2.0}}), "step=000007");
  EXPECT_EQ(step_of_checkpoint_name("step=000500-val_loss=1.2345"), 500);
  EXPECT_EQ(step_of_checkpoint_name("step=1234567"), 1234567);
  EXPECT_EQ(step_of_checkpoint_name("stepx"), -1);
  EXPECT_EQ(step_of_checkpoint_name("step=12a"), -1);
}

TEST(Checkpoint, RoundTripOneRank) {
  const fs::path root = fresh_dir("roundtrip");
  Fixture fx;
  auto ckpt = open_dir(root / "step=000010");
  ASSERT_TRUE(write_checkpoint(*ckpt, fx.contents(1)).is_ok());
  auto m = read_committed_metadata(*ckpt);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->format_version, kCheckpointFormatVersion);
  EXPECT_EQ(m->step, 10);
  EXPECT_EQ(m->world_size, 1);
  EXPECT_EQ(m->lora.r, 4);
  EXPECT_EQ(m->tensors.size(), 6u);
  EXPECT_TRUE(verify_checkpoint(*ckpt, *m).is_ok());
  auto model = load_rank_slices(*ckpt, *m, ShardKind::kModel, 0, 1);
  ASSERT_TRUE(model.is_ok()) << model.status().message();
  EXPECT_EQ(flat(*model, "layers.0.a"), fx.a);
  EXPECT_EQ(flat(*model, "b"), fx.b);
  auto optim = load_rank_slices(*ckpt, *m, ShardKind::kOptim, 0, 1);
  ASSERT_TRUE(optim.is_ok());
  EXPECT_EQ(flat(*optim, "b.exp_avg_sq"), fx.b_v);
  // A one-rank shard is a plain safetensors file with global shapes.
  auto loaded = load_checkpoint_model((root / "step=000010").string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].first, "layers.0.a");
  EXPECT_EQ((*loaded)[0].second.shape(), (Shape{6, 5}));
  EXPECT_EQ((*loaded)[0].second.data<float>()[29], 30.0f);
  fs::remove_all(root);
}

TEST(Checkpoint, ReshardTwoToOneAndOneToTwo) {
  const fs::path root = fresh_dir("reshard");
  Fixture fx;
  auto two = open_dir(root / "two");
  ASSERT_TRUE(write_checkpoint(*two, fx.contents(2)).is_ok());
  auto m2 = read_committed_metadata(*two);
  ASSERT_TRUE(m2.is_ok());
  EXPECT_EQ(m2->world_size, 2);
  EXPECT_NE(m2->file("model-rank00001.safetensors"), nullptr);
  auto whole = load_rank_slices(*two, *m2, ShardKind::kModel, 0, 1);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  EXPECT_EQ(flat(*whole, "layers.0.a"), fx.a);
  EXPECT_EQ(flat(*whole, "b"), fx.b);
  auto whole_optim = load_rank_slices(*two, *m2, ShardKind::kOptim, 0, 1);
  ASSERT_TRUE(whole_optim.is_ok());
  EXPECT_EQ(flat(*whole_optim, "layers.0.a.exp_avg"), fx.a_m);

  auto one = open_dir(root / "one");
  ASSERT_TRUE(write_checkpoint(*one, fx.contents(1)).is_ok());
  auto m1 = read_committed_metadata(*one);
  ASSERT_TRUE(m1.is_ok());
  for (int r = 0; r < 2; ++r) {
    auto part = load_rank_slices(*one, *m1, ShardKind::kOptim, r, 2);
    ASSERT_TRUE(part.is_ok()) << part.status().message();
    auto [lo, hi] = even_split(7, r, 2);
    for (const LoadedSlice& s : *part) {
      if (s.name != "b.exp_avg") continue;
      EXPECT_EQ(s.offset, lo);
      EXPECT_EQ(s.data, std::vector<float>(fx.b_m.begin() + lo, fx.b_m.begin() + hi));
    }
  }
  // And three ranks out of two files: slices straddle the file boundary.
  auto three = load_rank_slices(*two, *m2, ShardKind::kModel, 1, 3);
  ASSERT_TRUE(three.is_ok());
  auto [lo, hi] = even_split(30, 1, 3);
  EXPECT_EQ(flat(*three, "layers.0.a"), std::vector<float>(fx.a.begin() + lo, fx.a.begin() + hi));
  fs::remove_all(root);
}

TEST(Checkpoint, RanksWriteTheirShardsConcurrentlyThenOneCommits) {
  const fs::path root = fresh_dir("ranks");
  Fixture fx;
  auto ckpt = open_dir(root / "step=000010");
  CheckpointContents c = fx.contents(2);
  std::vector<CheckpointFileRecord> records[2];
  Status status[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto rec = write_rank_shards(*ckpt, r, 2, c.ranks[size_t(r)]);
      status[r] = rec.status();
      if (rec.is_ok()) records[r] = *rec;
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_TRUE(status[0].is_ok() && status[1].is_ok()) << status[0].message() << status[1].message();
  std::vector<CheckpointTensorRecord> tensors;
  for (const TensorSlice& s : c.ranks[0].model) tensors.push_back({.name = s.name, .shape = s.shape, .dtype = "F32", .kind = ShardKind::kModel});
  for (const TensorSlice& s : c.ranks[0].optim) tensors.push_back({.name = s.name, .shape = s.shape, .dtype = "F32", .kind = ShardKind::kOptim});
  // Without rank 1's records the commit refuses: its slices are missing.
  Status partial = commit_checkpoint(*ckpt, c, 2, tensors, records[0]);
  EXPECT_FALSE(partial.is_ok());
  EXPECT_FALSE(fs::exists(root / "step=000010" / "COMMITTED"));
  std::vector<CheckpointFileRecord> all = records[0];
  all.insert(all.end(), records[1].begin(), records[1].end());
  ASSERT_TRUE(commit_checkpoint(*ckpt, c, 2, tensors, all).is_ok());
  auto loaded = load_checkpoint_model((root / "step=000010").string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(std::vector<float>((*loaded)[0].second.data<float>(), (*loaded)[0].second.data<float>() + 30), fx.a);
  fs::remove_all(root);
}

TEST(Checkpoint, RefusesSlicesThatDoNotTile) {
  const fs::path root = fresh_dir("tile");
  Fixture fx;
  CheckpointContents c = fx.contents(2);
  c.ranks[1].model[0].offset += 1;
  auto ckpt = open_dir(root / "x");
  Status s = write_checkpoint(*ckpt, c);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("layers.0.a"), std::string::npos) << s.message();
  fs::remove_all(root);
}

TEST(Checkpoint, FlippedByteIsRefusedNamingTheFile) {
  const fs::path root = fresh_dir("flip");
  Fixture fx;
  const fs::path dir = root / "step=000010-val_loss=1.5000";
  auto ckpt = open_dir(dir);
  ASSERT_TRUE(write_checkpoint(*ckpt, fx.contents(1)).is_ok());
  flip_byte(dir / "optim-rank00000.safetensors", fs::file_size(dir / "optim-rank00000.safetensors") - 3);
  auto m = read_committed_metadata(*ckpt);
  ASSERT_TRUE(m.is_ok());
  Status v = verify_checkpoint(*ckpt, *m);
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.message().find("optim-rank00000.safetensors"), std::string::npos) << v.message();
  EXPECT_NE(v.message().find("checksum"), std::string::npos) << v.message();
  // The model file is intact, so the weights still load; the optimizer state does not.
  EXPECT_TRUE(load_checkpoint_model(dir.string()).is_ok());
  EXPECT_FALSE(load_rank_slices(*ckpt, *m, ShardKind::kOptim, 0, 1).is_ok());

  flip_byte(dir / "model-rank00000.safetensors", 40);
  auto bad = load_checkpoint_model(dir.string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("model-rank00000.safetensors"), std::string::npos);

  flip_byte(dir / "metadata.json", 20);
  auto meta = read_committed_metadata(*ckpt);
  ASSERT_FALSE(meta.is_ok());
  EXPECT_NE(meta.status().message().find("metadata.json"), std::string::npos) << meta.status().message();
  fs::remove_all(root);
}

TEST(Checkpoint, TruncatedAndUncommittedAreRefused) {
  const fs::path root = fresh_dir("trunc");
  Fixture fx;
  const fs::path dir = root / "step=000010";
  auto ckpt = open_dir(dir);
  ASSERT_TRUE(write_checkpoint(*ckpt, fx.contents(1)).is_ok());
  fs::resize_file(dir / "trainer_state.json", 3);
  auto m = read_committed_metadata(*ckpt);
  ASSERT_TRUE(m.is_ok());
  Status v = verify_checkpoint(*ckpt, *m);
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.message().find("trainer_state.json"), std::string::npos) << v.message();

  fs::remove(dir / "COMMITTED");
  auto un = load_checkpoint_model(dir.string());
  ASSERT_FALSE(un.is_ok());
  EXPECT_NE(un.status().message().find("not committed"), std::string::npos) << un.status().message();
  auto info = inspect_checkpoint(dir.string());
  ASSERT_TRUE(info.is_ok()) << info.status().message();
  EXPECT_FALSE(info->committed);
  EXPECT_EQ(info->step, 10);
  fs::remove_all(root);
}

TEST(Checkpoint, ResolveInspectAndList) {
  const fs::path root = fresh_dir("list");
  Fixture fx;
  auto r = open_dir(root);
  for (int64_t step : {5, 10}) {
    CheckpointContents c = fx.contents(1, step);
    c.metrics["val_loss"] = 2.0 / double(step);
    const std::string name = checkpoint_name(step, c.metrics);
    auto ckpt = open_dir(root / name);
    ASSERT_TRUE(write_checkpoint(*ckpt, c).is_ok());
    ASSERT_TRUE(r->write_text(kCheckpointLastFile, name + "\n").is_ok());
  }
  ASSERT_TRUE(r->write_text("step=000015/model-rank00000.safetensors", "partial").is_ok());

  auto url = resolve_checkpoint(root.string());
  ASSERT_TRUE(url.is_ok()) << url.status().message();
  EXPECT_EQ(*url, (root / "step=000010-val_loss=0.2000").string());
  EXPECT_EQ(*resolve_checkpoint((root / "last").string()), *url);
  EXPECT_EQ(*resolve_checkpoint(*url + "/"), *url);
  EXPECT_EQ(resolve_checkpoint((root / "nothing").string()).status().code(), StatusCode::kNotFound);

  auto info = inspect_checkpoint(root.string());
  ASSERT_TRUE(info.is_ok()) << info.status().message();
  EXPECT_TRUE(info->committed);
  EXPECT_EQ(info->step, 10);
  EXPECT_DOUBLE_EQ(info->metrics.at("val_loss"), 0.2);
  EXPECT_EQ(info->base_model_path, "/models/tiny");
  EXPECT_EQ(info->lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(info->recipe_yaml, "peft:\n  dim: 4\n");
  EXPECT_GT(info->total_bytes, 30 * 4 * 3);

  auto all = list_checkpoints(root.string());
  ASSERT_TRUE(all.is_ok()) << all.status().message();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].step, 5);
  EXPECT_TRUE((*all)[0].committed);
  EXPECT_EQ((*all)[2].step, 15);
  EXPECT_FALSE((*all)[2].committed);
  fs::remove_all(root);
}

TEST(Checkpoint, BaseModelHashSeesConfigAndHeadersOnly) {
  const fs::path d = fresh_dir("hash");
  { std::ofstream(d / "config.json") << "{\"hidden_size\": 8}"; }
  Tensor t = Tensor::zeros(DType::F32, {4});
  ASSERT_TRUE(write_safetensors((d / "model.safetensors").string(), {{"w", t}}).is_ok());
  auto h1 = base_model_hash(d.string());
  ASSERT_TRUE(h1.is_ok()) << h1.status().message();
  EXPECT_EQ(h1->rfind("fnv1a64:", 0), 0u);
  flip_byte(d / "model.safetensors", int64_t(fs::file_size(d / "model.safetensors")) - 1);  // data, not header
  EXPECT_EQ(*base_model_hash(d.string()), *h1);
  { std::ofstream(d / "config.json") << "{\"hidden_size\": 16}"; }
  EXPECT_NE(*base_model_hash(d.string()), *h1);
  fs::remove_all(d);
}

}  // namespace lathe
