// Local storage: a directory tree under a root. An object appears whole or
// not at all: a Writer streams into a hidden temporary file beside the final
// name (".<name>.lathe-tmp-<pid>-<n>", skipped by listings), and close()
// fsyncs it, renames it into place and fsyncs the directory so the rename
// itself survives a power cut. A Writer destroyed without close() unlinks its
// temporary. Plain POSIX calls, so errors carry errno's text and the path.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "io/storage.h"

namespace lathe {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTmpTag = ".lathe-tmp-";

std::string errno_text(int err) { return std::strerror(err); }

bool is_temp_name(const std::string& filename) {
  return !filename.empty() && filename[0] == '.' && filename.find(kTmpTag) != std::string::npos;
}

// Relative, '/'-separated, no leading '/', no "." or ".." component.
Status check_rel_path(const std::string& path, bool allow_empty) {
  if (path.empty()) return allow_empty ? Status::ok() : invalid_argument("storage: empty object path");
  if (path.front() == '/') return invalid_argument("storage: path '", path, "' must be relative to the root");
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    const std::string_view part(path.data() + start, slash - start);
    if (part == ".." || part == ".") return invalid_argument("storage: path '", path, "' may not contain '", part, "'");
    start = slash + 1;
  }
  return Status::ok();
}

Status fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error("storage: cannot open directory ", dir.string(), ": ", errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return io_error("storage: fsync of directory ", dir.string(), " failed: ", errno_text(err));
  return Status::ok();
}

class LocalWriter final : public StorageWriter {
 public:
  LocalWriter(int fd, fs::path tmp, fs::path final_path) : fd_(fd), tmp_(std::move(tmp)), final_(std::move(final_path)) {}
  ~LocalWriter() override {
    if (fd_ >= 0) ::close(fd_);
    if (!closed_) ::unlink(tmp_.c_str());
  }

  Status write(std::span<const uint8_t> bytes) override {
    if (closed_ || fd_ < 0) return io_error("storage: write to ", final_.string(), " after close");
    const uint8_t* p = bytes.data();
    size_t left = bytes.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_error("storage: cannot write ", final_.string(), ": ", errno_text(errno));
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    written_ += static_cast<int64_t>(bytes.size());
    start_writeback();
    return Status::ok();
  }

  Status close() override {
    if (closed_) return io_error("storage: ", final_.string(), " closed twice");
    // fsync waits for whatever writeback start_writeback() has not finished.
    if (::fsync(fd_) != 0) return io_error("storage: cannot fsync ", final_.string(), ": ", errno_text(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return io_error("storage: cannot close ", final_.string(), ": ", errno_text(errno));
    if (::rename(tmp_.c_str(), final_.c_str()) != 0)
      return io_error("storage: cannot rename ", tmp_.string(), " to ", final_.string(), ": ", errno_text(errno));
    closed_ = true;
    return fsync_dir(final_.parent_path());
  }

 private:
  // Large files: hand each full window of written bytes to the disk at once
  // (sync_file_range, asynchronous), so the disk works while later bytes are
  // still being produced and close()'s fsync only waits for the tail, as a
  // streaming `dd` keeps the disk busy. Advisory: an error here is not one,
  // the fsync in close() is what makes the file durable.
  static constexpr int64_t kWritebackWindow = int64_t{8} << 20;
  void start_writeback() {
    while (written_ - flushed_ >= kWritebackWindow) {
#if defined(__linux__)
      ::sync_file_range(fd_, flushed_, kWritebackWindow, SYNC_FILE_RANGE_WRITE);
#endif
      flushed_ += kWritebackWindow;
    }
  }

  int fd_;
  fs::path tmp_, final_;
  bool closed_ = false;
  int64_t written_ = 0;  // bytes written so far
  int64_t flushed_ = 0;  // bytes handed to the disk by start_writeback()
};

class LocalStorage final : public Storage {
 public:
  explicit LocalStorage(fs::path root, std::string shown) : root_(std::move(root)), shown_(std::move(shown)) {}

  std::string url() const override { return shown_; }

  Result<std::unique_ptr<StorageWriter>> open_writer(const std::string& path) override {
    LATHE_TRY(check_rel_path(path, false));
    const fs::path final_path = root_ / path;
    std::error_code ec;
    fs::create_directories(final_path.parent_path(), ec);
    if (ec) return io_error("storage: cannot create ", final_path.parent_path().string(), ": ", ec.message());
    static std::atomic<uint64_t> counter{0};
    std::string tmp_name(1, '.');
    tmp_name += final_path.filename().string();
    tmp_name += kTmpTag;
    tmp_name += std::to_string(::getpid());
    tmp_name += '-';
    tmp_name += std::to_string(counter++);
    const fs::path tmp = final_path.parent_path() / tmp_name;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return io_error("storage: cannot create ", tmp.string(), ": ", errno_text(errno));
    return std::unique_ptr<StorageWriter>(new LocalWriter(fd, tmp, final_path));
  }

  Result<std::vector<uint8_t>> read(const std::string& path) override {
    LATHE_ASSIGN_OR_RETURN(int64_t n, size(path));
    return read_range(path, 0, n);
  }

  Result<std::vector<uint8_t>> read_range(const std::string& path, int64_t offset, int64_t n) override {
    LATHE_TRY(check_rel_path(path, false));
    const fs::path p = root_ / path;
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return not_found("storage: ", p.string(), " does not exist");
      return io_error("storage: cannot open ", p.string(), ": ", errno_text(errno));
    }
    if (offset < 0 || n < 0) {
      ::close(fd);
      return invalid_argument("storage: bad range [", offset, ", +", n, ") of ", p.string());
    }
    std::vector<uint8_t> out(static_cast<size_t>(n));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t r = ::pread(fd, out.data() + got, out.size() - got, offset + static_cast<int64_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const int err = errno;
        ::close(fd);
        if (r == 0) return io_error("storage: ", p.string(), " ends before byte ", offset + n);
        return io_error("storage: cannot read ", p.string(), ": ", errno_text(err));
      }
      got += static_cast<size_t>(r);
    }
    ::close(fd);
    return out;
  }

  Result<int64_t> size(const std::string& path) override {
    LATHE_TRY(check_rel_path(path, false));
    const fs::path p = root_ / path;
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return not_found("storage: ", p.string(), " does not exist");
      return io_error("storage: cannot stat ", p.string(), ": ", errno_text(errno));
    }
    if (!S_ISREG(st.st_mode)) return not_found("storage: ", p.string(), " is not a file");
    return static_cast<int64_t>(st.st_size);
  }

  Result<std::vector<StorageEntry>> list(const std::string& prefix) override {
    LATHE_TRY(check_rel_path(prefix, true));
    // The deepest directory the prefix names; entries are filtered by the full prefix.
    const size_t slash = prefix.rfind('/');
    const std::string dir_part = slash == std::string::npos ? "" : prefix.substr(0, slash);
    const fs::path start = dir_part.empty() ? root_ : root_ / dir_part;
    std::vector<StorageEntry> out;
    std::error_code ec;
    if (!fs::is_directory(start, ec)) return out;
    fs::recursive_directory_iterator it(start, ec), end;
    if (ec) return io_error("storage: cannot list ", start.string(), ": ", ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) return io_error("storage: cannot list ", start.string(), ": ", ec.message());
      if (!it->is_regular_file(ec) || is_temp_name(it->path().filename().string())) continue;
      std::string rel = fs::relative(it->path(), root_, ec).generic_string();
      if (rel.rfind(prefix, 0) != 0) continue;
      out.push_back({rel, static_cast<int64_t>(it->file_size(ec))});
    }
    std::sort(out.begin(), out.end(), [](const StorageEntry& a, const StorageEntry& b) { return a.path < b.path; });
    return out;
  }

  Result<std::vector<std::string>> list_dirs(const std::string& prefix) override {
    LATHE_TRY(check_rel_path(prefix, true));
    const fs::path dir = prefix.empty() ? root_ : root_ / prefix;
    std::vector<std::string> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (fs::directory_iterator it(dir, ec), end; it != end; it.increment(ec)) {
      if (ec) break;
      if (it->is_directory(ec)) out.push_back(it->path().filename().string());
    }
    if (ec) return io_error("storage: cannot list ", dir.string(), ": ", ec.message());
    std::sort(out.begin(), out.end());
    return out;
  }

  Status remove(const std::string& path) override {
    LATHE_TRY(check_rel_path(path, false));
    const fs::path p = root_ / path;
    if (::unlink(p.c_str()) != 0 && errno != ENOENT)
      return io_error("storage: cannot remove ", p.string(), ": ", errno_text(errno));
    return Status::ok();
  }

  Status remove_prefix(const std::string& prefix) override {
    LATHE_TRY(check_rel_path(prefix, true));
    std::error_code ec;
    if (prefix.empty() || prefix.back() == '/') {
      const fs::path dir = prefix.empty() ? root_ : root_ / prefix;
      if (prefix.empty()) {
        for (fs::directory_iterator it(dir, ec), end; it != end; it.increment(ec)) fs::remove_all(it->path(), ec);
      } else {
        fs::remove_all(dir, ec);
      }
      if (ec) return io_error("storage: cannot remove ", dir.string(), ": ", ec.message());
      return Status::ok();
    }
    // A plain string prefix: every file and directory whose path starts with it.
    const size_t slash = prefix.rfind('/');
    const fs::path parent = slash == std::string::npos ? root_ : root_ / prefix.substr(0, slash);
    const std::string stem = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
    if (!fs::is_directory(parent, ec)) return Status::ok();
    std::vector<fs::path> doomed;
    for (fs::directory_iterator it(parent, ec), end; it != end; it.increment(ec)) {
      if (it->path().filename().string().rfind(stem, 0) == 0) doomed.push_back(it->path());
    }
    for (const fs::path& p : doomed) {
      fs::remove_all(p, ec);
      if (ec) return io_error("storage: cannot remove ", p.string(), ": ", ec.message());
    }
    return Status::ok();
  }

 private:
  fs::path root_;
  std::string shown_;
};

}  // namespace

Result<std::unique_ptr<Storage>> open_local_storage(const std::string& dir) {
  if (dir.empty()) return invalid_argument("storage: empty directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("storage: cannot create ", dir, ": ", ec.message());
  if (!fs::is_directory(dir, ec)) return invalid_argument("storage: ", dir, " is not a directory");
  std::string shown = dir;
  while (shown.size() > 1 && shown.back() == '/') shown.pop_back();
  return std::unique_ptr<Storage>(new LocalStorage(fs::path(shown), shown));
}

}  // namespace lathe
