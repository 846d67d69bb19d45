#!/usr/bin/env python3
"""Requantises a GGUF model's matrices to a K-quant (Q4_K, Q5_K or Q6_K) and measures, with
transformers on the result, the perplexity flm's must come within 1% of (issue 35).

gguf-py has no K-quant quantiser, so this one is written here from the block layouts of
ggml-common.h (as gguf-py's `dequantize_blocks` read them): per 256-value super-block, an
f16 scale `d` (and `dmin`) over 6-bit (Q4_K/Q5_K) or 8-bit (Q6_K) sub-block scales, codes
by rounding to nearest; the simple min/max fit, not llama.cpp's search
(`make_qkx2_quants`), so its error is somewhat larger than llama-quantize's. Rows whose
length is not a multiple of 256 cannot hold K-quant blocks; they fall back as
llama-quantize falls back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, with gguf-py's
quantisers). The token embedding and vectors are copied as they are. Every block written
is checked by decoding it with `gguf.quants.dequantize`.

Then transformers loads the new file (every weight dequantised by gguf-py, f32) and
prints its perplexity on tests/data/text/tinystories_style.txt in non-overlapping windows
of 512 tokens, each scored from its second token, as `flm perplexity --ctx 512` scores.

Usage: python3 tools/gguf/make_kquant_gguf.py IN.gguf OUT_DIR TYPE
(needs `pip install gguf torch transformers accelerate`).
"""

import pathlib
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter, quants

QK = 256
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0, a / np.where(b == 0, 1, b))


def scales_k4(sc, m):
    """Packs 8 six-bit scales and minimums per block as ggml's get_scale_min_k4 reads them."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return out


def q45_k(x, bits):
    """Q4_K (bits 4) or Q5_K (bits 5) blocks of x: (n_blocks, 256) float32."""
    n = x.shape[0]
    top = (1 << bits) - 1
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0)
    hi = sub.max(axis=-1)
    scale = (hi - lo) / top
    mins = -lo
    d = f16(scale.max(axis=-1) / 63).astype(np.float32)
    dmin = f16(mins.max(axis=-1) / 63).astype(np.float32)
    sc = np.clip(np.round(div(scale, d[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.round(div(mins, dmin[:, None])), 0, 63).astype(np.uint8)
    dl = (d[:, None] * sc.astype(np.float32))[..., None]
    ml = (dmin[:, None] * m.astype(np.float32))[..., None]
    q = np.clip(np.round(div(sub + ml, dl)), 0, top).astype(np.uint8)
    low = (q & 15).reshape(n, 4, 2, 32)
    qs = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(n, 128)
    parts = [f16(d).view(np.uint8).reshape(n, 2), f16(dmin).view(np.uint8).reshape(n, 2), scales_k4(sc, m)]
    if bits == 5:
        high = (q >> 4).reshape(n, 8, 32)
        qh = np.zeros((n, 32), dtype=np.uint8)
        for j in range(8):
            qh |= high[:, j, :] << j
        parts.append(qh)
    parts.append(qs)
    return np.concatenate(parts, axis=1)


def q6_k(x):
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    amax_i = np.abs(sub).argmax(axis=-1)
    amax = np.take_along_axis(sub, amax_i[..., None], axis=-1)[..., 0]
    scale = amax / -32
    d = f16(np.abs(scale).max(axis=-1) / 127).astype(np.float32)
    sc = np.clip(np.round(div(scale, d[:, None])), -128, 127).astype(np.int8)
    dl = (d[:, None] * sc.astype(np.float32))[..., None]
    q = (np.clip(np.round(div(sub, dl)), -32, 31) + 32).astype(np.uint8).reshape(n, 256)
    low = (q & 15).reshape(n, 2, 2, 64)
    ql = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    parts = [ql, qh, sc.view(np.uint8), f16(d).view(np.uint8).reshape(n, 2)]
    return np.concatenate(parts, axis=1)


def quantise(w, qtype):
    """w: (rows, cols) float32 -> (qtype actually used, bytes (rows, row_bytes))."""
    if w.shape[1] % QK != 0:
        qtype = FALLBACK[qtype]
        return qtype, quants.quantize(w, qtype)
    x = w.reshape(-1, QK)
    blocks = {T.Q4_K: lambda: q45_k(x, 4), T.Q5_K: lambda: q45_k(x, 5), T.Q6_K: lambda: q6_k(x)}[qtype]()
    out = blocks.reshape(w.shape[0], -1)
    back = quants.dequantize(out, qtype)
    err = np.abs(back - w).max() / max(np.abs(w).max(), 1e-12)
    assert err < {T.Q4_K: 0.2, T.Q5_K: 0.1, T.Q6_K: 0.05}[qtype], (qtype.name, err)
    return qtype, out


def copy_metadata(reader, writer):
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub)


def perplexity(out_dir, name, root):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(out_dir, gguf_file=name, dtype=torch.float32)
    ids = tok.encode((root / "tests/data/text/tinystories_style.txt").read_text(), add_special_tokens=False)
    nll, n = 0.0, 0
    for i in range(0, len(ids), 512):
        w = ids[i : i + 512]
        if len(w) < 2:
            continue
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([w])).logits[0].double(), dim=-1)
        nll -= logp[:-1].gather(1, torch.tensor(w[1:]).unsqueeze(1)).sum().item()
        n += len(w) - 1
    return float(np.exp(nll / n)), n


def main():
    src, out_dir, qtype = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), T[sys.argv[3]]
    root = pathlib.Path(__file__).resolve().parents[2]
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{src.stem.split('.')[0]}.{qtype.name}.gguf"
    reader = GGUFReader(src)
    writer = GGUFWriter(out_dir / name, arch=reader.fields["general.architecture"].contents())
    copy_metadata(reader, writer)
    used = {}
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        if len(shape) == 2 and t.name != "token_embd.weight":
            w = quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            got, data = quantise(w, qtype)
            writer.add_tensor(t.name, data, raw_dtype=got)
        else:
            got = t.tensor_type
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=got)
        used[got.name] = used.get(got.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {out_dir / name}: tensor types {used}")
    ppl, n = perplexity(out_dir, name, root)
    print(f"transformers perplexity over {n} tokens (windows of 512): {ppl:.4f}")


if __name__ == "__main__":
    main()
