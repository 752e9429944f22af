// The Jinja interpreter, one feature per case. Expected text comes from
// jinja2 itself, configured as transformers configures it for chat templates
// (tests/data/chat_templates/jinja_cases.json, made by
// tools/make_chat_template_fixtures.py). Hand-written tests below cover what
// Python cannot give us: error positions, resource limits, the clock.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/jinja_eval.h"

namespace lathe::jinja {
namespace {

nlohmann::ordered_json load_cases() {
  std::ifstream f(std::string(LATHE_TEST_DATA) + "/chat_templates/jinja_cases.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

Result<std::string> render_source(const std::string& src, const ValueDict& vars = {}, const RenderOptions& opt = {}) {
  LATHE_ASSIGN_OR_RETURN(Template t, parse_template(src));
  return render(t, vars, opt);
}

TEST(Jinja, MatchesJinja2OnEveryFeatureCase) {
  nlohmann::ordered_json cases = load_cases();
  ASSERT_GT(cases.size(), 80u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ValueDict vars = Value::from_json(c["vars"]).as_dict();
    Result<std::string> out = render_source(c["template"].get<std::string>(), vars);
    if (c.contains("expected")) {
      ASSERT_TRUE(out.is_ok()) << out.status().message();
      EXPECT_EQ(*out, c["expected"].get<std::string>());
    } else {
      EXPECT_FALSE(out.is_ok()) << "jinja2 raised " << c["error"] << " but lathe rendered: " << *out;
    }
  }
}

TEST(Jinja, RaiseExceptionCarriesTheTemplateMessageVerbatim) {
  Result<std::string> out = render_source("x\n{% if true %}{{ raise_exception('Roles must alternate') }}{% endif %}");
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().message(), "Roles must alternate");
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  Result<std::string> out = render_source("line one\nline two {{ 1 + }}");
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("line 2, column 17"), std::string::npos) << out.status().message();
  out = render_source("ok\n  {% frobnicate %}");
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("line 2"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("frobnicate"), std::string::npos);
  out = render_source("{% for x in xs %}\n{{ x }}");
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("endfor"), std::string::npos) << out.status().message();
  out = render_source("{{ 'unterminated }}");
  EXPECT_FALSE(out.is_ok());
  out = render_source("{# never closed");
  EXPECT_FALSE(out.is_ok());
}

TEST(Jinja, RuntimeErrorsNameTheLine) {
  Result<std::string> out = render_source("a\nb\n{{ missing.attr }}");
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("line 3"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("'missing' is undefined"), std::string::npos);
}

TEST(Jinja, StepBudgetStopsRunawayLoops) {
  RenderOptions opt;
  opt.max_steps = 100'000;
  Result<std::string> out =
      render_source("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}", {}, opt);
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("step budget"), std::string::npos) << out.status().message();
}

TEST(Jinja, OutputLimitStopsHugeStrings) {
  RenderOptions opt;
  opt.max_output_bytes = 1 << 16;
  EXPECT_FALSE(render_source("{{ 'x' * 100000000 }}", {}, opt).is_ok());
  EXPECT_FALSE(render_source("{% for i in range(1000) %}{{ 'y' * 1000 }}{% endfor %}", {}, opt).is_ok());
}

TEST(Jinja, RecursionIsBounded) {
  EXPECT_FALSE(render_source("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").is_ok());
  std::string deep(5000, '(');
  EXPECT_FALSE(render_source("{{ " + deep + "1" + std::string(5000, ')') + " }}").is_ok());
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_FALSE(render_source(nested).is_ok());
}

TEST(Jinja, EscapedCallerAndNamespaceCyclesAreSafe) {
  EXPECT_FALSE(render_source("{% set ns = namespace() %}{% macro m() %}{% set ns.c = caller %}{% endmacro %}"
                             "{% for i in [1] %}{% call m() %}x{% endcall %}{% endfor %}{{ ns.c() }}")
                   .is_ok());
  Result<std::string> out = render_source("{% set ns = namespace(n=1) %}{% set ns.me = ns %}{{ ns.me.me.n }}");
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "1");
}

TEST(Jinja, StrftimeNowUsesTheInjectedClock) {
  RenderOptions opt;
  opt.now = [] { return std::time_t{1721952000}; };  // 2024-07-26 00:00:00 UTC
  Result<std::string> out = render_source("{{ strftime_now('%Y') }}", {}, opt);
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "2024");
}

TEST(Jinja, NamespaceIsSharedAcrossScopes) {
  ValueDict vars;
  vars.set("xs", Value::list({Value::integer(1), Value::integer(2), Value::integer(3)}));
  Result<std::string> out = render_source(
      "{% set ns = namespace(total=0) %}{% for x in xs %}{% if x > 1 %}{% set ns.total = ns.total + x %}"
      "{% endif %}{% endfor %}{{ ns.total }}",
      vars);
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "5");
}

TEST(Jinja, FloatReprIsShortestRoundTrip) {
  EXPECT_EQ(float_repr(0.1), "0.1");
  EXPECT_EQ(float_repr(1.0), "1.0");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(0.00001), "1e-05");
  EXPECT_EQ(float_repr(-2.5), "-2.5");
}

}  // namespace
}  // namespace lathe::jinja
