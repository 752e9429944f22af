// The S3 object operations on top of S3Client::execute (s3_client.cpp): each
// builds one request, and turns the reply into a value or a Status that names
// the object.
#include <cstdlib>

#include "io/s3_client.h"
#include "io/s3_request.h"
#include "io/s3_xml.h"

namespace lathe {

namespace {

bool ok(const S3Client::Response& r) { return r.status >= 200 && r.status < 300; }

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Result<int64_t> parse_size(const std::string& text, const S3Client::Request& req, const char* what) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0)
    return io_error("s3: ", req.method, " ", req.url(), ": bad ", what, " '", text, "' in the reply");
  return static_cast<int64_t>(v);
}

// S3's ETag of a completed multipart upload (unencrypted or SSE-S3): the MD5
// of the parts' binary MD5s, "-", the part count. "" when a part's ETag is
// not a plain MD5.
std::string multipart_etag(const std::vector<std::string>& etags) {
  std::string raw;
  for (const std::string& e : etags) {
    std::string hex = e.size() == 34 && e.front() == '"' && e.back() == '"' ? e.substr(1, 32) : e;
    if (hex.size() != 32) return "";
    for (size_t i = 0; i < 32; i += 2) raw += static_cast<char>(std::strtol(hex.substr(i, 2).c_str(), nullptr, 16));
  }
  std::string out(1, '"');
  out += md5_hex(raw);
  out += '-';
  out += std::to_string(etags.size());
  out += '"';
  return out;
}

}  // namespace

Status S3Client::put_object(const std::string& bucket, const std::string& key, std::span<const uint8_t> body) {
  Request req{.method = "PUT", .bucket = bucket, .key = key, .body = body};
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  return ok(resp) ? Status::ok() : s3_error(req, resp);
}

Result<std::vector<uint8_t>> S3Client::get_object(const std::string& bucket, const std::string& key, int64_t offset,
                                                  int64_t n) {
  Request req{.method = "GET", .bucket = bucket, .key = key};
  if (n == 0) return std::vector<uint8_t>{};
  if (n > 0 || offset > 0) {
    std::string range = "bytes=" + std::to_string(offset) + "-" + (n > 0 ? std::to_string(offset + n - 1) : "");
    req.headers.emplace_back("range", range);
    req.expected_size = n;
  }
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (!ok(resp)) return s3_error(req, resp).with_context(n > 0 ? "bytes [" + std::to_string(offset) + ", " +
                                                                      std::to_string(offset + n) + ")"
                                                                : "whole object");
  if (n > 0 && static_cast<int64_t>(resp.body.size()) != n)
    return io_error("s3: GET ", req.url(), ": asked for bytes [", offset, ", ", offset + n, ") and got ",
                    resp.body.size(), " bytes (the object is shorter)");
  return std::move(resp.body);
}

Result<int64_t> S3Client::head_object(const std::string& bucket, const std::string& key) {
  LATHE_ASSIGN_OR_RETURN(S3Object info, head_object_info(bucket, key));
  return info.size;
}

Result<S3Object> S3Client::head_object_info(const std::string& bucket, const std::string& key) {
  Request req{.method = "HEAD", .bucket = bucket, .key = key};
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (!ok(resp)) return s3_error(req, resp);
  S3Object info{.key = key, .etag = resp.header("etag")};
  LATHE_ASSIGN_OR_RETURN(info.size, parse_size(resp.header("content-length"), req, "Content-Length"));
  return info;
}

Result<S3ListPage> S3Client::list_objects(const std::string& bucket, const std::string& prefix,
                                          const std::string& delimiter, const std::string& token) {
  Request req{.method = "GET", .bucket = bucket};
  req.query.emplace_back("list-type", "2");
  req.query.emplace_back("max-keys", std::to_string(options_.list_max_keys));
  if (!prefix.empty()) req.query.emplace_back("prefix", prefix);
  if (!delimiter.empty()) req.query.emplace_back("delimiter", delimiter);
  if (!token.empty()) req.query.emplace_back("continuation-token", token);
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (!ok(resp)) return s3_error(req, resp).with_context("listing prefix '" + prefix + "'");

  S3ListPage page;
  std::string_view doc = resp.text();
  for (std::string_view item : xml_elements(doc, "Contents")) {
    S3Object obj{.key = xml_text(item, "Key")};
    LATHE_ASSIGN_OR_RETURN(obj.size, parse_size(xml_text(item, "Size"), req, "Size"));
    page.objects.push_back(std::move(obj));
  }
  for (std::string_view item : xml_elements(doc, "CommonPrefixes")) page.common_prefixes.push_back(xml_text(item, "Prefix"));
  page.truncated = xml_text(doc, "IsTruncated") == "true";
  page.next_token = xml_text(doc, "NextContinuationToken");
  if (page.truncated && page.next_token.empty())
    return io_error("s3: GET ", req.url(), ": a truncated listing without NextContinuationToken");
  return page;
}

Status S3Client::delete_object(const std::string& bucket, const std::string& key) {
  Request req{.method = "DELETE", .bucket = bucket, .key = key};
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (ok(resp) || resp.status == 404) return Status::ok();
  return s3_error(req, resp);
}

Status S3Client::delete_objects(const std::string& bucket, const std::vector<std::string>& keys) {
  if (keys.empty()) return Status::ok();
  if (keys.size() > 1000) return invalid_argument("s3: DeleteObjects takes at most 1000 keys, got ", keys.size());
  std::string xml = "<Delete><Quiet>true</Quiet>";
  for (const std::string& k : keys) xml += "<Object><Key>" + xml_escape(k) + "</Key></Object>";
  xml += "</Delete>";
  Request req{.method = "POST", .bucket = bucket, .body = bytes_of(xml)};
  req.query.emplace_back("delete", "");
  req.headers.emplace_back("content-md5", md5_base64(xml));
  req.headers.emplace_back("content-type", "application/xml");
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (!ok(resp)) return s3_error(req, resp);
  std::vector<std::string_view> errors = xml_elements(resp.text(), "Error");
  if (!errors.empty())
    return io_error("s3: DeleteObjects s3://", bucket, "/", xml_text(errors[0], "Key"), ": ",
                    xml_text(errors[0], "Code"), ": ", xml_text(errors[0], "Message"), " (", errors.size(),
                    " of ", keys.size(), " keys failed)");
  return Status::ok();
}

Result<std::string> S3Client::create_multipart_upload(const std::string& bucket, const std::string& key) {
  Request req{.method = "POST", .bucket = bucket, .key = key};
  req.query.emplace_back("uploads", "");
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (!ok(resp)) return s3_error(req, resp).with_context("starting a multipart upload");
  std::string id = xml_text(resp.text(), "UploadId");
  if (id.empty()) return io_error("s3: POST ", req.url(), "?uploads: the reply holds no UploadId");
  return id;
}

Result<std::string> S3Client::upload_part(const std::string& bucket, const std::string& key,
                                          const std::string& upload_id, int part_number,
                                          std::span<const uint8_t> body) {
  Request req{.method = "PUT", .bucket = bucket, .key = key, .body = body};
  req.query.emplace_back("partNumber", std::to_string(part_number));
  req.query.emplace_back("uploadId", upload_id);
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (!ok(resp)) return s3_error(req, resp).with_context("part " + std::to_string(part_number));
  std::string etag = resp.header("etag");
  if (etag.empty()) return io_error("s3: PUT ", req.url(), ": part ", part_number, ": the reply holds no ETag");
  return etag;
}

Status S3Client::complete_multipart_upload(const std::string& bucket, const std::string& key,
                                           const std::string& upload_id, const std::vector<std::string>& etags,
                                           int64_t total_size) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i)
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + xml_escape(etags[i]) +
           "</ETag></Part>";
  xml += "</CompleteMultipartUpload>";
  // The server assembles the object before it answers, with no byte on the
  // wire meanwhile: allow it ten times the usual silence.
  Request req{.method = "POST", .bucket = bucket, .key = key, .body = bytes_of(xml),
              .timeout_ms = options_.timeout_ms * 10, .error_in_ok_body = true};
  req.query.emplace_back("uploadId", upload_id);
  req.headers.emplace_back("content-type", "application/xml");
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (ok(resp)) return Status::ok();
  // A retry after a lost reply finds the upload gone: the object tells.
  if (resp.attempts > 1) {
    Result<S3Object> info = head_object_info(bucket, key);
    if (info.is_ok() && info->size == total_size && info->etag == multipart_etag(etags)) return Status::ok();
  }
  return s3_error(req, resp).with_context("completing a multipart upload of " + std::to_string(etags.size()) +
                                          " parts");
}

Status S3Client::abort_multipart_upload(const std::string& bucket, const std::string& key,
                                        const std::string& upload_id) {
  Request req{.method = "DELETE", .bucket = bucket, .key = key};
  req.query.emplace_back("uploadId", upload_id);
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (ok(resp) || resp.status == 404) return Status::ok();
  return s3_error(req, resp).with_context("aborting a multipart upload");
}

Result<std::vector<S3Upload>> S3Client::list_multipart_uploads(const std::string& bucket,
                                                               const std::string& prefix) {
  Request req{.method = "GET", .bucket = bucket};
  req.query.emplace_back("uploads", "");
  if (!prefix.empty()) req.query.emplace_back("prefix", prefix);
  LATHE_ASSIGN_OR_RETURN(Response resp, execute(req));
  if (!ok(resp)) return s3_error(req, resp).with_context("listing multipart uploads");
  std::vector<S3Upload> out;
  for (std::string_view item : xml_elements(resp.text(), "Upload"))
    out.push_back({.key = xml_text(item, "Key"), .upload_id = xml_text(item, "UploadId")});
  return out;
}

}  // namespace lathe
