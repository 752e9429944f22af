// A model directory's weights as Hugging Face lays them out: one
// model.safetensors, or shards named model-0000i-of-0000n.safetensors listed by
// model.safetensors.index.json. Reading trusts the index only as far as the
// shards confirm it (every listed tensor must be in its shard). Writing splits
// shards the way huggingface_hub does (in order, a new shard when the next
// tensor would pass the limit, an oversized tensor alone) and writes the index
// last, so a crash never leaves an index pointing at missing shards.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/safetensors.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path, ": read failed");
  return ss.str();
}

// Parses the index into tensor → shard file name.
Result<std::map<std::string, std::string>> read_index(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(std::string text, read_text(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(path, ": not valid JSON");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return invalid_argument(path, ": needs an object \"weight_map\": {tensor: file}");
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) return invalid_argument(path, ": weight_map entry '", name, "' must be a file name");
    const auto& f = file.get_ref<const std::string&>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return invalid_argument(path, ": weight_map entry '", name, "' names '", f, "', not a file in the directory");
    }
    map[name] = f;
  }
  if (map.empty()) return invalid_argument(path, ": weight_map is empty");
  return map;
}

// Shards in huggingface_hub's order-preserving greedy split.
std::vector<std::vector<size_t>> split_shards(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                              uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t n = static_cast<uint64_t>(tensors[i].second.nbytes());
    if (n > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + n > max_shard_bytes && !current.empty()) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += n;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// Removes weight files of an earlier save that the new layout does not use.
void remove_stale(const std::string& dir, const std::set<std::string>& keep) {
  std::error_code ec;
  for (const auto& ent : fs::directory_iterator(dir, ec)) {
    std::string n = ent.path().filename().string();
    bool ours = n == kSingleFile || n == kIndexFile ||
                (n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos &&
                 n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0);
    if (ours && !keep.count(n)) fs::remove(ent.path(), ec);
  }
}

}  // namespace

Result<WeightStore> WeightStore::open_dir(const std::string& dir) {
  WeightStore ws;
  ws.dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(dir, ": not a directory");
  std::string index_path = (fs::path(dir) / kIndexFile).string();
  std::string single_path = (fs::path(dir) / kSingleFile).string();
  // Like transformers: a single model.safetensors wins over an index.
  if (fs::exists(single_path, ec)) {
    LATHE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single_path));
    for (const SafetensorsEntry& e : f.entries()) ws.index_[e.name] = 0;
    ws.files_.push_back(std::move(f));
    return ws;
  }
  if (!fs::exists(index_path, ec)) {
    return not_found(dir, ": no ", kSingleFile, " or ", kIndexFile);
  }
  LATHE_ASSIGN_OR_RETURN(auto map, read_index(index_path));
  std::map<std::string, size_t> file_ids;
  for (const auto& [name, file] : map) {
    auto [it, fresh] = file_ids.emplace(file, ws.files_.size());
    if (fresh) {
      auto f = SafetensorsFile::open((fs::path(dir) / file).string());
      if (!f.is_ok()) return f.status().with_context(index_path);
      ws.files_.push_back(std::move(f).value());
    }
    if (ws.files_[it->second].find(name) == nullptr) {
      return invalid_argument(index_path, ": tensor '", name, "' is listed in ", file,
                              " but that file does not hold it");
    }
    ws.index_[name] = it->second;
  }
  return ws;
}

bool WeightStore::has(std::string_view name) const { return index_.find(name) != index_.end(); }

Result<Tensor> WeightStore::get(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::string files;
    for (const auto& f : files_) files += (files.empty() ? "" : ", ") + fs::path(f.path()).filename().string();
    return not_found(dir_, ": tensor '", name, "' not found in ", files);
  }
  return files_[it->second].tensor(name);
}

Result<Tensor> WeightStore::get(std::string_view name, const Shape& expected) const {
  LATHE_ASSIGN_OR_RETURN(Tensor t, get(name));
  if (!(t.shape() == expected)) {
    return invalid_argument(file_of(name), ": tensor '", name, "' has shape ", t.shape().str(), ", expected ",
                            expected.str());
  }
  return t;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;
}

std::string WeightStore::file_of(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? std::string() : files_[it->second].path();
}

const SafetensorsEntry* WeightStore::entry(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : files_[it->second].find(name);
}

Status write_text_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return io_error(tmp, ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return io_error(path, ": rename: ", ec.message());
  return Status::ok();
}

Status write_weights(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                     uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir, ": cannot create directory: ", ec.message());
  if (tensors.empty()) return invalid_argument(dir, ": no tensors to write");
  const std::map<std::string, std::string> meta = {{"format", "pt"}};  // transformers checks it
  std::vector<std::vector<size_t>> shards = split_shards(tensors, max_shard_bytes);
  if (shards.size() == 1) {
    LATHE_TRY(write_safetensors((fs::path(dir) / kSingleFile).string(), tensors, meta));
    remove_stale(dir, {kSingleFile});
    return Status::ok();
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> sorted_map;  // transformers sorts the keys
  std::set<std::string> keep = {kIndexFile};
  uint64_t total_bytes = 0, total_params = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = shard_name(s, shards.size());
    std::vector<std::pair<std::string, Tensor>> part;
    for (size_t i : shards[s]) {
      part.push_back(tensors[i]);
      sorted_map[tensors[i].first] = name;
      total_bytes += static_cast<uint64_t>(tensors[i].second.nbytes());
      total_params += static_cast<uint64_t>(tensors[i].second.numel());
    }
    LATHE_TRY(write_safetensors((fs::path(dir) / name).string(), part, meta));
    keep.insert(name);
  }
  for (const auto& [k, v] : sorted_map) weight_map[k] = v;
  nlohmann::ordered_json index = {
      {"metadata", {{"total_parameters", total_params}, {"total_size", total_bytes}}},
      {"weight_map", weight_map}};
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const std::exception& e) {  // a tensor name that is not UTF-8
    return invalid_argument(dir, ": cannot encode ", kIndexFile, ": ", e.what());
  }
  LATHE_TRY(write_text_atomic((fs::path(dir) / kIndexFile).string(), text));
  remove_stale(dir, keep);
  return Status::ok();
}

}  // namespace lathe
