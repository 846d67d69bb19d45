//! What a Hugging Face `tokenizer_config.json` says about prompts: the Jinja
//! `chat_template` (or the `chat_template.jinja` beside it, which newer checkpoints such as
//! GLM-4.5's ship instead), and for THUDM's `ChatGLMTokenizer` the ChatGLM2/3 special tokens and
//! prompt format (the tokenizer itself is Python code in the checkpoint,
//! `tokenization_chatglm.py`; ChatGLM3's is told from ChatGLM2's by its role tokens, as
//! chatglm.cpp's converter does), and for byte-level BPE the BOS and EOS tokens.

use std::path::Path;

use crate::vocab::PieceKind;
use crate::{ChatFormat, Encoder, Error, Result, Tokenizer};

/// The file in which transformers keeps a tokenizer's chat template beside
/// `tokenizer_config.json` (its `CHAT_TEMPLATE_FILE`).
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

impl Tokenizer {
    /// [`Tokenizer::from_file`], then what the Hugging Face files beside it say, as
    /// transformers' `from_pretrained` reads a directory: the `tokenizer_config.json` (and
    /// `tokenization_chatglm.py`), if there is one ([`Tokenizer::with_hf_config`]), and the
    /// chat template of a `chat_template.jinja`, if there is one, which takes the place of
    /// the config's `chat_template` (transformers 4.43 and later save the template there;
    /// GLM-4.5's files have it only there).
    ///
    /// Errors: those of both, a `chat_template.jinja` that is not UTF-8 or fails the
    /// checks of [`Tokenizer::with_chat_template`], and [`Error::Io`] if a file exists but
    /// cannot be read.
    pub fn from_file_with_hf_config(path: &Path) -> Result<Tokenizer> {
        let tok = Tokenizer::from_file(path)?;
        let read = |name: &str| -> Result<Option<(std::path::PathBuf, Vec<u8>)>> {
            let file = path.with_file_name(name);
            if !file.is_file() {
                return Ok(None);
            }
            match std::fs::read(&file) {
                Ok(bytes) => Ok(Some((file, bytes))),
                Err(source) => Err(Error::Io { path: file, source }),
            }
        };
        let template = match read(CHAT_TEMPLATE_FILE)? {
            None => None,
            Some((file, bytes)) => Some(
                String::from_utf8(bytes)
                    .map_err(|e| Error::Invalid(format!("{}: not UTF-8 ({e})", file.display())))?,
            ),
        };
        let tok = match read("tokenizer_config.json")? {
            None => tok,
            Some((config, bytes)) => {
                let code = std::fs::read(path.with_file_name("tokenization_chatglm.py")).ok();
                tok.apply_hf_config(&bytes, code.as_deref(), template.is_some())
                    .map_err(|e| Error::Invalid(format!("{}: {e}", config.display())))?
            }
        };
        match template {
            None => Ok(tok),
            Some(text) => tok.with_chat_template(Some(text), "`chat_template.jinja`"),
        }
    }

    /// Applies a `tokenizer_config.json` (`config`) to this tokenizer, read from the same
    /// directory: its chat template ([`chat_template_from_hf_config`]), and, when
    /// `tokenizer_class` is `ChatGLMTokenizer` and this is a SentencePiece model, the
    /// ChatGLM special tokens and format ([`Tokenizer::into_chatglm`]): ChatGLM3 if
    /// `tokenization_py` (the directory's `tokenization_chatglm.py`) defines the
    /// `<|observation|>` role token, ChatGLM2 otherwise. For a byte-level BPE, its
    /// `bos_token`, `eos_token` and `add_bos_token`.
    ///
    /// Errors: those of [`chat_template_from_hf_config`] and [`Tokenizer::into_chatglm`],
    /// and a byte-level `bos_token`/`eos_token` that names no special token.
    pub fn with_hf_config(
        self,
        config: &[u8],
        tokenization_py: Option<&[u8]>,
    ) -> Result<Tokenizer> {
        self.apply_hf_config(config, tokenization_py, false)
    }

    /// [`Tokenizer::with_hf_config`]; with `template_elsewhere` (a `chat_template.jinja`
    /// replaces it), the config's `chat_template` is left unread.
    fn apply_hf_config(
        self,
        config: &[u8],
        tokenization_py: Option<&[u8]>,
        template_elsewhere: bool,
    ) -> Result<Tokenizer> {
        let template = if template_elsewhere {
            None
        } else {
            chat_template_from_hf_config(config)?
        };
        let value: serde_json::Value = serde_json::from_slice(config)
            .map_err(|e| Error::Invalid(format!("tokenizer_config.json: {e}")))?;
        let chatglm = value["tokenizer_class"] == "ChatGLMTokenizer"
            && self.chat_format.is_none()
            && matches!(self.encoder, Encoder::SentencePiece(_));
        let mut tok = if chatglm {
            let glm3 =
                tokenization_py.is_some_and(|py| py.windows(15).any(|w| w == b"<|observation|>"));
            self.into_chatglm(if glm3 {
                ChatFormat::ChatGlm3
            } else {
                ChatFormat::ChatGlm2
            })?
        } else {
            self
        };
        if template.is_some() {
            tok = tok.with_chat_template(template, "tokenizer_config.json `chat_template`")?;
        }
        if matches!(tok.encoder, Encoder::ByteLevel(_)) {
            tok.apply_special_tokens(&value)?;
        }
        Ok(tok)
    }

    /// For byte-level BPE, whose `tokenizer.json` does not say which tokens are BOS and
    /// EOS: `bos_token` and `eos_token` of the config (a string or `{"content": ..}`; null
    /// means none), as transformers' `PreTrainedTokenizerFast` takes them, and
    /// `add_bos_token` when present. Keys that are absent leave the guess of
    /// `hf_byte_level.rs` in place. Errors: [`Error::Invalid`] for a name that is not a
    /// special or added token.
    fn apply_special_tokens(&mut self, config: &serde_json::Value) -> Result<()> {
        let id = |key: &str| -> Result<Option<Option<u32>>> {
            let name = match config.get(key) {
                None => return Ok(None),
                Some(serde_json::Value::Null) => return Ok(Some(None)),
                Some(v) => v.as_str().or_else(|| v["content"].as_str()),
            };
            let name = name.ok_or_else(|| {
                Error::Invalid(format!("tokenizer_config.json: {key} is not a token name"))
            })?;
            let found = self.pieces.iter().rposition(|p| {
                matches!(p.kind, PieceKind::Control | PieceKind::UserDefined)
                    && *p.bytes == *name.as_bytes()
            });
            let found = found.ok_or_else(|| {
                Error::Invalid(format!(
                    "tokenizer_config.json: {key} {name:?} is not a special token"
                ))
            })?;
            Ok(Some(Some(found as u32)))
        };
        if let Some(bos) = id("bos_token")? {
            self.bos = bos;
        }
        if let Some(eos) = id("eos_token")? {
            self.eos = eos;
        }
        if let Some(add) = config
            .get("add_bos_token")
            .and_then(serde_json::Value::as_bool)
        {
            self.add_bos = add;
        }
        Ok(())
    }
}

/// The chat template of a Hugging Face `tokenizer_config.json`: its `chat_template`, a
/// string or (newer transformers) a list of `{"name", "template"}` of which the one named
/// `default` is used, as transformers does. `Ok(None)` when the file has none.
///
/// Errors: [`Error::Invalid`] for bytes that are not a JSON object, or a `chat_template`
/// of another shape (or a list without `default`).
pub fn chat_template_from_hf_config(json: &[u8]) -> Result<Option<String>> {
    let bad = |why: String| Error::Invalid(format!("tokenizer_config.json: {why}"));
    let config: serde_json::Value = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
    let config = config
        .as_object()
        .ok_or_else(|| bad("not a JSON object".into()))?;
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(t)) => Ok(Some(t.clone())),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(|t| Some(t.to_owned()))
            .ok_or_else(|| bad("chat_template is a list without a \"default\" template".into())),
        Some(other) => Err(bad(format!("chat_template is {other}, not a string"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_config_templates() {
        let get = |s: &str| chat_template_from_hf_config(s.as_bytes());
        assert_eq!(
            get(r#"{"chat_template": "x"}"#).unwrap().as_deref(),
            Some("x")
        );
        assert_eq!(get(r#"{"bos_token": "<s>"}"#).unwrap(), None);
        let list = r#"{"chat_template": [{"name": "tool_use", "template": "t"},
                      {"name": "default", "template": "d"}]}"#;
        assert_eq!(get(list).unwrap().as_deref(), Some("d"));
        assert!(get(r#"{"chat_template": [{"name": "rag", "template": "r"}]}"#).is_err());
        assert!(get(r#"{"chat_template": 3}"#).is_err());
        assert!(get("[1]").is_err());
        assert!(get("{").is_err());
    }
}
