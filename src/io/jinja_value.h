// The value type of lathe's Jinja interpreter. It models the Python objects a
// chat template sees through jinja2: None, bool, int, float, str, list/tuple,
// dict (insertion-ordered, like Python's), jinja's Undefined, namespace()
// objects and callables (globals, macros, bound methods). Printing, equality,
// ordering and truthiness follow Python so rendered text matches byte for byte.
//
// Lists and dicts are shared and immutable once built (the template sandbox
// forbids mutating them); only a Namespace is mutated, through `set ns.x = v`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace lathe::jinja {

class Value;
using ValueList = std::vector<Value>;

// Insertion-ordered string-keyed map; lookups are linear, which is what the
// small dicts of chat messages and tool schemas need.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // Keyword `name`, else positional `pos`, else null.
  const Value* get(size_t pos, std::string_view name) const;
};

using NativeFn = std::function<Result<Value>(const CallArgs&)>;

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

class Value {
 public:
  Value() = default;  // Undefined
  static Value undefined(std::string hint = "");
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(ValueList items, bool is_tuple = false);
  // What jinja's select/map/reverse return: iterable once, always truthy,
  // without a length; `|list` turns it into a list.
  static Value generator(ValueList items);
  static Value dict(ValueDict d);
  static Value name_space(ValueDict d);
  static Value function(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && is_tuple_; }
  bool is_generator() const { return kind_ == Kind::List && is_generator_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? (b_ ? 1 : 0) : i_; }
  double as_double() const;
  const std::string& as_string() const { return s_ ? *s_ : empty_string(); }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& namespace_dict() const { return *dict_; }  // Namespace only
  const NativeFn& as_function() const { return *fn_; }
  const std::string& name() const { return as_string(); }  // Callable name or Undefined hint

  // Python truthiness.
  bool truthy() const;
  // Python str(); lists and dicts print their items' repr().
  std::string str() const;
  std::string repr() const;
  // Python type name, for error messages ("str", "dict", ...).
  const char* type_name() const;

  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);  // keys come in sorted order

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  bool is_tuple_ = false;
  bool is_generator_ = false;
  int64_t i_ = 0;
  double f_ = 0.0;
  static const std::string& empty_string();
  std::shared_ptr<const std::string> s_;  // shared: strings are copied with every Value, never changed
  std::shared_ptr<ValueList> list_;  // shared: values are copied freely and never mutated
  std::shared_ptr<ValueDict> dict_;  // shared: a Namespace's dict is mutated through every copy
  std::shared_ptr<const NativeFn> fn_;
};

// Python ==.
bool equals(const Value& a, const Value& b);
// Python <: numbers, strings, lists; an error for other pairs.
Result<bool> less_than(const Value& a, const Value& b);
// Python repr() of a float (shortest round-trip digits).
std::string float_repr(double f);

struct JsonOptions {
  int indent = -1;  // < 0: single line
  std::string indent_str;  // used when set (indent given as a string)
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python json.dumps(v, ...) as transformers' tojson filter calls it.
Result<std::string> to_json(const Value& v, const JsonOptions& opt);

// UTF-8 helpers: strings index and slice by code point, as Python does.
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

}  // namespace lathe::jinja
