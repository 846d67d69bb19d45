"""GGUF files of tiny checkpoints in tests/data/hf-families (Qwen2, Qwen3, Gemma 3, Phi-3,
GLM-4, and the mixtures Mixtral, Qwen3-MoE and Qwen2-MoE), written with gguf-py as llama.cpp's
convert_hf_to_gguf.py writes these architectures, for flm's tests/hf_families.rs (the
logits to match are transformers', already in that folder).

Run from the repository root: `python tools/gguf/make_family_ggufs.py [FAMILY ...]`
(default: every family). Writes `tests/data/hf-families/<family>.gguf`: F32 tensors as in
model.safetensors under llama.cpp's names, the hyper-parameters under `<architecture>.` as
`Qwen2Model.set_gguf_parameters`, `Qwen3Model`, `Gemma3Model` (conversion/gemma.py),
`LlamaModel` (conversion/llama.py, Mixtral), `Phi3MiniModel` (conversion/phi.py) and `Qwen2MoeModel` / `Qwen3MoeModel`
(conversion/qwen.py) write them, no tokenizer (the checkpoints have none), so the
vocabulary size is given as `<architecture>.vocab_size`.
- q/k are not permuted for the Qwen and Gemma architectures (NEOX RoPE layout); Mixtral
  (architecture `llama`) has them permuted into Meta's interleaved layout, as
  `LlamaModel.permute` does.
- Gemma 3 as its converter does: every `*norm.weight` plus 1 (`Gemma3RMSNorm`'s gain),
  `sliding_window`, the global layers' RoPE base; and, because the tiny model's two layers
  are [sliding, full] rather than llama.cpp's default period of 6, the per-layer
  `attention.sliding_window_pattern` flags (the key llama.cpp's `load_swa_pattern` reads).
- Phi-3 (`Phi3MiniModel`, conversion/phi.py): fused `attn_qkv` (q, k, v rows) and
  `ffn_up` (gate rows, then up rows), `rope.dimension_count` the rotated dimensions of a
  head (12 of 16: partial_rotary_factor 0.75), `rope.scaling.original_context_length`,
  `rope.scaling.attn_factor` `sqrt(1 + ln(128/16) / ln(16))`, `attention.sliding_window`
  0, and the LongRoPE factors as the F32 tensors `rope_factors_short.weight` and
  `rope_factors_long.weight`.
- GLM-4 (`Glm4Model`): q/k not permuted (its RoPE pairs are already adjacent, llama.cpp's
  NORM type), the fused `gate_up_proj` as `ffn_up`, `post_self_attn_layernorm` and
  `post_mlp_layernorm` as `post_attention_norm` and `post_ffw_norm`,
  `rope.dimension_count` the rotated dimensions of a head (8 of 16: partial_rotary_factor
  0.5).
- GLM-4.5 (`Glm4MoeModel`): `block_count` counts the multi-token-prediction layer too
  (`nextn_predict_layers`), written as the block after the others with its own tensors
  as `nextn.eh_proj`, `nextn.enorm`, `nextn.hnorm` and `nextn.shared_head_norm`, the routed
  experts' count, width, groups (`expert_group_count`, `expert_group_used_count`: the base
  class's `n_group` and `topk_group`), the sigmoid gating function, `expert_weights_scale`
  and `expert_weights_norm`, `expert_shared_count` shared experts as `ffn_*_shexp`, the
  router's bias as `exp_probs_b.bias`, `leading_dense_block_count`, and
  `rope.dimension_count` the rotated half of each head.
- DeepSeek-V2 and V3 (`DeepseekV2Model`, architecture `deepseek2`; V3's
  multi-token-prediction layer dropped, as `skip_mtp` does): one KV head,
  `attention.key_length` the latent plus the rotated key and `value_length` the latent,
  `key_length_mla` and `value_length_mla` the heads' own widths, `q_lora_rank` where the
  query is compressed, `kv_lora_rank`, `rope.dimension_count` the rotated part,
  `leading_dense_block_count`, `expert_shared_count`, `expert_weights_scale`,
  `expert_weights_norm` when true, the base class's groups and gating function (from
  `n_group`, `topk_group`, `scoring_func`: V3's config has no `scoring_func` in
  transformers 5, so the script gives its sigmoid as DeepSeek's own config does), YaRN
  (`rope.scaling.*` and `yarn_log_multiplier` 0.1·mscale_all_dim), and `kv_b_proj` split
  into `attn_k_b` `[n_head, kv_lora, nope]` (each head's rows transposed) and `attn_v_b`
  `[n_head, v, kv_lora]`, as the converter's absorption split writes them;
  `deepseek_v2-kv_b.gguf` as it wrote DeepSeek-V2 before that split, `kv_b_proj` whole as
  `attn_kv_b` and `key_length`/`value_length` the heads' own widths.
- The mixtures: each layer's experts stacked into one tensor per projection,
  `ffn_{gate,up,down}_exps` of shape `[n_expert, out, in]` (`torch.stack(.., dim=0)`),
  the router as `ffn_gate_inp`, `expert_count` and `expert_used_count`; Qwen's
  `expert_feed_forward_length`; Qwen2-MoE's shared expert as `ffn_{gate,up,down}_shexp`
  and its gate `ffn_gate_inp_shexp` `[1, hidden]` (not squeezed, as the converter writes it
  since 2025), with `expert_shared_feed_forward_length`. Qwen3-MoE's dense layer 1
  (`mlp_only_layers`) keeps `ffn_gate`/`ffn_up`/`ffn_down`, as the converter's name map
  gives them (llama.cpp's own `qwen3moe` graph has no dense layers; flm reads a layer
  without `ffn_gate_inp` as dense).
- `mixtral-per-expert.gguf`: Mixtral as llama.cpp wrote it before stacking the experts,
  each expert's matrices as tensors of their own (`blk.{l}.ffn_gate.{e}.weight`, ...).
- `phi3-q8_0.gguf` and `qwen2_moe-q8_0.gguf`: the same with every matrix whose rows fill
  32-value blocks in Q8_0 (gguf-py's quantiser; norms, routers and the shared expert's down
  projection of rows of 48 stay F32), to check that fused and stacked tensors of a block
  type are sliced right; the weights are first rounded to the values their Q8_0 blocks
  decode to, and `<family>/q8_0_logits_f32le.bin` holds transformers' logits for those
  weights (the script imports torch and transformers for them).
"""

import json
import math
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import quants
from safetensors.numpy import load_file, save_file

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
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "post_self_attn_layernorm.weight": "post_attention_norm.weight",
    "post_mlp_layernorm.weight": "post_ffw_norm.weight",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    # GLM-4.5's multi-token-prediction layer (Glm4MoeModel's `blk.{n}.nextn.*`).
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
}
# The experts' stacked tensors, by the name of one expert's projection.
EXPERT_NAMES = {
    "gate_proj": "ffn_gate_exps.weight",
    "up_proj": "ffn_up_exps.weight",
    "down_proj": "ffn_down_exps.weight",
    "w1": "ffn_gate_exps.weight",
    "w3": "ffn_up_exps.weight",
    "w2": "ffn_down_exps.weight",
}
ARCHITECTURES = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "mixtral": "llama",
    "qwen3_moe": "qwen3moe",
    "qwen2_moe": "qwen2moe",
    "phi3": "phi3",
    "glm4": "glm4",
    "glm4_moe": "glm4moe",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",
}


def gguf_name(hf: str) -> str:
    if hf in NAMES:
        return NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{LAYER_NAMES[rest]}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's `LlamaModel.permute`: rotate-half rows to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def stacked_experts(tensors: dict, per_expert: bool = False) -> dict:
    """The tensors with each layer's experts stacked per projection, `[n_expert, out, in]`,
    or with `per_expert` under llama.cpp's names of before the stacking,
    `blk.{l}.ffn_gate.{e}.weight`."""
    out, experts = {}, {}
    for name, tensor in tensors.items():
        parts = name.split(".")
        if "experts" in parts:
            i = parts.index("experts")
            layer, expert, proj = int(parts[2]), int(parts[i + 1]), parts[i + 2]
            if per_expert:
                stem = EXPERT_NAMES[proj].removesuffix("_exps.weight")
                out[f"blk.{layer}.{stem}.{expert}.weight"] = tensor
                continue
            experts.setdefault((layer, proj), {})[expert] = tensor
        else:
            out[name] = tensor
    for (layer, proj), by_expert in sorted(experts.items()):
        stacked = np.stack([by_expert[e] for e in range(len(by_expert))], axis=0)
        out[f"blk.{layer}.{EXPERT_NAMES[proj]}"] = stacked
    return out


def deepseek2(writer: gguf.GGUFWriter, config: dict, rope: dict, family: str, legacy: bool) -> None:
    """`DeepseekV2Model.set_gguf_parameters` and the base class's expert and YaRN keys; with
    `legacy`, the MLA keys as the converter wrote them before llama.cpp absorbed `kv_b`
    (`key_length` and `value_length` the heads' own widths, no `*_mla` keys)."""
    if config.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(config["q_lora_rank"])
    rank, rot = config["kv_lora_rank"], config["qk_rope_head_dim"]
    writer.add_kv_lora_rank(rank)
    if legacy:
        writer.add_key_length(config["qk_nope_head_dim"] + rot)
        writer.add_value_length(config["v_head_dim"])
    else:
        writer.add_key_length(rank + rot)
        writer.add_value_length(rank)
        writer.add_key_length_mla(config["qk_nope_head_dim"] + rot)
        writer.add_value_length_mla(config["v_head_dim"])
    writer.add_rope_dimension_count(rot)
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    scoring = config.get("scoring_func", "sigmoid" if family == "deepseek_v3" else "softmax")
    writer.add_expert_gating_func(
        gguf.ExpertGatingFuncType.SIGMOID if scoring == "sigmoid" else gguf.ExpertGatingFuncType.SOFTMAX
    )
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def phi3(writer: gguf.GGUFWriter, config: dict, rope: dict) -> None:
    """What `Phi3MiniModel` adds: the pre-training context, the rotated dimensions of a
    head, the window (0: none), and for LongRoPE its attention factor and the short and
    long factors as F32 tensors."""
    n_embd, n_head = config["hidden_size"], config["num_attention_heads"]
    original = rope["original_max_position_embeddings"]
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head)
    writer.add_sliding_window(config.get("sliding_window") or 0)
    scale = config["max_position_embeddings"] / original
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
    writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))


# Routers stay F32, as llama.cpp's quantiser leaves them (HF and GGUF names).
ROUTERS = (
    "mlp.gate.weight",
    "block_sparse_moe.gate.weight",
    "shared_expert_gate.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_inp_shexp.weight",
)
Q8_0 = gguf.GGMLQuantizationType.Q8_0


def quantisable(name: str, tensor: np.ndarray) -> bool:
    """Whether a tensor becomes Q8_0 in the `-q8_0` files: matrices (stacked or not) whose
    rows fill 32-value blocks, but norms and routers."""
    return (
        tensor.ndim >= 2
        and tensor.shape[-1] % 32 == 0
        and "norm" not in name
        and not name.endswith(ROUTERS)
    )


def round_trip(tensor: np.ndarray) -> np.ndarray:
    """The values gguf-py's Q8_0 blocks of `tensor` decode to."""
    return quants.dequantize(quants.quantize(np.ascontiguousarray(tensor, dtype=np.float32), Q8_0), Q8_0)


def reference_logits(family: str, tensors: dict) -> None:
    """transformers' logits `[24, vocab]` (f32 little-endian) of the input ids of
    reference.json for the checkpoint `family` with `tensors` as its weights, written to
    `<family>/q8_0_logits_f32le.bin`."""
    import tempfile

    import torch
    import transformers

    input_ids = json.loads((ROOT / "reference.json").read_text())["input_ids"]
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(ROOT / family / "config.json", tmp)
        save_file(tensors, f"{tmp}/model.safetensors", metadata={"format": "pt"})
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        with torch.no_grad():
            logits = model(torch.tensor([input_ids])).logits[0].float()
    (ROOT / family / "q8_0_logits_f32le.bin").write_bytes(logits.numpy().astype("<f4").tobytes())


def add(writer: gguf.GGUFWriter, name: str, tensor: np.ndarray, q8_0: bool) -> None:
    """Adds `tensor` as F32, or as Q8_0 when `q8_0` and it is quantisable (its values are
    then already Q8_0's, so that the blocks decode to them exactly)."""
    tensor = np.ascontiguousarray(tensor, dtype=np.float32)
    if not (q8_0 and quantisable(name, tensor)):
        writer.add_tensor(name, tensor)
        return
    blocks = quants.quantize(tensor, Q8_0)
    assert (quants.dequantize(blocks, Q8_0) == tensor).all(), name
    writer.add_tensor(name, blocks, raw_dtype=Q8_0)


def write(family: str, q8_0: bool = False, per_expert: bool = False, legacy: bool = False) -> None:
    """Writes `<family>.gguf`, or with `q8_0` `<family>-q8_0.gguf` (the quantisable
    matrices in Q8_0) and transformers' logits for the weights its blocks decode to, or with
    `per_expert` `<family>-per-expert.gguf` (each expert's matrices as tensors of their
    own)."""
    src = ROOT / family
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    if q8_0:
        tensors = {n: round_trip(t) if quantisable(n, t) else t for n, t in tensors.items()}
        reference_logits(family, tensors)
    rope = config.get("rope_parameters") or {}
    gemma = family.startswith("gemma")
    rope = rope.get("full_attention", rope)
    arch = ARCHITECTURES[family]
    suffix = "-q8_0" if q8_0 else "-per-expert" if per_expert else "-kv_b" if legacy else ""
    writer = gguf.GGUFWriter(ROOT / f"{family}{suffix}.gguf", arch)
    writer.add_name(f"tiny-{family}")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    # DeepseekV2Model drops the multi-token-prediction layers (`skip_mtp`); Glm4MoeModel
    # writes them as blocks after the others.
    mtp = config.get("num_nextn_predict_layers", 0) if arch == "glm4moe" else 0
    writer.add_block_count(config["num_hidden_layers"] + mtp)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    # DeepSeek's MLA is written as one KV head of the latent (multi-query).
    writer.add_head_count_kv(1 if arch == "deepseek2" else config["num_key_value_heads"])
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta")))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    # transformers 5 writes DeepSeek's `head_dim` (the rotated part) into config.json,
    # DeepSeek's own configs have none: the MLA keys below stand for it.
    if config.get("head_dim") is not None and arch != "deepseek2":
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_vocab_size(config["vocab_size"])
    if "num_experts_per_tok" in config:
        experts = [config.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")]
        writer.add_expert_count(next(e for e in experts if e is not None))
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if "n_group" in config:
        writer.add_expert_group_count(config["n_group"])
        writer.add_expert_group_used_count(config["topk_group"])
    if "moe_intermediate_size" in config:
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if "shared_expert_intermediate_size" in config:
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if arch == "phi3":
        phi3(writer, config, rope)
    if arch == "llama":
        writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    if arch in ("glm4", "glm4moe"):
        writer.add_rope_dimension_count(int(config["head_dim"] * rope.get("partial_rotary_factor", 0.5)))
    if arch == "deepseek2":
        deepseek2(writer, config, rope, family, legacy)
    if arch == "glm4moe":
        writer.add_expert_shared_count(config["n_shared_experts"])
        writer.add_leading_dense_block_count(config["first_k_dense_replace"])
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        writer.add_expert_weights_scale(config["routed_scaling_factor"])
        writer.add_expert_weights_norm(config["norm_topk_prob"])
        writer.add_nextn_predict_layers(config["num_nextn_predict_layers"])
    if gemma:
        writer.add_sliding_window(config["sliding_window"])
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
        if rope.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
    for name, tensor in stacked_experts(tensors, per_expert).items():
        parts = name.split(".")
        layer = parts[2] if name.startswith("model.layers.") else parts[1] if parts[0] == "blk" else None
        if layer is not None and int(layer) >= config["num_hidden_layers"] + mtp:
            continue
        if name.startswith("blk."):
            add(writer, name, tensor, q8_0)
            continue
        if name.endswith("kv_b_proj.weight") and not legacy:
            layer = name.split(".")[2]
            heads, nope, v = config["num_attention_heads"], config["qk_nope_head_dim"], config["v_head_dim"]
            kv_b = tensor.reshape(heads, nope + v, tensor.shape[-1])
            add(writer, f"blk.{layer}.attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)), q8_0)
            add(writer, f"blk.{layer}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:]), q8_0)
            continue
        if arch == "llama" and name.endswith("q_proj.weight"):
            tensor = permute(tensor, config["num_attention_heads"])
        if arch == "llama" and name.endswith("k_proj.weight"):
            tensor = permute(tensor, config["num_key_value_heads"])
        if gemma and name.endswith("norm.weight"):
            tensor = tensor + 1.0
        if gemma and name.endswith("post_attention_layernorm.weight"):
            gname = gguf_name(name).replace("ffn_norm", "post_attention_norm")
        else:
            gname = gguf_name(name)
        add(writer, gname, tensor, q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# The families also written with Q8_0 matrices (`<family>-q8_0.gguf`).
QUANTISED = ("phi3", "qwen2_moe")

if __name__ == "__main__":
    for family in sys.argv[1:] or list(ARCHITECTURES):
        write(family)
        if family in QUANTISED:
            write(family, q8_0=True)
        if family == "deepseek_v2":
            write(family, legacy=True)
        if family == "mixtral":
            write(family, per_expert=True)
