// BPE model: loading the vocabulary and merges, and merging words (see the
// header). The merge loop keeps stale heap entries and discards them when
// popped (the pair at that position no longer produces the recorded id), the
// same order of work as the reference implementation, so ties between equal
// ranks resolve identically.
#include "io/tokenizer_bpe.h"

#include <algorithm>
#include <array>
#include <atomic>

#include <nlohmann/json.hpp>

#include "io/tokenizer_utf8.h"

namespace lathe::tok {

using json = nlohmann::json;

void PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, Value{});
  mask_ = cap - 1;
  size_ = 0;
}

void PairMap::insert(int32_t a, int32_t b, Value v) {
  if ((size_ + 1) * 2 > keys_.size()) {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<Value> old_values = std::move(values_);
    reserve(std::max<size_t>(16, old_keys.size()));
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != kEmpty) insert(int32_t(old_keys[i] >> 32), int32_t(uint32_t(old_keys[i])), old_values[i]);
    }
  }
  uint64_t key = pack(a, b);
  size_t i = hash(key) & mask_;
  while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
  if (keys_[i] == kEmpty) ++size_;
  keys_[i] = key;
  values_[i] = v;  // a repeated pair: the later line wins, as in the reference
}

namespace {

// Splits "a b" (exactly one space) or reads ["a", "b"].
bool merge_parts(const json& m, std::string& a, std::string& b) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) return false;
    a = s.substr(0, sp);
    b = s.substr(sp + 1);
    return true;
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    a = m[0].get<std::string>();
    b = m[1].get<std::string>();
    return true;
  }
  return false;
}

std::string opt_string(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // ▁

bool ends_with(std::string_view s, std::string_view x) { return s.size() >= x.size() && s.substr(s.size() - x.size()) == x; }

}  // namespace

// True when ▁ is a token and no merge puts a non-▁ symbol before one that
// starts with ▁: then no token can span such a boundary.
static bool metaspace_split_is_exact(const BpeModel& m, const json& merges) {
  if (m.vocab().find(kMetaspace) == nullptr) return false;
  std::string a, b;
  for (const json& mg : merges) {
    if (!merge_parts(mg, a, b)) return false;
    if (b.compare(0, kMetaspace.size(), kMetaspace) == 0 && !ends_with(a, kMetaspace)) return false;
  }
  return true;
}

Status BpeModel::build_merges(const json& merges) {
  merges_.reserve(merges.size());
  std::string a, b;
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string where = "model.merges[" + std::to_string(i) + "]";
    if (!merge_parts(merges[i], a, b)) return invalid_argument(where, ": expected \"a b\" or [\"a\", \"b\"]");
    const int32_t* ia = vocab_.find(a);
    const int32_t* ib = vocab_.find(b);
    if (ia == nullptr || ib == nullptr) return invalid_argument(where, ": token not in the vocabulary");
    if (b.size() < prefix_.size()) return invalid_argument(where, ": shorter than continuing_subword_prefix");
    const int32_t* inew = vocab_.find(a + b.substr(prefix_.size()));
    if (inew == nullptr) return invalid_argument(where, ": merged token not in the vocabulary");
    merges_.insert(*ia, *ib, {int32_t(i), *inew});
  }
  return Status::ok();
}

Result<std::unique_ptr<BpeModel>> BpeModel::parse(const json& j, bool byte_level) {
  if (!j.is_object()) return invalid_argument("model: expected an object");
  std::string type = opt_string(j, "type");
  if (!type.empty() && type != "BPE") return unsupported("model.type \"", type, "\" is not supported (only BPE)");
  auto vocab = j.find("vocab");
  auto merges = j.find("merges");
  if (vocab == j.end() || !vocab->is_object()) return invalid_argument("model.vocab: expected an object");
  if (merges == j.end() || !merges->is_array()) return invalid_argument("model.merges: expected an array");

  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_level_ = byte_level;
  m->prefix_ = opt_string(j, "continuing_subword_prefix");
  m->suffix_ = opt_string(j, "end_of_word_suffix");
  auto flag = [&](const char* k) { auto it = j.find(k); return it != j.end() && it->is_boolean() && it->get<bool>(); };
  m->ignore_merges_ = flag("ignore_merges");
  m->byte_fallback_ = flag("byte_fallback");
  m->fuse_unk_ = flag("fuse_unk");

  m->vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (1 << 30)) {
      return invalid_argument("model.vocab[\"", it.key(), "\"]: id must be a non-negative integer");
    }
    m->vocab_.insert(it.key(), int32_t(it.value().get<int64_t>()));
  }
  LATHE_TRY(m->build_merges(*merges));

  std::string unk = opt_string(j, "unk_token");
  if (!unk.empty()) {
    const int32_t* id = m->vocab_.find(unk);
    if (id == nullptr) return invalid_argument("model.unk_token \"", unk, "\" is not in the vocabulary");
    m->unk_id_ = *id;
  }

  const ByteLevelAlphabet& alpha = byte_level_alphabet();
  if (byte_level) {
    // Re-key by raw bytes; tokens outside the alphabet can never be formed
    // from byte-level input and are left out.
    std::string raw;
    m->model_keys_.reserve(m->vocab_.size());
    m->vocab_.for_each([&](std::string_view tok, int32_t id) {
      if (alpha.to_bytes(tok, raw)) m->model_keys_.insert(raw, id);
    });
    if (alpha.to_bytes(m->prefix_, raw)) m->prefix_ = raw;
    if (alpha.to_bytes(m->suffix_, raw)) m->suffix_ = raw;
  }
  for (int b = 0; b < 256; ++b) {
    m->byte_ids_[b] = -1;
    if (byte_level) {
      if (const int32_t* id = m->model_keys_.find(std::string(1, char(b)))) m->byte_ids_[b] = *id;
    }
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const int32_t* id = m->vocab_.find(std::string_view(name));
    m->fallback_ids_[b] = id == nullptr ? -1 : *id;
  }
  m->split_metaspace_ = !byte_level && m->prefix_.empty() && m->suffix_.empty() && metaspace_split_is_exact(*m, *merges);
  static std::atomic<uint64_t> next_serial{1};
  m->serial_ = next_serial++;
  return m;
}

// Splits a word into its first symbols: characters (bytes when byte-level)
// looked up in the vocabulary, with byte fallback and unk for the rest.
void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& ids, std::vector<uint32_t>& lens) const {
  bool plain = prefix_.empty() && suffix_.empty();
  std::optional<std::pair<int32_t, uint32_t>> unk;  // pending (id, byte length)
  std::string key;
  for (size_t i = 0; i < word.size();) {
    size_t n = byte_level_ ? 1 : utf8_char_len(word, i);
    bool is_first = i == 0, is_last = i + n == word.size();
    std::string_view s = word.substr(i, n);
    if (!plain) {
      key.assign(is_first ? "" : prefix_).append(s).append(is_last ? suffix_ : "");
      s = key;
    }
    i += n;
    int32_t id = -1;
    if (byte_level_ && plain) {
      id = byte_ids_[uint8_t(s[0])];
    } else if (const int32_t* found = keys().find(s)) {
      id = *found;
    }
    if (id >= 0) {
      if (unk) { ids.push_back(unk->first); lens.push_back(unk->second); unk.reset(); }
      ids.push_back(id);
      lens.push_back(uint32_t(n));
      continue;
    }
    if (byte_fallback_) {
      bool all = std::all_of(s.begin(), s.end(), [&](char c) { return fallback_ids_[uint8_t(c)] >= 0; });
      if (all) {
        for (char c : s) { ids.push_back(fallback_ids_[uint8_t(c)]); lens.push_back(1); }
        continue;
      }
    }
    if (!unk_id_) continue;  // no unk token: the character is dropped
    if (unk && fuse_unk_) {
      unk->second += uint32_t(n);
    } else {
      if (unk) { ids.push_back(unk->first); lens.push_back(unk->second); }
      unk = std::make_pair(*unk_id_, uint32_t(n));
    }
  }
  if (unk) { ids.push_back(unk->first); lens.push_back(unk->second); }
}

namespace {
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // 0 once merged into its left neighbour
};
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  bool operator<(const Candidate& o) const {  // max-heap: lowest rank, then leftmost, on top
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};
}  // namespace

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<uint32_t> lens;
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  ids.clear();
  lens.clear();
  initial_symbols(word, ids, lens);
  int32_t n = int32_t(ids.size());
  sym.resize(size_t(n));
  heap.clear();
  for (int32_t k = 0; k < n; ++k) {
    sym[size_t(k)] = {ids[size_t(k)], k - 1, k + 1 < n ? k + 1 : -1, lens[size_t(k)]};
    if (k + 1 < n) {
      if (const PairMap::Value* v = merges_.find(ids[size_t(k)], ids[size_t(k + 1)])) heap.push_back({v->rank, k, v->id});
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[size_t(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    int32_t right_pos = cur.next;
    Symbol right = sym[size_t(right_pos)];
    const PairMap::Value* v = merges_.find(cur.id, right.id);
    if (v == nullptr || v->id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    sym[size_t(right_pos)].len = 0;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const PairMap::Value* pv = merges_.find(sym[size_t(cur.prev)].id, cur.id)) {
        heap.push_back({pv->rank, cur.prev, pv->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (const PairMap::Value* nv = merges_.find(cur.id, sym[size_t(cur.next)].id)) {
        heap.push_back({nv->rank, top.pos, nv->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (int32_t k = 0; k < n; ++k) {
    if (sym[size_t(k)].len != 0) out.push_back(sym[size_t(k)].id);
  }
}

namespace {
// A thread's cache of merged words for one model, keyed by model serial.
struct WordCache {
  uint64_t owner = 0;
  FlatStringMap<std::pair<uint32_t, uint32_t>> index;  // word -> (offset, count) in ids
  std::vector<int32_t> ids;
};
}  // namespace

void BpeModel::tokenize_chunk(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (const int32_t* id = keys().find(word)) {
      out.push_back(*id);
      return;
    }
  }
  if (word.size() > kCacheMaxWordBytes) return merge_word(word, out);
  // A few models per thread; a new one evicts round robin.
  thread_local std::array<WordCache, 4> caches;
  thread_local size_t next_victim = 0;
  WordCache* cache = nullptr;
  for (WordCache& c : caches) {
    if (c.owner == serial_) cache = &c;
  }
  if (cache == nullptr) {
    cache = &caches[next_victim++ % caches.size()];
    *cache = WordCache{};
    cache->owner = serial_;
  }
  if (const auto* hit = cache->index.find(word)) {
    out.insert(out.end(), cache->ids.begin() + hit->first, cache->ids.begin() + hit->first + hit->second);
    return;
  }
  size_t start = out.size();
  merge_word(word, out);
  if (cache->index.size() < kCacheMaxWords) {
    cache->index.insert(word, {uint32_t(cache->ids.size()), uint32_t(out.size() - start)});
    cache->ids.insert(cache->ids.end(), out.begin() + std::ptrdiff_t(start), out.end());
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (!split_metaspace_) return tokenize_chunk(word, out);
  size_t start = 0;
  for (size_t pos = word.find(kMetaspace, 1); pos != std::string_view::npos; pos = word.find(kMetaspace, pos + 1)) {
    if (ends_with(word.substr(0, pos), kMetaspace)) continue;
    tokenize_chunk(word.substr(start, pos - start), out);
    start = pos;
  }
  tokenize_chunk(word.substr(start), out);
}

}  // namespace lathe::tok
