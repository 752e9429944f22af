// Jinja parser: statements ({% if %}, {% for %}, {% set %}, {% macro %},
// {% call %}, {% filter %}, {% break %}/{% continue %}, {% generation %}) and
// the expression grammar, one function per precedence level as jinja2 has it.
#include "io/jinja_parser.h"

#include <charconv>
#include <cstdlib>

namespace lathe::jinja {
namespace {

constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Result<Template> run() {
    Template t;
    std::string end;
    LATHE_TRY(subparse(&t.body, {}, &end));
    return t;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == TokType::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == TokType::Name && cur().value == n; }

  Status fail(const std::string& msg) const { return fail_at(cur(), msg); }
  Status fail_at(const Token& t, const std::string& msg) const {
    return invalid_argument("template syntax error at line ", t.line, ", column ", t.col, ": ", msg);
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokType::Eof: return "end of template";
      case TokType::VarEnd: return "end of print statement";
      case TokType::BlockEnd: return "end of statement block";
      case TokType::Data: return "template data";
      default: return "'" + t.value + "'";
    }
  }
  Status expect_op(const char* op) {
    if (!is_op(op)) return fail(std::string("expected '") + op + "', got " + describe(cur()));
    next();
    return Status::ok();
  }
  Result<std::string> expect_name() {
    if (cur().type != TokType::Name) return fail("expected a name, got " + describe(cur()));
    std::string n = cur().value;
    next();
    return n;
  }
  Status expect_block_end() {
    if (cur().type != TokType::BlockEnd) return fail("expected end of statement block, got " + describe(cur()));
    next();
    return Status::ok();
  }

  ExprPtr make(ExprKind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }

  // Parses statements until a block tag named in `ends`; *end receives it
  // (the tag name is consumed, the rest of that tag is left to the caller).
  Status subparse(Body* body, const std::vector<std::string>& ends, std::string* end) {
    if (++depth_ > kMaxDepth) return fail("template nested too deeply");
    while (true) {
      const Token& t = cur();
      if (t.type == TokType::Eof) {
        --depth_;
        if (ends.empty()) return Status::ok();
        std::string want;
        for (const std::string& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
        return fail("unexpected end of template, expected " + want);
      }
      if (t.type == TokType::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->text = t.value;
        body->push_back(std::move(s));
        next();
      } else if (t.type == TokType::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = t.line;
        s->col = t.col;
        next();
        LATHE_ASSIGN_OR_RETURN(s->expr, parse_tuple(true, false));
        if (cur().type != TokType::VarEnd) return fail("expected end of print statement, got " + describe(cur()));
        next();
        body->push_back(std::move(s));
      } else if (t.type == TokType::BlockBegin) {
        next();
        if (cur().type != TokType::Name) return fail("expected a statement name, got " + describe(cur()));
        for (const std::string& e : ends) {
          if (cur().value == e) {
            *end = e;
            next();
            --depth_;
            return Status::ok();
          }
        }
        LATHE_TRY(parse_statement(body));
      } else {
        return fail("unexpected " + describe(t));
      }
    }
  }

  Status parse_statement(Body* body) {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>();
    s->line = t.line;
    s->col = t.col;
    std::string tag = t.value;
    next();
    if (tag == "if") LATHE_TRY(parse_if(s.get()));
    else if (tag == "for") LATHE_TRY(parse_for(s.get()));
    else if (tag == "set") LATHE_TRY(parse_set(s.get()));
    else if (tag == "macro") LATHE_TRY(parse_macro(s.get()));
    else if (tag == "call") LATHE_TRY(parse_call_block(s.get()));
    else if (tag == "filter") LATHE_TRY(parse_filter_block(s.get()));
    else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return fail_at(t, "'" + tag + "' outside of a loop");
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
      LATHE_TRY(expect_block_end());
    } else if (tag == "generation") {
      s->kind = StmtKind::Scope;
      LATHE_TRY(expect_block_end());
      std::string end;
      LATHE_TRY(subparse(&s->body, {"endgeneration"}, &end));
      LATHE_TRY(expect_block_end());
    } else {
      return fail_at(t, "encountered unknown tag '" + tag + "'");
    }
    body->push_back(std::move(s));
    return Status::ok();
  }

  Status parse_if(Stmt* s) {
    s->kind = StmtKind::If;
    while (true) {
      LATHE_ASSIGN_OR_RETURN(ExprPtr c, parse_tuple(false, false));
      LATHE_TRY(expect_block_end());
      s->conds.push_back(std::move(c));
      s->bodies.emplace_back();
      std::string end;
      LATHE_TRY(subparse(&s->bodies.back(), {"elif", "else", "endif"}, &end));
      if (end == "elif") continue;
      if (end == "else") {
        LATHE_TRY(expect_block_end());
        LATHE_TRY(subparse(&s->else_body, {"endif"}, &end));
      }
      return expect_block_end();
    }
  }

  Status parse_targets(std::vector<std::string>* targets) {
    bool paren = is_op("(");
    if (paren) next();
    while (true) {
      LATHE_ASSIGN_OR_RETURN(std::string n, expect_name());
      targets->push_back(n);
      if (!is_op(",")) break;
      next();
      if (cur().type != TokType::Name) break;
    }
    if (paren) LATHE_TRY(expect_op(")"));
    return Status::ok();
  }

  Status parse_for(Stmt* s) {
    s->kind = StmtKind::For;
    LATHE_TRY(parse_targets(&s->targets));
    if (!is_name("in")) return fail("expected 'in', got " + describe(cur()));
    next();
    LATHE_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, false, /*stop_at_if=*/true));
    if (is_name("if")) {
      next();
      LATHE_ASSIGN_OR_RETURN(s->cond, parse_expression());
    }
    if (is_name("recursive")) return fail("recursive for loops are not supported");
    LATHE_TRY(expect_block_end());
    ++loop_depth_;
    std::string end;
    LATHE_TRY(subparse(&s->body, {"else", "endfor"}, &end));
    --loop_depth_;
    if (end == "else") {
      LATHE_TRY(expect_block_end());
      LATHE_TRY(subparse(&s->else_body, {"endfor"}, &end));
    }
    return expect_block_end();
  }

  Status parse_set(Stmt* s) {
    s->kind = StmtKind::Set;
    if (cur().type == TokType::Name && peek().type == TokType::Op && peek().value == ".") {
      s->targets.push_back(cur().value);
      next();
      next();
      LATHE_ASSIGN_OR_RETURN(s->name, expect_name());
    } else {
      LATHE_TRY(parse_targets(&s->targets));
    }
    if (is_op("=")) {
      next();
      LATHE_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, false));
      return expect_block_end();
    }
    if (!s->name.empty() || s->targets.size() != 1) return fail("expected '=', got " + describe(cur()));
    s->kind = StmtKind::SetBlock;
    if (is_op("|")) {
      LATHE_ASSIGN_OR_RETURN(s->expr, parse_filter_chain(nullptr));
    }
    LATHE_TRY(expect_block_end());
    std::string end;
    LATHE_TRY(subparse(&s->body, {"endset"}, &end));
    return expect_block_end();
  }

  Status parse_params(Stmt* s) {
    LATHE_TRY(expect_op("("));
    while (!is_op(")")) {
      if (!s->targets.empty()) LATHE_TRY(expect_op(","));
      if (is_op(")")) break;
      LATHE_ASSIGN_OR_RETURN(std::string n, expect_name());
      s->targets.push_back(n);
      ExprPtr def;
      if (is_op("=")) {
        next();
        LATHE_ASSIGN_OR_RETURN(def, parse_expression());
      } else if (!s->defaults.empty() && s->defaults.back()) {
        return fail("non-default argument follows default argument");
      }
      s->defaults.push_back(std::move(def));
    }
    next();
    return Status::ok();
  }

  Status parse_macro(Stmt* s) {
    s->kind = StmtKind::Macro;
    LATHE_ASSIGN_OR_RETURN(s->name, expect_name());
    LATHE_TRY(parse_params(s));
    LATHE_TRY(expect_block_end());
    std::string end;
    int saved = loop_depth_;
    loop_depth_ = 0;
    LATHE_TRY(subparse(&s->body, {"endmacro"}, &end));
    loop_depth_ = saved;
    if (cur().type == TokType::Name && cur().value == s->name) next();
    return expect_block_end();
  }

  Status parse_call_block(Stmt* s) {
    s->kind = StmtKind::CallBlock;
    if (is_op("(")) LATHE_TRY(parse_params(s));
    LATHE_ASSIGN_OR_RETURN(s->expr, parse_expression());
    if (s->expr->kind != ExprKind::Call) return fail_at(toks_[pos_ - 1], "expected a call expression");
    LATHE_TRY(expect_block_end());
    std::string end;
    LATHE_TRY(subparse(&s->body, {"endcall"}, &end));
    return expect_block_end();
  }

  Status parse_filter_block(Stmt* s) {
    s->kind = StmtKind::FilterBlock;
    LATHE_ASSIGN_OR_RETURN(s->expr, parse_filter_chain(nullptr, /*start_inline=*/true));
    LATHE_TRY(expect_block_end());
    std::string end;
    LATHE_TRY(subparse(&s->body, {"endfilter"}, &end));
    return expect_block_end();
  }

  // ---- expressions ----

  struct DepthGuard {
    explicit DepthGuard(int* d) : d_(d) { ++*d_; }
    ~DepthGuard() { --*d_; }
    int* d_;
  };

  Result<ExprPtr> parse_expression(bool with_cond = true) {
    DepthGuard g(&depth_);
    if (depth_ > kMaxDepth) return fail("expression nested too deeply");
    if (!with_cond) return parse_or();
    LATHE_ASSIGN_OR_RETURN(ExprPtr e, parse_or());
    while (is_name("if")) {
      const Token& t = cur();
      next();
      auto c = make(ExprKind::Cond, t);
      LATHE_ASSIGN_OR_RETURN(ExprPtr test, parse_or());
      ExprPtr other;
      if (is_name("else")) {
        next();
        LATHE_ASSIGN_OR_RETURN(other, parse_expression());
      }
      c->kids.push_back(std::move(test));
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  // Comma-separated expressions; a tuple when a comma is seen.
  Result<ExprPtr> parse_tuple(bool allow_empty_paren, bool explicit_paren, bool stop_at_if = false) {
    const Token& start = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) LATHE_TRY(expect_op(","));
      if (cur().type == TokType::VarEnd || cur().type == TokType::BlockEnd || is_op(")") ||
          (stop_at_if && (is_name("if") || is_name("recursive"))))
        break;
      LATHE_ASSIGN_OR_RETURN(ExprPtr e, parse_expression(!stop_at_if));
      items.push_back(std::move(e));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_paren) return fail("expected an expression, got " + describe(cur()));
    }
    auto t = make(ExprKind::Tuple, start);
    t->kids = std::move(items);
    return t;
  }

  Result<ExprPtr> parse_binary_chain(Result<ExprPtr> (Parser::*sub)(), std::initializer_list<const char*> ops,
                                     ExprKind kind) {
    LATHE_ASSIGN_OR_RETURN(ExprPtr left, (this->*sub)());
    while (true) {
      const char* hit = nullptr;
      for (const char* op : ops) {
        bool word = op[0] >= 'a' && op[0] <= 'z';
        if (word ? is_name(op) : is_op(op)) hit = op;
      }
      if (!hit) return left;
      const Token& t = cur();
      next();
      LATHE_ASSIGN_OR_RETURN(ExprPtr right, (this->*sub)());
      auto b = make(kind, t);
      b->name = hit;
      b->kids.push_back(std::move(left));
      b->kids.push_back(std::move(right));
      left = std::move(b);
    }
  }

  Result<ExprPtr> parse_or() { return parse_binary_chain(&Parser::parse_and, {"or"}, ExprKind::Or); }
  Result<ExprPtr> parse_and() { return parse_binary_chain(&Parser::parse_not, {"and"}, ExprKind::And); }
  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      DepthGuard g(&depth_);
      if (depth_ > kMaxDepth) return fail("expression nested too deeply");
      auto n = make(ExprKind::Not, cur());
      next();
      LATHE_ASSIGN_OR_RETURN(ExprPtr e, parse_not());
      n->kids.push_back(std::move(e));
      return n;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    const Token& start = cur();
    LATHE_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokType::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = cur().value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == TokType::Name && peek().value == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, start);
        cmp->kids.push_back(std::move(first));
      }
      LATHE_ASSIGN_OR_RETURN(ExprPtr rhs, parse_math1());
      cmp->ops.push_back(op);
      cmp->kids.push_back(std::move(rhs));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  Result<ExprPtr> parse_math1() { return parse_binary_chain(&Parser::parse_concat, {"+", "-"}, ExprKind::Binary); }
  Result<ExprPtr> parse_concat() { return parse_binary_chain(&Parser::parse_math2, {"~"}, ExprKind::Binary); }
  Result<ExprPtr> parse_math2() {
    return parse_binary_chain(&Parser::parse_pow, {"*", "/", "//", "%"}, ExprKind::Binary);
  }
  Result<ExprPtr> parse_pow() { return parse_binary_chain(&Parser::parse_unary_f, {"**"}, ExprKind::Binary); }
  Result<ExprPtr> parse_unary_f() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard g(&depth_);
    if (depth_ > kMaxDepth) return fail("expression nested too deeply");
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(is_op("-") ? ExprKind::Neg : ExprKind::Pos, cur());
      next();
      LATHE_ASSIGN_OR_RETURN(ExprPtr inner, parse_unary(false));
      node->kids.push_back(std::move(inner));
    } else {
      LATHE_ASSIGN_OR_RETURN(node, parse_primary());
    }
    LATHE_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      LATHE_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = cur();
    if (t.type == TokType::Name) {
      next();
      auto e = make(ExprKind::Const, t);
      if (t.value == "true" || t.value == "True") e->value = Value::boolean(true);
      else if (t.value == "false" || t.value == "False") e->value = Value::boolean(false);
      else if (t.value == "none" || t.value == "None") e->value = Value::none();
      else {
        e->kind = ExprKind::Name;
        e->name = t.value;
      }
      return e;
    }
    if (t.type == TokType::String) {
      auto e = make(ExprKind::Const, t);
      std::string s;
      while (cur().type == TokType::String) {
        s += cur().value;
        next();
      }
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.type == TokType::Int || t.type == TokType::Float) return parse_number(t);
    if (is_op("(")) {
      next();
      LATHE_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(true, true));
      LATHE_TRY(expect_op(")"));
      return e;
    }
    if (is_op("[")) return parse_list();
    if (is_op("{")) return parse_dict();
    return fail("unexpected " + describe(t));
  }

  Result<ExprPtr> parse_number(const Token& t) {
    next();
    auto e = make(ExprKind::Const, t);
    if (t.type == TokType::Float) {
      e->value = Value::number(std::strtod(t.value.c_str(), nullptr));
      return e;
    }
    int64_t v = 0;
    auto r = std::from_chars(t.value.data(), t.value.data() + t.value.size(), v);
    if (r.ec != std::errc() || r.ptr != t.value.data() + t.value.size())
      return fail_at(t, "integer literal out of range: " + t.value);
    e->value = Value::integer(v);
    return e;
  }

  Result<ExprPtr> parse_list() {
    auto e = make(ExprKind::List, cur());
    next();
    while (!is_op("]")) {
      if (!e->kids.empty()) {
        LATHE_TRY(expect_op(","));
        if (is_op("]")) break;
      }
      LATHE_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
      e->kids.push_back(std::move(item));
    }
    next();
    return e;
  }

  Result<ExprPtr> parse_dict() {
    auto e = make(ExprKind::Dict, cur());
    next();
    while (!is_op("}")) {
      if (!e->kids.empty()) {
        LATHE_TRY(expect_op(","));
        if (is_op("}")) break;
      }
      LATHE_ASSIGN_OR_RETURN(ExprPtr key, parse_expression());
      LATHE_TRY(expect_op(":"));
      LATHE_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      e->kids.push_back(std::move(key));
      e->kids.push_back(std::move(value));
    }
    next();
    return e;
  }

  Result<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        LATHE_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
      } else if (is_op("(")) {
        LATHE_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        LATHE_ASSIGN_OR_RETURN(node, parse_filter_chain(std::move(node)));
      } else if (is_name("is")) {
        LATHE_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
      } else if (is_op("(")) {
        LATHE_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr node) {
    const Token& t = cur();
    bool dot = is_op(".");
    next();
    if (dot) {
      if (cur().type == TokType::Name) {
        auto e = make(ExprKind::Getattr, t);
        e->name = cur().value;
        next();
        e->kids.push_back(std::move(node));
        return e;
      }
      if (cur().type != TokType::Int) return fail("expected name or number, got " + describe(cur()));
      auto e = make(ExprKind::Getitem, t);
      LATHE_ASSIGN_OR_RETURN(ExprPtr idx, parse_number(cur()));
      e->kids.push_back(std::move(node));
      e->kids.push_back(std::move(idx));
      return e;
    }
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    for (int i = 0; i < 3; ++i) {
      if (i > 0) {
        if (!is_op(":")) break;
        next();
        is_slice = true;
      }
      if (is_op(":") || is_op("]")) {
        parts.emplace_back();
      } else {
        LATHE_ASSIGN_OR_RETURN(ExprPtr p, parse_expression());
        parts.push_back(std::move(p));
      }
    }
    LATHE_TRY(expect_op("]"));
    auto e = make(is_slice ? ExprKind::Slice : ExprKind::Getitem, t);
    if (!is_slice && !parts[0]) return fail_at(t, "expected subscript expression");
    e->kids.push_back(std::move(node));
    for (auto& p : parts) e->kids.push_back(std::move(p));
    while (is_slice && e->kids.size() < 4) e->kids.emplace_back();
    return e;
  }

  Status parse_call_args(Expr* e) {
    LATHE_TRY(expect_op("("));
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        LATHE_TRY(expect_op(","));
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) return fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokType::Name && peek().type == TokType::Op && peek().value == "=") {
        std::string key = cur().value;
        next();
        next();
        LATHE_ASSIGN_OR_RETURN(ExprPtr v, parse_expression());
        e->kwargs.emplace_back(key, std::move(v));
      } else {
        if (!e->kwargs.empty()) return fail("positional argument follows keyword argument");
        LATHE_ASSIGN_OR_RETURN(ExprPtr v, parse_expression());
        e->kids.push_back(std::move(v));
      }
    }
    next();
    return Status::ok();
  }

  Result<ExprPtr> parse_call(ExprPtr node) {
    auto e = make(ExprKind::Call, cur());
    e->kids.push_back(std::move(node));
    LATHE_TRY(parse_call_args(e.get()));
    return e;
  }

  // "| name(args) | name ..."; node null for the {% filter %} / {% set %} forms.
  Result<ExprPtr> parse_filter_chain(ExprPtr node, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& t = cur();
      LATHE_ASSIGN_OR_RETURN(std::string name, expect_name());
      auto e = make(ExprKind::Filter, t);
      e->name = name;
      e->kids.push_back(std::move(node));
      if (is_op("(")) LATHE_TRY(parse_call_args(e.get()));
      node = std::move(e);
    }
    return node;
  }

  Result<ExprPtr> parse_test(ExprPtr node) {
    const Token& is_tok = cur();
    next();
    bool negated = false;
    if (is_name("not")) {
      negated = true;
      next();
    }
    LATHE_ASSIGN_OR_RETURN(std::string name, expect_name());
    auto e = make(ExprKind::Test, is_tok);
    e->name = name;
    e->kids.push_back(std::move(node));
    if (is_op("(")) {
      LATHE_TRY(parse_call_args(e.get()));
    } else if ((cur().type == TokType::Name || cur().type == TokType::String || cur().type == TokType::Int ||
                cur().type == TokType::Float || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) return fail("you cannot chain multiple tests with is");
      LATHE_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
      LATHE_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
      e->kids.push_back(std::move(arg));
    }
    if (!negated) return e;
    auto n = make(ExprKind::Not, is_tok);
    n->kids.push_back(std::move(e));
    return n;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

// Unknown filter and test names, checked as jinja2's compiler does: an error
// unless they sit inside an {% if %} or an inline if-expression (a "soft"
// frame), where they only fail if evaluated. Loops, macros and blocks inside
// an if start a new, strict frame.
Status check_expr(const Expr& e, bool soft) {
  if (!soft && ((e.kind == ExprKind::Filter && !is_known_filter(e.name)) ||
                (e.kind == ExprKind::Test && !is_known_test(e.name))))
    return invalid_argument("template syntax error at line ", e.line, ", column ", e.col, ": no ",
                            e.kind == ExprKind::Filter ? "filter" : "test", " named '", e.name, "'");
  bool inner = soft || e.kind == ExprKind::Cond;
  for (const ExprPtr& k : e.kids)
    if (k) LATHE_TRY(check_expr(*k, inner));
  for (const auto& [name, k] : e.kwargs)
    if (k) LATHE_TRY(check_expr(*k, inner));
  return Status::ok();
}

Status check_body(const Body& body, bool soft) {
  for (const StmtPtr& s : body) {
    if (s->expr) LATHE_TRY(check_expr(*s->expr, soft && s->kind != StmtKind::FilterBlock && s->kind != StmtKind::SetBlock));
    if (s->cond) LATHE_TRY(check_expr(*s->cond, false));
    for (const ExprPtr& d : s->defaults)
      if (d) LATHE_TRY(check_expr(*d, false));
    bool is_if = s->kind == StmtKind::If;
    for (const ExprPtr& c : s->conds) LATHE_TRY(check_expr(*c, true));
    for (const Body& b : s->bodies) LATHE_TRY(check_body(b, true));
    LATHE_TRY(check_body(s->body, false));
    LATHE_TRY(check_body(s->else_body, is_if));
  }
  return Status::ok();
}

}  // namespace

Result<Template> parse_template(const std::string& source, const LexOptions& opt) {
  LATHE_ASSIGN_OR_RETURN(std::vector<Token> toks, tokenize(source, opt));
  LATHE_ASSIGN_OR_RETURN(Template t, Parser(std::move(toks)).run());
  LATHE_TRY(check_body(t.body, false));
  return t;
}

}  // namespace lathe::jinja
