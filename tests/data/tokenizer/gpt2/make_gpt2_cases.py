"""Builds GPT-2's tokenizer.json with Hugging Face `tokenizers` from the vocabulary and
merges of llama.cpp's ggml-vocab-gpt-2.gguf, and records the ids `tokenizers` gives for
test texts, with GPT-2's pre-tokenizer and with the Split regexes of Llama 3, Qwen2 (and
its NFC normalizer) and Mistral-Nemo (tekken), and SmolLM's pre-tokenizer (single digits,
then GPT-2's), on the same vocabulary; and the Split sequences of more `tokenizer.ggml.pre`
names of llama.cpp (deepseek-llm, qwen35, jais-2, exaone-moe, spark2_5, minicpm5,
ufakzeka).

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
    # The Split sequences of llama.cpp's llama-vocab.cpp (the tokenizer.json originals where
    # it rewrote a case-insensitive group), each Split "Isolated" in turn.
    "deepseek-llm": [
        r"[\r\n]",
        "\\s?[A-Za-z\U000000b5\U000000c0-\U000000d6\U000000d8-\U000000f6\U000000f8-\U000001ba\U000001bc-\U000001bf\U000001c4-\U00000293\U00000295-\U000002af\U00000370-\U00000373\U00000376\U00000377\U0000037b-\U0000037d\U0000037f\U00000386\U00000388-\U0000038a\U0000038c\U0000038e-\U000003a1\U000003a3-\U000003f5\U000003f7-\U00000481\U0000048a-\U0000052f\U00000531-\U00000556\U000010a0-\U000010c5\U000013a0-\U000013f5\U000013f8-\U000013fd\U00001c90-\U00001cba\U00001cbd-\U00001cbf\U00001d00-\U00001d2b\U00001d6b-\U00001d77\U00001d79-\U00001d9a\U00001e00-\U00001f15\U00001f18-\U00001f1d\U00001f20-\U00001f45\U00001f48-\U00001f4d\U00001f50-\U00001f57\U00001f59\U00001f5b\U00001f5d\U00001f5f-\U00001f7d\U00001f80-\U00001fb4\U00001fb6-\U00001fbc\U00001fbe\U00001fc2-\U00001fc4\U00001fc6-\U00001fcc\U00001fd0-\U00001fd3\U00001fd6-\U00001fdb\U00001fe0-\U00001fec\U00001ff2-\U00001ff4\U00001ff6-\U00001ffc\U00002102\U00002107\U0000210a-\U00002113\U00002115\U00002119-\U0000211d\U00002124\U00002126\U00002128\U0000212a-\U0000212d\U0000212f-\U00002134\U00002139\U0000213c-\U0000213f\U00002145-\U00002149\U0000214e\U00002183\U00002184\U00002c00-\U00002c7b\U00002c7e-\U00002ce4\U00002ceb-\U00002cee\U00002cf2\U00002cf3\U0000a640-\U0000a66d\U0000a680-\U0000a69b\U0000a722-\U0000a76f\U0000a771-\U0000a787\U0000a78b-\U0000a78e\U0000ab70-\U0000abbf\U0000fb00-\U0000fb06\U0000fb13-\U0000fb17\U0000ff21-\U0000ff3a\U0000ff41-\U0000ff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    ],
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "jais-2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
    "exaone-moe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    "spark2_5": [
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+""",
        r"\p{N}",
    ],
    "minicpm5": [
        r"\p{N}{1,3}",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "ufakzeka": r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
# Qwen2's tokenizer.json has an NFC normalizer.
NORMALIZER = {"qwen2": {"type": "NFC"}}
# Llama 3 and tekken's tokenizer.json set ignore_merges.
IGNORE_MERGES = {"gpt2": False, "llama3": True, "qwen2": False, "tekken": True, "smollm": False}
IGNORE_MERGES.update({"deepseek-llm": False, "qwen35": False, "jais-2": False, "exaone-moe": False})
IGNORE_MERGES.update({"spark2_5": False, "minicpm5": True, "ufakzeka": False})
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
    regexes = REGEX.get(name, [])
    regexes = [regexes] if isinstance(regexes, str) else regexes
    pre = SMOLLM if name == "smollm" else {
        "type": "Sequence",
        "pretokenizers": [
            *({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in regexes),
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
