/*
 * A host application of libflm, built by gcc against libflm.so and libflm.a
 * (tools/capi/tests/c_program.rs drives it, also under valgrind).
 *
 *   flm_test generate MODEL PROMPT MAX_TOKENS
 *       Greedy generation, printed as `flm run --temperature 0` prints it: the
 *       continuation, then a newline.
 *   flm_test check MODEL
 *       Two sessions on two threads at once against their solo outputs, the documented
 *       status of each kind of bad call, tokenize/detokenize, a callback that stops,
 *       generation from ids, the chat calls on a model without a chat template.
 *       Prints "ok" and exits 0, or prints each failure and exits 1.
 *   flm_test chat MODEL USER_TEXT TEMPLATE_ARGS_JSON MAX_TOKENS
 *       A one-turn greedy chat, printed as `flm chat --temperature 0 --verbose` prints
 *       it: the prompt of flm_apply_chat_template() on stderr, framed as
 *       "--- prompt (N tokens)\nTEXT\n---\n" with N the length of flm_tokenize_chat()'s
 *       ids, and the reply of flm_generate_tokens() from those ids on stdout, then a
 *       newline.
 *   flm_test stress MODEL POOL_THREADS HOST_THREADS GENERATIONS
 *       HOST_THREADS threads, each with a session of its own over one model whose pool
 *       has POOL_THREADS workers, generate GENERATIONS greedy texts each (the prompts in
 *       turn); every call must succeed and every text must equal the text of its prompt
 *       generated alone. Prints "ok" and exits 0, or prints each failure and exits 1.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flm.h"

static int failures = 0;

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n",       \
                    __FILE__, __LINE__, #cond, flm_last_error());               \
            failures++;                                                         \
        }                                                                       \
    } while (0)

/* Checks that `call` returns `status` and that the error message contains `needle`. */
#define EXPECT_ERROR(call, status, needle)                                      \
    do {                                                                        \
        FlmStatus got_ = (call);                                                \
        if (got_ != (status) || strstr(flm_last_error(), (needle)) == NULL) {   \
            fprintf(stderr, "%s:%d: %s returned %d (want %d), message \"%s\" "  \
                    "(want \"%s\" in it)\n", __FILE__, __LINE__, #call,         \
                    (int)got_, (int)(status), flm_last_error(), (needle));      \
            failures++;                                                         \
        }                                                                       \
    } while (0)

/* A growing byte buffer that collects the generated pieces. */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
    size_t pieces;
    size_t stop_after; /* return non-zero after this many pieces; 0: never */
} Text;

static int collect(const char *piece, size_t len, void *user_data) {
    Text *t = user_data;
    if (t->len + len + 1 > t->cap) {
        size_t cap = (t->len + len + 1) * 2;
        char *data = realloc(t->data, cap);
        if (data == NULL) {
            return 1;
        }
        t->data = data;
        t->cap = cap;
    }
    memcpy(t->data + t->len, piece, len);
    t->len += len;
    t->data[t->len] = '\0';
    t->pieces++;
    return t->stop_after != 0 && t->pieces >= t->stop_after;
}

static int print_piece(const char *piece, size_t len, void *user_data) {
    (void)user_data;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static FlmModel *load(const char *path) {
    FlmModel *model = NULL;
    FlmStatus status = flm_model_load(path, NULL, &model);
    if (status != FLM_STATUS_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, flm_last_error());
        exit(1);
    }
    return model;
}

/* One generation job: a prompt and its sampling, on a session of its own. */
typedef struct {
    const FlmModel *model;
    const char *prompt;
    FlmSampling sampling;
    size_t max_tokens;
    pthread_barrier_t *start; /* NULL when run alone */
    Text out;
    FlmStatus status;
} Job;

static void *run_job(void *arg) {
    Job *job = arg;
    FlmSession *session = NULL;
    job->status = flm_session_new(job->model, &session);
    if (job->start != NULL) {
        pthread_barrier_wait(job->start);
    }
    if (job->status == FLM_STATUS_OK) {
        job->status = flm_generate(session, job->prompt, strlen(job->prompt), &job->sampling,
                                   job->max_tokens, collect, &job->out, NULL);
    }
    flm_session_free(session);
    return NULL;
}

static void two_threads_equal_solo(const FlmModel *model) {
    FlmSampling greedy = flm_sampling_default();
    greedy.temperature = 0.0f;
    FlmSampling sampled = flm_sampling_default();
    sampled.seed = 7;
    Job solo[2] = {
        {model, "Once upon a time", greedy, 120, NULL, {0}, FLM_STATUS_OK},
        {model, "Lily and Ben", sampled, 120, NULL, {0}, FLM_STATUS_OK},
    };
    Job both[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) {
        run_job(&solo[i]);
        CHECK(solo[i].status == FLM_STATUS_OK && solo[i].out.len > 0);
        both[i] = solo[i];
        both[i].start = &start;
        memset(&both[i].out, 0, sizeof both[i].out);
    }
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_create(&threads[i], NULL, run_job, &both[i]) == 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(threads[i], NULL);
        CHECK(both[i].status == FLM_STATUS_OK);
        CHECK(both[i].out.len == solo[i].out.len &&
              memcmp(both[i].out.data, solo[i].out.data, solo[i].out.len) == 0);
        free(solo[i].out.data);
        free(both[i].out.data);
    }
    pthread_barrier_destroy(&start);
}

static void tokenize_round_trip(const FlmModel *model) {
    const char *text = "Once upon a time, there was a little girl.";
    size_t n = 0;
    EXPECT_ERROR(flm_tokenize(model, text, strlen(text), true, NULL, 0, &n),
                 FLM_STATUS_BUFFER_TOO_SMALL, "needed");
    CHECK(n > 1);
    uint32_t *ids = malloc(n * sizeof *ids);
    size_t n2 = 0;
    CHECK(flm_tokenize(model, text, strlen(text), true, ids, n, &n2) == FLM_STATUS_OK);
    CHECK(n2 == n && ids[0] == 1);
    size_t len = 0;
    char small[4];
    EXPECT_ERROR(flm_detokenize(model, ids, n, small, sizeof small, &len),
                 FLM_STATUS_BUFFER_TOO_SMALL, "needed");
    CHECK(len == strlen(text));
    char back[128];
    CHECK(flm_detokenize(model, ids, n, back, sizeof back, &len) == FLM_STATUS_OK);
    CHECK(len == strlen(text) && memcmp(back, text, len) == 0);
    free(ids);
}

/* Checks that the model at path loads with options, and frees it. */
static void expect_loads(const char *path, const FlmModelOptions *options) {
    FlmModel *model = NULL;
    CHECK(flm_model_load(path, options, &model) == FLM_STATUS_OK);
    flm_model_free(model);
}

/* Checks that flm_model_load refuses the options with the string option *field set to
 * `refused` (FLM_STATUS_INVALID_ARGUMENT, a message holding needle) and loads them with it
 * set to `accepted`; leaves *field NULL (the default). */
static void expect_string_option(const char *path, FlmModelOptions *options,
                                 const char **field, const char *refused,
                                 const char *needle, const char *accepted) {
    FlmModel *none = NULL;
    *field = refused;
    EXPECT_ERROR(flm_model_load(path, options, &none), FLM_STATUS_INVALID_ARGUMENT, needle);
    *field = accepted;
    expect_loads(path, options);
    *field = NULL;
}

static void bad_calls(const char *path, FlmModel *model) {
    FlmModel *none = (FlmModel *)&failures; /* a non-NULL value the calls must reset */
    FlmSession *session = NULL;
    size_t n = 0;
    char text[16];

    /* Null pointers. */
    EXPECT_ERROR(flm_model_load(NULL, NULL, &none), FLM_STATUS_NULL_POINTER, "path");
    CHECK(none == NULL);
    EXPECT_ERROR(flm_model_load(path, NULL, NULL), FLM_STATUS_NULL_POINTER, "out_model");
    EXPECT_ERROR(flm_session_new(NULL, &session), FLM_STATUS_NULL_POINTER, "model");
    EXPECT_ERROR(flm_tokenize(model, NULL, 3, true, NULL, 0, &n), FLM_STATUS_NULL_POINTER,
                 "text");
    EXPECT_ERROR(flm_tokenize(model, "abc", 3, true, NULL, 0, NULL), FLM_STATUS_NULL_POINTER,
                 "n_ids");
    EXPECT_ERROR(flm_generate(NULL, "a", 1, NULL, 4, NULL, NULL, NULL),
                 FLM_STATUS_NULL_POINTER, "session");
    flm_model_free(NULL);
    flm_session_free(NULL);

    /* Invalid UTF-8. */
    const char bad[] = {'a', (char)0xff, (char)0xfe, 'b'};
    EXPECT_ERROR(flm_tokenize(model, bad, sizeof bad, true, NULL, 0, &n),
                 FLM_STATUS_INVALID_UTF8, "UTF-8");
    CHECK(flm_session_new(model, &session) == FLM_STATUS_OK);
    EXPECT_ERROR(flm_generate(session, bad, sizeof bad, NULL, 4, NULL, NULL, NULL),
                 FLM_STATUS_INVALID_UTF8, "prompt");

    /* Out-of-range token ids. */
    const uint32_t ids[] = {1, 100000};
    EXPECT_ERROR(flm_detokenize(model, ids, 2, text, sizeof text, &n),
                 FLM_STATUS_TOKEN_OUT_OF_RANGE, "100000");

    /* Missing file. */
    EXPECT_ERROR(flm_model_load("/nonexistent/flm-model.bin", NULL, &none), FLM_STATUS_IO,
                 "/nonexistent/flm-model.bin");
    CHECK(none == NULL);

    /* Bad options and sampling parameters; a prompt longer than the context. */
    FlmModelOptions options = {0};
    options.device = "gpu9";
    EXPECT_ERROR(flm_model_load(path, &options, &none), FLM_STATUS_INVALID_ARGUMENT, "gpu9");
    /* "cuda" loads where a GPU is usable, and otherwise says why it is not. */
    options.device = "cuda";
    FlmModel *on_gpu = NULL;
    if (flm_model_load(path, &options, &on_gpu) == FLM_STATUS_OK) {
        flm_model_free(on_gpu);
    } else {
        EXPECT_ERROR(flm_model_load(path, &options, &none), FLM_STATUS_INVALID_ARGUMENT,
                     "no CUDA GPU (");
    }
    options.device = NULL;
    options.threads = (size_t)-1;
    EXPECT_ERROR(flm_model_load(path, &options, &none), FLM_STATUS_INVALID_ARGUMENT, "threads");
    options.threads = 1;
    options.activation_bits = 12;
    EXPECT_ERROR(flm_model_load(path, &options, &none), FLM_STATUS_INVALID_ARGUMENT,
                 "activation_bits is 12");
    options.activation_bits = 16;
    expect_loads(path, &options);
    options.activation_bits = 0;
    expect_string_option(path, &options, &options.kv_dtype, "bf16",
                         "options->kv_dtype is \"bf16\": f32, f16 or auto", "f16");
    options.device = "cpu";
    options.gpu_layers = "many";
    EXPECT_ERROR(flm_model_load(path, &options, &none), FLM_STATUS_INVALID_ARGUMENT,
                 "options->gpu_layers: \"many\" is neither a layer count nor auto");
    expect_string_option(path, &options, &options.gpu_layers, "2",
                         "options->gpu_layers is 2, and no GPU runs the model", "0");
    options.device = NULL;
    FlmSampling sampling = flm_sampling_default();
    sampling.top_p = 1.5f;
    EXPECT_ERROR(flm_generate(session, "a", 1, &sampling, 4, NULL, NULL, NULL),
                 FLM_STATUS_INVALID_ARGUMENT, "top-p");
    options.device = "cpu";
    options.context = 4;
    options.threads = 1;
    FlmModel *small = NULL;
    CHECK(flm_model_load(path, &options, &small) == FLM_STATUS_OK);
    FlmSession *cramped = NULL;
    CHECK(flm_session_new(small, &cramped) == FLM_STATUS_OK);
    flm_model_free(small); /* the session keeps the weights alive */
    const char *prompt = "Once upon a time there was";
    EXPECT_ERROR(flm_generate(cramped, prompt, strlen(prompt), NULL, 4, NULL, NULL, NULL),
                 FLM_STATUS_CONTEXT_OVERFLOW, "context holds 4 tokens");
    size_t generated = 0;
    CHECK(flm_generate(cramped, "", 0, NULL, 100, NULL, NULL, &generated) == FLM_STATUS_OK);
    CHECK(generated == 3); /* BOS + 3 tokens fill the 4 positions */
    flm_session_free(cramped);

    /* A callback that stops: its pieces so far are the start of the full text. */
    Text full = {0}, part = {0};
    part.stop_after = 3;
    CHECK(flm_generate(session, "Lily", 4, NULL, 50, collect, &full, NULL) == FLM_STATUS_OK);
    const char *before = flm_last_error();
    CHECK(flm_generate(session, "Lily", 4, NULL, 50, collect, &part, &generated) ==
          FLM_STATUS_STOPPED);
    CHECK(flm_last_error() == before);
    CHECK(part.pieces == 3 && generated >= 3 && part.len > 0 && part.len < full.len &&
          memcmp(part.data, full.data, part.len) == 0);
    free(full.data);
    free(part.data);
    flm_session_free(session);
}

/* flm_generate_tokens() of flm_tokenize(text, true) gives flm_generate(text)'s pieces, and
 * the documented status of its bad calls. */
static void generate_from_ids(const FlmModel *model) {
    const char *prompt = "Once upon a time";
    uint32_t ids[16];
    size_t n = 0;
    CHECK(flm_tokenize(model, prompt, strlen(prompt), true, ids, 16, &n) == FLM_STATUS_OK);
    FlmSession *session = NULL;
    CHECK(flm_session_new(model, &session) == FLM_STATUS_OK);
    Text from_text = {0}, from_ids = {0};
    size_t generated = 0;
    CHECK(flm_generate(session, prompt, strlen(prompt), NULL, 40, collect, &from_text, NULL) ==
          FLM_STATUS_OK);
    CHECK(flm_generate_tokens(session, ids, n, false, NULL, 40, collect, &from_ids,
                              &generated) == FLM_STATUS_OK);
    CHECK(generated > 0 && from_ids.len > 0 && from_ids.len == from_text.len &&
          memcmp(from_ids.data, from_text.data, from_text.len) == 0);
    free(from_text.data);
    free(from_ids.data);

    EXPECT_ERROR(flm_generate_tokens(NULL, ids, n, false, NULL, 4, NULL, NULL, NULL),
                 FLM_STATUS_NULL_POINTER, "session");
    EXPECT_ERROR(flm_generate_tokens(session, NULL, 3, false, NULL, 4, NULL, NULL, NULL),
                 FLM_STATUS_NULL_POINTER, "ids");
    EXPECT_ERROR(flm_generate_tokens(session, ids, 0, false, NULL, 4, NULL, NULL, NULL),
                 FLM_STATUS_INVALID_ARGUMENT, "ids is empty");
    const uint32_t outside[] = {1, 100000};
    EXPECT_ERROR(flm_generate_tokens(session, outside, 2, false, NULL, 4, NULL, NULL, NULL),
                 FLM_STATUS_TOKEN_OUT_OF_RANGE, "100000");
    flm_session_free(session);
}

/* `text` as an FlmChatMessage content of role `role`. */
static FlmChatMessage message(const char *role, const char *text) {
    FlmChatMessage m = {role, strlen(role), text, strlen(text)};
    return m;
}

/* The chat calls on a model without a chat template: the checks of the arguments come
 * first, then FLM_STATUS_NO_CHAT_TEMPLATE. */
static void chat_bad_calls(const FlmModel *model) {
    FlmChatMessage turns[2] = {message("system", "Be brief."), message("user", "Hello")};
    char text[64];
    size_t len = 7;
    uint32_t ids[64];
    size_t n = 7;
    EXPECT_ERROR(flm_apply_chat_template(model, turns, 2, true, NULL, 0, text, sizeof text,
                                         &len),
                 FLM_STATUS_NO_CHAT_TEMPLATE, "no chat template");
    CHECK(len == 7); /* nothing written */
    EXPECT_ERROR(flm_tokenize_chat(model, turns, 2, true, NULL, 0, ids, 64, &n),
                 FLM_STATUS_NO_CHAT_TEMPLATE, "format the prompt yourself");
    CHECK(n == 7);
    EXPECT_ERROR(flm_apply_chat_template(NULL, turns, 2, true, NULL, 0, text, sizeof text,
                                         &len),
                 FLM_STATUS_NULL_POINTER, "model");
    EXPECT_ERROR(flm_tokenize_chat(model, NULL, 2, true, NULL, 0, ids, 64, &n),
                 FLM_STATUS_NULL_POINTER, "messages");
    FlmChatMessage no_role = {NULL, 4, "Hi", 2};
    EXPECT_ERROR(flm_apply_chat_template(model, &no_role, 1, true, NULL, 0, text, sizeof text,
                                         &len),
                 FLM_STATUS_NULL_POINTER, "messages[0].role");
    const char bad[] = {'a', (char)0xff};
    FlmChatMessage bad_content = {"user", 4, bad, sizeof bad};
    FlmChatMessage with_bad[2] = {turns[1], bad_content};
    EXPECT_ERROR(flm_tokenize_chat(model, with_bad, 2, true, NULL, 0, ids, 64, &n),
                 FLM_STATUS_INVALID_UTF8, "messages[1].content");
    const char *args[][2] = {
        {"[true]", "not a JSON object"},
        {"{\"enable_thinking\": fals", "not valid JSON"},
        {"{\"add_generation_prompt\": false}", "`add_generation_prompt`"},
    };
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        EXPECT_ERROR(flm_apply_chat_template(model, turns, 2, true, args[i][0],
                                             strlen(args[i][0]), text, sizeof text, &len),
                     FLM_STATUS_INVALID_ARGUMENT, args[i][1]);
    }
    EXPECT_ERROR(flm_apply_chat_template(model, turns, 2, true, bad, sizeof bad, text,
                                         sizeof text, &len),
                 FLM_STATUS_INVALID_UTF8, "template_args");
}

/* See `chat` in the usage at the top. */
static int chat(const char *path, const char *user, const char *template_args,
                size_t max_tokens) {
    FlmModel *model = load(path);
    FlmChatMessage turn = message("user", user);
    size_t len = 0, n = 0;
    FlmStatus status = flm_apply_chat_template(model, &turn, 1, true, template_args,
                                               strlen(template_args), NULL, 0, &len);
    CHECK(status == FLM_STATUS_BUFFER_TOO_SMALL || (status == FLM_STATUS_OK && len == 0));
    char *text = malloc(len + 1);
    CHECK(flm_apply_chat_template(model, &turn, 1, true, template_args, strlen(template_args),
                                  text, len, &len) == FLM_STATUS_OK);
    status = flm_tokenize_chat(model, &turn, 1, true, template_args, strlen(template_args),
                               NULL, 0, &n);
    CHECK(status == FLM_STATUS_BUFFER_TOO_SMALL && n > 0);
    uint32_t *ids = malloc(n * sizeof *ids);
    CHECK(flm_tokenize_chat(model, &turn, 1, true, template_args, strlen(template_args), ids,
                            n, &n) == FLM_STATUS_OK);
    fprintf(stderr, "--- prompt (%zu tokens)\n%.*s\n---\n", n, (int)len, text);
    FlmSession *session = NULL;
    CHECK(flm_session_new(model, &session) == FLM_STATUS_OK);
    FlmSampling greedy = flm_sampling_default();
    greedy.temperature = 0.0f;
    CHECK(flm_generate_tokens(session, ids, n, true, &greedy, max_tokens, print_piece, NULL,
                              NULL) == FLM_STATUS_OK);
    printf("\n");
    flm_session_free(session);
    free(ids);
    free(text);
    flm_model_free(model);
    return failures;
}

/* The prompts of `stress`: the longer ones make the prefill's Linears of stories260K large
 * enough to be split over the pool. */
static const char *const STRESS_PROMPTS[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play",
    "The big brown dog ran to the park with his friend Tom, and they",
    "Sam had a red ball. One day he went outside and",
    "",
};
#define STRESS_N_PROMPTS (sizeof STRESS_PROMPTS / sizeof STRESS_PROMPTS[0])
#define STRESS_MAX_TOKENS 32

/* One host thread of `stress`. */
typedef struct {
    const FlmModel *model;
    const Text *lone; /* the lone text of each prompt */
    size_t index;
    size_t generations;
    pthread_barrier_t *start;
    int failures;
} StressJob;

/* Greedy generation of `prompt` in `session` into `out`; the status. */
static FlmStatus greedy_text(FlmSession *session, const char *prompt, Text *out) {
    FlmSampling greedy = flm_sampling_default();
    greedy.temperature = 0.0f;
    return flm_generate(session, prompt, strlen(prompt), &greedy, STRESS_MAX_TOKENS, collect,
                        out, NULL);
}

static void *stress_job(void *arg) {
    StressJob *job = arg;
    FlmSession *session = NULL;
    FlmStatus status = flm_session_new(job->model, &session);
    pthread_barrier_wait(job->start);
    if (status != FLM_STATUS_OK) {
        fprintf(stderr, "thread %zu: flm_session_new: %d: %s\n", job->index, (int)status,
                flm_last_error());
        job->failures++;
        return NULL;
    }
    for (size_t g = 0; g < job->generations; g++) {
        size_t p = (job->index + g) % STRESS_N_PROMPTS;
        Text out = {0};
        status = greedy_text(session, STRESS_PROMPTS[p], &out);
        const Text *lone = &job->lone[p];
        if (status != FLM_STATUS_OK) {
            fprintf(stderr, "thread %zu, generation %zu: status %d: \"%s\"\n", job->index, g,
                    (int)status, flm_last_error());
            job->failures++;
        } else if (out.len != lone->len || memcmp(out.data, lone->data, lone->len) != 0) {
            fprintf(stderr, "thread %zu, generation %zu: \"%s\" instead of \"%s\"\n",
                    job->index, g, out.data != NULL ? out.data : "", lone->data);
            job->failures++;
        }
        free(out.data);
    }
    flm_session_free(session);
    return NULL;
}

/* See `stress` in the usage at the top. */
static int stress(const char *path, size_t pool_threads, size_t host_threads,
                  size_t generations) {
    FlmModelOptions options = {0};
    options.threads = pool_threads;
    FlmModel *model = NULL;
    FlmStatus status = flm_model_load(path, &options, &model);
    if (status != FLM_STATUS_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, flm_last_error());
        return 1;
    }
    Text lone[STRESS_N_PROMPTS] = {{0}};
    for (size_t p = 0; p < STRESS_N_PROMPTS; p++) {
        FlmSession *session = NULL;
        CHECK(flm_session_new(model, &session) == FLM_STATUS_OK);
        CHECK(greedy_text(session, STRESS_PROMPTS[p], &lone[p]) == FLM_STATUS_OK);
        CHECK(lone[p].len > 0);
        flm_session_free(session);
    }
    StressJob *jobs = calloc(host_threads, sizeof *jobs);
    pthread_t *threads = calloc(host_threads, sizeof *threads);
    pthread_barrier_t start;
    CHECK(jobs != NULL && threads != NULL && host_threads > 0);
    if (failures == 0) {
        pthread_barrier_init(&start, NULL, (unsigned)host_threads);
        for (size_t t = 0; t < host_threads; t++) {
            jobs[t] = (StressJob){model, lone, t, generations, &start, 0};
            CHECK(pthread_create(&threads[t], NULL, stress_job, &jobs[t]) == 0);
        }
        for (size_t t = 0; t < host_threads; t++) {
            pthread_join(threads[t], NULL);
            failures += jobs[t].failures;
        }
        pthread_barrier_destroy(&start);
    }
    for (size_t p = 0; p < STRESS_N_PROMPTS; p++) {
        free(lone[p].data);
    }
    free(jobs);
    free(threads);
    flm_model_free(model);
    return failures;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "generate") == 0) {
        FlmModel *model = load(argv[2]);
        FlmSession *session = NULL;
        FlmStatus status = flm_session_new(model, &session);
        if (status == FLM_STATUS_OK) {
            status = flm_generate(session, argv[3], strlen(argv[3]), NULL,
                                  strtoul(argv[4], NULL, 10), print_piece, NULL, NULL);
        }
        if (status != FLM_STATUS_OK) {
            fprintf(stderr, "error %d: %s\n", (int)status, flm_last_error());
        }
        printf("\n");
        flm_session_free(session);
        flm_model_free(model);
        return status == FLM_STATUS_OK ? 0 : 1;
    }
    if (argc == 3 && strcmp(argv[1], "check") == 0) {
        CHECK(strlen(flm_version()) > 0 && strcmp(flm_last_error(), "") == 0);
        FlmModel *model = load(argv[2]);
        two_threads_equal_solo(model);
        tokenize_round_trip(model);
        bad_calls(argv[2], model);
        generate_from_ids(model);
        chat_bad_calls(model);
        flm_model_free(model);
        if (failures > 0) {
            fprintf(stderr, "%d checks failed\n", failures);
            return 1;
        }
        printf("ok\n");
        return 0;
    }
    if (argc == 6 && strcmp(argv[1], "chat") == 0) {
        int failed = chat(argv[2], argv[3], argv[4], strtoul(argv[5], NULL, 10));
        if (failed > 0) {
            fprintf(stderr, "%d checks failed\n", failed);
            return 1;
        }
        return 0;
    }
    if (argc == 6 && strcmp(argv[1], "stress") == 0) {
        int failed = stress(argv[2], strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10),
                            strtoul(argv[5], NULL, 10));
        if (failed > 0) {
            fprintf(stderr, "%d checks failed\n", failed);
            return 1;
        }
        printf("ok\n");
        return 0;
    }
    fprintf(stderr, "usage: flm_test generate MODEL PROMPT MAX_TOKENS | check MODEL | "
                    "chat MODEL USER_TEXT TEMPLATE_ARGS_JSON MAX_TOKENS | "
                    "stress MODEL POOL_THREADS HOST_THREADS GENERATIONS\n");
    return 2;
}
