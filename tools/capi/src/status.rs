//! Status codes, the thread-local last error, the panic guard of every entry point, and
//! the checked reading of pointer arguments.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{self, AssertUnwindSafe};

use flm_core::Error as CoreError;
use flm_models::Error as ModelError;
use flm_tokenizer::Error as TokenizerError;

/// The result of every fallible call. `FLM_STATUS_OK` is 0; every other value but
/// `FLM_STATUS_STOPPED` is an error whose message `flm_last_error()` returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlmStatus {
    /// Success.
    Ok = 0,
    /// flm_generate(): the callback returned non-zero and generation stopped early; not an
    /// error (the text handed out so far is valid, flm_last_error() is not changed).
    Stopped = 1,
    /// A pointer argument that must not be NULL was NULL.
    NullPointer = 2,
    /// A text argument is not valid UTF-8.
    InvalidUtf8 = 3,
    /// An argument is out of its documented range (sampling parameters, threads, device
    /// name, context of 0, ...).
    InvalidArgument = 4,
    /// A token id is not in the model's vocabulary.
    TokenOutOfRange = 5,
    /// The caller's buffer is too small; the needed size was stored in the length output.
    BufferTooSmall = 6,
    /// A file could not be opened or read (a missing file, no permission).
    Io = 7,
    /// A model or tokenizer file is malformed, inconsistent or of an unsupported kind.
    Format = 8,
    /// The prompt does not fit in the session's context (it must leave room for one
    /// generated token).
    ContextOverflow = 9,
    /// An internal error (a bug of flm, caught at the boundary instead of unwinding).
    Internal = 10,
    /// A text could not be tokenised, though the tokenizer file is sound: its
    /// pre-tokenisation regex gave up on the text (possible only for the rare patterns
    /// that flm runs on a backtracking engine, see flm_tokenizer's `split.rs`); or the
    /// model's chat template refused the conversation of flm_apply_chat_template() or
    /// flm_tokenize_chat() (it called `raise_exception`, as Gemma's does for a system
    /// turn; a role its format does not know; a render past the template limits).
    Tokenizer = 11,
    /// An operation invalid in the current state of a model or session, though the files
    /// and arguments are sound: a step out of order (a model changed after sessions of it
    /// were made, a sequence not started at position 0). Unlike `FLM_STATUS_FORMAT`, it
    /// says nothing about the model file.
    State = 12,
    /// flm_apply_chat_template(), flm_tokenize_chat(): the model has no chat template (no
    /// `chat_template` in its tokenizer_config.json, no GGUF `tokenizer.chat_template`, no
    /// built-in ChatGLM format), so the host must format the prompt itself.
    NoChatTemplate = 13,
}

/// An error on its way to the caller: a status and its message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: FlmStatus,
    pub message: String,
}

impl Failure {
    pub fn new(status: FlmStatus, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }
}

/// The status of a tokenizer error: every kind named, so that a new one must be given its
/// status here.
fn tokenizer_status(e: &TokenizerError) -> FlmStatus {
    match e {
        TokenizerError::IdOutOfRange { .. } => FlmStatus::TokenOutOfRange,
        TokenizerError::Io { .. } => FlmStatus::Io,
        TokenizerError::NoBos => FlmStatus::InvalidArgument,
        TokenizerError::Encode(_) => FlmStatus::Tokenizer,
        TokenizerError::NotATokenizer(_)
        | TokenizerError::Truncated(_)
        | TokenizerError::Invalid(_)
        | TokenizerError::Unsupported(_)
        | TokenizerError::Template(_) => FlmStatus::Format,
    }
}

/// The status of an error of flm-core, every kind named (as in [`tokenizer_status`]). The
/// kinds with no status of their own (a shape or dtype mismatch between an op's tensors, a
/// read-only tensor written to, an op no device supports, operands in two memories, a
/// device failure, a tensor-parallel rank's, which the C ABI does not start) are never
/// caused by a caller's arguments or files: a file whose tensors do not fit its model is
/// reported as a [`ModelError::Format`] by the loader.
fn core_status(e: &CoreError) -> FlmStatus {
    match e {
        CoreError::TokenOutOfRange { .. } => FlmStatus::TokenOutOfRange,
        CoreError::ContextOverflow { .. } => FlmStatus::ContextOverflow,
        CoreError::InvalidArgument(_) => FlmStatus::InvalidArgument,
        CoreError::Io { .. } => FlmStatus::Io,
        CoreError::Format { .. } => FlmStatus::Format,
        CoreError::Shape { .. }
        | CoreError::DType { .. }
        | CoreError::OutOfBounds(_)
        | CoreError::Unsupported(_)
        | CoreError::ReadOnly
        | CoreError::Placement(_)
        | CoreError::Device(_)
        | CoreError::Collective { .. } => FlmStatus::Internal,
    }
}

impl From<ModelError> for Failure {
    fn from(e: ModelError) -> Failure {
        let status = match &e {
            ModelError::Core(c) => core_status(c),
            ModelError::Io { .. } => FlmStatus::Io,
            ModelError::Format { .. } | ModelError::Config(_) => FlmStatus::Format,
            ModelError::State(_) => FlmStatus::State,
            ModelError::Tokenizer(t) => tokenizer_status(t),
            ModelError::PromptTooLong { .. } => FlmStatus::ContextOverflow,
            ModelError::InvalidInput(_) => FlmStatus::InvalidArgument,
            // The C ABI does not run the serving engine.
            ModelError::QueueFull { .. } | ModelError::EngineStopped => FlmStatus::Internal,
        };
        Failure::new(status, e.to_string())
    }
}

impl From<TokenizerError> for Failure {
    fn from(e: TokenizerError) -> Failure {
        Failure::new(tokenizer_status(&e), e.to_string())
    }
}

impl From<CoreError> for Failure {
    fn from(e: CoreError) -> Failure {
        Failure::new(core_status(&e), e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with`: a call made while this thread's locals are being destroyed (from a
    // destructor of another thread-local) must not panic outside the guard.
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = message);
}

/// The message of the last call on this thread that returned an error, or "" if none.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|last| last.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Runs the body of an entry point: its error becomes a status and the thread's last error,
/// and a panic becomes `FLM_STATUS_INTERNAL` instead of unwinding into C (undefined
/// behaviour).
pub(crate) fn guard(body: impl FnOnce() -> Result<FlmStatus, Failure>) -> FlmStatus {
    let failure = match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => return status,
        Ok(Err(failure)) => failure,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Failure::new(FlmStatus::Internal, format!("internal error: {what}"))
        }
    };
    set_last_error(&failure.message);
    failure.status
}

/// `ptr` as a reference, or `FLM_STATUS_NULL_POINTER` naming `what`.
///
/// # Safety
/// A non-null `ptr` must point to a valid `T` that outlives `'a` and that nothing mutates
/// during `'a`.
pub(crate) unsafe fn arg_ref<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: non-null and valid for 'a by this function's contract.
    unsafe { ptr.as_ref() }.ok_or_else(|| null(what))
}

/// `ptr` as an exclusive reference, or `FLM_STATUS_NULL_POINTER` naming `what`.
///
/// # Safety
/// A non-null `ptr` must point to a valid `T` that outlives `'a` and that nothing else
/// accesses during `'a`.
pub(crate) unsafe fn arg_mut<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: non-null, valid and unaliased for 'a by this function's contract.
    unsafe { ptr.as_mut() }.ok_or_else(|| null(what))
}

/// The `len` elements at `ptr`; `ptr` may be NULL only when `len` is 0.
///
/// # Safety
/// A non-null `ptr` must point to `len` initialised `T`s valid for `'a`.
pub(crate) unsafe fn arg_slice<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
) -> Result<&'a [T], Failure> {
    if ptr.is_null() {
        return if len == 0 { Ok(&[]) } else { Err(null(what)) };
    }
    // SAFETY: non-null and pointing to `len` valid elements by this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The UTF-8 text of `len` bytes at `ptr` (NULL only when `len` is 0).
///
/// # Safety
/// As [`arg_slice`] for `len` bytes.
pub(crate) unsafe fn arg_str<'a>(
    ptr: *const c_char,
    len: usize,
    what: &str,
) -> Result<&'a str, Failure> {
    // SAFETY: forwarded contract.
    let bytes = unsafe { arg_slice(ptr.cast::<u8>(), len, what) }?;
    std::str::from_utf8(bytes).map_err(|e| {
        Failure::new(
            FlmStatus::InvalidUtf8,
            format!("{what} is not valid UTF-8: {e}"),
        )
    })
}

/// The NUL-terminated string at `ptr`.
///
/// # Safety
/// A non-null `ptr` must point to a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn arg_c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a CStr, Failure> {
    if ptr.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null and NUL-terminated by this function's contract.
    Ok(unsafe { CStr::from_ptr(ptr) })
}

/// Stores `value` through the output pointer `out` (named `what`).
///
/// # Safety
/// A non-null `out` must be valid for one write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null and valid for a write by this function's contract; `write` does not
    // read or drop the (possibly uninitialised) old value.
    unsafe { out.write(value) };
    Ok(())
}

/// The body of a constructor entry point: `*out` (named `what`) is set to NULL first, so
/// that a failure leaves NULL there, then to a new handle owning what `make` builds, which
/// the caller frees with [`free_handle`].
///
/// # Safety
/// `out` must be NULL or valid for writes; `make` reads its pointers under the entry
/// point's contract.
pub(crate) unsafe fn new_handle<T>(
    out: *mut *mut T,
    what: &str,
    make: impl FnOnce() -> Result<T, Failure>,
) -> FlmStatus {
    guard(|| {
        // SAFETY: `out` is NULL or writable (this function's contract).
        unsafe { write_out(out, std::ptr::null_mut(), what) }?;
        let handle = Box::new(make()?);
        // SAFETY: as above; the caller now owns the box (freed by free_handle).
        unsafe { write_out(out, Box::into_raw(handle), what) }?;
        Ok(FlmStatus::Ok)
    })
}

/// The body of a `_free` entry point: drops the handle from [`new_handle`]; NULL is ignored.
///
/// # Safety
/// `handle` must be NULL or a handle from [`new_handle`] not freed before, and no other
/// thread may be using it.
pub(crate) unsafe fn free_handle<T>(handle: *mut T) {
    guard(|| {
        if !handle.is_null() {
            // SAFETY: a live handle from Box::into_raw in new_handle, freed once.
            drop(unsafe { Box::from_raw(handle) });
        }
        Ok(FlmStatus::Ok)
    });
}

fn null(what: &str) -> Failure {
    Failure::new(FlmStatus::NullPointer, format!("{what} is NULL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_the_tokenizer_cannot_cut_is_not_a_format_error() {
        let failure = Failure::from(TokenizerError::Encode("the regex gave up".into()));
        assert_eq!(failure.status, FlmStatus::Tokenizer);
        assert!(failure.message.contains("the regex gave up"));
        // Through the models' error too, as flm_generate meets it.
        let failure = Failure::from(ModelError::Tokenizer(TokenizerError::Encode(String::new())));
        assert_eq!(failure.status, FlmStatus::Tokenizer);
        // Appended: the existing values keep their numbers.
        assert_eq!(FlmStatus::Internal as i32, 10);
        assert_eq!(FlmStatus::Tokenizer as i32, 11);
        let bad_file = Failure::from(TokenizerError::Invalid("a merge".into()));
        assert_eq!(bad_file.status, FlmStatus::Format);
    }

    #[test]
    fn a_call_out_of_order_is_a_state_error_not_a_format_error() {
        // A model whose KV cache dtype is changed after an instance of it is made: sound
        // file, sound arguments, wrong moment.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/stories260K/stories260K.bin");
        let ckpt = flm_models::import::load(&path).unwrap();
        let model = flm_models::SharedModel::new(&ckpt).unwrap();
        let _instance = model.instance().unwrap();
        let err = model.with_kv_dtype(flm_core::KvDtype::F16).err().unwrap();
        assert!(matches!(err, ModelError::State(_)), "{err}");
        let failure = Failure::from(err);
        assert_eq!(failure.status, FlmStatus::State);
        assert!(
            failure.message.contains("before any instance"),
            "{}",
            failure.message
        );
        // Appended after the last existing value.
        assert_eq!(FlmStatus::State as i32, 12);
    }
}
