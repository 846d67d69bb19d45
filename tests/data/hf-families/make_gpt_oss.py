"""A tiny random-weight gpt-oss checkpoint (OpenAI's gpt-oss-20b/120b architecture) and its
logits, from Hugging Face transformers' own `GptOssForCausalLM`, for flm's
tests/hf_families.rs (issue 51).

Run from this folder: `python make_gpt_oss.py`. Writes, as make_tiny.py does (whose
vocabulary, hidden size, input ids and weight conventions it shares), `gpt_oss/config.json`,
`gpt_oss/model.safetensors` (float32, by `save_pretrained`) and `gpt_oss/logits_f32le.bin`
(the logits `[SEQ_LEN, 256]` of one prefill of the input ids, f32 little-endian,
row-major), and the `gpt_oss` entry of `reference.json`: the largest change of the logits
when each feature is turned off (`max_diff_without`: a check that the test has teeth, not a
reference), the same for a few plausible implementation mistakes (`max_diff_if_wrong`),
how many expert activations the SwiGLU clamp cut (`swiglu_clamped`), and `greedy_ids`, the
20 ids of a greedy continuation of the input ids (argmax of a full prefill of the ids so
far at each step, no cache), with the smallest gap between the best and the second-best
logit on the way (`greedy_min_margin`).

The model: vocabulary 256, hidden 64, 4 layers alternating sliding_attention (layers 0, 2)
and full_attention (1, 3), a sliding window of 4 (< the 24-token input); 4 query heads over
2 KV heads of 16 (so q is 64 wide, k and v 32), q/k/v/o biases (`attention_bias`); one
learned attention sink per head; YaRN RoPE as gpt-oss ships it (rope_theta 150000,
factor 4, beta_fast 32, beta_slow 1, truncate false) over a pre-training context of 32
(so that one frequency pair lies on the ramp between the extrapolated and the interpolated
ones); in every layer 8 experts of 32, 2 per token, a router with a bias, expert biases,
swiglu_alpha 1.702 and swiglu_limit 1.0 (gpt-oss ships 7.0; a smaller limit so that the
clamp cuts many activations of these O(1) weights); untied lm_head; RMSNorm eps 1e-5.

Weights: `redraw` of make_tiny.py (N(0, 1/fan_in) matrices, 1 + N(0, 0.1) norm gains,
N(0, 0.1) `.bias`), then, with a second generator (seed + 1): the experts' matrices
N(0, 1/fan_in) with their true fan-in (H for gate_up_proj, I for down_proj; redraw takes
the last dimension), the experts' biases N(0, 0.3), the router's bias N(0, 0.5), the sinks
N(0, 1) * 2 (transformers initialises the experts' biases to zero and the sinks near 0).

Tensors transformers 5.25 saves (f32; E = 8 experts, H = 64 hidden, I = 32, 4 heads of
16, 2 KV heads; for each layer L in 0..3):
    model.embed_tokens.weight                       [256, 64]
    model.layers.L.input_layernorm.weight           [64]
    model.layers.L.self_attn.q_proj.weight          [64, 64]   (out, in) as nn.Linear
    model.layers.L.self_attn.q_proj.bias            [64]
    model.layers.L.self_attn.k_proj.weight          [32, 64]
    model.layers.L.self_attn.k_proj.bias            [32]
    model.layers.L.self_attn.v_proj.weight          [32, 64]
    model.layers.L.self_attn.v_proj.bias            [32]
    model.layers.L.self_attn.o_proj.weight          [64, 64]
    model.layers.L.self_attn.o_proj.bias            [64]
    model.layers.L.self_attn.sinks                  [4]        one per query head
    model.layers.L.post_attention_layernorm.weight  [64]
    model.layers.L.mlp.router.weight                [8, 64]    (E, H)
    model.layers.L.mlp.router.bias                  [8]
    model.layers.L.mlp.experts.gate_up_proj         [8, 64, 64]  (E, H, 2I): x @ W, NOT
                                                    transposed like nn.Linear; gate and up
                                                    INTERLEAVED on the last axis: column
                                                    2j is gate j, 2j+1 is up j
    model.layers.L.mlp.experts.gate_up_proj_bias    [8, 64]    (E, 2I), interleaved too
    model.layers.L.mlp.experts.down_proj            [8, 32, 64]  (E, I, H): h @ W
    model.layers.L.mlp.experts.down_proj_bias       [8, 64]    (E, H)
    model.norm.weight                               [64]
    lm_head.weight                                  [256, 64]
(No rotary buffers are saved. The released gpt-oss checkpoints hold the experts in MXFP4
as `gate_up_proj_blocks`/`_scales`; transformers dequantises them to these names.)

The math of transformers 5.25's modeling_gpt_oss.py (eager attention, eager experts):
- Decoder layer (pre-norm): h += attn(rmsnorm(h) * g1); h += moe(rmsnorm(h) * g2); the
  logits are lm_head(rmsnorm(h) * g). rmsnorm(x) = x / sqrt(mean(x^2) + 1e-5), gain times
  the normalised x (no 1 + w).
- Attention: q = x Wq^T + bq, k, v likewise, split in heads of 16; RoPE rotate-half (pairs
  (i, i + 8) of each head) on q and k with cos/sin of position * inv_freq, both cos and sin
  multiplied by YaRN's attention factor; query head h uses KV head h // 2. Scores
  s_j = q.k_j / sqrt(16) (scaling = head_dim^-0.5, no other factor) over the allowed keys
  j; softmax over the scores AND the head's sink: p_j = exp(s_j) / (exp(sink_h) +
  sum_j' exp(s_j')); the sink's column is dropped (it takes probability, adds no value);
  out = sum_j p_j v_j, then o_proj with its bias. Sink -inf is plain attention.
- Masks: full layers see keys 0..i (causal); sliding layers see the keys j with
  i - W < j <= i, i.e. the last W = sliding_window = 4 positions INCLUDING i itself
  (`kv_idx > q_idx - sliding_window`).
- YaRN (`_compute_yarn_parameters`, dim = 16, base 150000, factor 4, original context 32,
  truncate false): pos_freqs_i = base^(2i/16), i in 0..8; extrapolation = 1/pos_freqs,
  interpolation = 1/(factor * pos_freqs); low = max(0, d(beta_fast)), high =
  min(15, d(beta_slow)) with d(r) = 16 ln(32 / (2 pi r)) / (2 ln base) (no floor/ceil
  since truncate is false; here low = 0, high = 1.0925); ramp_i = clamp((i - low) /
  (high - low), 0, 1); inv_freq_i = interpolation_i * ramp_i + extrapolation_i *
  (1 - ramp_i). Attention factor (mscale) = 0.1 ln(factor) + 1 = 1.138629, multiplying
  cos and sin (so q.k scales by its square). `reference.json` lists the inv_freq.
- Router: logits = x R^T + b (bias added BEFORE the top-k); take the top k = 2 logits;
  weights = softmax over those 2 logits only (not over all 8); no further scaling.
- Expert e on its tokens: gu = x @ gate_up_proj[e] + gate_up_proj_bias[e] (2I wide);
  gate = gu[0::2], up = gu[1::2]; gate = min(gate, limit) (no lower clamp); up =
  clamp(up, -limit, limit); glu = gate * sigmoid(alpha * gate) with alpha = 1.702;
  y = ((up + 1) * glu) @ down_proj[e] + down_proj_bias[e]; moe(x) = sum over the 2 chosen
  experts of weight * y (each chosen expert's down bias is weighted too).
"""

import json
import math

import safetensors
import safetensors.torch
import torch
import transformers
from transformers import GptOssConfig, GptOssForCausalLM

from make_tiny import COMMON, HERE, SEQ_LEN, TOKEN_SEED, VOCAB, redraw

FAMILY = "gpt_oss"
SEED = 1015
GREEDY_TOKENS = 20
LAYERS = 4
EXTRA = dict(
    num_hidden_layers=LAYERS,
    head_dim=16,
    intermediate_size=32,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2),
    attention_bias=True,
    swiglu_alpha=1.702,
    swiglu_limit=1.0,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=150000.0,
        factor=4.0,
        original_max_position_embeddings=32,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
    ),
    tie_word_embeddings=False,
)
# Each feature turned off: config changes, or parameter names whose tensors are set
# to a value (0, or -inf for the sinks).
WITHOUT = {
    "sinks": ("self_attn.sinks", -math.inf),
    "sliding_window": dict(layer_types=["full_attention"] * LAYERS),
    "swiglu_clamp": dict(swiglu_limit=1e30),
    "router_bias": ("mlp.router.bias", 0.0),
    "expert_biases": ("_proj_bias", 0.0),
    "yarn": dict(rope_parameters=dict(rope_type="default", rope_theta=150000.0)),
}


def build(**change):
    config = GptOssConfig(**{**COMMON, **EXTRA, **change})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return GptOssForCausalLM(config).eval()


def redraw_gpt_oss(model, seed):
    redraw(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif name.endswith("experts.down_proj"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif name.endswith("_proj_bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("router.bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("self_attn.sinks"):
                p.copy_(2.0 * torch.randn(p.shape, generator=g))


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def variant(model, change=None, set_to=None, patch=None):
    """The logits of `model`'s weights with a config change, tensors set, or a patch."""
    plain = build(**(change or {}))
    plain.load_state_dict(model.state_dict())
    if set_to is not None:
        part, value = set_to
        with torch.no_grad():
            for name, p in plain.named_parameters():
                if part in name:
                    p.fill_(value)
    if patch is not None:
        patch(plain)
    return plain


def clamp_counts(model, ids):
    """How many of the chosen experts' gate and up activations the SwiGLU clamp cut."""
    counts = dict(gate_above=0, up_above=0, up_below=0, gate_below_minus_limit=0, total=0)
    hooks = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        original = experts._apply_gate

        def counting(gate_up, experts=experts, original=original):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            lim = experts.limit
            counts["gate_above"] += int((gate > lim).sum())
            counts["gate_below_minus_limit"] += int((gate < -lim).sum())
            counts["up_above"] += int((up > lim).sum())
            counts["up_below"] += int((up < -lim).sum())
            counts["total"] += gate.numel()
            return original(gate_up)

        experts._apply_gate = counting
        hooks.append((experts, original))
    logits_of(model, ids)
    for experts, original in hooks:
        experts._apply_gate = original
    return counts


def main():
    input_ids = torch.randint(
        3, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(TOKEN_SEED)
    ).tolist()
    reference = HERE / "reference.json"
    described = json.loads(reference.read_text())
    assert described["input_ids"] == input_ids, "make_tiny.py's input ids"

    torch.manual_seed(SEED)
    model = build()
    redraw_gpt_oss(model, SEED)
    out_dir = HERE / FAMILY
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "generation_config.json").unlink(missing_ok=True)
    logits = logits_of(model, input_ids)
    (out_dir / "logits_f32le.bin").write_bytes(logits.numpy().astype("<f4").tobytes())

    print("tensors saved:")
    with safetensors.safe_open(out_dir / "model.safetensors", "pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            print(f"  {name} {list(t.shape)} {t.dtype}")

    # The default experts implementation (if not eager) must agree.
    default_cfg = GptOssConfig(**{**COMMON, **EXTRA})
    default_cfg._attn_implementation = "eager"
    default_model = GptOssForCausalLM(default_cfg).eval()
    default_model.load_state_dict(model.state_dict())
    print("default experts implementation:", default_model.config._experts_implementation,
          "max diff", float((logits_of(default_model, input_ids) - logits).abs().max()))

    diffs = {}
    for feature, change in WITHOUT.items():
        if isinstance(change, dict):
            plain = variant(model, change=change)
        else:
            plain = variant(model, set_to=change)
        diffs[feature] = float((logits - logits_of(plain, input_ids)).abs().max())

    # Plausible mistakes of an implementation.
    def concatenated(m):
        for layer in m.model.layers:
            ex = layer.mlp.experts

            def gate_fn(gate_up, ex=ex):
                gate, up = gate_up.chunk(2, dim=-1)
                gate = gate.clamp(max=ex.limit)
                up = up.clamp(-ex.limit, ex.limit)
                return (up + 1) * gate * torch.sigmoid(gate * ex.alpha)

            ex._apply_gate = gate_fn

    def gate_clamped_below(m):
        for layer in m.model.layers:
            ex = layer.mlp.experts

            def gate_fn(gate_up, ex=ex):
                gate, up = gate_up[..., ::2], gate_up[..., 1::2]
                gate = gate.clamp(-ex.limit, ex.limit)
                up = up.clamp(-ex.limit, ex.limit)
                return (up + 1) * gate * torch.sigmoid(gate * ex.alpha)

            ex._apply_gate = gate_fn

    def softmax_then_topk(m):
        for layer in m.model.layers:
            router = layer.mlp.router

            def fwd(x, router=router):
                rl = torch.nn.functional.linear(x, router.weight, router.bias)
                probs = torch.softmax(rl, dim=-1)
                top, idx = torch.topk(probs, router.top_k, dim=-1)
                return rl, top, idx

            router.forward = fwd

    mistakes = {
        "gate_up_concatenated": variant(model, patch=concatenated),
        "gate_clamped_below": variant(model, patch=gate_clamped_below),
        "router_softmax_over_all": variant(model, patch=softmax_then_topk),
        "window_one_longer": variant(model, change=dict(sliding_window=5)),
        "yarn_no_attention_factor": variant(
            model, change=dict(rope_parameters=dict(EXTRA["rope_parameters"], attention_factor=1.0))
        ),
        "yarn_truncated": variant(
            model, change=dict(rope_parameters=dict(EXTRA["rope_parameters"], truncate=True))
        ),
    }
    wrong = {k: float((logits - logits_of(m, input_ids)).abs().max()) for k, m in mistakes.items()}

    counts = clamp_counts(model, input_ids)

    ids = list(input_ids)
    margin = math.inf  # the smallest gap between the best and second-best logit
    for _ in range(GREEDY_TOKENS):
        top = logits_of(model, ids)[-1].topk(2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))
    greedy = ids[SEQ_LEN:]

    rotary = model.model.rotary_emb
    described["families"][FAMILY] = dict(
        transformers=transformers.__version__,
        torch=torch.__version__,
        safetensors=safetensors.__version__,
        generator="make_gpt_oss.py",
        model_class=GptOssForCausalLM.__name__,
        weight_seed=SEED,
        logits_shape=list(logits.shape),
        max_abs_logit=float(logits.abs().max()),
        max_diff_without=diffs,
        max_diff_if_wrong=wrong,
        swiglu_clamped=counts,
        yarn_inv_freq=[float(x) for x in rotary.inv_freq],
        yarn_attention_factor=float(rotary.attention_scaling),
        greedy_ids=greedy,
        greedy_min_margin=margin,
    )
    reference.write_text(json.dumps(described, indent=1) + "\n")
    print(json.dumps(described["families"][FAMILY], indent=1))


if __name__ == "__main__":
    main()
