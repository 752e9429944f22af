// SigV4 signing: canonical request -> string to sign -> HMAC chain. OpenSSL
// supplies the digests; everything else is string assembly kept here, so the
// rules (what gets encoded, what gets sorted, what gets trimmed) live in one
// place.
#include "io/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>

#include "core/check.h"

namespace lathe {

namespace {

std::string digest(const EVP_MD* md, const void* data, size_t n) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  LATHE_CHECK(EVP_Digest(data, n, out, &len, md, nullptr) == 1, "EVP_Digest failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Header values are trimmed and inner runs of spaces collapse to one.
std::string canonical_header_value(std::string_view v) {
  std::string out;
  bool in_space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      in_space = !out.empty();
      continue;
    }
    if (in_space) out += ' ';
    in_space = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string hex_lower(std::string_view raw) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string sha256_hex(std::span<const uint8_t> bytes) {
  return hex_lower(digest(EVP_sha256(), bytes.data(), bytes.size()));
}

std::string sha256_hex(std::string_view text) { return hex_lower(digest(EVP_sha256(), text.data(), text.size())); }

std::string hmac_sha256(std::string_view key, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  LATHE_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                   reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len) != nullptr,
              "HMAC failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string md5_base64(std::string_view bytes) {
  std::string raw = digest(EVP_md5(), bytes.data(), bytes.size());
  unsigned char out[64];
  int n = EVP_EncodeBlock(out, reinterpret_cast<const unsigned char*>(raw.data()), static_cast<int>(raw.size()));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string md5_hex(std::string_view bytes) { return hex_lower(digest(EVP_md5(), bytes.data(), bytes.size())); }

std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool unreserved = std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string canonical_query_string(const SigV4Pairs& query) {
  SigV4Pairs enc;
  enc.reserve(query.size());
  for (const auto& [k, v] : query) enc.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [k, v] : enc) {
    if (!out.empty()) out += '&';
    out += k + "=" + v;
  }
  return out;
}

std::string amz_date(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

SigV4Signature sigv4_sign(const SigV4Request& request, const SigV4Credentials& credentials,
                          const SigV4Scope& scope) {
  // Headers: lowercase names, sorted; repeated names join their values with ','.
  SigV4Pairs headers;
  for (const auto& [k, v] : request.headers) headers.emplace_back(lower(k), canonical_header_value(v));
  std::stable_sort(headers.begin(), headers.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string canonical_headers, signed_headers;
  for (size_t i = 0; i < headers.size(); ++i) {
    if (i > 0 && headers[i].first == headers[i - 1].first) {
      canonical_headers.back() = ',';
      canonical_headers += headers[i].second + "\n";
      continue;
    }
    canonical_headers += headers[i].first + ":" + headers[i].second + "\n";
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += headers[i].first;
  }

  SigV4Signature sig;
  sig.signed_headers = signed_headers;
  sig.canonical_request = request.method + "\n" + uri_encode(request.path, true) + "\n" +
                          canonical_query_string(request.query) + "\n" + canonical_headers + "\n" +
                          signed_headers + "\n" + request.payload_sha256_hex;

  const std::string date = scope.amz_date.substr(0, 8);
  const std::string credential_scope = date + "/" + scope.region + "/" + scope.service + "/aws4_request";
  sig.string_to_sign =
      "AWS4-HMAC-SHA256\n" + scope.amz_date + "\n" + credential_scope + "\n" + sha256_hex(sig.canonical_request);

  std::string key = hmac_sha256("AWS4" + credentials.secret_access_key, date);
  key = hmac_sha256(key, scope.region);
  key = hmac_sha256(key, scope.service);
  key = hmac_sha256(key, "aws4_request");
  sig.signature = hex_lower(hmac_sha256(key, sig.string_to_sign));
  sig.authorization = "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + "/" + credential_scope +
                      ", SignedHeaders=" + signed_headers + ", Signature=" + sig.signature;
  return sig;
}

}  // namespace lathe
