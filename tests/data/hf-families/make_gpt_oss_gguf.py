"""gpt_oss_mxfp4.gguf: make_gpt_oss_mxfp4.py's checkpoint converted by llama.cpp's own
`convert_hf_to_gguf.py`, and transformers' logits for the model that file describes, for
flm's tests/gpt_oss_mxfp4.rs (issue 51).

Run from this folder, after make_gpt_oss_mxfp4.py:
`python make_gpt_oss_gguf.py [LLAMA_CPP]` (default /tmp/llama.cpp: a llama.cpp source tree,
whose `gguf-py` is used). Writes:

- `gpt_oss_mxfp4.gguf`: `convert_hf_to_gguf.py gpt_oss_mxfp4 --outtype f32` (its
  `GptOssModel`): the experts' MXFP4 blocks and scales repacked, without a float round
  trip, into ggml's MXFP4 `ffn_gate_exps` / `ffn_up_exps` (the even and odd rows of
  `gate_up_proj_blocks`) and `ffn_down_exps`, the stacked expert biases `ffn_*_exps.bias`,
  every other tensor F32; `gpt-oss.*` hyper-parameters (YaRN, the window, the expert
  width). One change to the converter: `GptOssModel.set_vocab` (which needs a tokenizer,
  and whose pre-tokenizer check refuses any it does not know) is replaced by writing
  `gpt-oss.vocab_size` (llama.cpp's key for the vocabulary size of a file without one), as
  the tiny checkpoint has no tokenizer; the other tiny GGUF files have none either.
- `gpt_oss_mxfp4/limit7_logits_f32le.bin`: the logits `[24, 256]` of reference.json's
  input ids by transformers loading `gpt_oss_mxfp4` (`Mxfp4Config(dequantize=True)`, f32,
  eager) with `swiglu_limit` 7.0. llama.cpp's graph (`LLM_FFN_SWIGLU_OAI_MOE`) fixes
  alpha 1.702 and limit 7.0, the released models' values, and a GGUF file has no key for
  them, so the file describes that model rather than the checkpoint's limit of 1.0.
- the `gguf_file` object of reference.json's `gpt_oss_mxfp4` entry: the converter's gguf-py
  version, `max_diff_limit7_from_limit1` (how far the two limits' logits are apart) and the
  `greedy_ids` / `greedy_min_margin` of the limit-7 model.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import GptOssForCausalLM, Mxfp4Config

from make_gpt_oss import GREEDY_TOKENS, logits_of
from make_tiny import HERE, SEQ_LEN

FAMILY = "gpt_oss_mxfp4"
LIMIT = 7.0


def convert(llama_cpp: Path, out: Path):
    """llama.cpp's converter on the MXFP4 checkpoint, with the vocabulary as its size."""
    sys.path.insert(0, str(llama_cpp))
    sys.path.insert(1, str(llama_cpp / "gguf-py"))
    import convert_hf_to_gguf
    from conversion.gpt_oss import GptOssModel

    def set_vocab(self):
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    GptOssModel.set_vocab = set_vocab
    sys.argv = ["convert_hf_to_gguf.py", str(HERE / FAMILY), "--outtype", "f32", "--outfile", str(out)]
    convert_hf_to_gguf.main()


def main():
    llama_cpp = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama.cpp")
    version = (llama_cpp / "gguf-py" / "pyproject.toml").read_text()
    gguf_version = next(l.split('"')[1] for l in version.splitlines() if l.startswith("version"))
    convert(llama_cpp, HERE / f"{FAMILY}.gguf")

    reference = HERE / "reference.json"
    described = json.loads(reference.read_text())
    input_ids = described["input_ids"]
    model = GptOssForCausalLM.from_pretrained(
        HERE / FAMILY,
        quantization_config=Mxfp4Config(dequantize=True),
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
        swiglu_limit=LIMIT,
    ).eval()
    assert model.model.layers[0].mlp.experts.limit == LIMIT
    logits = logits_of(model, input_ids)
    (HERE / FAMILY / "limit7_logits_f32le.bin").write_bytes(logits.numpy().astype("<f4").tobytes())
    limit1 = np.frombuffer((HERE / FAMILY / "logits_f32le.bin").read_bytes(), "<f4")

    ids = list(input_ids)
    margin = math.inf
    for _ in range(GREEDY_TOKENS):
        top = logits_of(model, ids)[-1].topk(2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))

    described["families"][FAMILY]["gguf_file"] = dict(
        converter="llama.cpp convert_hf_to_gguf.py (GptOssModel), --outtype f32",
        gguf_py=gguf_version,
        swiglu_limit=LIMIT,
        max_diff_limit7_from_limit1=float(np.abs(logits.numpy().reshape(-1) - limit1).max()),
        greedy_ids=ids[SEQ_LEN:],
        greedy_min_margin=margin,
    )
    reference.write_text(json.dumps(described, indent=1) + "\n")
    print(json.dumps(described["families"][FAMILY]["gguf_file"], indent=1))


if __name__ == "__main__":
    main()
