// The checkpoint reader API (checkpoint.h): finding a checkpoint from a
// directory, a root or a `last` file; describing one from its metadata
// without reading its shards; loading its weights verified. Also the
// helpers every side shares: names, the base model hash, location splitting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "io/safetensors.h"
#include "train/checkpoint.h"

namespace lathe {
namespace fs = std::filesystem;

namespace {

std::string trim_slashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string join(const std::string& root, const std::string& name) {
  if (root.empty()) return name;
  return root.back() == '/' ? root + name : root + "/" + name;
}

std::string trim_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Reads <root>/last: the name of the newest committed checkpoint.
Result<std::string> read_last(Storage& root) {
  LATHE_ASSIGN_OR_RETURN(std::string text, root.read_text(kCheckpointLastFile));
  std::string name = trim_line(text);
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    return invalid_argument(root.url_of(kCheckpointLastFile), ": does not hold a checkpoint name");
  return name;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

std::string checkpoint_name(int64_t step, const std::map<std::string, double>& metrics) {
  char buf[96];
  auto it = metrics.find("val_loss");
  if (it != metrics.end() && std::isfinite(it->second)) {
    std::snprintf(buf, sizeof buf, "step=%06lld-val_loss=%.4f", static_cast<long long>(step), it->second);
  } else {
    std::snprintf(buf, sizeof buf, "step=%06lld", static_cast<long long>(step));
  }
  return buf;
}

int64_t step_of_checkpoint_name(const std::string& name) {
  if (name.rfind("step=", 0) != 0) return -1;
  size_t i = 5;
  int64_t v = 0;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + (name[i++] - '0');
  if (i != name.size() && name[i] != '-') return -1;
  return v;
}

std::pair<std::string, std::string> split_checkpoint_location(const std::string& location) {
  const std::string loc = trim_slashes(location);
  const size_t slash = loc.rfind('/');
  if (slash == std::string::npos) return {".", loc};
  std::string parent = loc.substr(0, slash);
  if (parent.empty()) parent = "/";
  return {parent, loc.substr(slash + 1)};
}

Result<std::unique_ptr<Storage>> open_existing_storage(const std::string& location) {
  if (!is_s3_url(location)) {
    const std::string path = location.rfind("file://", 0) == 0 ? location.substr(7) : location;
    std::error_code ec;
    if (!fs::is_directory(path, ec)) return not_found(location, " does not exist or is not a directory");
  }
  return open_storage(location);
}

Result<std::string> base_model_hash(const std::string& model_dir) {
  uint64_t h = 0xcbf29ce484222325ull;
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> dir, open_existing_storage(model_dir));
  LATHE_ASSIGN_OR_RETURN(std::vector<uint8_t> config, dir->read("config.json"));
  h = fnv1a(h, config.data(), config.size());
  LATHE_ASSIGN_OR_RETURN(std::vector<StorageEntry> entries, dir->list(""));
  for (const StorageEntry& e : entries) {
    if (e.path.find('/') != std::string::npos || e.path.size() < 12 ||
        e.path.compare(e.path.size() - 12, 12, ".safetensors") != 0)
      continue;
    h = fnv1a(h, e.path.data(), e.path.size());
    LATHE_ASSIGN_OR_RETURN(std::vector<uint8_t> len8, dir->read_range(e.path, 0, 8));
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(len8[size_t(i)]) << (8 * i);
    if (n > kSafetensorsMaxHeaderBytes || int64_t(n) + 8 > e.size)
      return invalid_argument(dir->url_of(e.path), ": bad safetensors header length ", n);
    LATHE_ASSIGN_OR_RETURN(std::vector<uint8_t> header, dir->read_range(e.path, 8, int64_t(n)));
    h = fnv1a(h, header.data(), header.size());
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016llx", static_cast<unsigned long long>(h));
  return std::string(buf);
}

Result<std::string> resolve_checkpoint(const std::string& location) {
  if (location.empty()) return invalid_argument("checkpoint: empty location");
  const std::string loc = trim_slashes(location);
  auto [parent, leaf] = split_checkpoint_location(loc);
  if (leaf == kCheckpointLastFile && !is_s3_url(loc) && fs::is_regular_file(loc)) {
    LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> root, open_existing_storage(parent));
    LATHE_ASSIGN_OR_RETURN(std::string name, read_last(*root));
    return join(parent, name);
  }
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> dir, open_existing_storage(loc));
  LATHE_ASSIGN_OR_RETURN(bool has_meta, dir->exists(kCheckpointMetadataFile));
  if (has_meta || step_of_checkpoint_name(leaf) >= 0) return loc;
  LATHE_ASSIGN_OR_RETURN(bool has_last, dir->exists(kCheckpointLastFile));
  if (has_last) {
    LATHE_ASSIGN_OR_RETURN(std::string name, read_last(*dir));
    return join(loc, name);
  }
  if (leaf == kCheckpointLastFile) {  // s3://.../last
    LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> root, open_existing_storage(parent));
    LATHE_ASSIGN_OR_RETURN(bool parent_last, root->exists(kCheckpointLastFile));
    if (parent_last) {
      LATHE_ASSIGN_OR_RETURN(std::string name, read_last(*root));
      return join(parent, name);
    }
  }
  return not_found(loc, " is neither a checkpoint (no ", kCheckpointMetadataFile, ") nor a checkpoints root (no ",
                   kCheckpointLastFile, ")");
}

Result<CheckpointInfo> inspect_checkpoint(const std::string& location) {
  LATHE_ASSIGN_OR_RETURN(std::string url, resolve_checkpoint(location));
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> ckpt, open_existing_storage(url));
  CheckpointInfo info;
  info.location = url;
  info.name = split_checkpoint_location(url).second;
  info.step = std::max<int64_t>(step_of_checkpoint_name(info.name), 0);
  LATHE_ASSIGN_OR_RETURN(std::vector<StorageEntry> entries, ckpt->list(""));
  for (const StorageEntry& e : entries) info.total_bytes += e.size;
  LATHE_ASSIGN_OR_RETURN(bool has_meta, ckpt->exists(kCheckpointMetadataFile));
  if (!has_meta) {
    info.problem = "no metadata.json: the save did not finish";
    return info;
  }
  Result<CheckpointMetadata> committed = read_committed_metadata(*ckpt);
  info.committed = committed.is_ok();
  if (!committed.is_ok()) info.problem = committed.status().message();
  LATHE_ASSIGN_OR_RETURN(std::string text, ckpt->read_text(kCheckpointMetadataFile));
  Result<CheckpointMetadata> parsed = parse_checkpoint_metadata(text, ckpt->url_of(kCheckpointMetadataFile));
  if (!parsed.is_ok()) {
    info.committed = false;
    info.problem = parsed.status().message();
    return info;
  }
  const CheckpointMetadata& m = *parsed;
  info.format_version = m.format_version;
  info.step = m.step;
  info.metrics = m.metrics;
  info.world_size = m.world_size;
  info.full_sft = m.full_sft;
  info.base_model_path = m.base_model.path;
  info.base_model_hash = m.base_model.hash;
  info.lora = m.lora;
  if (Result<std::string> recipe = ckpt->read_text(kCheckpointRecipeFile); recipe.is_ok()) info.recipe_yaml = *recipe;
  return info;
}

Result<std::vector<CheckpointInfo>> list_checkpoints(const std::string& root) {
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage, open_existing_storage(root));
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> dirs, storage->list_dirs(""));
  std::vector<CheckpointInfo> out;
  for (const std::string& d : dirs) {
    if (step_of_checkpoint_name(d) < 0) {
      LATHE_ASSIGN_OR_RETURN(bool has_meta, storage->exists(d + "/" + kCheckpointMetadataFile));
      if (!has_meta) continue;
    }
    LATHE_ASSIGN_OR_RETURN(CheckpointInfo info, inspect_checkpoint(join(trim_slashes(root), d)));
    out.push_back(std::move(info));
  }
  std::stable_sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return out;
}

Result<std::vector<std::pair<std::string, Tensor>>> load_checkpoint_model(const std::string& location) {
  LATHE_ASSIGN_OR_RETURN(std::string url, resolve_checkpoint(location));
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Storage> ckpt, open_existing_storage(url));
  LATHE_ASSIGN_OR_RETURN(CheckpointMetadata m, read_committed_metadata(*ckpt));
  LATHE_ASSIGN_OR_RETURN(std::vector<LoadedSlice> slices, load_rank_slices(*ckpt, m, ShardKind::kModel, 0, 1));
  std::vector<std::pair<std::string, Tensor>> out;
  for (LoadedSlice& s : slices) {
    Tensor t = Tensor::empty(DType::F32, s.shape);
    std::copy(s.data.begin(), s.data.end(), t.data<float>());
    out.emplace_back(s.name, std::move(t));
  }
  return out;
}

}  // namespace lathe
