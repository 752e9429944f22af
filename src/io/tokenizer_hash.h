// Flat, open-addressing string-keyed tables for the tokenizer's hot path:
// vocabulary lookups and the per-thread word cache. Keys live in one arena
// and each slot keeps the full 64-bit hash, so a lookup usually touches one
// slot and one key: far fewer cache misses than node-based maps over a
// vocabulary of 100k+ strings. Insert-only; no deletion.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace lathe::tok {

inline uint64_t hash_bytes(std::string_view s) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = kMul ^ (s.size() * 0xFF51AFD7ED558CCDull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
  }
  h ^= h >> 32;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return h;
}

template <class V>
class FlatStringMap {
 public:
  size_t size() const { return size_; }

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (cap <= slots_.size()) return;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.used) place(s);
    }
  }

  // Inserts or overwrites.
  void insert(std::string_view key, const V& value) {
    if ((size_ + 1) * 2 > slots_.size()) reserve(std::max<size_t>(16, slots_.size()));
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) {
        s = Slot{h, uint32_t(arena_.size()), uint32_t(key.size()), true, value};
        arena_.append(key);
        ++size_;
        return;
      }
      if (s.hash == h && key_of(s) == key) {
        s.value = value;
        return;
      }
    }
  }

  // fn(std::string_view key, const V& value) for every entry, in slot order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_) {
      if (s.used) fn(key_of(s), s.value);
    }
  }

  const V* find(std::string_view key) const {
    if (size_ == 0) return nullptr;
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0) {
        return &s.value;
      }
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0;
    uint32_t len = 0;
    bool used = false;
    V value{};
  };
  std::string_view key_of(const Slot& s) const { return std::string_view(arena_).substr(s.off, s.len); }
  void place(const Slot& s) {
    size_t i = s.hash & mask_;
    while (slots_[i].used) i = (i + 1) & mask_;
    slots_[i] = s;
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace lathe::tok
