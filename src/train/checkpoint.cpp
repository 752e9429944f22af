// The checkpoint format (see checkpoint.h): writing the shard files and the
// small files, metadata.json and COMMITTED; reading metadata back and
// verifying files against it; assembling a rank's slices for any world size.
//
// Shard files are safetensors written by streaming: the header is built
// first from the slice list, then each slice's floats go out in chunks, the
// CRC32C computed on the way, so a multi-GB shard never needs a second copy.
// nlohmann::json throws; parsing is wrapped here and errors come out as
// Status naming metadata.json.
#include "train/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/crc32c.h"
#include "io/safetensors.h"

namespace lathe {

using json = nlohmann::json;

namespace {

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

const char* kind_name(ShardKind k) { return k == ShardKind::kModel ? "model" : "optim"; }

json shape_json(const Shape& s) {
  json a = json::array();
  for (int i = 0; i < s.rank(); ++i) a.push_back(s[i]);
  return a;
}

// A file being written: counts bytes and extends its CRC as they go out.
class CountingWriter {
 public:
  explicit CountingWriter(std::unique_ptr<StorageWriter> w) : w_(std::move(w)) {}
  Status write(std::span<const uint8_t> b) {
    crc_ = crc32c_extend(crc_, b.data(), b.size());
    size_ += static_cast<int64_t>(b.size());
    return w_->write(b);
  }
  Status close() { return w_->close(); }
  int64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  std::unique_ptr<StorageWriter> w_;
  int64_t size_ = 0;
  uint32_t crc_ = 0;
};

void pause_for_test(const CheckpointWriteOptions& opt) {
  if (opt.file_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt.file_delay_ms));
}

Result<CheckpointFileRecord> write_small_file(Storage& ckpt, const std::string& name, const std::string& bytes,
                                              const CheckpointWriteOptions& opt) {
  pause_for_test(opt);
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<StorageWriter> w, ckpt.open_writer(name));
  CountingWriter cw(std::move(w));
  LATHE_TRY(cw.write(as_bytes(bytes)));
  LATHE_TRY(cw.close());
  CheckpointFileRecord rec;
  rec.name = name;
  rec.size = cw.size();
  rec.crc32c = cw.crc();
  return rec;
}

Result<CheckpointFileRecord> write_shard(Storage& ckpt, ShardKind kind, int rank, int world,
                                         const std::vector<TensorSlice>& slices, const CheckpointWriteOptions& opt) {
  const std::string name = shard_file_name(kind, rank);
  json header = json::object();
  uint64_t pos = 0;
  CheckpointFileRecord rec;
  rec.name = name;
  rec.rank = rank;
  rec.kind = kind;
  for (const TensorSlice& s : slices) {
    const int64_t len = static_cast<int64_t>(s.data.size());
    const bool whole = s.offset == 0 && len == s.shape.numel();
    const uint64_t nbytes = static_cast<uint64_t>(len) * sizeof(float);
    header[s.name] = {{"dtype", "F32"},
                      {"shape", whole ? shape_json(s.shape) : json::array({len})},
                      {"data_offsets", {pos, pos + nbytes}}};
    pos += nbytes;
    rec.slices.push_back({s.name, s.offset, len});
  }
  header["__metadata__"] = {{"format", "lathe-checkpoint"},
                            {"kind", kind_name(kind)},
                            {"rank", std::to_string(rank)},
                            {"world_size", std::to_string(world)}};
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data section 8-byte aligned
  uint8_t len8[8];
  const uint64_t hlen = h.size();
  for (int i = 0; i < 8; ++i) len8[i] = static_cast<uint8_t>(hlen >> (8 * i));

  pause_for_test(opt);
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<StorageWriter> w, ckpt.open_writer(name));
  CountingWriter cw(std::move(w));
  LATHE_TRY(cw.write({len8, 8}));
  LATHE_TRY(cw.write(as_bytes(h)));
  const size_t chunk = static_cast<size_t>(std::max<int64_t>(opt.chunk_bytes, 4096));
  for (const TensorSlice& s : slices) {
    std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(s.data.data()), s.data.size_bytes());
    for (size_t off = 0; off < bytes.size(); off += chunk) {
      LATHE_TRY(cw.write(bytes.subspan(off, std::min(chunk, bytes.size() - off))));
    }
  }
  LATHE_TRY(cw.close());
  rec.size = cw.size();
  rec.crc32c = cw.crc();
  return rec;
}

// The tensors (global shape, kind) named by the slices, in first-seen order.
Result<std::vector<CheckpointTensorRecord>> tensors_of(const std::vector<RankShard>& ranks) {
  std::vector<CheckpointTensorRecord> out;
  std::map<std::string, size_t> seen;
  for (ShardKind kind : {ShardKind::kModel, ShardKind::kOptim}) {
    for (const RankShard& r : ranks) {
      for (const TensorSlice& s : kind == ShardKind::kModel ? r.model : r.optim) {
        auto [it, fresh] = seen.emplace(s.name, out.size());
        if (fresh) out.push_back({.name = s.name, .shape = s.shape, .dtype = "F32", .kind = kind});
        else if (!(out[it->second].shape == s.shape))
          return invalid_argument("checkpoint: tensor ", s.name, " has two global shapes");
      }
    }
  }
  return out;
}

// Every tensor must be tiled exactly by the shard files' slices: no gap, no overlap.
Status check_tiling(const std::vector<CheckpointTensorRecord>& tensors, const std::vector<CheckpointFileRecord>& files) {
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> cover;
  for (const CheckpointFileRecord& f : files)
    for (const auto& s : f.slices) cover[s.tensor].push_back({s.offset, s.offset + s.length});
  for (const CheckpointTensorRecord& t : tensors) {
    auto& v = cover[t.name];
    std::sort(v.begin(), v.end());
    int64_t at = 0;
    for (auto [b, e] : v) {
      if (b != at) return invalid_argument("checkpoint: slices of tensor ", t.name, " do not tile it (at element ", at, ")");
      at = e;
    }
    if (at != t.shape.numel())
      return invalid_argument("checkpoint: slices of tensor ", t.name, " cover ", at, " of ", t.shape.numel(), " elements");
    cover.erase(t.name);
  }
  if (!cover.empty()) return invalid_argument("checkpoint: shard slices name unknown tensor ", cover.begin()->first);
  return Status::ok();
}

json lora_json(const LoraConfig& l) {
  return {{"r", l.r}, {"alpha", l.alpha}, {"rslora", l.rslora}, {"dropout", l.dropout},
          {"target_modules", l.target_modules}};
}

// JSON has no NaN or infinity: a metric that is not finite is left out.
std::map<std::string, double> finite_metrics(const std::map<std::string, double>& m) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : m) if (std::isfinite(v)) out[k] = v;
  return out;
}

json metadata_json(const CheckpointContents& c, int world, const std::vector<CheckpointTensorRecord>& tensors,
                   const std::vector<CheckpointFileRecord>& files) {
  json t = json::array();
  for (const CheckpointTensorRecord& r : tensors)
    t.push_back({{"name", r.name}, {"kind", kind_name(r.kind)}, {"shape", shape_json(r.shape)}, {"dtype", r.dtype}});
  json f = json::array();
  for (const CheckpointFileRecord& r : files) {
    json e = {{"name", r.name}, {"size", r.size}, {"crc32c", crc32c_hex(r.crc32c)}};
    if (r.rank >= 0) {
      e["rank"] = r.rank;
      e["kind"] = kind_name(r.kind);
      json sl = json::array();
      for (const auto& s : r.slices) sl.push_back({{"tensor", s.tensor}, {"offset", s.offset}, {"length", s.length}});
      e["slices"] = std::move(sl);
    }
    f.push_back(std::move(e));
  }
  return {{"format", "lathe-checkpoint"},
          {"format_version", kCheckpointFormatVersion},
          {"step", c.step},
          {"metrics", finite_metrics(c.metrics)},
          {"world_size", world},
          {"full_sft", c.full_sft},
          {"lora", c.full_sft ? json(nullptr) : lora_json(c.lora)},
          {"base_model", {{"path", c.base_model.path}, {"hash", c.base_model.hash}}},
          {"tensors", std::move(t)},
          {"files", std::move(f)}};
}

std::string committed_text(const std::string& metadata) {
  return json({{"metadata_size", metadata.size()}, {"metadata_crc32c", crc32c_hex(crc32c(metadata.data(), metadata.size()))}})
             .dump() +
         "\n";
}

Result<uint32_t> parse_hex32(const std::string& s) {
  if (s.size() != 8) return invalid_argument("bad crc32c '", s, "'");
  uint32_t v = 0;
  for (char ch : s) {
    int d = (ch >= '0' && ch <= '9') ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10 : -1;
    if (d < 0) return invalid_argument("bad crc32c '", s, "'");
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  return v;
}

ShardKind parse_kind(const std::string& s) { return s == "optim" ? ShardKind::kOptim : ShardKind::kModel; }

// Throws nlohmann's exceptions on a missing or mistyped field; the caller catches.
CheckpointMetadata metadata_from_json(const json& j) {
  CheckpointMetadata m;
  if (j.at("format").get<std::string>() != "lathe-checkpoint") throw std::runtime_error("not a lathe checkpoint");
  m.format_version = j.at("format_version").get<int>();
  m.step = j.at("step").get<int64_t>();
  m.metrics = j.at("metrics").get<std::map<std::string, double>>();
  m.world_size = j.at("world_size").get<int>();
  m.full_sft = j.at("full_sft").get<bool>();
  if (const json& l = j.at("lora"); !l.is_null()) {
    m.lora.r = l.at("r").get<int>();
    m.lora.alpha = l.at("alpha").get<float>();
    m.lora.rslora = l.at("rslora").get<bool>();
    m.lora.dropout = l.at("dropout").get<float>();
    m.lora.target_modules = l.at("target_modules").get<std::vector<std::string>>();
  }
  m.base_model.path = j.at("base_model").at("path").get<std::string>();
  m.base_model.hash = j.at("base_model").at("hash").get<std::string>();
  for (const json& t : j.at("tensors")) {
    m.tensors.push_back({.name = t.at("name").get<std::string>(),
                         .shape = Shape(t.at("shape").get<std::vector<int64_t>>()),
                         .dtype = t.at("dtype").get<std::string>(),
                         .kind = parse_kind(t.at("kind").get<std::string>())});
  }
  for (const json& f : j.at("files")) {
    CheckpointFileRecord r;
    r.name = f.at("name").get<std::string>();
    r.size = f.at("size").get<int64_t>();
    Result<uint32_t> crc = parse_hex32(f.at("crc32c").get<std::string>());
    if (!crc.is_ok()) throw std::runtime_error(crc.status().message());
    r.crc32c = *crc;
    if (f.contains("rank")) {
      r.rank = f.at("rank").get<int>();
      r.kind = parse_kind(f.at("kind").get<std::string>());
      for (const json& s : f.at("slices"))
        r.slices.push_back({s.at("tensor").get<std::string>(), s.at("offset").get<int64_t>(), s.at("length").get<int64_t>()});
    }
    m.files.push_back(std::move(r));
  }
  return m;
}

}  // namespace

std::string shard_file_name(ShardKind kind, int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s-rank%05d.safetensors", kind_name(kind), rank);
  return buf;
}

std::pair<int64_t, int64_t> even_split(int64_t n, int rank, int world) {
  return {n * rank / world, n * (rank + 1) / world};
}

Result<std::vector<CheckpointFileRecord>> write_rank_shards(Storage& ckpt, int rank, int world, const RankShard& shard,
                                                            const CheckpointWriteOptions& opt) {
  if (world < 1 || rank < 0 || rank >= world) return invalid_argument("checkpoint: bad rank ", rank, " of ", world);
  std::vector<CheckpointFileRecord> out;
  for (ShardKind k : {ShardKind::kModel, ShardKind::kOptim}) {
    LATHE_ASSIGN_OR_RETURN(CheckpointFileRecord rec,
                           write_shard(ckpt, k, rank, world, k == ShardKind::kModel ? shard.model : shard.optim, opt));
    out.push_back(std::move(rec));
  }
  return out;
}

Status commit_checkpoint(Storage& ckpt, const CheckpointContents& c, int world,
                         const std::vector<CheckpointTensorRecord>& tensors,
                         std::vector<CheckpointFileRecord> shard_files, const CheckpointWriteOptions& opt) {
  LATHE_TRY(check_tiling(tensors, shard_files));
  for (int r = 0; r < world; ++r) {
    for (ShardKind k : {ShardKind::kModel, ShardKind::kOptim}) {
      const std::string name = shard_file_name(k, r);
      if (std::none_of(shard_files.begin(), shard_files.end(), [&](const auto& f) { return f.name == name; }))
        return invalid_argument("checkpoint: rank ", r, " of ", world, " wrote no ", name);
    }
  }
  std::vector<CheckpointFileRecord> files = std::move(shard_files);
  LATHE_ASSIGN_OR_RETURN(CheckpointFileRecord st, write_small_file(ckpt, kCheckpointTrainerStateFile, c.trainer_state_json, opt));
  files.push_back(std::move(st));
  LATHE_ASSIGN_OR_RETURN(CheckpointFileRecord rc, write_small_file(ckpt, kCheckpointRecipeFile, c.recipe_yaml, opt));
  files.push_back(std::move(rc));
  for (const auto& [name, bytes] : c.extra_files) {
    LATHE_ASSIGN_OR_RETURN(CheckpointFileRecord ef, write_small_file(ckpt, name, bytes, opt));
    files.push_back(std::move(ef));
  }
  const std::string meta = metadata_json(c, world, tensors, files).dump(1) + "\n";
  LATHE_TRY(write_small_file(ckpt, kCheckpointMetadataFile, meta, opt).status());
  return write_small_file(ckpt, kCheckpointCommittedFile, committed_text(meta), opt).status();
}

Status write_checkpoint(Storage& ckpt, const CheckpointContents& c, const CheckpointWriteOptions& opt) {
  if (c.ranks.empty()) return invalid_argument("checkpoint: no ranks to write");
  LATHE_ASSIGN_OR_RETURN(std::vector<CheckpointTensorRecord> tensors, tensors_of(c.ranks));
  const int world = static_cast<int>(c.ranks.size());
  std::vector<CheckpointFileRecord> files;
  for (int r = 0; r < world; ++r) {
    LATHE_ASSIGN_OR_RETURN(std::vector<CheckpointFileRecord> mine, write_rank_shards(ckpt, r, world, c.ranks[size_t(r)], opt));
    for (CheckpointFileRecord& f : mine) files.push_back(std::move(f));
  }
  return commit_checkpoint(ckpt, c, world, tensors, std::move(files), opt);
}

const CheckpointFileRecord* CheckpointMetadata::file(const std::string& name) const {
  for (const CheckpointFileRecord& f : files) if (f.name == name) return &f;
  return nullptr;
}

int64_t CheckpointMetadata::total_bytes() const {
  int64_t n = 0;
  for (const CheckpointFileRecord& f : files) n += f.size;
  return n;
}

Result<CheckpointMetadata> parse_checkpoint_metadata(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(where, ": not valid JSON");
  try {
    CheckpointMetadata m = metadata_from_json(j);
    if (m.format_version > kCheckpointFormatVersion)
      return unsupported(where, ": format_version ", m.format_version, " is newer than this build reads (",
                         kCheckpointFormatVersion, ")");
    return m;
  } catch (const std::exception& e) {
    return invalid_argument(where, ": ", e.what());
  }
}

Result<CheckpointMetadata> read_committed_metadata(Storage& ckpt) {
  const std::string committed_url = ckpt.url_of(kCheckpointCommittedFile);
  LATHE_ASSIGN_OR_RETURN(bool has_commit, ckpt.exists(kCheckpointCommittedFile));
  if (!has_commit)
    return invalid_argument("checkpoint ", ckpt.url(), " is not committed (no ", kCheckpointCommittedFile,
                            "): a save was interrupted; use an earlier checkpoint");
  LATHE_ASSIGN_OR_RETURN(std::string meta, ckpt.read_text(kCheckpointMetadataFile));
  LATHE_ASSIGN_OR_RETURN(std::string commit, ckpt.read_text(kCheckpointCommittedFile));
  if (commit != committed_text(meta))
    return invalid_argument(ckpt.url_of(kCheckpointMetadataFile), ": size or checksum does not match ",
                            committed_url, " (corrupt checkpoint)");
  return parse_checkpoint_metadata(meta, ckpt.url_of(kCheckpointMetadataFile));
}

Result<std::vector<uint8_t>> read_verified(Storage& ckpt, const CheckpointMetadata& m, const std::string& name) {
  const CheckpointFileRecord* rec = m.file(name);
  if (rec == nullptr) return not_found(ckpt.url_of(kCheckpointMetadataFile), ": lists no file ", name);
  Result<std::vector<uint8_t>> bytes = ckpt.read(name);
  if (!bytes.is_ok()) return bytes.status().with_context("checkpoint file " + ckpt.url_of(name));
  if (static_cast<int64_t>(bytes->size()) != rec->size)
    return invalid_argument("checkpoint file ", ckpt.url_of(name), " has ", bytes->size(), " bytes, metadata says ",
                            rec->size, " (truncated or corrupt)");
  const uint32_t crc = crc32c(bytes->data(), bytes->size());
  if (crc != rec->crc32c)
    return invalid_argument("checkpoint file ", ckpt.url_of(name), " fails its checksum (crc32c ", crc32c_hex(crc),
                            ", metadata says ", crc32c_hex(rec->crc32c), "): corrupt");
  return bytes;
}

Status verify_checkpoint(Storage& ckpt, const CheckpointMetadata& m) {
  for (const CheckpointFileRecord& f : m.files) LATHE_TRY(read_verified(ckpt, m, f.name).status());
  return Status::ok();
}

Result<std::vector<LoadedSlice>> load_rank_slices(Storage& ckpt, const CheckpointMetadata& m, ShardKind kind,
                                                  int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) return invalid_argument("checkpoint: bad rank ", rank, " of ", world);
  std::vector<LoadedSlice> out;
  std::map<std::string, size_t> index;
  for (const CheckpointTensorRecord& t : m.tensors) {
    if (t.kind != kind) continue;
    if (t.dtype != "F32") return unsupported(ckpt.url_of(kCheckpointMetadataFile), ": tensor ", t.name, " is ", t.dtype);
    auto [b, e] = even_split(t.shape.numel(), rank, world);
    index[t.name] = out.size();
    out.push_back({.name = t.name, .shape = t.shape, .offset = b, .data = std::vector<float>(size_t(e - b))});
  }
  std::map<std::string, int64_t> filled;
  for (const CheckpointFileRecord& f : m.files) {
    if (f.rank < 0 || f.kind != kind) continue;
    bool needed = false;  // read only files that overlap this rank's share
    for (const auto& s : f.slices) {
      auto it = index.find(s.tensor);
      if (it == index.end()) continue;
      const LoadedSlice& dst = out[it->second];
      if (s.offset < dst.offset + int64_t(dst.data.size()) && dst.offset < s.offset + s.length) needed = true;
    }
    if (!needed) continue;
    LATHE_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_verified(ckpt, m, f.name));
    const std::string_view view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    LATHE_ASSIGN_OR_RETURN(SafetensorsFile sf, SafetensorsFile::from_bytes(view, ckpt.url_of(f.name)));
    for (const auto& s : f.slices) {
      auto it = index.find(s.tensor);
      if (it == index.end())
        return invalid_argument(ckpt.url_of(f.name), ": tensor ", s.tensor, " is not in ", kCheckpointMetadataFile);
      LoadedSlice& dst = out[it->second];
      const int64_t b = std::max(s.offset, dst.offset);
      const int64_t e = std::min(s.offset + s.length, dst.offset + int64_t(dst.data.size()));
      if (b >= e) continue;
      const SafetensorsEntry* ent = sf.find(s.tensor);
      if (ent == nullptr || ent->dtype != DType::F32 || int64_t(ent->end - ent->begin) != s.length * 4)
        return invalid_argument(ckpt.url_of(f.name), ": tensor ", s.tensor, " does not match ", kCheckpointMetadataFile);
      LATHE_ASSIGN_OR_RETURN(Tensor t, sf.tensor(s.tensor));
      std::memcpy(dst.data.data() + (b - dst.offset), t.data<float>() + (b - s.offset), size_t(e - b) * sizeof(float));
      filled[s.tensor] += e - b;
    }
  }
  for (const LoadedSlice& s : out) {
    if (filled[s.name] != int64_t(s.data.size()))
      return invalid_argument(ckpt.url_of(kCheckpointMetadataFile), ": the shard files do not cover tensor ", s.name);
  }
  return out;
}

}  // namespace lathe
