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

use crate::spec::{
    AddedTokenSpec, HfBpeSpec, MetaspaceSpec, NormalizerStep, PrependScheme, TokenizerKind,
};
use crate::vocab::{parse_byte_piece, Piece, PieceKind};
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

fn flag(o: &Map<String, Value>, key: &str, default: bool) -> bool {
    o.get(key).and_then(Value::as_bool).unwrap_or(default)
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
    let mut normalizer = Vec::new();
    parse_normalizer(
        root.get("normalizer").unwrap_or(&Value::Null),
        &mut normalizer,
    )?;
    let metaspace = parse_pre_tokenizer(root.get("pre_tokenizer").unwrap_or(&Value::Null))?;
    let byte_fallback = flag(model, "byte_fallback", false);

    // The vocabulary, then the added tokens, into one dense id space.
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
            .map(|id| id as u32)
    };
    let mut slots: Vec<Option<Piece>> = vec![None; capacity];
    for (token, id) in vocab {
        let id = id_of(id).ok_or_else(|| invalid(format!("bad id for {token:?}: {id}")))?;
        if slots[id as usize].is_some() {
            return Err(invalid(format!("id {id} is given to two tokens")));
        }
        let kind = match parse_byte_piece(token.as_bytes()) {
            Some(b) if byte_fallback => PieceKind::Byte(b),
            _ => PieceKind::Normal,
        };
        slots[id as usize] = Some(Piece {
            bytes: token.as_bytes().into(),
            score: 0.0,
            kind,
        });
    }
    // The id of a token of the model vocabulary (all checked above).
    let vocab_id = |token: &str| vocab.get(token).and_then(id_of);
    let mut added_tokens = Vec::with_capacity(added.len());
    let mut added_only = Vec::new();
    let (mut bos, mut eos) = (None, None);
    for t in added {
        let o = t
            .as_object()
            .ok_or_else(|| invalid("added token is not an object"))?;
        let content = o.get("content").and_then(Value::as_str).unwrap_or("");
        let id = o.get("id").and_then(id_of);
        let id = id.ok_or_else(|| invalid(format!("bad id for added token {content:?}")))?;
        if content.is_empty() {
            continue;
        }
        // A token of the model vocabulary keeps its id there (`AddedVocabulary::add_tokens`).
        let id = vocab_id(content).unwrap_or(id);
        if flag(o, "single_word", false) {
            return Err(unsupported(format!("single_word added token {content:?}")));
        }
        let special = flag(o, "special", false);
        let slot = &mut slots[id as usize];
        match slot {
            Some(p) if *p.bytes != *content.as_bytes() => {
                return Err(invalid(format!(
                    "added token {content:?} has the id of another token"
                )));
            }
            Some(p) if special => p.kind = PieceKind::Control,
            Some(_) => {}
            None => {
                added_only.push(id);
                *slot = Some(Piece {
                    bytes: content.as_bytes().into(),
                    score: 0.0,
                    kind: if special {
                        PieceKind::Control
                    } else {
                        PieceKind::UserDefined
                    },
                })
            }
        }
        // Matching order and deduplication of the patterns are the builder's.
        added_tokens.push(AddedTokenSpec {
            id,
            lstrip: flag(o, "lstrip", false),
            rstrip: flag(o, "rstrip", false),
            normalized: flag(o, "normalized", !special),
        });
        match content {
            "<s>" => bos = Some(id),
            "</s>" => eos = Some(id),
            _ => {}
        }
    }
    let size = slots.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    let pieces: Vec<Piece> = slots
        .into_iter()
        .take(size)
        .enumerate()
        .map(|(i, p)| p.ok_or_else(|| invalid(format!("no token has id {i}"))))
        .collect::<Result<_>>()?;

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
        fuse_unk: flag(model, "fuse_unk", false),
        ignore_merges: flag(model, "ignore_merges", false),
        added_tokens,
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

/// `Metaspace` (alone or as the only member of a `Sequence`) or none.
fn parse_pre_tokenizer(v: &Value) -> Result<Option<MetaspaceSpec>> {
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
            let replacement = v.get("replacement").and_then(Value::as_str);
            if replacement != Some("\u{2581}") {
                return Err(unsupported(format!(
                    "Metaspace replacement {replacement:?}"
                )));
            }
            let scheme = v.get("prepend_scheme").and_then(Value::as_str);
            let prepend = match (v.get("add_prefix_space").and_then(Value::as_bool), scheme) {
                (Some(false), _) | (_, Some("never")) => PrependScheme::Never,
                (_, Some("first")) => PrependScheme::First,
                (_, Some("always") | None) => PrependScheme::Always,
                (_, Some(s)) => return Err(invalid(format!("Metaspace prepend_scheme {s:?}"))),
            };
            Ok(Some(MetaspaceSpec {
                prepend_scheme: prepend,
                split: v.get("split").and_then(Value::as_bool).unwrap_or(true),
            }))
        }
        t => Err(unsupported(format!("pre-tokenizer {t:?}"))),
    }
}
