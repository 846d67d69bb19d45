"""A random-weight GPTQ checkpoint (4-bit, symmetric, groups of 128, no act-order, the
layout of Qwen's official *-GPTQ-Int4 releases) at the shapes of a Hugging Face
config.json, for `flm bench` (docs/benchmarks.md): every projection and the classifier
packed as tools/quant/make_gptq_awq.py packs them (GPTQModel's layout, v1 zero points), the
embedding and norms f16. With `--awq`, an AutoAWQ checkpoint instead (4-bit, asymmetric
with AWQ's zero points, groups of 128, the GEMM layout: the scheme of Qwen's official
*-AWQ releases).

With `--act-order`, `desc_act` GPTQ checkpoints: each linear's input channels go to
groups in a random order (`g_idx` as GPTQ's act-order makes it), shared by the projections
that read the same input (q/k/v, gate/up), as they share one Hessian in GPTQ.

`python tools/quant/make_gptq_bench.py CONFIG OUT_DIR [--awq | --act-order]`
"""

import json
import sys
from pathlib import Path

import safetensors.torch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gptq_awq import codes_of, pack_awq, pack_gptq, quantise  # noqa: E402

GROUP = 128


def linear(name, out, inp, g, tensors, awq, order=None):
    """`order`: the seed of the act-order permutation (GPTQ), or None for none."""
    w = torch.randn(out, inp, generator=g) / inp**0.5
    if awq:
        scales, zeros, g_idx = quantise(w, GROUP, False, False, False, "awq", g)
        qweight, qzeros = pack_awq(codes_of(w, scales, zeros, g_idx), zeros)
        tensors.update({f"{name}.qweight": qweight, f"{name}.qzeros": qzeros,
                        f"{name}.scales": scales})
        return
    act_order = order is not None
    perm_g = torch.Generator().manual_seed(order) if act_order else g
    scales, zeros, g_idx = quantise(w, GROUP, True, act_order, False, "gptq", perm_g)
    qweight, qzeros = pack_gptq(codes_of(w, scales, zeros, g_idx), zeros)
    tensors.update({f"{name}.qweight": qweight, f"{name}.qzeros": qzeros,
                    f"{name}.scales": scales, f"{name}.g_idx": g_idx})


def main():
    config_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    awq = "--awq" in sys.argv[3:]
    act_order = "--act-order" in sys.argv[3:]
    c = json.loads(config_path.read_text())
    g = torch.Generator().manual_seed(0)
    dim, hidden, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim", dim // heads)
    kv = c.get("num_key_value_heads", heads) * head_dim
    tensors = {
        "model.embed_tokens.weight": (torch.randn(c["vocab_size"], dim, generator=g) * 0.02).half(),
        "model.norm.weight": torch.ones(dim).half(),
    }
    linear("lm_head", c["vocab_size"], dim, g, tensors, awq, 1 if act_order else None)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}"
        tensors[f"{p}.input_layernorm.weight"] = torch.ones(dim).half()
        tensors[f"{p}.post_attention_layernorm.weight"] = torch.ones(dim).half()
        # The act-order seed of each linear: one per input the layer's projections read.
        for name, o, i, input_ in [("self_attn.q_proj", heads * head_dim, dim, 0),
                                   ("self_attn.k_proj", kv, dim, 0), ("self_attn.v_proj", kv, dim, 0),
                                   ("self_attn.o_proj", dim, heads * head_dim, 1),
                                   ("mlp.gate_proj", hidden, dim, 2), ("mlp.up_proj", hidden, dim, 2),
                                   ("mlp.down_proj", dim, hidden, 3)]:
            order = 2 + 4 * l + input_ if act_order else None
            linear(f"{p}.{name}", o, i, g, tensors, awq, order)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    if awq:
        c["quantization_config"] = dict(quant_method="awq", bits=4, group_size=GROUP, zero_point=True,
                                        version="gemm")
    else:
        c["quantization_config"] = dict(quant_method="gptq", bits=4, group_size=GROUP,
                                        desc_act=act_order, sym=True, checkpoint_format="gptq")
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")


if __name__ == "__main__":
    main()
