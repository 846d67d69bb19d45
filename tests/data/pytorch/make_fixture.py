"""Writes the PyTorch `torch.save` fixtures of flm's pytorch importer tests.

Run from the repository root with torch, safetensors and numpy installed:

    python tests/data/pytorch/make_fixture.py

Outputs (all under tests/data/pytorch/):

- stories260K/pytorch_model.bin: the state dict of tests/data/hf-stories260K/model.safetensors
  as an OrderedDict with `_metadata` (what `model.state_dict()` gives), some entries
  wrapped in nn.Parameter, lm_head.weight sharing the embedding's storage (tied).
- stories260K-sharded/: the same tensors in two .bin shards plus
  pytorch_model.bin.index.json, as transformers' `save_pretrained` shards them.
- malicious/pytorch_model.bin: a checkpoint whose pickle calls os.system("echo pwned").
- bogus-global/pytorch_model.bin: a checkpoint whose pickle names evil_module.payload.
- tensors.bin: small tensors of several dtypes and layouts for the unit tests;
  noncontiguous.bin and int64.bin: one tensor each that the importer refuses;
  compressed.bin: tensors.bin with deflated entries, also refused.

Each directory also gets a copy of config.json, the two stories260K ones tokenizer.model.
"""

import collections
import json
import os
import shutil
import sys
import types
import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent
HF = ROOT.parent / "hf-stories260K"


def model_dir(name, files=("config.json", "tokenizer.model")):
    out = ROOT / name
    out.mkdir(exist_ok=True)
    for f in files:
        shutil.copyfile(HF / f, out / f)
    return out


def state_dict():
    weights = load_file(HF / "model.safetensors")
    sd = collections.OrderedDict()
    for i, (name, t) in enumerate(sorted(weights.items())):
        # Every third tensor as an nn.Parameter: pickled through _rebuild_parameter.
        sd[name] = torch.nn.Parameter(t, requires_grad=False) if i % 3 == 0 else t
    # Tied classifier: the same tensor under a second name (one storage in the file).
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    sd._metadata = collections.OrderedDict({"": {"version": 1}})
    return sd


def write_single():
    torch.save(state_dict(), model_dir("stories260K") / "pytorch_model.bin")


def write_sharded():
    out = model_dir("stories260K-sharded")
    sd = state_dict()
    names = list(sd)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin"
        part = collections.OrderedDict((n, sd[n]) for n in shard)
        torch.save(part, out / file)
        for n in shard:
            weight_map[n] = file
            total += sd[n].numel() * sd[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2) + "\n")


class Evil:
    """Unpickling this calls os.system (pickled as the global posix.system)."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def write_malicious():
    sd = {"model.embed_tokens.weight": Evil()}
    torch.save(sd, model_dir("malicious", ["config.json"]) / "pytorch_model.bin")


def write_bogus_global():
    module = types.ModuleType("evil_module")

    def payload(*args):
        return args

    payload.__module__ = "evil_module"
    payload.__qualname__ = "payload"
    module.payload = payload
    sys.modules["evil_module"] = module

    class Bogus:
        def __reduce__(self):
            return (payload, (1,))

    sd = {"model.embed_tokens.weight": Bogus()}
    torch.save(sd, model_dir("bogus-global", ["config.json"]) / "pytorch_model.bin")


def write_tensors():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 4
    tensors = collections.OrderedDict()
    tensors["f32"] = base
    tensors["f16"] = base.to(torch.float16)
    tensors["bf16"] = base.to(torch.bfloat16)
    tensors["param"] = torch.nn.Parameter(base[:2].clone(), requires_grad=True)
    tensors["offset_view"] = base[1:3]  # storage_offset 6 into f32's storage
    tensors["shared"] = base  # the same tensor again (a memo reference)
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.zeros(0, 3)
    torch.save(tensors, ROOT / "tensors.bin")
    # Each refused: strides (1, 6) are not row-major; int64 is not a flm dtype.
    torch.save({"transposed": base.t()}, ROOT / "noncontiguous.bin")
    torch.save({"int64": torch.arange(3)}, ROOT / "int64.bin")
    # The same archive as tensors.bin with deflated entries (torch.save never compresses).
    with zipfile.ZipFile(ROOT / "tensors.bin") as src:
        with zipfile.ZipFile(ROOT / "compressed.bin", "w", zipfile.ZIP_DEFLATED) as dst:
            for name in src.namelist():
                dst.writestr(name, src.read(name))


if __name__ == "__main__":
    torch.manual_seed(0)
    write_single()
    write_sharded()
    write_malicious()
    write_bogus_global()
    write_tensors()
    print(f"torch {torch.__version__}")
