// S3 storage against a real S3-compatible server: moto's, started by the
// test on 127.0.0.1 with signature checking on (so every request lathe signs
// is verified the way AWS verifies it), and a proxy in front of it that fails
// requests on command (HTTP 500/503/429, SlowDown, dropped connections,
// replies lost after the server acted, stalls past the timeout).
//
// moto missing is a loud skip here, and a failure when CI is set (CI
// installs it through scripts/setup.sh).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "io/s3_client.h"
#include "io/storage.h"
#include "io/storage_s3.h"
#include "io/s3_test_server.h"

namespace lathe {
namespace {

using testing::S3TestServer;

class S3StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    server_ = S3TestServer::instance(&error);
    ASSERT_TRUE(server_) << "the S3 test server did not start: " << error;
    if (!server_->skip_reason.empty()) {
      std::string msg = "\n*** S3 STORAGE TESTS NOT RUN: " + server_->skip_reason + " ***\n";
      if (std::getenv("CI")) FAIL() << msg << "CI must install moto[server] (scripts/setup.sh)";
      GTEST_SKIP() << msg;
    }
    ASSERT_EQ(server_->command("clear"), "ok");
    prefix_ = std::string("t/") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // Options for the server directly, or through the fault proxy; short
  // timeouts and backoff so that retries cost milliseconds.
  S3Options options(bool through_proxy = false) const {
    S3Options o;
    o.endpoint_url = through_proxy ? server_->proxy : server_->endpoint;
    o.credentials = {.access_key_id = server_->access_key, .secret_access_key = server_->secret_key};
    o.part_size_bytes = int64_t{5} << 20;
    o.max_attempts = 8;
    o.timeout_ms = 1000;
    o.backoff_ms = 10;
    o.max_backoff_ms = 100;
    return o;
  }

  std::string root() const { return "s3://" + server_->bucket + "/" + prefix_; }

  std::unique_ptr<Storage> open(const S3Options& o) {
    Result<std::unique_ptr<Storage>> s = open_s3_storage(root(), o);
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    return s.is_ok() ? std::move(s).value() : nullptr;
  }

  int proxy_count(const char* what) {
    nlohmann::json j = nlohmann::json::parse(server_->command("count"));
    return j.at(what).get<int>();
  }

  size_t pending_uploads() {
    auto client = S3Client::create(options());
    auto uploads = (*client)->list_multipart_uploads(server_->bucket, prefix_ + "/");
    EXPECT_TRUE(uploads.is_ok()) << uploads.status().message();
    return uploads.is_ok() ? uploads->size() : 0;
  }

  S3TestServer* server_ = nullptr;
  std::string prefix_;
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

// Writes data in uneven pieces, so buffering across part boundaries is exercised.
Status write_in_pieces(Storage& s, const std::string& path, const std::vector<uint8_t>& data) {
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<StorageWriter> w, s.open_writer(path));
  const size_t pieces[] = {1, (3u << 20) + 7, 6u << 20, 100, 5u << 20};
  size_t off = 0;
  for (int i = 0; off < data.size(); ++i) {
    size_t n = std::min(pieces[i % 5], data.size() - off);
    LATHE_TRY(w->write(std::span<const uint8_t>(data).subspan(off, n)));
    off += n;
  }
  return w->close();
}

TEST_F(S3StorageTest, SmallObjectsRoundTrip) {
  auto s = open(options());
  ASSERT_TRUE(s);
  EXPECT_EQ(s->url(), root());
  EXPECT_EQ(s->url_of("step=000010/metadata.json"), root() + "/step=000010/metadata.json");
  ASSERT_TRUE(s->write_text("step=000010/metadata.json", "{\"step\": 10}").is_ok());
  ASSERT_TRUE(s->write_text("odd name+&=%/ü.txt", "x").is_ok());
  ASSERT_TRUE(s->write_all("empty", {}).is_ok());
  EXPECT_EQ(*s->read_text("step=000010/metadata.json"), "{\"step\": 10}");
  EXPECT_EQ(*s->read_text("odd name+&=%/ü.txt"), "x");
  EXPECT_EQ(s->read("empty")->size(), 0u);
  EXPECT_EQ(*s->size("step=000010/metadata.json"), 12);
  EXPECT_TRUE(*s->exists("empty"));
  ASSERT_TRUE(s->write_text("step=000010/metadata.json", "v2").is_ok());  // overwrite
  EXPECT_EQ(*s->read_text("step=000010/metadata.json"), "v2");
  EXPECT_FALSE(s->open_writer("../escape").is_ok());
  EXPECT_FALSE(s->open_writer("/abs").is_ok());
}

TEST_F(S3StorageTest, LargeObjectGoesMultipartAndReadsBackInRanges) {
  auto s = open(options(/*through_proxy=*/true));
  ASSERT_TRUE(s);
  const std::vector<uint8_t> data = pattern((12u << 20) + 123, 1);  // 5 + 5 + 2 MiB parts
  int before = proxy_count("requests");
  ASSERT_TRUE(write_in_pieces(*s, "model-rank00000.safetensors", data).is_ok());
  EXPECT_EQ(proxy_count("requests") - before, 5) << "create + 3 parts + complete";
  EXPECT_EQ(*s->size("model-rank00000.safetensors"), static_cast<int64_t>(data.size()));
  Result<std::vector<uint8_t>> all = s->read("model-rank00000.safetensors");
  ASSERT_TRUE(all.is_ok()) << all.status().message();
  EXPECT_TRUE(*all == data);
  // Ranges: the start, across the first part boundary, the very end, empty.
  const int64_t boundary = int64_t{5} << 20;
  for (auto [off, n] : {std::pair<int64_t, int64_t>{0, 10}, {boundary - 3, 7},
                        {static_cast<int64_t>(data.size()) - 9, 9}, {100, 0}}) {
    Result<std::vector<uint8_t>> r = s->read_range("model-rank00000.safetensors", off, n);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_TRUE(std::equal(r->begin(), r->end(), data.begin() + off) && r->size() == static_cast<size_t>(n));
  }
  Result<std::vector<uint8_t>> past = s->read_range("model-rank00000.safetensors", data.size() - 5, 10);
  ASSERT_FALSE(past.is_ok());
  EXPECT_NE(past.status().message().find(root() + "/model-rank00000.safetensors"), std::string::npos)
      << past.status().message();
  EXPECT_EQ(pending_uploads(), 0u);
}

TEST_F(S3StorageTest, ListPaginatesAndListsDirs) {
  S3Options o = options();
  o.list_max_keys = 7;  // 23 objects: four pages
  auto s = open(o);
  ASSERT_TRUE(s);
  std::vector<std::string> want;
  for (int step : {5, 10, 15}) {
    for (int f = 0; f < 7; ++f) {
      char name[64];
      std::snprintf(name, sizeof(name), "step=%06d/shard-%d", step, f);
      want.push_back(name);
    }
  }
  want.push_back("last");
  want.push_back("nested/a/b");
  std::sort(want.begin(), want.end());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_TRUE(s->write_text(want[i], std::string(i, 'x')).is_ok());

  Result<std::vector<StorageEntry>> all = s->list("");
  ASSERT_TRUE(all.is_ok()) << all.status().message();
  ASSERT_EQ(all->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*all)[i].path, want[i]);
    EXPECT_EQ((*all)[i].size, static_cast<int64_t>(std::find(want.begin(), want.end(), want[i]) - want.begin()));
  }
  EXPECT_EQ(s->list("step=000010/")->size(), 7u);
  EXPECT_EQ(*s->list_dirs(""), (std::vector<std::string>{"nested", "step=000005", "step=000010", "step=000015"}));
  EXPECT_EQ(*s->list_dirs("nested"), std::vector<std::string>{"a"});
  EXPECT_TRUE(s->list_dirs("step=000005/")->empty());
  EXPECT_TRUE(s->list("nothing/")->empty());
}

TEST_F(S3StorageTest, RemoveAndRemovePrefix) {
  auto s = open(options());
  ASSERT_TRUE(s);
  for (const char* p : {"step=1/a", "step=1/b", "step=10/a", "step=2/a", "last"})
    ASSERT_TRUE(s->write_text(p, p).is_ok());
  // An upload left running under step=1/ by a writer that never finished.
  auto client = S3Client::create(options());
  ASSERT_TRUE(client.is_ok());
  ASSERT_TRUE((*client)->create_multipart_upload(server_->bucket, prefix_ + "/step=1/orphan").is_ok());
  EXPECT_EQ(pending_uploads(), 1u);

  ASSERT_TRUE(s->remove_prefix("step=1/").is_ok());  // the directory, not step=10/
  std::vector<StorageEntry> left = *s->list("");
  ASSERT_EQ(left.size(), 3u);
  EXPECT_EQ(left[0].path, "last");
  EXPECT_EQ(left[1].path, "step=10/a");
  EXPECT_EQ(pending_uploads(), 0u);
  ASSERT_TRUE(s->remove_prefix("step=").is_ok());  // a plain prefix: every step=*
  left = *s->list("");
  ASSERT_EQ(left.size(), 1u);
  ASSERT_TRUE(s->remove("last").is_ok());
  ASSERT_TRUE(s->remove("last").is_ok());  // absent is fine
  EXPECT_FALSE(*s->exists("last"));
  ASSERT_TRUE(s->remove_prefix("").is_ok());
  EXPECT_TRUE(s->list("")->empty());
}

TEST_F(S3StorageTest, MissingKeysAndAbandonedWriters) {
  auto s = open(options());
  ASSERT_TRUE(s);
  for (auto st : {s->read("missing/x").status(), s->read_range("missing/x", 0, 4).status(),
                  s->read_range("missing/x", 0, 0).status(), s->size("missing/x").status()}) {
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.message();
    EXPECT_NE(st.message().find(root() + "/missing/x"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("404"), std::string::npos) << st.message();
  }
  EXPECT_FALSE(*s->exists("missing/x"));
  {
    // Past one part, so a multipart upload is running when the writer dies.
    auto w = s->open_writer("abandoned");
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE((*w)->write(pattern(6u << 20, 2)).is_ok());
    EXPECT_EQ(pending_uploads(), 1u);
  }
  EXPECT_EQ(pending_uploads(), 0u);
  EXPECT_FALSE(*s->exists("abandoned"));
  {
    auto w = s->open_writer("small-abandoned");
    ASSERT_TRUE((*w)->write(pattern(10, 3)).is_ok());
  }
  EXPECT_FALSE(*s->exists("small-abandoned"));
}

TEST_F(S3StorageTest, BadCredentialsFailClearly) {
  S3Options o = options();
  o.credentials.secret_access_key = "not-the-secret";
  Result<std::unique_ptr<Storage>> s = open_s3_storage(root(), o);
  ASSERT_FALSE(s.is_ok());
  const std::string& msg = s.status().message();
  for (const char* part : {"s3://lathe-test", "HTTP 403", "SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' missing from: " << msg;

  o = options();
  o.credentials.access_key_id = "AKIANOSUCHKEY0000000";
  s = open_s3_storage(root(), o);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("InvalidAccessKeyId"), std::string::npos) << s.status().message();

  o = options();
  o.credentials = {};
  s = open_s3_storage(root(), o);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos) << s.status().message();

  s = open_s3_storage("s3://no-such-bucket-here/x", options());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("NoSuchBucket"), std::string::npos) << s.status().message();
  EXPECT_FALSE(open_s3_storage("s3:///x", options()).is_ok());
}

TEST_F(S3StorageTest, RetriesThroughInjectedFaults) {
  auto s = open(options(/*through_proxy=*/true));
  ASSERT_TRUE(s);
  // Each kind of fault once, on a small PUT, a GET, a HEAD and a listing.
  ASSERT_EQ(server_->command("faults 503 slowdown 500 429 drop lost"), "ok");
  ASSERT_TRUE(s->write_text("a", "hello").is_ok());
  EXPECT_EQ(proxy_count("faults"), 6);
  ASSERT_EQ(server_->command("faults stall"), "ok");
  Result<std::string> text = s->read_text("a");
  ASSERT_TRUE(text.is_ok()) << text.status().message();
  EXPECT_EQ(*text, "hello");
  ASSERT_EQ(server_->command("faults 503 lost drop slowdown"), "ok");
  EXPECT_EQ(*s->size("a"), 5);
  EXPECT_EQ(*s->size("a"), 5);  // the connection is still good after a failed HEAD
  ASSERT_EQ(server_->command("faults slowdown lost"), "ok");
  EXPECT_EQ(s->list("")->size(), 1u);

  // A multipart upload whose completion is applied but whose reply is lost:
  // the retry finds no upload and must recognise the finished object.
  const std::vector<uint8_t> data = pattern((12u << 20) + 5, 4);
  ASSERT_EQ(server_->command("faults ok ok ok ok lost"), "ok");
  Status st = write_in_pieces(*s, "big", data);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_TRUE(*s->read("big") == data);

  // A flaky store throughout: a third of all requests fail somehow.
  ASSERT_EQ(server_->command("random 0.33 7"), "ok");
  st = write_in_pieces(*s, "big2", data);
  ASSERT_TRUE(st.is_ok()) << st.message();
  Result<std::vector<uint8_t>> back = s->read("big2");
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_TRUE(*back == data);
  ASSERT_TRUE(s->remove_prefix("").is_ok());
  ASSERT_EQ(server_->command("clear"), "ok");
  EXPECT_GT(proxy_count("faults"), 12);
  EXPECT_EQ(pending_uploads(), 0u);
}

TEST_F(S3StorageTest, FailsClearlyPastTheRetryBudget) {
  S3Options o = options(/*through_proxy=*/true);
  o.max_attempts = 3;
  auto s = open(o);
  ASSERT_TRUE(s);
  ASSERT_EQ(server_->command("always slowdown"), "ok");
  Status st = s->write_text("x", "y");
  ASSERT_FALSE(st.is_ok());
  const std::string url = root() + "/x";
  for (const char* part : {"PUT", url.c_str(), "HTTP 503 SlowDown", "Please reduce your request rate", "3 attempts"})
    EXPECT_NE(st.message().find(part), std::string::npos) << "'" << part << "' missing from: " << st.message();

  ASSERT_EQ(server_->command("always drop"), "ok");
  st = s->read("x").status();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("connection failed"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("3 attempts"), std::string::npos) << st.message();

  // Stalls past the timeout: each try gives up after about timeout_ms.
  o.max_attempts = 2;
  o.timeout_ms = 300;
  ASSERT_EQ(server_->command("always stall"), "ok");
  auto stalled = S3Client::create(o);
  auto t0 = std::chrono::steady_clock::now();
  st = (*stalled)->put_object(server_->bucket, prefix_ + "/z", {});
  double s_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("LATHE_S3_TIMEOUT_MS"), std::string::npos) << st.message();
  EXPECT_LT(s_taken, 6.0) << "a stalled request must give up near its timeout";
  ASSERT_EQ(server_->command("clear"), "ok");
}

TEST(S3Url, ParsesBucketAndPrefix) {
  std::string bucket, prefix;
  ASSERT_TRUE(parse_s3_url("s3://b/run/x/", &bucket, &prefix).is_ok());
  EXPECT_EQ(bucket, "b");
  EXPECT_EQ(prefix, "run/x");
  ASSERT_TRUE(parse_s3_url("s3://b", &bucket, &prefix).is_ok());
  EXPECT_EQ(prefix, "");
  EXPECT_FALSE(parse_s3_url("s3://", &bucket, &prefix).is_ok());
  EXPECT_FALSE(parse_s3_url("s3://b//x", &bucket, &prefix).is_ok());
  S3Options o;
  o.credentials = {.access_key_id = "a", .secret_access_key = "b"};
  o.part_size_bytes = 1 << 20;
  EXPECT_NE(o.validate().message().find("5 MiB"), std::string::npos);
}

}  // namespace
}  // namespace lathe
