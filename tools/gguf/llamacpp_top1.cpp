// llama.cpp's side of the SmolLM2 accuracy comparison in docs/benchmarks.md: reads token ids
// from stdin and prints, with mode `tf`, the argmax of the logits at every position but the
// last (teacher-forced, one batch), or, with mode `greedy`, the first 8 greedy tokens after
// the ids. Driven by tools/gguf/llamacpp_top1.py.
//
// Build against a llama.cpp checkout with libllama built (cmake -B build && cmake --build build):
//   g++ -O2 -std=c++17 tools/gguf/llamacpp_top1.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//     -L$LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin -o llamacpp_top1
// Usage: llamacpp_top1 MODEL.gguf tf|greedy THREADS < ids.txt
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf tf|greedy THREADS < ids\n", argv[0]);
        return 2;
    }
    const bool teacher_forced = strcmp(argv[2], "tf") == 0;
    const int threads = atoi(argv[3]);
    std::vector<llama_token> ids;
    int id;
    while (scanf("%d", &id) == 1) ids.push_back(id);
    if (ids.empty()) return 2;

    llama_backend_init();
    llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 2048;
    cp.n_threads = cp.n_threads_batch = threads;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_batch batch = llama_batch_init(ids.size() + 1, 0, 1);
    batch.n_tokens = ids.size();
    for (size_t i = 0; i < ids.size(); i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = teacher_forced || i + 1 == ids.size();
    }
    if (llama_decode(ctx, batch)) return 1;
    if (teacher_forced) {
        for (size_t i = 0; i + 1 < ids.size(); i++) {
            printf("%d ", argmax(llama_get_logits_ith(ctx, i), n_vocab));
        }
        printf("\n");
        return 0;
    }
    int pos = ids.size();
    int token = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    printf("%d", token);
    for (int step = 1; step < 8; step++) {
        batch.n_tokens = 1;
        batch.token[0] = token;
        batch.pos[0] = pos++;
        batch.n_seq_id[0] = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0] = 1;
        if (llama_decode(ctx, batch)) return 1;
        token = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        printf(" %d", token);
    }
    printf("\n");
    return 0;
}
