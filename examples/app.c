/*
 * The smallest host of libflm: loads a model, generates a greedy continuation of a prompt
 * and streams it to stdout. README.md's C section builds it; tools/capi/tests/c_program.rs
 * builds and runs it against both libraries.
 *
 *   usage: app MODEL [PROMPT [MAX_TOKENS]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flm.h"

/* Writes each piece of text as it comes; returning non-zero would stop generation. */
static int print_piece(const char *piece, size_t len, void *user_data) {
    (void)user_data;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [PROMPT [MAX_TOKENS]]\n", argv[0]);
        return 2;
    }
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    size_t max_tokens = argc > 3 ? strtoul(argv[3], NULL, 10) : 64;

    FlmModel *model = NULL;
    FlmModelOptions options = {0}; /* zero: the defaults (CPU, the model's context) */
    if (flm_model_load(argv[1], &options, &model) != FLM_STATUS_OK) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], flm_last_error());
        return 1;
    }
    FlmSession *session = NULL;
    if (flm_session_new(model, &session) != FLM_STATUS_OK) {
        fprintf(stderr, "cannot start a session: %s\n", flm_last_error());
        flm_model_free(model);
        return 1;
    }
    /* NULL sampling: greedy decoding, as `flm run --temperature 0`. */
    size_t generated = 0;
    enum FlmStatus status = flm_generate(session, prompt, strlen(prompt), NULL, max_tokens,
                                         print_piece, NULL, &generated);
    putchar('\n');
    if (status != FLM_STATUS_OK) {
        fprintf(stderr, "generation failed: %s\n", flm_last_error());
    }
    flm_session_free(session);
    flm_model_free(model);
    return status == FLM_STATUS_OK ? 0 : 1;
}
