"""Tiny random-weight Llama 3, Mistral, Qwen2, Qwen3, Phi-3, Gemma 1/2/3, Mixtral,
Qwen3-MoE, Qwen2-MoE and GLM-4-0414 checkpoints and their logits, from Hugging Face transformers, for flm's
tests/hf_families.rs.

Run from this folder: `python make_tiny.py [FAMILY ...]` (default: every family). Writes,
per family, `<family>/config.json`,
`<family>/model.safetensors` (float32) and `<family>/logits_f32le.bin` (the logits
`[len(INPUT_IDS), vocab_size]` of one prefill of INPUT_IDS, f32 little-endian, row-major),
and its entry in `reference.json` describing them (versions, seeds, shapes, checks); the
entries of families not run are kept.

The weights are redrawn with scales that give O(1) activations (transformers' default
`initializer_range` of 0.02 would make every logit nearly 0, so any graph would match).
Each family has what makes it differ from Llama 2 exercised by the test positions:
- llama3: rope_theta 500000 and `rope_scaling` of type llama3 with an
  original_max_position_embeddings of 64, so that the wavelengths of most frequency pairs
  exceed the low/high-frequency thresholds (scaled and smoothed pairs at positions < 24);
- mistral: a sliding window of 8 tokens, shorter than the 24-token sequence;
- qwen2: q/k/v biases (no output bias), tied embeddings, rope_theta 1000000;
- qwen3: an RMSNorm over each query and key head before RoPE, heads of 32 (so that the
  query width, 128, exceeds the hidden size, 64, as in Qwen3-0.6B), tied embeddings;
- phi3: fused qkv and gate/up projections, LongRoPE over the first 12 of 16 dimensions
  (partial_rotary_factor 0.75, as Phi-4-mini) with a pre-training context of 16, so that
  the 24-token input runs on the long factors and the attention factor;
- mixtral: 4 experts of 128, 2 per token (top-2 of a softmax, renormalised), in every
  layer;
- qwen3_moe: 4 experts of 32, 2 per token with norm_topk_prob, layer 0 routed and layer 1
  dense (mlp_only_layers), the per-head q/k norms of Qwen3.
- qwen2_moe: 4 experts of 32, 2 per token without norm_topk_prob (transformers' default),
  in both layers, a shared expert of 48 weighted by the sigmoid of its gate, q/k/v biases.
- gemma: GeGLU (tanh GELU), RMSNorm gains 1 + w, embeddings times sqrt(hidden), tied;
- gemma2: besides, post-attention and post-feed-forward norms, a sliding window of 8 on
  layer 0 (layer 1 global), query_pre_attn_scalar 24 (not head_dim), and soft-capping of
  the attention scores at 1.5 and of the logits at 4 (low caps, so that they bite);
- gemma3: post-norms, q/k norms, the window on layer 0, and two RoPEs: theta 10000 on the
  sliding layer, theta 1000000 with linear scaling by 8 on the global one.
- glm4: post-attention and post-MLP norms, a fused gate/up projection, q/k/v biases (no
  output bias), RoPE in adjacent pairs on the first 8 of each head's 16 dimensions.
Gemma's norm weights are drawn as N(0, 0.1) (its gain is 1 + w).
"""

import json
import math
import sys
from pathlib import Path

import safetensors
import torch
import transformers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Glm4Config,
    Glm4ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

HERE = Path(__file__).resolve().parent
VOCAB = 256
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="float32",
)
FAMILIES = {
    "llama3": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
            tie_word_embeddings=False,
        ),
        1001,
    ),
    "mistral": (
        MistralConfig,
        MistralForCausalLM,
        dict(rope_theta=10000.0, sliding_window=8, tie_word_embeddings=False),
        1002,
    ),
    "qwen2": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            rope_theta=1000000.0,
            use_sliding_window=False,
            sliding_window=None,
            tie_word_embeddings=True,
        ),
        1003,
    ),
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(
            head_dim=32,
            rope_theta=1000000.0,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            tie_word_embeddings=True,
        ),
        1004,
    ),
    "phi3": (
        Phi3Config,
        Phi3ForCausalLM,
        dict(
            partial_rotary_factor=0.75,
            original_max_position_embeddings=16,
            rope_scaling=dict(
                rope_type="longrope",
                short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 9.0],
            ),
            sliding_window=None,
            tie_word_embeddings=False,
            pad_token_id=0,
        ),
        1005,
    ),
    "gemma": (
        GemmaConfig,
        GemmaForCausalLM,
        dict(head_dim=16, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True),
        1006,
    ),
    "gemma2": (
        Gemma2Config,
        Gemma2ForCausalLM,
        dict(
            head_dim=16,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=4.0,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            tie_word_embeddings=True,
        ),
        1007,
    ),
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        dict(
            head_dim=32,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=32,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
            ),
            tie_word_embeddings=True,
        ),
        1008,
    ),
    "mixtral": (
        MixtralConfig,
        MixtralForCausalLM,
        dict(
            rope_theta=1000000.0,
            sliding_window=None,
            num_local_experts=4,
            num_experts_per_tok=2,
            tie_word_embeddings=False,
        ),
        1006,
    ),
    "qwen3_moe": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(
            head_dim=16,
            rope_theta=1000000.0,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            tie_word_embeddings=False,
        ),
        1007,
    ),
    "qwen2_moe": (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        dict(
            rope_theta=1000000.0,
            qkv_bias=True,
            use_sliding_window=False,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            tie_word_embeddings=False,
        ),
        1009,
    ),
    "glm4": (
        Glm4Config,
        Glm4ForCausalLM,
        dict(
            head_dim=16,
            attention_bias=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
            tie_word_embeddings=False,
            pad_token_id=0,
        ),
        1010,
    ),
}
# What each Gemma's check of teeth turns off: the soft caps (gemma2), the sliding window
# and the local RoPE (gemma3), GeGLU for SwiGLU (gemma); GLM-4's: RoPE on half of each head
# (RoPE on all of it instead).
WITHOUT = {
    "gemma2": dict(attn_logit_softcapping=None, final_logit_softcapping=None),
    "gemma3": dict(
        layer_types=["full_attention", "full_attention"],
        rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=1000000.0),
            full_attention=dict(rope_type="default", rope_theta=1000000.0),
        ),
    ),
    "gemma": dict(hidden_act="silu"),
    "glm4": dict(
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0)
    ),
}
TOKEN_SEED = 1000
SEQ_LEN = 24


def redraw(model, seed):
    """Weights with O(1) activations: N(0, 1/fan_in) matrices (the experts' stacked ones
    too, fan_in their last dimension) and embeddings (so that tied logits stay O(1) too),
    1 + N(0, 0.1) norm gains, N(0, 0.1) biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                offset = 0.0 if "Gemma" in type(model).__name__ else 1.0
                p.copy_(offset + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def main():
    input_ids = torch.randint(
        3, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(TOKEN_SEED)
    ).tolist()
    reference = HERE / "reference.json"
    kept = json.loads(reference.read_text()) if reference.exists() else dict(families={})
    for entry in kept["families"].values():
        # Entries of files written when the versions were recorded once for all.
        for tool in ("transformers", "torch", "safetensors"):
            entry.setdefault(tool, kept.get(tool))
    described = dict(
        generator="make_tiny.py",
        token_seed=TOKEN_SEED,
        input_ids=input_ids,
        logits_file="logits_f32le.bin",
        families=kept["families"],
    )
    chosen = sys.argv[1:] or list(FAMILIES)
    for family in chosen:
        config_cls, model_cls, extra, seed = FAMILIES[family]
        torch.manual_seed(seed)
        config = config_cls(**COMMON, **extra)
        config._attn_implementation = "eager"
        model = model_cls(config).eval()
        redraw(model, seed)
        out_dir = HERE / family
        model.save_pretrained(out_dir, safe_serialization=True)
        (out_dir / "generation_config.json").unlink(missing_ok=True)
        with torch.no_grad():
            logits = model(torch.tensor([input_ids])).logits[0].float()
        (out_dir / "logits_f32le.bin").write_bytes(logits.numpy().astype("<f4").tobytes())
        # How much the family's feature matters here: the logits of the same weights
        # without it (a check that the test has teeth, not a reference).
        plain = dict(extra, **WITHOUT.get(family, {}))
        plain.pop("rope_scaling", None)
        if family == "mistral":
            plain["sliding_window"] = None
        if family == "mixtral":
            plain["num_experts_per_tok"] = 1
        if family == "qwen3_moe":
            plain["norm_topk_prob"] = False
        if family == "qwen3":
            # The same weights without the per-head norms: Llama's graph with heads of 32.
            plain_model = LlamaForCausalLM(
                LlamaConfig(**COMMON, head_dim=32, rope_theta=1000000.0, tie_word_embeddings=True)
            ).eval()
            state = {k: v for k, v in model.state_dict().items() if "_norm." not in k or "layernorm" in k}
            plain_model.load_state_dict(state)
        else:
            plain_model = model_cls(config_cls(**COMMON, **plain)).eval()
            plain_model.load_state_dict(model.state_dict())
        if family == "qwen2_moe":
            # Without the shared expert: its down projection zeroed.
            with torch.no_grad():
                for name, p in plain_model.named_parameters():
                    if "shared_expert.down_proj" in name:
                        p.zero_()
        if family == "qwen2":
            with torch.no_grad():
                for name, p in plain_model.named_parameters():
                    if name.endswith(".bias"):
                        p.zero_()
        with torch.no_grad():
            plain_logits = plain_model(torch.tensor([input_ids])).logits[0].float()
        described["families"][family] = dict(
            transformers=transformers.__version__,
            torch=torch.__version__,
            safetensors=safetensors.__version__,
            model_class=model_cls.__name__,
            weight_seed=seed,
            logits_shape=list(logits.shape),
            max_abs_logit=float(logits.abs().max()),
            max_diff_without_feature=float((logits - plain_logits).abs().max()),
        )
    reference.write_text(json.dumps(described, indent=1) + "\n")


if __name__ == "__main__":
    main()
