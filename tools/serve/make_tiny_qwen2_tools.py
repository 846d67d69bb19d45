#!/usr/bin/env python3
"""A tiny random Qwen2 checkpoint whose chat template takes `tools`, for the mechanics of
tool calls in `flm serve` (tests/data/qwen2-tools).

- Model: `Qwen2ForCausalLM` from transformers with hidden 64, intermediate 128, 2 layers,
  4 query heads and 2 KV heads, 2048 positions, tied embeddings, weights drawn by
  transformers' initialiser under `torch.manual_seed(39)`, saved in float32.
- Tokenizer: byte-level BPE (GPT-2's byte-to-unicode map) with the 256 byte tokens and no
  merges, then `<|endoftext|>` (256), `<|im_start|>` (257), `<|im_end|>` (258, EOS) as
  special tokens and `<tool_call>` (259), `</tool_call>` (260) as plain added tokens, made by
  the `tokenizers` library.
- Chat template (in tokenizer_config.json): ChatML with a tool list in the system turn and calls as
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (the Hermes format that
  Qwen2.5 and Qwen3 use), tool results as `<tool_response>` in a user turn; written here.

Usage: python3 tools/serve/make_tiny_qwen2_tools.py   (torch, transformers, tokenizers)
"""

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

OUT = Path(__file__).resolve().parents[2] / "tests/data/qwen2-tools"

TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nYou may call functions. Their signatures, in <tools></tools> tags:"
    "\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nFor each call, answer <tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'assistant' and not m.tool_calls) %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{ '<|im_start|>assistant' }}"
    "{%- if m.content %}{{ '\\n' + m.content }}{% endif %}"
    "{%- for call in m.tool_calls %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{%- if call.function.arguments is string %}{{ call.function.arguments }}"
    "{%- else %}{{ call.function.arguments | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tokenizer():
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    # GPT-2's order: the bytes 0..255 through bytes_to_unicode.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    chars = dict(zip(bs, (chr(c) for c in cs)))
    vocab = {chars[b]: b for b in range(256)}
    assert set(vocab) == set(byte_chars)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    return tok


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    assert tok.get_vocab_size() == 261
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(OUT)
    # The template goes in tokenizer_config.json (transformers 4's place), which flm reads.
    (OUT / "chat_template.jinja").unlink()
    config_path = OUT / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    torch.manual_seed(39)
    config = Qwen2Config(
        vocab_size=261, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, eos_token_id=258, bos_token_id=None,
        pad_token_id=256, rope_theta=1000000.0, use_sliding_window=False,
    )
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
