// Attribute and item access, Python str/dict/list methods, iteration and the
// global functions of a chat template. Lookups follow jinja2's sandboxed
// environment: `x.name` prefers a method of x's type, then a dict item;
// `x[key]` prefers the item. Methods that would mutate a list or dict exist
// but fail when called, as they do under the immutable sandbox transformers
// renders with. Strings are indexed by code point, as in Python.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>

#include "io/jinja_eval.h"

namespace lathe::jinja {
namespace {

uint32_t decode_cp(std::string_view c) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(c[i])); };
  if (c.size() == 1) return b(0);
  if (c.size() == 2) return ((b(0) & 0x1f) << 6) | (b(1) & 0x3f);
  if (c.size() == 3) return ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f);
}

bool is_py_space(std::string_view c) {
  uint32_t cp = decode_cp(c);
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

std::string object_repr(const Value& obj) {
  if (obj.is_none()) return "None";
  return std::string(obj.type_name()) + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  std::string msg(1, '\'');
  msg += object_repr(obj);
  msg += "' has no attribute '";
  msg += name;
  msg += '\'';
  return Value::undefined(std::move(msg));
}

Value missing_element(const Value& obj, const Value& key) {
  std::string msg(1, '\'');
  msg += object_repr(obj);
  msg += "' has no element ";
  msg += key.repr();
  return Value::undefined(std::move(msg));
}

Value unsafe_method(const Value& obj, const std::string& name) {
  std::string msg = "access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe";
  return Value::function(name, [msg](const CallArgs&) -> Result<Value> { return invalid_argument(msg); });
}

// A method bound to `self`.
template <class F>
Value bound(const Value& self, const std::string& name, F f) {
  return Value::function(name, [self, f](const CallArgs& a) -> Result<Value> { return f(self, a); });
}

Result<std::string> str_arg(const CallArgs& a, size_t pos, const char* name, const char* method) {
  const Value* v = a.get(pos, name);
  if (!v || !v->is_string())
    return invalid_argument(method, "() argument ", pos + 1, " must be str, not ", v ? v->type_name() : "missing");
  return v->as_string();
}

int64_t int_arg(const CallArgs& a, size_t pos, const char* name, int64_t def) {
  const Value* v = a.get(pos, name);
  return v && (v->is_int() || v->is_bool()) ? v->as_int() : def;
}

std::vector<std::string> split_ws(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> out;
  auto chars = utf8_chars(s);
  size_t i = 0;
  while (i < chars.size()) {
    while (i < chars.size() && is_py_space(chars[i])) ++i;
    if (i >= chars.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      std::string rest;
      for (size_t k = i; k < chars.size(); ++k) rest += chars[k];
      size_t n = rest.size();
      auto rc = utf8_chars(rest);
      while (!rc.empty() && is_py_space(rc.back())) {
        n -= rc.back().size();
        rc.pop_back();
      }
      out.push_back(rest.substr(0, n));
      return out;
    }
    std::string word;
    while (i < chars.size() && !is_py_space(chars[i])) word += chars[i++];
    out.push_back(std::move(word));
  }
  return out;
}

Result<Value> str_split(const std::string& s, const CallArgs& a, bool from_right) {
  const Value* sep = a.get(0, "sep");
  int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
  std::vector<std::string> parts;
  if (!sep || sep->is_none()) {
    parts = split_ws(s, from_right ? -1 : maxsplit);
  } else {
    if (!sep->is_string()) return invalid_argument("must be str or None, not ", sep->type_name());
    const std::string& d = sep->as_string();
    if (d.empty()) return invalid_argument("empty separator");
    if (!from_right) {
      size_t start = 0, hit;
      while ((maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) &&
             (hit = s.find(d, start)) != std::string::npos) {
        parts.push_back(s.substr(start, hit - start));
        start = hit + d.size();
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
        if (end < d.size()) break;
        size_t hit = s.rfind(d, end - d.size());
        if (hit == std::string::npos) break;
        rev.push_back(s.substr(hit + d.size(), end - hit - d.size()));
        end = hit;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  ValueList out;
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::list(std::move(out));
}

Result<Value> str_affix(const std::string& s, const CallArgs& a, bool prefix) {
  const Value* p = a.get(0, prefix ? "prefix" : "suffix");
  if (!p) return invalid_argument(prefix ? "startswith" : "endswith", "() takes at least 1 argument");
  std::vector<std::string> options;
  if (p->is_string()) options.push_back(p->as_string());
  else if (p->is_list())
    for (const Value& v : p->as_list()) {
      if (!v.is_string()) return invalid_argument("tuple for startswith/endswith must only contain str");
      options.push_back(v.as_string());
    }
  else return invalid_argument(prefix ? "startswith" : "endswith", " first arg must be str or a tuple of str");
  for (const std::string& o : options) {
    if (o.size() > s.size()) continue;
    if (prefix ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)
      return Value::boolean(true);
  }
  return Value::boolean(false);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    auto chars = utf8_chars(s);
    int64_t n = 0;
    for (size_t i = 0; i <= chars.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < chars.size()) out += chars[i];
    }
    return out;
  }
  size_t start = 0, hit;
  int64_t n = 0;
  while ((count < 0 || n < count) && (hit = s.find(old, start)) != std::string::npos) {
    out.append(s, start, hit - start);
    out += repl;
    start = hit + old.size();
    ++n;
  }
  out.append(s, start);
  return out;
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alpha) c = prev_cased ? static_cast<char>(std::tolower(c)) : static_cast<char>(std::toupper(c));
    prev_cased = alpha;
  }
  return out;
}

// str.format with "{}", "{0}", "{name}" fields and "{{" / "}}" escapes.
Result<Value> str_format(const std::string& s, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '}' && i + 1 < s.size() && s[i + 1] == '}') { out += '}'; ++i; continue; }
    if (c != '{') { out += c; continue; }
    if (i + 1 < s.size() && s[i + 1] == '{') { out += '{'; ++i; continue; }
    size_t close = s.find('}', i);
    if (close == std::string::npos) return invalid_argument("Single '{' encountered in format string");
    std::string field = s.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) return unsupported("format specs in str.format are not supported");
    const Value* v = nullptr;
    if (field.empty()) v = auto_idx < a.args.size() ? &a.args[auto_idx++] : nullptr;
    else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      size_t idx = std::strtoul(field.c_str(), nullptr, 10);
      v = idx < a.args.size() ? &a.args[idx] : nullptr;
    } else {
      for (const auto& [k, x] : a.kwargs) if (k == field) v = &x;
    }
    if (!v) return invalid_argument("format: no value for field '{", field, "}'");
    out += v->str();
    i = close;
  }
  return Value::string(std::move(out));
}

Value string_query_method(const Value& self, const std::string& name);

// str methods that transform: strip family, split, affixes, case, replace.
Value string_method(const Value& self, const std::string& name) {
  using A = const CallArgs&;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return bound(self, name, [l, r](const Value& v, A a) -> Result<Value> {
      return Value::string(py_strip(v.as_string(), a.get(0, "chars"), l, r));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return bound(self, name, [right](const Value& v, A a) { return str_split(v.as_string(), a, right); });
  }
  if (name == "startswith" || name == "endswith") {
    bool pre = name == "startswith";
    return bound(self, name, [pre](const Value& v, A a) { return str_affix(v.as_string(), a, pre); });
  }
  if (name == "upper") return bound(self, name, [](const Value& v, A) -> Result<Value> { return Value::string(ascii_upper(v.as_string())); });
  if (name == "lower") return bound(self, name, [](const Value& v, A) -> Result<Value> { return Value::string(ascii_lower(v.as_string())); });
  if (name == "title") return bound(self, name, [](const Value& v, A) -> Result<Value> { return Value::string(py_title(v.as_string())); });
  if (name == "capitalize")
    return bound(self, name, [](const Value& v, A) -> Result<Value> {
      std::string t = ascii_lower(v.as_string());
      if (!t.empty()) t[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(t[0])));
      return Value::string(t);
    });
  if (name == "replace")
    return bound(self, name, [](const Value& v, A a) -> Result<Value> {
      LATHE_ASSIGN_OR_RETURN(std::string old, str_arg(a, 0, "old", "replace"));
      LATHE_ASSIGN_OR_RETURN(std::string repl, str_arg(a, 1, "new", "replace"));
      return Value::string(py_replace(v.as_string(), old, repl, int_arg(a, 2, "count", -1)));
    });
  return string_query_method(self, name);
}

// str methods that search or test: find/count/index, join, splitlines,
// removeprefix/removesuffix, format, is*().
Value string_query_method(const Value& self, const std::string& name) {
  using A = const CallArgs&;
  if (name == "find" || name == "rfind" || name == "count" || name == "index")
    return bound(self, name, [name](const Value& v, A a) -> Result<Value> {
      LATHE_ASSIGN_OR_RETURN(std::string sub, str_arg(a, 0, "sub", name.c_str()));
      const std::string& str = v.as_string();
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(str) + 1));
        int64_t n = 0;
        for (size_t p = str.find(sub); p != std::string::npos; p = str.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
      }
      size_t p = name == "rfind" ? str.rfind(sub) : str.find(sub);
      if (p == std::string::npos) {
        if (name == "index") return invalid_argument("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(utf8_length(std::string_view(str).substr(0, p))));
    });
  if (name == "join")
    return bound(self, name, [](const Value& v, A a) -> Result<Value> {
      if (a.args.empty()) return invalid_argument("join() takes exactly one argument");
      LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(a.args[0]));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) return invalid_argument("sequence item ", i, ": expected str instance, ", items[i].type_name(), " found");
        if (i) out += v.as_string();
        out += items[i].as_string();
      }
      return Value::string(std::move(out));
    });
  if (name == "splitlines")
    return bound(self, name, [](const Value& v, A) -> Result<Value> {
      ValueList out;
      const std::string& str = v.as_string();
      size_t start = 0;
      for (size_t i = 0; i < str.size(); ++i) {
        char c = str[i];
        if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
          out.push_back(Value::string(str.substr(start, i - start)));
          if (c == '\r' && i + 1 < str.size() && str[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < str.size()) out.push_back(Value::string(str.substr(start)));
      return Value::list(std::move(out));
    });
  if (name == "removeprefix" || name == "removesuffix") {
    bool pre = name == "removeprefix";
    return bound(self, name, [pre](const Value& v, A a) -> Result<Value> {
      LATHE_ASSIGN_OR_RETURN(std::string x, str_arg(a, 0, pre ? "prefix" : "suffix", "remove"));
      const std::string& str = v.as_string();
      if (x.size() <= str.size() && (pre ? str.compare(0, x.size(), x) == 0 : str.compare(str.size() - x.size(), x.size(), x) == 0))
        return Value::string(pre ? str.substr(x.size()) : str.substr(0, str.size() - x.size()));
      return v;
    });
  }
  if (name == "format") return bound(self, name, [](const Value& v, A a) { return str_format(v.as_string(), a); });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper")
    return bound(self, name, [name](const Value& v, A) -> Result<Value> {
      const std::string& str = v.as_string();
      if (str.empty()) return Value::boolean(false);
      bool any_cased = false, ok = true;
      for (unsigned char c : str) {
        if (name == "isdigit") ok = ok && std::isdigit(c);
        else if (name == "isalpha") ok = ok && (std::isalpha(c) || c >= 0x80);
        else if (name == "isalnum") ok = ok && (std::isalnum(c) || c >= 0x80);
        else if (name == "isspace") ok = ok && std::isspace(c);
        else if (name == "islower") { ok = ok && !std::isupper(c); any_cased = any_cased || std::islower(c); }
        else { ok = ok && !std::islower(c); any_cased = any_cased || std::isupper(c); }
      }
      if (name == "islower" || name == "isupper") ok = ok && any_cased;
      return Value::boolean(ok);
    });
  return missing_attr(self, name);
}

bool is_dict_method_name(const std::string& n) {
  static const char* const kNames[] = {"items", "keys", "values", "get", "copy", "update", "pop", "popitem",
                                       "setdefault", "clear"};
  for (const char* k : kNames)
    if (n[0] == k[0] && n == k) return true;
  return false;
}

Value dict_method(const Value& self, const std::string& name) {
  using A = const CallArgs&;
  if (name.empty() || !is_dict_method_name(name)) return Value::undefined();
  if (name == "items")
    return bound(self, name, [](const Value& v, A) -> Result<Value> {
      ValueList out;
      for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::list({Value::string(k), x}, true));
      return Value::list(std::move(out));
    });
  if (name == "keys" || name == "values") {
    bool keys = name == "keys";
    return bound(self, name, [keys](const Value& v, A) -> Result<Value> {
      ValueList out;
      for (const auto& [k, x] : v.as_dict().items) out.push_back(keys ? Value::string(k) : x);
      return Value::list(std::move(out));
    });
  }
  if (name == "get")
    return bound(self, name, [](const Value& v, A a) -> Result<Value> {
      if (a.args.empty()) return invalid_argument("get expected at least 1 argument, got 0");
      const Value* def = a.get(1, "default");
      if (a.args[0].is_string())
        if (const Value* x = v.as_dict().find(a.args[0].as_string())) return *x;
      return def ? *def : Value::none();
    });
  if (name == "copy") return bound(self, name, [](const Value& v, A) -> Result<Value> { return Value::dict(v.as_dict()); });
  if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" || name == "clear")
    return unsafe_method(self, name);
  return Value::undefined();
}

Value list_method(const Value& self, const std::string& name) {
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
      name == "sort" || name == "reverse" || name == "clear")
    return unsafe_method(self, name);
  if (name == "index" || name == "count")
    return bound(self, name, [name](const Value& v, const CallArgs& a) -> Result<Value> {
      if (a.args.empty()) return invalid_argument(name, "() takes exactly one argument");
      int64_t n = 0;
      for (size_t i = 0; i < v.as_list().size(); ++i) {
        if (!equals(v.as_list()[i], a.args[0])) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") return invalid_argument(a.args[0].repr(), " is not in list");
      return Value::integer(n);
    });
  return missing_attr(self, name);
}

Result<ValueDict> dict_from_args(const CallArgs& a, const char* fn) {
  ValueDict d;
  if (a.args.size() > 1) return invalid_argument(fn, " expected at most 1 argument, got ", a.args.size());
  if (!a.args.empty()) {
    const Value& src = a.args[0];
    if (src.is_dict() || src.is_namespace()) {
      d = src.is_dict() ? src.as_dict() : src.namespace_dict();
    } else {
      LATHE_ASSIGN_OR_RETURN(ValueList pairs, iterate(src));
      for (const Value& p : pairs) {
        if (!p.is_list() || p.as_list().size() != 2 || !p.as_list()[0].is_string())
          return invalid_argument(fn, ": each element must be a (str, value) pair");
        d.set(p.as_list()[0].as_string(), p.as_list()[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kwargs) d.set(k, v);
  return d;
}

}  // namespace

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cs = utf8_chars(s);
  std::vector<std::string_view> set;
  bool ws = !chars || !chars->is_string();
  if (!ws) set = utf8_chars(chars->as_string());
  auto strip_it = [&](std::string_view c) {
    return ws ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strip_it(cs[b])) ++b;
  if (right)
    while (e > b && strip_it(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

Status undefined_error(const Value& v) {
  return invalid_argument(v.name().empty() ? std::string("value is undefined") : v.name());
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::Dict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return missing_attr(obj, name);
    }
    case Kind::Namespace: {
      if (const Value* v = obj.namespace_dict().find(name)) return *v;
      return missing_attr(obj, name);
    }
    case Kind::String: return string_method(obj, name);
    case Kind::List: return list_method(obj, name);
    default: return missing_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      auto chars = utf8_chars(obj.as_string());
      int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(std::string(chars[static_cast<size_t>(i)]));
    }
    return missing_element(obj, key);
  }
  if (key.is_string()) {
    Value v = get_attr(obj, key.as_string());
    return v;
  }
  return missing_element(obj, key);
}

Result<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  for (const Value* p : {&start, &stop, &step})
    if (!p->is_none() && !p->is_int() && !p->is_bool()) return Value::undefined("slice indices must be integers or None");
  if (obj.is_dict()) return invalid_argument("unhashable type: 'slice'");
  if (!obj.is_list() && !obj.is_string()) return missing_attr(obj, "__getitem__");
  int64_t st = step.is_none() ? 1 : step.as_int();
  if (st == 0) return invalid_argument("slice step cannot be zero");
  std::vector<std::string_view> chars;
  if (obj.is_string()) chars = utf8_chars(obj.as_string());
  int64_t n = obj.is_list() ? static_cast<int64_t>(obj.as_list().size()) : static_cast<int64_t>(chars.size());
  auto adjust = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  int64_t b = adjust(start, st < 0 ? n - 1 : 0);
  int64_t e = adjust(stop, st < 0 ? -1 : n);
  ValueList items;
  std::string text;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_list()) items.push_back(obj.as_list()[static_cast<size_t>(i)]);
    else text += chars[static_cast<size_t>(i)];
  }
  if (obj.is_string()) return Value::string(std::move(text));
  return Value::list(std::move(items), obj.is_tuple());
}

Result<ValueList> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return ValueList{};
    case Kind::List: return v.as_list();
    case Kind::Dict: {
      ValueList keys;
      for (const auto& [k, x] : v.as_dict().items) keys.push_back(Value::string(k));
      return keys;
    }
    case Kind::String: {
      ValueList chars;
      for (std::string_view c : utf8_chars(v.as_string())) chars.push_back(Value::string(std::string(c)));
      return chars;
    }
    default: return invalid_argument("'", v.type_name(), "' object is not iterable");
  }
}

void add_globals(Runtime& rt, ValueDict* g) {
  g->set("range", Value::function("range", [&rt](const CallArgs& a) -> Result<Value> {
    int64_t v[3] = {0, 0, 1};
    if (a.args.empty() || a.args.size() > 3) return invalid_argument("range expected 1 to 3 arguments");
    for (const Value& x : a.args)
      if (!x.is_int() && !x.is_bool()) return invalid_argument("'", x.type_name(), "' object cannot be interpreted as an integer");
    if (a.args.size() == 1) v[1] = a.args[0].as_int();
    else for (size_t i = 0; i < a.args.size(); ++i) v[i] = a.args[i].as_int();
    if (v[2] == 0) return invalid_argument("range() arg 3 must not be zero");
    double count = std::max(0.0, std::ceil((static_cast<double>(v[1]) - static_cast<double>(v[0])) / static_cast<double>(v[2])));
    if (count > 100000) return invalid_argument("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    LATHE_TRY(rt.step(static_cast<int64_t>(count)));
    ValueList out;
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) out.push_back(Value::integer(i));
    return Value::list(std::move(out));
  }));
  g->set("dict", Value::function("dict", [](const CallArgs& a) -> Result<Value> {
    LATHE_ASSIGN_OR_RETURN(ValueDict d, dict_from_args(a, "dict"));
    return Value::dict(std::move(d));
  }));
  g->set("namespace", Value::function("namespace", [&rt](const CallArgs& a) -> Result<Value> {
    LATHE_ASSIGN_OR_RETURN(ValueDict d, dict_from_args(a, "namespace"));
    for (const auto& [k, v] : d.items)
      if (!k.empty() && k[0] == '_')
        return invalid_argument("chat templates cannot store underscore-prefixed attributes on a namespace, but got '", k, "'");
    Value ns = Value::name_space(std::move(d));
    rt.adopt_namespace(ns);
    return ns;
  }));
  g->set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Result<Value> {
    const Value* m = a.get(0, "message");
    return invalid_argument(kRaisedMarker, m ? m->str() : std::string());
  }));
  g->set("strftime_now", Value::function("strftime_now", [&rt](const CallArgs& a) -> Result<Value> {
    const Value* f = a.get(0, "format");
    if (!f || !f->is_string()) return invalid_argument("strftime_now() argument must be str");
    std::time_t t = rt.options().now ? rt.options().now() : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    if (f->as_string().empty()) return Value::string("");
    for (size_t cap = 256; cap <= (size_t{1} << 20); cap *= 4) {
      std::string buf(cap, '\0');
      size_t n = std::strftime(buf.data(), cap, f->as_string().c_str(), &tm);
      if (n > 0) return Value::string(buf.substr(0, n));
    }
    return Value::string("");
  }));
}

}  // namespace lathe::jinja
