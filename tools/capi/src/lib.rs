//! libflm: the C ABI of flm, for host applications (C, C++, Python through ctypes...).
//!
//! Built as a shared library (`libflm.so`) and a static one (`libflm.a`, which needs
//! `-lpthread -ldl -lm`); the header `include/flm.h` is generated from this crate by
//! cbindgen and checked in (`tests/header.rs` fails when it is out of date).
//!
//! Design, after the C APIs of llama.cpp and SQLite:
//! - Opaque handles: an [`FlmModel`] (weights behind an `Arc`, tokenizer, a rayon thread
//!   pool of `threads` workers) and any number of [`FlmSession`]s over it, each with its
//!   own KV cache ([`flm_models::session::Session`], the generation loop of `flm run`).
//!   Sessions run concurrently on different threads; their forward passes share the
//!   model's pool.
//! - Every fallible call returns an [`FlmStatus`]; the message of the last failure is
//!   thread-local ([`flm_last_error`]).
//! - Every entry point runs under `catch_unwind`, so no panic unwinds into C.
//! - Text has explicit lengths; output buffers are the caller's, with a size query.
//! - Chat prompts come from the model's chat template ([`flm_apply_chat_template`] for the
//!   text, [`flm_tokenize_chat`] for the ids that [`flm_generate_tokens`] continues), as
//!   `flm chat` and `flm serve` build them, so that no host writes ChatML by hand.

mod chat;
mod model;
mod session;
mod status;

use std::ffi::c_char;

pub use chat::{flm_apply_chat_template, flm_tokenize_chat, FlmChatMessage};
pub use model::{
    flm_detokenize, flm_model_free, flm_model_load, flm_tokenize, FlmModel, FlmModelOptions,
};
pub use session::{
    flm_generate, flm_generate_tokens, flm_sampling_default, flm_session_free, flm_session_new,
    FlmPieceCallback, FlmSampling, FlmSession,
};
pub use status::FlmStatus;

/// The library version ("MAJOR.MINOR.PATCH"), a NUL-terminated static string owned by the
/// library (never freed).
#[no_mangle]
pub extern "C" fn flm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the last call on the calling thread that returned an error (a status
/// other than FLM_STATUS_OK and FLM_STATUS_STOPPED), or "" if there was none: a
/// NUL-terminated UTF-8 string owned by the library, valid until the next failing call on
/// this thread. Successful calls leave it unchanged.
#[no_mangle]
pub extern "C" fn flm_last_error() -> *const c_char {
    status::last_error()
}
