// One S3 request and its reply, as the transport (s3_client.cpp) and the
// operations (s3_ops.cpp) share them. Internal to io/.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/s3_client.h"

namespace lathe {

struct S3Client::Request {
  std::string method{};  // GET, PUT, POST, HEAD, DELETE
  std::string bucket{};
  std::string key{};     // "" for bucket-level requests
  SigV4Pairs query{};    // decoded
  SigV4Pairs headers{};  // extra headers, sent and signed (range, content-md5)
  std::span<const uint8_t> body{};  // borrowed for the call
  int64_t expected_size = 0;      // reserve for the reply body when known
  int64_t timeout_ms = 0;         // no-progress timeout; 0: the client's
  bool error_in_ok_body = false;  // CompleteMultipartUpload may answer 200 with an <Error>

  std::string url() const;  // "s3://bucket/key", for messages
};

struct S3Client::Response {
  long status = 0;
  std::vector<uint8_t> body;
  SigV4Pairs headers;  // lowercase names
  int curl_code = 0;   // non-zero: the transfer itself failed
  std::string curl_error;
  int attempts = 0;

  std::string header(std::string_view name) const;
  std::string error_code() const;  // S3's <Code>, "" when none
  std::string describe() const;    // "HTTP 503 SlowDown: Please reduce your request rate."
  std::string_view text() const { return {reinterpret_cast<const char*>(body.data()), body.size()}; }
};

// The Status for a failed request: kNotFound for 404, kIoError otherwise,
// naming the method, the s3 URL, the HTTP status and S3's code and message.
Status s3_error(const S3Client::Request& req, const S3Client::Response& resp);

}  // namespace lathe
