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

Result<Template> parse_template(const std::string& source, const LexOptions& opt = {});

}  // namespace lathe::jinja
