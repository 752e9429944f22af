// The BPE model of tokenizer.json. A word is split into characters (or, for
// byte-level tokenizers, raw bytes: the vocabulary is re-keyed by the bytes
// its byte-level strings stand for, so no per-byte remapping happens at
// encode time), unknown characters go to byte fallback or unk, and merges
// are applied lowest rank first, leftmost first, with a min-heap over a
// linked list of symbols. Results for short words are cached per thread
// (no locks on the hot path).
//
// SentencePiece-style models run without a pre-tokenizer, so a whole text is
// one "word". When no merge joins a non-▁ symbol to a following ▁ (checked at
// load), merges can never cross the point before such a ▁, and the word is
// cut there into independent, cacheable chunks with identical results.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "io/tokenizer_hash.h"

namespace lathe::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map from a pair of ids to (rank, merged id).
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  void insert(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const {
    uint64_t key = pack(a, b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static size_t hash(uint64_t k) { return size_t((k * 0x9E3779B97F4A7C15ull) >> 20); }
  std::vector<uint64_t> keys_ = std::vector<uint64_t>(1, kEmpty);
  std::vector<Value> values_ = std::vector<Value>(1);
  size_t mask_ = 0;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // j: the "model" object. byte_level: the pre-tokenizer maps bytes to the
  // byte-level alphabet, so words arrive as raw bytes.
  static Result<std::unique_ptr<BpeModel>> parse(const nlohmann::json& j, bool byte_level);

  // Appends the ids of one pre-tokenized word. Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  const FlatStringMap<int32_t>& vocab() const { return vocab_; }  // token string -> id

 private:
  void tokenize_chunk(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids, std::vector<uint32_t>& lens) const;
  Status build_merges(const nlohmann::json& merges);

  // What words are looked up by: vocab_, or its raw-byte re-keying.
  const FlatStringMap<int32_t>& keys() const { return byte_level_ ? model_keys_ : vocab_; }

  FlatStringMap<int32_t> vocab_;       // as written in the file
  FlatStringMap<int32_t> model_keys_;  // byte-level only: raw bytes -> id
  PairMap merges_;
  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  int32_t byte_ids_[256];         // byte-level: id of each single byte, -1 if absent
  int32_t fallback_ids_[256];     // byte fallback: id of "<0xNN>", -1 if absent

  bool split_metaspace_ = false;  // cut words before a ▁ that follows a non-▁
  uint64_t serial_ = 0;           // identifies this model's per-thread caches

  static constexpr size_t kCacheMaxWords = 65'536;
  static constexpr size_t kCacheMaxWordBytes = 256;
};

}  // namespace lathe::tok
