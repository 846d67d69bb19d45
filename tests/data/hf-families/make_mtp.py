"""Multi-token-prediction layers for the tiny DeepSeek-V3 and GLM-4.5 checkpoints of
make_mla.py, and their logits, for flm's tests/mtp.rs.

transformers 5.25 neither builds nor saves these layers (`num_nextn_predict_layers`), so
this script adds one as DeepSeek-V3's checkpoints hold it, under
`model.layers.{num_hidden_layers}.` (vLLM's `DeepSeekMultiTokenPredictorLayer`,
DeepSeek-V3 Technical Report §2.2): `enorm`, `hnorm`, `eh_proj`, `shared_head.norm` and a
decoder layer of the model's own class (built by transformers as layer
`num_hidden_layers` of a model one layer deeper and saved by its `save_pretrained`, so the
tensor names are transformers'). It computes, with that layer and torch alone, what the
layer drafts:
- row i (positions 0..SEQ_LEN-2): `x_i = eh_proj [enorm(E t_{i+1}); hnorm(h_i)]`, with
  `h_i` the model's `last_hidden_state` (after its final norm), through the decoder layer
  with causal attention over the rows at positions 0..i, then `lm_head(shared_head.norm)`:
  logits drafting `t_{i+2}`;
- one chained row at position SEQ_LEN-1, as vLLM drafts a second token: the token is the
  argmax of the last row's logits and the hidden state the decoder layer's output of that
  row (before any norm).

The layer's weights are drawn as make_tiny.py draws them, then trained (`train`, Adam, a
few hundred steps) to predict the token after next of the model's own greedy
continuations, as a real prediction layer is trained on text, so that speculative decoding
with it accepts drafts (on the continuations of the prompts it was trained on; it has seen
too little to predict others well), and its head norm's gain scaled for O(1) logits.

Run from this folder after make_mla.py: `python make_mtp.py`. Writes `<family>/config.json`
(`num_nextn_predict_layers` 1), adds the layer's tensors to `<family>/model.safetensors`,
writes `<family>/mtp_logits_f32le.bin` (`[SEQ_LEN, 256]` f32: the SEQ_LEN-1 rows, then the
chained one) and the family's `mtp` entry in `reference.json`.
"""

import json
import tempfile

import safetensors
import safetensors.torch
import torch
from torch import nn

from make_mla import FAMILIES, build
from make_tiny import HERE, SEQ_LEN, VOCAB

MTP_SEED = {"deepseek_v3": 2012, "glm4_moe": 2014}
# The training of `train`: greedy continuations of random 8-token prompts.
TRAIN_SEQUENCES, TRAIN_LEN, TRAIN_STEPS = 64, 48, 400


def decoder_out(layer, x, positions, rotary):
    """The decoder layer over the rows of `x` `[1, T, H]` at `positions`, causal."""
    t = x.shape[1]
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    out = layer(
        x,
        attention_mask=mask,
        position_ids=positions,
        position_embeddings=rotary(x, positions),
    )
    return out[0] if isinstance(out, tuple) else out


def mtp_logits(main_model, parts, layer, ids, hidden):
    """The layer's logits for rows `0..T-2` of `ids` `[B, T]` with the model's `hidden`."""
    embed = main_model.model.embed_tokens
    x = parts["eh_proj"](
        torch.cat([parts["enorm"](embed(ids[:, 1:])), parts["hnorm"](hidden[:, :-1])], -1)
    )
    positions = torch.arange(ids.shape[1] - 1)[None]
    out = decoder_out(layer, x, positions, main_model.model.rotary_emb)
    return main_model.lm_head(parts["head_norm"](out)), out


def train(main_model, parts, layer, seed):
    """Trains the layer, as DeepSeek-V3's is trained, to predict the token after next of
    the model's own greedy continuations of random prompts (end-of-sequence held off to
    keep them long), so that its drafts are
    accepted as a trained one's are (and speculative decoding's accepting paths run)."""
    g = torch.Generator().manual_seed(seed + 1)
    prompts = torch.randint(3, VOCAB, (TRAIN_SEQUENCES, 8), generator=g)
    with torch.no_grad():
        ids = main_model.generate(
            prompts, max_new_tokens=TRAIN_LEN - 8, do_sample=False, min_new_tokens=TRAIN_LEN - 8
        )
        hidden = main_model.model(ids).last_hidden_state
    params = list(parts.parameters()) + list(layer.parameters())
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(TRAIN_STEPS):
        logits, _ = mtp_logits(main_model, parts, layer, ids, hidden)
        loss = nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 2:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    # O(1) logits, as make_tiny.py's: the head norm's gain scales them, the argmax stays.
    with torch.no_grad():
        logits, _ = mtp_logits(main_model, parts, layer, ids, hidden)
        parts["head_norm"].weight.mul_(4.0 / logits.abs().max())
    return loss.item(), prompts[0].tolist()


def main():
    described = json.loads((HERE / "reference.json").read_text())
    input_ids = described["input_ids"]
    for family, seed in MTP_SEED.items():
        config_cls, model_cls, extra, _ = FAMILIES[family]
        out_dir = HERE / family
        main_model = model_cls.from_pretrained(
            out_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        n = main_model.config.num_hidden_layers
        hidden_size, eps = main_model.config.hidden_size, main_model.config.rms_norm_eps
        deeper = build(config_cls, model_cls, dict(extra, num_hidden_layers=n + 1))
        g = torch.Generator().manual_seed(seed)
        norm_cls = type(main_model.model.norm)
        parts = nn.ModuleDict(
            dict(
                enorm=norm_cls(hidden_size, eps=eps),
                hnorm=norm_cls(hidden_size, eps=eps),
                eh_proj=nn.Linear(2 * hidden_size, hidden_size, bias=False),
                head_norm=norm_cls(hidden_size, eps=eps),
            )
        )
        layer = deeper.model.layers[n]
        with torch.no_grad():
            # make_tiny.py's scales: N(0, 1/fan_in) matrices, 1 + N(0, 0.1) gains.
            for name, p in list(parts.named_parameters()) + list(layer.named_parameters()):
                if name.endswith("norm.weight") or name in ("enorm.weight", "hnorm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                elif name.endswith(".bias"):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            for name, b in layer.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.copy_(0.3 * torch.randn(b.shape, generator=g))
        loss, seen_prompt = train(main_model, parts, layer, seed)
        deeper.eval()
        ids = torch.tensor([input_ids])
        positions = torch.arange(SEQ_LEN - 1)[None]
        rotary = main_model.model.rotary_emb
        with torch.no_grad():
            h = main_model.model(ids).last_hidden_state
            embed = main_model.model.embed_tokens
            x = parts["eh_proj"](
                torch.cat([parts["enorm"](embed(ids[:, 1:])), parts["hnorm"](h[:, :-1])], -1)
            )
            logits, out = mtp_logits(main_model, parts, layer, ids, h)
            logits = logits[0]
            chain_token = int(logits[-1].argmax())
            chained = parts["eh_proj"](
                torch.cat(
                    [
                        parts["enorm"](embed(torch.tensor([[chain_token]]))),
                        parts["hnorm"](out[:, -1:]),
                    ],
                    -1,
                )
            )
            all_out = decoder_out(
                layer, torch.cat([x, chained], 1), torch.arange(SEQ_LEN)[None], rotary
            )
            chain_logits = main_model.lm_head(parts["head_norm"](all_out[:, -1:]))[0]
        rows = torch.cat([logits, chain_logits]).float()
        (out_dir / "mtp_logits_f32le.bin").write_bytes(rows.numpy().astype("<f4").tobytes())

        # The deeper model's own files name the layer's tensors as transformers saves them.
        with tempfile.TemporaryDirectory() as tmp:
            deeper.save_pretrained(tmp, safe_serialization=True)
            saved = safetensors.torch.load_file(f"{tmp}/model.safetensors")
        prefix = f"model.layers.{n}."
        tensors = safetensors.torch.load_file(out_dir / "model.safetensors")
        tensors = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
        tensors.update({k: v for k, v in saved.items() if k.startswith(prefix)})
        own = dict(
            enorm="enorm.weight",
            hnorm="hnorm.weight",
            eh_proj="eh_proj.weight",
            head_norm="shared_head.norm.weight",
        )
        for module, name in own.items():
            tensors[prefix + name] = parts[module].weight.detach().clone().contiguous()
        safetensors.torch.save_file(
            dict(sorted(tensors.items())), out_dir / "model.safetensors", metadata={"format": "pt"}
        )
        config = json.loads((out_dir / "config.json").read_text())
        config["num_nextn_predict_layers"] = 1
        (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        described["families"][family]["mtp"] = dict(
            generator="make_mtp.py",
            weight_seed=seed,
            layer=n,
            rows=SEQ_LEN - 1,
            chain_token=chain_token,
            train_loss=loss,
            # A prompt of the training set: drafts on its continuation are accepted.
            seen_prompt=seen_prompt,
            max_abs_logit=float(rows.abs().max()),
        )
    (HERE / "reference.json").write_text(json.dumps(described, indent=1) + "\n")


if __name__ == "__main__":
    main()
