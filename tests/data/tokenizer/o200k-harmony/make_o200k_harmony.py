"""Builds o200k_harmony, gpt-oss's tokenizer, as a Hugging Face tokenizer.json with
transformers' TikTokenConverter from OpenAI's o200k_base.tiktoken, and records the ids
Hugging Face `tokenizers` and `tiktoken` give for test texts (they must agree); also writes a
vocabulary-only GGUF of its first RANKS ranks with `gguf-py` (`tokenizer.ggml.pre =
"gpt-4o"`), with the ids `tokenizers` and `tiktoken` give on the same cut, to which
`llama_cpp_refs.py` adds llama.cpp's `llama-tokenize` ids.

The vocabulary: o200k_base.tiktoken as the `tiktoken-rs` crate 0.12.1 ships it
(`assets/o200k_base.tiktoken`, sha256 446a9538... = tiktoken's `expected_hash` for
`o200k_base`). gpt-oss's tokenizer.json is that file converted by transformers'
`TikTokenConverter` (its `convert_gpt_oss_weights_to_hf.py`: the o200k regex,
`ignore_merges`, ByteLevel pre-tokenizer without regex, ByteLevel decoder and
post-processor), with the 21 harmony special tokens after the 199998 ranks
(`<|startoftext|>` 199998 ... `<|endofprompt|>` 200018), as here.

The GGUF's cut keeps the ranks below RANKS, and the special tokens follow them in the same
order (ids RANKS ... RANKS + 20): a GGUF lists its tokens by id, and the real ids would need
183614 padding entries.

    python3 -m venv /work/hfenv
    /work/hfenv/bin/pip install transformers==5.25.0 tokenizers==0.23.3 tiktoken==0.14.0 gguf==0.19.0 numpy
    /work/hfenv/bin/python tests/data/tokenizer/o200k-harmony/make_o200k_harmony.py \
        ~/.cargo/registry/src/*/tiktoken-rs-0.12.1/assets/o200k_base.tiktoken

Writes tokenizer.json.xz, tokenizer_config.json, o200k-harmony-16k.gguf and cases.json
beside this script (deterministic).
"""

import base64
import hashlib
import json
import lzma
import sys
import tempfile
from pathlib import Path

import gguf
import tiktoken
import tiktoken.load
from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import TikTokenConverter

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent
RANKS = 16384
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

# tiktoken_ext/openai_public.py, o200k_base's pat_str.
PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# tiktoken_ext/openai_public.py, o200k_harmony's special tokens (gpt-oss's
# tokenizer_config.json added_tokens_decoder holds the same 21).
SPECIALS = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|reserved_200000|>": 200000,
    "<|reserved_200001|>": 200001,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|reserved_200004|>": 200004,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|reserved_200009|>": 200009,
    "<|reserved_200010|>": 200010,
    "<|reserved_200011|>": 200011,
    "<|call|>": 200012,
    "<|reserved_200013|>": 200013,
    "<|reserved_200014|>": 200014,
    "<|reserved_200015|>": 200015,
    "<|reserved_200016|>": 200016,
    "<|reserved_200017|>": 200017,
    "<|endofprompt|>": 200018,
}

source = Path(sys.argv[1])
assert hashlib.sha256(source.read_bytes()).hexdigest() == SHA256, "not o200k_base.tiktoken"
full = tiktoken.load.load_tiktoken_bpe(str(source))
assert len(full) == 199998 and sorted(full.values()) == list(range(199998))


def build(ranks, specials):
    """The tokenizer.json TikTokenConverter makes of `ranks`, with `specials` added."""
    with tempfile.TemporaryDirectory() as tmp:
        cut = Path(tmp) / "ranks.tiktoken"
        lines = sorted(ranks.items(), key=lambda x: x[1])
        cut.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in lines))
        converted = TikTokenConverter(vocab_file=str(cut), pattern=PATTERN).converted()
    spec = json.loads(converted.to_str())
    spec["added_tokens"] = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for s, i in specials.items()
    ]
    tok = Tokenizer.from_str(json.dumps(spec))
    assert all(tok.token_to_id(s) == i for s, i in specials.items())
    enc = tiktoken.Encoding(name="o200k_harmony", pat_str=PATTERN, mergeable_ranks=ranks,
                            special_tokens=specials)
    return spec, tok, enc


spec, tok, enc = build(full, SPECIALS)
text = tok.to_str()
(HERE / "tokenizer.json.xz").write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))

# gpt-oss's tokenizer_config.json, the fields flm reads (its chat template is llama.cpp's
# copy, tests/data/templates/openai-gpt-oss-120b.jinja, kept apart).
config = {
    "bos_token": "<|startoftext|>",
    "eos_token": "<|return|>",
    "pad_token": "<|endoftext|>",
    "tokenizer_class": "PreTrainedTokenizerFast",
    "model_max_length": 131072,
}
(HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")

CUT = {s: RANKS + i - 199998 for s, i in SPECIALS.items()}
cut_spec, cut_tok, cut_enc = build({t: r for t, r in full.items() if r < RANKS}, CUT)

sep = "\n__ggml_vocab_test__\n"
texts = (DATA / "llama.cpp" / "ggml-vocab-gpt-2.gguf.inp").read_text("utf-8").split(sep)[:-1]
assert len(texts) == 46
texts += [
    "I'M DON'T you'LL we'Ve they'd SHE'S It's",
    "HelloWorld ALLCaps camelCase XMLHttpRequest iPhone McDonald's",
    "path/to/file\n\n/usr/bin/env  python3\r\n",
    "12345 678,9 0.25 1e10 3.14159",
    "  \n\n  x \r\n\ty  \t\t",
    "héllo wörld — 你好 🦙🦙 こんにちは 안녕하세요 Привет мир",
    "cafe\u0301 A\u030angstro\u0308m \u1100\u1161\u11a8 नमस्ते दुनिया ของฉัน",
    "ǅungla ǈ ÀBc ΣΊΣΥΦΟΣ Ὠιδή",
    "<|start|>assistant<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
    "text<|endoftext|>more<|startoftext|> <|reserved_200013|><|endofprompt|>",
    "def f(x):\n    return x**2  # square\n\n\nprint(f(3))\n",
]


def case(t, e, text):
    ids = t.encode(text, add_special_tokens=False).ids
    assert ids == e.encode(text, allowed_special="all"), text
    return {
        "ids": ids,
        "decoded": t.decode(ids, skip_special_tokens=False),
        "decoded_skip_special": t.decode(ids, skip_special_tokens=True),
    }


cases = [{"text": x, **case(tok, enc, x), "cut": case(cut_tok, cut_enc, x)} for x in texts]

# The cut as a vocabulary-only GGUF, as llama.cpp's converter writes gpt-oss's (`gpt2`
# model, pre `gpt-4o`, the special tokens CONTROL, BOS/EOS/PAD as gpt-oss's config names them).
vocab = cut_spec["model"]["vocab"]
tokens = [None] * RANKS
for s, i in vocab.items():
    tokens[i] = s
assert all(t is not None for t in tokens)
types = [gguf.TokenType.NORMAL] * RANKS
for s, i in CUT.items():
    assert i == len(tokens)
    tokens.append(s)
    types.append(gguf.TokenType.CONTROL)
merges = [" ".join(m) if isinstance(m, list) else m for m in cut_spec["model"]["merges"]]
w = gguf.GGUFWriter(str(HERE / "o200k-harmony-16k.gguf"), "gpt-oss")
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("gpt-4o")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(merges)
w.add_bos_token_id(CUT["<|startoftext|>"])
w.add_eos_token_id(CUT["<|return|>"])
w.add_pad_token_id(CUT["<|endoftext|>"])
w.add_add_bos_token(False)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

out = {"ranks": RANKS, "special_ids": SPECIALS, "cut_special_ids": CUT, "cases": cases}
(HERE / "cases.json").write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n", "utf-8")
print(len(cases), "cases;", len(spec["model"]["merges"]), "merges;", len(merges), "in the cut")
