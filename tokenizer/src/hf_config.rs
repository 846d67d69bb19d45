//! What a Hugging Face `tokenizer_config.json` says about prompts: the Jinja
//! `chat_template`, and for THUDM's `ChatGLMTokenizer` the ChatGLM2/3 special tokens and
//! prompt format (the tokenizer itself is Python code in the checkpoint,
//! `tokenization_chatglm.py`; ChatGLM3's is told from ChatGLM2's by its role tokens, as
//! chatglm.cpp's converter does), and for byte-level BPE the BOS and EOS tokens.

use std::path::Path;

use crate::vocab::PieceKind;
use crate::{ChatFormat, Encoder, Error, Result, Tokenizer};

impl Tokenizer {
    /// [`Tokenizer::from_file`], then [`Tokenizer::with_hf_config`] with the
    /// `tokenizer_config.json` (and `tokenization_chatglm.py`) beside the file, if there is
    /// one: how a tokenizer file of a Hugging Face directory is read.
    ///
    /// Errors: those of both, and [`Error::Io`] if the config exists but cannot be read.
    pub fn from_file_with_hf_config(path: &Path) -> Result<Tokenizer> {
        let tok = Tokenizer::from_file(path)?;
        let config = path.with_file_name("tokenizer_config.json");
        if !config.is_file() {
            return Ok(tok);
        }
        let bytes = std::fs::read(&config).map_err(|source| Error::Io {
            path: config.clone(),
            source,
        })?;
        let code = std::fs::read(path.with_file_name("tokenization_chatglm.py")).ok();
        tok.with_hf_config(&bytes, code.as_deref())
            .map_err(|e| Error::Invalid(format!("{}: {e}", config.display())))
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
        let template = chat_template_from_hf_config(config)?;
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
