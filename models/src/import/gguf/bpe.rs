//! The byte-level BPE tokenizer of a GGUF file (`tokenizer.ggml.model = "gpt2"`, which
//! llama.cpp's converter writes for GPT-2, Llama 3, Qwen2, GLM-4 and Mistral-Nemo), read
//! as llama.cpp's `llama_vocab::load` reads it: `tokenizer.ggml.tokens` in GPT-2's byte
//! spelling, `.token_type`, `.merges` ("left right", in rank order), `.pre` (the family's
//! pre-tokeniser), `.bos_token_id`, `.eos_token_id`, `.add_bos_token` (default false) and
//! `tokenizer.chat_template`. The spelling, regexes and merges are flm-tokenizer's
//! ([`flm_tokenizer::gguf_gpt2_spec`]).

use flm_tokenizer::{PieceType, Tokenizer};

use super::file::{Meta, Value};
use crate::{Error, Result};

/// The tokenizer, `Ok(Err(why))` for a pre-tokeniser flm does not implement, `Err` for
/// malformed metadata.
pub(super) fn tokenizer(m: &Meta) -> Result<std::result::Result<Tokenizer, String>> {
    let bad = |msg: String| Error::format(m.path, format!("invalid tokenizer metadata: {msg}"));
    let strings = |key: &str| -> Result<Vec<String>> {
        let list = m.array(key)?.ok_or_else(|| bad(format!("no {key}")))?;
        (0..)
            .zip(list)
            .map(|(i, v)| match v {
                Value::Str(s) => String::from_utf8(s.clone())
                    .map_err(|_| bad(format!("{key}[{i}] is not UTF-8"))),
                v => Err(bad(format!("{key}[{i}] is {}", v.describe()))),
            })
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types = match m.array("tokenizer.ggml.token_type")? {
        None => vec![PieceType::Normal; tokens.len()],
        Some(list) => (0..)
            .zip(list)
            .map(|(i, v)| match v {
                Value::Int(0 | 1) => Ok(PieceType::Normal),
                Value::Int(t @ 2..=6) => PieceType::try_from(*t as u8).map_err(bad),
                v => Err(bad(format!(
                    "token type {i} is {}, not 0 to 6",
                    v.describe()
                ))),
            })
            .collect::<Result<_>>()?,
    };
    let pre = m.str("tokenizer.ggml.pre")?;
    let pre = pre.as_deref().unwrap_or("default");
    let mut spec = match flm_tokenizer::gguf_gpt2_spec(&tokens, &types, &merges, pre) {
        Ok(spec) => spec,
        Err(flm_tokenizer::Error::Unsupported(why)) => return Ok(Err(why)),
        Err(e) => return Err(bad(e.to_string())),
    };
    spec.bos_id = m.id("tokenizer.ggml.bos_token_id")?;
    spec.eos_id = m.id("tokenizer.ggml.eos_token_id")?;
    spec.add_bos = m.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    super::with_chat_template(m, spec)
}
