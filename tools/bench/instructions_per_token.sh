#!/usr/bin/env bash
# Instructions per decoded token, counted by valgrind's callgrind, for flm bench and
# llama.cpp's llama-bench on one GGUF, one thread: a figure that does not depend on how
# much of the core the neighbours leave (docs/benchmarks.md, "Instructions per decoded
# token").
#
# Only the instructions inside one forward step are counted (`--toggle-collect` on
# flm's `Llama::forward` and llama.cpp's step function, LLAMA_STEP), divided by the steps,
# each of one token: flm runs a warm-up and one measured run, each a one-token prefill and
# N decode steps (2·(1 + N) steps); llama-bench a one-token warm-up and N steps (1 + N).
# Valgrind (3.19) runs no AVX-512 or AVX-VNNI code, so flm runs its AVX2 kernels there,
# and llama.cpp needs an AVX2 build of its CPU backend (LLAMA_LIB, see below).
#
# Settings, by environment variable:
#   GGUF         llama.cpp's model          (default /tmp/gguf-bench/tinyllama-q4_0.gguf)
#   FLM_MODEL    flm's: the GGUF converted to .flm, made if absent (default: GGUF with
#                .flm for .gguf); the same weights (Q4_0 repacks into int4-sym bit for bit),
#                and mapped without a repack, which would take minutes under valgrind
#   FLM          flm binary                 (default target/release/flm)
#   LLAMA_BENCH  llama-bench binary         (default /tmp/llama.cpp/build/bin/llama-bench)
#   LLAMA_LIB    folder put first on LD_LIBRARY_PATH for llama-bench: an AVX2-only build's
#                libggml-cpu.so (default /tmp/llama.cpp/build-avx2/bin)
#   LLAMA_STEP   llama.cpp's function of one step: `llama_process` (default; what
#                llama-bench calls in the llama.cpp of llama-cpp-python 0.3.36) or
#                `llama_decode` (older llama.cpp)
#   N            decode steps per run       (default 2)
#   OUT          folder of the callgrind files (default /tmp/callgrind)
# Prints one line per program: instructions per step and the top functions by their own
# instructions per step.
set -euo pipefail

GGUF=${GGUF:-/tmp/gguf-bench/tinyllama-q4_0.gguf}
FLM=${FLM:-target/release/flm}
LLAMA_BENCH=${LLAMA_BENCH:-/tmp/llama.cpp/build/bin/llama-bench}
LLAMA_LIB=${LLAMA_LIB:-/tmp/llama.cpp/build-avx2/bin}
FLM_MODEL=${FLM_MODEL:-${GGUF%.gguf}.flm}
LLAMA_STEP=${LLAMA_STEP:-llama_process}
N=${N:-2}
OUT=${OUT:-/tmp/callgrind}
mkdir -p "$OUT"

count() { # name steps callgrind-file
    callgrind_annotate --threshold=100 --auto=no "$3" | python3 -c '
import collections, re, sys
name, steps = sys.argv[1], int(sys.argv[2])
lines = sys.stdin.read().splitlines()
total = next(int(l.split()[0].replace(",", "")) for l in lines if "PROGRAM TOTALS" in l)
print(f"{name}: {total / steps / 1e6:.1f} M instructions per step ({total:,} over {steps} steps)")
# Lines are "Ir (share) file:function [object]"; the debug lines split a function by the
# files its inlined code came from, so sum them by function.
own = collections.Counter()
for l in lines:
    m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+[^:]*:(.*?)(?: \[[^]]*\])?$", l)
    if m:
        own[m.group(2)] += int(m.group(1).replace(",", ""))
for fn, ir in own.most_common(12):
    print(f"  {ir / steps / 1e6:8.2f} M {100 * ir / total:5.1f}%  {fn[:110]}")
' "$1" "$2"
}

[[ -e $FLM_MODEL ]] || "$FLM" convert --input "$GGUF" --output "$FLM_MODEL"
valgrind --tool=callgrind --callgrind-out-file="$OUT/flm.out" \
    --toggle-collect='flm_models::llama::Llama::forward' \
    "$FLM" bench --model "$FLM_MODEL" --threads 1 --prompt-tokens 1 --gen-tokens "$N" --reps 1 \
    --stream-mib 1 >"$OUT/flm.log" 2>&1
LD_LIBRARY_PATH="$LLAMA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    valgrind --tool=callgrind --callgrind-out-file="$OUT/llama.out" \
    --toggle-collect="$LLAMA_STEP" \
    "$LLAMA_BENCH" -m "$GGUF" -p 0 -n "$N" -r 1 -t 1 >"$OUT/llama.log" 2>&1

count flm $((2 * (1 + N))) "$OUT/flm.out"
count llama.cpp $((1 + N)) "$OUT/llama.out"
