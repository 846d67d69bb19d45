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
use crate::spec::{AddedTokenSpec, ByteLevelBpeSpec, PieceType};
use crate::{Error, Result, Tokenizer};

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("tokenizer.json: {what}"))
}

fn unsupported(what: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("tokenizer.json (byte-level BPE): {what}"))
}

fn flag(o: &Value, key: &str, default: bool) -> bool {
    o.get(key).and_then(Value::as_bool).unwrap_or(default)
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
    if model.get("dropout").and_then(Value::as_f64).unwrap_or(0.0) != 0.0 {
        return Err(unsupported("BPE dropout"));
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if model
            .get(key)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(unsupported(format!("BPE {key}")));
        }
    }
    let pattern = pattern(root.get("pre_tokenizer").unwrap_or(&Value::Null))?;
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("BPE model without a vocab object"))?;
    let added = root.get("added_tokens").and_then(Value::as_array);
    let added = added.map(Vec::as_slice).unwrap_or_default();
    let capacity = vocab.len() + added.len();
    let id_of = |v: &Value| {
        v.as_u64()
            .filter(|&id| id < capacity as u64)
            .map(|id| id as usize)
    };
    let mut slots: Vec<Option<Token>> = (0..capacity).map(|_| None).collect();
    for (text, id) in vocab {
        let id = id_of(id).ok_or_else(|| invalid(format!("bad id for {text:?}: {id}")))?;
        if slots[id]
            .replace(Token {
                text,
                kind: PieceType::Normal,
            })
            .is_some()
        {
            return Err(invalid(format!("id {id} is given to two tokens")));
        }
    }
    let mut added_tokens = Vec::with_capacity(added.len());
    let (mut bos, mut eos) = (None, None);
    for t in added {
        let content = t.get("content").and_then(Value::as_str).unwrap_or("");
        let id = t.get("id").and_then(id_of);
        let id = id.ok_or_else(|| invalid(format!("bad id for added token {content:?}")))?;
        if content.is_empty() {
            continue;
        }
        if flag(t, "single_word", false) {
            return Err(unsupported(format!("single_word added token {content:?}")));
        }
        let kind = if flag(t, "special", false) {
            PieceType::Control
        } else {
            PieceType::UserDefined
        };
        // A token of the vocabulary keeps its id there, now as an added token.
        let id = vocab.get(content).and_then(id_of).unwrap_or(id);
        match &slots[id] {
            Some(p) if p.kind != PieceType::Normal || p.text != content => {
                return Err(invalid(format!(
                    "added token {content:?} has the id of another token"
                )))
            }
            _ => {
                slots[id] = Some(Token {
                    text: content,
                    kind,
                })
            }
        }
        added_tokens.push(AddedTokenSpec {
            id: id as u32,
            lstrip: flag(t, "lstrip", false),
            rstrip: flag(t, "rstrip", false),
            normalized: flag(t, "normalized", kind != PieceType::Control),
        });
        match content {
            "<|begin_of_text|>" | "<s>" => bos = Some(id as u32),
            "<|end_of_text|>" | "<|endoftext|>" | "</s>" => eos = Some(id as u32),
            _ => {}
        }
    }
    let size = slots.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    let tokens: Vec<Token> = slots
        .into_iter()
        .take(size)
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| invalid(format!("no token has id {i}"))))
        .collect::<Result<_>>()?;
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
        merges: None,
        ignore_merges,
        nfc,
        added_tokens,
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
