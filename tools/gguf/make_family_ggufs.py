"""GGUF files of the tiny Qwen2, Qwen3 and Gemma 3 checkpoints in tests/data/hf-families,
written with gguf-py as llama.cpp's convert_hf_to_gguf.py writes these architectures, for
flm's tests/hf_families.rs (the logits to match are transformers', already in that folder).

Run from the repository root: `python tools/gguf/make_family_ggufs.py`. Writes
`tests/data/hf-families/<family>.gguf` for qwen2, qwen3 and gemma3: F32 tensors as in
model.safetensors under llama.cpp's names (q/k not permuted: these use the NEOX RoPE
layout), the hyper-parameters under `<architecture>.` as `Qwen2Model.set_gguf_parameters`,
`Qwen3Model` and `Gemma3Model` (conversion/gemma.py) write them, no tokenizer (the
checkpoints have none), so the vocabulary size is given as `<architecture>.vocab_size`.
Gemma 3 as its converter does: every `*norm.weight` plus 1 (`Gemma3RMSNorm`'s gain),
`sliding_window`, the global layers' RoPE base; and, because the tiny model's two layers
are [sliding, full] rather than llama.cpp's default period of 6, the per-layer
`attention.sliding_window_pattern` flags (the key llama.cpp's `load_swa_pattern` reads).
"""

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[2] / "tests" / "data" / "hf-families"

NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf in NAMES:
        return NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{LAYER_NAMES[rest]}"


def write(family: str) -> None:
    src = ROOT / family
    config = json.loads((src / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    gemma = family.startswith("gemma")
    rope = rope.get("full_attention", rope)
    arch = family
    writer = gguf.GGUFWriter(ROOT / f"{family}.gguf", arch)
    writer.add_name(f"tiny-{family}")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta")))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_vocab_size(config["vocab_size"])
    if gemma:
        writer.add_sliding_window(config["sliding_window"])
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
        if rope.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
    for name, tensor in load_file(src / "model.safetensors").items():
        if gemma and name.endswith("norm.weight"):
            tensor = tensor + 1.0
        if gemma and name.endswith("post_attention_layernorm.weight"):
            gname = gguf_name(name).replace("ffn_norm", "post_attention_norm")
        else:
            gname = gguf_name(name)
        writer.add_tensor(gname, np.ascontiguousarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    for family in ("qwen2", "qwen3", "gemma3"):
        write(family)
