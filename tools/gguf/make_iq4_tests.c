/*
 * Writes the IQ4_NL and IQ4_XS quantiser test data of tests/data/gguf/iq4/ with ggml's own
 * quantisers (ggml_quantize_chunk, which calls quantize_iq4_nl / quantize_iq4_xs of
 * ggml-quants.c, as llama-quantize does), so that flm's quantisers can be checked against
 * ggml's bytes (core/tests/iq4_quant.rs; provenance in tests/data/gguf/SOURCES.md).
 *
 * Input: tests/data/gguf/quants/weights.f32 (8 rows x 512 f32, little-endian).
 * Output, in OUTPUT_DIR:
 *   importance.f32            512 f32: the per-column importance (imatrix) used below
 *   <t>.bin                   the 8 rows quantised without importance
 *   <t>-imatrix.bin           the 8 rows quantised with importance.f32
 *   <t>-short.bin             the first 300 values of each row, zero-padded to whole
 *                             blocks, quantised without importance
 *   <t>-short-imatrix.bin     the same with the first 300 importances, padded with zeros
 * for <t> = iq4_nl and iq4_xs (ggml_type_name). Deterministic: running it again writes the
 * same bytes.
 *
 * Build and run against llama.cpp's ggml (libggml-base.so, ggml 0.25.3, in
 * /tmp/llama.cpp/build/bin), from the repository root:
 *   gcc -O2 -std=c11 -o /tmp/make_iq4_tests tools/gguf/make_iq4_tests.c \
 *       -I/tmp/llama.cpp/ggml/include -I/tmp/llama.cpp/ggml/src \
 *       -L/tmp/llama.cpp/build/bin -lggml-base -Wl,-rpath,/tmp/llama.cpp/build/bin
 *   /tmp/make_iq4_tests [WEIGHTS [OUTPUT_DIR]]
 * (defaults tests/data/gguf/quants/weights.f32 and tests/data/gguf/iq4).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

#define ROWS 8
#define COLS 512
#define SHORT 300

static void die(const char * what, const char * path) {
    fprintf(stderr, "make_iq4_tests: %s %s\n", what, path);
    exit(1);
}

static void write_file(const char * dir, const char * name, const void * data, size_t size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        die("cannot write", path);
    }
    printf("%s: %zu bytes\n", path, size);
}

/* A per-column importance with the shapes a real imatrix has: varied positive weights, a
 * few dead columns, and one whole dead run of 32 (columns 96..127). */
static float importance_of(int j) {
    if ((j >= 96 && j < 128) || j % 41 == 7) {
        return 0.0f;
    }
    return 0.05f + (float) ((j * 37) % 101) / 25.0f;
}

/* Quantises `rows` rows of `cols` values of `src` (importance `imatrix` or NULL) to `type`
 * and writes them to `name`. */
static void quantize_to(const char * dir, const char * name, enum ggml_type type,
                        const float * src, int rows, int cols, const float * imatrix) {
    size_t size = ggml_row_size(type, cols) * rows;
    void * dst = malloc(size);
    if (!dst) {
        die("out of memory for", name);
    }
    size_t written = ggml_quantize_chunk(type, src, dst, 0, rows, cols, imatrix);
    if (written != size) {
        die("unexpected size from ggml_quantize_chunk for", name);
    }
    write_file(dir, name, dst, size);
    free(dst);
}

int main(int argc, char ** argv) {
    const char * weights_path = argc > 1 ? argv[1] : "tests/data/gguf/quants/weights.f32";
    const char * dir = argc > 2 ? argv[2] : "tests/data/gguf/iq4";

    static float weights[ROWS * COLS];
    FILE * f = fopen(weights_path, "rb");
    if (!f || fread(weights, sizeof(float), ROWS * COLS, f) != ROWS * COLS) {
        die("cannot read", weights_path);
    }
    fclose(f);

    static float importance[COLS];
    for (int j = 0; j < COLS; ++j) {
        importance[j] = importance_of(j);
    }
    write_file(dir, "importance.f32", importance, sizeof importance);

    const enum ggml_type types[] = { GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
        const enum ggml_type type = types[t];
        const char * tname = ggml_type_name(type);
        char name[64];

        snprintf(name, sizeof name, "%s.bin", tname);
        quantize_to(dir, name, type, weights, ROWS, COLS, NULL);
        snprintf(name, sizeof name, "%s-imatrix.bin", tname);
        quantize_to(dir, name, type, weights, ROWS, COLS, importance);

        /* The short rows as flm pads them: values and importances past SHORT are zero. */
        const int blck = (int) ggml_blck_size(type);
        const int padded = (SHORT + blck - 1) / blck * blck;
        float * rows = calloc((size_t) ROWS * padded, sizeof(float));
        float * imp = calloc((size_t) padded, sizeof(float));
        if (!rows || !imp) {
            die("out of memory for", tname);
        }
        for (int r = 0; r < ROWS; ++r) {
            memcpy(rows + (size_t) r * padded, weights + (size_t) r * COLS, SHORT * sizeof(float));
        }
        memcpy(imp, importance, SHORT * sizeof(float));
        snprintf(name, sizeof name, "%s-short.bin", tname);
        quantize_to(dir, name, type, rows, ROWS, padded, NULL);
        snprintf(name, sizeof name, "%s-short-imatrix.bin", tname);
        quantize_to(dir, name, type, rows, ROWS, padded, imp);
        free(rows);
        free(imp);
    }
    return 0;
}
