// Jinja parser: tokens → syntax tree, with jinja2's grammar and operator
// precedence (conditional < or < and < not < comparison < + - < ~ < * / // %
// < ** < unary < postfix/filter/test). Nesting is bounded so hostile input
// cannot exhaust the stack; errors name the line and column.
#pragma once

#include <string>

#include "io/jinja_ast.h"
#include "io/jinja_lexer.h"

namespace lathe::jinja {

struct Template {
  Body body;
};

// Unknown filter and test names are errors at parse time, as in jinja2.
Result<Template> parse_template(const std::string& source, const LexOptions& opt = {});

// The builtin filters and tests (defined with them, in jinja_filters.cpp).
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace lathe::jinja
