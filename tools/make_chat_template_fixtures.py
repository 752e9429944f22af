#!/usr/bin/env python3
"""Reference renderings for lathe's chat templates and Jinja interpreter.

Writes two files under tests/data/chat_templates/:

  expected.json     whole conversations rendered by transformers'
                    apply_chat_template(tokenize=False) with the real templates
                    of ../shared/tokenizers/{llama3,qwen3} and the templates in
                    this folder (*.jinja), with and without a generation
                    prompt, with tools, tool calls, reasoning and Korean text.
  jinja_cases.json  one small template per Jinja feature, rendered by the very
                    jinja2 environment transformers builds for chat templates
                    (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
                    its tojson, raise_exception, strftime_now, namespace, dict).

cli_messages.json and cli_expected_qwen3_{gen,nogen}.txt feed
tests/cli/chat_template_e2e.sh.

Each case records either "expected" (the exact text) or "error" (the message
of the exception raised). strftime_now is never reached: templates that call
it get a fixed date_string.

Usage: python3 tools/make_chat_template_fixtures.py   (from the repository root)
"""
import json
import os

from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "chat_templates")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "tokenizers")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 서울"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SYS = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [SYS, {"role": "user", "content": "What is 2 + 2?"}],
    "multi_turn": [
        SYS,
        {"role": "user", "content": "  Tell me a joke.  "},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "I don't know, why?"},
    ],
    "korean": [
        {"role": "user", "content": "안녕하세요! 오늘 서울 날씨 어때요?"},
        {"role": "assistant", "content": "맑고 따뜻해요. 🌞"},
        {"role": "user", "content": "고마워요.\n내일은요?"},
    ],
}

TOOL_CALL_CONVERSATION = [
    SYS,
    {"role": "user", "content": "What's the weather in Seoul?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Seoul", "unit": "celsius"}}}
        ],
    },
    {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 21°C and clear in Seoul."},
    {"role": "user", "content": "Thanks"},
]

QWEN_REASONING = [
    {"role": "user", "content": "What is 3 * 7?"},
    {"role": "assistant", "content": "21", "reasoning_content": "3 times 7 is 21."},
    {"role": "user", "content": "And 4 * 6?"},
    {"role": "assistant", "content": "<think>\n4 times 6 is 24.\n</think>\n\n24"},
]

QWEN_TOOLS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Busan?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Busan"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Seoul\"}"}},
        ],
    },
    {"role": "tool", "content": "{\"temperature\": 19}"},
    {"role": "tool", "content": "{\"temperature\": 21}"},
]


def render(tok, template, messages, add_generation_prompt, extra):
    case = {"messages": messages, "add_generation_prompt": add_generation_prompt, "extra": extra}
    kwargs = dict(extra)
    tools = kwargs.pop("tools", None)
    try:
        case["expected"] = tok.apply_chat_template(
            messages, tools=tools, chat_template=template, tokenize=False,
            add_generation_prompt=add_generation_prompt, **kwargs)
    except Exception as e:  # the template refused the input
        case["error"] = str(e)
    return case


def conversation_cases():
    cases = []
    tokenizers = {name: AutoTokenizer.from_pretrained(os.path.join(SHARED, name))
                  for name in ("llama3", "qwen3", "mistral")}

    def add(name, tokenizer, template_file, messages, extra=None, gen_both=True):
        tok = tokenizers[tokenizer]
        template = None
        if template_file:
            with open(os.path.join(OUT, template_file), encoding="utf-8") as f:
                template = f.read()
        for gen in ([False, True] if gen_both else [True]):
            case = render(tok, template, messages, gen, extra or {})
            if template and "{% generation" in template.replace("{%-", "{%") and "expected" in case:
                # The text of each {% generation %} block, as transformers' assistant-mask tracker finds it.
                kwargs = {**tok.special_tokens_map, **(extra or {})}
                rendered, indices = render_jinja_template(
                    conversations=[messages], chat_template=template, return_assistant_tokens_mask=True,
                    add_generation_prompt=gen, **kwargs)
                assert rendered[0] == case["expected"]
                case["generation_texts"] = [rendered[0][b:e] for b, e in indices[0]]
            case["name"] = f"{name}/{'gen' if gen else 'nogen'}"
            case["tokenizer"] = tokenizer
            case["template_file"] = template_file
            case["special_tokens"] = dict(tok.special_tokens_map) if template_file else {}
            cases.append(case)

    for conv_name, conv in CONVERSATIONS.items():
        add(f"llama3/{conv_name}", "llama3", None, conv)
        add(f"qwen3/{conv_name}", "qwen3", None, conv)
        for f in ("chatml.jinja", "zephyr.jinja", "mistral_inst.jinja", "llama2_sys.jinja", "chatml_generation.jinja"):
            add(f"{f}/{conv_name}", "mistral", f, conv)
        add(f"llama31_tools.jinja/{conv_name}", "llama3", "llama31_tools.jinja", conv,
            {"date_string": "26 Jul 2024"})
    add("qwen3/tools", "qwen3", None, QWEN_TOOLS, {"tools": [WEATHER_TOOL]})
    # content=None is dropped before rendering; qwen3's template then reads a
    # missing .content and fails. With content "" it renders.
    add("qwen3/tool_call_null_content", "qwen3", None, TOOL_CALL_CONVERSATION, {"tools": [WEATHER_TOOL]},
        gen_both=False)
    empty_content = [dict(m, content="") if m.get("content", 1) is None else m for m in TOOL_CALL_CONVERSATION]
    add("qwen3/tool_call_conversation", "qwen3", None, empty_content, {"tools": [WEATHER_TOOL]})
    add("qwen3/reasoning", "qwen3", None, QWEN_REASONING)
    add("qwen3/thinking_off", "qwen3", None, CONVERSATIONS["system_user"], {"enable_thinking": False})
    add("qwen3/thinking_on", "qwen3", None, CONVERSATIONS["system_user"], {"enable_thinking": True})
    add("llama31_tools.jinja/tool_call", "llama3", "llama31_tools.jinja", TOOL_CALL_CONVERSATION,
        {"tools": [WEATHER_TOOL], "date_string": "26 Jul 2024"})
    add("llama31_tools.jinja/tools_in_system", "llama3", "llama31_tools.jinja", TOOL_CALL_CONVERSATION,
        {"tools": [WEATHER_TOOL], "date_string": "01 Jan 2025", "tools_in_user_message": False})
    add("dump_messages.jinja/cleanup", "qwen3", "dump_messages.jinja", [
        {"role": "user", "content": "q", "name": None},
        {"role": "assistant", "content": None, "reasoning": "r1"},
        {"role": "assistant", "content": "a", "thinking": "t", "extra": {"k": [1, 2.5, None]}},
        {"role": "assistant", "reasoning_content": "rc", "content": "b"},
    ], gen_both=False)
    mistral_calls = [
        SYS,
        {"role": "user", "content": "Weather in Seoul and Busan?"},
        {"role": "assistant", "tool_calls": [
            {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Seoul"}}},
            {"id": "xyz987uvw", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Busan"}}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "21"},
        {"role": "tool", "tool_call_id": "xyz987uvw", "content": {"content": "19"}},
        {"role": "assistant", "content": " Seoul 21, Busan 19. "},
        {"role": "user", "content": "Thanks!"},
    ]
    add("mistral_tools.jinja/tool_calls", "mistral", "mistral_tools.jinja", mistral_calls, {"tools": [WEATHER_TOOL]})
    add("mistral_tools.jinja/no_tools", "mistral", "mistral_tools.jinja", CONVERSATIONS["multi_turn"])
    bad_id = [dict(m) for m in mistral_calls]
    bad_id[3] = dict(bad_id[3], tool_call_id="short")
    add("mistral_tools.jinja/bad_id", "mistral", "mistral_tools.jinja", bad_id, {"tools": [WEATHER_TOOL]}, gen_both=False)
    search_tool = {"type": "function", "function": {
        "name": "search_docs", "description": "  Search the knowledge base.  ",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for"},
            "max_results": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"enum": ["fast", "deep"]},
            "filters": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}},
            "required": ["query"]}}}
    add("schema_macro.jinja/tools", "llama3", "schema_macro.jinja", CONVERSATIONS["multi_turn"],
        {"tools": [search_tool, WEATHER_TOOL]})
    add("schema_macro.jinja/korean", "llama3", "schema_macro.jinja", CONVERSATIONS["korean"])
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    add("mistral_inst.jinja/not_alternating", "mistral", "mistral_inst.jinja", bad, gen_both=False)
    add("mistral_inst.jinja/tool_role", "mistral", "mistral_inst.jinja",
        [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], gen_both=False)
    add("llama2_sys.jinja/assistant_first", "mistral", "llama2_sys.jinja",
        [{"role": "assistant", "content": "hi"}], gen_both=False)
    return cases


# One template per feature; vars are the template's variables.
M = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
JINJA_CASES = [
    ("text_only", "plain text\n", {}),
    ("print_string", "{{ 'a' }}{{ \"b\" }}", {}),
    ("print_values", "{{ none }}|{{ true }}|{{ False }}|{{ 42 }}|{{ 1.5 }}|{{ 1.0 }}|{{ 1e20 }}|{{ 0.0001 }}|{{ 1e-5 }}", {}),
    ("print_list_dict", "{{ [1, 'a', none, true] }} {{ {'k': 'v', 'n': [1.5]} }} {{ (1,) }} {{ (1, 'x') }}", {}),
    ("string_escapes", "{{ 'tab\\there\\nnew \\'q\\' \\u00e9 \\x41 \\\\' }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("comment", "a{# hidden #}b\n{# line #}\nc", {}),
    ("ws_minus", "a  {{- 'b' -}}  c\n  {%- if true -%}  d  {%- endif -%}  e", {}),
    ("ws_plus", "  {%+ if true %}x{% endif %}\n  {% if true +%}\ny{% endif %}", {}),
    ("trim_blocks", "{% if true %}\nA\n{% endif %}\nB\n", {}),
    ("lstrip_blocks", "    {% if true %}\n    X\n    {% endif %}\n  {# c #}\nY", {}),
    ("lstrip_not_var", "  {{ 'v' }}\n  {% if true %}z{% endif %}", {}),
    ("trailing_newline", "abc\n", {}),
    ("crlf", "a\r\nb{% if true %}\r\nc{% endif %}", {}),
    ("raw", "{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("for_unpack", "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x % 3 == 0 %}{{ x }}/{{ loop.length }} {% endfor %}", {}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("for_prev_next", "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}", {}),
    ("for_cycle", "{% for x in range(4) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("set_scoping", "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("set_block", "{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]", {}),
    ("set_block_filter", "{% set x | upper %}shout{% endset %}{{ x }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("namespace_dict_arg", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
    ("macro_varargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}", {}),
    ("macro_scope", "{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{% for g in ['loop'] %}{{ m() }}{% endfor %}", {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}", {}),
    ("call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}", {}),
    ("generation_block", "{% generation %}assistant text{% endgeneration %}", {}),
    ("arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 6 / 3 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' + 'y' }} {{ [1] + [2] }} {{ 'ab' * 3 }} {{ [0] * 2 }}", {}),
    ("compare", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ [1, 2] == [1, 2] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ true == 1 }}", {}),
    ("logic", "{{ true and 'x' }} {{ 0 or 'y' }} {{ not 0 }} {{ '' or [] }} {{ none and 1 }} {{ not (1 and 0) }}", {}),
    ("in_operator", "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [3] }}", {}),
    ("ternary", "{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'only' if false }}]", {}),
    ("unary", "{{ -3 }} {{ -(2 + 1) }} {{ +4 }} {{ -1.5 }} {{ - 2 | abs }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ 'a' ~ (1 + 2) }} {{ not 1 == 2 }} {{ 1 + 2 ~ 3 }}", {}),
    ("concat_binds_tighter_than_plus", "{{ 'a' ~ 1 + 2 }}", {}),
    ("attr_subscript", "{{ m.role }} {{ m['content'] }} {{ xs[0] }} {{ xs[-1] }} {{ xs.1 }} {{ d.a.b }}", {"m": M[0], "xs": [10, 20, 30], "d": {"a": {"b": "deep"}}}),
    ("slicing", "{{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ 'hello'[1:3] }} {{ '안녕하세요'[::-1] }} {{ xs[5:] }}", {"xs": [1, 2, 3, 4]}),
    ("undefined", "[{{ nope }}] {{ nope is defined }} {{ nope is undefined }} {{ m.missing is defined }} {% if nope %}t{% else %}f{% endif %} {{ nope | default('dflt') }} {{ nope | length }} {% for x in nope %}x{% endfor %}", {"m": {"a": 1}}),
    ("undefined_attr_error", "{{ nope.attr }}", {}),
    ("undefined_add_error", "{{ nope + 1 }}", {}),
    ("none_attr", "[{{ n.x }}] {{ n.x is defined }}", {"n": None}),
    ("list_index_oob", "[{{ xs[10] }}]", {"xs": [1]}),
    ("dict_literal_order", "{{ {'b': 1, 'a': 2} | tojson }}", {}),
    ("tojson_plain", "{{ d | tojson }}", {"d": {"s": "é \"q\" \n 한국", "n": None, "b": True, "i": -3, "f": 2.5, "l": [1, [], {}]}}),
    ("tojson_indent", "{{ d | tojson(indent=2) }}", {"d": {"a": [1, {"b": None}], "c": {}, "e": "x"}}),
    ("tojson_sort_keys", "{{ d | tojson(sort_keys=true) }}", {"d": {"b": 1, "a": 2}}),
    ("tojson_separators", "{{ d | tojson(separators=(',', ':')) }}", {"d": {"a": [1, 2]}}),
    ("tojson_ensure_ascii", "{{ 'é한' | tojson(ensure_ascii=true) }}", {}),
    ("tojson_string_number", "{{ 'x' | tojson }} {{ 3 | tojson }} {{ 0.1 | tojson }} {{ none | tojson }}", {}),
    ("filters_text", "{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Hi' | upper }}|{{ 'Hi' | lower }}|{{ 'hELLO wORLD' | capitalize }}|{{ 'hello big-world' | title }}|{{ 'a-b-c' | replace('-', '+') }}|{{ 'aaa' | replace('a', 'b', 2) }}", {}),
    ("filters_length", "{{ 'héllo' | length }} {{ [1, 2] | length }} {{ {'a': 1} | count }}", {}),
    ("filters_convert", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 1 | string }}{{ 'ab' | list }} {{ 2 | float }}", {}),
    ("filters_join", "{{ [1, 2, 3] | join }} {{ ['a', 'b'] | join(', ') }} {{ users | join('/', attribute='name') }}", {"users": [{"name": "x"}, {"name": "y"}]}),
    ("filters_default", "{{ none | default('d') }} {{ '' | default('d', true) }} {{ 0 | d('z') }} {{ missing | d }}", {}),
    ("filters_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} [{{ [] | first }}]", {}),
    ("filters_items", "{% for k, v in d | items %}{{ k }}:{{ v }} {% endfor %}", {"d": {"x": 1, "y": [2]}}),
    ("filters_select", "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ msgs | rejectattr('role', 'eq', 'user') | list | length }} {{ [0, 1, 2, 3] | select('odd') | list }} {{ [0, 1, 2] | reject | list }} {{ msgs | selectattr('extra') | list }}", {"msgs": M + [{"role": "user", "content": "again", "extra": 1}]}),
    ("filters_map", "{{ ['a', 'b'] | map('upper') | join }} {{ msgs | map(attribute='missing', default='-') | join }} {{ [1.4, 2.6] | map('round') | list }}", {"msgs": M}),
    ("generator_truthy", "{% if [] | select %}truthy{% else %}falsy{% endif %}", {}),
    ("filters_numbers", "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 1.234 | round(1, 'floor') }} {{ 1.21 | round(1, 'ceil') }} {{ -3 | abs }} {{ -2.5 | abs }} {{ 5 | round }}", {}),
    ("filters_collections", "{{ [3, 1, 2, 1] | unique | list }} {{ ['A', 'a', 'b'] | unique | list }} {{ {'b': 1, 'A': 2, 'c': 0} | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(by='value') }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort(reverse=true) }}", {}),
    ("filters_sort_attr", "{{ xs | sort(attribute='n') | map(attribute='n') | join(',') }} {{ xs | sum(attribute='n') }} {{ xs | max(attribute='n') }} {{ [4, 9, 2] | min }}", {"xs": [{"n": 3}, {"n": 1}, {"n": 2}]}),
    ("filters_misc", "{{ 'x' | safe }} {{ '<a href=\"u\">&</a>' | e }} {{ 'l1\\nl2\\n\\nl3' | indent(2) }}|{{ 'a\\nb' | indent(first=true) }}|{{ '%s-%05.1f' | format('x', 3.14159) }}|{{ d | attr('k') }}", {"d": {"k": "v"}}),
    ("tests", "{{ none is none }} {{ 1 is number }} {{ true is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is integer }} {{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is sequence }} {{ 1 is iterable }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ true is boolean }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 2 is equalto 2 }} {{ 2 is eq(3) }} {{ 1 is not none }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 3 is gt 2 }} {{ 3 is le 2 }} {{ none is sameas none }} {{ range is callable }}", {}),
    ("string_methods", "{{ '  x  '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a\\n\\n'.rstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'hello world'.title() }}|{{ 'abca'.replace('a', 'X') }}|{{ 'hello'.find('l') }}|{{ 'hello'.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ '{} and {name}'.format(1, name='n') }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'hello'.capitalize() }}|{{ 'abc'.removeprefix('a') }}", {}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'fallback') }} {{ d['items'] is defined }}", {"d": {"a": 1, "b": 2}}),
    ("globals", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b='x') }} {{ dict([('k', 2)]) }}", {}),
    ("raise_exception", "{% if true %}{{ raise_exception('Custom failure: ' ~ 42) }}{% endif %}", {}),
    ("list_append_unsafe", "{% set xs = [] %}{{ xs.append(1) }}", {}),
    ("namespace_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}", {}),
    ("range_too_big", "{{ range(200000) | length }}", {}),
    ("syntax_error_unclosed", "line one\n{% if true %}\nno end", {}),
    ("syntax_error_bad_token", "{{ 1 + }}", {}),
    ("syntax_error_unknown_tag", "ok\n  {% frobnicate %}", {}),
    ("unknown_filter_in_dead_branch", "{% if false %}{{ x | frobnicate }}{% endif %}ok", {}),
    ("unknown_test", "{{ 1 is frobnicated }}", {}),
    ("unknown_filter_in_ternary", "{{ (x | nosuch) if false else 'fine' }}", {}),
    ("unknown_filter_in_loop_in_if", "{% if false %}{% for x in [] %}{{ x | nosuch }}{% endfor %}{% endif %}", {}),
    ("unknown_filter_evaluated_in_if", "{% if true %}{{ 'x' | nosuch }}{% endif %}", {}),
    ("string_plus_int_error", "{{ 'a' + 1 }}", {}),
    ("content_blocks", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}{% if c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}{% endif %}|{% endfor %}", {"messages": [{"role": "user", "content": [{"type": "text", "text": "part1"}, {"type": "image"}]}, {"role": "user", "content": "plain"}]}),
    ("whitespace_heavy", "{%- for m in messages -%}\n    {%- if m.role == 'user' -%}\n        U: {{ m.content }}\n    {%- else %}\n        A: {{ m.content }}\n    {% endif -%}\n{%- endfor %}\nend", {"messages": M}),
    ("loop_in_macro_namespace", "{% macro render(ms) %}{% set ns = namespace(c=0) %}{% for m in ms %}{% set ns.c = ns.c + m.content | length %}{% endfor %}{{ ns.c }}{% endmacro %}{{ render(messages) }}", {"messages": M}),
    ("is_not_defined_chain", "{% if x is not defined or x is none %}a{% endif %}{% if y is defined and y %}b{% endif %}", {"y": 1}),
    ("float_repr", "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 100.0 }} {{ 1e16 }} {{ 123456789.125 }} {{ -0.0 }} {{ 2.5e-7 }}", {}),
]


def jinja_cases():
    cases = []
    for name, src, variables in JINJA_CASES:
        case = {"name": name, "template": src, "vars": variables}
        try:
            case["expected"] = _compile_jinja_template(src).render(**variables)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    return cases


def cli_fixtures():
    """Inputs and outputs for tests/cli/chat_template_e2e.sh."""
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, "qwen3"))
    doc = {"messages": QWEN_TOOLS + [{"role": "user", "content": "요약해 주세요"}], "tools": [WEATHER_TOOL]}
    with open(os.path.join(OUT, "cli_messages.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
    for gen, suffix in ((True, "gen"), (False, "nogen")):
        text = tok.apply_chat_template(doc["messages"], tools=doc["tools"], tokenize=False,
                                       add_generation_prompt=gen, enable_thinking=False)
        with open(os.path.join(OUT, f"cli_expected_qwen3_{suffix}.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(text)


def write(name, data):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    write("expected.json", conversation_cases())
    write("jinja_cases.json", jinja_cases())
    cli_fixtures()
