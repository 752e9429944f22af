// safetensors reading and writing. The header is untrusted input: every rule
// the reference library enforces is checked here before any byte of the data
// section is handed out, so a bad file is an error naming the file and the
// tensor, never a crash or an out-of-bounds read. The rules, in the reference
// library's terms: header length within the file and at most
// kSafetensorsMaxHeaderBytes; JSON object of entries {dtype, shape,
// data_offsets} plus an optional "__metadata__" of str -> str; known dtype;
// end - begin == numel * dtype size; and the tensors, sorted by offset, tile
// the data section exactly (start at 0, no gap, no overlap, end at the file's
// end).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

namespace lathe {
namespace {

using json = nlohmann::json;

std::string errno_text() { return std::strerror(errno); }

// A read-only mapping of a whole file; unmapped when the last holder lets go.
struct MappedFile {
  void* addr = nullptr;
  size_t len = 0;
  ~MappedFile() {
    if (addr != nullptr) munmap(addr, len);
  }
};

uint64_t read_le64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// a * b, or false on overflow.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// Reads an unsigned integer JSON value; floats, negatives and other types fail.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

Status parse_metadata(const json& m, const std::string& source, std::map<std::string, std::string>* out) {
  if (m.is_null()) return Status::ok();
  if (!m.is_object()) return invalid_argument(source, ": \"__metadata__\" must be an object of strings");
  for (const auto& [k, v] : m.items()) {
    if (!v.is_string()) {
      return invalid_argument(source, ": \"__metadata__\" value for '", k, "' must be a string, got ", v.type_name());
    }
    (*out)[k] = v.get<std::string>();
  }
  return Status::ok();
}

// Fills e from one header entry; checks types, dtype, rank and the byte size.
Status parse_entry(const std::string& name, const json& v, const std::string& source, SafetensorsEntry* e) {
  auto fail = [&](const auto&... parts) { return invalid_argument(source, ": tensor '", name, "': ", parts...); };
  if (!v.is_object()) return fail("entry must be an object with dtype, shape, data_offsets");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return fail("\"dtype\" missing or not a string");
  if (sh == v.end() || !sh->is_array()) return fail("\"shape\" missing or not an array");
  if (off == v.end() || !off->is_array() || off->size() != 2) {
    return fail("\"data_offsets\" missing or not an array of two integers");
  }
  std::optional<DType> dtype = dtype_from_safetensors_name(dt->get_ref<const std::string&>());
  if (!dtype) return fail("unsupported dtype \"", dt->get_ref<const std::string&>(), "\"");
  e->name = name;
  e->dtype = *dtype;
  if (sh->size() > static_cast<size_t>(kMaxDims)) return fail("rank ", sh->size(), " exceeds ", kMaxDims);
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  for (const json& d : *sh) {
    uint64_t n = 0;
    if (!as_u64(d, &n)) return fail("shape entries must be non-negative integers");
    if (n > static_cast<uint64_t>(INT64_MAX) || mul_overflows(numel, n, &numel) ||
        numel > static_cast<uint64_t>(INT64_MAX)) {
      return fail("shape dimension ", dims.size(), " (", n, ") overflows the element count");
    }
    dims.push_back(static_cast<int64_t>(n));
  }
  uint64_t bits = 0;
  if (mul_overflows(numel, static_cast<uint64_t>(dtype_bits(*dtype)), &bits)) {
    return fail("shape ", Shape(dims).str(), " overflows the byte size");
  }
  if (!as_u64((*off)[0], &e->begin) || !as_u64((*off)[1], &e->end)) {
    return fail("\"data_offsets\" must be non-negative integers");
  }
  if (e->end < e->begin) return fail("data_offsets [", e->begin, ", ", e->end, "] end before they begin");
  if (e->end - e->begin != bits / 8) {
    return fail("data_offsets [", e->begin, ", ", e->end, "] hold ", e->end - e->begin, " bytes but ",
                dtype_safetensors_name(*dtype), " ", Shape(dims).str(), " needs ", bits / 8);
  }
  e->shape = Shape(dims);
  return Status::ok();
}

// JSON allows repeated keys; a repeated tensor name would silently hide one
// of the two, so the top level is checked while parsing.
json parse_header_json(std::string_view header, std::string* duplicate) {
  std::set<std::string, std::less<>> seen;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate->empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) *duplicate = k;
    }
    return true;
  };
  return json::parse(header.begin(), header.end(), cb, /*allow_exceptions=*/false);
}

// Opens path read-only and maps the whole file (an empty file maps to nothing).
Result<std::shared_ptr<MappedFile>> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return error(errno == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, path, ": cannot open: ",
                 errno_text());
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = io_error(path, ": stat: ", errno_text());
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path, ": not a regular file");
  }
  auto m = std::make_shared<MappedFile>();
  m->len = static_cast<size_t>(st.st_size);
  if (m->len > 0) {
    void* a = mmap(nullptr, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (a == MAP_FAILED) {
      Status s = io_error(path, ": mmap: ", errno_text());
      ::close(fd);
      return s;
    }
    m->addr = a;
  }
  ::close(fd);
  return m;
}

}  // namespace

Status SafetensorsFile::parse_header(std::string_view header, uint64_t data_bytes, const std::string& source,
                                     SafetensorsFile* out) {
  std::string duplicate;
  json j = parse_header_json(header, &duplicate);
  if (j.is_discarded()) return invalid_argument(source, ": header is not valid JSON");
  if (!j.is_object()) return invalid_argument(source, ": header must be a JSON object, got ", j.type_name());
  if (!duplicate.empty()) return invalid_argument(source, ": tensor '", duplicate, "' appears twice in the header");
  std::vector<SafetensorsEntry> entries;
  entries.reserve(j.size());
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      LATHE_TRY(parse_metadata(v, source, &out->metadata_));
      continue;
    }
    SafetensorsEntry e;
    LATHE_TRY(parse_entry(name, v, source, &e));
    entries.push_back(std::move(e));
  }
  // The tensors, in offset order, must tile [0, data_bytes) exactly.
  std::stable_sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin != pos) {
      return invalid_argument(source, ": tensor '", e.name, "' data_offsets [", e.begin, ", ", e.end, "] ",
                              e.begin < pos ? "overlap the previous tensor" : "leave a gap after the previous tensor",
                              " (expected to begin at ", pos, ")");
    }
    pos = e.end;
  }
  if (pos != data_bytes) {
    return invalid_argument(source, ": tensors cover ", pos, " bytes of the data section but it holds ", data_bytes,
                            pos > data_bytes ? " (offsets past the end of the file)" : " (trailing bytes)");
  }
  out->entries_ = std::move(entries);
  for (size_t i = 0; i < out->entries_.size(); ++i) out->by_name_[out->entries_[i].name] = i;
  return Status::ok();
}

Result<SafetensorsFile> SafetensorsFile::from_bytes(std::string_view bytes, const std::string& source_name) {
  if (bytes.size() < 8) {
    return invalid_argument(source_name, ": ", bytes.size(), " bytes is too short for a safetensors file (needs 8)");
  }
  uint64_t n = read_le64(bytes.data());
  if (n > kSafetensorsMaxHeaderBytes) {
    return invalid_argument(source_name, ": header length ", n, " exceeds the limit of ", kSafetensorsMaxHeaderBytes);
  }
  if (n > bytes.size() - 8) {
    return invalid_argument(source_name, ": header length ", n, " runs past the end of the file (",
                            bytes.size(), " bytes)");
  }
  SafetensorsFile f;
  f.path_ = source_name;
  f.data_ = bytes.data() + 8 + n;
  f.data_bytes_ = bytes.size() - 8 - n;
  LATHE_TRY(parse_header(bytes.substr(8, n), f.data_bytes_, source_name, &f));
  return f;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> m, map_file(path));
  std::string_view bytes(static_cast<const char*>(m->addr), m->len);
  LATHE_ASSIGN_OR_RETURN(SafetensorsFile f, from_bytes(bytes, path));
  f.mapping_ = std::move(m);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

Result<Tensor> SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) return not_found(path_, ": no tensor '", name, "'");
  const char* p = data_ + e->begin;
  // Writers that do not pad the header leave data misaligned for its
  // element type; such tensors are copied instead of aliased.
  size_t align = static_cast<size_t>(std::max(1, dtype_bits(e->dtype) / 8));
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    Tensor t = Tensor::empty(e->dtype, e->shape);
    if (e->end > e->begin) std::memcpy(t.raw(), p, e->end - e->begin);
    return t;
  }
  // The mapping is read-only: a tensor from a file must not be written to.
  return Tensor::wrap(const_cast<char*>(p), e->dtype, e->shape, mapping_);
}

// --- writing -----------------------------------------------------------------

namespace {

Status write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error(path, ": write: ", errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

Status fsync_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::ok();  // best effort: some filesystems refuse
  ::fsync(fd);
  ::close(fd);
  return Status::ok();
}

Result<std::string> build_header(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                 const std::map<std::string, std::string>& metadata, const std::string& path) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string, std::less<>> names;
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || name.empty()) return invalid_argument(path, ": invalid tensor name '", name, "'");
    if (!names.insert(name).second) return invalid_argument(path, ": tensor '", name, "' given twice");
    if (!t.defined()) return invalid_argument(path, ": tensor '", name, "' is undefined");
    if (!t.device().is_cpu()) return invalid_argument(path, ": tensor '", name, "' is not on the CPU");
    if (t.dtype() == DType::NF4) {
      return unsupported(path, ": tensor '", name, "': nf4 has no safetensors dtype; store its packed bytes as U8");
    }
    uint64_t n = static_cast<uint64_t>(t.nbytes());
    h[name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype()))},
               {"shape", t.shape().vec()},
               {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');  // data starts 8-aligned, as the reference pads
  return s;
}

}  // namespace

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::string header;
  try {
    LATHE_ASSIGN_OR_RETURN(header, build_header(tensors, metadata, path));
  } catch (const std::exception& e) {  // a metadata string that is not UTF-8
    return invalid_argument(path, ": cannot encode header: ", e.what());
  }
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(tmp, ": cannot create: ", errno_text());
  char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  Status s = write_all(fd, len, 8, tmp);
  if (s.is_ok()) s = write_all(fd, header.data(), header.size(), tmp);
  for (size_t i = 0; s.is_ok() && i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].second;
    s = write_all(fd, static_cast<const char*>(t.raw()), static_cast<size_t>(t.nbytes()), tmp);
  }
  if (s.is_ok() && ::fsync(fd) != 0) s = io_error(tmp, ": fsync: ", errno_text());
  if (::close(fd) != 0 && s.is_ok()) s = io_error(tmp, ": close: ", errno_text());
  if (s.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = io_error(path, ": rename: ", errno_text());
  if (!s.is_ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return fsync_dir(path);
}

}  // namespace lathe
