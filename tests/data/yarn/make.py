"""YaRN RoPE scaling (Peng et al. 2023) as Hugging Face transformers computes it, for the
YaRN tests of flm's `core/src/rope.rs` and `models/src/import/hf_families.rs`.

Run `python tests/data/yarn/make.py` (transformers 5.25, torch 2.15). Writes `yarn.json`
beside it: one entry per case below, with
- `config`: the RoPE fields of the case's `config.json` (as a checkpoint writes them);
- `head_dim`, `rotary_dim`: the head width flm's table is built for and the rotated part of
  it (transformers' `head_dim`; DeepSeek's heads are `qk_nope_head_dim + qk_rope_head_dim`
  wide and rotate `qk_rope_head_dim`, which its transformers config calls `head_dim`);
- `flm`: the same parameters in the serde form of flm's `RopeScaling::Yarn`, with
  transformers' defaults filled in as `_compute_yarn_parameters` fills them (the lines
  marked "as transformers") and its attention factor;
- from transformers: `inv_freq` (`ROPE_INIT_FUNCTIONS["yarn"]`, f32), `attention_factor`,
  `softmax_scale_factor` (`yarn_apply_mscale(rope_parameters, 1.0)`), and `cos` and `sin`
  `[len(positions), rotary_dim / 2]` at `positions` as the model's rotary embedding gives
  them (f32; the second half of each row repeats the first and is left out).
"""

import json
import math
import os

import torch
import transformers
from transformers import DeepseekV2Config, Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, yarn_apply_mscale
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

POSITIONS = [0, 1, 4097, 100000]

# DeepSeek-V2-Lite's `config.json` (deepseek-ai/DeepSeek-V2-Lite), its RoPE fields.
DEEPSEEK_V2_LITE = {
    "rope_theta": 10000,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
}

# (name, model kind, config.json RoPE fields, transformers head_dim)
CASES = [
    ("deepseek_v2_lite", "deepseek_v2", DEEPSEEK_V2_LITE, 64),
    # mscale and mscale_all_dim differ: the attention factor is their ratio.
    (
        "deepseek_mscale_ratio",
        "deepseek_v2",
        {
            "rope_theta": 10000,
            "max_position_embeddings": 65536,
            "rope_scaling": {
                "type": "yarn",
                "factor": 16,
                "mscale": 1.0,
                "mscale_all_dim": 0.5,
                "original_max_position_embeddings": 4096,
            },
        },
        64,
    ),
    # Qwen2.5 / Qwen3's documented long-context block.
    (
        "qwen_factor4",
        "qwen3",
        {
            "rope_theta": 1000000.0,
            "max_position_embeddings": 131072,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            },
        },
        128,
    ),
    # gpt-oss's: no truncation of the correction range (transformers 5 form).
    (
        "untruncated",
        "qwen3",
        {
            "max_position_embeddings": 131072,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 4096,
                "truncate": False,
            },
        },
        64,
    ),
    # An explicit attention factor, and betas other than the defaults.
    (
        "explicit_attention_factor",
        "qwen3",
        {
            "rope_theta": 500000.0,
            "max_position_embeddings": 65536,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 8.0,
                "attention_factor": 1.25,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "original_max_position_embeddings": 8192,
            },
        },
        128,
    ),
    # No factor: transformers takes max_position_embeddings / original (8).
    (
        "factor_from_context",
        "qwen3",
        {
            "rope_theta": 10000.0,
            "max_position_embeddings": 65536,
            "rope_scaling": {
                "type": "yarn",
                "factor": None,
                "original_max_position_embeddings": 8192,
            },
        },
        64,
    ),
]


def f32_list(t):
    return [float(v) for v in t.to(torch.float32).flatten().tolist()]


def case(name, kind, fields, head_dim):
    rope = fields.get("rope_parameters") or fields["rope_scaling"]
    # A copy: the config classes add their defaults to the dicts they are given.
    common = json.loads(json.dumps(fields))
    if kind == "deepseek_v2":
        config = DeepseekV2Config(
            hidden_size=2048,
            num_attention_heads=16,
            qk_rope_head_dim=head_dim,
            qk_nope_head_dim=128,
            v_head_dim=128,
            **common,
        )
        flm_head_dim = 128 + head_dim
    else:
        config = Qwen3Config(hidden_size=1024, num_attention_heads=8, head_dim=head_dim, **common)
        flm_head_dim = head_dim
    assert config.head_dim == head_dim
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    softmax_scale_factor = yarn_apply_mscale(config.rope_parameters, 1.0)

    position_ids = torch.tensor([POSITIONS])
    x = torch.zeros(1, dtype=torch.float32)
    if kind == "deepseek_v2":
        freqs_cis = DeepseekV2RotaryEmbedding(config)(x, position_ids)[0]
        cos, sin = freqs_cis.real, freqs_cis.imag
    else:
        cos, sin = Qwen3RotaryEmbedding(config)(x, position_ids)
        cos, sin = cos[0, :, : head_dim // 2], sin[0, :, : head_dim // 2]
    assert cos.dtype == torch.float32 and cos.shape == (len(POSITIONS), head_dim // 2)

    factor = rope["factor"]
    if factor is None:  # as transformers
        factor = fields["max_position_embeddings"] / rope["original_max_position_embeddings"]
    flm = {
        "type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": rope["original_max_position_embeddings"],
        "beta_fast": rope.get("beta_fast") or 32,  # as transformers
        "beta_slow": rope.get("beta_slow") or 1,  # as transformers
        "attention_factor": attention_factor,
        "truncate": rope.get("truncate", True),  # as transformers
        "mscale_all_dim": rope.get("mscale_all_dim") or None,  # 0 folds nothing in transformers
    }
    return {
        "name": name,
        "config": fields,
        "head_dim": flm_head_dim,
        "rotary_dim": head_dim,
        "flm": flm,
        "inv_freq": f32_list(inv_freq),
        "attention_factor": attention_factor,
        "softmax_scale_factor": softmax_scale_factor,
        "positions": POSITIONS,
        "cos": f32_list(cos),
        "sin": f32_list(sin),
    }


def main():
    out = {
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "cases": [case(*c) for c in CASES],
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "yarn.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for c in out["cases"]:
        print(c["name"], c["attention_factor"], c["softmax_scale_factor"], math.fsum(c["inv_freq"]))


if __name__ == "__main__":
    main()
