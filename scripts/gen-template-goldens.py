#!/usr/bin/env python3
"""Generate chat-template goldens for tests/unit/test_template.c.

Renders every template in ../shared/testdata/templates/ (or --templates DIR) for the
conversations below with Python jinja2 (pip install jinja2), in the environment that
transformers' apply_chat_template builds (transformers/utils/chat_template_utils.py:
_compile_jinja_template / render_jinja_template):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
  filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=)
  globals["raise_exception"] raises TemplateError(message)
  globals["strftime_now"] = datetime.now().strftime(fmt)   (here: the fixed time NOW)
  render(messages=..., tools=... or None, documents=None, add_generation_prompt=...,
         bos_token=..., eos_token=..., **extra)

Writes tests/data/templates/conversations.json (the inputs) and
tests/data/templates/goldens/<template>.json: for each case either the rendered text
or the exception (type and message) jinja2 raised. kiln must render the same bytes, or
fail too.

Usage: scripts/gen-template-goldens.py [--templates DIR] [--out DIR]
"""
import argparse
import datetime
import hashlib
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = "2026-01-15T10:30:00"  # what kiln's test sets as KILN_TEMPLATE_NOW
BOS = "<s>"
EOS = "</s>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "integer", "default": 5},
                "safe": {"type": "boolean"},
                "ratio": {"type": "number"},
            },
            "required": ["query"],
        },
    },
}

CONVERSATIONS = {
    "sys_user": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
    },
    "user_only": {"messages": [{"role": "user", "content": "Hello!"}]},
    "multi_turn": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "1, 2, 3."},
            {"role": "user", "content": "Now backwards."},
        ]
    },
    "no_system_multi": {
        "messages": [
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road?"},
            {"role": "user", "content": "Why?"},
        ]
    },
    "unicode": {
        "messages": [
            {"role": "system", "content": "  Réponds en français. \"Quotes\" and 'apostrophes' \\ backslash  "},
            {"role": "user", "content": "日本語のテキスト 🎉 emoji\n\ttab <b>html</b> & amp\nline3\n"},
        ]
    },
    "multimodal": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Describe this."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "It is a cat."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks"}, {"type": "text", "text": "!"}]},
        ]
    },
    "reasoning": {
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "reasoning_content": "The user asks 2+2. That is 4.", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ]
    },
    "think_in_content": {
        "messages": [
            {"role": "system", "content": "Think first."},
            {"role": "user", "content": "Is 7 prime?"},
            {"role": "assistant", "content": "<think>\n7 has no divisors but 1 and 7.\n</think>\n\nYes, 7 is prime."},
            {"role": "user", "content": "And 9?"},
        ]
    },
    "tools_defined": {
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "What's the weather in Paris?"},
        ],
        "tools": [WEATHER_TOOL, SEARCH_TOOL],
    },
    "tool_call": {
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
            {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
            {"role": "user", "content": "And in Tokyo?"},
        ],
        "tools": [WEATHER_TOOL],
    },
    "parallel_tools": {
        "messages": [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "Weather in Oslo and news about kiln?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                    {"id": "call_b", "type": "function", "function": {"name": "search", "arguments": {"query": "kiln inference", "max_results": 3, "safe": True, "ratio": 0.5}}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "-3 C, snow"},
            {"role": "tool", "tool_call_id": "call_b", "name": "search", "content": "No results."},
        ],
        "tools": [WEATHER_TOOL, SEARCH_TOOL],
    },
    "tool_args_string": {
        "messages": [
            {"role": "user", "content": "Search for cats."},
            {
                "role": "assistant",
                "content": "Searching.",
                "tool_calls": [
                    {"id": "call_s", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"cats\"}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_s", "content": "Cats are mammals."},
        ],
        "tools": [SEARCH_TOOL],
    },
    "assistant_last": {
        "messages": [
            {"role": "system", "content": "You complete sentences."},
            {"role": "user", "content": "Start a story."},
            {"role": "assistant", "content": "Once upon a time"},
        ]
    },
    "system_only": {"messages": [{"role": "system", "content": "Only a system prompt."}]},
    "empty_content": {
        "messages": [
            {"role": "user", "content": ""},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": " "},
        ]
    },
    "reasoning_tool_call": {
        "messages": [
            {"role": "system", "content": "Think, then act."},
            {"role": "user", "content": "Weather in Rome?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "reasoning_content": "I should call get_weather for Rome.",
                "tool_calls": [
                    {"id": "call_r", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_r", "name": "get_weather", "content": "{\"temperature\": 25}"},
            {"role": "assistant", "content": "It is 25 °C in Rome.", "reasoning_content": "The tool said 25."},
            {"role": "user", "content": "Thanks! And Milan?"},
        ],
        "tools": [WEATHER_TOOL],
    },
    "tool_call_multi_turn": {
        "messages": [
            {"role": "user", "content": "Find cats."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": {"query": "cats"}}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "search", "content": "Cats: small, furry."},
            {"role": "assistant", "content": "Cats are small and furry."},
            {"role": "user", "content": "Now dogs."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "search", "arguments": {"query": "dogs"}}}]},
            {"role": "tool", "tool_call_id": "c2", "name": "search", "content": "Dogs: loyal."},
        ],
        "tools": [SEARCH_TOOL],
    },
    "thinking_on": {
        "messages": [
            {"role": "user", "content": "Why is the sky blue?"},
        ],
        "vars": {"enable_thinking": True, "reasoning_effort": "high"},
    },
    "thinking_off": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a color."},
        ],
        "vars": {"enable_thinking": False},
    },
}

# Small templates, one feature each, rendered with a fixed context (goldens/features.json).
FEATURE_CONTEXT = {
    "msgs": [{"role": "system", "content": " sys "}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "extra": None}],
    "d": {"b": 2, "a": 1, "C": 3},
    "s": "  Hello, World!  ",
    "u": "héllo wörld 日本",
    "n": 7,
    "f": 2.5,
    "xs": [3, 1, 2, 1],
    "words": ["b", "A", "a", "C"],
    "none": None,
    "t": True,
    "nested": {"k": [1, {"x": "y"}], "e": [], "o": {}},
}
FEATURES = [
    ("ws_trim_lstrip", "a\n  {% if true %}\n  b\n  {% endif %}\nc {% if 1 %}d{% endif %}\n"),
    ("ws_minus", "x  \n  {%- if true -%}  \n y  {{- ' z ' -}}  \n{%- endif %}\n\nw"),
    ("ws_plus", "a\n  {%+ if true +%}\nb\n  {%+ endif %}\nc"),
    ("ws_comment", "a\n  {# c #}\nb {#- c -#} c\n{# multi\nline #}\nd"),
    ("ws_var_not_lstripped", "a\n  {{ 'v' }}\n  {% set x = 1 %}\nb"),
    ("ws_after_var", "{{ 'a' }}  {% if true %}b{% endif %}\n  {% if true %}c{% endif %}"),
    ("raw", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}  |"),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n"),
    ("trailing_newline", "x\n"),
    ("two_trailing_newlines", "x\n\n"),
    ("loop_vars", "{% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}"),
    ("loop_prev_next", "{% for x in xs %}{{ loop.previtem is defined }}{{ loop.nextitem | default('-') }}{{ loop.cycle('a','b') }},{% endfor %}"),
    ("loop_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"),
    ("loop_filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }};{% endfor %}"),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
    ("loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}"),
    ("loop_string", "{% for ch in u %}[{{ ch }}]{% endfor %}"),
    ("loop_scope", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }};{% endfor %}{{ x }}"),
    ("nested_loop", "{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.depth }}{% endfor %}{{ loop.depth }}{% endfor %}"),
    ("namespace", "{% set ns = namespace(a=1, found=false) %}{% for m in msgs %}{% set ns.a = ns.a + 1 %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.a }} {{ ns.found }}"),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (1, 'x') %}{{ c }}{{ (1,) }}{{ () }}"),
    ("set_block", "{% set x %}  inner {{ n }}  {% endset %}[{{ x }}]{% set y | trim | upper %}  abc  {% endset %}[{{ y }}]"),
    ("macro", "{% macro m(a, b='B', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(a=3, c=4) }}"),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}"),
    ("macro_too_many", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
    ("macro_scope", "{% macro m() %}{{ z }}{% endmacro %}{% set z = 1 %}{{ m() }}{% set z = 2 %}{{ m() }}"),
    ("macro_caller", "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}inside {{ n }}{% endcall %}"),
    ("macro_caller_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1,2]) %}[{{ v }}]{% endcall %}"),
    ("filter_block", "{% filter upper %}hello {{ n }}{% endfilter %}|{% filter trim | replace('a', 'o') %}  banana  {% endfilter %}"),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}"),
    ("generation", "{% for m in msgs %}{% generation %}{{ m.content }}{% set inner = 1 %}{% endgeneration %}{% endfor %}{{ inner is defined }}"),
    ("slicing", "{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ u[1:4] }}{{ u[-2:] }}{{ xs[10:] }}{{ 'abc'[::-1] }}{{ xs[-1] }}{{ u[0] }}"),
    ("getattr_getitem", "{{ msgs[0].role }}{{ msgs[0]['content'] }}{{ d.a }}{{ d['b'] }}{{ nested.k[1].x }}{{ msgs[5] is defined }}{{ d.zz is defined }}{{ d.get('a') }}{{ d.get('zz', 'def') }}{{ d.get('zz') }}"),
    ("attr_on_none", "{{ none.foo is defined }}{{ n.foo is defined }}"),
    ("undefined_attr_error", "{{ missing.attr }}"),
    ("undefined_ops", "[{{ missing }}]{{ missing is defined }}{{ missing | default('dflt') }}{{ missing | length }}{{ not missing }}{% for x in missing %}x{% endfor %}{{ missing == missing }}"),
    ("undefined_add_error", "{{ missing + 1 }}"),
    ("str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ s.startswith('  H') }}{{ s.endswith(('x', '  ')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ u.find('w') }}{{ u.count('l') }}|{{ '-'.join(['a','b']) }}|{{ 'l1\nl2\r\nl3'.splitlines() }}|{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ '  '.isspace() }}"),
    ("str_format", "{{ '{}-{}'.format(1, 'a') }}{{ '{0}{0}{x}'.format('z', x=5) }}{{ '{{}}'.format() }}"),
    ("str_percent", "{{ '%s is %d' % ('x', 3) }}{{ '%s' % 'y' }}{{ 'p%%' % () }}{{ '%r' | format('q') }}{{ '%s-%s' | format(1, 2) }}"),
    ("dict_methods", "{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}{{ d | length }}"),
    ("tests", "{{ n is number }}{{ f is float }}{{ n is integer }}{{ t is boolean }}{{ s is string }}{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ d is sequence }}{{ none is none }}{{ n is odd }}{{ n is even }}{{ n is divisibleby 7 }}{{ n is divisibleby(2) }}{{ 'a' is in 'abc' }}{{ n is eq 7 }}{{ n is ne 7 }}{{ n is gt 3 }}{{ 'ab' is lower }}{{ t is true }}{{ t is false }}{{ t is not none }}{{ range is callable }}{{ missing is undefined }}{{ t is sameas true }}"),
    ("in_operator", "{{ 'a' in 'cat' }}{{ 1 in xs }}{{ 'a' in d }}{{ 'z' not in d }}{{ 5 not in xs }}"),
    ("in_error", "{{ 1 in 'abc' }}"),
    ("ternary", "{{ 'y' if t else 'n' }}{{ 'y' if none else 'n' }}{{ 'only' if false }}|{{ 1 if false else 2 if true else 3 }}"),
    ("and_or_values", "{{ 0 or 'x' }}{{ 'a' and 'b' }}{{ none or [] }}{{ '' and 1 }}{{ not 0 }}"),
    ("arithmetic", "{{ 1 + 2 * 3 }}{{ (1 + 2) * 3 }}{{ 7 / 2 }}{{ 7 // 2 }}{{ -7 // 2 }}{{ 7 % 3 }}{{ -7 % 3 }}{{ 2 ** 10 }}{{ 2 ** -1 }}{{ 1.5 + 1 }}{{ -n }}{{ +n }}{{ -2 ** 2 }}{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 'a' ~ 1 ~ none ~ t }}{{ [1] + [2] }}{{ 10 - 2.5 }}{{ 7.0 // 2 }}{{ 7.5 % 2 }}{{ True + 1 }}"),
    ("comparisons", "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' != 'a' }}{{ none == none }}{{ 2 >= 2 }}"),
    ("compare_error", "{{ 1 < 'a' }}"),
    ("float_repr", "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 1.0 }} {{ 100.0 / 3 }} {{ 1e22 }} {{ 123456789.0 * 1000 }} {{ 0.0001 }} {{ -0.0 }} {{ 3.0 * 2 }} {{ 2.5e-10 }}"),
    ("repr_str", "{{ ['a', \"b'c\", 'd\"e', 'f\\'g\"h', 'new\\nline', 'tab\\t', 'back\\\\slash', 'é', none, true, 1.5] }}{{ {'k': [1, {'x': none}]} }}"),
    ("string_literals", "{{ 'a\\nb' }}|{{ \"q\\\"q\" }}|{{ 'u\\u00e9\\x41' }}|{{ 'unknown \\d escape' }}|{{ 'adj' 'acent' }}"),
    ("tojson_basic", "{{ d | tojson }}|{{ msgs | tojson }}|{{ 'é\"\\\\\\n\\t<>&' | tojson }}|{{ [1, 2.5, none, true, 'x'] | tojson }}|{{ nested | tojson }}"),
    ("tojson_indent", "{{ nested | tojson(indent=2) }}|{{ d | tojson(indent=4) }}|{{ [] | tojson(indent=2) }}"),
    ("tojson_options", "{{ d | tojson(sort_keys=true) }}|{{ u | tojson(ensure_ascii=true) }}|{{ '🎉' | tojson(ensure_ascii=True) }}|{{ d | tojson(separators=(',', ':')) }}"),
    ("tojson_error", "{{ missing | tojson }}"),
    ("filters_string", "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'ab cd' | title }}|{{ 'aBC' | capitalize }}|{{ s | replace('l', 'L') }}|{{ s | length }}|{{ u | length }}|{{ 'x' | center(7) }}|{{ 'one two  three' | wordcount }}|{{ n | string }}|{{ '<a href=\"x\">' | e }}|{{ 'a' | safe }}|{{ 'xay' | trim('xy') }}"),
    ("filter_indent", "{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(4, first=true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}|{{ 'x\ny' | indent('> ') }}"),
    ("filters_list", "{{ xs | first }}{{ xs | last }}{{ xs | sort }}{{ xs | sort(reverse=true) }}{{ words | sort }}{{ words | sort(case_sensitive=true) }}{{ xs | unique | list }}{{ words | unique | list }}{{ xs | min }}{{ xs | max }}{{ words | max }}{{ xs | sum }}{{ xs | reverse | list }}{{ xs | join(',') }}{{ xs | join }}{{ [] | first is defined }}{{ 'abc' | list }}{{ d | list }}"),
    ("filters_dict", "{{ d | dictsort }}{{ d | dictsort(true) }}{{ d | dictsort(by='value', reverse=true) }}{{ d | items | list }}"),
    ("filters_select", "{{ msgs | selectattr('role', 'equalto', 'user') | list }}{{ msgs | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}{{ xs | select('odd') | list }}{{ xs | reject('odd') | list }}{{ [0, 1, '', 'a'] | select | list }}{{ msgs | map(attribute='missing', default='z') | list }}{{ words | map('upper') | list }}{{ msgs | selectattr('extra', 'defined') | list | length }}{{ msgs | selectattr('extra', 'none') | list | length }}"),
    ("filters_numbers", "{{ '42' | int }}{{ '4.7' | int }}{{ 'x' | int }}{{ 'x' | int(5) }}{{ 3.9 | int }}{{ '2.5' | float }}{{ n | float }}{{ -3 | abs }}{{ 2.567 | round(2) }}{{ 2.5 | round }}{{ 3.5 | round }}{{ 2.1 | round(method='ceil') }}{{ '0x1A' | int(0, 16) }}{{ ' 12 ' | int }}"),
    ("default_filter", "{{ missing | default('a') }}{{ none | default('b') }}{{ '' | default('c', true) }}{{ 0 | d('e', boolean=true) }}{{ n | default(1) }}"),
    ("range_global", "{{ range(3) | list }}{{ range(1, 10, 3) | list }}{{ range(5, 0, -2) | list }}{{ range(0) | list }}"),
    ("dict_global", "{{ dict(a=1, b='x') }}{{ {'a': 1, 'b': 2} }}{{ {} }}"),
    ("strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %-d, %Y %A') }}"),
    ("raise_exception", "{% if n > 5 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}"),
    ("unknown_filter_in_if", "{% if false %}{{ x | nosuch }}{% endif %}ok"),
    ("unknown_filter_top", "{{ x | nosuch }}"),
    ("unknown_test_in_if_taken", "{% if true %}{{ 1 is nosuch }}{% endif %}"),
    ("unknown_tag", "{% do x %}"),
    ("sandbox_append", "{% set l = [1] %}{% set _ = l.append(2) %}{{ l }}"),
    ("sandbox_pop_dict", "{{ d.pop('a') }}"),
    ("sandbox_update", "{% set _ = d.update({'x': 1}) %}"),
    ("ns_assign_error", "{% set x = 1 %}{% set x.y = 2 %}"),
    ("loop_outer", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in [3] %}{{ outer.index }}{{ loop.index }}{% endfor %}{% endfor %}"),
    ("loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }}{% endfor %}"),
    ("output_types", "{{ none }}|{{ t }}|{{ n }}|{{ f }}|{{ xs }}|{{ d }}|{{ (1, 2) }}|{{ nested.e }}|{{ nested.o }}"),
    ("concat_list_error", "{{ 'a' + [1] }}"),
    ("items_on_string_error", "{{ s | items | list }}"),
    ("iterate_none_error", "{% for x in none %}{% endfor %}"),
    ("multiline_expr", "{{\n  'a'\n  ~ 'b'\n}}{%\n  if true\n%}c{% endif %}"),
    ("nested_braces", "{{ {'a': {'b': 1}}['a'] }}{{ [[1]] }}"),
    ("elif_chain", "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}other{% endif %},{% endfor %}"),
    ("set_in_if_leaks", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}"),
    ("string_compare_unicode", "{{ 'é' > 'z' }}{{ ['b', 'é', 'a'] | sort }}"),
    ("length_none_error", "{{ none | length }}"),
    ("whitespace_inside_tags", "{%if true%}a{%endif%}{{n}}{{- n -}}{%- if true -%} b {%- endif -%}"),
    ("lstrip_after_var_newline", "{{ 'x' }}\n    {% if true %}y{% endif %}"),
    ("minus_inside_expression", "{{ n -1 }}{{ n- 1 }}{{ n - -1 }}"),
    ("markup_concat", "{{ '<a>' | safe + '<b>' }}|{{ '<c>' + '&' | safe }}|{{ '<d>' | e }}|{{ ('<e>' | e) | e }}|{{ '<f>' | safe ~ '<g>' }}|{{ ('<h>' | safe) | upper + '<i>' }}"),
    ("generator_truthy", "{{ 'y' if ([] | select) else 'n' }}{{ 'y' if ([] | list) else 'n' }}{% if msgs | selectattr('role', 'equalto', 'nobody') %}always{% endif %}"),
    ("generator_consumed", "{% set g = xs | select('odd') %}{{ g | list }}{{ g | list }}{% set h = xs | map('string') %}{{ h | first }}{{ h | join(',') }}"),
    ("generator_len_error", "{{ xs | map('string') | length }}"),
    ("generator_tojson_error", "{{ xs | select('odd') | tojson }}"),
    ("dict_views", "{{ d.items() }}{{ d.keys() }}{{ d.values() | length }}{{ 'a' in d.keys() }}"),
    ("percent_float", "{{ '%.2f' | format(3.14159) }}{{ '%5s|%-5s|' % ('a', 'b') }}{{ '%03d' % 7 }}{{ '%x' % 255 }}"),
    ("recursive_macro", "{% macro render(v) %}{% if v is mapping %}{{ '{' }}{% for k, x in v.items() %}{{ k }}:{{ render(x) }},{% endfor %}{{ '}' }}{% elif v is iterable and v is not string %}[{% for x in v %}{{ render(x) }}{% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ render(nested) }}"),
    ("macro_no_loop", "{% macro m() %}{{ loop is defined }}{% endmacro %}{% for x in [1] %}{{ m() }}{{ loop is defined }}{% endfor %}"),
    ("content_join", "{{ msgs | map(attribute='content') | join('\\n') }}|{{ (msgs | length) - 1 }}|{% for m in msgs[::-1] %}{{ m.role[0] }}{% endfor %}"),
    ("multimodal_text", "{% set c = [{'type': 'text', 'text': 'a'}, {'type': 'image'}, {'type': 'text', 'text': 'b'}] %}{{ c | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') }}"),
    ("sum_floats", "{{ [1.5, 2] | sum }}{{ [] | sum }}{{ [1, 2] | sum(start=10) }}{{ 'x' ~ 1.0 }}{{ d | dictsort | first }}"),
    ("not_parens", "{{ not (t or none) }}{{ not t and none }}{{ (1, 2) == (1, 2) }}{{ [1, 2] == (1, 2) }}"),
    ("replace_newlines", "{{ 'a\nb' | replace('\n', '\\n') }}|{{ 'a.b.c'.split('.', 1) }}|{{ 'x'.join(['1', '2', '3']) }}"),
    ("loop_index_ops", "{% for x in range(5) %}{{ loop.index0 % 2 }}{{ 'e' if loop.index is even else 'o' }}{% endfor %}"),
    ("tojson_nested_unicode", "{{ {'k': '日本', 'e': '🎉', 'c': '\x01\x7f'} | tojson }}|{{ {'k': '日本'} | tojson(ensure_ascii=true) }}|{{ [1e100, 0.1, -0.0, 1.0] | tojson }}"),
    ("bool_int_keys", "{{ {1: 'a', true: 'b'} }}{{ {1: 'x', 2.5: 'y', none: 'z'} | tojson }}"),
    ("items_loop", "{% for k, v in nested.items() %}{{ k }}={{ v | tojson }};{% endfor %}"),
    ("string_tests_unicode", "{{ 'ÀB' | lower }}{{ 'àb' | upper }}{{ 'éa' | title }}{{ '  x\u3000' | trim | length }}"),
    ("unicode_whitespace_control", "a\u00a0\u3000 {%- if true -%}\u2003 b \u00a0{{- 'c' -}}\u3000\n d{% endif %}"),
    ("int_float_strings", "{{ '0x10' | int }}{{ '0x10' | int(0, 16) }}{{ '10' | int(0, 2) }}{{ '0b11' | int(0, 0) }}{{ '1_000' | int }}{{ '0x1p3' | float }}{{ ' 2.5 ' | float }}{{ 'nan' | float }}{{ '-inf' | float }}{{ '007' | int }}"),
    ("call_without_caller", "{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}"),
    ("with_outer_values", "{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}"),
    ("namespace_item", "{% set ns = namespace(a=1) %}{{ ns['a'] }}{{ ns }}{{ ns.missing is defined }}"),
    ("truncate", "{{ 'hello world foo bar' | truncate(11) }}|{{ 'hello world foo bar' | truncate(11, true) }}|{{ 'hello world foo bar' | truncate(9, false, '..', 0) }}|{{ 'short' | truncate(3, leeway=5) }}|{{ 'abcdefghij' | truncate(5, leeway=0) }}|{{ 'a b' | truncate(3, leeway=0, end='') }}"),
    ("batch_slice", "{{ xs | batch(3) | list }}|{{ xs | batch(3, 'x') | list }}|{{ [1,2,3,4,5,6,7] | slice(3) | list }}|{{ [1,2,3,4,5,6,7] | slice(3, 0) | list }}|{{ [] | batch(2) | list }}"),
    ("select_on_none", "{{ none | selectattr('x') | list }}{{ none | map('upper') | list }}"),
]


class AssistantTracker(Extension):
    """transformers' {% generation %} extension: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromisoformat(NOW).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_case(env, source, conv, agp):
    try:
        tpl = env.from_string(source)
    except Exception as e:  # compile-time failure (syntax, unknown filter/test)
        return {"error_type": type(e).__name__, "error": str(e), "stage": "compile"}
    kwargs = dict(conv.get("vars", {}))
    kwargs.update(
        messages=conv["messages"], tools=conv.get("tools"), documents=None, add_generation_prompt=agp, bos_token=BOS, eos_token=EOS
    )
    try:
        return {"output": tpl.render(**kwargs)}
    except Exception as e:
        return {"error_type": type(e).__name__, "error": str(e), "stage": "render"}


def write_template_gguf(path, template_path):
    """Tiny GGUF with general.architecture, a 4-token vocabulary, BOS/EOS ids, the
    default template and a named variant (tokenizer.chat_template.tool_use)."""
    import gguf  # pip install gguf

    with open(template_path, encoding="utf-8") as f:
        tpl = f.read()
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "hi"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_string("tokenizer.chat_template", tpl)
    w.add_string("tokenizer.chat_template.tool_use", "{{ bos_token }}tools={{ tools | length }}{{ eos_token }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", default=os.path.join(root, "..", "shared", "testdata", "templates"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "templates"))
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "goldens"), exist_ok=True)
    with open(os.path.join(args.out, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"now": NOW, "bos_token": BOS, "eos_token": EOS, "jinja2_version": jinja2.__version__, "conversations": CONVERSATIONS},
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")
    env = make_env()
    names = sorted(n for n in os.listdir(args.templates) if n.endswith(".jinja"))
    stats = {"output": 0, "error": 0}
    for name in names:
        with open(os.path.join(args.templates, name), "rb") as f:
            raw = f.read()
        source = raw.decode("utf-8")
        cases = []
        for conv_name, conv in CONVERSATIONS.items():
            for agp in (False, True):
                r = render_case(env, source, conv, agp)
                r = {"conversation": conv_name, "add_generation_prompt": agp, **r}
                stats["output" if "output" in r else "error"] += 1
                cases.append(r)
        golden = {"template": name, "sha256": hashlib.sha256(raw).hexdigest(), "cases": cases}
        with open(os.path.join(args.out, "goldens", name[: -len(".jinja")] + ".json"), "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, indent=1)
            f.write("\n")
    # fixture for tests/unit/test_template_cli.sh: one real template through `kiln template`
    cli = os.path.join(args.out, "cli")
    os.makedirs(cli, exist_ok=True)
    conv = CONVERSATIONS["tool_call"]
    for fname, obj in (("messages.json", conv["messages"]), ("tools.json", conv["tools"])):
        with open(os.path.join(cli, fname), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
    with open(os.path.join(args.templates, "Qwen-Qwen2.5-7B-Instruct.jinja"), encoding="utf-8") as f:
        r = render_case(env, f.read(), conv, True)
    with open(os.path.join(cli, "expected-qwen25-tool_call.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(r["output"])
    # a vocab-only GGUF carrying a real template, for `kiln template -m` (needs pip gguf)
    write_template_gguf(os.path.join(cli, "qwen25-template.gguf"), os.path.join(args.templates, "Qwen-Qwen2.5-7B-Instruct.jinja"))
    feats = []
    for fname, ftpl in FEATURES:
        r = render_case(env, ftpl, {"messages": [], "vars": FEATURE_CONTEXT}, False)
        feats.append({"name": fname, "template": ftpl, "context": FEATURE_CONTEXT, **r})
    with open(os.path.join(args.out, "goldens", "features.json"), "w", encoding="utf-8") as f:
        json.dump(feats, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(FEATURES)} feature templates, {sum('output' in x for x in feats)} rendered")
    print(f"{len(names)} templates, {stats['output']} renderings, {stats['error']} errors (jinja2 {jinja2.__version__})")


if __name__ == "__main__":
    sys.exit(main())
