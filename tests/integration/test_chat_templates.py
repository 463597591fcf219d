#!/usr/bin/env python3
"""paged's Jinja engine against Python's jinja2 on real chat templates.

Every template in tests/data/chat_templates/ (README.md there says where
each came from) is rendered with a set of conversations (system/user/
assistant, multi-turn, tools, tool calls and results, add_generation_prompt
on and off, chat_template_kwargs) twice: by `paged render-template` and by
jinja2 set up exactly as Hugging Face's apply_chat_template sets it up
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
the generation tag, raise_exception, strftime_now, HF's tojson). The two
outputs must be identical; where jinja2 raises (a template that refuses a
conversation), paged must fail too, with the same raise_exception text.

Usage: .venv/bin/python3 tests/integration/test_chat_templates.py [-v] [NAME_SUBSTRING]
"""
import copy
import glob
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGED = os.path.join(ROOT, "build/paged")
TEMPLATES = os.path.join(ROOT, "tests/data/chat_templates")


class TemplateError(Exception):
    pass


# --- Hugging Face's environment (transformers/utils/chat_template_utils.py) --------------

class AssistantTracker(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def hf_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# --- conversations --------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "integer", "minimum": 0}},
            "required": ["a", "b"]}}},
]


def call(i, name, args):
    return {"id": f"call{i}abcd"[:9], "type": "function", "function": {"name": name, "arguments": args}}


SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! How are you?"}
A1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
U2 = {"role": "user", "content": "Tell me a joke about \"quotes\" and 'apostrophes'.\nTwo lines."}
UW = {"role": "user", "content": "What is the weather in Paris?"}
TC1 = {"role": "assistant", "content": "", "tool_calls": [call(1, "get_weather", {"city": "Paris", "unit": "celsius"})]}
TR1 = {"role": "tool", "tool_call_id": "call1abcd", "name": "get_weather", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"}
TC2 = {"role": "assistant", "content": "", "tool_calls": [call(1, "get_weather", {"city": "Paris"}), call(2, "add", {"a": 1.5, "b": 2})]}
TR2 = {"role": "tool", "tool_call_id": "call2abcd", "name": "add", "content": "3.5"}
AF = {"role": "assistant", "content": "It is 21.5 degrees and clear in Paris."}
UNI = {"role": "user", "content": "  Übersetze: «café» → 咖啡 🙂\t\n"}

CONVERSATIONS = [
    ("user", [U1], {}),
    ("system_user", [SYS, U1], {}),
    ("multi_turn", [SYS, U1, A1, U2], {}),
    ("no_system_multi", [U1, A1, U2], {}),
    ("ends_assistant", [U1, A1], {}),
    ("unicode_ws", [SYS, UNI], {}),
    ("tools_offered", [SYS, UW], {"tools": TOOLS}),
    ("tools_no_system", [UW], {"tools": TOOLS}),
    ("tool_round_trip", [SYS, UW, TC1, TR1], {"tools": TOOLS}),
    ("tool_final", [SYS, UW, TC1, TR1, AF], {"tools": TOOLS}),
    ("parallel_calls", [UW, TC2, copy.deepcopy(TR1), TR2], {"tools": TOOLS}),
    # OpenAI clients send arguments as a JSON string; some templates (DeepSeek)
    # expect that, others a dict (vLLM and paged pass a dict when it parses).
    ("string_arguments", [UW, {"role": "assistant", "content": None, "tool_calls": [
        call(1, "get_weather", "{\"city\": \"Paris\"}")]}, TR1], {"tools": TOOLS}),
    ("thinking_off", [SYS, U1], {"enable_thinking": False}),
    ("thinking_on", [U1, A1, U2], {"enable_thinking": True}),
]


def contexts():
    for name, msgs, extra in CONVERSATIONS:
        for gen in (True, False):
            ctx = {"messages": msgs, "tools": None, "documents": None, "add_generation_prompt": gen,
                   "bos_token": "<|BOS|>", "eos_token": "<|EOS|>", "unk_token": "<unk>", "pad_token": "<pad>"}
            ctx.update(copy.deepcopy(extra))
            yield f"{name}{'+gen' if gen else ''}", ctx


def render_python(template, ctx):
    try:
        return True, template.render(**copy.deepcopy(ctx))
    except TemplateError as e:
        return False, str(e)
    except Exception as e:  # a template bug hit by this conversation
        return False, f"{type(e).__name__}: {e}"


def render_paged(path, ctxs):
    """Every context in one `paged render-template --each` run: [(ok, text or error)]."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ctxs, f)
    try:
        p = subprocess.run([PAGED, "render-template", path, "--each", f.name],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:  # the template itself did not parse
        return [(False, p.stderr.decode().strip())] * len(ctxs)
    return [(True, r["text"]) if "text" in r else (False, r["error"]) for r in json.loads(p.stdout)]


def first_diff(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"at {i}: jinja2 {a[max(0, i - 60):i + 60]!r}\n            paged  {b[max(0, i - 60):i + 60]!r}"


def main():
    verbose = "-v" in sys.argv
    only = [a for a in sys.argv[1:] if not a.startswith("-")]
    env = hf_env()
    files = sorted(glob.glob(os.path.join(TEMPLATES, "*.jinja")))
    assert len(files) >= 20, f"the corpus has {len(files)} templates, expected at least 20"
    failures, checked, refused = [], 0, 0
    for path in files:
        name = os.path.basename(path)
        if only and not any(o in name for o in only):
            continue
        src = open(path, encoding="utf-8").read()
        template = env.from_string(src)
        cases = list(contexts())
        paged = render_paged(path, [ctx for _, ctx in cases])
        for (cname, ctx), (ok_pg, out_pg) in zip(cases, paged):
            ok_py, out_py = render_python(template, ctx)
            checked += 1
            if not ok_py:
                refused += 1
                # jinja2 refused: paged must refuse too (same text for raise_exception).
                if ok_pg:
                    failures.append(f"{name} [{cname}]: jinja2 failed ({out_py}) but paged rendered")
                elif not out_py.startswith(tuple(t + ":" for t in ("TypeError", "UndefinedError", "ValueError", "KeyError", "AttributeError", "SecurityError"))) \
                        and out_py not in out_pg:
                    failures.append(f"{name} [{cname}]: raise_exception text differs:\n  jinja2 {out_py!r}\n  paged  {out_pg!r}")
                elif verbose:
                    print(f"  {name} [{cname}]: both refuse: {out_py[:100]}")
                continue
            if not ok_pg:
                failures.append(f"{name} [{cname}]: paged failed: {out_pg}")
            elif out_py != out_pg:
                failures.append(f"{name} [{cname}]: output differs {first_diff(out_py, out_pg)}")
    for f in failures:
        print("FAIL", f)
    print(f"{checked} renders of {len(files)} templates, {refused} refused by the template itself, "
          f"{len(failures)} mismatches")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
