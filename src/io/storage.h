// Storage behind one interface: a local directory or an S3 prefix
// ("s3://bucket/prefix", through libcurl with AWS SigV4). Checkpoints, exports
// and their listings go through it, so every code path above works the same on
// both.
//
// Paths given to a Storage are relative to its root, '/'-separated, never
// starting with '/' and never containing "..". An object is whole or absent
// to readers: a local write goes to a temporary name, is fsync'ed and renamed
// into place (and the directory fsync'ed); an S3 object appears when its PUT
// or multipart upload completes. A Writer that is destroyed without close()
// leaves nothing behind (local temp file removed, multipart upload aborted).
//
// Threads: a Storage may be used from several threads at once (the
// checkpoint writer thread and the trainer's listing); one Writer is used by
// one thread. Errors name the location (file path or s3 URL) and the cause.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

// An object being written: bytes appended in order, published by close().
class StorageWriter {
 public:
  virtual ~StorageWriter() = default;
  virtual Status write(std::span<const uint8_t> bytes) = 0;
  // Makes the object visible (durable for local files). Exactly once.
  virtual Status close() = 0;
};

struct StorageEntry {
  std::string path;  // relative to the root, e.g. "step=000010/metadata.json"
  int64_t size = 0;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // "file:///abs/dir", "/abs/dir", "rel/dir" or "s3://bucket/prefix".
  virtual std::string url() const = 0;
  // url() joined with a relative path, for messages.
  std::string url_of(const std::string& path) const;

  virtual Result<std::unique_ptr<StorageWriter>> open_writer(const std::string& path) = 0;
  // Whole object in one call (small files: metadata.json, COMMITTED, last).
  Status write_all(const std::string& path, std::span<const uint8_t> bytes);
  Status write_text(const std::string& path, const std::string& text);

  // Whole object, or a byte range [offset, offset + n) of it.
  virtual Result<std::vector<uint8_t>> read(const std::string& path) = 0;
  virtual Result<std::vector<uint8_t>> read_range(const std::string& path, int64_t offset, int64_t n) = 0;
  Result<std::string> read_text(const std::string& path);

  // Size of an object; a kNotFound Status naming it when it does not exist
  // (read() and read_range() answer the same way).
  virtual Result<int64_t> size(const std::string& path) = 0;
  Result<bool> exists(const std::string& path);  // from size(): kNotFound is false

  // Every object under prefix (recursively), sorted by path. prefix "" lists
  // everything; "step=000010/" lists one checkpoint.
  virtual Result<std::vector<StorageEntry>> list(const std::string& prefix) = 0;
  // The immediate "subdirectories" of prefix (names without the trailing '/').
  virtual Result<std::vector<std::string>> list_dirs(const std::string& prefix) = 0;

  // Removes one object (absent is not an error) or everything under a prefix.
  virtual Status remove(const std::string& path) = 0;
  virtual Status remove_prefix(const std::string& prefix) = 0;
};

// True for "s3://..." locations.
bool is_s3_url(const std::string& location);

// Opens location as a Storage root. Local roots are created if missing. S3
// takes AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (optional),
// AWS_REGION / AWS_DEFAULT_REGION (default us-east-1) and AWS_ENDPOINT_URL
// (S3-compatible stores; path-style addressing) from the environment.
Result<std::unique_ptr<Storage>> open_storage(const std::string& location);

// The two implementations (storage_local.cpp, storage_s3.cpp).
Result<std::unique_ptr<Storage>> open_local_storage(const std::string& dir);
Result<std::unique_ptr<Storage>> open_s3_storage(const std::string& url);

}  // namespace lathe
