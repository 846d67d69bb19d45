#!/usr/bin/env python3
"""Writes tests/data/gguf/tiny-lut4.gguf: the one-layer Llama of make_kquant_fixture.py
(same shapes and tokenizer, its own random weights) with matrices in ggml's 4-bit lookup
types IQ4_NL, IQ4_XS and MXFP4, and the teacher-forced logits of its weights as gguf-py
decodes them, by the float64 NumPy forward pass of make_stories260k_gguf.py (independent
of flm).

- token_embd, attn_v, ffn_down: IQ4_XS; attn_q, attn_output, ffn_gate: IQ4_NL; attn_k,
  ffn_up: MXFP4; norms F32;
- MXFP4 blocks by gguf-py's own quantiser (`gguf.quants.quantize`, ggml's
  `quantize_row_mxfp4_ref`); gguf-py has none for IQ4_NL and IQ4_XS, so their blocks are
  written here from ggml-common.h's layouts with the first stage of ggml's
  `quantize_row_iq4_nl_impl` (per 32 values the scale `max / 127` of the value of largest
  magnitude, IQ4_XS's run scales then 6-bit against `d = −max_scale / 32`, each value's
  nearest level), without its search; each block is checked by decoding it with
  `gguf.quants.dequantize`;
- tiny-lut4_logits_f32le.bin: logits [8, 512] (f32 little-endian) for the token ids of
  stories260K_reference.json "logits_file".

Usage: python3 tools/gguf/make_lut4_fixture.py, with gguf 0.19.0, numpy 2.4.6,
sentencepiece 0.2.3 and protobuf (Python 3.11.7 made the committed files). Deterministic
(NumPy's PCG64, seed 51): a rerun writes byte-identical files.
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
import make_kquant_fixture as fixture  # noqa: E402
import make_kquant_gguf as kq  # noqa: E402
import make_stories260k_gguf as s260  # noqa: E402

# ggml's kvalues_iq4nl.
LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
QUANT = {
    "token_embd.weight": T.IQ4_XS,
    "blk.0.attn_q.weight": T.IQ4_NL,
    "blk.0.attn_k.weight": T.MXFP4,
    "blk.0.attn_v.weight": T.IQ4_XS,
    "blk.0.attn_output.weight": T.IQ4_NL,
    "blk.0.ffn_gate.weight": T.IQ4_NL,
    "blk.0.ffn_up.weight": T.MXFP4,
    "blk.0.ffn_down.weight": T.IQ4_XS,
}


def nearest(x):
    """The index of the level nearest each value of x (the lower of two equally near)."""
    return np.abs(x[..., None] - LEVELS).argmin(axis=-1).astype(np.uint8)


def nibbles(q):
    """(n, 32) codes -> (n, 16) bytes: value i in the low nibble of byte i, i + 16 high."""
    return q[:, :16] | (q[:, 16:] << 4)


def run_scales(sub):
    """Per run of 32 values (last axis) the scale max / 127 of the value of largest magnitude."""
    i = np.abs(sub).argmax(axis=-1)
    return np.take_along_axis(sub, i[..., None], axis=-1)[..., 0] / 127


def iq4_nl(x):
    """IQ4_NL blocks of x: (n_blocks, 32) float32."""
    d = kq.f16(run_scales(x))
    codes = nearest(kq.div(x, d.astype(np.float32)[:, None]))
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), nibbles(codes)], axis=1)


def iq4_xs(x):
    """IQ4_XS blocks of x: (n_blocks, 256) float32."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    scale = run_scales(sub)
    i = np.abs(scale).argmax(axis=-1)
    d = kq.f16(-np.take_along_axis(scale, i[:, None], axis=-1)[:, 0] / 32)
    l = np.clip(np.round(kq.div(scale, d.astype(np.float32)[:, None])), -32, 31).astype(np.int32)
    dl = d.astype(np.float32)[:, None] * l.astype(np.float32)
    codes = nearest(kq.div(sub, dl[..., None])).reshape(n * 8, 32)
    l += 32
    scales_h = np.zeros(n, dtype=np.uint16)
    for j in range(8):
        scales_h |= ((l[:, j] >> 4) & 3).astype(np.uint16) << (2 * j)
    scales_l = ((l[:, 0::2] & 15) | ((l[:, 1::2] & 15) << 4)).astype(np.uint8)
    qs = nibbles(codes).reshape(n, 128)
    parts = [d.view(np.uint8).reshape(n, 2), scales_h.view(np.uint8).reshape(n, 2), scales_l, qs]
    return np.concatenate(parts, axis=1)


def quantise(w, qtype):
    """w: (rows, cols) float32 -> blocks (rows, row bytes), checked by gguf-py's decoding."""
    if qtype == T.MXFP4:
        out = gguf.quants.quantize(w, qtype)
    else:
        block = 32 if qtype == T.IQ4_NL else 256
        make = iq4_nl if qtype == T.IQ4_NL else iq4_xs
        out = make(w.reshape(-1, block)).reshape(w.shape[0], -1)
    back = gguf.quants.dequantize(out, qtype)
    err = np.abs(back - w).max() / max(np.abs(w).max(), 1e-12)
    # MXFP4 clips a block's largest value to 1.5 times its power of two: up to a quarter off.
    assert err < (0.26 if qtype == T.MXFP4 else 0.2), (qtype.name, err)
    return out


def main():
    path = DATA / "gguf" / "tiny-lut4.gguf"
    cfg = fixture.CFG
    w = fixture.weights(np.random.default_rng(51))
    writer = s260.llama_writer(path, "tiny-lut4", cfg)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_IQ4_XS)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    s260.add_tokenizer(writer, DATA / "stories260K" / "tok512.model")
    for name, t in w.items():
        if name in QUANT:
            q = quantise(t, QUANT[name])
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=QUANT[name])
        else:
            writer.add_tensor(name, t)
    s260.finish(writer, path)

    reader = gguf.GGUFReader(str(path))
    decoded = {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        for t in reader.tensors
    }
    ref = json.loads((DATA / "stories260K" / "stories260K_reference.json").read_text())
    logits = s260.forward(cfg, decoded, ref["logits_file"]["input_ids"]).astype("<f4")
    logits.tofile(DATA / "gguf" / "tiny-lut4_logits_f32le.bin")
    print(f"logits {logits.shape}, max |logit| {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    main()
