"""Writes a small hand-made tiktoken ranks file and the ids that OpenAI's `tiktoken`
package (an independent implementation of byte-level BPE) gives for some texts under
GLM-4's pre-tokenisation regex and special tokens, as GLM-4's tokenization_chatglm.py
builds its `tiktoken.Encoding`.

Run: pip install tiktoken==0.14.0 && python3 make_glm4_cases.py
Writes glm4_small.tiktoken and glm4_small_cases.json next to this script.
"""

import base64
import json
import os

import tiktoken

HERE = os.path.dirname(os.path.abspath(__file__))

# GLM-4's tokenization_chatglm.py `pat_str` and special tokens (appended after the ranks).
PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
            "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
            "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>"]

# Every single byte, then hand-picked merges (their order is their rank).
tokens = [bytes([b]) for b in range(256)]
for t in ["he", "ll", "llo", "hel", "hello", " w", "or", "ld", " wor", " world", "\n\n", "  ",
          "'s", "bc", "ab", "abc", "12", "123", "你", "好", "你好", "！", "Hello", " ?",
          " 🦙", "🦙"]:
    tokens.append(t.encode("utf-8"))
tokens.append("你".encode("utf-8")[:2])
ranks = {t: i for i, t in enumerate(tokens)}
assert len(ranks) == len(tokens)

enc = tiktoken.Encoding(
    name="glm4_small",
    pat_str=PAT,
    mergeable_ranks=ranks,
    special_tokens={s: len(ranks) + i for i, s in enumerate(SPECIALS)},
)

TEXTS = ["hello world", "Hello's world\n\nabcd 12345", "你好！你们好", "  spaces   here ",
         "abc bca cab", "emoji 🦙🦙 ?", "<|user|> is text here", "tab\tand\r\nnewlines\n\n\n",
         "I'M 3.14159 ok", ""]

with open(os.path.join(HERE, "glm4_small.tiktoken"), "w") as f:
    for t, r in ranks.items():
        f.write(f"{base64.b64encode(t).decode()} {r}\n")
cases = {
    "source": "tiktoken 0.14.0 Encoding(pat_str=GLM-4's, mergeable_ranks=glm4_small.tiktoken, "
              "special_tokens=GLM-4's after the ranks).encode_ordinary(text); written by "
              "make_glm4_cases.py",
    "special_ids": {s: len(ranks) + i for i, s in enumerate(SPECIALS)},
    "cases": [{"text": t, "ids": enc.encode_ordinary(t)} for t in TEXTS],
    "with_specials": [{"text": t, "ids": enc.encode(t, allowed_special="all")}
                      for t in ["[gMASK]<sop><|user|>\nhello<|assistant|>"]],
}
with open(os.path.join(HERE, "glm4_small_cases.json"), "w") as f:
    json.dump(cases, f, ensure_ascii=False, indent=1)
    f.write("\n")
