// SigV4 against the published AWS examples: the signature-v4 test suite
// (get-vanilla, get-vanilla-query-order-key-case, post-vanilla, get-utf8; key
// AKIDEXAMPLE, 2015-08-30T12:36:00Z, service "service") and the S3 examples
// of the S3 API reference (GET with Range, PUT with extra headers, a valueless
// subresource, a listing; key AKIAIOSFODNN7EXAMPLE, 2013-05-24). Plus the XML
// scanner the S3 client reads replies with.
#include <gtest/gtest.h>

#include "io/s3_xml.h"
#include "io/sigv4.h"

namespace lathe {
namespace {

const char* kEmptySha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

SigV4Signature suite_sign(const std::string& method, const std::string& path, SigV4Pairs query = {}) {
  SigV4Request req{.method = method, .path = path, .query = std::move(query),
                   .headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}},
                   .payload_sha256_hex = kEmptySha};
  SigV4Credentials creds{.access_key_id = "AKIDEXAMPLE",
                         .secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"};
  return sigv4_sign(req, creds, SigV4Scope{.region = "us-east-1", .service = "service", .amz_date = "20150830T123600Z"});
}

SigV4Signature s3_sign(const std::string& method, const std::string& path, SigV4Pairs query, SigV4Pairs extra,
                       const std::string& payload_sha) {
  SigV4Pairs headers = {{"host", "examplebucket.s3.amazonaws.com"},
                        {"x-amz-date", "20130524T000000Z"},
                        {"x-amz-content-sha256", payload_sha}};
  headers.insert(headers.end(), extra.begin(), extra.end());
  SigV4Request req{.method = method, .path = path, .query = std::move(query), .headers = std::move(headers),
                   .payload_sha256_hex = payload_sha};
  SigV4Credentials creds{.access_key_id = "AKIAIOSFODNN7EXAMPLE",
                         .secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"};
  return sigv4_sign(req, creds, SigV4Scope{.region = "us-east-1", .service = "s3", .amz_date = "20130524T000000Z"});
}

TEST(SigV4, TestSuiteGetVanilla) {
  SigV4Signature s = suite_sign("GET", "/");
  EXPECT_EQ(s.canonical_request,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
                std::string(kEmptySha));
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, "
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

TEST(SigV4, TestSuiteQueryOrderPostAndUtf8) {
  EXPECT_EQ(suite_sign("GET", "/", {{"Param2", "value2"}, {"Param1", "value1"}}).signature,
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
  EXPECT_EQ(suite_sign("POST", "/").signature, "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
  EXPECT_EQ(suite_sign("GET", "/\xE1\x88\xB4").signature,
            "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85");
}

TEST(SigV4, S3GetObjectWithRange) {
  SigV4Signature s = s3_sign("GET", "/test.txt", {}, {{"Range", "bytes=0-9"}}, kEmptySha);
  EXPECT_EQ(s.canonical_request,
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n" +
                std::string(kEmptySha));
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(s.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4, S3PutObjectEncodesTheKey) {
  const std::string body_sha = sha256_hex(std::string_view("Welcome to Amazon S3."));
  EXPECT_EQ(body_sha, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SigV4Signature s = s3_sign("PUT", "/test$file.text", {},
                             {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
                             body_sha);
  EXPECT_EQ(s.signed_headers, "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class");
  EXPECT_NE(s.canonical_request.find("\n/test%24file.text\n"), std::string::npos);
  EXPECT_EQ(s.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4, S3SubresourceAndListing) {
  EXPECT_EQ(s3_sign("GET", "/", {{"lifecycle", ""}}, {}, kEmptySha).signature,
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  EXPECT_EQ(s3_sign("GET", "/", {{"prefix", "J"}, {"max-keys", "2"}}, {}, kEmptySha).signature,
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4, SignatureDependsOnEveryInput) {
  const std::string base = s3_sign("GET", "/a", {}, {}, kEmptySha).signature;
  EXPECT_NE(s3_sign("GET", "/b", {}, {}, kEmptySha).signature, base);
  EXPECT_NE(s3_sign("DELETE", "/a", {}, {}, kEmptySha).signature, base);
  EXPECT_NE(s3_sign("GET", "/a", {{"x", "1"}}, {}, kEmptySha).signature, base);
  EXPECT_NE(s3_sign("GET", "/a", {}, {{"range", "bytes=0-1"}}, kEmptySha).signature, base);
}

TEST(SigV4, UriEncodingAndHeaderValues) {
  EXPECT_EQ(uri_encode("step=000010/a b+c~d", true), "step%3D000010/a%20b%2Bc~d");
  EXPECT_EQ(uri_encode("a/b", false), "a%2Fb");
  EXPECT_EQ(uri_encode("\xC3\xA9", true), "%C3%A9");
  EXPECT_EQ(canonical_query_string({{"b", "2"}, {"a", "x y"}, {"A", ""}}), "A=&a=x%20y&b=2");
  EXPECT_EQ(amz_date(1369353600), "20130524T000000Z");
  // Values are trimmed and inner runs of spaces collapse (the test suite's
  // get-header-value-trim case).
  SigV4Request req{.method = "GET", .path = "/", .headers = {{"host", "h"}, {"My-Header1", "  a   b  c "}},
                   .payload_sha256_hex = kEmptySha};
  SigV4Signature s = sigv4_sign(req, {.access_key_id = "k", .secret_access_key = "s"}, {.amz_date = "20200101T000000Z"});
  EXPECT_NE(s.canonical_request.find("\nmy-header1:a b c\n"), std::string::npos) << s.canonical_request;
}

TEST(SigV4, Md5Base64) {
  // RFC 1321's "abc" digest, base64 encoded.
  EXPECT_EQ(md5_base64("abc"), "kAFQmDzST7DWlj99KOF/cg==");
}

TEST(S3Xml, ElementsTextAndEntities) {
  const std::string doc =
      "<?xml version=\"1.0\"?><ListBucketResult><KeyCount>2</KeyCount><Contents><Key>a&amp;b</Key>"
      "<Size>3</Size></Contents><Contents><Key>c&#x3C;&#61;</Key><Size>4</Size></Contents>"
      "<CommonPrefixes><Prefix>run/</Prefix></CommonPrefixes><Marker/><IsTruncated>false</IsTruncated>"
      "</ListBucketResult>";
  std::vector<std::string_view> contents = xml_elements(doc, "Contents");
  ASSERT_EQ(contents.size(), 2u);
  EXPECT_EQ(xml_text(contents[0], "Key"), "a&b");
  EXPECT_EQ(xml_text(contents[1], "Key"), "c<=");
  EXPECT_EQ(xml_text(doc, "KeyCount"), "2");  // not confused with <Key>
  EXPECT_EQ(xml_elements(doc, "Marker").size(), 1u);
  EXPECT_EQ(xml_text(doc, "Missing"), "");
  EXPECT_EQ(xml_unescape(xml_escape("<a href=\"x\">'&'</a>")), "<a href=\"x\">'&'</a>");
  EXPECT_EQ(xml_text("<Error><Code>NoSuchKey</Code><Message>gone", "Message"), "");  // unterminated
}

}  // namespace
}  // namespace lathe
