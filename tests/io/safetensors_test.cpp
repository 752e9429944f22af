// safetensors: files written by the Python library read back exactly; files
// lathe writes read back by the Python library (when it is installed); and
// every header validation rule rejects a file built to break it, with a
// message naming the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kData = std::string(LATHE_TEST_DATA) + "/safetensors";

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("lathe_st_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Runs a shell command, returning its exit status and stdout.
int run(const std::string& cmd, std::string* out) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  return pclose(p);
}

bool have_python_safetensors() {
  static const bool ok = std::system("python3 -c 'import numpy, safetensors' >/dev/null 2>&1") == 0;
  return ok;
}

// Element i of t as a double, whatever its dtype.
double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return t.data<double>()[i];
    case DType::BF16: return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::F16: return f16_to_f32(t.data<uint16_t>()[i]);
    case DType::I64: return static_cast<double>(t.data<int64_t>()[i]);
    case DType::U8: case DType::BOOL: return t.data<uint8_t>()[i];
    default: ADD_FAILURE() << "unexpected dtype"; return 0;
  }
}

// Checks a tensor against one entry of a *.expected.json written by Python.
void expect_matches(const Tensor& t, const json& want, const std::string& name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(dtype_safetensors_name(t.dtype()), want["dtype"].get<std::string>());
  EXPECT_EQ(t.shape().vec(), want["shape"].get<std::vector<int64_t>>());
  const json& values = want["values"];
  ASSERT_EQ(static_cast<size_t>(t.numel()), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(element(t, static_cast<int64_t>(i)), values[i].get<double>()) << "element " << i;
  }
}

TEST(Safetensors, ReadsEveryDtypeOfAFileWrittenByThePythonLibrary) {
  auto f = SafetensorsFile::open(kData + "/py_mixed.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  json want = read_json(kData + "/py_mixed.safetensors.expected.json");
  EXPECT_EQ(f->entries().size(), want["tensors"].size());
  for (const auto& [name, w] : want["tensors"].items()) {
    auto t = f->tensor(name);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    expect_matches(*t, w, name);
  }
  EXPECT_EQ(json(f->metadata()), want["metadata"]);
}

TEST(Safetensors, TensorsAliasTheMappingAndOutliveTheFileObject) {
  Tensor a, b;
  uint64_t a_begin = 0, b_begin = 0;
  {
    auto f = SafetensorsFile::open(kData + "/py_mixed.safetensors");
    ASSERT_TRUE(f.is_ok());
    a = f->tensor("lm_head.weight").value();
    b = f->tensor("model.embed_tokens.weight").value();
    a_begin = f->find("lm_head.weight")->begin;
    b_begin = f->find("model.embed_tokens.weight")->begin;
    // Zero-copy: both point into one mapping at their offsets' distance.
    EXPECT_EQ(static_cast<char*>(a.raw()) - static_cast<char*>(b.raw()),
              static_cast<int64_t>(a_begin) - static_cast<int64_t>(b_begin));
  }
  json want = read_json(kData + "/py_mixed.safetensors.expected.json");
  expect_matches(a, want["tensors"]["lm_head.weight"], "lm_head.weight after close");
}

TEST(Safetensors, WeightStoreReadsShardsWrittenByHuggingFaceHub) {
  auto ws = WeightStore::open_dir(kData + "/py_sharded");
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  json want = read_json(kData + "/py_sharded.expected.json");
  EXPECT_EQ(ws->names().size(), want["tensors"].size());
  EXPECT_EQ(ws->files().size(), 3u);
  for (const auto& [name, w] : want["tensors"].items()) {
    EXPECT_EQ(fs::path(ws->file_of(name)).filename().string(), w["file"].get<std::string>());
    auto t = ws->get(name, Shape{4, 8});
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    expect_matches(*t, w, name);
  }
}

TEST(Safetensors, WeightStoreErrorsNameDirectoryFileAndTensor) {
  auto ws = WeightStore::open_dir(kData + "/py_sharded");
  ASSERT_TRUE(ws.is_ok());
  auto missing = ws->get("model.layers.9.mlp.weight");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("py_sharded: tensor 'model.layers.9.mlp.weight' not found in"),
            std::string::npos) << missing.status().message();
  auto shaped = ws->get("model.layers.0.mlp.weight", Shape{8, 4});
  ASSERT_FALSE(shaped.is_ok());
  EXPECT_NE(shaped.status().message().find(
                "model-00001-of-00003.safetensors: tensor 'model.layers.0.mlp.weight' has shape [4, 8], expected [8, 4]"),
            std::string::npos) << shaped.status().message();

  std::string empty = fresh_dir("empty");
  auto none = WeightStore::open_dir(empty);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find(empty), std::string::npos);
  EXPECT_FALSE(WeightStore::open_dir(empty + "/nope").is_ok());

  // An index that lists a tensor its shard does not hold, or a missing shard.
  std::string bad = fresh_dir("badindex");
  fs::copy(kData + "/py_sharded", bad, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  json idx = read_json(bad + "/model.safetensors.index.json");
  idx["weight_map"]["model.layers.0.mlp.weight"] = "model-00002-of-00003.safetensors";
  std::ofstream(bad + "/model.safetensors.index.json") << idx.dump();
  auto r = WeightStore::open_dir(bad);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("model.safetensors.index.json: tensor 'model.layers.0.mlp.weight' is listed in "
                                      "model-00002-of-00003.safetensors"),
            std::string::npos) << r.status().message();
  fs::remove(bad + "/model-00003-of-00003.safetensors");
  idx["weight_map"]["model.layers.0.mlp.weight"] = "model-00001-of-00003.safetensors";
  std::ofstream(bad + "/model.safetensors.index.json") << idx.dump();
  r = WeightStore::open_dir(bad);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("model-00003-of-00003.safetensors: cannot open"), std::string::npos)
      << r.status().message();
}

TEST(Safetensors, WeightStorePrefersASingleFileOverAnIndexAsTransformersDoes) {
  std::string dir = fresh_dir("both");
  fs::copy(kData + "/py_sharded", dir, fs::copy_options::recursive);
  fs::copy_file(kData + "/py_mixed.safetensors", dir + "/model.safetensors");
  auto ws = WeightStore::open_dir(dir);
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  EXPECT_EQ(ws->files().size(), 1u);
  EXPECT_TRUE(ws->has("lm_head.weight"));
  EXPECT_FALSE(ws->has("model.layers.0.mlp.weight"));
}

// A handful of tensors of every writable dtype, with known values.
std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, Tensor>> out;
  Tensor f32 = Tensor::empty(DType::F32, {2, 3});
  for (int i = 0; i < 6; ++i) f32.data<float>()[i] = 0.25f * static_cast<float>(i) - 0.5f;
  out.emplace_back("w.f32", f32);
  out.emplace_back("w.bf16", f32.to(DType::BF16));
  out.emplace_back("w.f16", f32.to(DType::F16).reshape({3, 2}));
  Tensor i64 = Tensor::empty(DType::I64, {3});
  for (int i = 0; i < 3; ++i) i64.data<int64_t>()[i] = -1000000000000LL * i;
  out.emplace_back("ids", i64);
  Tensor u8 = Tensor::empty(DType::U8, {1, 1, 5});  // odd size: later offsets unaligned
  for (int i = 0; i < 5; ++i) u8.data<uint8_t>()[i] = static_cast<uint8_t>(50 * i);
  out.emplace_back("bytes", u8);
  out.emplace_back("empty", Tensor::zeros(DType::F32, {0, 4}));
  Tensor scalar = Tensor::empty(DType::F64, Shape{});
  *scalar.data<double>() = 3.0e100;
  out.emplace_back("scalar", scalar);
  return out;
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(got.raw(), want.raw(), static_cast<size_t>(want.nbytes())), 0);
}

TEST(Safetensors, WriteThenReadBackPadsTheHeaderLikeTheReference) {
  std::string dir = fresh_dir("write");
  std::string path = dir + "/t.safetensors";
  auto tensors = sample_tensors();
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}, {"k", "v"}}).is_ok());
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "t.safetensors");  // no temp left

  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  size_t close = bytes.rfind('}', 8 + n);
  for (size_t i = close + 1; i < 8 + n; ++i) EXPECT_EQ(bytes[i], ' ');

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->metadata().at("k"), "v");
  ASSERT_EQ(f->entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(f->entries()[i].name, tensors[i].first);  // written in the given order
    expect_same(f->tensor(tensors[i].first).value(), tensors[i].second, tensors[i].first);
  }
}

TEST(Safetensors, PythonLibraryReadsWhatLatheWrites) {
  if (!have_python_safetensors()) GTEST_SKIP() << "python3 with numpy + safetensors not installed";
  std::string path = fresh_dir("pyread") + "/t.safetensors";
  auto tensors = sample_tensors();
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}}).is_ok());
  std::string out;
  ASSERT_EQ(run("python3 " LATHE_SOURCE_DIR "/tools/safetensors_fixtures.py read " + path, &out), 0) << out;
  json got = json::parse(out);
  EXPECT_EQ(got["metadata"], json({{"format", "pt"}}));
  ASSERT_EQ(got["tensors"].size(), tensors.size());
  for (const auto& [name, t] : tensors) expect_matches(t, got["tensors"][name], name);
}

TEST(Safetensors, WriteWeightsShardsLikeHuggingFaceHubAndPythonReadsIt) {
  // The same five 64-byte tensors and limit as the hub-written fixture.
  auto ref = WeightStore::open_dir(kData + "/py_sharded");
  ASSERT_TRUE(ref.is_ok());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int i = 0; i < 5; ++i) {
    std::string name = "model.layers." + std::to_string(i) + ".mlp.weight";
    tensors.emplace_back(name, ref->get(name).value().clone());
  }
  std::string dir = fresh_dir("sharded");
  std::ofstream(dir + "/model.safetensors") << "stale";  // an earlier unsharded save
  ASSERT_TRUE(write_weights(dir, tensors, 150).is_ok());
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  json idx = read_json(dir + "/model.safetensors.index.json");
  json ref_idx = read_json(kData + "/py_sharded/model.safetensors.index.json");
  EXPECT_EQ(idx["weight_map"], ref_idx["weight_map"]);
  EXPECT_EQ(idx["metadata"]["total_size"], ref_idx["metadata"]["total_size"]);
  EXPECT_EQ(idx["metadata"]["total_parameters"], 5 * 32);

  auto ws = WeightStore::open_dir(dir);
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  for (const auto& [name, t] : tensors) expect_same(ws->get(name).value(), t, name);

  if (have_python_safetensors()) {
    std::string out;
    ASSERT_EQ(run("python3 " LATHE_SOURCE_DIR "/tools/safetensors_fixtures.py read " + dir, &out), 0) << out;
    json got = json::parse(out);
    for (const auto& [name, t] : tensors) expect_matches(t, got["tensors"][name], name);
  }

  // Saving again under the limit gives one file and removes the shards.
  ASSERT_TRUE(write_weights(dir, tensors).is_ok());
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/model-00001-of-00003.safetensors"));
  auto one = SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->metadata().at("format"), "pt");
}

TEST(Safetensors, WriteRejectsBadInputAndUnwritablePaths) {
  auto tensors = sample_tensors();
  Status s = write_safetensors("/nonexistent_dir_lathe/x.safetensors", tensors);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("/nonexistent_dir_lathe/x.safetensors"), std::string::npos);
  std::string dir = fresh_dir("badwrite");
  tensors.push_back(tensors[0]);
  s = write_safetensors(dir + "/x.safetensors", tensors);
  EXPECT_NE(s.message().find("tensor 'w.f32' given twice"), std::string::npos) << s.message();
  s = write_safetensors(dir + "/x.safetensors", {{"__metadata__", tensors[0].second}});
  EXPECT_FALSE(s.is_ok());
  s = write_safetensors(dir + "/x.safetensors", {{"q", Tensor::empty(DType::NF4, {4})}});
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
}

// --- header validation: one file per rule ------------------------------------

std::string file_bytes(const std::string& header, size_t data_bytes, uint64_t declared = UINT64_MAX) {
  uint64_t n = declared == UINT64_MAX ? header.size() : declared;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\x01');
}

// Expects from_bytes to fail with a message holding each of parts.
void expect_rejected(const std::string& bytes, std::initializer_list<std::string> parts) {
  auto f = SafetensorsFile::from_bytes(bytes, "bad.safetensors");
  ASSERT_FALSE(f.is_ok());
  const std::string& m = f.status().message();
  EXPECT_EQ(m.rfind("bad.safetensors: ", 0), 0u) << m;
  for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
}

const char* kOk = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(SafetensorsHeader, AWellFormedFileIsAccepted) {
  std::string b = file_bytes(kOk, 8);
  auto f = SafetensorsFile::from_bytes(b, "ok");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  // Header of odd length: data is misaligned for f32 and gets copied.
  std::string odd = file_bytes(std::string(kOk) + " ", 8);
  auto g = SafetensorsFile::from_bytes(odd, "odd");
  ASSERT_TRUE(g.is_ok());
  Tensor t = g->tensor("a").value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 4, 0u);
  EXPECT_EQ(std::memcmp(t.raw(), odd.data() + odd.size() - 8, 8), 0);
  EXPECT_EQ(g->tensor("b").status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsHeader, LengthRules) {
  expect_rejected(std::string(7, '\0'), {"too short"});
  expect_rejected(file_bytes(kOk, 8, kSafetensorsMaxHeaderBytes + 1), {"exceeds the limit"});
  expect_rejected(file_bytes(kOk, 0, 1000), {"runs past the end of the file"});
}

TEST(SafetensorsHeader, JsonShapeRules) {
  expect_rejected(file_bytes("{\"a\":", 0), {"not valid JSON"});
  expect_rejected(file_bytes("[1,2]", 0), {"must be a JSON object"});
  expect_rejected(file_bytes("{\"a\":\"\xff\xfe\"}", 0), {"not valid JSON"});  // not UTF-8
  expect_rejected(file_bytes(R"({"a":[1]})", 0), {"tensor 'a'", "must be an object"});
  expect_rejected(file_bytes(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), {"tensor 'a'", "\"dtype\""});
  expect_rejected(file_bytes(R"({"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}})", 8), {"tensor 'a'", "\"dtype\""});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8), {"tensor 'a'", "\"shape\""});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", 8), {"tensor 'a'", "\"data_offsets\""});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8),
                  {"tensor 'a'", "\"data_offsets\""});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})", 8),
                  {"tensor 'a'", "\"data_offsets\" must be non-negative integers"});
}

TEST(SafetensorsHeader, DtypeAndShapeRules) {
  expect_rejected(file_bytes(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8),
                  {"tensor 'a'", "unsupported dtype \"Q4\""});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                  {"tensor 'a'", "non-negative integers"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8),
                  {"tensor 'a'", "non-negative integers"});
  expect_rejected(
      file_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      {"tensor 'a'", "overflows the element count"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
                  {"tensor 'a'", "overflows the byte size"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
                  {"tensor 'a'", "rank 7"});
}

TEST(SafetensorsHeader, OffsetRules) {
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                  {"tensor 'a'", "end before they begin"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", 12),
                  {"tensor 'a'", "hold 12 bytes", "needs 8"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
                  {"past the end of the file"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9),
                  {"trailing bytes"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                  {"tensor 'a'", "leave a gap", "expected to begin at 0"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
                  {"tensor 'b'", "leave a gap"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                  {"tensor 'b'", "overlap"});
  expect_rejected(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
                  {"tensor 'a' appears twice"});
  // Zero-size tensors may share an offset.
  std::string zeros = file_bytes(R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                                 R"("y":{"dtype":"BF16","shape":[3,0],"data_offsets":[0,0]},)"
                                 R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  EXPECT_TRUE(SafetensorsFile::from_bytes(zeros, "z").is_ok());
}

TEST(SafetensorsHeader, MetadataRules) {
  EXPECT_TRUE(SafetensorsFile::from_bytes(file_bytes(R"({"__metadata__":{"format":"pt"}})", 0), "m").is_ok());
  EXPECT_TRUE(SafetensorsFile::from_bytes(file_bytes(R"({"__metadata__":null})", 0), "m").is_ok());
  expect_rejected(file_bytes(R"({"__metadata__":["pt"]})", 0), {"\"__metadata__\" must be an object"});
  expect_rejected(file_bytes(R"({"__metadata__":{"format":1}})", 0), {"value for 'format' must be a string"});
}

TEST(SafetensorsHeader, OpenNamesThePathOfMissingAndCorruptFiles) {
  auto m = SafetensorsFile::open("/nonexistent_lathe/model.safetensors");
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("/nonexistent_lathe/model.safetensors"), std::string::npos);
  std::string dir = fresh_dir("corrupt");
  std::ofstream(dir + "/empty.safetensors");
  auto e = SafetensorsFile::open(dir + "/empty.safetensors");
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find(dir + "/empty.safetensors: 0 bytes is too short"), std::string::npos);
  std::ofstream(dir + "/bad.safetensors", std::ios::binary)
      << file_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  auto b = SafetensorsFile::open(dir + "/bad.safetensors");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find(dir + "/bad.safetensors: tensor 'w'"), std::string::npos);
  EXPECT_FALSE(SafetensorsFile::open(dir).is_ok());  // a directory
}

}  // namespace
}  // namespace lathe
