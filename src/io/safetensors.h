// safetensors: the Hugging Face tensor file format. 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, ...,
// "__metadata__": {str: str}}, then the data section.
//
// Reading maps the file (mmap) and hands out zero-copy tensors that keep the
// mapping alive. The header is validated before anything is trusted: length
// limit, JSON shape, known dtypes, offsets inside the data section, offsets
// consistent with dtype x shape, no overlaps. Writing is atomic: a temporary
// file is written, flushed and renamed into place.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // as the reference library

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets within the data section, [begin, end)
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates path. Errors name the file (and tensor, where one is at fault).
  static Result<SafetensorsFile> open(const std::string& path);
  // Validates an in-memory file (fuzzing, tests). bytes must outlive the object.
  static Result<SafetensorsFile> from_bytes(std::string_view bytes, const std::string& source_name);

  const std::string& path() const { return path_; }
  // In data-section (offset) order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(std::string_view name) const;
  // Zero-copy: the Tensor points into the read-only mapping and keeps it
  // alive; never write through it. (Data misaligned for its dtype, possible
  // only in files whose writer did not pad the header, is copied instead.)
  Result<Tensor> tensor(std::string_view name) const;

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // shared: every tensor handed out holds it
  const char* data_ = nullptr;     // start of the data section
  uint64_t data_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, size_t, std::less<>> by_name_;  // name → entries_ index
  static Status parse_header(std::string_view header, uint64_t data_bytes, const std::string& source,
                             SafetensorsFile* out);
};

// Writes tensors (CPU, any dtype) in the given order to path, atomically.
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Writes text to path through a temporary file renamed into place.
Status write_text_atomic(const std::string& path, const std::string& text);

// A model's weights: one model.safetensors, or shards listed by
// model.safetensors.index.json ("weight_map": {tensor: file}).
class WeightStore {
 public:
  static Result<WeightStore> open_dir(const std::string& dir);
  bool has(std::string_view name) const;
  // Error when missing: "<dir>: tensor '<name>' not found in <files>".
  Result<Tensor> get(std::string_view name) const;
  // Like get(), and checks the shape: "<file>: tensor '<name>' has shape [..], expected [..]".
  Result<Tensor> get(std::string_view name, const Shape& expected) const;
  std::vector<std::string> names() const;
  std::string file_of(std::string_view name) const;
  // Header entry (dtype, shape, offsets) without touching the data; null when missing.
  const SafetensorsEntry* entry(std::string_view name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> index_;  // tensor → files_ index
};

// Writes a Hugging Face style model: model.safetensors, or when the total
// exceeds max_shard_bytes, model-0000i-of-0000n.safetensors plus
// model.safetensors.index.json.
Status write_weights(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                     uint64_t max_shard_bytes = 5ull << 30);

}  // namespace lathe
