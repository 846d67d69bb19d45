#!/usr/bin/env bash
# Cycles per 256 weights of flm's NEON int4 decode loop, by llvm-mca, for Cortex-A76 and
# Cortex-A55 (dotprod) and Cortex-A72 (without): docs/benchmarks.md, "NEON int4 decode
# loop". The loop is the int4 tile of 4 weight rows × 1 input row (decode) at groups of 32
# (int4-sym g32 is Q4_0), whole chunks of 128 values: 512 weights per iteration.
#
# flm-devices is cross-built for aarch64 as in .ci/run (Debian's rustc with the arm64
# standard library) with `--emit asm`; tools/bench/asm_loops.py cuts the loops out.
# Settings, by environment variable:
#   OTHER   an aarch64 assembly file holding one loop of another implementation, and
#   OTHER_WEIGHTS  the weights one iteration of it covers: run through llvm-mca likewise
#           (for llama.cpp's ggml_vec_dot_q4_0_q8_0, 64: two Q4_0 blocks per iteration)
#   OUT     working folder (default /tmp/neon-mca)
# Usage: tools/bench/neon_mca.sh   (from the repository root)
set -euo pipefail

OUT=${OUT:-/tmp/neon-mca}
mkdir -p "$OUT"
export RUSTC=/usr/bin/rustc CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/aarch64-cross}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
/usr/bin/cargo rustc --release -p flm-devices --lib --target aarch64-unknown-linux-gnu \
    -- --emit asm -C debuginfo=0
asm=$(ls -t "$CARGO_TARGET_DIR"/aarch64-unknown-linux-gnu/release/deps/flm_devices-*.s | head -1)

# The instantiation <R = 4, T = 1> of each kernel is the one with 4 rows' dot products per
# block: 32 `sdot` (i4_dot) or 64 `smull`/`smlal` (i4_plain) per chunk and group size.
pick() { # kernel dot-count
    python3 - "$asm" "$1" "$2" <<'EOF'
import re, sys
asm, kernel, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = open(asm).read().split('\n')
for i, l in enumerate(s):
    if re.match(rf'^_ZN.*neon4Tile\d+{kernel}17h\w+E:$', l):
        end = next(j for j in range(i, len(s)) if s[j].strip() == '.cfi_endproc')
        n = sum(bool(re.search(r'\b(sdot|smull2?|smlal2?)\b', x)) for x in s[i:end])
        if n == 6 * want:  # 3 group sizes × (whole chunks + the partial one)
            print(l[:-1])
EOF
}
mca() { # file weights-per-iteration cpu [attr]
    llvm-mca -mtriple=aarch64 -mcpu="$3" ${4:+-mattr=$4} -iterations=400 "$1" | awk \
        -v w="$2" -v f="$(basename "$1")" -v cpu="$3" \
        '/^Instructions:/{i=$2} /^Total Cycles:/{c=$3}
         END{printf "%-28s %-11s %6.1f instructions %6.1f cycles per 256 weights\n", f, cpu, i/400*256/w, c/400*256/w}'
}
loop_g32() { # symbol prefix: the loop with 4 consecutive f16 scale loads and no calls
    python3 tools/bench/asm_loops.py "$asm" "^$1" "$OUT/$2" |
        awk -v p="$OUT/$2" '$6 == 0 && $8 == 4 {print p "-" $1 ".s"; exit}'
}
dot=$(loop_g32 "$(pick i4_dot 32)" i4_dot)
plain=$(loop_g32 "$(pick i4_plain 64)" i4_plain)
for cpu in cortex-a76 cortex-a55; do mca "$dot" 512 "$cpu" +dotprod; done
mca "$plain" 512 cortex-a72
if [[ -n ${OTHER:-} ]]; then
    for cpu in cortex-a76 cortex-a55; do mca "$OTHER" "${OTHER_WEIGHTS:?}" "$cpu" +dotprod; done
fi
