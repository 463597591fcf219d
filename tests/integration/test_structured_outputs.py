#!/usr/bin/env python3
"""Structured outputs and token controls against `paged serve` on the default
model, with the official openai SDK:

- client.chat.completions.parse with Pydantic models (nested models, lists,
  Literal enums, Optional, numbers with bounds) returns parsed objects;
- 200 random JSON schemas from a seeded generator (nested objects, arrays
  with minItems/maxItems, enums, const, patterns, anyOf, integer and number
  ranges, required/optional, additionalProperties) each produce output that
  `jsonschema` validates; an output cut by max_tokens counts as a failure;
- json_object mode, guided_choice, guided_regex, guided_grammar (GBNF),
  structured_outputs {...}, /v1/completions with response_format,
  streaming, n = 2;
- logit_bias -100 removes a token, +100 forces it; allowed_token_ids;
  bad_words; best_of.

PAGED_SCHEMAS=N changes the count of random schemas (default 200)."""
import concurrent.futures as cf
import json
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()

import jsonschema  # noqa: E402
import openai  # noqa: E402
from typing import List, Literal, Optional  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

N_SCHEMAS = int(os.environ.get("PAGED_SCHEMAS", "200"))


# --- random schemas -------------------------------------------------------------------

WORDS = ["name", "city", "color", "size", "kind", "code", "level", "owner", "price", "count",
         "title", "label", "score", "tag", "year", "id", "note", "state", "mode", "rank"]
PATTERNS = [r"^[a-z]{2,6}$", r"^[A-Z][a-z]{1,6}$", r"^[0-9]{3}-[0-9]{2}$", r"^(red|green|blue)$",
            r"^[a-f0-9]{4}$", r"^x[0-9]{1,6}y$"]


def gen_schema(rng, depth=0):
    """A schema whose every instance is short (bounded strings, arrays and
    numbers), so max_tokens can be chosen to fit."""
    kinds = ["string", "integer", "number", "boolean", "enum", "pattern", "anyof", "const"]
    if depth < 2:
        kinds += ["object", "object", "array"]
    k = rng.choice(kinds)
    if k == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 10)}
    if k == "integer":
        lo = rng.randint(-50, 50)
        s = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
        if rng.random() < 0.3:
            s = {"type": "integer", "exclusiveMinimum": lo, "exclusiveMaximum": lo + rng.randint(2, 100)}
        return s
    if k == "number":
        lo = rng.randint(-20, 20)
        return {"type": "number", "minimum": lo, "maximum": lo + rng.randint(1, 100)}
    if k == "boolean":
        return {"type": "boolean"}
    if k == "enum":
        vals = rng.sample(["alpha", "beta", "gamma", "delta", 1, 2, 3, True, None], rng.randint(1, 4))
        return {"enum": vals}
    if k == "const":
        return {"const": rng.choice(["fixed", 7, False])}
    if k == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if k == "anyof":
        return {"anyOf": [gen_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    if k == "array":
        mn = rng.randint(0, 2)
        return {"type": "array", "items": gen_schema(rng, depth + 1), "minItems": mn,
                "maxItems": mn + rng.randint(0, 2)}
    props = {}
    for w in rng.sample(WORDS, rng.randint(1, 4)):
        props[w] = gen_schema(rng, depth + 1)
    req = [p for p in props if rng.random() < 0.6]
    s = {"type": "object", "properties": props, "required": req}
    if rng.random() < 0.7:
        s["additionalProperties"] = False
    return s


# --- Pydantic models for parse() --------------------------------------------------------

class Pet(BaseModel):
    name: str = Field(max_length=20)
    species: Literal["cat", "dog", "bird"]
    age: int = Field(ge=0, le=30)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    pets: List[Pet] = Field(max_length=3)


class Weather(BaseModel):
    city: str = Field(max_length=30)
    temperature_c: float = Field(ge=-50, le=60)
    condition: Literal["sunny", "cloudy", "rain", "snow"]
    humidity: Optional[int] = Field(ge=0, le=100)


class Step(BaseModel):
    explanation: str = Field(max_length=60)
    output: str = Field(max_length=30)


class MathAnswer(BaseModel):
    steps: List[Step] = Field(max_length=3)
    final_answer: str = Field(max_length=20)


def main():
    with su.Server() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=300, max_retries=0)
        port = srv.port

        model = client.models.list().data[0].id

        def chat(content, **kw):
            return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                                  **kw)

        def parse_pydantic():
            cases = [(Person, "Describe a person who owns two pets, as JSON."),
                     (Weather, "What is the weather in Paris today? Answer as JSON."),
                     (MathAnswer, "Solve 8x + 7 = -23 step by step."),
                     (Pet, "Invent a pet.")]
            for cls, prompt in cases:
                r = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": prompt}],
                                                  response_format=cls, max_tokens=400, temperature=0.7, seed=1)
                msg = r.choices[0].message
                assert r.choices[0].finish_reason == "stop", (cls.__name__, r.choices[0].finish_reason, msg.content)
                assert isinstance(msg.parsed, cls), (cls.__name__, msg.content)
                print(f"     {cls.__name__}: {msg.content}")

        def random_schemas():
            rng = random.Random(17)
            schemas = [gen_schema(rng) for _ in range(N_SCHEMAS)]
            # The root is an object (as OpenAI requires) about half the time.
            schemas = [s if s.get("type") == "object" or i % 2 else
                       {"type": "object", "properties": {"value": s}, "required": ["value"]}
                       for i, s in enumerate(schemas)]

            def one(i):
                s = schemas[i]
                jsonschema.Draft202012Validator.check_schema(s)
                body = {"model": model, "messages": [{"role": "user", "content": "Produce JSON for this schema: " + json.dumps(s)}],
                        "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s, "strict": True}},
                        "max_tokens": 500, "temperature": 0.8, "seed": i}
                st, _, data = su.request(port, "POST", "/v1/chat/completions", body, timeout=600)
                if st != 200:
                    return i, "http %d: %s" % (st, data[:200])
                ch = json.loads(data)["choices"][0]
                text = ch["message"]["content"]
                if ch["finish_reason"] != "stop":
                    return i, "finish_reason %s: %s" % (ch["finish_reason"], text[:200])
                try:
                    jsonschema.validate(json.loads(text), s)
                except Exception as ex:  # noqa: BLE001
                    return i, "invalid: %s: %s" % (str(ex).splitlines()[0], text[:200])
                return i, None

            t0 = time.time()
            with cf.ThreadPoolExecutor(16) as ex:
                results = list(ex.map(one, range(len(schemas))))
            bad = [(i, why) for i, why in results if why]
            for i, why in bad[:10]:
                print(f"     schema {i}: {json.dumps(schemas[i])}\n       {why}")
            print(f"     {len(schemas) - len(bad)}/{len(schemas)} schemas valid in {time.time() - t0:.0f} s"
                  f" ({sum(1 for _, w in bad if w.startswith('finish_reason length'))} cut by max_tokens)")
            assert not bad, f"{len(bad)} of {len(schemas)} outputs failed"

        def other_spellings():
            r = chat("List three colors as a JSON object.", response_format={"type": "json_object"}, max_tokens=200)
            assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content
            r = chat("Is water wet?", extra_body={"guided_choice": ["yes", "no", "maybe"]}, max_tokens=10)
            assert r.choices[0].message.content in ("yes", "no", "maybe"), r.choices[0].message.content
            r = chat("Give me a date.", extra_body={"guided_regex": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"},
                     max_tokens=20)
            assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]", r.choices[0].message.content), r
            gbnf = 'root ::= "The answer is " num "."\nnum ::= [1-9] [0-9]{0,2}\n'
            r = chat("What is 6 times 7?", extra_body={"guided_grammar": gbnf}, max_tokens=20)
            assert re.fullmatch(r"The answer is [1-9][0-9]{0,2}\.", r.choices[0].message.content), r
            r = chat("Pick a fruit.", extra_body={"structured_outputs": {"choice": ["apple", "pear"]}}, max_tokens=5)
            assert r.choices[0].message.content in ("apple", "pear")
            c = client.completions.create(model=model, max_tokens=200, temperature=0,
                                          prompt="Here is a small JSON object describing a book (title, year):\n",
                                          extra_body={"response_format": {"type": "json_object"}})
            assert c.choices[0].finish_reason == "stop", c.choices[0]
            assert isinstance(json.loads(c.choices[0].text), dict), c.choices[0].text
            # Streaming: the deltas concatenate to a valid object.
            schema = Person.model_json_schema()
            text = ""
            for ch in chat("Describe a person.", stream=True, max_tokens=300,
                           response_format={"type": "json_schema",
                                            "json_schema": {"name": "p", "schema": schema}}):
                if ch.choices and ch.choices[0].delta.content:
                    text += ch.choices[0].delta.content
            Person.model_validate_json(text)
            # n = 2: every choice follows the schema.
            r = chat("Invent a pet.", n=2, max_tokens=100, temperature=1.0,
                     response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": Pet.model_json_schema()}})
            assert len(r.choices) == 2
            for c in r.choices:
                Pet.model_validate_json(c.message.content)

        def logit_bias():
            prompt = "The capital of France is"
            tok = su.post(port, "/tokenize", {"prompt": " Paris"})[1]["tokens"]
            assert len(tok) == 1, tok
            paris = tok[0]
            base = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0, logprobs=1)
            assert base.choices[0].text == " Paris", base.choices[0].text
            r = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                          logit_bias={str(paris): -100})
            assert " Paris" not in r.choices[0].text, r.choices[0].text
            banana = su.post(port, "/tokenize", {"prompt": " banana"})[1]["tokens"][0]
            for seed in range(3):
                r = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=1.0, seed=seed,
                                              logit_bias={str(banana): 100})
                assert r.choices[0].text == " banana" * 4, r.choices[0].text
            r = chat("Say hello.", max_tokens=3, logit_bias={str(banana): 100})
            assert r.choices[0].message.content == " banana" * 3, r.choices[0].message.content
            r = chat("Say hello.", max_tokens=3, logit_bias={})
            assert r.choices[0].message.content
            # allowed_token_ids: only these come out.
            ids = su.post(port, "/tokenize", {"prompt": " yes no"})[1]["tokens"]
            r = client.completions.create(model=model, prompt="Answer:", max_tokens=5,
                                          extra_body={"allowed_token_ids": ids})
            out = su.post(port, "/tokenize", {"prompt": r.choices[0].text})[1]["tokens"]
            assert set(out) <= set(ids), (r.choices[0].text, out, ids)
            # bad_words: a one-token and a two-token word never appear.
            r = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0,
                                          extra_body={"bad_words": ["Paris", "the capital"]})
            assert "Paris" not in r.choices[0].text and "the capital" not in r.choices[0].text, r.choices[0].text
            # best_of: the n of best_of candidates with the highest cumulative
            # logprob; the same seed with n = best_of shows all candidates.
            kw = dict(model=model, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=3)
            best = client.completions.create(n=2, best_of=5, **kw)
            every = client.completions.create(n=5, logprobs=0, **kw)
            ranked = sorted(every.choices, key=lambda c: -sum(c.logprobs.token_logprobs))
            assert [c.text for c in best.choices] == [c.text for c in ranked[:2]], (best.choices, ranked)
            assert [c.index for c in best.choices] == [0, 1] and best.choices[0].logprobs is None

        su.run_checks([
            ("chat.completions.parse with Pydantic models", parse_pydantic),
            (f"{N_SCHEMAS} random JSON schemas validate (jsonschema)", random_schemas),
            ("json_object, guided_choice/regex/grammar, structured_outputs, completions, stream, n=2",
             other_spellings),
            ("logit_bias -100 removes, +100 forces; allowed_token_ids; bad_words; best_of", logit_bias),
        ])
    print("test_structured_outputs: all passed")


if __name__ == "__main__":
    main()
