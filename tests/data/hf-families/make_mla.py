"""Tiny random-weight DeepSeek-V2, DeepSeek-V3 (multi-head latent attention and DeepSeek's
mixture of experts) and GLM-4.5 (DeepSeek-V3's experts behind grouped-query attention)
checkpoints and their logits, from Hugging Face transformers, for flm's tests/hf_families.rs.

Run from this folder: `python make_mla.py [FAMILY ...]` (default: all three). Writes, as
make_tiny.py does (whose weights, input ids and shapes it shares), `<family>/config.json`,
`<family>/model.safetensors` (float32) and `<family>/logits_f32le.bin`, and the family's
entry in `reference.json`, with the largest change of the logits when each feature is
turned off (`max_diff_without`: a check that the test has teeth, not a reference).

- deepseek_v2: no query compression (q_lora_rank null, as DeepSeek-V2-Lite), a latent of
  32 with a RoPE key of 8, heads of 16 + 8 (query/key) and 16 (value); YaRN (factor 4 over
  a pre-training context of 32, mscale and mscale_all_dim 0.707, so that the softmax scale
  has YaRN's factor); layer 0 dense, layer 1 with 16 routed experts of 32 in 4 groups, 3
  per token from the 2 best groups by their best score (group_limited_greedy), the softmax
  weights times routed_scaling_factor 2, and a shared expert.
- deepseek_v3: query compression (q_lora_rank 24), 8 routed experts, 2 per token, RoPE in interleaved pairs
  (rope_interleave), the sigmoid router with a random e_score_correction_bias used only
  to choose, 4 groups chosen 2 by the sum of their two best scores, renormalised weights
  times 2.5, a shared expert, layer 0 dense. No multi-token-prediction layer.
- glm4_moe: GQA (4 heads over 2 of 16) with q/k/v biases, q/k norms, rotate-half RoPE on
  the first 8 of each head's 16 dimensions; DeepSeek-V3's router (sigmoid, random bias,
  4 groups chosen 2, renormalised, times 2.5) over 8 experts of 32, 2 per token, a shared
  expert, layer 0 dense; one multi-token-prediction layer in the config
  (`num_nextn_predict_layers`), which transformers 5.25 neither builds nor saves.
"""

import json
import sys

import safetensors
import torch
import transformers
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
)

from make_tiny import COMMON, HERE, SEQ_LEN, TOKEN_SEED, VOCAB, redraw

EXPERTS = dict(
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    tie_word_embeddings=False,
)
MLA = dict(
    EXPERTS,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
)
FAMILIES = {
    "deepseek_v2": (
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        dict(
            MLA,
            q_lora_rank=None,
            # More experts per token than groups chosen, so that the group limit can bite.
            n_routed_experts=16,
            num_experts_per_tok=3,
            topk_method="group_limited_greedy",
            routed_scaling_factor=2.0,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=32,
                mscale=0.707,
                mscale_all_dim=0.707,
                beta_fast=32,
                beta_slow=1,
            ),
        ),
        1011,
    ),
    "deepseek_v3": (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        dict(
            MLA,
            q_lora_rank=24,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_interleave=True,
            num_mtp_layers=0,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        1012,
    ),
    "glm4_moe": (
        Glm4MoeConfig,
        Glm4MoeForCausalLM,
        dict(
            EXPERTS,
            head_dim=16,
            num_key_value_heads=2,
            attention_bias=True,
            use_qk_norm=True,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            num_mtp_layers=1,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
        ),
        1014,
    ),
}
# Each feature turned off: config changes, or a parameter or buffer name part zeroed.
V3_ROUTING = {
    "groups": dict(n_group=1, topk_group=1),
    "score_bias": "e_score_correction_bias",
    "renormalize": dict(norm_topk_prob=False),
    "routed_scaling": dict(routed_scaling_factor=1.0),
    "shared_expert": "shared_experts.down_proj",
}
WITHOUT = {
    "deepseek_v2": {
        "group_limited": dict(topk_method="greedy"),
        "routed_scaling": dict(routed_scaling_factor=1.0),
        "yarn": dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        "shared_expert": "shared_experts.down_proj",
    },
    "deepseek_v3": V3_ROUTING,
    "glm4_moe": V3_ROUTING,
}


def build(config_cls, model_cls, extra):
    config = config_cls(**{**COMMON, "num_key_value_heads": 4, **extra})
    config._attn_implementation = "eager"
    return model_cls(config).eval()


def main():
    input_ids = torch.randint(
        3, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(TOKEN_SEED)
    ).tolist()
    reference = HERE / "reference.json"
    described = json.loads(reference.read_text())
    assert described["input_ids"] == input_ids, "make_tiny.py's input ids"
    for family in sys.argv[1:] or list(FAMILIES):
        config_cls, model_cls, extra, seed = FAMILIES[family]
        torch.manual_seed(seed)
        model = build(config_cls, model_cls, extra)
        redraw(model, seed)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    # Large enough to change which experts win, as a trained bias does.
                    b.copy_(0.3 * torch.randn(b.shape, generator=g))
        out_dir = HERE / family
        model.save_pretrained(out_dir, safe_serialization=True)
        (out_dir / "generation_config.json").unlink(missing_ok=True)
        with torch.no_grad():
            logits = model(torch.tensor([input_ids])).logits[0].float()
        (out_dir / "logits_f32le.bin").write_bytes(logits.numpy().astype("<f4").tobytes())
        diffs = {}
        for feature, change in WITHOUT[family].items():
            if isinstance(change, dict):
                plain = build(config_cls, model_cls, dict(extra, **change))
            else:
                plain = build(config_cls, model_cls, extra)
            plain.load_state_dict(model.state_dict())
            if isinstance(change, str):
                with torch.no_grad():
                    for name, t in list(plain.named_parameters()) + list(plain.named_buffers()):
                        if change in name:
                            t.zero_()
            with torch.no_grad():
                plain_logits = plain(torch.tensor([input_ids])).logits[0].float()
            diffs[feature] = float((logits - plain_logits).abs().max())
        described["families"][family] = dict(
            transformers=transformers.__version__,
            torch=torch.__version__,
            safetensors=safetensors.__version__,
            generator="make_mla.py",
            model_class=model_cls.__name__,
            weight_seed=seed,
            logits_shape=list(logits.shape),
            max_abs_logit=float(logits.abs().max()),
            max_diff_without=diffs,
        )
    reference.write_text(json.dumps(described, indent=1) + "\n")


if __name__ == "__main__":
    main()
