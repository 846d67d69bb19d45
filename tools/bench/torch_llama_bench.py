#!/usr/bin/env python3
"""Baseline for `flm bench --device cuda`: Hugging Face transformers' LlamaForCausalLM in
f16 on the GPU, with random weights at the shapes of a config.json, a static KV cache and
(optionally) torch.compile, measured the way flm bench measures:

- prefill: one forward pass over --prompt-tokens tokens, tokens/s;
- decode: --gen-tokens single-token steps after the prompt, tokens/s, greedy on the device;
- bytes per decoded token: the parameters' bytes (every weight read once per step; the
  embedding table counts one row) and the bandwidth utilisation against the GPU's peak,
  given by --peak-gb-s (`flm bench --device cuda --json` prints it as stream_gb_s).

Mean ± standard deviation over --reps runs after one warm-up, one JSON object per line.

Usage (on the GPU machine; needs torch with CUDA and transformers >= 4.45):
    python3 tools/bench/torch_llama_bench.py --config ../shared/configs/llama-2-7b.json \
        --prompt-tokens 512 2048 --gen-tokens 128 --compile
"""

import argparse
import json
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a Hugging Face config.json")
    p.add_argument("--prompt-tokens", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    p.add_argument("--peak-gb-s", type=float, default=None, help="the GPU's peak bandwidth")
    args = p.parse_args()

    with open(args.config) as f:
        config = LlamaConfig(**json.load(f))
    config.torch_dtype = torch.float16
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.float16).eval()
    params = sum(t.numel() * t.element_size() for t in model.parameters())
    row = config.hidden_size * 2
    bytes_per_token = params - model.model.embed_tokens.weight.numel() * 2 + row
    max_len = max(args.prompt_tokens) + args.gen_tokens
    cache = StaticCache(config=config, max_batch_size=1, max_cache_len=max_len,
                        device="cuda", dtype=torch.float16)

    def step(ids, positions):
        out = model(input_ids=ids, past_key_values=cache, cache_position=positions,
                    use_cache=True, return_dict=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    # Positions go in as tensors, so the compiled (CUDA-graph) step is not specialised on
    # each position's value.
    decode_step = step
    if args.compile:
        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)

        def decode_step(ids, positions):
            # Each call replays the CUDA graph into the same output buffer: mark a new step
            # and clone the token, or the next replay overwrites the one it reads.
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(ids, positions).clone()

    g = torch.Generator(device="cuda").manual_seed(1)
    for n in args.prompt_tokens:
        prompt = torch.randint(0, config.vocab_size, (1, n), device="cuda", generator=g)

        @torch.inference_mode()
        def once():
            cache.reset()
            nxt, prefill = timed(lambda: step(prompt, torch.arange(n, device="cuda")))

            def loop():
                t = nxt
                for i in range(args.gen_tokens):
                    t = decode_step(t, torch.tensor([n + i], device="cuda"))
                return t

            _, decode = timed(loop)
            return n / prefill, args.gen_tokens / decode

        once()
        runs = [once() for _ in range(args.reps)]
        pp = [r[0] for r in runs]
        tg = [r[1] for r in runs]
        tg_mean = statistics.mean(tg)
        gb_s = bytes_per_token * tg_mean / 1e9
        print(json.dumps({
            "impl": "transformers" + (" + torch.compile" if args.compile else ""),
            "config": args.config,
            "dtype": "f16",
            "gpu": torch.cuda.get_device_name(),
            "prompt_tokens": n,
            "gen_tokens": args.gen_tokens,
            "reps": args.reps,
            "prefill_tok_s": statistics.mean(pp),
            "prefill_tok_s_sd": statistics.stdev(pp) if len(pp) > 1 else 0.0,
            "decode_tok_s": tg_mean,
            "decode_tok_s_sd": statistics.stdev(tg) if len(tg) > 1 else 0.0,
            "weight_bytes_per_token": bytes_per_token,
            "decode_gb_s": gb_s,
            "bandwidth_fraction": gb_s / args.peak_gb_s if args.peak_gb_s else None,
        }), flush=True)


if __name__ == "__main__":
    main()
