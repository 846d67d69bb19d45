#!/usr/bin/env bash
# The CUDA graph checks, on a GPU machine, from the project root, after
# `../shared/gpu/prepare` put the release `flm` and the cuda_* test executables in .gpu/:
#   1. tests/cuda_graph.rs with its output (the decode rates it prints);
#   2. `flm bench` decode with every layer on the GPU, CUDA graph on and off: stories260K
#      (llama2.c's, f32) and Llama-2-7B shapes in f16 (random weights).
# Device tool: command `bash tools/bench/cuda_graph.sh`, carry [".gpu"], timeout_s ~300.
# Logs go to $OUT (default /tmp/gpu-out).
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
libs=$(ls -d /usr/local/cuda*/lib64 2>/dev/null | paste -sd:)
export LD_LIBRARY_PATH=$libs:${LD_LIBRARY_PATH:-} RUST_BACKTRACE=1
root=$(cat .gpu/ROOT)
[[ -e $root ]] || { mkdir -p "$(dirname "$root")" && ln -sfn "$PWD" "$root"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "=== tests/cuda_graph"
(cd tests && timeout -k 5 120 ../.gpu/tests/tests/cuda_graph --test-threads 1 --nocapture) \
    2>&1 | tee "$out/cuda_graph.log" | grep -E "^test |test result|tokens/s|skipped|panicked"
for graph in on off; do
    echo "=== flm bench stories260K, --cuda-graph $graph"
    timeout -k 5 60 .gpu/bin/flm bench --device cuda --gpu-layers auto --cuda-graph "$graph" \
        --model tests/data/stories260K/stories260K.bin --prompt-tokens 16 --gen-tokens 256 \
        --reps 3 --json 2>&1 | tee -a "$out/cuda_graph_bench.jsonl" | tail -2
    echo "=== flm bench Llama-2-7B shapes f16, --cuda-graph $graph"
    timeout -k 5 120 .gpu/bin/flm bench --device cuda --gpu-layers auto --cuda-graph "$graph" \
        --random .gpu/configs/llama-2-7b.json --dtype f16 --prompt-tokens 16 \
        --gen-tokens 128 --reps 3 --json 2>&1 | tee -a "$out/cuda_graph_bench.jsonl" | tail -2
done
