// Jinja interpreter: renders a parsed Template against a set of variables.
// Scoping follows jinja2: a for-loop iteration and a macro call open a scope
// (so `set` inside them does not leak out; namespace() is the way out), if
// blocks do not. Undefined follows jinja2's default Undefined: it prints as
// "", is falsy and iterates as empty, and any attribute, item, call or
// arithmetic on it is an error.
//
// Every render is bounded (output size, statement/iteration steps, call
// depth) so arbitrary templates cannot hang or exhaust memory.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/jinja_parser.h"

namespace lathe::jinja {

struct RenderOptions {
  size_t max_output_bytes = size_t{64} << 20;
  int64_t max_steps = 5'000'000;  // statements executed + loop iterations + list items built
  int max_call_depth = 64;        // nested macro calls
  // Clock behind strftime_now(); null means the system clock.
  std::function<std::time_t()> now;
  // When set, receives the [begin, end) byte offsets in the output of every
  // {% generation %} block rendered at top level (not inside a macro or a
  // captured block), as transformers' assistant-mask tracker records them.
  std::vector<std::pair<size_t, size_t>>* generation_spans = nullptr;
};

// vars: the template's variables (messages, add_generation_prompt, ...).
// Thread-safe for concurrent renders of the same Template.
Result<std::string> render(const Template& tmpl, const ValueDict& vars, const RenderOptions& opt = {});

// Marks the Status of raise_exception(msg): render() returns msg unchanged.
inline constexpr const char* kRaisedMarker = "\x01raised:";

// ---- builtins (jinja_filters.cpp, jinja_methods.cpp) ----

// Services the builtins need from the running interpreter.
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Status step(int64_t n = 1) = 0;  // charges work against max_steps
  virtual const RenderOptions& options() const = 0;
  // Registers a namespace() made during the render; its contents are cleared
  // when the render ends, which breaks reference cycles like `set ns.me = ns`.
  virtual void adopt_namespace(const Value& ns) = 0;
};

Result<Value> apply_filter(Runtime& rt, const std::string& name, const Value& input, const CallArgs& args);
Result<bool> apply_test(Runtime& rt, const std::string& name, const Value& input, const CallArgs& args);

// obj.name, with jinja2's sandboxed lookup: methods of str/dict/list first,
// then dict items. Missing → Undefined carrying a message.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: items first, then (string keys) attributes.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on lists and strings.
Result<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Iteration as Python does it: list items, dict keys, string characters.
Result<ValueList> iterate(const Value& v);
// Globals every template sees: range, dict, namespace, raise_exception, strftime_now.
void add_globals(Runtime& rt, ValueDict* globals);
// The error an Undefined raises when used (its hint, or "'name' is undefined").
Status undefined_error(const Value& v);

// Python `item in container`.
Result<bool> py_contains(const Value& container, const Value& item);

// Python str methods / operators the interpreter and filters share.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);

}  // namespace lathe::jinja
