#!/usr/bin/env python3
"""Speculative decoding with n-gram prompt lookup through the real server
(docs/speculative_decoding.md): --speculative-config must not change a
greedy text, only how many steps it takes.

1. Twenty greedy prompts on the default model - ten of the held-out set and
   ten copy-heavy ones (a 200-token passage to repeat, code to echo, a list
   and JSON to continue) where prompt lookup finds long matches - give
   exactly the same texts with and without
   '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
   "prompt_lookup_min": 2}' (same max_tokens), sent four at a time so
   drafts share steps with plain decodes and prefills.
2. /metrics of the speculating server counts drafts, draft tokens and
   accepted tokens (> 0, accepted <= drafted, per position non-increasing),
   under vLLM's names too with --metrics-compat vllm; the other server
   counts none.
3. Seeded sampled requests (temperatures 0.3-1.0, top_p 0.95) give the
   plain texts too; so do penalised ones, which speculate (sampled with a
   presence penalty; greedy with a repetition and with a frequency
   penalty: a draft row's penalty history holds the drafts before it; the
   frequency-penalised copy prompt alone gets drafts accepted); so do
   requests with logprobs: a copy prompt with logprobs 3 gives the same
   tokens, top-3 ids and logprobs (within 1e-3) as plain decoding, with
   drafts accepted (each emitted token carries its own row's logprobs);
   and masked requests: guided JSON on a JSON copy prompt, bad_words on the
   passage copy (each draft row gets the mask after the drafts before it),
   with drafts accepted for the guided one alone.
4. Every KV block is back in the pool once the requests are done.
5. Bad --speculative-config values stop `paged serve` with exit code 2 and
   one line naming the problem (method eagle is refused as not supported
   yet; draft_model without its "model"); a draft model of another
   vocabulary (the Gemma 3 file, when present) stops start-up in one line.
6. Tensor parallelism (-tp 3 on the CPU): the draft rows go through the
   ranks' argmax exchange, and three copy prompts give the same texts with
   and without speculation at -tp 3, with drafts accepted.
7. A draft model (engine/draft_model.h): '{"method": "draft_model", "model":
   <the default model>, "num_speculative_tokens": 4}' - the model as its own
   draft, so nearly every draft is accepted - gives the same texts for every
   request of 1 and 3, with drafts counted and every KV block back.
8. n = 3 (three choices sharing the prompt's blocks, each drafting from its
   own output and verified with its own seed): a greedy request and a
   seeded sampled one give every choice's plain text, with n-gram drafts
   and with the draft model, and the metrics count drafts made and
   accepted for them alone.
"""
import concurrent.futures
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

SPEC = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'

PASSAGE = (
    "The river rose slowly through the night, and by morning the low fields east of the town were "
    "under water. Farmers moved their cattle to the ridge, where the old stone church had stood for "
    "three hundred years. The mayor called a meeting in the school hall at noon. He said the bridge "
    "would stay closed until engineers could inspect it, and that the army would bring sandbags by "
    "the evening train. Volunteers filled bags until dark, singing to keep warm. When the rain "
    "stopped on the third day, the water fell as quickly as it had risen, leaving a brown line on "
    "every wall and a smell of mud that lasted the whole summer. The children remembered it as the "
    "best week of the year, because there was no school and every street was a canal."
)
CODE = (
    "def merge_sorted(a, b):\n"
    "    out = []\n"
    "    i = j = 0\n"
    "    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n"
    "            out.append(a[i])\n"
    "            i += 1\n"
    "        else:\n"
    "            out.append(b[j])\n"
    "            j += 1\n"
    "    out.extend(a[i:])\n"
    "    out.extend(b[j:])\n"
    "    return out\n"
)
COPY_PROMPTS = [
    f"Repeat this text exactly:\n\n{PASSAGE}\n\nRepeated text:\n\n",
    f"Text: {PASSAGE}\n\nThe same text, copied word for word:\n",
    f"Echo the following code back unchanged.\n\n{CODE}\nEcho:\n",
    f"{CODE}\n# The same function again, with the same names:\n",
    "Count: one, two, three, four, five, six, seven, eight, nine, ten. Again: one, two, three,",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
    '{"name": "Ada", "age": 36, "city": "London"}\n{"name": "Alan", "age": 41, "city": "Manchester"}\n{"name": "Grace",',
    "<ul>\n  <li>apples</li>\n  <li>pears</li>\n  <li>plums</li>\n</ul>\n<ul>\n  <li>",
    f"Summarise nothing; just repeat: {PASSAGE[:300]}\nRepeat: {PASSAGE[:60]}",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(10):\n",
]
PLAIN_PROMPTS = su.PROMPTS_20[:10]
GUIDED_PROMPT = ('Copy the record exactly.\nRecord: {"name": "Ada Lovelace", "city": "London", "year": 1843, '
                 '"tags": ["math", "engines", "notes"]}\nCopy: ')
GUIDED_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                                  "year": {"type": "integer"},
                                                  "tags": {"type": "array", "items": {"type": "string"}}},
                 "required": ["name", "city", "year", "tags"], "additionalProperties": False}


def complete(port, prompt, max_tokens, **kw):
    body = dict(dict(prompt=prompt, max_tokens=max_tokens, temperature=0), **kw)
    st, resp = su.post(port, "/v1/completions", body, timeout=600)
    assert st == 200, (st, resp)
    return resp["choices"][0]["text"]


def complete_lp(port, prompt, max_tokens):
    body = dict(prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=3)
    st, resp = su.post(port, "/v1/completions", body, timeout=600)
    assert st == 200, (st, resp)
    lp = resp["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]


def same_logprobs(a, b):
    """Same tokens and top-3 ids; logprobs within 1e-3 (a draft's rows run
    in a prefill-shaped step, plain decoding's in decode steps)."""
    if a[0] != b[0] or [sorted(x) for x in a[2]] != [sorted(x) for x in b[2]]:
        return False
    vals = [abs(x - y) for x, y in zip(a[1], b[1])]
    vals += [abs(x[k] - y[k]) for x, y in zip(a[2], b[2]) for k in x]
    return max(vals) < 1e-3


def run_all(port):
    jobs = [(p, 160) for p in COPY_PROMPTS] + [(p, 48) for p in PLAIN_PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        texts = list(ex.map(lambda j: complete(port, *j), jobs))
    # Seeded sampling speculates too, and must give plain decoding's text:
    # each verified row draws what plain decoding draws at its position.
    sampled = [(p, 96, dict(temperature=t, seed=100 + i, top_p=0.95))
               for i, (p, t) in enumerate(zip(COPY_PROMPTS[:6], (0.3, 0.6, 0.8, 1.0, 0.7, 0.5)))]
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        texts += list(ex.map(lambda j: complete(port, j[0], j[1], **j[2]), sampled))
    # Penalties speculate (each draft row's penalty history holds the drafts
    # before it): sampled with a presence penalty, greedy with repetition
    # and frequency penalties; greedy with logprobs never speculates.
    texts.append(complete(port, COPY_PROMPTS[4], 40, temperature=0.8, seed=11, presence_penalty=0.5))
    texts.append(complete(port, COPY_PROMPTS[0], 48, temperature=0, repetition_penalty=1.2))
    texts.append(complete(port, COPY_PROMPTS[1], 48, temperature=0, frequency_penalty=0.4))
    texts.append(complete(port, COPY_PROMPTS[5], 40, logprobs=2))
    # Masked: a JSON schema on the JSON copy prompt, bad words on the passage.
    texts.append(complete(port, GUIDED_PROMPT, 60, guided_json=GUIDED_SCHEMA))
    texts.append(complete(port, COPY_PROMPTS[0], 48, bad_words=["river", " water"]))
    return texts


def complete_n(port, prompt, max_tokens, n, **kw):
    """The texts of the n choices, by index."""
    body = dict(dict(prompt=prompt, max_tokens=max_tokens, temperature=0, n=n), **kw)
    st, resp = su.post(port, "/v1/completions", body, timeout=600)
    assert st == 200, (st, resp)
    texts = [None] * n
    for c in resp["choices"]:
        texts[c["index"]] = c["text"]
    return texts


def run_n3(port):
    """n = 3 requests: greedy, and seeded sampled (choice i draws with seed
    + i); the texts of every choice and the spec counters they added."""
    before = spec_counts(su.wait_idle(port), "paged")
    texts = complete_n(port, COPY_PROMPTS[0], 64, 3)
    texts += complete_n(port, COPY_PROMPTS[3], 64, 3, temperature=0.7, seed=7, top_p=0.95)
    after = spec_counts(su.wait_idle(port), "paged")
    return texts, [a - b for a, b in zip(after, before)]


def spec_counts(m, prefix):
    return [su.metric(m, f"{prefix}:spec_decode_num_{n}_total") for n in ("drafts", "draft_tokens", "accepted_tokens")]


def check_bad_flags():
    cases = [
        ('{"method": "eagle", "model": "x", "num_speculative_tokens": 3}', "not supported yet"),
        ('{"method": "draft_model", "num_speculative_tokens": 3}', "\"model\""),
        ('{"method": "draft_model", "model": "x", "num_speculative_tokens": 3, "prompt_lookup_min": 2}',
         "prompt_lookup_min"),
        ('{"method": "ngram"}', "num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 3}', "min_n"),
        ('{"method": "ngram", "num_speculative_tokens": 4, "bogus": 1}', "bogus"),
        ("ngram", "not a JSON object"),
    ]
    for value, want in cases:
        r = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--speculative-config", value],
                           capture_output=True, text=True, timeout=60)
        err = r.stderr.strip()
        assert r.returncode == 2, (value, r.returncode, err)
        assert want in err and len(err.splitlines()) == 1, (value, err)
    print(f"bad --speculative-config: {len(cases)} refused with exit code 2 and one line")
    gemma = os.path.join(su.ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
    if os.path.exists(gemma):
        value = '{"method": "draft_model", "model": "%s", "num_speculative_tokens": 3}' % gemma
        r = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--speculative-config", value],
                           capture_output=True, text=True, timeout=120)
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        assert r.returncode != 0 and "vocabulary" in last, (r.returncode, r.stderr[-2000:])
        print(f"a draft of another vocabulary: refused at start ({last.strip()[:120]})")


def main():
    su.require_model_and_binary()
    check_bad_flags()
    with su.Server() as plain:
        want = run_all(plain.port)
        want_n3, _ = run_n3(plain.port)
        want_lp = complete_lp(plain.port, COPY_PROMPTS[0], 48)
        m = su.wait_idle(plain.port)
        assert spec_counts(m, "paged") == [0, 0, 0], spec_counts(m, "paged")
    with su.Server("--speculative-config", SPEC, "--metrics-compat", "vllm") as spec:
        got = run_all(spec.port)
        m = su.wait_idle(spec.port)
        assert su.metric(m, "paged:kv_cache_blocks", state="used") == 0
        drafts, drafted, accepted = spec_counts(m, "paged")
        assert spec_counts(m, "vllm") == [drafts, drafted, accepted]
        name = "paged:spec_decode_num_accepted_tokens_per_pos_total"
        per_pos = [su.metric(m, name, position=str(i)) for i in range(5)
                   if any(k.startswith(name + "{") and f'position="{i}"' in k for k in m)]
        complete(spec.port, COPY_PROMPTS[1], 48, temperature=0, frequency_penalty=0.4)
        pen_acc = su.metric(su.wait_idle(spec.port), "paged:spec_decode_num_accepted_tokens_total") - accepted
        print(f"a frequency-penalised copy prompt alone: {int(pen_acc)} draft tokens accepted")
        assert pen_acc > 0, "a penalised request got no draft accepted"
        got_lp = complete_lp(spec.port, COPY_PROMPTS[0], 48)
        lp_acc = su.metric(su.wait_idle(spec.port), "paged:spec_decode_num_accepted_tokens_total") - accepted - pen_acc
        print(f"a copy prompt with logprobs 3: {int(lp_acc)} draft tokens accepted; tokens, top-3 and logprobs "
              f"{'the same' if same_logprobs(got_lp, want_lp) else 'DIFFER'}")
        assert lp_acc > 0 and same_logprobs(got_lp, want_lp), (want_lp, got_lp)
        before = su.metric(su.wait_idle(spec.port), "paged:spec_decode_num_accepted_tokens_total")
        guided = complete(spec.port, GUIDED_PROMPT, 60, guided_json=GUIDED_SCHEMA)
        g_acc = su.metric(su.wait_idle(spec.port), "paged:spec_decode_num_accepted_tokens_total") - before
        print(f"guided JSON on a JSON copy prompt: {int(g_acc)} draft tokens accepted: {guided!r}")
        assert g_acc > 0 and json.loads(guided)["name"], guided
        got_n3, n3_counts = run_n3(spec.port)
    draft = '{"method": "draft_model", "model": "%s", "num_speculative_tokens": 4}' % su.MODEL
    with su.Server("--speculative-config", draft) as dsrv:
        got_draft = run_all(dsrv.port)
        got_draft_n3, d_n3_counts = run_n3(dsrv.port)
        md = su.wait_idle(dsrv.port)
        assert su.metric(md, "paged:kv_cache_blocks", state="used") == 0
        d_counts = spec_counts(md, "paged")
    d_diff = [i for i in range(len(want)) if want[i] != got_draft[i]]
    for i in d_diff:
        print(f"prompt {i} (draft model): differs\n  plain: {want[i]!r}\n  draft: {got_draft[i]!r}")
    assert not d_diff, f"draft model: {len(d_diff)} of {len(want)} texts differ"
    assert d_counts[0] > 0 and 0 < d_counts[2] <= d_counts[1], d_counts
    print(f"draft model (the model itself, k 4): {len(want)} texts identical; {int(d_counts[0])} drafts, "
          f"{int(d_counts[1])} draft tokens, {int(d_counts[2])} accepted ({d_counts[2] / d_counts[1]:.1%})")
    # n = 3: the greedy choices are one text; every choice as without drafts.
    assert want_n3[0] == want_n3[1] == want_n3[2], want_n3[:3]
    assert len(set(want_n3[3:])) == 3, want_n3[3:]  # each sampled choice its own seed
    for name, got3, counts in (("ngram", got_n3, n3_counts), ("draft model", got_draft_n3, d_n3_counts)):
        n3_diff = [i for i in range(6) if want_n3[i] != got3[i]]
        for i in n3_diff:
            print(f"n = 3 ({name}), {'greedy' if i < 3 else 'sampled'} choice {i % 3}: differs\n"
                  f"  plain: {want_n3[i]!r}\n  spec:  {got3[i]!r}")
        assert not n3_diff, f"n = 3 ({name}): {len(n3_diff)} of 6 choices differ"
        assert counts[0] >= 3 and 0 < counts[2] <= counts[1], (name, counts)
        print(f"n = 3 ({name}): greedy and seeded sampled, all 6 choices identical with and without "
              f"speculation; {int(counts[0])} drafts, {int(counts[1])} draft tokens, {int(counts[2])} accepted")
    tp_texts = []
    for args in ([], ["--speculative-config", SPEC]):
        with su.Server("-tp", "3", *args) as srv:
            tp_texts.append([complete(srv.port, p, 64) for p in COPY_PROMPTS[:3]])
            m_tp = su.wait_idle(srv.port)
    assert tp_texts[0] == tp_texts[1], tp_texts
    tp_acc = su.metric(m_tp, "paged:spec_decode_num_accepted_tokens_total")
    assert tp_acc > 0
    print(f"-tp 3: 3 copy prompts identical with and without speculation ({int(tp_acc)} draft tokens accepted)")
    n = len(COPY_PROMPTS) + len(PLAIN_PROMPTS)
    diff = [i for i in range(len(want)) if want[i] != got[i]]
    for i in diff:
        print(f"prompt {i}: differs\n  plain: {want[i]!r}\n  spec:  {got[i]!r}")
    assert not diff, f"{len(diff)} of {len(want)} texts differ"
    assert drafts > 0 and accepted > 0 and accepted <= drafted, (drafts, drafted, accepted)
    assert sum(per_pos) == accepted and all(a >= b for a, b in zip(per_pos, per_pos[1:])), per_pos
    print(f"{n} greedy prompts + 6 seeded sampled ones + 3 penalised ones + greedy with logprobs + 2 masked ones: identical texts with and "
          f"without speculation; "
          f"{int(drafts)} drafts, {int(drafted)} draft tokens, {int(accepted)} accepted "
          f"({accepted / drafted:.1%}), per position {[int(a) for a in per_pos]}; every KV block back")


if __name__ == "__main__":
    main()
