// AWS Signature Version 4 for requests signed in the Authorization header,
// and the hashing it rests on (SHA-256, HMAC-SHA-256, MD5, from OpenSSL).
//
// Signing is a pure function of the request, the credentials, the scope and
// the time, so it is checked against the published AWS examples with fixed
// dates. The S3 client signs exactly the headers it sends and encodes paths
// and query strings the same way for the URL and for the canonical request,
// which is what keeps them from drifting apart.
#pragma once

#include <cstdint>
#include <ctime>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lathe {

struct SigV4Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
};

using SigV4Pairs = std::vector<std::pair<std::string, std::string>>;

struct SigV4Request {
  std::string method;    // "GET", "PUT", ...
  std::string path;      // decoded, starting with '/': "/bucket/step=10/a.bin"
  SigV4Pairs query;      // decoded names and values, any order
  SigV4Pairs headers;    // every header to sign; must hold host and x-amz-date
  std::string payload_sha256_hex;  // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
};

struct SigV4Scope {
  std::string region = "us-east-1";
  std::string service = "s3";
  std::string amz_date;  // "20130524T000000Z"; its first 8 characters are the date
};

struct SigV4Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;  // "host;x-amz-content-sha256;x-amz-date"
  std::string signature;       // lowercase hex
  std::string authorization;   // the Authorization header's value
};

SigV4Signature sigv4_sign(const SigV4Request& request, const SigV4Credentials& credentials,
                          const SigV4Scope& scope);

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters
// (A-Z a-z 0-9 - . _ ~) stay, every other byte becomes %XX (uppercase hex);
// '/' stays when keep_slash (paths) and is encoded otherwise (query parts).
std::string uri_encode(std::string_view s, bool keep_slash);
// "a=1&b=2": pairs encoded and sorted by name, then value.
std::string canonical_query_string(const SigV4Pairs& query);

// "20130524T000000Z" for a UTC time.
std::string amz_date(std::time_t t);

std::string sha256_hex(std::span<const uint8_t> bytes);
std::string sha256_hex(std::string_view text);
// HMAC-SHA-256 of message under key, raw 32 bytes.
std::string hmac_sha256(std::string_view key, std::string_view message);
// Base64 of the raw MD5 digest (the Content-MD5 header), and its hex.
std::string md5_base64(std::string_view bytes);
std::string md5_hex(std::string_view bytes);
std::string hex_lower(std::string_view raw);

}  // namespace lathe
