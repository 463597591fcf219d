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

PAGED_SCHEMAS=N changes the count of random schemas (default 200).

On another machine (a GPU host, which may lack jsonschema, openai and
pydantic), run only the random schemas and keep the outputs:

    PAGED_BIN=build/paged PAGED_MODEL=M PAGED_EXTRA_ARGS="--device cuda" \
        python3 tests/integration/test_structured_outputs.py --dump out.json

(needs nothing beyond the standard library), then validate them here:

    python3 tests/integration/test_structured_outputs.py --validate out.json
"""
import concurrent.futures as cf
import json
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

def usage():
    print(__doc__)
    sys.exit(2)


# "full" (every check), "dump" (random schemas' outputs to a file) or
# "validate" (a dumped file against its schemas, no server).
MODE, MODE_FILE = "full", None
if len(sys.argv) == 3 and sys.argv[1] in ("--dump", "--validate"):
    MODE, MODE_FILE = sys.argv[1][2:], sys.argv[2]
elif len(sys.argv) != 1:
    usage()

if MODE != "validate":
    su.require_model_and_binary()
if MODE != "dump":
    # The repository's .venv has these (deploy/quickstart.sh setup).
    if MODE == "full":
        su.require_openai()
    import jsonschema  # noqa: E402
if MODE == "full":
    import openai  # noqa: E402

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


def random_schema_list():
    rng = random.Random(17)
    schemas = [gen_schema(rng) for _ in range(N_SCHEMAS)]
    # The root is an object (as OpenAI requires) about half the time.
    return [s if s.get("type") == "object" or i % 2 else
            {"type": "object", "properties": {"value": s}, "required": ["value"]}
            for i, s in enumerate(schemas)]


def generate(port, model, schemas):
    """Each schema's request; a list of {i, schema, http, finish_reason, text}."""
    def one(i):
        s = schemas[i]
        body = {"model": model, "messages": [{"role": "user", "content": "Produce JSON for this schema: " + json.dumps(s)}],
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s, "strict": True}},
                "max_tokens": 500, "temperature": 0.8, "seed": i}
        st, _, data = su.request(port, "POST", "/v1/chat/completions", body, timeout=600)
        r = {"i": i, "schema": s, "http": st, "finish_reason": None, "text": None}
        if st != 200:
            r["text"] = data[:200].decode("utf-8", "replace") if isinstance(data, bytes) else str(data)[:200]
            return r
        ch = json.loads(data)["choices"][0]
        r["finish_reason"] = ch["finish_reason"]
        r["text"] = ch["message"]["content"]
        return r

    with cf.ThreadPoolExecutor(16) as ex:
        return list(ex.map(one, range(len(schemas))))


def check(results):
    """Validates generate()'s results with jsonschema; prints the first
    failures and returns how many failed."""
    bad = []
    for r in results:
        s, text = r["schema"], r["text"]
        jsonschema.Draft202012Validator.check_schema(s)
        if r["http"] != 200:
            bad.append((r["i"], s, "http %d: %s" % (r["http"], text)))
        elif r["finish_reason"] != "stop":
            bad.append((r["i"], s, "finish_reason %s: %s" % (r["finish_reason"], text[:200])))
        else:
            try:
                jsonschema.validate(json.loads(text), s)
            except Exception as ex:  # noqa: BLE001
                bad.append((r["i"], s, "invalid: %s: %s" % (str(ex).splitlines()[0], text[:200])))
    for i, s, why in bad[:10]:
        print(f"     schema {i}: {json.dumps(s)}\n       {why}")
    cut = sum(1 for _, _, w in bad if w.startswith("finish_reason length"))
    print(f"     {len(results) - len(bad)}/{len(results)} schemas valid ({cut} cut by max_tokens)")
    return len(bad)


def dump_main():
    with su.Server() as srv:
        model = json.loads(su.request(srv.port, "GET", "/v1/models")[2])["data"][0]["id"]
        t0 = time.time()
        results = generate(srv.port, model, random_schema_list())
        with open(MODE_FILE, "w") as f:
            json.dump({"model": model, "server_args": su.EXTRA_ARGS, "results": results}, f, indent=1)
    print(f"test_structured_outputs: {len(results)} outputs in {time.time() - t0:.0f} s written to {MODE_FILE}"
          f" (validate: {sys.argv[0]} --validate {MODE_FILE})")


def validate_main():
    with open(MODE_FILE) as f:
        d = json.load(f)
    print(f"     {MODE_FILE}: model {d['model']}, server args {d['server_args']}")
    n_bad = check(d["results"])
    if n_bad:
        print(f"test_structured_outputs --validate: {n_bad} of {len(d['results'])} outputs failed")
        sys.exit(1)
    print("test_structured_outputs --validate: all valid")


# --- Pydantic models for parse() --------------------------------------------------------

def define_models():
    """The Pydantic models, as module globals (full mode only: pydantic
    may be missing where --dump runs)."""
    from typing import List, Literal, Optional
    from pydantic import BaseModel, Field
    global Pet, Person, Weather, Step, MathAnswer

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
    if MODE == "dump":
        return dump_main()
    if MODE == "validate":
        return validate_main()
    define_models()
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
            t0 = time.time()
            schemas = random_schema_list()
            n_bad = check(generate(port, model, schemas))
            print(f"     in {time.time() - t0:.0f} s")
            assert not n_bad, f"{n_bad} of {len(schemas)} outputs failed"

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
