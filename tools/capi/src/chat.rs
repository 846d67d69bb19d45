//! Chat prompts: a conversation rendered by the model's chat template, as text
//! ([`flm_apply_chat_template`]) and as the token ids to generate from
//! ([`flm_tokenize_chat`], then `flm_generate_tokens`).
//!
//! Both are [`flm_tokenizer::Tokenizer::encode_chat_with_args`], the prompt of `flm chat`
//! and of `flm serve`'s chat completions: the model's Jinja template (Hugging Face
//! `tokenizer_config.json` `chat_template`, GGUF `tokenizer.chat_template`) rendered under
//! transformers' `apply_chat_template` semantics with the host's keyword arguments, or a
//! built-in ChatGLM format. The ids are not those of the text passed to `flm_tokenize`:
//! the text spells out the special tokens a template writes (`bos_token`, `<|im_start|>`),
//! which SentencePiece files do not recognise in plain text, and a template that writes
//! `bos_token` already starts with BOS, which `flm_tokenize(.., add_bos = true)` and
//! `flm_generate` would add a second time. Hence the two calls, and a generation from ids.
//!
//! The keyword arguments travel as one JSON object, the shape of `chat_template_kwargs`
//! of `flm serve`'s requests, rather than as C key/value arrays: their values are any
//! JSON (booleans such as Qwen3's `enable_thinking`, strings, lists, objects), which a
//! C struct would have to re-invent.

use std::ffi::c_char;

use flm_tokenizer::{ChatPrompt, Error as TokenizerError, Message, TemplateArgs};

use crate::model::{copy_out, FlmModel};
use crate::status::{arg_ref, arg_slice, arg_str, guard, Failure, FlmStatus};

/// One turn of a conversation, for flm_apply_chat_template() and flm_tokenize_chat():
/// UTF-8 texts with their lengths in bytes (no terminating NUL needed), borrowed for the
/// call only. A pointer may be NULL when its length is 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FlmChatMessage {
    /// The role: "system", "user", "assistant", or another the model's template knows
    /// (such as "tool"; ChatGLM3 and GLM-4 have "observation").
    pub role: *const c_char,
    /// Length of `role` in bytes.
    pub role_len: usize,
    /// The text of the turn.
    pub content: *const c_char,
    /// Length of `content` in bytes.
    pub content_len: usize,
}

/// The conversation `messages[..n_messages]` as [`Message`]s.
///
/// # Safety
/// `messages` must be NULL or point to `n_messages` structs whose pointers satisfy the
/// [`FlmChatMessage`] docs.
unsafe fn read_messages(
    messages: *const FlmChatMessage,
    n_messages: usize,
) -> Result<Vec<Message>, Failure> {
    // SAFETY: this function's contract.
    let messages = unsafe { arg_slice(messages, n_messages, "messages") }?;
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // SAFETY: the struct's pointers satisfy its docs (this function's contract).
            let role = unsafe { arg_str(m.role, m.role_len, &format!("messages[{i}].role")) }?;
            // SAFETY: as above.
            let content =
                unsafe { arg_str(m.content, m.content_len, &format!("messages[{i}].content")) }?;
            Ok(Message::new(role, content))
        })
        .collect()
}

/// The keyword arguments of the template from the JSON object text at `json`
/// (`len` bytes; none when `len` is 0).
///
/// # Safety
/// `json` must be NULL or point to `len` readable bytes.
unsafe fn read_template_args(json: *const c_char, len: usize) -> Result<TemplateArgs, Failure> {
    if len == 0 {
        return Ok(TemplateArgs::new());
    }
    // SAFETY: this function's contract.
    let text = unsafe { arg_str(json, len, "template_args") }?;
    let invalid = |why: String| Failure::new(FlmStatus::InvalidArgument, why);
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| invalid(format!("template_args is not valid JSON: {e}")))?;
    let serde_json::Value::Object(args) = value else {
        return Err(invalid(format!(
            "template_args is not a JSON object (of the template's variables): {value}"
        )));
    };
    flm_tokenizer::check_template_args(&args)
        .map_err(|e| invalid(format!("template_args: {e}")))?;
    Ok(args)
}

/// The chat prompt of the arguments of [`flm_apply_chat_template`] and
/// [`flm_tokenize_chat`].
///
/// # Safety
/// The pointers satisfy the contract of those functions.
unsafe fn chat_prompt(
    model: *const FlmModel,
    messages: *const FlmChatMessage,
    n_messages: usize,
    add_generation_prompt: bool,
    template_args: *const c_char,
    template_args_len: usize,
) -> Result<ChatPrompt, Failure> {
    // SAFETY: this function's contract.
    let model = unsafe { arg_ref(model, "model") }?;
    // SAFETY: as above.
    let messages = unsafe { read_messages(messages, n_messages) }?;
    // SAFETY: as above.
    let args = unsafe { read_template_args(template_args, template_args_len) }?;
    let tokenizer = &model.tokenizer;
    if !tokenizer.can_chat() {
        return Err(Failure::new(
            FlmStatus::NoChatTemplate,
            "the model has no chat template (no chat_template in its tokenizer_config.json, \
             no GGUF tokenizer.chat_template, no built-in ChatGLM format): format the prompt \
             yourself and pass it to flm_generate()",
        ));
    }
    tokenizer
        .encode_chat_with_args(&messages, add_generation_prompt, &args)
        .map_err(|e| match e {
            // The template or format refused this conversation: the model's files are sound
            // (a template that does not compile is refused when the model is loaded).
            TokenizerError::Template(_) => Failure::new(FlmStatus::Tokenizer, e.to_string()),
            e => Failure::from(e),
        })
}

/// Renders the conversation `messages` (`n_messages` turns, oldest first) with the model's
/// chat template, as `flm chat` and `flm serve` build their prompts (the Jinja template of
/// the model's files under transformers' `apply_chat_template` semantics, or the built-in
/// ChatGLM2/ChatGLM3/GLM-4 format). With `add_generation_prompt` the prompt ends where
/// the assistant's reply starts.
///
/// `template_args` (`template_args_len` bytes of UTF-8; NULL or 0 bytes: none) is a JSON
/// object of keyword arguments for a Jinja template, the variables of transformers'
/// `apply_chat_template(messages, **kwargs)` (`flm serve`'s `chat_template_kwargs`), such
/// as `{"enable_thinking": false}` for Qwen3; the built-in formats ignore them.
///
/// `*text_len` receives the length of the prompt in bytes: UTF-8, not NUL-terminated,
/// special tokens spelled out (`<s>`, `<|im_start|>`, ChatGLM's `[gMASK]sop`). It is
/// written to `text` (capacity `text_capacity` bytes, owned by the caller) when it fits,
/// else FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
/// `text = NULL, text_capacity = 0` to ask for the size.
///
/// The text is for display, logs and hosts that tokenize elsewhere: to generate, take the
/// ids of flm_tokenize_chat() to flm_generate_tokens(). flm_tokenize() of the text does
/// not give those ids for every tokenizer (SentencePiece files see a special token written
/// in text as plain characters; ChatGLM's prompts are built token by token), and
/// flm_generate() adds BOS before a text that may start with it already.
///
/// Errors: FLM_STATUS_NULL_POINTER (`model`; `messages` or a message's pointer with a
/// length above 0; `text_len`; `text` when the prompt is not empty), FLM_STATUS_INVALID_UTF8
/// (a role, a content, `template_args`), FLM_STATUS_INVALID_ARGUMENT (`template_args` is
/// not a JSON object, or sets `messages`, `tools` or `add_generation_prompt`),
/// FLM_STATUS_NO_CHAT_TEMPLATE (the model has none), FLM_STATUS_TOKENIZER (the template
/// refused the conversation: its `raise_exception` message, an unknown role of a ChatGLM
/// format, a render past the template limits), FLM_STATUS_BUFFER_TOO_SMALL.
///
/// # Safety
/// `model` must be NULL or a live handle; `messages` NULL or `n_messages` readable
/// structs, each pointer in them NULL or valid for its length; `template_args` NULL or
/// `template_args_len` readable bytes; `text` NULL or `text_capacity` writable bytes;
/// `text_len` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn flm_apply_chat_template(
    model: *const FlmModel,
    messages: *const FlmChatMessage,
    n_messages: usize,
    add_generation_prompt: bool,
    template_args: *const c_char,
    template_args_len: usize,
    text: *mut c_char,
    text_capacity: usize,
    text_len: *mut usize,
) -> FlmStatus {
    guard(|| {
        // SAFETY: the pointers satisfy this function's contract.
        let prompt = unsafe {
            chat_prompt(
                model,
                messages,
                n_messages,
                add_generation_prompt,
                template_args,
                template_args_len,
            )
        }?;
        // SAFETY: as above.
        unsafe {
            copy_out(
                prompt.text.as_bytes(),
                text.cast::<u8>(),
                text_capacity,
                text_len,
                ("text", "text_len"),
            )
        }
    })
}

/// The token ids of the chat prompt of flm_apply_chat_template() (same arguments): the ids
/// `flm chat` and `flm serve` feed the model for this conversation, its BOS or ChatGLM
/// prefix included where the template or format writes one. Generate the reply with
/// flm_generate_tokens(session, ids, n, true, ...).
///
/// `*n_ids` receives the number of ids; they are written to `ids` (capacity
/// `ids_capacity` elements, owned by the caller) when they fit, else
/// FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
/// `ids = NULL, ids_capacity = 0` to ask for the size.
///
/// Errors: those of flm_apply_chat_template() (`ids` and `n_ids` in place of `text` and
/// `text_len`), and FLM_STATUS_TOKENIZER for a prompt the tokenizer cannot cut.
///
/// # Safety
/// As flm_apply_chat_template(); `ids` NULL or `ids_capacity` writable elements; `n_ids`
/// NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn flm_tokenize_chat(
    model: *const FlmModel,
    messages: *const FlmChatMessage,
    n_messages: usize,
    add_generation_prompt: bool,
    template_args: *const c_char,
    template_args_len: usize,
    ids: *mut u32,
    ids_capacity: usize,
    n_ids: *mut usize,
) -> FlmStatus {
    guard(|| {
        // SAFETY: the pointers satisfy this function's contract.
        let prompt = unsafe {
            chat_prompt(
                model,
                messages,
                n_messages,
                add_generation_prompt,
                template_args,
                template_args_len,
            )
        }?;
        // SAFETY: as above.
        unsafe { copy_out(&prompt.ids, ids, ids_capacity, n_ids, ("ids", "n_ids")) }
    })
}
