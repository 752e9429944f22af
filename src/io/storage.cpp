// The parts of Storage shared by every implementation, and the dispatch from
// a location string to the local or S3 implementation.
#include "io/storage.h"

namespace lathe {

std::string Storage::url_of(const std::string& path) const {
  std::string root = url();
  if (path.empty()) return root;
  if (!root.empty() && root.back() != '/') root += '/';
  return root + path;
}

Status Storage::write_all(const std::string& path, std::span<const uint8_t> bytes) {
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<StorageWriter> w, open_writer(path));
  LATHE_TRY(w->write(bytes));
  return w->close();
}

Status Storage::write_text(const std::string& path, const std::string& text) {
  return write_all(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

Result<std::string> Storage::read_text(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read(path));
  return std::string(bytes.begin(), bytes.end());
}

Result<bool> Storage::exists(const std::string& path) {
  Result<int64_t> s = size(path);
  if (s.is_ok()) return true;
  if (s.status().code() == StatusCode::kNotFound) return false;
  return s.status();
}

bool is_s3_url(const std::string& location) { return location.rfind("s3://", 0) == 0; }

Result<std::unique_ptr<Storage>> open_storage(const std::string& location) {
  if (location.empty()) return invalid_argument("storage: empty location");
  if (is_s3_url(location)) return open_s3_storage(location);
  if (location.rfind("file://", 0) == 0) return open_local_storage(location.substr(7));
  if (location.find("://") != std::string::npos)
    return unsupported("storage: ", location, ": only local paths, file:// and s3:// are supported");
  return open_local_storage(location);
}

}  // namespace lathe
