//! Sessions: creating, freeing and generating.

use std::ffi::{c_char, c_int, c_void};
use std::ops::ControlFlow;
use std::sync::Arc;

use flm_core::{Executor, SamplerConfig};
use flm_models::session::{GenerateParams, Session, StopReason};

use crate::model::FlmModel;
use crate::status::{
    arg_mut, arg_ref, arg_slice, arg_str, free_handle, guard, new_handle, write_out, Failure,
    FlmStatus,
};

/// Sampling parameters of flm_generate(); flm_sampling_default() gives a filled struct.
/// The order of application is repetition penalty, temperature, top-k, top-p (as
/// llama.cpp and Hugging Face `generate`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FlmSampling {
    /// Softmax temperature, finite and >= 0; 0 is greedy (argmax).
    pub temperature: f32,
    /// Sample among the `top_k` most likely tokens only; 0 disables.
    pub top_k: usize,
    /// Nucleus sampling threshold in (0, 1]; 1 disables.
    pub top_p: f32,
    /// CTRL repetition penalty (> 0) over the prompt and generated tokens; 1 disables.
    pub repeat_penalty: f32,
    /// Seed of the random stream (ChaCha8): the same seed gives the same text.
    pub seed: u64,
}

/// The sampling defaults of `flm run`: temperature 0.8, top-k 40, top-p 0.95, no
/// repetition penalty, seed 0.
#[no_mangle]
pub extern "C" fn flm_sampling_default() -> FlmSampling {
    FlmSampling {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        repeat_penalty: 1.0,
        seed: 0,
    }
}

/// A generation session (opaque): its own KV cache over a model's shared weights. Use
/// one session from one thread at a time; different sessions may run on different
/// threads at the same time.
pub struct FlmSession {
    session: Session,
    exec: Arc<Executor>,
}

// A session may move between host threads and a model is used from several at once.
const _: fn() = || {
    fn movable<T: Send>() {}
    fn shared<T: Send + Sync>() {}
    movable::<FlmSession>();
    shared::<FlmModel>();
};

/// Called by flm_generate() with each new piece of text: `len` bytes of UTF-8 at `piece`
/// (not NUL-terminated, never empty, whole characters), borrowed for the call only, and
/// the caller's `user_data`. Returning non-zero stops generation.
pub type FlmPieceCallback =
    Option<unsafe extern "C" fn(piece: *const c_char, len: usize, user_data: *mut c_void) -> c_int>;

/// Creates a session over `model`, with a KV cache for the model's context (see
/// FlmModelOptions.context). On success `*out_session` receives a new handle that the
/// caller owns and frees with flm_session_free(); on failure it is set to NULL. The
/// session keeps the model's weights alive: flm_model_free() may come first.
///
/// Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INTERNAL (allocation size overflow).
///
/// # Safety
/// `model` must be NULL or a live handle; `out_session` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn flm_session_new(
    model: *const FlmModel,
    out_session: *mut *mut FlmSession,
) -> FlmStatus {
    let create = || {
        // SAFETY: `model` is NULL or a live handle (this function's contract).
        let model = unsafe { arg_ref(model, "model") }?;
        let instance = model.model.instance()?;
        Ok(FlmSession {
            session: Session::new(instance, Arc::clone(&model.tokenizer))?,
            exec: Arc::clone(&model.exec),
        })
    };
    // SAFETY: `out_session` is NULL or writable (this function's contract).
    unsafe { new_handle(out_session, "out_session", create) }
}

/// Frees a session handle. NULL is ignored.
///
/// # Safety
/// `session` must be NULL or a handle from flm_session_new() not freed before, and no
/// other thread may be using it.
#[no_mangle]
pub unsafe extern "C" fn flm_session_free(session: *mut FlmSession) {
    // SAFETY: this function's contract.
    unsafe { free_handle(session) }
}

/// Generates a continuation of the UTF-8 `prompt` (`prompt_len` bytes; the
/// begin-of-sequence token is added, the prompt itself is not handed out) with the
/// session's KV cache: prefill (only after the longest common prefix of the prompt's
/// tokens and the sequence the cache holds from the previous call, so a multi-turn chat
/// whose prompt repeats the conversation costs only the new turn; ChatGLM-6B always
/// restarts), then one token per decode step, until an end-of-sequence token (the
/// model's, or a stop token of the tokenizer's chat format), `max_tokens` tokens, a full
/// context, or `callback` returning non-zero. The text is handed to `callback` (may be NULL) piece by piece;
/// `flm run` prints the same pieces. `sampling` may be NULL for greedy decoding. A chat
/// prompt is generated from its ids instead: flm_tokenize_chat(), then
/// flm_generate_tokens().
/// `n_generated` (may be NULL) receives the number of tokens generated.
///
/// Returns FLM_STATUS_OK, or FLM_STATUS_STOPPED when the callback stopped generation.
/// Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INVALID_UTF8 (`prompt`),
/// FLM_STATUS_INVALID_ARGUMENT (sampling parameters), FLM_STATUS_CONTEXT_OVERFLOW (the
/// prompt fills the context), FLM_STATUS_TOKENIZER (the tokenizer cannot cut the prompt).
///
/// # Safety
/// `session` must be NULL or a live handle not used by another thread during the call;
/// `prompt` NULL or `prompt_len` readable bytes; `sampling` NULL or a valid struct;
/// `n_generated` NULL or valid for a write; `callback` must be safe to call with
/// `user_data`, and must not unwind (C++ exceptions, longjmp) through this function.
#[no_mangle]
pub unsafe extern "C" fn flm_generate(
    session: *mut FlmSession,
    prompt: *const c_char,
    prompt_len: usize,
    sampling: *const FlmSampling,
    max_tokens: usize,
    callback: FlmPieceCallback,
    user_data: *mut c_void,
    n_generated: *mut usize,
) -> FlmStatus {
    guard(|| {
        // SAFETY: the pointers satisfy this function's contract.
        let session = unsafe { arg_mut(session, "session") }?;
        // SAFETY: as above.
        let prompt = unsafe { arg_str(prompt, prompt_len, "prompt") }?;
        // SAFETY: as above.
        unsafe {
            run(
                session,
                Prompt::Text(prompt),
                sampling,
                max_tokens,
                (callback, user_data),
                n_generated,
            )
        }
    })
}

/// Generates a continuation of the token ids `ids` (`n_ids` of them, at least 1): the whole
/// sequence from position 0, as flm_tokenize_chat() or flm_tokenize(.., add_bos = true)
/// give it, to which nothing is added (no BOS). Otherwise as flm_generate(): the prefill
/// skips what the session's KV cache holds of it, the ids are not handed out, the reply is.
///
/// With `at_start` the reply is decoded as the start of a text (the leading space of its
/// first piece dropped where the tokenizer adds a dummy prefix), as `flm chat` prints a
/// reply after a chat prompt: pass true for the ids of flm_tokenize_chat(), false to
/// continue a text (flm_generate() passes true only for an empty prompt).
///
/// Returns FLM_STATUS_OK, or FLM_STATUS_STOPPED when the callback stopped generation.
/// Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INVALID_ARGUMENT (no ids, sampling
/// parameters, a ChatGLM-6B prompt without its `[gMASK]` and `sop` tokens),
/// FLM_STATUS_TOKEN_OUT_OF_RANGE (an id outside the vocabulary), FLM_STATUS_CONTEXT_OVERFLOW
/// (the prompt fills the context).
///
/// # Safety
/// As flm_generate(), with `ids` NULL or `n_ids` readable elements in place of `prompt`.
#[no_mangle]
pub unsafe extern "C" fn flm_generate_tokens(
    session: *mut FlmSession,
    ids: *const u32,
    n_ids: usize,
    at_start: bool,
    sampling: *const FlmSampling,
    max_tokens: usize,
    callback: FlmPieceCallback,
    user_data: *mut c_void,
    n_generated: *mut usize,
) -> FlmStatus {
    guard(|| {
        // SAFETY: the pointers satisfy this function's contract.
        let session = unsafe { arg_mut(session, "session") }?;
        // SAFETY: as above.
        let ids = unsafe { arg_slice(ids, n_ids, "ids") }?;
        if ids.is_empty() {
            return Err(Failure::new(
                FlmStatus::InvalidArgument,
                "ids is empty: a prompt has at least one token (BOS)",
            ));
        }
        // SAFETY: as above.
        unsafe {
            run(
                session,
                Prompt::Ids(ids.to_vec(), at_start),
                sampling,
                max_tokens,
                (callback, user_data),
                n_generated,
            )
        }
    })
}

/// What a generation starts from.
enum Prompt<'a> {
    /// A text, encoded with BOS ([`Session::generate`]).
    Text(&'a str),
    /// Token ids, and whether the reply is the start of a text
    /// ([`Session::generate_tokens`]).
    Ids(Vec<u32>, bool),
}

/// The generation of flm_generate() and flm_generate_tokens() after their prompt is read.
///
/// # Safety
/// `sampling`, `callback`, `user_data` and `n_generated` satisfy flm_generate()'s contract.
unsafe fn run(
    session: &mut FlmSession,
    prompt: Prompt<'_>,
    sampling: *const FlmSampling,
    max_tokens: usize,
    (callback, user_data): (FlmPieceCallback, *mut c_void),
    n_generated: *mut usize,
) -> Result<FlmStatus, Failure> {
    // SAFETY: the pointers satisfy this function's contract.
    let sampling = unsafe { sampling.as_ref() }.copied();
    let sampler = sampling.map_or_else(SamplerConfig::default, |s| SamplerConfig {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        repeat_penalty: s.repeat_penalty,
        seed: s.seed,
        ..SamplerConfig::default()
    });
    let params = GenerateParams {
        sampler,
        max_tokens,
        ignore_eos: false,
        stop: session.session.tokenizer().chat_stop_ids(),
    };
    let on_piece = |piece: flm_models::session::Piece<'_>| match callback {
        Some(f) if !piece.text.is_empty() => {
            // SAFETY: the pointer and length describe `piece.text`, alive for the
            // call; the callback is callable with `user_data` (contract above).
            let stop = unsafe { f(piece.text.as_ptr().cast(), piece.text.len(), user_data) };
            if stop != 0 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
        _ => ControlFlow::Continue(()),
    };
    let exec = &session.exec;
    let generation = match prompt {
        Prompt::Text(text) => session.session.generate(exec, text, &params, on_piece)?,
        Prompt::Ids(ids, at_start) => session
            .session
            .generate_tokens(exec, ids, at_start, &params, on_piece)?,
    };
    if !n_generated.is_null() {
        // SAFETY: non-null and valid for a write (contract above).
        unsafe { write_out(n_generated, generation.generated, "n_generated") }?;
    }
    Ok(match generation.stop {
        StopReason::Stopped => FlmStatus::Stopped,
        _ => FlmStatus::Ok,
    })
}
