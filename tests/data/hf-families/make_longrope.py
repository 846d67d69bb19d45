"""transformers' logits of the tiny Phi-3 (`phi3/`, made by make_tiny.py) run as generation
runs it, for flm's LongRoPE test: the frequencies switch per forward pass, from the short
factors to the long ones once the sequence passes `original_max_position_embeddings` (16
here), and the keys already cached keep the rotation they were cached with
(transformers' `longrope_frequency_update`).

Run from this folder: `python make_longrope.py`. Writes, for the 24 input ids of
`reference.json` (each file f32 little-endian `[24, vocab]`):
- `phi3/two_chunks_logits_f32le.bin`: a forward pass of ids 0..10 (10 positions: the short
  factors), then of ids 10..24 over its cache (24 positions: the long ones);
- `phi3/stepped_logits_f32le.bin`: one id per forward pass over the cache (positions
  0..15 short, 16..23 long).
`prefill` of make_tiny.py (`phi3/logits_f32le.bin`, one pass of 24: all long) is the third
way.
"""

import json

import numpy as np
import torch
from transformers import DynamicCache, Phi3ForCausalLM

from make_tiny import HERE


def main():
    ids = json.loads((HERE / "reference.json").read_text())["input_ids"]
    model = Phi3ForCausalLM.from_pretrained(HERE / "phi3", attn_implementation="eager").eval()

    def run(chunks):
        cache, rows, pos = DynamicCache(config=model.config), [], 0
        with torch.no_grad():
            for chunk in chunks:
                positions = torch.arange(pos, pos + len(chunk))[None]
                out = model(
                    torch.tensor([chunk]), position_ids=positions, cache=cache, use_cache=True
                )
                rows.append(out.logits[0].float().numpy())
                pos += len(chunk)
        return np.concatenate(rows).astype("<f4").tobytes()

    (HERE / "phi3/two_chunks_logits_f32le.bin").write_bytes(run([ids[:10], ids[10:]]))
    (HERE / "phi3/stepped_logits_f32le.bin").write_bytes(run([[t] for t in ids]))


if __name__ == "__main__":
    main()
