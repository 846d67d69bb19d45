//! Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Llama 3, Qwen2,
//! Mistral-Nemo): `model.type` "BPE" with a `vocab` and `merges` in GPT-2's byte spelling
//! (`gpt2.rs`), a `ByteLevel` pre-tokenizer (GPT-2's regex) or a `Sequence` of a regex
//! `Split` (behaviour `Isolated`) and a `ByteLevel` without regex, and `added_tokens` as
//! plain text. Field names follow `tokenizers`' serde code (pre_tokenizers/byte_level.rs,
//! pre_tokenizers/split.rs, tokenizer/added_vocabulary.rs).
//!
//! The normaliser may be none or `NFC` (Qwen2). Refused with [`Error::Unsupported`] rather
//! than tokenised differently: other normalisers, `add_prefix_space`, other
//! pre-tokenizers, `single_word` added tokens, BPE dropout and subword prefixes/suffixes.

use serde_json::{Map, Value};

use crate::gpt2::{build_spec, Token, GPT2_PATTERN};
use crate::hf_vocab::{flag, unsupported_bpe_option, Vocabulary};
use crate::spec::{ByteLevelBpeSpec, PieceType};
use crate::{Error, Result, Tokenizer};

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("tokenizer.json: {what}"))
}

fn unsupported(what: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("tokenizer.json (byte-level BPE): {what}"))
}

/// The pre-tokenisation regex of the `pre_tokenizer`.
fn pattern(v: &Value) -> Result<String> {
    let byte_level = |b: &Value, use_regex: bool| {
        if b.get("type").and_then(Value::as_str) != Some("ByteLevel") {
            return Err(unsupported(format!("pre-tokenizer {b}")));
        }
        if flag(b, "add_prefix_space", true) {
            return Err(unsupported("ByteLevel add_prefix_space"));
        }
        if flag(b, "use_regex", true) != use_regex {
            return Err(unsupported(format!("pre-tokenizer {b} in this position")));
        }
        Ok(())
    };
    match v.get("type").and_then(Value::as_str) {
        Some("ByteLevel") => byte_level(v, true).map(|()| GPT2_PATTERN.to_owned()),
        Some("Sequence") => match v
            .get("pretokenizers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            Some([split, b]) => {
                byte_level(b, false)?;
                let regex = split.pointer("/pattern/Regex").and_then(Value::as_str);
                let ok = split.get("type").and_then(Value::as_str) == Some("Split")
                    && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
                    && !flag(split, "invert", false);
                match regex {
                    Some(r) if ok => Ok(r.to_owned()),
                    _ => Err(unsupported(format!("pre-tokenizer {split}"))),
                }
            }
            _ => Err(unsupported(format!("pre-tokenizer {v}"))),
        },
        _ => Err(unsupported(format!("pre-tokenizer {v}"))),
    }
}

/// Reads a byte-level `tokenizer.json` (`root`, whose `model` is `model`). BOS and EOS
/// are the added tokens named `<|begin_of_text|>` / `<s>` and `<|end_of_text|>` /
/// `<|endoftext|>` / `</s>`; prompts start with BOS when the `post_processor` inserts it.
pub(crate) fn load(root: &Value, model: &Map<String, Value>) -> Result<Tokenizer> {
    let nfc = match root.get("normalizer").unwrap_or(&Value::Null) {
        Value::Null => false,
        n if n.get("type").and_then(Value::as_str) == Some("NFC") => true,
        n => return Err(unsupported(format!("normalizer {n}"))),
    };
    if let Some(option) = unsupported_bpe_option(model) {
        return Err(unsupported(option));
    }
    let pattern = pattern(root.get("pre_tokenizer").unwrap_or(&Value::Null))?;
    let table = Vocabulary::read(root, model)?;
    let tokens: Vec<Token> = (table.entries.iter())
        .map(|e| Token {
            text: e.text,
            kind: match e.added {
                None => PieceType::Normal,
                Some(true) => PieceType::Control,
                Some(false) => PieceType::UserDefined,
            },
        })
        .collect();
    let bos = table.added_id(&["<|begin_of_text|>", "<s>"]);
    let eos = table.added_id(&["<|end_of_text|>", "<|endoftext|>", "</s>"]);
    let merges = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("BPE model without a merges list"))?;
    let merges = merges.iter().filter_map(|m| match m {
        Value::String(s) if s.starts_with("#version") => None,
        Value::String(s) => Some(match s.split(' ').collect::<Vec<_>>()[..] {
            [a, b] => Ok((a, b)),
            _ => Err(invalid(format!("merge {s:?} is not two tokens"))),
        }),
        Value::Array(p) => Some(match p.as_slice() {
            [Value::String(a), Value::String(b)] => Ok((a.as_str(), b.as_str())),
            _ => Err(invalid(format!("merge {m} is not a pair of strings"))),
        }),
        _ => Some(Err(invalid(format!("merge {m} is not a string or a pair")))),
    });
    let ignore_merges = model
        .get("ignore_merges")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let settings = ByteLevelBpeSpec {
        pattern,
        pre_split: Vec::new(),
        merges: None,
        ignore_merges,
        nfc,
        added_tokens: table.added_specs(),
    };
    let mut spec = build_spec(&tokens, merges, settings)?;
    let inserts_bos = |bos: u32| {
        let name = &tokens[bos as usize].text;
        root.get("post_processor")
            .is_some_and(|p| p.to_string().contains(&format!("\"{name}\"")))
    };
    spec.add_bos = bos.is_some_and(inserts_bos);
    spec.bos_id = bos;
    spec.eos_id = eos;
    Tokenizer::from_spec(spec)
}
