//! Jinja chat templates rendered with minijinja under the semantics of transformers'
//! `PreTrainedTokenizerBase.apply_chat_template` (`utils/chat_template_utils.py`): the
//! environment has `trim_blocks` and `lstrip_blocks` on, the template sees `messages`,
//! `add_generation_prompt`, `bos_token` and `eos_token`, and may call
//! `raise_exception(message)`; Python string methods (`.strip()`, `.startswith()`...)
//! work through minijinja-contrib's `pycompat`.

use minijinja::{context, Environment, ErrorKind};

use crate::chat::Message;
use crate::{Error, Result, Tokenizer};

/// Renders `template` for `messages`.
///
/// Errors: [`Error::Template`] with minijinja's message for a syntax error, an undefined
/// function, or a `raise_exception` call (the template's message).
pub(crate) fn render(
    tok: &Tokenizer,
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    let token = |id: Option<u32>| {
        id.and_then(|id| tok.piece(id))
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default()
    };
    let ctx = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => token(tok.bos_id()),
        eos_token => token(tok.eos_id()),
    };
    let failed = |e: minijinja::Error| {
        let mut why = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            why += &format!(": {s}");
            source = s.source();
        }
        Error::Template(format!("chat template: {why}"))
    };
    env.template_from_str(template)
        .map_err(failed)?
        .render(ctx)
        .map_err(failed)
}
