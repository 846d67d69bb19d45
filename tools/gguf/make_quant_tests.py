#!/usr/bin/env python3
"""Writes the ggml weight-type test data of tests/data/gguf/quants/ with gguf-py
(llama.cpp's own Python package, `pip install gguf`): for each type, `<TYPE>.bin` holds
ROWS x COLS values as ggml blocks and `<TYPE>.f32` the values `gguf.quants.dequantize`
decodes them to (f32 little-endian, row-major). flm's decoders must give the same bits
(core/tests/ggml.rs). `weights.f32` holds the weights the quantised types were made from,
so that flm's MXFP4 quantiser is checked against gguf-py's blocks.

The blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 are quantised by `gguf.quants.quantize` from
seeded random weights (normal, with a few rows scaled, an all-zero row and outliers).
gguf-py has no quantiser for the K-quants and IQ4 types, so their blocks are random bytes
(every bit pattern of a code or scale byte is a valid block) with the f16 scale fields
drawn from finite f16 bit patterns, subnormals included: a test of the decoder over every
field, not of a quantiser. Deterministic: running it again writes the same bytes.

Usage: python3 tools/gguf/make_quant_tests.py [OUTPUT_DIR]
(default tests/data/gguf/quants, relative to the repository root).
"""

import pathlib
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

ROWS, COLS = 8, 512
QUANTISED = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]
RANDOM = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]
# Byte offsets of the f16 fields in each block (ggml-common.h).
F16_FIELDS = {
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}


def weights(rng):
    w = rng.standard_normal((ROWS, COLS)).astype(np.float32) * 0.05
    w[1] *= 40.0
    w[2] = 0.0
    w[3, ::37] = 3.0
    w[4, 5] = -7.5
    w[5] += 0.2
    return w


def finite_f16(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exponent = (bits >> 10) & 0x1F
    # Inf and NaN (exponent 31) become exponent 14: values near 1, either sign.
    bits = np.where(exponent == 31, (bits & 0x83FF) | (14 << 10), bits).astype(np.uint16)
    return bits


def random_blocks(rng, qtype):
    block, size = quants.GGML_QUANT_SIZES[qtype]
    n = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = finite_f16(rng, n).view(np.uint8).reshape(n, 2)
    return raw.reshape(ROWS, -1)


def main():
    root = pathlib.Path(__file__).resolve().parents[2]
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests/data/gguf/quants"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(35)
    w = weights(rng)
    # The weights the quantised types were made from, for the tests of flm's quantisers.
    (out / "weights.f32").write_bytes(w.astype("<f4").tobytes())
    for qtype in QUANTISED + RANDOM:
        if qtype in QUANTISED:
            blocks = quants.quantize(w, qtype)
        else:
            blocks = random_blocks(rng, qtype)
        values = quants.dequantize(blocks, qtype).astype("<f4")
        assert values.shape == (ROWS, COLS), (qtype.name, values.shape)
        assert np.isfinite(values).all(), qtype.name
        (out / f"{qtype.name}.bin").write_bytes(blocks.tobytes())
        (out / f"{qtype.name}.f32").write_bytes(values.tobytes())
        print(f"{qtype.name}: {blocks.nbytes} bytes of blocks, {values.nbytes} bytes of values")


if __name__ == "__main__":
    main()
