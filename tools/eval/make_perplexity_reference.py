"""Perplexity of hf-stories260K over tests/data/text/tinystories_style.txt, by HF
transformers, in the windows `flm perplexity` cuts (`models/src/eval/mod.rs`), each
starting with BOS:

- llama.cpp's method (tools/perplexity/perplexity.cpp): chunks of CTX tokens of the text
  as tokenized with BOS, a shorter tail dropped, each chunk's first token replaced by BOS,
  the targets at positions CTX/2 + 1 .. CTX - 1 scored;
- the Hugging Face guide "Perplexity of fixed-length models": a window every STRIDE tokens
  of text, BOS then CTX - 1 tokens, scoring the targets no earlier window scored (the
  guide's labels of -100 for the rest).

Also the guide's windows without BOS after the first, to show that the model is
sensitive to it. Writes tests/data/stories260K/perplexity_reference.json.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers
    /tmp/venv/bin/python tools/eval/make_perplexity_reference.py
"""

import json
import math
import pathlib

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]
CTX, STRIDE = 128, 64

model = transformers.AutoModelForCausalLM.from_pretrained(
    ROOT / "tests/data/hf-stories260K", dtype=torch.float32
).eval()
tokenizer = transformers.AutoTokenizer.from_pretrained(ROOT / "tests/data/hf-stories260K")
text = (ROOT / "tests/data/text/tinystories_style.txt").read_text()
ids = tokenizer(text).input_ids
bos = tokenizer.bos_token_id
assert ids[0] == bos


def nll_sum(window, labels):
    """Σ −ln p over the labels that are not -100 (shifted as transformers does)."""
    with torch.no_grad():
        logits = model(torch.tensor([window])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    total, count = 0.0, 0
    for pos, label in enumerate(labels[1:]):
        if label != -100:
            total -= logp[pos, label].item()
            count += 1
    return total, count


def llama_cpp():
    """Chunks of CTX tokens, each starting with BOS, their second halves scored."""
    for start in range(0, len(ids) // CTX * CTX, CTX):
        window = [bos] + ids[start + 1 : start + CTX]
        labels = [-100] * (CTX // 2 + 1) + window[CTX // 2 + 1 :]
        yield window, labels


def strided(length, width):
    """The guide's windows [begin, end) of `width` of `length` tokens every STRIDE tokens,
    up to the one that reaches the end, each with the end of the window before it."""
    prev_end = 0
    for begin in range(0, length, STRIDE):
        end = min(begin + width, length)
        yield begin, end, prev_end
        prev_end = end
        if end == length:
            break


def sliding():
    """Windows of BOS and CTX - 1 tokens of text, every STRIDE tokens of text."""
    text_ids = ids[1:]
    for begin, end, prev_end in strided(len(text_ids), CTX - 1):
        window = [bos] + text_ids[begin:end]
        labels = [-100] * len(window)
        for j in range(max(prev_end, begin), end):
            labels[j - begin + 1] = text_ids[j]
        yield window, labels


def guide_without_bos():
    """The guide's loop as written: windows of the ids (BOS only in the first)."""
    for begin, end, prev_end in strided(len(ids), CTX):
        window = ids[begin:end]
        trg_len = end - prev_end
        labels = [-100] * (len(window) - trg_len) + window[len(window) - trg_len :]
        yield window, labels


def entry(windows):
    """The summed NLL, scored count and perplexity of the (window, labels) pairs."""
    total, count = 0.0, 0
    for window, labels in windows:
        t, c = nll_sum(window, labels)
        total, count = total + t, count + c
    return {"nll": total, "scored": count, "perplexity": math.exp(total / count)}


out = {
    "source": "HF transformers %s, torch %s, float32 weights, log-softmax in float64"
    % (transformers.__version__, torch.__version__),
    "ctx": CTX,
    "stride": STRIDE,
    "ids": ids,
    "llama_cpp": entry(llama_cpp()),
    "sliding": entry(sliding()),
    "sliding_without_bos": entry(guide_without_bos()),
}
path = ROOT / "tests/data/stories260K/perplexity_reference.json"
path.write_text(json.dumps(out, indent=1) + "\n")
print({k: v for k, v in out.items() if k != "ids"})
