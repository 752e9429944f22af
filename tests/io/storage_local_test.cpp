// Local Storage: whole-or-absent objects, listings, ranges, removal, and
// the path checks every implementation shares.
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "io/storage.h"

namespace lathe {
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("lathe_storage_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}
std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
}  // namespace

TEST(LocalStorage, WriteReadListRemove) {
  const fs::path d = fresh_dir("basic");
  auto st = open_storage(d.string());
  ASSERT_TRUE(st.is_ok()) << st.status().message();
  Storage& s = **st;
  ASSERT_TRUE(s.write_text("a/b.txt", "hello").is_ok());
  ASSERT_TRUE(s.write_text("a/c/d.bin", "0123456789").is_ok());
  ASSERT_TRUE(s.write_text("top", "x").is_ok());
  EXPECT_EQ(*s.read_text("a/b.txt"), "hello");
  auto r = s.read_range("a/c/d.bin", 3, 4);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(std::string(r->begin(), r->end()), "3456");
  EXPECT_EQ(*s.size("a/c/d.bin"), 10);
  EXPECT_TRUE(*s.exists("top"));
  EXPECT_FALSE(*s.exists("nope"));
  EXPECT_EQ(s.read("nope").status().code(), StatusCode::kNotFound);
  auto all = s.list("");
  ASSERT_TRUE(all.is_ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].path, "a/b.txt");
  EXPECT_EQ((*all)[1].path, "a/c/d.bin");
  EXPECT_EQ((*all)[1].size, 10);
  EXPECT_EQ(s.list("a/c/")->size(), 1u);
  EXPECT_EQ(*s.list_dirs(""), std::vector<std::string>{"a"});
  EXPECT_EQ(*s.list_dirs("a"), std::vector<std::string>{"c"});
  ASSERT_TRUE(s.remove("top").is_ok());
  ASSERT_TRUE(s.remove("top").is_ok());  // absent is fine
  ASSERT_TRUE(s.remove_prefix("a/c/").is_ok());
  EXPECT_EQ(s.list("")->size(), 1u);
  EXPECT_FALSE(fs::exists(d / "a" / "c"));
  fs::remove_all(d);
}

TEST(LocalStorage, WriterWithoutCloseLeavesNothing) {
  const fs::path d = fresh_dir("abandon");
  auto st = open_storage(d.string());
  ASSERT_TRUE(st.is_ok());
  {
    auto w = (*st)->open_writer("x/obj");
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE((*w)->write(bytes_of("partial")).is_ok());
    EXPECT_TRUE((*st)->list("")->empty());  // the temporary is not listed
  }
  EXPECT_FALSE(*(*st)->exists("x/obj"));
  EXPECT_TRUE(fs::is_empty(d / "x"));
  fs::remove_all(d);
}

TEST(LocalStorage, RejectsEscapingPaths) {
  const fs::path d = fresh_dir("paths");
  auto st = open_storage(d.string());
  ASSERT_TRUE(st.is_ok());
  EXPECT_EQ((*st)->write_text("../evil", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*st)->write_text("/abs", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*st)->read("a/../../b").status().code(), StatusCode::kInvalidArgument);
  fs::remove_all(d);
}

TEST(LocalStorage, RemovePlainPrefix) {
  const fs::path d = fresh_dir("prefix");
  auto st = open_storage(d.string());
  ASSERT_TRUE(st.is_ok());
  ASSERT_TRUE((*st)->write_text("step=1/a", "x").is_ok());
  ASSERT_TRUE((*st)->write_text("step=12/a", "x").is_ok());
  ASSERT_TRUE((*st)->write_text("other/a", "x").is_ok());
  ASSERT_TRUE((*st)->remove_prefix("step=1").is_ok());
  auto left = (*st)->list("");
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].path, "other/a");
  fs::remove_all(d);
}

}  // namespace lathe
