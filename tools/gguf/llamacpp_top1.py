#!/usr/bin/env python3
"""llama.cpp against transformers on SmolLM2-135M-Instruct Q4_1, the figures of
docs/benchmarks.md ("A real GGUF"): teacher-forced top-1 agreement over the reference
text of tests/data/smollm2/smollm2_reference.json, and how many of its chat prompts give
transformers' 8 greedy tokens.

Usage: python3 tools/gguf/llamacpp_top1.py LLAMACPP_TOP1_BINARY MODEL.gguf [THREADS]
(the binary is tools/gguf/llamacpp_top1.cpp, built as its header says).
"""

import json
import pathlib
import subprocess
import sys


def run(binary, model, mode, ids, threads):
    out = subprocess.run(
        [binary, model, mode, str(threads)],
        input=" ".join(map(str, ids)),
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(t) for t in out.stdout.split()]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    root = pathlib.Path(__file__).resolve().parents[2]
    ref = json.loads((root / "tests/data/smollm2/smollm2_reference.json").read_text())
    text = ref["text"]
    got = run(binary, model, "tf", text["ids"], threads)
    agree = sum(a == b for a, b in zip(got, text["argmax"]))
    print(f"top-1 agreement {agree}/{len(got)} = {100 * agree / len(got):.2f}%")
    equal = 0
    for case in ref["greedy"]:
        out = run(binary, model, "greedy", case["prompt_ids"], threads)
        same = 0
        while same < len(out) and out[same] == case["output_ids"][same]:
            same += 1
        print(f"{case['question']!r}: {same}/8 greedy tokens equal")
        equal += same == len(case["output_ids"])
    print(f"{equal} of {len(ref['greedy'])} prompts give transformers' 8 greedy tokens")


if __name__ == "__main__":
    main()
