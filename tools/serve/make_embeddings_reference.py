#!/usr/bin/env python3
"""Reference embeddings of stories260K for `/v1/embeddings`: transformers' LlamaModel
`last_hidden_state` (after the final norm) of tests/data/hf-stories260K, pooled by the mean
over the tokens and by the last token, each L2-normalised (as sentence-transformers'
Normalize module and vLLM's embedding pooler do).

Writes tests/data/stories260K/embeddings_reference.json:
{"inputs": [[ids...], ...], "mean": [[...], ...], "last": [[...], ...], "versions": {...}}

Usage: python3 tools/serve/make_embeddings_reference.py   (torch and transformers installed)
"""

import json
from pathlib import Path

import torch
import transformers
from transformers import AutoModel

REPO = Path(__file__).resolve().parents[2]
INPUTS = [
    [1, 403, 407, 261, 378, 432, 383, 286],
    [1, 347, 294, 261, 471, 283, 310, 360, 431, 300, 264, 372, 296],
    [1, 430],
]


def main():
    model = AutoModel.from_pretrained(REPO / "tests/data/hf-stories260K", dtype=torch.float32)
    model.eval()
    mean, last = [], []
    with torch.no_grad():
        for ids in INPUTS:
            hidden = model(torch.tensor([ids])).last_hidden_state[0].double()
            for pooled, out in ((hidden.mean(0), mean), (hidden[-1], last)):
                out.append([round(v, 7) for v in (pooled / pooled.norm()).tolist()])
    out = REPO / "tests/data/stories260K/embeddings_reference.json"
    out.write_text(json.dumps({
        "inputs": INPUTS,
        "mean": mean,
        "last": last,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
