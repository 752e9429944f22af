// Storage on S3: paths under a root "s3://bucket/prefix" become keys
// "prefix/path". A Writer buffers up to one part: an object that stays below
// the part size goes up in one PUT at close(); a larger one becomes a
// multipart upload whose parts leave as they fill, several at once on their
// own threads (upload_concurrency; one stream rarely fills a link to S3), so
// memory stays at (concurrency + 1) parts whatever the object's size. close()
// completes the upload and a destructor without close() aborts it, so
// nothing half-written ever appears.
// remove_prefix() also aborts uploads left running under the prefix (a
// process killed mid-write leaves one behind).
#include "io/storage_s3.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <future>

#include "core/log.h"

namespace lathe {

namespace {

Status check_path(const std::string& url, const std::string& path) {
  if (!path.empty() && path.front() == '/')
    return invalid_argument("storage: ", url, ": path '", path, "' must be relative");
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    if (path.compare(pos, slash - pos, "..") == 0 && slash - pos == 2)
      return invalid_argument("storage: ", url, ": path '", path, "' must not contain '..'");
    pos = slash + 1;
  }
  return Status::ok();
}

class S3Writer : public StorageWriter {
 public:
  S3Writer(S3Client* client, std::string bucket, std::string key, std::string url)
      : client_(client), bucket_(std::move(bucket)), key_(std::move(key)), url_(std::move(url)),
        part_size_(static_cast<size_t>(client->options().part_size_bytes)),
        max_in_flight_(static_cast<size_t>(std::max(1, client->options().upload_concurrency))) {}

  ~S3Writer() override {
    (void)drain();  // the part uploads borrow this writer
    if (closed_ || upload_id_.empty()) return;
    Status st = client_->abort_multipart_upload(bucket_, key_, upload_id_);
    if (!st.is_ok()) LATHE_LOG(kWarn, "storage: ", url_, ": abandoned upload not aborted: ", st.message());
  }

  Status write(std::span<const uint8_t> bytes) override {
    if (closed_) return io_error("storage: ", url_, ": write after close");
    if (!failed_.is_ok()) return failed_;
    while (!bytes.empty()) {
      size_t take = std::min(bytes.size(), part_size_ - buf_.size());
      buf_.insert(buf_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(take));
      bytes = bytes.subspan(take);
      if (buf_.size() == part_size_) LATHE_TRY(remember(launch_part()));
    }
    return Status::ok();
  }

  Status close() override {
    if (closed_) return io_error("storage: ", url_, ": closed twice");
    if (!failed_.is_ok()) return failed_;
    if (upload_id_.empty()) {
      LATHE_TRY(remember(client_->put_object(bucket_, key_, buf_)));
    } else {
      if (!buf_.empty()) LATHE_TRY(remember(launch_part()));
      LATHE_TRY(remember(drain()));
      LATHE_TRY(remember(client_->complete_multipart_upload(bucket_, key_, upload_id_, etags_, total_)));
    }
    closed_ = true;
    buf_ = {};
    return Status::ok();
  }

 private:
  struct Part {
    int number = 0;
    std::future<Result<std::string>> etag;
  };

  // Sends buf_ as the next part on its own thread, once fewer than
  // max_in_flight_ parts are on their way.
  Status launch_part() {
    if (upload_id_.empty()) {
      LATHE_ASSIGN_OR_RETURN(upload_id_, client_->create_multipart_upload(bucket_, key_));
    }
    while (in_flight_.size() >= max_in_flight_) LATHE_TRY(finish_oldest());
    const int number = static_cast<int>(etags_.size()) + 1;
    etags_.emplace_back();
    total_ += static_cast<int64_t>(buf_.size());
    in_flight_.push_back({number, std::async(std::launch::async, [this, number, data = std::move(buf_)] {
                            return client_->upload_part(bucket_, key_, upload_id_, number, data);
                          })});
    buf_ = {};
    return Status::ok();
  }

  Status finish_oldest() {
    Part part = std::move(in_flight_.front());
    in_flight_.pop_front();
    Result<std::string> etag = part.etag.get();
    if (!etag.is_ok()) return etag.status();
    etags_[static_cast<size_t>(part.number - 1)] = std::move(etag).value();
    return Status::ok();
  }

  // Waits for every part on its way; the first failure, if any.
  Status drain() {
    Status first;
    while (!in_flight_.empty()) {
      Status st = finish_oldest();
      if (first.is_ok() && !st.is_ok()) first = st;
    }
    return first;
  }

  // The first failure sticks: later calls answer with it (it names the URL).
  Status remember(Status st) {
    if (!st.is_ok() && failed_.is_ok()) failed_ = st;
    return failed_;
  }

  S3Client* client_;
  std::string bucket_, key_, url_;
  size_t part_size_;
  size_t max_in_flight_;
  std::vector<uint8_t> buf_;
  std::string upload_id_;
  std::vector<std::string> etags_;  // by part number - 1
  std::deque<Part> in_flight_;
  int64_t total_ = 0;
  bool closed_ = false;
  Status failed_;
};

class S3Storage : public Storage {
 public:
  S3Storage(std::unique_ptr<S3Client> client, std::string bucket, std::string prefix)
      : client_(std::move(client)), bucket_(std::move(bucket)), root_(prefix.empty() ? "" : prefix + "/"),
        url_("s3://" + bucket_ + (prefix.empty() ? "" : "/" + prefix)) {}

  std::string url() const override { return url_; }

  Result<std::unique_ptr<StorageWriter>> open_writer(const std::string& path) override {
    LATHE_TRY(check_object_path(path));
    return std::unique_ptr<StorageWriter>(new S3Writer(client_.get(), bucket_, root_ + path, url_of(path)));
  }

  Result<std::vector<uint8_t>> read(const std::string& path) override {
    LATHE_TRY(check_object_path(path));
    return client_->get_object(bucket_, root_ + path);
  }

  Result<std::vector<uint8_t>> read_range(const std::string& path, int64_t offset, int64_t n) override {
    LATHE_TRY(check_object_path(path));
    if (offset < 0 || n < 0)
      return invalid_argument("storage: ", url_of(path), ": bad range offset ", offset, " length ", n);
    if (n == 0) {  // still answers kNotFound for a missing object
      LATHE_TRY(size(path));
      return std::vector<uint8_t>{};
    }
    return client_->get_object(bucket_, root_ + path, offset, n);
  }

  Result<int64_t> size(const std::string& path) override {
    LATHE_TRY(check_object_path(path));
    return client_->head_object(bucket_, root_ + path);
  }

  Result<std::vector<StorageEntry>> list(const std::string& prefix) override {
    LATHE_TRY(check_path(url_, prefix));
    std::vector<StorageEntry> out;
    std::string token;
    do {
      LATHE_ASSIGN_OR_RETURN(S3ListPage page, client_->list_objects(bucket_, root_ + prefix, "", token));
      for (S3Object& o : page.objects) out.push_back({.path = o.key.substr(root_.size()), .size = o.size});
      token = page.truncated ? page.next_token : "";
    } while (!token.empty());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
    return out;
  }

  Result<std::vector<std::string>> list_dirs(const std::string& prefix) override {
    LATHE_TRY(check_path(url_, prefix));
    const std::string dir = root_ + as_dir(prefix);
    std::vector<std::string> out;
    std::string token;
    do {
      LATHE_ASSIGN_OR_RETURN(S3ListPage page, client_->list_objects(bucket_, dir, "/", token));
      for (const std::string& p : page.common_prefixes) {
        std::string name = p.substr(dir.size());
        if (!name.empty() && name.back() == '/') name.pop_back();
        if (!name.empty()) out.push_back(std::move(name));
      }
      token = page.truncated ? page.next_token : "";
    } while (!token.empty());
    std::sort(out.begin(), out.end());
    return out;
  }

  Status remove(const std::string& path) override {
    LATHE_TRY(check_object_path(path));
    return client_->delete_object(bucket_, root_ + path);
  }

  // A plain string prefix, as for local storage: "step=1/" is one directory,
  // "step=1" also takes "step=10/...".
  Status remove_prefix(const std::string& prefix) override {
    LATHE_TRY(check_path(url_, prefix));
    LATHE_ASSIGN_OR_RETURN(std::vector<S3Upload> uploads, client_->list_multipart_uploads(bucket_, root_ + prefix));
    for (const S3Upload& u : uploads) LATHE_TRY(client_->abort_multipart_upload(bucket_, u.key, u.upload_id));
    LATHE_ASSIGN_OR_RETURN(std::vector<StorageEntry> entries, list(prefix));
    std::vector<std::string> batch;
    for (size_t i = 0; i < entries.size(); ++i) {
      batch.push_back(root_ + entries[i].path);
      if (batch.size() == 1000 || i + 1 == entries.size()) {
        LATHE_TRY(client_->delete_objects(bucket_, batch).with_context("storage: removing " + url_of(prefix)));
        batch.clear();
      }
    }
    return Status::ok();
  }

 private:
  // "a" and "a/" both name the directory "a/"; "" stays the whole root.
  static std::string as_dir(const std::string& prefix) {
    return prefix.empty() || prefix.back() == '/' ? prefix : prefix + "/";
  }

  Status check_object_path(const std::string& path) const {
    if (path.empty() || path.back() == '/')
      return invalid_argument("storage: ", url_, ": '", path, "' does not name an object");
    return check_path(url_, path);
  }

  std::unique_ptr<S3Client> client_;
  std::string bucket_;
  std::string root_;  // "prefix/" or ""
  std::string url_;
};

}  // namespace

Status parse_s3_url(const std::string& url, std::string* bucket, std::string* prefix) {
  if (url.rfind("s3://", 0) != 0) return invalid_argument("storage: '", url, "' is not an s3:// URL");
  std::string rest = url.substr(5);
  size_t slash = rest.find('/');
  *bucket = rest.substr(0, slash);
  *prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!prefix->empty() && prefix->back() == '/') prefix->pop_back();
  if (bucket->empty()) return invalid_argument("storage: '", url, "' names no bucket (s3://bucket/prefix)");
  if (!prefix->empty() && (prefix->front() == '/' || prefix->find("//") != std::string::npos))
    return invalid_argument("storage: '", url, "' has an empty path segment");
  return Status::ok();
}

Result<std::unique_ptr<Storage>> open_s3_storage(const std::string& url, S3Options options) {
  std::string bucket, prefix;
  LATHE_TRY(parse_s3_url(url, &bucket, &prefix));
  Result<std::unique_ptr<S3Client>> created = S3Client::create(std::move(options));
  if (!created.is_ok()) return created.status().with_context("storage: opening " + url);
  std::unique_ptr<S3Client> client = std::move(created).value();
  Result<S3ListPage> probe = client->list_objects(bucket, prefix.empty() ? "" : prefix + "/", "/", "");
  if (!probe.is_ok()) return probe.status().with_context("storage: opening " + url);
  return std::unique_ptr<Storage>(new S3Storage(std::move(client), bucket, prefix));
}

Result<std::unique_ptr<Storage>> open_s3_storage(const std::string& url) {
  LATHE_ASSIGN_OR_RETURN(S3Options options, s3_options_from_env());
  return open_s3_storage(url, std::move(options));
}

}  // namespace lathe
