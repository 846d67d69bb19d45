//! Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Llama 3, Qwen2,
//! Mistral-Nemo, GLM-4/4.5, DeepSeek-V2/V3): `model.type` "BPE" with a `vocab` and
//! `merges` in GPT-2's byte spelling (`gpt2.rs`), a `ByteLevel` pre-tokenizer (GPT-2's
//! regex) or a `Sequence` of regex `Split`s (behaviour `Isolated`) and `Digits` ending in
//! a `ByteLevel` (see [`regexes`]; DeepSeek's files cut with three and six members before
//! it, which become the [`ByteLevelBpeSpec::pre_split`] regexes llama.cpp's GGUF names
//! also use), and `added_tokens` as plain text. Field names follow `tokenizers`' serde code
//! (pre_tokenizers/byte_level.rs, pre_tokenizers/split.rs, pre_tokenizers/digits.rs,
//! tokenizer/added_vocabulary.rs).
//!
//! The normaliser may be none (also an empty `Sequence`, as DeepSeek writes it) or `NFC`
//! (Qwen2). Refused with [`Error::Unsupported`] rather than tokenised differently: other
//! normalisers, `add_prefix_space`, other pre-tokenizers, `single_word` added tokens, BPE
//! dropout and subword prefixes/suffixes.

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

/// The pre-tokenisation regexes of the `pre_tokenizer`, in the order they cut the text:
/// the last is [`ByteLevelBpeSpec::pattern`], the others [`ByteLevelBpeSpec::pre_split`].
///
/// A `ByteLevel` alone cuts with GPT-2's regex. A `Sequence` cuts with each member in
/// turn, every member cutting each piece the previous ones left, as `tokenizers`'
/// `Sequence` does: `Split`s on a regex with the `Isolated` behaviour (matches and the text
/// between them become pieces), `Digits` (`individual_digits`: each digit alone, as the
/// regex `\p{N}` isolates it; else each run of digits, `\p{N}+`; Rust's
/// `char::is_numeric`, which `Digits` tests, is the general category N that `\p{N}`
/// names), and last a `ByteLevel` that adds GPT-2's regex when `use_regex` (SmolLM) and
/// else only spells the bytes (Llama 3, Qwen2, GLM-4, DeepSeek-V3 with its three
/// `Split`s, DeepSeek-V2 with five and `Digits`).
fn regexes(v: &Value) -> Result<Vec<String>> {
    let byte_level = |b: &Value| {
        if b.get("type").and_then(Value::as_str) != Some("ByteLevel") {
            return Err(unsupported(format!("pre-tokenizer {b}")));
        }
        if flag(b, "add_prefix_space", true) {
            return Err(unsupported("ByteLevel add_prefix_space"));
        }
        Ok(flag(b, "use_regex", true))
    };
    let cut = |p: &Value| match p.get("type").and_then(Value::as_str) {
        Some("Split") => {
            let regex = p.pointer("/pattern/Regex").and_then(Value::as_str);
            let isolated = p.get("behavior").and_then(Value::as_str) == Some("Isolated")
                && !flag(p, "invert", false);
            match regex {
                Some(r) if isolated => Ok(r.to_owned()),
                _ => Err(unsupported(format!("pre-tokenizer {p}"))),
            }
        }
        Some("Digits") if flag(p, "individual_digits", false) => Ok(r"\p{N}".to_owned()),
        Some("Digits") => Ok(r"\p{N}+".to_owned()),
        _ => Err(unsupported(format!("pre-tokenizer {p} in a Sequence"))),
    };
    let members = match v.get("type").and_then(Value::as_str) {
        Some("ByteLevel") => std::slice::from_ref(v),
        Some("Sequence") => v
            .get("pretokenizers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default(),
        _ => return Err(unsupported(format!("pre-tokenizer {v}"))),
    };
    let Some((last, cuts)) = members.split_last() else {
        return Err(unsupported(format!("pre-tokenizer {v}")));
    };
    let mut regexes = cuts.iter().map(cut).collect::<Result<Vec<_>>>()?;
    if byte_level(last)? {
        regexes.push(GPT2_PATTERN.to_owned());
    }
    if regexes.is_empty() {
        return Err(unsupported(format!(
            "pre-tokenizer {v}: a ByteLevel without a regex cuts nothing"
        )));
    }
    Ok(regexes)
}

/// Whether the `normalizer` is NFC (Qwen2), or none at all: absent, null, or an empty
/// `Sequence` (DeepSeek's); a `Sequence` of one normaliser is that normaliser.
fn nfc(v: &Value) -> Result<bool> {
    match v.get("type").and_then(Value::as_str) {
        _ if v.is_null() => Ok(false),
        Some("NFC") => Ok(true),
        Some("Sequence") => match v.get("normalizers").and_then(Value::as_array) {
            Some(list) if list.is_empty() => Ok(false),
            Some(list) if list.len() == 1 => nfc(&list[0]),
            _ => Err(unsupported(format!("normalizer {v}"))),
        },
        _ => Err(unsupported(format!("normalizer {v}"))),
    }
}

/// Reads a byte-level `tokenizer.json` (`root`, whose `model` is `model`). BOS and EOS
/// are the added tokens named `<|begin_of_text|>` / `<s>` and `<|end_of_text|>` /
/// `<|endoftext|>` / `</s>`; prompts start with BOS when the `post_processor` inserts it.
pub(crate) fn load(root: &Value, model: &Map<String, Value>) -> Result<Tokenizer> {
    let nfc = nfc(root.get("normalizer").unwrap_or(&Value::Null))?;
    if let Some(option) = unsupported_bpe_option(model) {
        return Err(unsupported(option));
    }
    let mut pre_split = regexes(root.get("pre_tokenizer").unwrap_or(&Value::Null))?;
    let pattern = pre_split.pop().unwrap_or_default();
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
        pre_split,
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
