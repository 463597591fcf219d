#!/usr/bin/env python3
"""tool_choice "required" and a named function are enforced by the
structured-output engine (the function's JSON schema, as vLLM does), with
no prompt engineering: the default model gets a bare question, and the
answer must be a tool call whose arguments validate against the schema,
through the official openai SDK, streamed and not."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()
import jsonschema  # noqa: E402
import openai  # noqa: E402

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_forecast", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "maxLength": 16}}, "required": ["zone"]}}}]
MSGS = [{"role": "user", "content": "Will it rain in Paris this week?"}]


def check_call(call, names):
    assert call.function.name in names, call
    args = json.loads(call.function.arguments)
    schema = SCHEMA if call.function.name == "get_forecast" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(args, schema)
    return args


def main():
    with su.Server() as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        model = c.models.list().data[0].id
        named = {"type": "function", "function": {"name": "get_forecast"}}
        r = c.chat.completions.create(model=model, messages=MSGS, tools=TOOLS, tool_choice=named,
                                      max_tokens=64, temperature=0)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch
        print("named:", check_call(ch.message.tool_calls[0], {"get_forecast"}))
        r = c.chat.completions.create(model=model, messages=MSGS, tools=TOOLS, tool_choice="required",
                                      max_tokens=96, temperature=0)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
        for call in ch.message.tool_calls:
            print("required:", call.function.name, check_call(call, {"get_forecast", "get_time"}))
        # Streamed: the name first, then argument deltas; the same call.
        name, args, finish = None, "", None
        for chunk in c.chat.completions.create(model=model, messages=MSGS, tools=TOOLS, tool_choice=named,
                                               max_tokens=64, temperature=0, stream=True):
            d = chunk.choices[0].delta if chunk.choices else None
            for tc in (d.tool_calls or []) if d else []:
                if tc.function and tc.function.name:
                    assert name is None and args == "", "the name comes first, once"
                    name = tc.function.name
                if tc.function and tc.function.arguments:
                    args += tc.function.arguments
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        assert name == "get_forecast" and finish == "tool_calls", (name, finish)
        jsonschema.validate(json.loads(args), SCHEMA)
        print("streamed:", args)
    print("test_tool_choice_constrained: ok")


if __name__ == "__main__":
    main()
