// The syntax tree the Jinja parser builds and the interpreter walks. Two node
// families: Expr (values) and Stmt (output-producing statements). Both are
// plain structs with a kind tag and child lists rather than a class per node:
// the interpreter switches on the kind, which keeps each rule in one place.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/jinja_value.h"

namespace lathe::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind : uint8_t {
  Const,     // value
  Name,      // name
  List,      // kids
  Tuple,     // kids
  Dict,      // kids: key0, value0, key1, value1, ...
  Getattr,   // kids[0].name
  Getitem,   // kids[0][kids[1]]
  Slice,     // kids[0][kids[1]:kids[2]:kids[3]] (null kids for omitted parts)
  Call,      // kids[0](kids[1..], kwargs)
  Filter,    // name: filter; kids[0] the input (null inside {% filter %}), kids[1..] args
  Test,      // name: test; kids[0] the input, kids[1..] args
  Not,       // not kids[0]
  Neg,       // -kids[0]
  Pos,       // +kids[0]
  Binary,    // kids[0] name kids[1]: + - * / // % ** ~
  Compare,   // kids[0] ops[0] kids[1] ops[1] kids[2]...: == != < > <= >= in notin
  And,
  Or,
  Cond,      // kids[1] if kids[0] else kids[2] (kids[2] null when absent)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int col = 0;
  std::string name;
  Value value;
  std::vector<std::string> ops;  // Compare only
  std::vector<ExprPtr> kids;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

enum class StmtKind : uint8_t {
  Text,        // text
  Output,      // {{ expr }}
  If,          // conds[i] → bodies[i]; else_body
  For,         // targets in expr [if cond]; body; else_body
  Set,         // targets (or ns_attr on targets[0]) = expr
  SetBlock,    // {% set name %}body{% endset %}, optional filter expr
  Macro,       // name(params = defaults) body
  CallBlock,   // {% call(params) expr %}body{% endcall %}
  FilterBlock, // {% filter f %}body{% endfilter %}
  Break,
  Continue,
  Scope,       // a plain body ({% generation %} renders its content as is)
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  int col = 0;
  std::string text;
  std::string name;                  // macro name, or namespace attribute for Set
  std::vector<std::string> targets;  // loop/set targets, or macro params
  std::vector<ExprPtr> defaults;     // macro param defaults (null for none)
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
};

}  // namespace lathe::jinja
