// Jinja filters and tests, one small function each, looked up by name in two
// tables. Each follows its jinja2 counterpart's signature (positional and
// keyword arguments) and result type; tojson is transformers' override
// (json.dumps with ensure_ascii=False and optional indent/separators/sort_keys).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "io/jinja_eval.h"

namespace lathe::jinja {
namespace {

using A = const CallArgs&;
using FilterFn = Result<Value> (*)(Runtime&, const Value&, A);
using TestFn = Result<bool> (*)(Runtime&, const Value&, A);

bool arg_true(A a, size_t pos, const char* name, bool def = false) {
  const Value* v = a.get(pos, name);
  return v ? v->truthy() : def;
}

// "a.b.0"-style lookups, as jinja's make_attrgetter does.
Value attr_path(const Value& item, const Value& path) {
  if (!path.is_string()) return get_item(item, path);
  Value cur = item;
  const std::string& p = path.as_string();
  size_t start = 0;
  while (true) {
    size_t dot = p.find('.', start);
    std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) && part.size() < 18;
    cur = digits ? get_item(cur, Value::integer(std::stoll(part))) : get_item(cur, Value::string(part));
    if (dot == std::string::npos || cur.is_undefined()) return cur;
    start = dot + 1;
  }
}

Value fold_case(const Value& v, bool case_sensitive) {
  return v.is_string() && !case_sensitive ? Value::string(ascii_lower(v.as_string())) : v;
}

// Sorts with Python's sorted(): stable, by less_than, errors propagate.
Status py_sort(std::vector<std::pair<Value, Value>>* keyed, bool reverse) {
  Status err;
  std::stable_sort(keyed->begin(), keyed->end(), [&](const auto& x, const auto& y) {
    if (!err.is_ok()) return false;
    Result<bool> r = reverse ? less_than(y.first, x.first) : less_than(x.first, y.first);
    if (!r.is_ok()) {
      err = r.status();
      return false;
    }
    return *r;
  });
  return err;
}

Result<Value> f_tojson(Runtime&, const Value& v, A a) {
  JsonOptions opt;
  opt.ensure_ascii = arg_true(a, 0, "ensure_ascii");
  const Value* indent = a.get(1, "indent");
  if (indent && (indent->is_int() || indent->is_bool())) opt.indent = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64));
  else if (indent && indent->is_string()) opt.indent_str = indent->as_string();
  else if (indent && !indent->is_none()) return invalid_argument("tojson: indent must be an int or a string");
  bool pretty = opt.indent >= 0 || (indent && indent->is_string());
  if (pretty && opt.indent_str.empty() && opt.indent < 0) opt.indent = 0;
  if (pretty && opt.indent_str.empty() && indent->is_string()) opt.indent = 0;
  opt.item_sep = pretty ? "," : ", ";
  if (const Value* sep = a.get(2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->as_list().size() != 2 || !sep->as_list()[0].is_string() || !sep->as_list()[1].is_string())
      return invalid_argument("tojson: separators must be a pair of strings");
    opt.item_sep = sep->as_list()[0].as_string();
    opt.key_sep = sep->as_list()[1].as_string();
  }
  opt.sort_keys = arg_true(a, 3, "sort_keys");
  LATHE_ASSIGN_OR_RETURN(std::string s, to_json(v, opt));
  return Value::string(std::move(s));
}

Result<Value> f_trim(Runtime&, const Value& v, A a) { return Value::string(py_strip(v.str(), a.get(0, "chars"), true, true)); }
Result<Value> f_upper(Runtime&, const Value& v, A) { return Value::string(ascii_upper(v.str())); }
Result<Value> f_lower(Runtime&, const Value& v, A) { return Value::string(ascii_lower(v.str())); }
Result<Value> f_string(Runtime&, const Value& v, A) { return Value::string(v.str()); }
Result<Value> f_safe(Runtime&, const Value& v, A) { return v.is_string() ? v : Value::string(v.str()); }
Result<Value> f_capitalize(Runtime&, const Value& v, A) {
  std::string s = ascii_lower(v.str());
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return Value::string(std::move(s));
}
// jinja2's title filter: words start after whitespace or one of "-({[<";
// the first character of each word is upper-cased, the rest lower-cased.
Result<Value> f_title(Runtime&, const Value& v, A) {
  std::string s = v.str();
  bool word_start = true;
  for (char& c : s) {
    bool sep = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '-' || c == '(' ||
               c == '{' || c == '[' || c == '<';
    if (sep) {
      word_start = true;
      continue;
    }
    c = static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    word_start = false;
  }
  return Value::string(std::move(s));
}

Result<Value> f_length(Runtime&, const Value& v, A) {
  switch (v.kind()) {
    case Kind::Undefined: return Value::integer(0);
    case Kind::String: return Value::integer(static_cast<int64_t>(utf8_length(v.as_string())));
    case Kind::List:
      if (v.is_generator()) return invalid_argument("object of type 'generator' has no len()");
      return Value::integer(static_cast<int64_t>(v.as_list().size()));
    case Kind::Dict: return Value::integer(static_cast<int64_t>(v.as_dict().items.size()));
    default: return invalid_argument("object of type '", v.type_name(), "' has no len()");
  }
}

// Python int(str): optional sign, digits with single underscores, spaces around.
bool parse_py_int(const std::string& s, int64_t* out) {
  std::string t = py_strip(s, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  if (i >= t.size()) return false;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    if (t[i] == '_' && prev_digit && i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
      prev_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) return false;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, t[i] - '0', &v)) return false;
    prev_digit = true;
  }
  *out = neg ? -v : v;
  return true;
}

bool parse_py_float(const std::string& s, double* out) {
  std::string t = py_strip(s, nullptr, true, true);
  std::string clean;
  for (char c : t)
    if (c != '_') clean += c;
  if (clean.empty()) return false;
  std::string low = ascii_lower(clean);
  if (low.find("0x") != std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size();
}

Result<Value> f_int(Runtime&, const Value& v, A a) {
  const Value* def = a.get(0, "default");
  Value d = def ? *def : Value::integer(0);
  if (v.is_undefined()) return undefined_error(v);
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) return std::isfinite(v.as_double()) ? Value::integer(static_cast<int64_t>(v.as_double())) : d;
  if (v.is_string()) {
    int64_t i;
    if (parse_py_int(v.as_string(), &i)) return Value::integer(i);
    double f;
    if (parse_py_float(v.as_string(), &f) && std::isfinite(f) && std::fabs(f) < 9e18) return Value::integer(static_cast<int64_t>(f));
  }
  return d;
}

Result<Value> f_float(Runtime&, const Value& v, A a) {
  const Value* def = a.get(0, "default");
  if (v.is_number()) return Value::number(v.as_double());
  double f;
  if (v.is_string() && parse_py_float(v.as_string(), &f)) return Value::number(f);
  return def ? *def : Value::number(0.0);
}

Result<Value> f_list(Runtime&, const Value& v, A) {
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  return Value::list(std::move(items));
}

Result<Value> f_join(Runtime&, const Value& v, A a) {
  const Value* d = a.get(0, "d");
  const Value* attr = a.get(1, "attribute");
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i && d) out += d->str();
    out += (attr ? attr_path(items[i], *attr) : items[i]).str();
  }
  return Value::string(std::move(out));
}

Result<Value> f_default(Runtime&, const Value& v, A a) {
  const Value* d = a.get(0, "default_value");
  bool boolean = arg_true(a, 1, "boolean");
  if (v.is_undefined() || (boolean && !v.truthy())) return d ? *d : Value::string("");
  return v;
}

Result<Value> f_first(Runtime&, const Value& v, A) {
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}
Result<Value> f_last(Runtime&, const Value& v, A) {
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Result<Value> f_items(Runtime&, const Value& v, A) {
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) return invalid_argument("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::list({Value::string(k), x}, true));
  return Value::generator(std::move(out));
}

// select / reject / selectattr / rejectattr share one body.
Result<Value> select_impl(Runtime& rt, const Value& v, A a, bool by_attr, bool keep) {
  if (!v.truthy()) return Value::generator({});  // jinja2 skips falsy inputs (None, 0, "")
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  size_t first_test = by_attr ? 1 : 0;
  const Value* attr = by_attr ? a.get(0, "attribute") : nullptr;
  if (by_attr && !attr) return invalid_argument("Missing parameter for attribute name");
  CallArgs test_args;
  for (size_t i = first_test + 1; i < a.args.size(); ++i) test_args.args.push_back(a.args[i]);
  ValueList out;
  for (const Value& item : items) {
    LATHE_TRY(rt.step(1));
    Value x = attr ? attr_path(item, *attr) : item;
    bool t;
    if (a.args.size() > first_test) {
      if (!a.args[first_test].is_string()) return invalid_argument("test name must be a string");
      LATHE_ASSIGN_OR_RETURN(t, apply_test(rt, a.args[first_test].as_string(), x, test_args));
    } else {
      t = x.truthy();
    }
    if (t == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}
Result<Value> f_select(Runtime& rt, const Value& v, A a) { return select_impl(rt, v, a, false, true); }
Result<Value> f_reject(Runtime& rt, const Value& v, A a) { return select_impl(rt, v, a, false, false); }
Result<Value> f_selectattr(Runtime& rt, const Value& v, A a) { return select_impl(rt, v, a, true, true); }
Result<Value> f_rejectattr(Runtime& rt, const Value& v, A a) { return select_impl(rt, v, a, true, false); }

Result<Value> f_map(Runtime& rt, const Value& v, A a) {
  if (!v.truthy()) return Value::generator({});  // jinja2 skips falsy inputs (None, 0, "")
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  ValueList out;
  const Value* attr = nullptr;
  for (const auto& [k, x] : a.kwargs)
    if (k == "attribute") attr = &x;
  const Value* def = nullptr;
  for (const auto& [k, x] : a.kwargs)
    if (k == "default") def = &x;
  if (!attr && (a.args.empty() || !a.args[0].is_string())) return invalid_argument("map requires a filter name or attribute=");
  CallArgs fargs;
  for (size_t i = 1; i < a.args.size(); ++i) fargs.args.push_back(a.args[i]);
  for (const Value& item : items) {
    LATHE_TRY(rt.step(1));
    if (attr) {
      Value x = attr_path(item, *attr);
      out.push_back(x.is_undefined() && def ? *def : x);
    } else {
      LATHE_ASSIGN_OR_RETURN(Value x, apply_filter(rt, a.args[0].as_string(), item, fargs));
      out.push_back(std::move(x));
    }
  }
  return Value::generator(std::move(out));
}

Result<Value> f_replace(Runtime&, const Value& v, A a) {
  const Value* old = a.get(0, "old");
  const Value* repl = a.get(1, "new");
  const Value* count = a.get(2, "count");
  if (!old || !repl) return invalid_argument("replace() needs old and new");
  CallArgs m;
  m.args = {Value::string(old->str()), Value::string(repl->str())};
  if (count && !count->is_none()) m.args.push_back(*count);
  return get_attr(Value::string(v.str()), "replace").as_function()(m);
}

Result<Value> f_round(Runtime&, const Value& v, A a) {
  int64_t precision = 0;
  if (const Value* p = a.get(0, "precision"); p && (p->is_int() || p->is_bool())) precision = p->as_int();
  const Value* m = a.get(1, "method");
  std::string method = m && m->is_string() ? m->as_string() : "common";
  if (!v.is_number()) return invalid_argument("round: expected a number, got ", v.type_name());
  precision = std::clamp<int64_t>(precision, -308, 308);
  double x = v.as_double();
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());
    if (precision < 0 || !std::isfinite(x)) {
      double s = std::pow(10.0, static_cast<double>(-precision));
      return Value::number(std::nearbyint(x / s) * s);
    }
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
    return Value::number(std::strtod(buf, nullptr));
  }
  if (method != "ceil" && method != "floor") return invalid_argument("method must be common, ceil or floor");
  double s = std::pow(10.0, static_cast<double>(precision));
  return Value::number((method == "ceil" ? std::ceil(x * s) : std::floor(x * s)) / s);
}

Result<Value> f_abs(Runtime&, const Value& v, A) {
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  return invalid_argument("bad operand type for abs(): '", v.type_name(), "'");
}

Result<Value> f_unique(Runtime& rt, const Value& v, A a) {
  bool cs = arg_true(a, 0, "case_sensitive");
  const Value* attr = a.get(1, "attribute");
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  ValueList out, seen;
  for (const Value& item : items) {
    LATHE_TRY(rt.step(static_cast<int64_t>(seen.size()) + 1));
    Value key = fold_case(attr ? attr_path(item, *attr) : item, cs);
    bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); });
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Result<Value> f_dictsort(Runtime&, const Value& v, A a) {
  if (!v.is_dict()) return invalid_argument("dictsort: expected a dict, got ", v.type_name());
  bool cs = arg_true(a, 0, "case_sensitive");
  const Value* by = a.get(1, "by");
  bool by_value = by && by->is_string() && by->as_string() == "value";
  if (by && !(by->is_string() && (by->as_string() == "key" || by->as_string() == "value")))
    return invalid_argument("You can only sort by either \"key\" or \"value\"");
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [k, x] : v.as_dict().items)
    keyed.emplace_back(fold_case(by_value ? x : Value::string(k), cs), Value::list({Value::string(k), x}, true));
  LATHE_TRY(py_sort(&keyed, arg_true(a, 2, "reverse")));
  ValueList out;
  for (auto& [k, x] : keyed) out.push_back(std::move(x));
  return Value::list(std::move(out));
}

Result<Value> f_sort(Runtime&, const Value& v, A a) {
  bool rev = arg_true(a, 0, "reverse");
  bool cs = arg_true(a, 1, "case_sensitive");
  const Value* attr = a.get(2, "attribute");
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) keyed.emplace_back(fold_case(attr ? attr_path(item, *attr) : item, cs), item);
  LATHE_TRY(py_sort(&keyed, rev));
  ValueList out;
  for (auto& [k, x] : keyed) out.push_back(std::move(x));
  return Value::list(std::move(out));
}

Result<Value> f_reverse(Runtime&, const Value& v, A) {
  if (v.is_string()) {
    auto chars = utf8_chars(v.as_string());
    std::string out;
    for (size_t i = chars.size(); i-- > 0;) out += chars[i];
    return Value::string(std::move(out));
  }
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::generator(std::move(items));
}

Result<Value> f_minmax(Runtime&, const Value& v, A a, bool want_max) {
  bool cs = arg_true(a, 0, "case_sensitive");
  const Value* attr = a.get(1, "attribute");
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    Value x = fold_case(attr ? attr_path(items[i], *attr) : items[i], cs);
    Value b = fold_case(attr ? attr_path(items[best], *attr) : items[best], cs);
    LATHE_ASSIGN_OR_RETURN(bool better, want_max ? less_than(b, x) : less_than(x, b));
    if (better) best = i;
  }
  return items[best];
}
Result<Value> f_min(Runtime& rt, const Value& v, A a) { return f_minmax(rt, v, a, false); }
Result<Value> f_max(Runtime& rt, const Value& v, A a) { return f_minmax(rt, v, a, true); }

Result<Value> f_sum(Runtime& rt, const Value& v, A a) {
  const Value* attr = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
  Value total = start ? *start : Value::integer(0);
  for (const Value& item : items) {
    Value x = attr ? attr_path(item, *attr) : item;
    if (!x.is_number() || !total.is_number()) return invalid_argument("sum: unsupported operand type(s) for +");
    total = total.is_float() || x.is_float() ? Value::number(total.as_double() + x.as_double())
                                             : Value::integer(total.as_int() + x.as_int());
  }
  (void)rt;
  return total;
}

Result<Value> f_indent(Runtime&, const Value& v, A a) {
  if (!v.is_string()) return invalid_argument("indent: expected a string, got ", v.type_name());
  const Value* w = a.get(0, "width");
  std::string ind = w && w->is_string() ? w->as_string() : std::string(static_cast<size_t>(std::clamp<int64_t>(w ? w->as_int() : 4, 0, 1024)), ' ');
  bool first = arg_true(a, 1, "first"), blank = arg_true(a, 2, "blank");
  CallArgs none;
  LATHE_ASSIGN_OR_RETURN(Value lines_v, get_attr(Value::string(v.str() + "\n"), "splitlines").as_function()(none));
  const ValueList& lines = lines_v.as_list();
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i > 0) out += "\n";
    if (i > 0 && (blank || !line.empty())) out += ind;
    out += line;
  }
  if (first) out = ind + out;
  return Value::string(std::move(out));
}

Result<Value> f_escape(Runtime&, const Value& v, A) {
  std::string out;
  for (char c : v.str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::string(std::move(out));
}

Result<Value> f_attr(Runtime&, const Value& v, A a) {
  const Value* n = a.get(0, "name");
  if (!n || !n->is_string()) return invalid_argument("attr: name must be a string");
  if (v.is_undefined()) return undefined_error(v);
  // Python attributes only (methods), never dict items: jinja's attr filter.
  Value probe = v.is_dict() ? Value::dict({}) : v;
  Value m = get_attr(probe, n->as_string());
  if (m.is_callable()) return get_attr(v, n->as_string());
  return Value::undefined("'" + std::string(v.type_name()) + " object' has no attribute '" + n->as_string() + "'");
}

// printf-style "%s" formatting (the format filter and str % args).
Result<Value> f_format(Runtime&, const Value& v, A a) {
  const std::string& s = v.str();
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    size_t j = i + 1;
    while (j < s.size() && std::strchr("-+ #0123456789.", s[j]) && s[j] != 0) ++j;
    if (j >= s.size()) return invalid_argument("incomplete format");
    char conv = s[j];
    std::string spec = s.substr(i, j - i);
    if (conv == '%') {
      out += '%';
      i = j;
      continue;
    }
    if (next >= a.args.size()) return invalid_argument("not enough arguments for format string");
    const Value& x = a.args[next++];
    char buf[512];
    if (conv == 's' || conv == 'r') {
      std::string t = conv == 's' ? x.str() : x.repr();
      std::string fmt = spec + "s";
      int n = std::snprintf(nullptr, 0, fmt.c_str(), t.c_str());
      if (n < 0 || n > (1 << 20)) return invalid_argument("format: result too large");
      std::string piece(static_cast<size_t>(n) + 1, '\0');
      std::snprintf(piece.data(), piece.size(), fmt.c_str(), t.c_str());
      piece.pop_back();
      out += piece;
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
      if (!x.is_number()) return invalid_argument("%", conv, " format: a real number is required, not ", x.type_name());
      std::snprintf(buf, sizeof(buf), (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(),
                    static_cast<long long>(x.is_float() ? static_cast<int64_t>(x.as_double()) : x.as_int()));
      out += buf;
    } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
      if (!x.is_number()) return invalid_argument("must be real number, not ", x.type_name());
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), x.as_double());
      out += buf;
    } else {
      return invalid_argument("unsupported format character '", std::string(1, conv), "'");
    }
    i = j;
  }
  if (next < a.args.size() && a.kwargs.empty()) return invalid_argument("not all arguments converted during string formatting");
  return Value::string(std::move(out));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> k = {
      {"abs", f_abs}, {"attr", f_attr}, {"capitalize", f_capitalize}, {"count", f_length}, {"d", f_default},
      {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape},
      {"first", f_first}, {"float", f_float}, {"forceescape", f_escape}, {"format", f_format},
      {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
      {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max},
      {"min", f_min}, {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe}, {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string}, {"sum", f_sum},
      {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique}, {"upper", f_upper},
  };
  return k;
}

// ---- tests ----
const Value& arg0(A a) {
  static const Value kUndef;
  return a.args.empty() ? kUndef : a.args[0];
}
Result<bool> t_defined(Runtime&, const Value& v, A) { return !v.is_undefined(); }
Result<bool> t_undefined(Runtime&, const Value& v, A) { return v.is_undefined(); }
Result<bool> t_none(Runtime&, const Value& v, A) { return v.is_none(); }
Result<bool> t_boolean(Runtime&, const Value& v, A) { return v.is_bool(); }
Result<bool> t_true(Runtime&, const Value& v, A) { return v.is_bool() && v.as_bool(); }
Result<bool> t_false(Runtime&, const Value& v, A) { return v.is_bool() && !v.as_bool(); }
Result<bool> t_integer(Runtime&, const Value& v, A) { return v.is_int(); }
Result<bool> t_float(Runtime&, const Value& v, A) { return v.is_float(); }
Result<bool> t_number(Runtime&, const Value& v, A) { return v.is_number(); }
Result<bool> t_string(Runtime&, const Value& v, A) { return v.is_string(); }
Result<bool> t_mapping(Runtime&, const Value& v, A) { return v.is_dict(); }
Result<bool> t_iterable(Runtime&, const Value& v, A) { return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string(); }
Result<bool> t_sequence(Runtime&, const Value& v, A) {
  return (v.is_list() && !v.is_generator()) || v.is_dict() || v.is_string() || v.is_undefined();
}
Result<bool> t_callable(Runtime&, const Value& v, A) { return v.is_callable() || v.is_undefined(); }
Result<bool> t_escaped(Runtime&, const Value&, A) { return false; }
Result<bool> t_eq(Runtime&, const Value& v, A a) { return equals(v, arg0(a)); }
Result<bool> t_ne(Runtime&, const Value& v, A a) { return !equals(v, arg0(a)); }
Result<bool> t_lt(Runtime&, const Value& v, A a) { return less_than(v, arg0(a)); }
Result<bool> t_gt(Runtime&, const Value& v, A a) { return less_than(arg0(a), v); }
Result<bool> t_le(Runtime&, const Value& v, A a) {
  LATHE_ASSIGN_OR_RETURN(bool gt, less_than(arg0(a), v));
  return !gt;
}
Result<bool> t_ge(Runtime&, const Value& v, A a) {
  LATHE_ASSIGN_OR_RETURN(bool lt, less_than(v, arg0(a)));
  return !lt;
}
Result<bool> t_in(Runtime&, const Value& v, A a) { return py_contains(arg0(a), v); }
Result<bool> t_sameas(Runtime&, const Value& v, A a) {
  const Value& o = arg0(a);
  if (v.is_none() || v.is_bool() || o.is_none() || o.is_bool()) return v.kind() == o.kind() && equals(v, o);
  return v.kind() == o.kind() && (v.is_list() || v.is_dict() || v.is_namespace() || v.is_callable()) && equals(v, o);
}
// value % 2 with Python's sign rule, for ints and floats.
Result<double> py_mod2(const Value& v, const char* test) {
  if (!v.is_number()) return invalid_argument(test, ": expected a number, got ", v.type_name());
  if (!v.is_float()) return static_cast<double>(((v.as_int() % 2) + 2) % 2);
  double m = std::fmod(v.as_double(), 2.0);
  return m < 0 ? m + 2.0 : m;
}
Result<bool> t_odd(Runtime&, const Value& v, A) {
  LATHE_ASSIGN_OR_RETURN(double m, py_mod2(v, "odd"));
  return m == 1.0;
}
Result<bool> t_even(Runtime&, const Value& v, A) {
  LATHE_ASSIGN_OR_RETURN(double m, py_mod2(v, "even"));
  return m == 0.0;
}
Result<bool> t_divisibleby(Runtime&, const Value& v, A a) {
  const Value& d = arg0(a);
  if (!v.is_number() || !d.is_number()) return invalid_argument("divisibleby: expected numbers");
  if (d.as_double() == 0) return invalid_argument("integer division or modulo by zero");
  if (v.is_float() || d.is_float()) return std::fmod(v.as_double(), d.as_double()) == 0;
  return v.as_int() % d.as_int() == 0;
}
Result<bool> t_lower(Runtime&, const Value& v, A) {
  std::string s = v.str();
  return ascii_lower(s) == s && ascii_upper(s) != s;
}
Result<bool> t_upper(Runtime&, const Value& v, A) {
  std::string s = v.str();
  return ascii_upper(s) == s && ascii_lower(s) != s;
}
Result<bool> t_filter(Runtime&, const Value& v, A) { return v.is_string() && is_known_filter(v.as_string()); }
Result<bool> t_test(Runtime&, const Value& v, A) { return v.is_string() && is_known_test(v.as_string()); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> k = {
      {"!=", t_ne}, {"<", t_lt}, {"<=", t_le}, {"==", t_eq}, {">", t_gt}, {">=", t_ge},
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
      {"eq", t_eq}, {"equalto", t_eq}, {"escaped", t_escaped}, {"even", t_even}, {"false", t_false},
      {"filter", t_filter}, {"float", t_float}, {"ge", t_ge}, {"greaterthan", t_gt}, {"gt", t_gt},
      {"in", t_in}, {"integer", t_integer}, {"iterable", t_iterable}, {"le", t_le}, {"lessthan", t_lt},
      {"lower", t_lower}, {"lt", t_lt}, {"mapping", t_mapping}, {"ne", t_ne}, {"none", t_none},
      {"number", t_number}, {"odd", t_odd}, {"sameas", t_sameas}, {"sequence", t_sequence},
      {"string", t_string}, {"test", t_test}, {"true", t_true}, {"undefined", t_undefined}, {"upper", t_upper},
  };
  return k;
}

}  // namespace

Result<bool> py_contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (!item.is_string())
        return invalid_argument("'in <string>' requires string as left operand, not ", item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::List:
      for (const Value& v : container.as_list())
        if (equals(v, item)) return true;
      return false;
    case Kind::Dict:
      if ((item.is_list() && !item.is_tuple()) || item.is_dict())
        return invalid_argument("unhashable type: '", item.type_name(), "'");
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default: return invalid_argument("argument of type '", container.type_name(), "' is not iterable");
  }
}

bool is_known_filter(const std::string& name) { return filters().count(name) != 0; }
bool is_known_test(const std::string& name) { return tests().count(name) != 0; }

Result<Value> apply_filter(Runtime& rt, const std::string& name, const Value& input, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) return invalid_argument("no filter named '", name, "'");
  // Filters that compute on their input fail on Undefined; the rest treat it
  // as "" or an empty sequence, as jinja2's Undefined does.
  if (input.is_undefined() && (name == "abs" || name == "round" || name == "int" || name == "float" ||
                               name == "tojson" || name == "dictsort" || name == "attr" || name == "indent"))
    return undefined_error(input);
  return it->second(rt, input, args);
}

Result<bool> apply_test(Runtime& rt, const std::string& name, const Value& input, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) return invalid_argument("no test named '", name, "'");
  static const char* const kOneArg[] = {"!=", "<", "<=", "==", ">", ">=", "divisibleby", "eq", "equalto", "ge",
                                        "greaterthan", "gt", "in", "le", "lessthan", "lt", "ne", "sameas"};
  bool one_arg = std::find_if(std::begin(kOneArg), std::end(kOneArg), [&](const char* n) { return name == n; }) !=
                 std::end(kOneArg);
  size_t n_args = args.args.size() + args.kwargs.size();
  if (n_args != (one_arg ? 1u : 0u))
    return invalid_argument("test '", name, "' takes ", one_arg ? 1 : 0, " argument(s) but ", n_args, " were given");
  return it->second(rt, input, args);
}

}  // namespace lathe::jinja
