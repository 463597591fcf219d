#!/usr/bin/env python3
"""Golden chat prompts rendered by Jinja2 (the engine Hugging Face uses) from
the real templates: SmolLM2's (read from the default model's GGUF), Llama-3,
Llama-2 and Mistral v0.1 (the tokenizer_config.json templates of those
models, quoted below). paged renders them natively; test_chat_template.c
compares. The leading BOS text is stripped: paged adds BOS as a token.

Usage: PYTHONPATH=$SDIST/vendor/llama.cpp/gguf-py python3 tests/data/gen_chat_golden.py MODEL.gguf
"""
import json
import sys

import jinja2
from gguf import GGUFReader

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
          "<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
          "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
          "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == "
          "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
          "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != "
          "false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] "
          "%}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' "
          "%}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
           "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
           "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' "
           "+ message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
           "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
           "are supported!') }}{% endif %}{% endfor %}")

CONVS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "  padded  \n"}, {"role": "assistant", "content": " Sure. "},
     {"role": "user", "content": "Again, in Français 日本語 🙂"}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello, how can I help?"}, {"role": "user", "content": "Tell me a joke."}],
]


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def main():
    smol = GGUFReader(sys.argv[1]).fields["tokenizer.chat_template"].contents()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    cases = []
    for family, text, bos, eos in [("chatml", smol, "", "<|im_end|>"), ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
                                   ("llama2", LLAMA2, "<s>", "</s>"), ("mistral", MISTRAL, "<s>", "</s>")]:
        for conv in CONVS:
            for gen in (True, False):
                try:
                    out = env.from_string(text).render(messages=conv, add_generation_prompt=gen,
                                                       bos_token=bos, eos_token=eos)
                    if bos and out.startswith(bos):
                        out = out[len(bos):]
                    expected = {"text": out}
                except jinja2.exceptions.TemplateError as e:
                    expected = {"error": str(e)}
                cases.append({"family": family, "template": text, "messages": conv,
                              "add_generation_prompt": gen, **expected})
    json.dump(cases, open("tests/data/chat_golden.json", "w"), ensure_ascii=False, indent=1)
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
