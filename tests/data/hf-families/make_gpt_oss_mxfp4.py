"""make_gpt_oss.py's tiny gpt-oss with its experts in MXFP4, stored as the released
gpt-oss checkpoints store them, and the logits of transformers' own `GptOssForCausalLM`
loading that directory, for flm's tests/gpt_oss_mxfp4.rs (issue 51).

Run from this folder, after make_gpt_oss.py: `python make_gpt_oss_mxfp4.py`. Writes
`gpt_oss_mxfp4/`:
- `config.json`: gpt_oss's, plus `quantization_config` {"quant_method": "mxfp4",
  "modules_to_not_convert": [...]} as openai/gpt-oss-20b's;
- `model.safetensors`: gpt_oss's tensors (the same weights: make_gpt_oss.py's model,
  seeds and all), but each layer's `mlp.experts.gate_up_proj` and `down_proj` replaced by
  (E = 8 experts, H = 64 hidden, I = 32 expert width; for a matrix of `out` rows of `in`
  values, as `nn.Linear` orders them):
      mlp.experts.gate_up_proj_blocks  [8, 64, 2, 16] uint8  (E, out = 2I, in / 32, 16)
      mlp.experts.gate_up_proj_scales  [8, 64, 2]     uint8  (E, out = 2I, in / 32)
      mlp.experts.down_proj_blocks     [8, 64, 1, 16] uint8  (E, out = H, in / 32, 16)
      mlp.experts.down_proj_scales     [8, 64, 1]     uint8  (E, out = H, in / 32)
  Row r of gate_up (its `out` axis) is column r of transformers' `gate_up_proj` [E, H, 2I]:
  even rows gate, odd rows up. Each block of 32 consecutive input values has one scale
  byte `s` (E8M0, bias 127) and 16 bytes of E2M1 codes, byte i holding value 2i in its low
  nibble and value 2i + 1 in its high one; value = FP4_VALUES[code] * 2^(s - 127)
  (transformers' `integrations/mxfp4.py`, `_convert_moe_packed_tensors`).
- `logits_f32le.bin`: the logits `[24, 256]` of one prefill of reference.json's input ids
  by transformers loading this directory with `Mxfp4Config(dequantize=True)` (its CPU
  path: the experts dequantised by `convert_moe_packed_tensors` into f32 `GptOssExperts`),
  eager attention and experts, f32.
- `dequantized_experts.safetensors`: the experts as that model holds them after loading,
  under transformers' names (`model.layers.L.mlp.experts.gate_up_proj` [8, 64, 64],
  `down_proj` [8, 32, 64]), in bf16: every value is an E2M1 value times a power of two, so
  bf16 holds it exactly (checked here), at half the bytes of f32.
and the `gpt_oss_mxfp4` entry of reference.json: versions, how far these logits are from
gpt_oss's unquantised ones (`max_diff_from_unquantised`: the test has teeth), and
`greedy_ids` / `greedy_min_margin` as make_gpt_oss.py defines them.

The quantisation: each expert matrix in (out, in) order is cut into blocks of 32 input
values and quantised by gguf-py's `MXFP4.quantize_blocks` (ggml's `quantize_row_mxfp4_ref`:
e = floor(log2(max|x|)) - 2 + 127, each value the nearest of the 16 levels), giving ggml's
`block_mxfp4` (byte 0 e, then byte i holding value i low and value i + 16 high). The
E2M1 codes and the exponent byte are the same in both formats (ggml's levels are the E2M1
values doubled, its scale 2^(e - 128)), so the HF form is the same codes with the nibbles
reordered. The script checks that transformers' dequantised experts equal gguf-py's
`MXFP4.dequantize_blocks` of the ggml blocks exactly.
"""

import importlib.metadata
import json
import math

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from gguf.quants import MXFP4
from transformers import GptOssForCausalLM, Mxfp4Config

from make_gpt_oss import GREEDY_TOKENS, SEED, build, logits_of, redraw_gpt_oss
from make_tiny import HERE, SEQ_LEN, TOKEN_SEED, VOCAB

FAMILY = "gpt_oss_mxfp4"
BLOCK = 32
# As openai/gpt-oss-20b's config.json.
QUANTIZATION_CONFIG = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}


def ggml_blocks(w):
    """gguf-py's MXFP4 blocks of `w` [..., out, in]: uint8 [..., out, in / 32, 17]."""
    *outer, cols = w.shape
    rows = w.reshape(-1, BLOCK).numpy().astype(np.float32)
    return MXFP4.quantize_blocks(rows).reshape(*outer, cols // BLOCK, 17)


def hf_blocks_and_scales(blocks):
    """ggml blocks [..., 17] as transformers' `_blocks` [..., 16] and `_scales` [...]."""
    scales = blocks[..., 0]
    qs = blocks[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # value j at index j, 0..32
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.astype(np.uint8), scales.astype(np.uint8)


def ggml_dequantized(blocks):
    """gguf-py's decoding of ggml blocks [..., n, 17]: f32 [..., n * 32]."""
    *outer, n, _ = blocks.shape
    values = MXFP4.dequantize_blocks(blocks.reshape(-1, 17))
    return torch.from_numpy(values.reshape(*outer, n * BLOCK))


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
    unquantised = logits_of(model, input_ids)
    stored = np.frombuffer((HERE / "gpt_oss" / "logits_f32le.bin").read_bytes(), "<f4")
    assert np.array_equal(unquantised.numpy().reshape(-1), stored), "make_gpt_oss.py's model"

    out_dir = HERE / FAMILY
    out_dir.mkdir(exist_ok=True)
    model.config.save_pretrained(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    config["architectures"] = [GptOssForCausalLM.__name__]
    config["quantization_config"] = QUANTIZATION_CONFIG
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    tensors = {}
    expected = {}
    for name, p in model.state_dict().items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = p.detach().clone().contiguous()
            continue
        # transformers' [E, in, out] (x @ W) as [E, out, in].
        blocks = ggml_blocks(p.detach().transpose(1, 2).contiguous())
        packed, scales = hf_blocks_and_scales(blocks)
        tensors[name + "_blocks"] = torch.from_numpy(packed)
        tensors[name + "_scales"] = torch.from_numpy(scales)
        expected[name] = ggml_dequantized(blocks).transpose(1, 2).contiguous()
    safetensors.torch.save_file(
        dict(sorted(tensors.items())), out_dir / "model.safetensors", metadata={"format": "pt"}
    )

    loaded = GptOssForCausalLM.from_pretrained(
        out_dir,
        quantization_config=Mxfp4Config(dequantize=True),
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
    ).eval()
    assert loaded.config._experts_implementation == "eager", loaded.config._experts_implementation
    state = loaded.state_dict()
    dequantized = {}
    for name, want in expected.items():
        got = state[name]
        assert got.dtype == torch.float32 and torch.equal(got, want), name
        as_bf16 = got.to(torch.bfloat16)
        assert torch.equal(as_bf16.float(), got), f"{name} is not exact in bf16"
        dequantized[name] = as_bf16.contiguous()
    for name, t in tensors.items():
        if name in state:
            assert torch.equal(state[name], t), name
    safetensors.torch.save_file(
        dict(sorted(dequantized.items())),
        out_dir / "dequantized_experts.safetensors",
        metadata={"format": "pt"},
    )

    logits = logits_of(loaded, input_ids)
    (out_dir / "logits_f32le.bin").write_bytes(logits.numpy().astype("<f4").tobytes())

    ids = list(input_ids)
    margin = math.inf
    for _ in range(GREEDY_TOKENS):
        top = logits_of(loaded, ids)[-1].topk(2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))

    print("tensors saved:")
    with safetensors.safe_open(out_dir / "model.safetensors", "pt") as f:
        for name in sorted(f.keys()):
            if "experts" in name or name.startswith("model.layers.0."):
                t = f.get_tensor(name)
                print(f"  {name} {list(t.shape)} {t.dtype}")

    described["families"][FAMILY] = dict(
        transformers=transformers.__version__,
        torch=torch.__version__,
        safetensors=safetensors.__version__,
        gguf_py=importlib.metadata.version("gguf"),
        generator="make_gpt_oss_mxfp4.py",
        model_class=GptOssForCausalLM.__name__,
        weight_seed=SEED,
        logits_shape=list(logits.shape),
        max_abs_logit=float(logits.abs().max()),
        max_diff_from_unquantised=float((logits - unquantised).abs().max()),
        greedy_ids=ids[SEQ_LEN:],
        greedy_min_margin=margin,
    )
    reference.write_text(json.dumps(described, indent=1) + "\n")
    print(json.dumps(described["families"][FAMILY], indent=1))


if __name__ == "__main__":
    main()
