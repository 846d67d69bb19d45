"""Golden routing cases for flm's `Op::MoeFfn` (devices/tests/ops_moe_routing.rs).

Runs transformers' own routers on small random configurations and writes, for each case,
the router weight, the choice bias, the hidden states and the experts and weights the
router picks for each row, to `routing.json` beside this script:

- `DeepseekV2TopkRouter`: softmax scores, `greedy` and `group_limited_greedy` (groups
  scored by their best expert), times `routed_scaling_factor`; it never renormalises.
- `DeepseekV3TopkRouter` and `Glm4MoeTopkRouter`: sigmoid scores plus
  `e_score_correction_bias` to choose, groups scored by the sum of their two best biased
  scores, the unbiased scores as weights, renormalised (`+ 1e-20`) iff `norm_topk_prob`,
  times `routed_scaling_factor`.

Every row's choice is drawn to be clear: the last expert chosen beats the first one left
out (among the candidates of the chosen groups) and the last group chosen beats the first
one left out by `MARGIN` at least, so that a logit that differs in its last bits (another
summation order) chooses the same experts.

Run with a Python that has transformers 5.25 and torch 2.15 (`python make.py`; CPU, f32);
the output is the same on every run.
"""

import json
import pathlib

import torch
import transformers
from transformers import DeepseekV2Config, DeepseekV3Config, Glm4MoeConfig
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

N_EXPERTS, HIDDEN, TOP_K, N_GROUPS, TOP_GROUPS, ROWS = 16, 8, 4, 4, 2, 6
SCALE = 2.5
MARGIN = 1e-4
SEED = 20260107


def margins(choice, top_k, n_groups, top_groups, group_score):
    """The smallest gap, over the rows, between the groups and experts chosen and left out."""
    least = float("inf")
    size = choice.shape[1] // n_groups
    for row in choice.double():
        groups = row.view(n_groups, size)
        if group_score == "max":
            g = groups.max(dim=-1).values
        else:
            g = groups.topk(2, dim=-1).values.sum(dim=-1)
        order = g.argsort(descending=True)
        if top_groups < n_groups:
            least = min(least, (g[order[top_groups - 1]] - g[order[top_groups]]).item())
        candidates = torch.cat([groups[i] for i in order[:top_groups]])
        s = candidates.sort(descending=True).values
        if top_k < len(s):
            least = min(least, (s[top_k - 1] - s[top_k]).item())
    return least


def case(name, router, config, scoring, groups, bias, renormalize, generator):
    # Draws again (from the same seeded stream) until every choice is clear.
    for _ in range(100):
        with torch.no_grad():
            router.weight.copy_(torch.randn(N_EXPERTS, HIDDEN, generator=generator) * 0.6)
            if bias is not None:
                router.e_score_correction_bias.copy_(bias)
            x = torch.randn(ROWS, HIDDEN, generator=generator)
            logits, weights, ids = router(x)
        if scoring == "softmax":
            choice = logits.softmax(dim=-1)
        else:
            choice = logits.sigmoid() + (bias if bias is not None else 0.0)
        if groups is None:
            gap = margins(choice, TOP_K, 1, 1, "max")
        else:
            gap = margins(
                choice, TOP_K, groups["n_groups"], groups["top_groups"], groups["score"]
            )
        if gap > MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no clear draw in 100; change the seed")
    # The routers give their top_k unsorted: sort each row by expert.
    order = ids.argsort(dim=-1)
    ids = ids.gather(1, order)
    weights = weights.gather(1, order)
    return {
        "name": name,
        "transformers_class": type(router).__name__,
        "config": {k: getattr(config, k) for k in sorted(config_keys(config))},
        "routing": {
            "top_k": TOP_K,
            "scoring": scoring,
            "groups": groups,
            "renormalize": renormalize,
            "scale": SCALE,
        },
        "n_experts": N_EXPERTS,
        "hidden": HIDDEN,
        "router_weight": router.weight.detach().flatten().tolist(),
        "choice_bias": None if bias is None else bias.tolist(),
        "input": x.flatten().tolist(),
        "expert_ids": ids.tolist(),
        "expert_weights": weights.tolist(),
        "min_choice_margin": gap,
    }


def config_keys(config):
    keys = ["num_experts_per_tok", "n_group", "topk_group", "routed_scaling_factor"]
    for extra in ["topk_method", "norm_topk_prob"]:
        if hasattr(config, extra):
            keys.append(extra)
    return keys


def main():
    generator = torch.Generator().manual_seed(SEED)
    common = dict(
        hidden_size=HIDDEN,
        n_routed_experts=N_EXPERTS,
        num_experts_per_tok=TOP_K,
        routed_scaling_factor=SCALE,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    cases = []
    for method, groups in [
        ("greedy", None),
        (
            "group_limited_greedy",
            {"n_groups": N_GROUPS, "top_groups": TOP_GROUPS, "score": "max"},
        ),
    ]:
        config = DeepseekV2Config(
            **common, topk_method=method, n_group=N_GROUPS, topk_group=TOP_GROUPS
        )
        cases.append(
            case(
                f"deepseek_v2 {method}",
                DeepseekV2TopkRouter(config),
                config,
                "softmax",
                groups,
                None,
                False,
                generator,
            )
        )
    sum2 = {"n_groups": N_GROUPS, "top_groups": TOP_GROUPS, "score": "sum_of_top2"}
    for cls, config_cls, family in [
        (DeepseekV3TopkRouter, DeepseekV3Config, "deepseek_v3"),
        (Glm4MoeTopkRouter, Glm4MoeConfig, "glm4_moe"),
    ]:
        for norm in [True, False]:
            config = config_cls(
                **common, n_group=N_GROUPS, topk_group=TOP_GROUPS, norm_topk_prob=norm
            )
            bias = (torch.rand(N_EXPERTS, generator=generator) - 0.5) * 0.4
            cases.append(
                case(
                    f"{family} norm_topk_prob={norm}",
                    cls(config),
                    config,
                    "sigmoid",
                    sum2,
                    bias,
                    norm,
                    generator,
                )
            )
    out = pathlib.Path(__file__).with_name("routing.json")
    doc = {
        "made_by": "tests/data/moe_routing/make.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "cases": cases,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for c in cases:
        print(c["name"], "margin", c["min_choice_margin"], "ids", c["expert_ids"][0])


if __name__ == "__main__":
    main()
