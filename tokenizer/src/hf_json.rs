//! Hugging Face `tokenizer.json` of the SentencePiece-BPE kind (what `transformers`
//! writes for Llama, Mistral, TinyLlama...): `model.type` "BPE" with `byte_fallback`, a
//! `vocab`, `merges` (as "a b" strings or ["a", "b"] pairs), a `Prepend("▁")` +
//! `Replace(" ", "▁")` normaliser or a `Metaspace` pre-tokenizer, and `added_tokens`.
//! Field names and defaults follow `tokenizers`' serde code (models/bpe/serialization.rs,
//! pre_tokenizers/metaspace.rs, tokenizer/added_vocabulary.rs).
//!
//! A file with a `ByteLevel` component is read as byte-level BPE (`hf_byte_level.rs`).
//! Anything else (WordPiece, Unigram, regex normalisers, BPE dropout...)
//! is rejected with [`Error::Unsupported`] instead of being tokenised wrongly.
//!
//! This file only reads: it checks the file and resolves token texts to ids into the
//! pieces and [`HfBpeSpec`] of a [`crate::TokenizerSpec`], and the model (vocabulary trie,
//! merge table, added-token tries) is assembled by `spec_build::build`, the builder of
//! [`Tokenizer::from_spec`]. Encoding is in `hf_bpe.rs`.

use serde_json::{Map, Value};

use crate::hf_vocab::{flag, unsupported_bpe_option, Vocabulary};
use crate::spec::{
    HfBpeSpec, MetaspaceSpec, NormalizerStep, PrependScheme, SplitBehavior, SplitSpec,
    TokenizerKind,
};
use crate::vocab::{parse_byte_piece, PieceKind, VocabEntry};
use crate::{Error, Result, Tokenizer};

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("tokenizer.json: {what}"))
}

fn unsupported(what: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("tokenizer.json: {what}"))
}

fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Whether a component tree names a `ByteLevel` step anywhere.
fn mentions_byte_level(v: &Value) -> bool {
    match v {
        Value::Object(o) => type_of(v) == "ByteLevel" || o.values().any(mentions_byte_level),
        Value::Array(a) => a.iter().any(mentions_byte_level),
        _ => false,
    }
}

/// Reads a `tokenizer.json`.
pub(crate) fn load(bytes: &[u8]) -> Result<Tokenizer> {
    let root: Value = serde_json::from_slice(bytes).map_err(|e| {
        if e.is_eof() {
            Error::Truncated(format!("tokenizer.json: {e}"))
        } else {
            Error::NotATokenizer(format!("invalid JSON: {e}"))
        }
    })?;
    let Some(model) = root.get("model").and_then(Value::as_object) else {
        return Err(Error::NotATokenizer(
            "a JSON file without a \"model\" object".into(),
        ));
    };
    match model.get("type").and_then(Value::as_str) {
        Some("BPE") => {}
        None if model.contains_key("merges") => {}
        t => {
            return Err(unsupported(format!(
                "model type {}; only SentencePiece-style BPE is supported",
                t.unwrap_or("(none)")
            )))
        }
    }
    if ["normalizer", "pre_tokenizer", "decoder"]
        .iter()
        .any(|key| root.get(key).is_some_and(mentions_byte_level))
    {
        return crate::hf_byte_level::load(&root, model);
    }
    if let Some(option) = unsupported_bpe_option(model) {
        return Err(unsupported(option));
    }
    let mut normalizer = Vec::new();
    parse_normalizer(
        root.get("normalizer").unwrap_or(&Value::Null),
        &mut normalizer,
    )?;
    let (metaspace, split) =
        match parse_pre_tokenizer(root.get("pre_tokenizer").unwrap_or(&Value::Null))? {
            None => (None, None),
            Some(PreTokenizer::Metaspace(m)) => (Some(m), None),
            Some(PreTokenizer::Split(s)) => (None, Some(s)),
        };
    let byte_fallback = flag(&root["model"], "byte_fallback", false);

    // The vocabulary, then the added tokens, into one dense id space.
    let table = Vocabulary::read(&root, model)?;
    let pieces: Vec<VocabEntry> = (table.entries.iter())
        .map(|e| VocabEntry {
            bytes: e.text.as_bytes().into(),
            score: 0.0,
            kind: match (e.added, e.in_vocab) {
                (Some(true), _) => PieceKind::Control,
                (Some(false), false) => PieceKind::UserDefined,
                _ => match parse_byte_piece(e.text.as_bytes()) {
                    Some(b) if byte_fallback => PieceKind::Byte(b),
                    _ => PieceKind::Normal,
                },
            },
        })
        .collect();
    // Added tokens outside the model vocabulary (each id once, in file order).
    let mut added_only: Vec<u32> = Vec::new();
    for a in &table.added {
        let id = a.spec.id;
        if !table.entries[id as usize].in_vocab && !added_only.contains(&id) {
            added_only.push(id);
        }
    }
    let vocab_id = |token: &str| table.vocab_id(token);
    let (bos, eos) = (table.added_id(&["<s>"]), table.added_id(&["</s>"]));

    let merges = parse_merges(model, &vocab_id, pieces.len())?;
    let unk = match model.get("unk_token").and_then(Value::as_str) {
        None => None,
        Some(u) => Some(
            vocab_id(u)
                .ok_or_else(|| invalid(format!("unk_token {u:?} is not in the vocabulary")))?,
        ),
    };
    let kind = TokenizerKind::HfBpe(HfBpeSpec {
        merges,
        normalizer,
        metaspace,
        split,
        fuse_unk: flag(&root["model"], "fuse_unk", false),
        ignore_merges: flag(&root["model"], "ignore_merges", false),
        added_tokens: table.added_specs(),
        added_only,
    });
    crate::spec_build::build(pieces, kind, byte_fallback, unk, (bos, eos))
}

/// `merges`, in rank order, as (left id, right id) pairs; `vocab_id` finds a token of the
/// model vocabulary. A pair listed twice is kept twice: the builder gives it its last
/// rank, as `tokenizers` collecting into a map does.
fn parse_merges(
    model: &Map<String, Value>,
    vocab_id: &dyn Fn(&str) -> Option<u32>,
    size: usize,
) -> Result<Vec<[u32; 2]>> {
    let list = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("BPE model without a merges list"))?;
    let mut merges = Vec::with_capacity(list.len());
    for m in list {
        let (a, b) = match m {
            Value::String(s) if s.starts_with("#version") => continue,
            Value::String(s) => match s.split(' ').collect::<Vec<_>>()[..] {
                [a, b] => (a, b),
                _ => return Err(invalid(format!("merge {s:?} is not two tokens"))),
            },
            Value::Array(p) => match (
                p.len(),
                p.first().and_then(Value::as_str),
                p.get(1).and_then(Value::as_str),
            ) {
                (2, Some(a), Some(b)) => (a, b),
                _ => return Err(invalid(format!("merge {m} is not a pair of strings"))),
            },
            _ => return Err(invalid(format!("merge {m} is not a string or a pair"))),
        };
        let id = |t: &str| {
            vocab_id(t)
                .filter(|&id| (id as usize) < size)
                .ok_or_else(|| {
                    invalid(format!("merge {a:?} {b:?}: {t:?} is not in the vocabulary"))
                })
        };
        // The merged token must exist too (checked here to name it by its text).
        let pair = [id(a)?, id(b)?];
        id(&format!("{a}{b}"))?;
        merges.push(pair);
    }
    Ok(merges)
}

/// `Prepend`, string `Replace` and `Sequence`s of them.
fn parse_normalizer(v: &Value, ops: &mut Vec<NormalizerStep>) -> Result<()> {
    if v.is_null() {
        return Ok(());
    }
    match type_of(v) {
        "Sequence" => {
            let list = v.get("normalizers").and_then(Value::as_array);
            for n in list.ok_or_else(|| invalid("Sequence normalizer without a list"))? {
                parse_normalizer(n, ops)?;
            }
        }
        "Prepend" => {
            let p = v.get("prepend").and_then(Value::as_str);
            let p = p.ok_or_else(|| invalid("Prepend without a string"))?;
            ops.push(NormalizerStep::Prepend { prepend: p.into() });
        }
        "Replace" => {
            let pattern = v.pointer("/pattern/String").and_then(Value::as_str);
            let content = v.get("content").and_then(Value::as_str);
            match (pattern, content) {
                (Some(p), Some(c)) if !p.is_empty() => ops.push(NormalizerStep::Replace {
                    pattern: p.into(),
                    content: c.into(),
                }),
                _ => return Err(unsupported(format!("Replace normalizer {v}"))),
            }
        }
        t => return Err(unsupported(format!("normalizer {t:?}"))),
    }
    Ok(())
}

/// The pre-tokenizers of SentencePiece-style BPE models.
enum PreTokenizer {
    Metaspace(MetaspaceSpec),
    Split(SplitSpec),
}

/// `Metaspace` or `Split` on a string (alone or as the only member of a `Sequence`), or
/// none.
fn parse_pre_tokenizer(v: &Value) -> Result<Option<PreTokenizer>> {
    match type_of(v) {
        _ if v.is_null() => Ok(None),
        "Sequence" => match v
            .get("pretokenizers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            Some([one]) => parse_pre_tokenizer(one),
            _ => Err(unsupported(format!("pre-tokenizer {v}"))),
        },
        "Metaspace" => {
            match v.get("replacement").and_then(Value::as_str) {
                Some("\u{2581}") => {}
                Some(other) => return Err(unsupported(format!("Metaspace replacement {other:?}"))),
                None => return Err(unsupported("Metaspace without a replacement")),
            }
            let scheme = v.get("prepend_scheme").and_then(Value::as_str);
            let prepend = match (v.get("add_prefix_space").and_then(Value::as_bool), scheme) {
                (Some(false), _) | (_, Some("never")) => PrependScheme::Never,
                (_, Some("first")) => PrependScheme::First,
                (_, Some("always") | None) => PrependScheme::Always,
                (_, Some(s)) => return Err(invalid(format!("Metaspace prepend_scheme {s:?}"))),
            };
            Ok(Some(PreTokenizer::Metaspace(MetaspaceSpec {
                prepend_scheme: prepend,
                split: v.get("split").and_then(Value::as_bool).unwrap_or(true),
            })))
        }
        "Split" => {
            let pattern = match v.get("pattern").and_then(|p| p.get("String")) {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                _ => return Err(unsupported(format!("Split pre-tokenizer pattern {v}"))),
            };
            if v.get("invert").and_then(Value::as_bool) == Some(true) {
                return Err(unsupported("an inverted Split pre-tokenizer"));
            }
            let behavior = match v.get("behavior").and_then(Value::as_str) {
                Some("Removed") => SplitBehavior::Removed,
                Some("Isolated") => SplitBehavior::Isolated,
                Some("MergedWithPrevious") => SplitBehavior::MergedWithPrevious,
                Some("MergedWithNext") => SplitBehavior::MergedWithNext,
                b => return Err(unsupported(format!("Split behavior {b:?}"))),
            };
            Ok(Some(PreTokenizer::Split(SplitSpec { pattern, behavior })))
        }
        t => Err(unsupported(format!("pre-tokenizer {t:?}"))),
    }
}
