#!/usr/bin/env python3
"""Writes tests/data/gguf/tiny-kquant.gguf: a one-layer Llama of random weights whose
matrices are ggml K-quants (rows of 256 and 512 values, whole super-blocks), and the
teacher-forced logits of its weights as gguf-py decodes them, by the float64 NumPy forward
pass of make_stories260k_gguf.py (independent of flm).

- dim 256, 4 heads of 64, 2 KV heads (GQA), FFN 512, vocabulary 512 (stories260K's
  SentencePiece tokenizer, tok512.model), tied embedding;
- token_embd, attn_v, ffn_down: Q6_K; attn_q, attn_output, ffn_gate: Q4_K; attn_k,
  ffn_up: Q5_K (the blocks of make_kquant_gguf.py's quantisers, each checked by decoding
  it with gguf.quants.dequantize); norms F32;
- tiny-kquant_logits_f32le.bin: logits [8, 512] (f32 little-endian) for the token ids of
  stories260K_reference.json "logits_file".

Usage: python3 tools/gguf/make_kquant_fixture.py, with gguf 0.19.0, numpy 2.4.6,
sentencepiece 0.2.3 and protobuf (Python 3.11.7 made the committed files). Deterministic
(NumPy's PCG64, seed 35): a rerun writes byte-identical files.
"""

import json
import pathlib
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(DATA / "gguf"))
sys.path.insert(0, str(ROOT / "tools" / "gguf"))
import make_kquant_gguf as kq  # noqa: E402
import make_stories260k_gguf as s260  # noqa: E402

CFG = {"dim": 256, "hidden": 512, "n_layers": 1, "n_heads": 4, "n_kv": 2, "vocab": 512, "seq_len": 64}
QUANT = {
    "token_embd.weight": T.Q6_K,
    "blk.0.attn_q.weight": T.Q4_K,
    "blk.0.attn_k.weight": T.Q5_K,
    "blk.0.attn_v.weight": T.Q6_K,
    "blk.0.attn_output.weight": T.Q4_K,
    "blk.0.ffn_gate.weight": T.Q4_K,
    "blk.0.ffn_up.weight": T.Q5_K,
    "blk.0.ffn_down.weight": T.Q6_K,
}


def weights(rng):
    dim, hidden, kv = CFG["dim"], CFG["hidden"], CFG["dim"] // CFG["n_heads"] * CFG["n_kv"]
    m = lambda rows, cols: rng.normal(0, cols**-0.5, (rows, cols)).astype(np.float32)
    return {
        "token_embd.weight": rng.normal(0, 0.25, (CFG["vocab"], dim)).astype(np.float32),
        "blk.0.attn_norm.weight": (1 + 0.1 * rng.normal(size=dim)).astype(np.float32),
        "blk.0.attn_q.weight": m(dim, dim),
        "blk.0.attn_k.weight": m(kv, dim),
        "blk.0.attn_v.weight": m(kv, dim),
        "blk.0.attn_output.weight": m(dim, dim),
        "blk.0.ffn_norm.weight": (1 + 0.1 * rng.normal(size=dim)).astype(np.float32),
        "blk.0.ffn_gate.weight": m(hidden, dim),
        "blk.0.ffn_down.weight": m(dim, hidden),
        "blk.0.ffn_up.weight": m(hidden, dim),
        "output_norm.weight": (1 + 0.1 * rng.normal(size=dim)).astype(np.float32),
    }


def main():
    path = DATA / "gguf" / "tiny-kquant.gguf"
    w = weights(np.random.default_rng(35))
    writer = s260.llama_writer(path, "tiny-kquant", CFG)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    s260.add_tokenizer(writer, DATA / "stories260K" / "tok512.model")
    for name, t in w.items():
        if name in QUANT:
            got, q = kq.quantise(t, QUANT[name])
            assert got == QUANT[name]
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=got)
        else:
            writer.add_tensor(name, t)
    s260.finish(writer, path)

    reader = gguf.GGUFReader(str(path))
    decoded = {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        for t in reader.tensors
    }
    ref = json.loads((DATA / "stories260K" / "stories260K_reference.json").read_text())
    logits = s260.forward(CFG, decoded, ref["logits_file"]["input_ids"]).astype("<f4")
    logits.tofile(DATA / "gguf" / "tiny-kquant_logits_f32le.bin")
    print(f"logits {logits.shape}, max |logit| {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    main()
