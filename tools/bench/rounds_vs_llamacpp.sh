#!/usr/bin/env bash
# Alternated rounds of llama.cpp's llama-bench and flm bench (TinyLlama-1.1B shapes by
# default), and the median (min–max) of the per-round ratios flm / llama.cpp: the protocol
# of docs/benchmarks.md ("flm against llama.cpp on the CPU"). A round runs, at one thread
# count, llama.cpp's Q4_0, flm's int4-sym and int4, llama.cpp's Q8_0 and flm's int8 (by
# default), one after the other, so that each ratio compares runs minutes apart under the
# same neighbours.
#
# Needs a llama-bench built on the machine (cmake -DGGML_NATIVE=ON, Release) and GGUFs of
# the same shapes (tools/bench/random_gguf.py writes them); flm built with
# `cargo build --release -p flm-cli`. Settings, by environment variable:
#   LLAMA_BENCH  llama-bench binary     (default /tmp/llama.cpp/build/bin/llama-bench)
#   Q4_0, Q8_0   the GGUFs              (default /tmp/gguf-bench/tinyllama-{q4_0,q8_0}.gguf);
#                Q8_0= (set, empty) leaves out the Q8_0 / int8 pair
#   Q4_DTYPES    flm's dtypes against Q4_0 (default "int4-sym int4")
#   FLM          flm binary             (default target/release/flm)
#   CONFIG       config of --random     (default tools/bench/configs/tinyllama-1.1b.json)
#   ROUNDS       "threads:rounds ..."   (default "2:10 1:3", the issue's sitting)
#   PP, TG, REPS prompt tokens, generated tokens and repetitions of each run
#                (default 128, 64, 3: llama-bench -p 128 -n 64 -r 3 against
#                flm bench --prompt-tokens 128 --gen-tokens 64 --reps 3)
#   OUT          raw results, JSON lines (default rounds-<date>.jsonl)
# Usage: tools/bench/rounds_vs_llamacpp.sh   (from the repository root)
set -euo pipefail

LLAMA_BENCH=${LLAMA_BENCH:-/tmp/llama.cpp/build/bin/llama-bench}
Q4_0=${Q4_0:-/tmp/gguf-bench/tinyllama-q4_0.gguf}
Q8_0=${Q8_0-/tmp/gguf-bench/tinyllama-q8_0.gguf}
Q4_DTYPES=${Q4_DTYPES:-"int4-sym int4"}
FLM=${FLM:-target/release/flm}
CONFIG=${CONFIG:-tools/bench/configs/tinyllama-1.1b.json}
ROUNDS=${ROUNDS:-"2:10 1:3"}
PP=${PP:-128}
TG=${TG:-64}
REPS=${REPS:-3}
OUT=${OUT:-rounds-$(date -u +%Y%m%dT%H%M%SZ).jsonl}

for f in "$LLAMA_BENCH" "$Q4_0" ${Q8_0:+"$Q8_0"} "$FLM" "$CONFIG"; do
    [[ -e $f ]] || { echo "missing: $f (see the header of $0)" >&2; exit 1; }
done

# One JSON line: {"round", "threads", "engine", "model", "pp", "tg"} (tokens/s).
llama() { # threads round gguf
    "$LLAMA_BENCH" -m "$3" -p "$PP" -n "$TG" -r "$REPS" -t "$1" -o jsonl | python3 -c '
import json, sys
r = {"round": int(sys.argv[1]), "threads": int(sys.argv[2]), "engine": "llama.cpp",
     "model": sys.argv[3]}
for line in sys.stdin:
    t = json.loads(line)
    r["pp" if t["n_prompt"] else "tg"] = t["avg_ts"]
print(json.dumps(r))' "$2" "$1" "$(basename "$3")"
}
flm() { # threads round dtype
    "$FLM" bench --random "$CONFIG" --dtype "$3" --threads "$1" --prompt-tokens "$PP" \
        --gen-tokens "$TG" --reps "$REPS" --json | python3 -c '
import json, sys
t = json.loads(sys.stdin.read().strip().splitlines()[-1])
print(json.dumps({"round": int(sys.argv[1]), "threads": int(sys.argv[2]), "engine": "flm",
                  "model": sys.argv[3], "pp": t["prefill_tok_s"], "tg": t["decode_tok_s"],
                  "bandwidth_fraction": t["bandwidth_fraction"]}))' "$2" "$1" "$3"
}

for spec in $ROUNDS; do
    threads=${spec%%:*}
    for ((round = 1; round <= ${spec##*:}; round++)); do
        echo "== $threads thread(s), round $round" >&2
        llama "$threads" "$round" "$Q4_0" | tee -a "$OUT"
        for dtype in $Q4_DTYPES; do
            flm "$threads" "$round" "$dtype" | tee -a "$OUT"
        done
        if [[ -n $Q8_0 ]]; then
            llama "$threads" "$round" "$Q8_0" | tee -a "$OUT"
            flm "$threads" "$round" int8 | tee -a "$OUT"
        fi
    done
done

python3 - "$OUT" "$(basename "$Q4_0")" "$(basename "${Q8_0:-none}")" "$Q4_DTYPES" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
q4, q8 = sys.argv[2], sys.argv[3]
pairs = [(dtype, q4) for dtype in sys.argv[4].split()] + [("int8", q8)]
print("| pair | threads | rounds | prefill llama.cpp / flm | median ratio (min–max) "
      "| decode llama.cpp / flm | median ratio (min–max) | decode / bound |")
print("|---|--:|--:|--:|--:|--:|--:|--:|")
for threads in sorted({r["threads"] for r in rows}, reverse=True):
    for dtype, gguf in pairs:
        ours = {r["round"]: r for r in rows
                if r["threads"] == threads and r["engine"] == "flm" and r["model"] == dtype}
        theirs = {r["round"]: r for r in rows
                  if r["threads"] == threads and r["engine"] == "llama.cpp" and r["model"] == gguf}
        rounds = sorted(ours.keys() & theirs.keys())
        if not rounds:
            continue
        cells = []
        for key in ("pp", "tg"):
            ratios = [ours[n][key] / theirs[n][key] for n in rounds]
            mean = lambda d: statistics.mean(d[n][key] for n in rounds)
            cells.append(f"{mean(theirs):.1f} / {mean(ours):.1f}")
            cells.append(f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})")
        bound = statistics.median(ours[n]["bandwidth_fraction"] for n in rounds)
        print(f"| {gguf.split('.')[0]} / {dtype} | {threads} | {len(rounds)} | "
              + " | ".join(cells) + f" | {bound:.0%} |")
EOF
