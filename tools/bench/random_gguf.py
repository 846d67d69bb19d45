#!/usr/bin/env python3
"""Writes a GGUF of random weights at the shapes of a Hugging Face config.json.

For speed comparisons with llama.cpp (tools/bench/rounds_vs_llamacpp.sh), of a Llama
(`llama`), a DeepSeek-V2 (model_type `deepseek_v2`, written as llama.cpp's `deepseek2`) or
a gpt-oss (`gpt_oss`, as llama.cpp's `gpt-oss`, type `mxfp4` only: the routed experts in
MXFP4 and the other matrices in BF16, as the released checkpoints hold them, the biases and
sinks f32):
every matrix, token embedding and output head included, is stored in one type (Q4_0, Q4_1
or Q8_0), as `llama-quantize --pure` would; norms and the MoE routers (`ffn_gate_inp`,
which llama-quantize never quantises) are f32. The blocks are random and written
directly, one tensor at a time (a DeepSeek-V2-Lite file is 9 GB): each block's step (f16)
is drawn from [0.04, 0.08] / (the quants' levels), its quants are random bytes, and
Q4_1's minimum is -8 steps, so that the weights spread about as N(0, 0.02) does. Decode
speed does not depend on the values. (The script's first version, 39fa981, which wrote the
TinyLlama files of docs/benchmarks.md, quantised N(0, 0.02) values with gguf-py's reference
quantisers instead: minutes for a 1B model, hours for DeepSeek-V2-Lite.)
The vocabulary is a placeholder SentencePiece one (control tokens, the 256 byte tokens,
then "tok<i>") so that llama.cpp and flm load it.

DeepSeek-V2 is laid out as llama.cpp's converter writes it (`DeepseekV2Model`): the
metadata of `deepseek2` in tools/gguf/make_family_ggufs.py (MLA as one KV head of the
latent, `key_length_mla`, `value_length_mla`, `kv_lora_rank`, the expert keys, YaRN), the
query as `attn_q` (or `attn_q_a` and `attn_q_b` where q_lora_rank is set),
`attn_kv_a_mqa`, `kv_b_proj` split into `attn_k_b` `[n_head, kv_lora, nope]` and
`attn_v_b` `[n_head, v, kv_lora]`, dense FFNs in the first `first_k_dense_replace`
layers, then each layer's routed experts stacked as `ffn_{gate,up,down}_exps`
`[n_expert, out, in]` and the shared experts as `ffn_{gate,up,down}_shexp`.

Usage: random_gguf.py CONFIG.json {q4_0,q4_1,q8_0,mxfp4} OUT.gguf [--seed N]
Needs numpy and gguf (gguf-py 0.19 was used); for DeepSeek-V2 also what
tools/gguf/make_family_ggufs.py imports (safetensors).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import gguf

# Each type: its GGML type, llama.cpp's file type, the f16 fields at the head of a block
# (the step, and Q4_1's minimum) and the levels of a quant.
TYPES = {
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0, 1, 16),
    "q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1, 2, 16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0, 1, 256),
    # gpt-oss as it ships: MXFP4 experts (their E8M0 exponent drawn per block), BF16 else.
    "mxfp4": (gguf.GGMLQuantizationType.MXFP4, gguf.LlamaFileType.MOSTLY_MXFP4_MOE, 0, 0),
}


def llama(w: gguf.GGUFWriter, cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Adds a Llama's own keys; returns its tensors' names and shapes (outer first)."""
    d, ff, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = d // heads
    w.add_rope_dimension_count(head_dim)
    w.add_head_count_kv(kv_heads)
    tensors = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", (d,)),
            (p + "attn_q.weight", (heads * head_dim, d)),
            (p + "attn_k.weight", (kv_heads * head_dim, d)),
            (p + "attn_v.weight", (kv_heads * head_dim, d)),
            (p + "attn_output.weight", (d, heads * head_dim)),
            (p + "ffn_norm.weight", (d,)),
            (p + "ffn_gate.weight", (ff, d)),
            (p + "ffn_up.weight", (ff, d)),
            (p + "ffn_down.weight", (d, ff)),
        ]
    return tensors


def deepseek2(w: gguf.GGUFWriter, cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Adds DeepSeek-V2's own keys as llama.cpp's converter does; returns its tensors' names
    and shapes (outer first)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gguf"))
    from make_family_ggufs import deepseek2 as mla_and_expert_keys

    d, ff, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    rank, q_rank = cfg["kv_lora_rank"], cfg.get("q_lora_rank")
    nope, rot, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    experts, exp_ff = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    shared_ff = exp_ff * cfg["n_shared_experts"]
    w.add_head_count_kv(1)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if "n_group" in cfg:
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_feed_forward_length(exp_ff)
    # DeepSeek's own config.json has `rope_scaling` with `type`; transformers 5 writes
    # `rope_parameters` with `rope_type`.
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope.setdefault("rope_type", rope.get("type"))
    mla_and_expert_keys(w, cfg, rope, cfg["model_type"], legacy=False)

    tensors = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"blk.{i}."
        tensors.append((p + "attn_norm.weight", (d,)))
        if q_rank is None:
            tensors.append((p + "attn_q.weight", (heads * (nope + rot), d)))
        else:
            tensors += [
                (p + "attn_q_a.weight", (q_rank, d)),
                (p + "attn_q_a_norm.weight", (q_rank,)),
                (p + "attn_q_b.weight", (heads * (nope + rot), q_rank)),
            ]
        tensors += [
            (p + "attn_kv_a_mqa.weight", (rank + rot, d)),
            (p + "attn_kv_a_norm.weight", (rank,)),
            (p + "attn_k_b.weight", (heads, rank, nope)),
            (p + "attn_v_b.weight", (heads, v, rank)),
            (p + "attn_output.weight", (d, heads * v)),
            (p + "ffn_norm.weight", (d,)),
        ]
        if i < cfg["first_k_dense_replace"]:
            tensors += [
                (p + "ffn_gate.weight", (ff, d)),
                (p + "ffn_up.weight", (ff, d)),
                (p + "ffn_down.weight", (d, ff)),
            ]
            continue
        tensors += [
            (p + "ffn_gate_inp.weight", (experts, d)),
            (p + "ffn_gate_exps.weight", (experts, exp_ff, d)),
            (p + "ffn_up_exps.weight", (experts, exp_ff, d)),
            (p + "ffn_down_exps.weight", (experts, d, exp_ff)),
            (p + "ffn_gate_shexp.weight", (shared_ff, d)),
            (p + "ffn_up_shexp.weight", (shared_ff, d)),
            (p + "ffn_down_shexp.weight", (d, shared_ff)),
        ]
    return tensors


def gpt_oss(w: gguf.GGUFWriter, cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Adds gpt-oss's own keys as llama.cpp's converter does (`GptOssModel`: YaRN, the
    sliding window on every other layer from the first, `expert_feed_forward_length`);
    returns its tensors' names and shapes (outer first), biases and sinks included."""
    d, heads, head_dim = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    kv_heads, experts, ff = cfg["num_key_value_heads"], cfg["num_local_experts"], cfg["intermediate_size"]
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(ff)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    tensors = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"blk.{i}."
        for name, out, inp in [("attn_q", heads * head_dim, d), ("attn_k", kv_heads * head_dim, d),
                               ("attn_v", kv_heads * head_dim, d), ("attn_output", d, heads * head_dim)]:
            tensors += [(p + name + ".weight", (out, inp)), (p + name + ".bias", (out,))]
        tensors += [
            (p + "attn_norm.weight", (d,)),
            (p + "attn_sinks.weight", (heads,)),
            (p + "post_attention_norm.weight", (d,)),
            (p + "ffn_gate_inp.weight", (experts, d)),
            (p + "ffn_gate_inp.bias", (experts,)),
            (p + "ffn_gate_exps.weight", (experts, ff, d)),
            (p + "ffn_gate_exps.bias", (experts, ff)),
            (p + "ffn_up_exps.weight", (experts, ff, d)),
            (p + "ffn_up_exps.bias", (experts, ff)),
            (p + "ffn_down_exps.weight", (experts, d, ff)),
            (p + "ffn_down_exps.bias", (experts, d)),
        ]
    return tensors


ARCHITECTURES = {"llama": llama, "deepseek_v2": deepseek2, "gpt_oss": gpt_oss}
GGUF_ARCH = {"llama": "llama", "deepseek_v2": "deepseek2", "gpt_oss": "gpt-oss"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("qtype", choices=list(TYPES))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    qtype, file_type, fields, levels = TYPES[args.qtype]
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(args.seed)
    family = cfg.get("model_type", "llama")
    if family not in ARCHITECTURES:
        sys.exit(f"{args.config}: model_type {family!r} is not one of {list(ARCHITECTURES)}")
    if (family == "gpt_oss") != (args.qtype == "mxfp4"):
        sys.exit("gpt-oss is written with --qtype mxfp4, and mxfp4 only for gpt-oss")
    d, vocab = cfg["hidden_size"], cfg["vocab_size"]

    w = gguf.GGUFWriter(args.out, GGUF_ARCH[family])
    w.add_name("random " + args.config)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(d)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_file_type(file_type)

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

    tensors = [("token_embd.weight", (vocab, d))]
    tensors += ARCHITECTURES[family](w, cfg)
    tensors += [("output_norm.weight", (d,)), ("output.weight", (vocab, d))]

    def f32(name: str) -> bool:
        return name.endswith(("norm.weight", "ffn_gate_inp.weight", ".bias", "attn_sinks.weight"))

    def type_of(name: str) -> gguf.GGMLQuantizationType:
        if qtype == gguf.GGMLQuantizationType.MXFP4 and "_exps." not in name:
            return gguf.GGMLQuantizationType.BF16
        return qtype

    def byte_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        block, block_bytes = gguf.GGML_QUANT_SIZES[type_of(name)]
        assert shape[-1] % block == 0, shape
        return (*shape[:-1], shape[-1] // block * block_bytes)

    # The tensor infos first, then each tensor's data, made when it is written.
    for name, shape in tensors:
        if f32(name):
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * math.prod(shape))
        else:
            w.add_tensor_info(name, byte_shape(name, shape), np.dtype(np.uint8),
                              math.prod(byte_shape(name, shape)), raw_dtype=type_of(name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in tensors:
        if name.endswith("norm.weight"):
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
            continue
        if f32(name):
            w.write_tensor_data(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
            continue
        if type_of(name) == gguf.GGMLQuantizationType.BF16:
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
            w.write_tensor_data(bf16.view(np.uint8).reshape(byte_shape(name, shape)))
            continue
        n = math.prod(shape) // block
        if qtype == gguf.GGMLQuantizationType.MXFP4:
            # Steps 2^(e - 128) of 2^-10 to 2^-8: the largest level (12) about 0.01 to 0.05.
            blocks = np.frombuffer(bytearray(rng.bytes(n * block_bytes)), np.uint8).reshape(n, block_bytes)
            blocks[:, 0] = rng.integers(118, 121, n, dtype=np.uint8)
            w.write_tensor_data(blocks.reshape(byte_shape(name, shape)))
            continue
        blocks = np.frombuffer(bytearray(rng.bytes(n * block_bytes)), np.uint8).reshape(n, block_bytes)
        step = (rng.uniform(0.04, 0.08, n) / levels).astype(np.float16)
        blocks[:, 0:2] = step.view(np.uint8).reshape(n, 2)
        if fields == 2:
            blocks[:, 2:4] = (-8 * step).view(np.uint8).reshape(n, 2)
        w.write_tensor_data(blocks.reshape(byte_shape(name, shape)))
    w.close()


if __name__ == "__main__":
    main()
