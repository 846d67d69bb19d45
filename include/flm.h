/*
 * flm.h: the C ABI of flm, a portable LLM inference runtime.
 *
 * Generated from tools/capi/src by cbindgen (tools/capi/cbindgen.toml); do not edit.
 * Regenerate with: FLM_UPDATE_HEADER=1 cargo test -p flm-capi --test header
 *
 * Conventions:
 * - Every call that can fail returns an FlmStatus; FLM_STATUS_OK (0) is success, and
 *   flm_last_error() gives the message of the last failure on the calling thread.
 * - Text passed in is UTF-8 with an explicit length in bytes (no terminating NUL
 *   needed); only the model path and the device name are NUL-terminated strings.
 * - Handles (FlmModel, FlmSession) are opaque; they are created by flm_*_new/_load and
 *   owned by the caller until passed to the matching _free function.
 * - The library borrows every pointer argument only for the duration of the call, unless
 *   the function's documentation says otherwise.
 * - No Rust panic crosses this boundary: an internal error returns
 *   FLM_STATUS_INTERNAL.
 */

#ifndef FLM_H
#define FLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 The result of every fallible call. `FLM_STATUS_OK` is 0; every other value but
 `FLM_STATUS_STOPPED` is an error whose message `flm_last_error()` returns.
 */
typedef enum FlmStatus {
  /*
   Success.
   */
  FLM_STATUS_OK = 0,
  /*
   flm_generate(): the callback returned non-zero and generation stopped early; not an
   error (the text handed out so far is valid, flm_last_error() is not changed).
   */
  FLM_STATUS_STOPPED = 1,
  /*
   A pointer argument that must not be NULL was NULL.
   */
  FLM_STATUS_NULL_POINTER = 2,
  /*
   A text argument is not valid UTF-8.
   */
  FLM_STATUS_INVALID_UTF8 = 3,
  /*
   An argument is out of its documented range (sampling parameters, threads, device
   name, context of 0, ...).
   */
  FLM_STATUS_INVALID_ARGUMENT = 4,
  /*
   A token id is not in the model's vocabulary.
   */
  FLM_STATUS_TOKEN_OUT_OF_RANGE = 5,
  /*
   The caller's buffer is too small; the needed size was stored in the length output.
   */
  FLM_STATUS_BUFFER_TOO_SMALL = 6,
  /*
   A file could not be opened or read (a missing file, no permission).
   */
  FLM_STATUS_IO = 7,
  /*
   A model or tokenizer file is malformed, inconsistent or of an unsupported kind.
   */
  FLM_STATUS_FORMAT = 8,
  /*
   The prompt does not fit in the session's context (it must leave room for one
   generated token).
   */
  FLM_STATUS_CONTEXT_OVERFLOW = 9,
  /*
   An internal error (a bug of flm, caught at the boundary instead of unwinding).
   */
  FLM_STATUS_INTERNAL = 10,
  /*
   A text could not be tokenised, though the tokenizer file is sound: its
   pre-tokenisation regex gave up on the text (possible only for the rare patterns
   that flm runs on a backtracking engine, see flm_tokenizer's `split.rs`); or the
   model's chat template refused the conversation of flm_apply_chat_template() or
   flm_tokenize_chat() (it called `raise_exception`, as Gemma's does for a system
   turn; a role its format does not know; a render past the template limits).
   */
  FLM_STATUS_TOKENIZER = 11,
  /*
   An operation invalid in the current state of a model or session, though the files
   and arguments are sound: a step out of order (a model changed after sessions of it
   were made, a sequence not started at position 0). Unlike `FLM_STATUS_FORMAT`, it
   says nothing about the model file.
   */
  FLM_STATUS_STATE = 12,
  /*
   flm_apply_chat_template(), flm_tokenize_chat(): the model has no chat template (no
   `chat_template` in its tokenizer_config.json, no GGUF `tokenizer.chat_template`, no
   built-in ChatGLM format), so the host must format the prompt itself.
   */
  FLM_STATUS_NO_CHAT_TEMPLATE = 13,
} FlmStatus;

/*
 A loaded model (opaque): weights, tokenizer and executor (devices, thread pool),
 shared by its sessions.
 */
typedef struct FlmModel FlmModel;

/*
 A generation session (opaque): its own KV cache over a model's shared weights. Use
 one session from one thread at a time; different sessions may run on different
 threads at the same time.
 */
typedef struct FlmSession FlmSession;

/*
 One turn of a conversation, for flm_apply_chat_template() and flm_tokenize_chat():
 UTF-8 texts with their lengths in bytes (no terminating NUL needed), borrowed for the
 call only. A pointer may be NULL when its length is 0.
 */
typedef struct FlmChatMessage {
  /*
   The role: "system", "user", "assistant", or another the model's template knows
   (such as "tool"; ChatGLM3 and GLM-4 have "observation").
   */
  const char *role;
  /*
   Length of `role` in bytes.
   */
  size_t role_len;
  /*
   The text of the turn.
   */
  const char *content;
  /*
   Length of `content` in bytes.
   */
  size_t content_len;
} FlmChatMessage;

/*
 Options of flm_model_load(). A zero-initialised struct (`FlmModelOptions o = {0};`)
 asks for the defaults.
 */
typedef struct FlmModelOptions {
  /*
   Worker threads of the model's thread pool, shared by all its sessions; 0: one per
   CPU core; at most 4096.
   */
  size_t threads;
  /*
   NUL-terminated device name: "cpu"; "cuda" (a CUDA GPU runs every op it supports,
   on the layers `gpu_layers` places in its memory, and the CPU the rest;
   FLM_STATUS_INVALID_ARGUMENT saying why when there is no usable GPU or the library was
   built without the `cuda` feature); or "auto" ("cuda" when a usable GPU is present,
   else "cpu"). NULL means "auto". Borrowed for the call only.
   */
  const char *device;
  /*
   Positions of each session's KV cache (the context length), capped at the model's;
   0: the model's context, at most 4096.
   */
  size_t context;
  /*
   Precision of the activations that int8, int4, K-quant and Q8_0 weights are dotted
   against on the CPU: 0 or 8, int8 blocks (as llama.cpp; the fastest); 16, int8 codes
   plus their rounding residual (the logits of unrounded activations, at twice the
   integer work). Any other value is FLM_STATUS_INVALID_ARGUMENT.
   */
  uint32_t activation_bits;
  /*
   NUL-terminated element type of each session's KV cache: "f32"; "f16" (half the
   bytes attention reads, each key and value rounded to the nearest f16 as it is
   stored); or "auto" (f16 for a cache in a GPU's memory, f32 in host memory, where the
   caches of libflm's sessions live). NULL means "auto"; any other name is
   FLM_STATUS_INVALID_ARGUMENT. Borrowed for the call only.
   */
  const char *kv_dtype;
  /*
   NUL-terminated number of the model's first layers whose weights, KV caches and
   activations live in the GPU's memory (the rest in host memory, run by the CPU), as
   the CLI's `--gpu-layers`: "auto" places as many as the GPU's free memory holds after
   their KV caches; "0" keeps them all in host memory, the GPU running their ops one at
   a time from there. NULL means "auto"; without a GPU "auto" places nothing and a count
   above 0 is FLM_STATUS_INVALID_ARGUMENT, as is anything but "auto" or a count.
   Llama-graph models (ChatGLM-6B's graph stays in host memory under "auto").
   Borrowed for the call only.
   */
  const char *gpu_layers;
} FlmModelOptions;

/*
 Sampling parameters of flm_generate(); flm_sampling_default() gives a filled struct.
 The order of application is repetition penalty, temperature, top-k, top-p (as
 llama.cpp and Hugging Face `generate`).
 */
typedef struct FlmSampling {
  /*
   Softmax temperature, finite and >= 0; 0 is greedy (argmax).
   */
  float temperature;
  /*
   Sample among the `top_k` most likely tokens only; 0 disables.
   */
  size_t top_k;
  /*
   Nucleus sampling threshold in (0, 1]; 1 disables.
   */
  float top_p;
  /*
   CTRL repetition penalty (> 0) over the prompt and generated tokens; 1 disables.
   */
  float repeat_penalty;
  /*
   Seed of the random stream (ChaCha8): the same seed gives the same text.
   */
  uint64_t seed;
} FlmSampling;

/*
 Called by flm_generate() with each new piece of text: `len` bytes of UTF-8 at `piece`
 (not NUL-terminated, never empty, whole characters), borrowed for the call only, and
 the caller's `user_data`. Returning non-zero stops generation.
 */
typedef int (*FlmPieceCallback)(const char *piece, size_t len, void *user_data);

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/*
 The library version ("MAJOR.MINOR.PATCH"), a NUL-terminated static string owned by the
 library (never freed).
 */
const char *flm_version(void);

/*
 The message of the last call on the calling thread that returned an error (a status
 other than FLM_STATUS_OK and FLM_STATUS_STOPPED), or "" if there was none: a
 NUL-terminated UTF-8 string owned by the library, valid until the next failing call on
 this thread. Successful calls leave it unchanged.
 */
const char *flm_last_error(void);

/*
 Renders the conversation `messages` (`n_messages` turns, oldest first) with the model's
 chat template, as `flm chat` and `flm serve` build their prompts (the Jinja template of
 the model's files under transformers' `apply_chat_template` semantics, or the built-in
 ChatGLM2/ChatGLM3/GLM-4 format). With `add_generation_prompt` the prompt ends where
 the assistant's reply starts.

 `template_args` (`template_args_len` bytes of UTF-8; NULL or 0 bytes: none) is a JSON
 object of keyword arguments for a Jinja template, the variables of transformers'
 `apply_chat_template(messages, **kwargs)` (`flm serve`'s `chat_template_kwargs`), such
 as `{"enable_thinking": false}` for Qwen3; the built-in formats ignore them.

 `*text_len` receives the length of the prompt in bytes: UTF-8, not NUL-terminated,
 special tokens spelled out (`<s>`, `<|im_start|>`, ChatGLM's `[gMASK]sop`). It is
 written to `text` (capacity `text_capacity` bytes, owned by the caller) when it fits,
 else FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
 `text = NULL, text_capacity = 0` to ask for the size.

 The text is for display, logs and hosts that tokenize elsewhere: to generate, take the
 ids of flm_tokenize_chat() to flm_generate_tokens(). flm_tokenize() of the text does
 not give those ids for every tokenizer (SentencePiece files see a special token written
 in text as plain characters; ChatGLM's prompts are built token by token), and
 flm_generate() adds BOS before a text that may start with it already.

 Errors: FLM_STATUS_NULL_POINTER (`model`; `messages` or a message's pointer with a
 length above 0; `text_len`; `text` when the prompt is not empty), FLM_STATUS_INVALID_UTF8
 (a role, a content, `template_args`), FLM_STATUS_INVALID_ARGUMENT (`template_args` is
 not a JSON object, or sets `messages`, `tools` or `add_generation_prompt`),
 FLM_STATUS_NO_CHAT_TEMPLATE (the model has none), FLM_STATUS_TOKENIZER (the template
 refused the conversation: its `raise_exception` message, an unknown role of a ChatGLM
 format, a render past the template limits), FLM_STATUS_BUFFER_TOO_SMALL.

 # Safety
 `model` must be NULL or a live handle; `messages` NULL or `n_messages` readable
 structs, each pointer in them NULL or valid for its length; `template_args` NULL or
 `template_args_len` readable bytes; `text` NULL or `text_capacity` writable bytes;
 `text_len` NULL or valid for a write.
 */
enum FlmStatus flm_apply_chat_template(const struct FlmModel *model,
                                       const struct FlmChatMessage *messages,
                                       size_t n_messages,
                                       bool add_generation_prompt,
                                       const char *template_args,
                                       size_t template_args_len,
                                       char *text,
                                       size_t text_capacity,
                                       size_t *text_len);

/*
 The token ids of the chat prompt of flm_apply_chat_template() (same arguments): the ids
 `flm chat` and `flm serve` feed the model for this conversation, its BOS or ChatGLM
 prefix included where the template or format writes one. Generate the reply with
 flm_generate_tokens(session, ids, n, true, ...).

 `*n_ids` receives the number of ids; they are written to `ids` (capacity
 `ids_capacity` elements, owned by the caller) when they fit, else
 FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
 `ids = NULL, ids_capacity = 0` to ask for the size.

 Errors: those of flm_apply_chat_template() (`ids` and `n_ids` in place of `text` and
 `text_len`), and FLM_STATUS_TOKENIZER for a prompt the tokenizer cannot cut.

 # Safety
 As flm_apply_chat_template(); `ids` NULL or `ids_capacity` writable elements; `n_ids`
 NULL or valid for a write.
 */
enum FlmStatus flm_tokenize_chat(const struct FlmModel *model,
                                 const struct FlmChatMessage *messages,
                                 size_t n_messages,
                                 bool add_generation_prompt,
                                 const char *template_args,
                                 size_t template_args_len,
                                 uint32_t *ids,
                                 size_t ids_capacity,
                                 size_t *n_ids);

/*
 Loads the model at `path` (NUL-terminated; a llama2.c `.bin`, a `.flm` file, a GGUF
 file or a Hugging Face directory, detected from the bytes) with the tokenizer inside
 or beside it.

 `options` may be NULL (the defaults). On success `*out_model` receives a new handle
 that the caller owns and frees with flm_model_free(); on failure it is set to NULL.

 Errors: FLM_STATUS_NULL_POINTER (`path` or `out_model`), FLM_STATUS_IO (a missing or
 unreadable file), FLM_STATUS_FORMAT (a malformed model or tokenizer),
 FLM_STATUS_INVALID_ARGUMENT / FLM_STATUS_INVALID_UTF8 (options).

 # Safety
 `path` must be NULL or a NUL-terminated string; `options` NULL or a valid struct;
 `out_model` NULL or valid for a write.
 */
enum FlmStatus flm_model_load(const char *path,
                              const struct FlmModelOptions *options,
                              struct FlmModel **out_model);

/*
 Frees a model handle. Sessions created from it stay usable (they keep what they need
 alive). NULL is ignored.

 # Safety
 `model` must be NULL or a handle from flm_model_load() not freed before, and no other
 thread may be using it.
 */
void flm_model_free(struct FlmModel *model);

/*
 Encodes `text_len` bytes of UTF-8 `text` into token ids, with the begin-of-sequence
 token first if `add_bos`. `*n_ids` receives the number of ids the text encodes to;
 they are written to `ids` (capacity `ids_capacity` elements, owned by the caller) when
 they fit, else FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
 `ids = NULL, ids_capacity = 0` to ask for the size.

 Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INVALID_UTF8, FLM_STATUS_BUFFER_TOO_SMALL,
 FLM_STATUS_INVALID_ARGUMENT (`add_bos` with a tokenizer that has no BOS token),
 FLM_STATUS_TOKENIZER (the tokenizer cannot cut this text).

 # Safety
 `model` must be NULL or a live handle; `text` NULL or `text_len` readable bytes; `ids`
 NULL or `ids_capacity` writable elements; `n_ids` NULL or valid for a write.
 */
enum FlmStatus flm_tokenize(const struct FlmModel *model,
                            const char *text,
                            size_t text_len,
                            bool add_bos,
                            uint32_t *ids,
                            size_t ids_capacity,
                            size_t *n_ids);

/*
 Decodes `n_ids` token ids into UTF-8 text, not NUL-terminated, as SentencePiece
 `Decode` does (control tokens as nothing, the leading space of the first piece
 dropped). `*text_len` receives the length in bytes; the text is
 written to `text` (capacity `text_capacity` bytes, owned by the caller) when it fits,
 else FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
 `text = NULL, text_capacity = 0` to ask for the size.

 Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_TOKEN_OUT_OF_RANGE (an id outside the
 vocabulary), FLM_STATUS_BUFFER_TOO_SMALL.

 # Safety
 `model` must be NULL or a live handle; `ids` NULL or `n_ids` readable elements; `text`
 NULL or `text_capacity` writable bytes; `text_len` NULL or valid for a write.
 */
enum FlmStatus flm_detokenize(const struct FlmModel *model,
                              const uint32_t *ids,
                              size_t n_ids,
                              char *text,
                              size_t text_capacity,
                              size_t *text_len);

/*
 The sampling defaults of `flm run`: temperature 0.8, top-k 40, top-p 0.95, no
 repetition penalty, seed 0.
 */
struct FlmSampling flm_sampling_default(void);

/*
 Creates a session over `model`, with a KV cache for the model's context (see
 FlmModelOptions.context). On success `*out_session` receives a new handle that the
 caller owns and frees with flm_session_free(); on failure it is set to NULL. The
 session keeps the model's weights alive: flm_model_free() may come first.

 Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INTERNAL (allocation size overflow).

 # Safety
 `model` must be NULL or a live handle; `out_session` NULL or valid for a write.
 */
enum FlmStatus flm_session_new(const struct FlmModel *model, struct FlmSession **out_session);

/*
 Frees a session handle. NULL is ignored.

 # Safety
 `session` must be NULL or a handle from flm_session_new() not freed before, and no
 other thread may be using it.
 */
void flm_session_free(struct FlmSession *session);

/*
 Generates a continuation of the UTF-8 `prompt` (`prompt_len` bytes; the
 begin-of-sequence token is added, the prompt itself is not handed out) with the
 session's KV cache: prefill (only after the longest common prefix of the prompt's
 tokens and the sequence the cache holds from the previous call, so a multi-turn chat
 whose prompt repeats the conversation costs only the new turn; ChatGLM-6B always
 restarts), then one token per decode step, until an end-of-sequence token (the
 model's, or a stop token of the tokenizer's chat format), `max_tokens` tokens, a full
 context, or `callback` returning non-zero. The text is handed to `callback` (may be NULL) piece by piece;
 `flm run` prints the same pieces. `sampling` may be NULL for greedy decoding. A chat
 prompt is generated from its ids instead: flm_tokenize_chat(), then
 flm_generate_tokens().
 `n_generated` (may be NULL) receives the number of tokens generated.

 Returns FLM_STATUS_OK, or FLM_STATUS_STOPPED when the callback stopped generation.
 Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INVALID_UTF8 (`prompt`),
 FLM_STATUS_INVALID_ARGUMENT (sampling parameters), FLM_STATUS_CONTEXT_OVERFLOW (the
 prompt fills the context), FLM_STATUS_TOKENIZER (the tokenizer cannot cut the prompt).

 # Safety
 `session` must be NULL or a live handle not used by another thread during the call;
 `prompt` NULL or `prompt_len` readable bytes; `sampling` NULL or a valid struct;
 `n_generated` NULL or valid for a write; `callback` must be safe to call with
 `user_data`, and must not unwind (C++ exceptions, longjmp) through this function.
 */
enum FlmStatus flm_generate(struct FlmSession *session,
                            const char *prompt,
                            size_t prompt_len,
                            const struct FlmSampling *sampling,
                            size_t max_tokens,
                            FlmPieceCallback callback,
                            void *user_data,
                            size_t *n_generated);

/*
 Generates a continuation of the token ids `ids` (`n_ids` of them, at least 1): the whole
 sequence from position 0, as flm_tokenize_chat() or flm_tokenize(.., add_bos = true)
 give it, to which nothing is added (no BOS). Otherwise as flm_generate(): the prefill
 skips what the session's KV cache holds of it, the ids are not handed out, the reply is.

 With `at_start` the reply is decoded as the start of a text (the leading space of its
 first piece dropped where the tokenizer adds a dummy prefix), as `flm chat` prints a
 reply after a chat prompt: pass true for the ids of flm_tokenize_chat(), false to
 continue a text (flm_generate() passes true only for an empty prompt).

 Returns FLM_STATUS_OK, or FLM_STATUS_STOPPED when the callback stopped generation.
 Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INVALID_ARGUMENT (no ids, sampling
 parameters, a ChatGLM-6B prompt without its `[gMASK]` and `sop` tokens),
 FLM_STATUS_TOKEN_OUT_OF_RANGE (an id outside the vocabulary), FLM_STATUS_CONTEXT_OVERFLOW
 (the prompt fills the context).

 # Safety
 As flm_generate(), with `ids` NULL or `n_ids` readable elements in place of `prompt`.
 */
enum FlmStatus flm_generate_tokens(struct FlmSession *session,
                                   const uint32_t *ids,
                                   size_t n_ids,
                                   bool at_start,
                                   const struct FlmSampling *sampling,
                                   size_t max_tokens,
                                   FlmPieceCallback callback,
                                   void *user_data,
                                   size_t *n_generated);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* FLM_H */
