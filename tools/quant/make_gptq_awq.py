"""Tiny GPTQ and AWQ int4 checkpoints and their references, for flm's tests/gptq_awq.rs.

Run with a Python that has torch, transformers and safetensors:
`python tools/quant/make_gptq_awq.py [--gptqmodel SDIST] [--autoawq SDIST]`.
It writes `tests/data/gptq-awq/<variant>/{config.json,model.safetensors}` and
`tests/data/gptq-awq/reference.json`.

Each variant is a random two-layer Llama (transformers' `LlamaForCausalLM`, hidden 128)
whose seven projections per layer are round-to-nearest quantised and packed as the
reference packers pack them (the GPTQ algorithm's error feedback changes which codes are
chosen, not how they are stored):
- GPTQ: GPTQModel's `PackableQuantLinear.pack_original` (gptqmodel 7.7.0,
  `nn_modules/qlinear/__init__.py`): `qweight [in/8, out]` int32, 8 codes per word along
  the input dimension, code `j` of a word in bits `4j..4j+4`; `qzeros [groups, out/8]`
  packed the same way along the output dimension; f16 `scales [groups, out]`; int32
  `g_idx [in]` (the group of each input channel). Saved in the `gptq` (v1) checkpoint
  format: the packed zero words minus 0x11111111 (GPTQModel's
  `convert_gptq_v2_to_v1_format_module`, whose borrows a reader undoes by adding it back).
  Symmetric schemes have the zero point 8 (GPTQ's `(maxq + 1) / 2`). One variant is 8-bit
  (4 codes per word) in the `gptq_v2` format (zero points stored as they are). Act-order permutes the
  channels: group `j` holds channels `perm[j*G:(j+1)*G]`, so `g_idx[c] = invperm[c] // G`.
- AWQ: AutoAWQ's `WQLinear_GEMM.from_linear` (autoawq 0.2.9, `modules/linear/gemm.py`):
  `qweight [in, out/8]` int32 with the 8 codes of a word taken in the order
  (0, 2, 4, 6, 1, 3, 5, 7), `qzeros [groups, out/8]` packed the same way, f16
  `scales [groups, out]`; zero points from AutoAWQ's `pseudo_quantize_tensor`.

The packing is checked against the references' own unpacking: AutoAWQ's
`awq/utils/packing_utils.dequantize_gemm`, and GPTQModel's `TorchLinear.dequantize_weight`
after its v1 -> v2 conversion (both imported from their source distributions, given by
`--autoawq` and `--gptqmodel`; the script fails if they disagree with the values below).

reference.json holds, per variant and per quantised tensor, the SHA-256 of its dequantised
values `scale * (q - zero)` as f32 little-endian (the products are exact in f32) and as
f16 (the references' own f16 arithmetic), and transformers' logits and greedy ids for a
float32 model holding the f16 dequantised weights (what GPTQModel's torch kernel and
AutoAWQ's `dequantize_gemm` multiply by).
"""

import argparse
import hashlib
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "gptq-awq"
VOCAB = 256
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
    torch_dtype="float16",
)
PROJECTIONS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]
# name: (method, group size, symmetric, act-order, short scales, seed). Short scales have
# 7 significant bits, so that every minimum -scale*zero (at most 11 bits) is an f16 number,
# as int4's f16 minimum needs (real quantisers give 11-bit scales); flm loads both kinds of
# asymmetric scheme as int4-zp, whose zero points hold any minimum exactly.
VARIANTS = {
    "gptq-sym-g128": ("gptq", 128, True, False, False, 4101),
    "gptq-sym-g32-actorder": ("gptq", 32, True, True, False, 4102),
    "gptq-asym-g32": ("gptq", 32, False, False, False, 4103),
    "gptq-asym-g128-actorder": ("gptq", 128, False, True, False, 4104),
    "gptq-asym-g32-short-scales": ("gptq", 32, False, False, True, 4107),
    "gptq-8bit-asym-g32-v2": ("gptq", 32, False, False, False, 4108),
    "awq-g32": ("awq", 32, False, False, False, 4105),
    "awq-g128-short-scales": ("awq", 128, False, False, True, 4106),
}
# Variants with other bits or GPTQ checkpoint formats than 4 and `gptq` (v1).
OPTIONS = {"gptq-8bit-asym-g32-v2": dict(bits=8, checkpoint_format="gptq_v2")}
SEQ_LEN = 16
NEW_TOKENS = 16
TOKEN_SEED = 4100
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def redraw(model, seed):
    """Weights with O(1) activations: N(0, 1/fan_in) matrices, 1 + N(0, 0.1) norm gains;
    a few groups of layer 0's q_proj all positive and all negative, so that zero points
    0 and 15 occur (the v1 format's borrow)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        q = model.model.layers[0].self_attn.q_proj.weight
        q[:3, :32] = q[:3, :32].abs()
        q[3:6, :32] = -q[3:6, :32].abs()


def rtn(w, channels, symmetric, maxq=15):
    """Scale and zero point of one group (`w[:, channels]`, per output row), GPTQ's
    `Quantizer.find_params` (symmetric: zero (maxq + 1) / 2), AutoAWQ's rule is the same
    min/max fit with the zero rounded and clamped."""
    x = w[:, channels]
    xmin = torch.minimum(x.min(1).values, torch.zeros(()))
    xmax = torch.maximum(x.max(1).values, torch.zeros(()))
    if symmetric:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    both_zero = (xmin == 0) & (xmax == 0)
    xmin[both_zero], xmax[both_zero] = -1, 1
    scale = (xmax - xmin) / maxq
    zero = torch.full_like(scale, (maxq + 1) / 2) if symmetric else torch.round(-xmin / scale)
    return scale, zero.clamp(0, maxq)


def awq_params(w, group, channels):
    """AutoAWQ's `pseudo_quantize_tensor` (zero_point=True): scales and zeros of a group."""
    x = w[:, channels]
    max_val, min_val = x.max(1).values, x.min(1).values
    scale = (max_val - min_val).clamp(min=1e-5) / 15
    zero = (-torch.round(min_val / scale)).clamp(0, 15)
    return scale, zero


def quantise(w, group, symmetric, act_order, short, method, g, maxq=15):
    """Scales [groups, out] (f16), zeros [groups, out] (int), g_idx [in] of `w` [out, in];
    `short`: scales rounded to 7 significant bits."""
    n_in = w.shape[1]
    perm = torch.randperm(n_in, generator=g) if act_order else torch.arange(n_in)
    invperm = torch.argsort(perm)
    scales, zeros = [], []
    for j in range(n_in // group):
        channels = perm[j * group : (j + 1) * group]
        s, z = awq_params(w, group, channels) if method == "awq" else rtn(w, channels, symmetric, maxq)
        if short:
            mantissa, exponent = torch.frexp(s)
            s = torch.ldexp(torch.round(mantissa * 128) / 128, exponent)
        scales.append(s)
        zeros.append(z)
    scales = torch.stack(scales).half()
    zeros = torch.stack(zeros).to(torch.int32)
    g_idx = (invperm // group).to(torch.int32)
    return scales, zeros, g_idx


def codes_of(w, scales, zeros, g_idx, maxq=15):
    """The codes `[in, out]` as both packers compute them: round((w + s*z) / s) with
    the f16 scales, clamped to [0, maxq]."""
    s = scales.float()[g_idx.long()]
    z = zeros.float()[g_idx.long()]
    return torch.clamp(torch.round((w.t() + s * z) / s), 0, maxq).to(torch.int64)


def pack_gptq(codes, zeros, bits=4, v1=True):
    """GPTQModel's pack_original, then (v1) the v2 -> v1 word subtraction."""
    per_word = 32 // bits
    codes = codes.numpy().astype(np.uint32)
    qweight = np.zeros((codes.shape[0] // per_word, codes.shape[1]), dtype=np.uint32)
    for row in range(qweight.shape[0]):
        for j in range(per_word):
            qweight[row] |= codes[row * per_word + j] << (bits * j)
    z = zeros.numpy().astype(np.uint32)
    qzeros = np.zeros((z.shape[0], z.shape[1] // per_word), dtype=np.uint32)
    for col in range(qzeros.shape[1]):
        for j in range(per_word):
            qzeros[:, col] |= z[:, col * per_word + j] << (bits * j)
    if v1:
        qzeros = (qzeros - np.uint32(0x11111111 if bits == 4 else 0x01010101)).astype(np.uint32)
    return torch.from_numpy(qweight.view(np.int32)), torch.from_numpy(qzeros.view(np.int32))


def pack_awq(codes, zeros):
    """AutoAWQ's WQLinear_GEMM.from_linear packing: codes [in, out], zeros [groups, out]."""
    def pack(x):
        x = x.numpy().astype(np.uint32)
        out = np.zeros((x.shape[0], x.shape[1] // 8), dtype=np.uint32)
        for col in range(out.shape[1]):
            for i in range(8):
                out[:, col] |= x[:, col * 8 + AWQ_ORDER[i]] << (4 * i)
        return torch.from_numpy(out.view(np.int32))

    return pack(codes), pack(zeros)


def dequantise(codes, scales, zeros, g_idx, dtype):
    """`scale * (q - zero)` `[out, in]` in `dtype` (f16: the references' own arithmetic)."""
    s = scales[g_idx.long()].to(dtype)
    z = zeros[g_idx.long()].to(dtype)
    return (s * (codes.to(dtype) - z)).t().contiguous()


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_awq(autoawq, qweight, qzeros, scales, group, want):
    """AutoAWQ's own unpacking must give the same f16 weights (its layout is [in, out])."""
    packing = load_module(Path(autoawq) / "awq/utils/packing_utils.py", "awq_packing")
    got = packing.dequantize_gemm(qweight, qzeros, scales, 4, group)
    assert torch.equal(got.t().contiguous().view(torch.int16), want.view(torch.int16)), "AutoAWQ"


def check_gptq(gptqmodel, qweight, qzeros, scales, g_idx, group, symmetric, want, bits=4, v1=True):
    """GPTQModel's own unpacking (TorchLinear after its v1 -> v2 conversion) must give
    the same f16 weights."""
    sys.path.insert(0, str(gptqmodel))
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    n_in, n_out = g_idx.shape[0], scales.shape[1]
    layer = TorchLinear(
        bits=bits, group_size=group, sym=symmetric, desc_act=False, in_features=n_in,
        out_features=n_out, bias=False, pack_dtype=torch.int32, register_buffers=True,
    )
    layer.qweight.copy_(qweight)
    layer.qzeros.copy_(qzeros)
    layer.scales.copy_(scales)
    layer.g_idx.copy_(g_idx)
    if v1:
        convert_gptq_v1_to_v2_format_module(layer, bits=bits, pack_dtype=torch.int32)
    layer.enable_wf_unsqueeze = True
    layer._init_wf_unsqueeze_buffers()
    got = layer.dequantize_weight().t().contiguous()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "GPTQModel"


def sha(t, dtype):
    return hashlib.sha256(t.to(dtype).contiguous().numpy().astype(
        "<f4" if dtype == torch.float32 else "<f2").tobytes()).hexdigest()


def make(name, method, group, symmetric, act_order, short, seed, args):
    torch.manual_seed(seed)
    config = LlamaConfig(**COMMON)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    redraw(model, seed)
    g = torch.Generator().manual_seed(seed)
    options = OPTIONS.get(name, {})
    bits = options.get("bits", 4)
    checkpoint_format = options.get("checkpoint_format", "gptq")
    v1 = checkpoint_format == "gptq"
    maxq = 2**bits - 1
    state = {k: v.half() for k, v in model.state_dict().items()}
    tensors = {}
    hashes = {}
    with torch.no_grad():
        for l, layer in enumerate(model.model.layers):
            for proj in PROJECTIONS:
                prefix = f"model.layers.{l}.{proj}"
                linear = layer.get_submodule(proj)
                w = linear.weight.data.float()
                scales, zeros, g_idx = quantise(w, group, symmetric, act_order, short, method, g, maxq)
                codes = codes_of(w, scales, zeros, g_idx, maxq)
                f16 = dequantise(codes, scales, zeros, g_idx, torch.float16)
                f32 = dequantise(codes, scales, zeros, g_idx, torch.float32)
                if method == "awq":
                    qweight, qzeros = pack_awq(codes, zeros)
                    check_awq(args.autoawq, qweight, qzeros, scales, group, f16)
                    tensors.update({f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros})
                else:
                    qweight, qzeros = pack_gptq(codes, zeros, bits, v1)
                    check_gptq(args.gptqmodel, qweight, qzeros, scales, g_idx, group, symmetric, f16,
                               bits, v1)
                    tensors.update({f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros,
                                    f"{prefix}.g_idx": g_idx})
                tensors[f"{prefix}.scales"] = scales
                del state[f"{prefix}.weight"]
                hashes[f"{prefix}.weight"] = dict(f32=sha(f32, torch.float32), f16=sha(f16, torch.float16))
                linear.weight.copy_(f16.float())
        # The unquantised tensors as saved (f16), in the reference model too.
        for k, v in state.items():
            tensors[k] = v
            model.get_parameter(k).copy_(v.float())
    out_dir = OUT / name
    out_dir.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    cfg = config.to_dict()
    for k in ("_attn_implementation_autoset", "transformers_version"):
        cfg.pop(k, None)
    if method == "gptq":
        cfg["quantization_config"] = dict(
            quant_method="gptq", bits=bits, group_size=group, desc_act=act_order, sym=symmetric,
            checkpoint_format=checkpoint_format, damp_percent=0.01, true_sequential=True,
        )
    else:
        cfg["quantization_config"] = dict(
            quant_method="awq", bits=4, group_size=group, zero_point=True, version="gemm",
            modules_to_not_convert=None,
        )
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return model, hashes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gptqmodel", required=True, help="gptqmodel 7.7.0 source folder")
    parser.add_argument("--autoawq", required=True, help="autoawq 0.2.9 source folder")
    args = parser.parse_args()
    input_ids = torch.randint(3, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(TOKEN_SEED))
    reference = dict(
        generator="tools/quant/make_gptq_awq.py",
        transformers=transformers.__version__,
        torch=torch.__version__,
        input_ids=input_ids.tolist(),
        logits_file="logits_f32le.bin",
        variants={},
    )
    for name, (method, group, symmetric, act_order, short, seed) in VARIANTS.items():
        model, hashes = make(name, method, group, symmetric, act_order, short, seed, args)
        with torch.no_grad():
            logits = model(input_ids[None]).logits[0].float()
            (OUT / name / "logits_f32le.bin").write_bytes(logits.numpy().astype("<f4").tobytes())
            ids = input_ids[None]
            margins = []
            for _ in range(NEW_TOKENS):
                last = model(ids).logits[0, -1].float()
                top = torch.topk(last, 2).values
                margins.append(float(top[0] - top[1]))
                ids = torch.cat([ids, last.argmax().view(1, 1)], dim=1)
        reference["variants"][name] = dict(
            method=method, group_size=group, sym=symmetric, desc_act=act_order,
            short_scales=short, seed=seed,
            greedy_ids=ids[0, SEQ_LEN:].tolist(),
            min_greedy_margin=min(margins),
            dequantised_sha256=hashes,
        )
        print(name, "min top-2 margin", min(margins))
    (OUT / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main()
