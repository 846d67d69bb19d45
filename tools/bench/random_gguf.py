#!/usr/bin/env python3
"""Writes a GGUF of random Llama weights at the shapes of a Hugging Face config.json.

For speed comparisons with llama.cpp (tools/bench/rounds_vs_llamacpp.sh): every matrix,
token embedding and output head included, is stored in one type (Q4_0, Q4_1 or Q8_0),
quantised by gguf-py (`gguf.quants.quantize`, ggml's reference quantisers), as
`llama-quantize --pure` would; norms are f32. The vocabulary is a placeholder SentencePiece
one (control tokens, the 256 byte tokens, then "tok<i>") so that llama.cpp and flm load it;
decode speed does not depend on the values.

Usage: random_gguf.py CONFIG.json {q4_0,q4_1,q8_0} OUT.gguf [--seed N]
Needs numpy and gguf (gguf-py 0.19 was used).
"""

import argparse
import json

import numpy as np
import gguf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("qtype", choices=["q4_0", "q4_1", "q8_0"])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    qtype = {
        "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
    }[args.qtype]
    rng = np.random.default_rng(args.seed)

    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    vocab = cfg["vocab_size"]
    head_dim = d // heads

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("random " + args.config)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_file_type(
        {"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
         "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
         "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[args.qtype]
    )

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    tokens += [f"tok{i}" for i in range(vocab - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def matrix(name: str, rows: int, cols: int) -> None:
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        q = gguf.quants.quantize(x, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(d, dtype=np.float32))

    matrix("token_embd.weight", vocab, d)
    for i in range(layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        matrix(p + "attn_q.weight", heads * head_dim, d)
        matrix(p + "attn_k.weight", kv_heads * head_dim, d)
        matrix(p + "attn_v.weight", kv_heads * head_dim, d)
        matrix(p + "attn_output.weight", d, heads * head_dim)
        norm(p + "ffn_norm.weight")
        matrix(p + "ffn_gate.weight", ff, d)
        matrix(p + "ffn_up.weight", ff, d)
        matrix(p + "ffn_down.weight", d, ff)
    norm("output_norm.weight")
    matrix("output.weight", vocab, d)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
