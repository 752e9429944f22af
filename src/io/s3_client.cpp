// S3Client transport: building, signing and sending one request through a
// pooled curl handle, and the retry loop around it. The object operations
// that use it live in s3_ops.cpp.
#include "io/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "core/env.h"
#include "core/log.h"
#include "io/s3_request.h"
#include "io/s3_xml.h"

namespace lathe {

namespace {

using Clock = std::chrono::steady_clock;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Upload {
  std::span<const uint8_t> body;
  size_t offset = 0;
};

size_t read_body(char* dst, size_t size, size_t n, void* user) {
  auto* up = static_cast<Upload*>(user);
  size_t want = std::min(size * n, up->body.size() - up->offset);
  std::memcpy(dst, up->body.data() + up->offset, want);
  up->offset += want;
  return want;
}

int seek_body(void* user, curl_off_t offset, int origin) {
  auto* up = static_cast<Upload*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > up->body.size()) return CURL_SEEKFUNC_FAIL;
  up->offset = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t write_body(char* src, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::vector<uint8_t>*>(user);
  out->insert(out->end(), reinterpret_cast<uint8_t*>(src), reinterpret_cast<uint8_t*>(src) + size * n);
  return size * n;
}

size_t write_header(char* src, size_t size, size_t n, void* user) {
  auto* resp = static_cast<S3Client::Response*>(user);
  std::string_view line(src, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after 100 Continue): start over
    resp->headers.clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.remove_suffix(1);
  resp->headers.emplace_back(std::move(name), std::string(value));
  return size * n;
}

// Fails a transfer in which no byte has moved for timeout_ms (libcurl calls
// this at least about once a second, and on every chunk).
struct Progress {
  int64_t timeout_ms = 0;
  curl_off_t last_bytes = -1;
  Clock::time_point last_change = Clock::now();
  bool stalled = false;
};

int on_progress(void* user, curl_off_t, curl_off_t dlnow, curl_off_t, curl_off_t ulnow) {
  auto* p = static_cast<Progress*>(user);
  auto now = Clock::now();
  if (dlnow + ulnow != p->last_bytes) {
    p->last_bytes = dlnow + ulnow;
    p->last_change = now;
    return 0;
  }
  auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(now - p->last_change).count();
  if (idle > p->timeout_ms) {
    p->stalled = true;
    return 1;
  }
  return 0;
}

bool retryable_curl(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
      return true;
    default:
      return false;
  }
}

bool retryable_http(const S3Client::Response& r) {
  if (r.status >= 500 || r.status == 429) return true;
  const std::string code = r.error_code();
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" || code == "ServiceUnavailable";
}

// Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))].
int64_t backoff_delay_ms(const S3Options& o, int attempt) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  double ceiling = static_cast<double>(o.backoff_ms) * static_cast<double>(int64_t{1} << std::min(attempt - 1, 30));
  ceiling = std::min(ceiling, static_cast<double>(o.max_backoff_ms));
  std::uniform_real_distribution<double> dist(0.0, ceiling);
  return static_cast<int64_t>(dist(rng));
}

struct CurlHeaders {
  curl_slist* list = nullptr;
  ~CurlHeaders() { curl_slist_free_all(list); }
  void add(const std::string& line) { list = curl_slist_append(list, line.c_str()); }
};

}  // namespace

std::string S3Client::Response::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return "";
}

std::string S3Client::Response::error_code() const {
  std::string_view text(reinterpret_cast<const char*>(body.data()), body.size());
  if (text.find("<Error>") == std::string_view::npos) return "";
  return xml_text(text, "Code");
}

Status S3Options::validate() const {
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty())
    return invalid_argument("s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
  if (part_size_bytes < (int64_t{5} << 20))
    return invalid_argument("s3: part size ", part_size_bytes, " bytes is below S3's minimum of 5 MiB");
  if (upload_concurrency < 1) return invalid_argument("s3: upload_concurrency must be >= 1");
  if (max_attempts < 1) return invalid_argument("s3: max_attempts must be >= 1");
  if (timeout_ms < 1) return invalid_argument("s3: timeout_ms must be >= 1");
  if (list_max_keys < 1 || list_max_keys > 1000) return invalid_argument("s3: list_max_keys must be in [1, 1000]");
  if (!endpoint_url.empty() && endpoint_url.rfind("http://", 0) != 0 && endpoint_url.rfind("https://", 0) != 0)
    return invalid_argument("s3: AWS_ENDPOINT_URL '", endpoint_url, "' must start with http:// or https://");
  return Status::ok();
}

Result<S3Options> s3_options_from_env() {
  S3Options o;
  o.endpoint_url = env::aws_endpoint_url();
  o.region = env::aws_region();
  o.credentials.access_key_id = env::get("AWS_ACCESS_KEY_ID");
  o.credentials.secret_access_key = env::get("AWS_SECRET_ACCESS_KEY");
  o.credentials.session_token = env::get("AWS_SESSION_TOKEN");
  LATHE_ASSIGN_OR_RETURN(o.part_size_bytes, env::s3_part_size_bytes());
  LATHE_ASSIGN_OR_RETURN(int64_t concurrency, env::s3_upload_concurrency());
  o.upload_concurrency = static_cast<int>(concurrency);
  LATHE_ASSIGN_OR_RETURN(int64_t attempts, env::s3_max_attempts());
  o.max_attempts = static_cast<int>(attempts);
  LATHE_ASSIGN_OR_RETURN(o.timeout_ms, env::s3_timeout_ms());
  LATHE_ASSIGN_OR_RETURN(o.backoff_ms, env::s3_backoff_ms());
  return o;
}

S3Client::S3Client(S3Options options) : options_(std::move(options)) {}

Result<std::unique_ptr<S3Client>> S3Client::create(S3Options options) {
  LATHE_TRY(options.validate());
  global_init();
  std::unique_ptr<S3Client> c(new S3Client(std::move(options)));
  const std::string& ep = c->options_.endpoint_url;
  if (ep.empty()) {
    c->scheme_ = "https";
  } else {
    size_t sep = ep.find("://");
    c->scheme_ = ep.substr(0, sep);
    std::string rest = ep.substr(sep + 3);
    size_t slash = rest.find('/');
    c->host_ = rest.substr(0, slash);
    if (slash != std::string::npos) c->base_path_ = rest.substr(slash);
    while (!c->base_path_.empty() && c->base_path_.back() == '/') c->base_path_.pop_back();
    if (c->host_.empty()) return invalid_argument("s3: AWS_ENDPOINT_URL '", ep, "' names no host");
  }
  return c;
}

S3Client::~S3Client() {
  for (void* h : pool_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* S3Client::acquire_handle() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_.empty()) {
      void* h = pool_.back();
      pool_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void S3Client::release_handle(void* curl) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_.push_back(curl);
}

std::string S3Client::Request::url() const {
  return "s3://" + bucket + (key.empty() ? "" : "/" + key);
}

Result<S3Client::Response> S3Client::perform(const Request& req, void* handle, const std::string& payload_hash) {
  CURL* curl = static_cast<CURL*>(handle);
  curl_easy_reset(curl);

  // Where the request goes: path-style to the endpoint, or AWS virtual-hosted.
  std::string host = host_, path;
  if (host_.empty() && req.bucket.find('.') == std::string::npos) {
    host = req.bucket + ".s3." + options_.region + ".amazonaws.com";
    path = "/" + req.key;
  } else if (host_.empty()) {  // a dotted bucket breaks the TLS wildcard: path-style
    host = "s3." + options_.region + ".amazonaws.com";
    path = "/" + req.bucket + (req.key.empty() ? "" : "/" + req.key);
  } else {
    path = base_path_ + "/" + req.bucket + (req.key.empty() ? "" : "/" + req.key);
  }
  SigV4Request sreq{.method = req.method, .path = path, .query = req.query, .headers = req.headers,
                    .payload_sha256_hex = payload_hash};
  const std::string date = amz_date(std::time(nullptr));
  sreq.headers.emplace_back("host", host);
  sreq.headers.emplace_back("x-amz-date", date);
  sreq.headers.emplace_back("x-amz-content-sha256", payload_hash);
  if (!options_.credentials.session_token.empty())
    sreq.headers.emplace_back("x-amz-security-token", options_.credentials.session_token);
  SigV4Signature sig = sigv4_sign(sreq, options_.credentials, SigV4Scope{.region = options_.region, .amz_date = date});

  CurlHeaders headers;
  for (const auto& [k, v] : sreq.headers) headers.add(k + ": " + v);
  headers.add("Authorization: " + sig.authorization);
  headers.add("Expect:");  // no 100-continue round trip
  std::string query = canonical_query_string(req.query);
  std::string url = scheme_ + "://" + host + uri_encode(path, true) + (query.empty() ? "" : "?" + query);

  Response resp;
  Upload up{.body = req.body};
  Progress progress{.timeout_ms = req.timeout_ms > 0 ? req.timeout_ms : options_.timeout_ms};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.timeout_ms));
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &progress);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &resp.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, write_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &resp);
  if (req.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  if (req.method == "PUT" || req.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_body);
    curl_easy_setopt(curl, CURLOPT_READDATA, &up);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, seek_body);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &up);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  }
  if (req.expected_size > 0) resp.body.reserve(static_cast<size_t>(req.expected_size));

  CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK) {
    resp.curl_code = static_cast<int>(rc);
    resp.curl_error = progress.stalled ? "no byte moved for " + std::to_string(progress.timeout_ms) +
                                             " ms (LATHE_S3_TIMEOUT_MS)"
                                       : curl_easy_strerror(rc);
    return resp;
  }
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  resp.status = status;
  return resp;
}

Result<S3Client::Response> S3Client::execute(const Request& req) {
  const std::string payload_hash = sha256_hex(req.body);
  Response resp;
  for (int attempt = 1;; ++attempt) {
    void* curl = acquire_handle();
    if (!curl) return io_error("s3: ", req.method, " ", req.url(), ": cannot create a curl handle");
    LATHE_ASSIGN_OR_RETURN(resp, perform(req, curl, payload_hash));
    release_handle(curl);
    resp.attempts = attempt;
    bool transport_failed = resp.curl_code != 0;
    bool error_in_ok = req.error_in_ok_body && resp.status == 200 && !resp.error_code().empty();
    if (!transport_failed && !error_in_ok && resp.status < 300) return resp;
    bool retry = transport_failed ? retryable_curl(static_cast<CURLcode>(resp.curl_code))
                                  : (error_in_ok || retryable_http(resp));
    if (!retry || attempt >= options_.max_attempts) break;
    int64_t delay = backoff_delay_ms(options_, attempt);
    LATHE_LOG(kDebug, "s3: ", req.method, " ", req.url(), ": ", resp.describe(), "; retry ", attempt, " in ",
              delay, " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  if (resp.curl_code != 0 || resp.status < 300) return s3_error(req, resp);
  return resp;  // an HTTP error the caller turns into a Status (404 may be fine)
}

std::string S3Client::Response::describe() const {
  if (curl_code != 0) return "connection failed: " + curl_error;
  std::string_view text(reinterpret_cast<const char*>(body.data()), body.size());
  std::string code = error_code();
  std::string out = "HTTP " + std::to_string(status);
  if (code.empty() && status == 404) code = "NotFound";
  if (code.empty() && status == 403) code = "Forbidden";
  if (!code.empty()) out += " " + code;
  std::string message = xml_text(text, "Message");
  if (!message.empty()) out += ": " + message;
  return out;
}

Status s3_error(const S3Client::Request& req, const S3Client::Response& resp) {
  std::string msg = "s3: " + req.method + " " + req.url() + ": " + resp.describe();
  if (resp.attempts > 1) msg += " (" + std::to_string(resp.attempts) + " attempts)";
  if (resp.status == 403)
    msg += "; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN and the bucket's policy";
  const std::string region = resp.header("x-amz-bucket-region");
  if (!region.empty() && (resp.status == 301 || resp.status == 400))
    msg += "; the bucket is in " + region + ": set AWS_REGION=" + region;
  if (resp.status == 404) return not_found(msg);
  return io_error(msg);
}

}  // namespace lathe
