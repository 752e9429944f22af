// A small S3 client: the object operations lathe's storage needs, over
// libcurl, signed with SigV4 (io/sigv4.h).
//
// Every request is retried with exponential backoff and full jitter when the
// failure is one a later try can cure: connection errors, a request that
// moves no byte for timeout_ms, HTTP 5xx, 429 and S3's SlowDown /
// RequestTimeout codes. Anything else (403, 404, a bad request) returns at
// once. Errors read "s3: PUT s3://bucket/key: HTTP 503 SlowDown: <message>
// (8 attempts)", so a log line says where, what and how hard lathe tried.
//
// Addressing: with an endpoint URL (S3-compatible stores, tests) requests go
// path-style to <endpoint>/<bucket>/<key>; without one to AWS itself,
// virtual-hosted, https://<bucket>.s3.<region>.amazonaws.com/<key> (path-style
// for bucket names with dots, which TLS wildcards do not cover).
//
// Threads: one S3Client may be used from any number of threads at once; it
// keeps a pool of curl handles so connections are reused.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "io/sigv4.h"

namespace lathe {

struct S3Options {
  std::string endpoint_url;  // "http://127.0.0.1:9000"; empty = AWS, virtual-hosted
  std::string region = "us-east-1";
  SigV4Credentials credentials;
  int64_t part_size_bytes = int64_t{64} << 20;  // multipart part size, >= 5 MiB
  int upload_concurrency = 4;                   // parts of one object in flight at once
  int max_attempts = 8;                         // tries per request, the first included
  int64_t timeout_ms = 30000;                   // a request with no byte moving this long fails
  int64_t backoff_ms = 200;                     // first retry delay (doubles, full jitter)
  int64_t max_backoff_ms = 20000;
  int list_max_keys = 1000;  // keys per ListObjectsV2 page (S3 caps it at 1000)

  Status validate() const;
};

// Options from the environment (core/env.h lists the variables).
Result<S3Options> s3_options_from_env();

struct S3Object {
  std::string key{};
  int64_t size = 0;
  std::string etag{};  // as S3 sends it, quotes included (head_object_info only)
};

struct S3ListPage {
  std::vector<S3Object> objects;
  std::vector<std::string> common_prefixes;  // with a delimiter: "run/step=10/"
  std::string next_token;                    // continuation token when truncated
  bool truncated = false;
};

struct S3Upload {
  std::string key;
  std::string upload_id;
};

class S3Client {
 public:
  static Result<std::unique_ptr<S3Client>> create(S3Options options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Options& options() const { return options_; }

  // Borrows body for the duration of the call.
  Status put_object(const std::string& bucket, const std::string& key, std::span<const uint8_t> body);
  // The whole object (n < 0) or bytes [offset, offset + n). kNotFound when absent.
  Result<std::vector<uint8_t>> get_object(const std::string& bucket, const std::string& key, int64_t offset = 0,
                                          int64_t n = -1);
  // The object's size; kNotFound when absent.
  Result<int64_t> head_object(const std::string& bucket, const std::string& key);
  Result<S3Object> head_object_info(const std::string& bucket, const std::string& key);
  // One ListObjectsV2 page; token "" starts at the beginning.
  Result<S3ListPage> list_objects(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                                  const std::string& token);
  // Absent objects are not an error.
  Status delete_object(const std::string& bucket, const std::string& key);
  // Up to 1000 keys in one DeleteObjects request.
  Status delete_objects(const std::string& bucket, const std::vector<std::string>& keys);

  // Multipart upload: create -> upload_part (numbers from 1) -> complete, or abort.
  Result<std::string> create_multipart_upload(const std::string& bucket, const std::string& key);
  // Returns the part's ETag.
  Result<std::string> upload_part(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                  int part_number, std::span<const uint8_t> body);
  // etags[i] is part i + 1's. A retried completion that finds the upload
  // gone (an earlier try, whose reply was lost, succeeded) checks the
  // object's size and multipart ETag instead.
  Status complete_multipart_upload(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                   const std::vector<std::string>& etags, int64_t total_size);
  Status abort_multipart_upload(const std::string& bucket, const std::string& key, const std::string& upload_id);
  // Uploads begun and neither completed nor aborted, under prefix (first 1000).
  Result<std::vector<S3Upload>> list_multipart_uploads(const std::string& bucket, const std::string& prefix);

  struct Request;
  struct Response;

 private:
  explicit S3Client(S3Options options);
  Result<Response> execute(const Request& request);
  Result<Response> perform(const Request& request, void* curl, const std::string& payload_hash);
  void* acquire_handle();
  void release_handle(void* curl);

  S3Options options_;
  std::string scheme_;       // "http" / "https"
  std::string host_;         // endpoint host[:port], or "" for AWS
  std::string base_path_;    // endpoint path prefix ("" usually)
  std::mutex pool_mu_;
  std::vector<void*> pool_;  // idle CURL* handles
};

}  // namespace lathe
