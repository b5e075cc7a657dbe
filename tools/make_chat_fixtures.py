#!/usr/bin/env python3
"""make_chat_fixtures.py — reference renderings of chat templates by jinja2 itself, for tests/test_jinja.c.

The environment is the one transformers builds for apply_chat_template (utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]) with the globals
raise_exception and strftime_now and a tojson filter that keeps non-ASCII. The templates below are written here to
exercise what the templates real models ship use (namespace state across a reversed loop, tool calls through tojson,
role-alternation checks through raise_exception, macros, whitespace control, slicing, string methods, filters and
tests); the moe-mini-a template is the embedded model's own.

  python3 tools/make_chat_fixtures.py > tests/fixtures/chat_templates.json
  python3 tools/make_chat_fixtures.py --check DIR   # also render every DIR/*.jinja with the conversations (local use)
"""
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


MINI_A = json.load(open("models/moe-mini-a/tokenizer_config.json"))["chat_template"]

IM_TOOLS = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "Tools you may call, one JSON signature a line:\n" }}
    {%- for tool in tools %}
        {{- tool | tojson }}
        {{- "\n" }}
    {%- endfor %}
    {{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set st = namespace(searching=true, last_user=messages|length - 1) %}
{%- for m in messages[::-1] %}
    {%- set idx = (messages|length - 1) - loop.index0 %}
    {%- if st.searching and m.role == "user" and m.content is string and not m.content.startswith('<result>') %}
        {%- set st.searching = false %}
        {%- set st.last_user = idx %}
    {%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- set content = m.content if m.content is string else '' %}
    {%- if m.role == "user" or (m.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif m.role == "assistant" %}
        {%- set thought = '' %}
        {%- if m.reasoning_content is string %}
            {%- set thought = m.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set thought = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > st.last_user and (loop.last or thought) %}
            {{- '<|im_start|>assistant\n<think>\n' + thought.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- for call in m.tool_calls | default([]) %}
            {%- if (loop.first and content) or not loop.first %}{{- '\n' }}{%- endif %}
            {%- if call.function %}{%- set call = call.function %}{%- endif %}
            {{- '<call>{"name": "' + call.name + '", "arguments": ' }}
            {{- call.arguments if call.arguments is string else call.arguments | tojson }}
            {{- '}</call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif m.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<result>\n' + content + '\n</result>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

ALTERNATING = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set sys = messages[0]['content'] %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set sys = none %}
    {%- set rest = messages %}
{%- endif %}
{%- for message in rest %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and sys is not none %}
            {{- ' [INST] ' + sys + '\n\n' + message['content'] | trim + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] | trim + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, got ' ~ message['role']) }}
    {%- endif %}
{%- endfor %}"""

HEADERS = r"""{%- set date_string = date_string | default("26 Jul 2024") -%}
{{- bos_token -}}
{%- macro header(role) -%}<|start_header_id|>{{ role }}<|end_header_id|>

{% endmacro -%}
{%- if messages[0].role == 'system' -%}
    {%- set system_message = messages[0].content | trim -%}
    {%- set messages = messages[1:] -%}
{%- else -%}
    {%- set system_message = "" -%}
{%- endif -%}
{{- header('system') -}}
Today Date: {{ date_string }}
{% if tools is not none and tools | length > 0 %}
Functions:
{% for t in tools %}{{ t | tojson(indent=4) }}
{% endfor %}
{%- endif %}
{{ system_message }}<|eot_id|>
{%- for message in messages %}
{{- header(message.role) + message.content | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- header('assistant') -}}{%- endif -%}"""

FEATURES = r"""{# every construct once #}
{%- set xs = [3, 1, 2] -%}
sorted={{ xs | sort }} rev={{ xs | reverse | list }} len={{ xs | length }} first={{ xs | first }} last={{ xs | last }}
sum={{ xs | sum }} max={{ xs | max }} min={{ xs | min }} join={{ xs | join('-') }} uniq={{ [1, 1, 2] | unique | list }}
slices={{ xs[1:] }} {{ xs[:-1] }} {{ xs[::2] }} {{ "héllo"[1:3] }} {{ "abc"[::-1] }} idx={{ xs[-1] }}
math={{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }}
cmp={{ 1 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1] == [1] }} {{ 'x' in 'xyz' }} {{ 3 not in xs }} {{ 'k' in {'k': 1} }}
logic={{ true and 'y' }} {{ false or 'z' }} {{ not none }} {{ 'a' if xs else 'b' }} {{ 'c' if not xs else 'd' }}
str={{ "  pad  " | trim }}|{{ "Hello World".lower() }}|{{ "hello world" | title }}|{{ "x,y,,z".split(",") }}|{{ " a  b ".split() }}
{{ "a-b-c".rsplit("-", 1) }} {{ "abc".replace("b", "B") }} {{ "abc".upper() }} {{ "aXbXc".split("X", 1) }} {{ "xxhixx".strip("x") }}
{{ "abc".startswith(("z", "a")) }} {{ "abc".endswith("bc") }} {{ "banana".count("an") }} {{ "banana".find("n") }} {{ "{} and {}".format(1, "two") }}
tests={{ none is none }} {{ 1 is number }} {{ 'a' is string }} {{ {} is mapping }} {{ undefined_thing is defined }} {{ 4 is even }} {{ 9 is divisibleby 3 }}
repr={{ [1, 'two', none, true, 2.5, {'k': 'v'}] }} {{ {'a': [1, 2]} }} {{ "it's" }} {{ ["it's"] }}
json={{ {'b': 1, 'a': [true, none, "é\n"]} | tojson }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}
{{ {'k': [1, {'z': none}]} | tojson(indent=2) }}
loop={% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %} {% for x in xs if x > 1 %}{{ x }}@{{ loop.index0 }} {% endfor %}
{% for k, v in {'one': 1, 'two': 2}.items() %}{{ k }}={{ v }};{% endfor %} {% for x in [] %}never{% else %}empty{% endfor %}
ctl={% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %} {{ range(2, 9, 3) | list }}
{% set ns = namespace(total=0) %}{% for i in range(5) %}{% set ns.total = ns.total + i %}{% endfor %}ns={{ ns.total }}
{% set block %}inside {{ xs | length }}{% endset %}block={{ block }}
{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}macro={{ greet('a') }} {{ greet('b', punct='?') }}
filters={{ none | default('dflt') }} {{ '' | default('empty', true) }} {{ 'x' | default('no') }} {{ '3' | int + 1 }} {{ 2 | float }} {{ -3 | abs }} {{ 2.567 | round(2) }}
{{ [{'n': 'a', 'on': true}, {'n': 'b', 'on': false}] | selectattr('on') | map(attribute='n') | list }} {{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3] | reject('odd') | list }}
{{ [{'r': 'user'}, {'r': 'system'}] | selectattr('r', 'equalto', 'system') | list | length }} {{ "a\nb" | indent(2) }} {{ ['x', 'y'] | map('upper') | join }}
{{ {'b': 2, 'a': 1} | dictsort }} {{ [{'k': 2}, {'k': 1}] | sort(attribute='k') | map(attribute='k') | join(',') }} {{ 'ab' ~ 1 ~ none }}
ws:   {%- if true %}   tight   {%- endif %}   |
  {% if true %}
    lstripped
  {% endif %}
{%+ if true %}kept-indent{% endif %}
{% raw %}{{ not rendered }}{% endraw %}
{{ "%s-%d" % ("a", 3) }} {{ messages | length }} {{ messages[0].content }} {{ messages[0]['role'] }} {{ messages[0].missing is defined }}
"""

ERRORS = [
    ("raise", "{{ raise_exception('bad roles') }}"),
    ("undefined_attr", "{{ nothing.attr }}"),
    ("unclosed_if", "{% if true %}x"),
    ("unknown_tag", "{% frobnicate %}"),
    ("bad_expr", "{{ 1 + }}"),
    ("unclosed_var", "{{ x"),
    ("not_callable", "{{ 3() }}"),
    ("immutable_set_attr", "{% set d = {'a': 1} %}{% set d.a = 2 %}"),
    ("div_zero", "{{ 1 // 0 }}"),
    ("stray_endfor", "{% endfor %}"),
]

CONVERSATIONS = {
    "simple": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_multi": {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "  And 3+3?  "}]},
    "unicode": {"messages": [{"role": "user", "content": "naïve café — 日本語 \"quoted\" \\ back"}]},
    "tools": {
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "<think>\nneed weather\n</think>\n\nChecking.",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                             "arguments": {"city": "Paris", "unit": "c"}}}]},
            {"role": "tool", "content": "{\"temp\": 21}"},
            {"role": "tool", "content": "{\"sky\": \"clear\"}"},
            {"role": "assistant", "content": "It is 21 C and clear."},
            {"role": "user", "content": "Thanks"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                                    "parameters": {"type": "object", "properties": {
                                                        "city": {"type": "string"}}, "required": ["city"]}}}]},
    "bad_alternation": {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
    "no_think": {"messages": [{"role": "user", "content": "hi"}], "enable_thinking": False},
}


def render(env, src, conv, gen):
    vars_ = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": gen, "tools": None}
    vars_.update(conv)
    try:
        return {"vars": vars_, "expected": env.from_string(src).render(**vars_)}
    except Exception as e:
        return {"vars": vars_, "error": str(e)}


def main():
    env = hf_env()
    cases = []
    templates = {"moe-mini-a": MINI_A, "im-tools": IM_TOOLS, "alternating": ALTERNATING, "headers": HEADERS}
    for tname, src in templates.items():
        for cname, conv in CONVERSATIONS.items():
            for gen in (True, False):
                r = render(env, src, conv, gen)
                r.update(name=f"{tname}/{cname}/{'gen' if gen else 'nogen'}", template=src)
                cases.append(r)
    r = render(env, FEATURES, CONVERSATIONS["simple"], True)
    r.update(name="features", template=FEATURES)
    cases.append(r)
    for name, src in ERRORS:
        try:
            env.from_string(src).render(x=1)
            raise SystemExit(f"error case {name} rendered without an error")
        except Exception as e:  # jinja2 raises TemplateError and Python's own (TypeError, ZeroDivisionError)
            cases.append({"name": "error/" + name, "template": src, "vars": {"x": 1}, "error": str(e)})
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        import glob
        import os
        for path in sorted(glob.glob(os.path.join(sys.argv[2], "*.jinja"))):
            src = open(path).read()
            for cname, conv in CONVERSATIONS.items():
                r = render(env, src, conv, True)
                r.update(name=f"{os.path.basename(path)}/{cname}", template=src)
                cases.append(r)
    json.dump(cases, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
