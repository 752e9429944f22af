// Jinja interpreter: statements and expressions. Values are computed with
// Python semantics (operators, truthiness, printing); the builtins
// (filters, tests, attribute lookup, globals) live in jinja_filters.cpp and
// jinja_methods.cpp. Errors carry the template line of the failing node.
#include "io/jinja_eval.h"

#include <cmath>
#include <cstring>
#include <unordered_map>

namespace lathe::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  int parent;  // index of the enclosing visible scope; -1 for the root
};

Status at_line(const Status& s, int line) {
  if (s.is_ok() || line <= 0 || s.message().rfind("line ", 0) == 0 ||
      s.message().rfind("template syntax error", 0) == 0)
    return s;
  return Status(s.code(), "line " + std::to_string(line) + ": " + s.message());
}

class Interpreter final : public Runtime {
 public:
  Interpreter(const ValueDict& vars, const RenderOptions& opt) : opt_(opt) {
    scopes_.push_back({{}, -1});
    for (const auto& [k, v] : vars.items) scopes_[0].vars[k] = v;
    add_globals(*this, &globals_);
  }

  ~Interpreter() override {
    for (const Value& ns : namespaces_) ns.namespace_dict().items.clear();
  }

  Result<std::string> run(const Template& t) {
    LATHE_TRY(exec_body(t.body));
    return std::move(out_);
  }

  Status step(int64_t n) override {
    steps_ += n;
    if (steps_ > opt_.max_steps) return invalid_argument("template exceeded its step budget (", opt_.max_steps, ")");
    return Status::ok();
  }
  const RenderOptions& options() const override { return opt_; }
  void adopt_namespace(const Value& ns) override { namespaces_.push_back(ns); }

 private:
  // ---- scopes ----
  void push_scope(int parent) {
    scopes_.push_back({{}, parent});
    current_ = static_cast<int>(scopes_.size()) - 1;
  }
  void pop_scope(int restore) {
    scopes_.pop_back();
    current_ = restore;
  }
  Value lookup(const std::string& name) const {
    for (int i = current_; i >= 0; i = scopes_[static_cast<size_t>(i)].parent) {
      const auto& vars = scopes_[static_cast<size_t>(i)].vars;
      auto it = vars.find(name);
      if (it != vars.end()) return it->second;
    }
    if (const Value* g = globals_.find(name)) return *g;
    return Value::undefined("'" + name + "' is undefined");
  }
  void assign(const std::string& name, Value v) { scopes_[static_cast<size_t>(current_)].vars[name] = std::move(v); }

  Status emit(const std::string& s) {
    if (out_.size() + s.size() > opt_.max_output_bytes)
      return invalid_argument("template output exceeds ", opt_.max_output_bytes, " bytes");
    out_ += s;
    return Status::ok();
  }

  // ---- statements ----
  Status exec_body(const Body& body) {
    for (const StmtPtr& s : body) {
      LATHE_TRY(step(1));
      Status st = exec(*s);
      if (!st.is_ok()) return at_line(st, s->line);
      if (break_ || continue_) return Status::ok();
    }
    return Status::ok();
  }

  Status exec(const Stmt& s) {
    switch (s.kind) {
      case StmtKind::Text: return emit(s.text);
      case StmtKind::Output: {
        LATHE_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
        return emit(v.str());
      }
      case StmtKind::If: {
        for (size_t i = 0; i < s.conds.size(); ++i) {
          LATHE_ASSIGN_OR_RETURN(Value c, eval(*s.conds[i]));
          if (c.truthy()) return exec_body(s.bodies[i]);
        }
        return exec_body(s.else_body);
      }
      case StmtKind::For: return exec_for(s);
      case StmtKind::Set: return exec_set(s);
      case StmtKind::SetBlock: {
        LATHE_ASSIGN_OR_RETURN(std::string text, capture(s.body));
        Value v = Value::string(std::move(text));
        if (s.expr) {
          LATHE_ASSIGN_OR_RETURN(v, eval_filter(*s.expr, &v));
        }
        assign(s.targets[0], std::move(v));
        return Status::ok();
      }
      case StmtKind::Macro: {
        assign(s.name, make_macro(s, s.name, current_, false));
        return Status::ok();
      }
      case StmtKind::CallBlock: return exec_call_block(s);
      case StmtKind::FilterBlock: {
        LATHE_ASSIGN_OR_RETURN(std::string text, capture(s.body));
        Value v = Value::string(std::move(text));
        LATHE_ASSIGN_OR_RETURN(Value r, eval_filter(*s.expr, &v));
        return emit(r.str());
      }
      case StmtKind::Break: break_ = true; return Status::ok();
      case StmtKind::Continue: continue_ = true; return Status::ok();
      case StmtKind::Scope: {  // {% generation %}
        size_t begin = out_.size();
        LATHE_TRY(exec_body(s.body));
        if (opt_.generation_spans && capture_depth_ == 0) opt_.generation_spans->emplace_back(begin, out_.size());
        return Status::ok();
      }
    }
    return Status::ok();
  }

  Result<std::string> capture(const Body& body) {
    std::string saved = std::move(out_);
    out_.clear();
    ++capture_depth_;
    Status st = exec_body(body);
    --capture_depth_;
    std::string text = std::move(out_);
    out_ = std::move(saved);
    if (!st.is_ok()) return st;
    return text;
  }

  Status bind_targets(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return Status::ok();
    }
    LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(v));
    if (items.size() != targets.size())
      return invalid_argument(items.size() < targets.size() ? "not enough" : "too many", " values to unpack (expected ",
                              targets.size(), ", got ", items.size(), ")");
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
    return Status::ok();
  }

  Value make_loop(const ValueList& items, size_t i) {
    size_t n = items.size();
    ValueDict d;
    d.items.reserve(11);
    d.items.emplace_back("index", Value::integer(static_cast<int64_t>(i + 1)));
    d.items.emplace_back("index0", Value::integer(static_cast<int64_t>(i)));
    d.items.emplace_back("revindex", Value::integer(static_cast<int64_t>(n - i)));
    d.items.emplace_back("revindex0", Value::integer(static_cast<int64_t>(n - i - 1)));
    d.items.emplace_back("first", Value::boolean(i == 0));
    d.items.emplace_back("last", Value::boolean(i + 1 == n));
    d.items.emplace_back("length", Value::integer(static_cast<int64_t>(n)));
    d.items.emplace_back("depth", Value::integer(1));
    d.items.emplace_back("depth0", Value::integer(0));
    d.items.emplace_back("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    d.items.emplace_back("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    d.items.emplace_back("cycle", Value::function("cycle", [i](const CallArgs& a) -> Result<Value> {
                           if (a.args.empty()) return invalid_argument("no items for cycling given");
                           return a.args[i % a.args.size()];
                         }));
    return Value::dict(std::move(d));
  }

  Status exec_for(const Stmt& s) {
    LATHE_ASSIGN_OR_RETURN(Value seq, eval(*s.expr));
    LATHE_ASSIGN_OR_RETURN(ValueList items, iterate(seq));
    LATHE_TRY(step(static_cast<int64_t>(items.size())));
    int outer = current_;
    if (s.cond) {
      ValueList kept;
      for (const Value& item : items) {
        push_scope(outer);
        Status st = bind_targets(s.targets, item);
        Result<Value> c = st.is_ok() ? eval(*s.cond) : Result<Value>(st);
        pop_scope(outer);
        if (!c.is_ok()) return c.status();
        if (c->truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      push_scope(outer);
      assign("loop", make_loop(items, i));
      Status st = bind_targets(s.targets, items[i]);
      if (st.is_ok()) st = exec_body(s.body);
      pop_scope(outer);
      LATHE_TRY(st);
      continue_ = false;
      if (break_) {
        break_ = false;
        break;
      }
    }
    if (items.empty()) return exec_body(s.else_body);
    return Status::ok();
  }

  Status exec_set(const Stmt& s) {
    LATHE_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
    if (s.name.empty()) return bind_targets(s.targets, v);
    Value ns = lookup(s.targets[0]);
    if (!ns.is_namespace()) return invalid_argument("cannot assign attribute on non-namespace object");
    if (!s.name.empty() && s.name[0] == '_')
      return invalid_argument("chat templates cannot store underscore-prefixed attributes on a namespace");
    ns.namespace_dict().set(s.name, std::move(v));
    return Status::ok();
  }

  // A macro (or a call block's caller) as a callable. Its body runs in a new
  // scope whose parent is `parent_scope`: the root for macros (they see the
  // template's variables, not their caller's), the call site for caller().
  Value make_macro(const Stmt& s, const std::string& name, int parent_scope, bool is_caller) {
    const Stmt* stmt = &s;
    int parent = is_caller ? parent_scope : 0;
    return Value::function(name, [this, stmt, parent, is_caller](const CallArgs& a) -> Result<Value> {
      if (++call_depth_ > opt_.max_call_depth) {
        --call_depth_;
        return invalid_argument("macro calls nested deeper than ", opt_.max_call_depth);
      }
      // A caller() kept past its {% call %} block would point at a scope that is gone.
      if (parent >= static_cast<int>(scopes_.size())) return invalid_argument("caller() used outside its call block");
      int saved = current_;
      push_scope(parent);
      Status st = bind_macro_args(*stmt, a, is_caller);
      Result<std::string> text = st.is_ok() ? capture(stmt->body) : Result<std::string>(st);
      pop_scope(saved);
      --call_depth_;
      if (!text.is_ok()) return text.status();
      return Value::string(std::move(text).value());
    });
  }

  Status bind_macro_args(const Stmt& s, const CallArgs& a, bool is_caller) {
    ValueList varargs;
    for (size_t i = 0; i < a.args.size(); ++i) {
      if (i < s.targets.size()) assign(s.targets[i], a.args[i]);
      else varargs.push_back(a.args[i]);
    }
    ValueDict kwargs;
    for (const auto& [k, v] : a.kwargs) {
      bool is_param = false;
      for (const std::string& t : s.targets) is_param = is_param || t == k;
      if (is_param) assign(k, v);
      else if (k == "caller" && !is_caller) assign("caller", v);
      else kwargs.items.emplace_back(k, v);
    }
    for (size_t i = a.args.size(); i < s.targets.size(); ++i) {
      if (scopes_[static_cast<size_t>(current_)].vars.count(s.targets[i])) continue;
      if (s.defaults[i]) {
        LATHE_ASSIGN_OR_RETURN(Value d, eval(*s.defaults[i]));
        assign(s.targets[i], std::move(d));
      } else {
        assign(s.targets[i], Value::undefined("parameter '" + s.targets[i] + "' was not provided"));
      }
    }
    assign("varargs", Value::list(std::move(varargs), /*is_tuple=*/true));
    assign("kwargs", Value::dict(std::move(kwargs)));
    return Status::ok();
  }

  Status exec_call_block(const Stmt& s) {
    const Expr& call = *s.expr;
    LATHE_ASSIGN_OR_RETURN(Value fn, eval(*call.kids[0]));
    LATHE_ASSIGN_OR_RETURN(CallArgs args, eval_args(call));
    args.kwargs.emplace_back("caller", make_macro(s, "caller", current_, true));
    LATHE_ASSIGN_OR_RETURN(Value r, call_value(fn, args));
    return emit(r.str());
  }

  // ---- expressions ----
  Result<CallArgs> eval_args(const Expr& e, size_t first = 1) {
    CallArgs a;
    for (size_t i = first; i < e.kids.size(); ++i) {
      LATHE_ASSIGN_OR_RETURN(Value v, eval(*e.kids[i]));
      a.args.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      LATHE_ASSIGN_OR_RETURN(Value v, eval(*x));
      a.kwargs.emplace_back(k, std::move(v));
    }
    return a;
  }

  Result<Value> call_value(const Value& fn, const CallArgs& args) {
    if (fn.is_undefined()) return undefined_error(fn);
    if (!fn.is_callable()) return invalid_argument("'", fn.type_name(), "' object is not callable");
    return fn.as_function()(args);
  }

  // A Filter expression; `input` replaces the innermost (null) input of the
  // {% filter %} / {% set x | f %} forms.
  Result<Value> eval_filter(const Expr& e, const Value* input) {
    Value in;
    if (e.kids[0]) {
      LATHE_ASSIGN_OR_RETURN(in, e.kids[0]->kind == ExprKind::Filter ? eval_filter(*e.kids[0], input)
                                                                      : eval(*e.kids[0]));
    } else if (input) {
      in = *input;
    }
    LATHE_ASSIGN_OR_RETURN(CallArgs args, eval_args(e));
    return apply_filter(*this, e.name, in, args);
  }

  Result<Value> eval(const Expr& e) {
    Result<Value> r = eval_inner(e);
    if (!r.is_ok()) return at_line(r.status(), e.line);
    return r;
  }

  Result<Value> eval_inner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Const: return e.value;
      case ExprKind::Name: return lookup(e.name);
      case ExprKind::List:
      case ExprKind::Tuple: {
        ValueList items;
        for (const ExprPtr& k : e.kids) {
          LATHE_ASSIGN_OR_RETURN(Value v, eval(*k));
          items.push_back(std::move(v));
        }
        return Value::list(std::move(items), e.kind == ExprKind::Tuple);
      }
      case ExprKind::Dict: {
        ValueDict d;
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
          LATHE_ASSIGN_OR_RETURN(Value k, eval(*e.kids[i]));
          LATHE_ASSIGN_OR_RETURN(Value v, eval(*e.kids[i + 1]));
          if (!k.is_string()) return invalid_argument("dict keys must be strings, got ", k.type_name());
          d.set(k.as_string(), std::move(v));
        }
        return Value::dict(std::move(d));
      }
      case ExprKind::Getattr:
      case ExprKind::Getitem:
      case ExprKind::Slice:
      case ExprKind::Call:
      case ExprKind::Filter:
      case ExprKind::Test: return eval_access(e);
      case ExprKind::Not: {
        LATHE_ASSIGN_OR_RETURN(Value v, eval(*e.kids[0]));
        return Value::boolean(!v.truthy());
      }
      case ExprKind::Neg:
      case ExprKind::Pos: {
        LATHE_ASSIGN_OR_RETURN(Value v, eval(*e.kids[0]));
        if (v.is_undefined()) return undefined_error(v);
        if (!v.is_number()) return invalid_argument("bad operand type for unary ", e.kind == ExprKind::Neg ? "-" : "+",
                                                    ": '", v.type_name(), "'");
        if (e.kind == ExprKind::Pos) return v.is_bool() ? Value::integer(v.as_int()) : v;
        if (v.is_float()) return Value::number(-v.as_double());
        if (v.as_int() == INT64_MIN) return invalid_argument("integer overflow");
        return Value::integer(-v.as_int());
      }
      case ExprKind::Binary: {
        LATHE_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0]));
        LATHE_ASSIGN_OR_RETURN(Value b, eval(*e.kids[1]));
        return binary(e.name, a, b);
      }
      case ExprKind::Compare: return eval_compare(e);
      case ExprKind::And:
      case ExprKind::Or: {
        LATHE_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0]));
        if (a.truthy() == (e.kind == ExprKind::Or)) return a;
        return eval(*e.kids[1]);
      }
      case ExprKind::Cond: {
        LATHE_ASSIGN_OR_RETURN(Value c, eval(*e.kids[0]));
        if (c.truthy()) return eval(*e.kids[1]);
        if (e.kids[2]) return eval(*e.kids[2]);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
    }
    return Value();
  }

  // Attribute, item, slice, call, filter and test expressions.
  Result<Value> eval_access(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Getattr: {
        LATHE_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0]));
        if (obj.is_undefined()) return undefined_error(obj);
        return get_attr(obj, e.name);
      }
      case ExprKind::Getitem: {
        LATHE_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0]));
        LATHE_ASSIGN_OR_RETURN(Value key, eval(*e.kids[1]));
        if (obj.is_undefined()) return undefined_error(obj);
        return get_item(obj, key);
      }
      case ExprKind::Slice: {
        LATHE_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0]));
        Value parts[3] = {Value::none(), Value::none(), Value::none()};
        for (size_t i = 0; i < 3; ++i) {
          if (e.kids[i + 1]) {
            LATHE_ASSIGN_OR_RETURN(parts[i], eval(*e.kids[i + 1]));
          }
        }
        if (obj.is_undefined()) return undefined_error(obj);
        return get_slice(obj, parts[0], parts[1], parts[2]);
      }
      case ExprKind::Call: {
        LATHE_ASSIGN_OR_RETURN(Value fn, eval(*e.kids[0]));
        LATHE_ASSIGN_OR_RETURN(CallArgs args, eval_args(e));
        return call_value(fn, args);
      }
      case ExprKind::Filter: return eval_filter(e, nullptr);
      case ExprKind::Test: {
        LATHE_ASSIGN_OR_RETURN(Value in, eval(*e.kids[0]));
        LATHE_ASSIGN_OR_RETURN(CallArgs args, eval_args(e));
        LATHE_ASSIGN_OR_RETURN(bool b, apply_test(*this, e.name, in, args));
        return Value::boolean(b);
      }
      default: return Value();
    }
  }

  Result<Value> eval_compare(const Expr& e) {
    LATHE_ASSIGN_OR_RETURN(Value left, eval(*e.kids[0]));
    for (size_t i = 0; i < e.ops.size(); ++i) {
      LATHE_ASSIGN_OR_RETURN(Value right, eval(*e.kids[i + 1]));
      LATHE_ASSIGN_OR_RETURN(bool ok, compare(e.ops[i], left, right));
      if (!ok) return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }

  Result<bool> compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in" || op == "notin") {
      LATHE_ASSIGN_OR_RETURN(bool in, py_contains(b, a));
      return op == "in" ? in : !in;
    }
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    if (op == "<") return less_than(a, b);
    if (op == ">") return less_than(b, a);
    LATHE_ASSIGN_OR_RETURN(bool lt, less_than(op == "<=" ? b : a, op == "<=" ? a : b));
    return !lt;
  }

  Result<Value> binary(const std::string& op, const Value& a, const Value& b);

  const RenderOptions& opt_;
  std::vector<Scope> scopes_;
  int current_ = 0;
  ValueDict globals_;
  std::string out_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int capture_depth_ = 0;  // > 0 while rendering into a macro's or block's own buffer
  bool break_ = false;
  bool continue_ = false;
  std::vector<Value> namespaces_;  // cleared at the end of the render (cycles)
};

Status unsupported_operands(const std::string& op, const Value& a, const Value& b) {
  return invalid_argument("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
}

Result<Value> repeat(const Value& seq, int64_t n, size_t max_bytes) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (!seq.as_string().empty() && static_cast<uint64_t>(n) > max_bytes / seq.as_string().size())
      return invalid_argument("string repetition result too large");
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::string(std::move(out));
  }
  if (!seq.as_list().empty() && static_cast<uint64_t>(n) * seq.as_list().size() > 1'000'000)
    return invalid_argument("list repetition result too large");
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value::list(std::move(out), seq.is_tuple());
}

Result<Value> int_pow(int64_t base, int64_t exp) {
  int64_t r = 1;
  for (int64_t i = 0; i < exp; ++i) {
    if (__builtin_mul_overflow(r, base, &r)) return Value::number(std::pow(static_cast<double>(base), static_cast<double>(exp)));
    if (r == 0 || r == 1) break;
  }
  if (r == 1 && base == -1 && exp % 2 == 1) r = -1;
  return Value::integer(r);
}

Result<Value> Interpreter::binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(a.str() + b.str());
  if (op == "%" && a.is_string() && b.is_undefined()) {
    CallArgs args;  // Python treats an Undefined operand like a mapping: unconverted is fine
    args.args.push_back(b);
    args.kwargs.emplace_back("mapping", b);
    return apply_filter(*this, "format", a, args);
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  const size_t max_bytes = opt_.max_output_bytes;
  if (a.is_number() && b.is_number()) {
    bool fl = a.is_float() || b.is_float();
    double x = a.as_double(), y = b.as_double();
    int64_t i = a.as_int(), j = b.as_int(), r = 0;
    if (op == "+") return fl ? Value::number(x + y) : __builtin_add_overflow(i, j, &r) ? Value::number(x + y) : Value::integer(r);
    if (op == "-") return fl ? Value::number(x - y) : __builtin_sub_overflow(i, j, &r) ? Value::number(x - y) : Value::integer(r);
    if (op == "*") return fl ? Value::number(x * y) : __builtin_mul_overflow(i, j, &r) ? Value::number(x * y) : Value::integer(r);
    if (op == "/") {
      if (y == 0) return invalid_argument("division by zero");
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
      if (fl ? y == 0 : j == 0) return invalid_argument(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (fl) {
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return op == "%" ? Value::number(m) : Value::number(std::floor(x / y));
      }
      if (i == INT64_MIN && j == -1) return invalid_argument("integer overflow");
      int64_t q = i / j, m = i % j;
      if (m != 0 && ((m < 0) != (j < 0))) {
        --q;
        m += j;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**") {
      if (!fl && j >= 0) return int_pow(i, j);
      if (x == 0 && y < 0) return invalid_argument("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(x, y));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > max_bytes) return invalid_argument("string too large");
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      LATHE_TRY(step(static_cast<int64_t>(a.as_list().size() + b.as_list().size())));
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(out), a.is_tuple());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int(), max_bytes);
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int(), max_bytes);
  }
  if (op == "%" && a.is_string()) {
    CallArgs args;
    if (b.is_tuple()) args.args = b.as_list();
    else args.args.push_back(b);
    // Python: a list or dict right operand may go unconverted without error.
    if ((b.is_list() && !b.is_tuple()) || b.is_dict()) args.kwargs.emplace_back("mapping", b);
    return apply_filter(*this, "format", a, args);
  }
  return unsupported_operands(op, a, b);
}

}  // namespace

Result<std::string> render(const Template& tmpl, const ValueDict& vars, const RenderOptions& opt) {
  Interpreter interp(vars, opt);
  Result<std::string> r = interp.run(tmpl);
  if (!r.is_ok() && r.status().message().find(kRaisedMarker) != std::string::npos) {
    const std::string& m = r.status().message();
    return Status(r.status().code(), m.substr(m.find(kRaisedMarker) + std::strlen(kRaisedMarker)));
  }
  return r;
}

}  // namespace lathe::jinja
