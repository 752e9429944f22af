// Value: construction, Python-compatible printing (str/repr, float repr),
// equality and ordering, and json.dumps as the template's tojson filter does it.
#include "io/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace lathe::jinja {

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t pos, std::string_view name) const {
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return pos < args.size() ? &args[pos] : nullptr;
}

const std::string& Value::empty_string() {
  static const std::string kEmpty;
  return kEmpty;
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::Float;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(ValueList items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::List;
  v.is_tuple_ = is_tuple;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::generator(ValueList items) {
  Value v = list(std::move(items));
  v.is_generator_ = true;
  return v;
}
Value Value::dict(ValueDict d) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::name_space(ValueDict d) {
  Value v = dict(std::move(d));
  v.kind_ = Kind::Namespace;
  return v;
}
Value Value::function(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::Callable;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const NativeFn>(std::move(fn));
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::Float: return f_;
    case Kind::Int: return static_cast<double>(i_);
    case Kind::Bool: return b_ ? 1.0 : 0.0;
    default: return 0.0;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0.0;
    case Kind::String: return !as_string().empty();
    case Kind::List: return is_generator_ || !list_->empty();
    case Kind::Dict: return !dict_->items.empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return is_generator_ ? "generator" : is_tuple_ ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "object";
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  int exp = std::atoi(sci.c_str() + e_pos + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

static std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  out += quote;
  return out;
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::String: return string_repr(as_string());
    case Kind::Namespace:
    case Kind::Callable:
    default: return str();
  }
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return float_repr(f_);
    case Kind::String: return as_string();
    case Kind::List: {
      if (is_generator_) return "<generator object>";
      std::string out = is_tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (is_tuple_ && list_->size() == 1) out += ",";
      return out + (is_tuple_ ? ")" : "]");
    }
    case Kind::Dict:
    case Kind::Namespace: {
      std::string out = kind_ == Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(k) + ": " + v.repr();
      }
      return out + (kind_ == Kind::Namespace ? "}>" : "}");
    }
    case Kind::Callable: return "<function " + as_string() + ">";
  }
  return "";
}

template <class Json>
static Value value_from_json(const Json& j, int depth) {
  using T = typename Json::value_t;
  if (depth > 512) return Value::none();
  switch (j.type()) {
    case T::boolean: return Value::boolean(j.template get<bool>());
    case T::number_integer: return Value::integer(j.template get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case T::number_float: return Value::number(j.template get<double>());
    case T::string: return Value::string(j.template get<std::string>());
    case T::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(value_from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case T::object: {
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), value_from_json(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default: return Value::none();
  }
}

Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j, 0); }
Value Value::from_json(const nlohmann::json& j) { return value_from_json(j, 0); }

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.as_string() == b.as_string();
    case Kind::List: {
      if (a.is_tuple() != b.is_tuple() || a.as_list().size() != b.as_list().size()) return false;
      for (size_t i = 0; i < a.as_list().size(); ++i)
        if (!equals(a.as_list()[i], b.as_list()[i])) return false;
      return true;
    }
    case Kind::Dict: {
      const auto& da = a.as_dict();
      const auto& db = b.as_dict();
      if (da.items.size() != db.items.size()) return false;
      for (const auto& [k, v] : da.items) {
        const Value* o = db.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace: return &a.namespace_dict() == &b.namespace_dict();
    case Kind::Callable: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

Result<bool> less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& la = a.as_list();
    const auto& lb = b.as_list();
    for (size_t i = 0; i < la.size() && i < lb.size(); ++i) {
      if (equals(la[i], lb[i])) continue;
      return less_than(la[i], lb[i]);
    }
    return la.size() < lb.size();
  }
  return invalid_argument("'<' not supported between instances of '", a.type_name(), "' and '",
                          b.type_name(), "'");
}

// Decodes one UTF-8 sequence at s[i]; returns its byte length (1 for bad bytes).
static size_t utf8_seq_len(std::string_view s, size_t i, uint32_t* cp) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    *cp = c;
    return 1;
  }
  uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) {
    unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc >> 6) != 0x2) {
      *cp = c;
      return 1;
    }
    v = (v << 6) | (cc & 0x3f);
  }
  *cp = v;
  return n;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_seq_len(s, i, &cp);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t count = 0;
  uint32_t cp;
  for (size_t i = 0; i < s.size(); i += utf8_seq_len(s, i, &cp)) ++count;
  return count;
}

static void json_string(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char b[16];
    if (c == '"') *out += "\\\"";
    else if (c == '\\') *out += "\\\\";
    else if (c == '\n') *out += "\\n";
    else if (c == '\r') *out += "\\r";
    else if (c == '\t') *out += "\\t";
    else if (c == '\b') *out += "\\b";
    else if (c == '\f') *out += "\\f";
    else if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      *out += b;
    } else if (c >= 0x80 && ensure_ascii) {
      uint32_t cp;
      size_t n = utf8_seq_len(s, i, &cp);
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      *out += b;
      i += n;
      continue;
    } else *out += static_cast<char>(c);
    ++i;
  }
  *out += '"';
}

static Status json_encode(const Value& v, const JsonOptions& opt, int level, std::string* out) {
  if (level > 256) return invalid_argument("tojson: value nested too deeply");
  bool pretty = opt.indent >= 0 || !opt.indent_str.empty();
  std::string unit = opt.indent_str.empty() ? std::string(static_cast<size_t>(std::max(opt.indent, 0)), ' ')
                                            : opt.indent_str;
  auto newline = [&](int lvl) {
    *out += '\n';
    for (int i = 0; i < lvl; ++i) *out += unit;
  };
  switch (v.kind()) {
    case Kind::None: *out += "null"; return Status::ok();
    case Kind::Bool: *out += v.as_bool() ? "true" : "false"; return Status::ok();
    case Kind::Int: *out += std::to_string(v.as_int()); return Status::ok();
    case Kind::Float: {
      double f = v.as_double();
      *out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f < 0 ? "-Infinity" : "Infinity") : float_repr(f);
      return Status::ok();
    }
    case Kind::String: json_string(v.as_string(), opt.ensure_ascii, out); return Status::ok();
    case Kind::List: {
      if (v.is_generator()) return invalid_argument("tojson: Object of type generator is not JSON serializable");
      if (v.as_list().empty()) {
        *out += "[]";
        return Status::ok();
      }
      *out += '[';
      if (pretty) newline(level + 1);
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) {
          *out += opt.item_sep;
          if (pretty) newline(level + 1);
        }
        first = false;
        LATHE_TRY(json_encode(e, opt, level + 1, out));
      }
      if (pretty) newline(level);
      *out += ']';
      return Status::ok();
    }
    case Kind::Dict: {
      if (v.as_dict().items.empty()) {
        *out += "{}";
        return Status::ok();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      *out += '{';
      if (pretty) newline(level + 1);
      bool first = true;
      for (const auto* kv : items) {
        if (!first) {
          *out += opt.item_sep;
          if (pretty) newline(level + 1);
        }
        first = false;
        json_string(kv->first, opt.ensure_ascii, out);
        *out += opt.key_sep;
        LATHE_TRY(json_encode(kv->second, opt, level + 1, out));
      }
      if (pretty) newline(level);
      *out += '}';
      return Status::ok();
    }
    default:
      return invalid_argument("tojson: Object of type ", v.type_name(), " is not JSON serializable");
  }
}

Result<std::string> to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  LATHE_TRY(json_encode(v, opt, 0, &out));
  return out;
}

}  // namespace lathe::jinja
