#!/usr/bin/env python3
"""Writes the stories260K GGUF fixtures of flm's GGUF importer tests.

Inputs (tests/data, see SOURCES.md): the llama2.c legacy checkpoint
`stories260K/stories260K.bin` (fp32; q/k in Meta's adjacent-pair RoPE layout, which is
also what llama.cpp's converter writes, so they are copied as they are) and the
SentencePiece tokenizer `stories260K/tok512.model`.

Outputs, written with the `gguf` package's GGUFWriter (llama.cpp's own writer):

- stories260K-f32.gguf   every tensor F32
- stories260K-q8_0.gguf  2-D matrices Q8_0 (gguf.quants.quantize), norms F32
- stories260K-q4_0.gguf  2-D matrices Q4_0, norms F32
- stories260K-q4_1.gguf  2-D matrices Q4_1, norms F32
- stories260K-q5_1.gguf  2-D matrices Q5_1, norms F32
- stories260K-q5_0.gguf  2-D matrices Q5_0, norms F32

In the quantised files the five `blk.N.ffn_down.weight` matrices ([64, 172]: rows of 172
values, not a multiple of the 32-value ggml block) are stored as F16, as llama.cpp's
quantizer falls back for rows it cannot quantise.

It also writes the teacher-forced logits [8, 512] (f32 little-endian) of the quantised files
for the token ids of `stories260K_reference.json` "logits_file", computed by a float64 NumPy
Llama forward pass on the weights as `gguf.quants.dequantize` decodes them (independent of
flm): stories260K-{q8_0,q4_0,q4_1,q5_1,q5_0}_logits_f32le.bin. The NumPy
pass is first checked against transformers' fp32 logits on the F32 file (< 1e-4).

Usage: python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf numpy \
sentencepiece, then /tmp/gguf-venv/bin/python tests/data/gguf/make_stories260k_gguf.py
(from the repository root, or anywhere: paths are relative to this file).
"""

import json
from pathlib import Path

import gguf
import numpy as np
import sentencepiece as spm

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def read_llama2c(path):
    """The legacy llama2.c layout (SOURCES.md section 1a): 7 int32, then fp32 tensors."""
    raw = path.read_bytes()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = np.frombuffer(raw[:28], "<i4")
    assert vocab > 0, "stories260K shares its classifier"
    f = np.frombuffer(raw[28:], "<f4")
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        out = f[pos : pos + n].reshape(shape)
        pos += n
        return out

    head = dim // n_heads
    kv_dim = head * n_kv
    w = {"emb": take(vocab, dim), "att_norm": take(n_layers, dim)}
    w["wq"] = take(n_layers, dim, dim)
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, dim)
    w["ffn_norm"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["final_norm"] = take(dim)
    take(seq_len, head)  # the legacy RoPE tables (cos and sin halves), unused
    assert pos == f.size, "the file ends after the RoPE tables"
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv,
               vocab=vocab, seq_len=seq_len)
    return {k: int(v) for k, v in cfg.items()}, w


def tensors(w, n_layers):
    """(GGUF name, fp32 array in PyTorch [out, in] layout) in llama.cpp's order."""
    yield "token_embd.weight", w["emb"]
    for l in range(n_layers):
        yield f"blk.{l}.attn_norm.weight", w["att_norm"][l]
        yield f"blk.{l}.attn_q.weight", w["wq"][l]
        yield f"blk.{l}.attn_k.weight", w["wk"][l]
        yield f"blk.{l}.attn_v.weight", w["wv"][l]
        yield f"blk.{l}.attn_output.weight", w["wo"][l]
        yield f"blk.{l}.ffn_norm.weight", w["ffn_norm"][l]
        yield f"blk.{l}.ffn_gate.weight", w["w1"][l]
        yield f"blk.{l}.ffn_down.weight", w["w2"][l]
        yield f"blk.{l}.ffn_up.weight", w["w3"][l]
    yield "output_norm.weight", w["final_norm"]


def add_tokenizer(writer, path):
    """tok512.model as llama.cpp's converter writes a SentencePiece vocabulary."""
    sp = spm.SentencePieceProcessor(model_file=str(path))
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(path.read_bytes())
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
    writer.add_remove_extra_whitespaces(proto.normalizer_spec.remove_extra_whitespaces)
    writer.add_chat_template(CHAT_TEMPLATE)


def llama_writer(path, name, cfg):
    """A GGUFWriter of the Llama `name` to `path`, with the hyperparameters of `cfg` (dim,
    hidden, n_layers, n_heads, n_kv, vocab, seq_len) written first."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(cfg["seq_len"])
    writer.add_embedding_length(cfg["dim"])
    writer.add_block_count(cfg["n_layers"])
    writer.add_feed_forward_length(cfg["hidden"])
    writer.add_rope_dimension_count(cfg["dim"] // cfg["n_heads"])
    writer.add_head_count(cfg["n_heads"])
    writer.add_head_count_kv(cfg["n_kv"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(cfg["vocab"])
    return writer


def finish(writer, path):
    """Writes out the file of `writer` at `path`, and prints its size."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{path.name}: {path.stat().st_size} bytes")


def write(name, qtype, cfg, w):
    writer = llama_writer(HERE / name, "stories260K", cfg)
    file_type = {
        gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
        gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
        gguf.GGMLQuantizationType.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
        gguf.GGMLQuantizationType.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
        gguf.GGMLQuantizationType.Q5_1: gguf.LlamaFileType.MOSTLY_Q5_1,
        gguf.GGMLQuantizationType.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0,
    }[qtype]
    writer.add_file_type(file_type)
    if qtype != gguf.GGMLQuantizationType.F32:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(writer, DATA / "stories260K" / "tok512.model")
    for tname, t in tensors(w, cfg["n_layers"]):
        t = np.ascontiguousarray(t, dtype=np.float32)
        if t.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(tname, t)
        elif t.shape[-1] % 32 != 0:
            writer.add_tensor(tname, t.astype(np.float16))
        else:
            q = gguf.quants.quantize(t, qtype)
            writer.add_tensor(tname, q, raw_shape=q.shape, raw_dtype=qtype)
    finish(writer, HERE / name)


def read_gguf(name):
    """The tensors of a written file, dequantised by the gguf package (not by flm)."""
    reader = gguf.GGUFReader(str(HERE / name))
    out = {}
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
    return out


def forward(cfg, t, tokens):
    """Teacher-forced logits [len(tokens), vocab] of the Llama graph, in float64 NumPy
    (llama2.c run.c semantics: adjacent-pair RoPE, GQA, SwiGLU, RMSNorm eps 1e-5)."""
    dim, n_heads, n_kv = cfg["dim"], cfg["n_heads"], cfg["n_kv"]
    hd, n = dim // n_heads, len(tokens)
    t = {k: v.astype(np.float64) for k, v in t.items()}

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g

    freq = 10000.0 ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * freq[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # [n, heads, hd], pairs (2j, 2j + 1)
        a, b = x[..., 0::2], x[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out

    x = t["token_embd.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(cfg["n_layers"]):
        p = lambda name: t[f"blk.{l}.{name}.weight"]
        h = rms(x, p("attn_norm"))
        q = rope((h @ p("attn_q").T).reshape(n, n_heads, hd))
        k = rope((h @ p("attn_k").T).reshape(n, n_kv, hd))
        v = (h @ p("attn_v").T).reshape(n, n_kv, hd)
        k, v = (np.repeat(a, n_heads // n_kv, axis=1) for a in (k, v))
        att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", att, v).reshape(n, dim) @ p("attn_output").T
        h = rms(x, p("ffn_norm"))
        gate, up = h @ p("ffn_gate").T, h @ p("ffn_up").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p("ffn_down").T
    return rms(x, t["output_norm.weight"]) @ t["token_embd.weight"].T


def main():
    cfg, w = read_llama2c(DATA / "stories260K" / "stories260K.bin")
    write("stories260K-f32.gguf", gguf.GGMLQuantizationType.F32, cfg, w)
    write("stories260K-q8_0.gguf", gguf.GGMLQuantizationType.Q8_0, cfg, w)
    write("stories260K-q4_0.gguf", gguf.GGMLQuantizationType.Q4_0, cfg, w)
    write("stories260K-q4_1.gguf", gguf.GGMLQuantizationType.Q4_1, cfg, w)
    write("stories260K-q5_1.gguf", gguf.GGMLQuantizationType.Q5_1, cfg, w)
    write("stories260K-q5_0.gguf", gguf.GGMLQuantizationType.Q5_0, cfg, w)
    # Reference logits of the quantised files: the gguf package's dequantisation, then the
    # NumPy forward pass, which first has to reproduce transformers' fp32 logits.
    ref = json.loads((DATA / "stories260K" / "stories260K_reference.json").read_text())
    tokens = ref["logits_file"]["input_ids"]
    hf = np.fromfile(DATA / "stories260K" / "stories260K_logits_f32le.bin", "<f4")
    err = np.abs(forward(cfg, read_gguf("stories260K-f32.gguf"), tokens).ravel() - hf).max()
    assert err < 1e-4, f"the NumPy forward pass disagrees with transformers: {err}"
    for kind in ["q8_0", "q4_0", "q4_1", "q5_1", "q5_0"]:
        logits = forward(cfg, read_gguf(f"stories260K-{kind}.gguf"), tokens).astype("<f4")
        logits.tofile(HERE / f"stories260K-{kind}_logits_f32le.bin")
        print(f"{kind}: max abs logit change vs fp32 {np.abs(logits.ravel() - hf).max():.4f}")


if __name__ == "__main__":
    main()
