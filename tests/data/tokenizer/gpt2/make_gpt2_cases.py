"""Builds GPT-2's tokenizer.json with Hugging Face `tokenizers` from the vocabulary and
merges of llama.cpp's ggml-vocab-gpt-2.gguf, and records the ids `tokenizers` gives for
test texts, with GPT-2's pre-tokenizer and with the Split regexes of Llama 3, Qwen2 (and
its NFC normalizer) and Mistral-Nemo (tekken), and SmolLM's pre-tokenizer (single digits,
then GPT-2's), on the same vocabulary.

    python3 -m venv /tmp/bpevenv
    /tmp/bpevenv/bin/pip install tokenizers==0.20.3 gguf==0.19.0
    /tmp/bpevenv/bin/python tests/data/tokenizer/gpt2/make_gpt2_cases.py

Writes tokenizer.json and gpt2_cases.json beside this script (deterministic).
"""

import json
from pathlib import Path

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent

reader = gguf.GGUFReader(DATA / "gguf" / "ggml-vocab-gpt-2.gguf")


def strings(key):
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


tokens = strings("tokenizer.ggml.tokens")
merges = [tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]
vocab = {t: i for i, t in enumerate(tokens)}

# What GPT2TokenizerFast builds from vocab.json and merges.txt.
tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(["<|endoftext|>", "<|im_start|>"])
tok.add_tokens([AddedToken("[NEW]", lstrip=True), AddedToken("tok en", normalized=True)])
tok.save(str(HERE / "tokenizer.json"), pretty=False)

sep = "\n__ggml_vocab_test__\n"
texts = (DATA / "llama.cpp" / "ggml-vocab-gpt-2.gguf.inp").read_text("utf-8").split(sep)[:-1]
assert len(texts) == 46
texts += [
    "Hello<|endoftext|> world",
    "<|im_start|>user\nhi<|endoftext|>",
    "a   [NEW] b[NEW]c",
    "one tok en two",
    "12345 678,9 0.25",
    "I'M DON'T you'LL we'Ve",
    "  \n\n  x \r\n\ty  ",
    "héllo wörld — 你好 🦙🦙",
    "HelloWorld ALLCaps camelCase path/to/file\n\n",
    "ǅungla ǈ ÀBc",
    "cafe\u0301 A\u030angstro\u0308m [NEW]e\u0301 \u1100\u1161\u11a8",
]

REGEX = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "tekken": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
# Qwen2's tokenizer.json has an NFC normalizer.
NORMALIZER = {"qwen2": {"type": "NFC"}}
# Llama 3 and tekken's tokenizer.json set ignore_merges.
IGNORE_MERGES = {"gpt2": False, "llama3": True, "qwen2": False, "tekken": True, "smollm": False}
# SmolLM's (and StarCoder's) tokenizer.json: each digit apart, then GPT-2's ByteLevel.
SMOLLM = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}


def variant(name):
    if name == "gpt2":
        return tok, None
    pre = SMOLLM if name == "smollm" else {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": REGEX[name]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = pre
    j["model"]["ignore_merges"] = IGNORE_MERGES[name]
    j["normalizer"] = NORMALIZER.get(name)
    return Tokenizer.from_str(json.dumps(j)), pre


# Byte sequences that are not valid UTF-8, as ids of the single-byte tokens
# (GPT-2's bytes_to_unicode spelling, as in encoder.py).
printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
extra = iter(range(256, 512))
spelling = {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}
byte_id = {b: vocab[spelling[b]] for b in range(256)}
invalid = [
    b"\xe2\x96a",
    b"\xf0\x9f\xa6",
    b"x\xf0\x9f\xa6\x99y",
    b"\xffa\xc3",
    b"\xed\xa0\x80z",
    b"\xc0\xaf\xe0\x80\xbf\xf4\x90\x80\x80",
]
decode_cases = [
    {"ids": ids, "text": tok.decode(ids)} for ids in ([byte_id[b] for b in seq] for seq in invalid)
]

out = {"texts": texts, "variants": {}, "decode_cases": decode_cases}
for name in IGNORE_MERGES:
    t, pre = variant(name)
    ids = [t.encode(x, add_special_tokens=False).ids for x in texts]
    out["variants"][name] = {
        "pre_tokenizer": pre,
        "normalizer": NORMALIZER.get(name),
        "ignore_merges": IGNORE_MERGES[name],
        "ids": ids,
        "decoded": [t.decode(i, skip_special_tokens=True) for i in ids],
    }
(HERE / "gpt2_cases.json").write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n", "utf-8")
