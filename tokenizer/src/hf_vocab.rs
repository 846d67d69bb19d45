//! The id space of a Hugging Face `tokenizer.json`: the model's `vocab` and the
//! `added_tokens`, read into one dense table, shared by the SentencePiece-BPE reader
//! (`hf_json.rs`) and the byte-level one (`hf_byte_level.rs`).
//!
//! As in `tokenizers` (tokenizer/added_vocabulary.rs, `AddedVocabulary::add_tokens`), an
//! added token whose text is in the vocabulary keeps the vocabulary's id; the others take
//! their own. Every id from 0 to the largest must name a token.

use serde_json::{Map, Value};

use crate::spec::AddedTokenSpec;
use crate::{Error, Result};

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("tokenizer.json: {what}"))
}

/// `o[key]` as a boolean, `default` when absent.
pub(crate) fn flag(o: &Value, key: &str, default: bool) -> bool {
    o.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The first option of the BPE `model` that neither reader implements (dropout, a
/// continuing-subword prefix, an end-of-word suffix), named for the reader's error.
pub(crate) fn unsupported_bpe_option(model: &Map<String, Value>) -> Option<String> {
    if model.get("dropout").and_then(Value::as_f64).unwrap_or(0.0) != 0.0 {
        return Some("BPE dropout".into());
    }
    ["continuing_subword_prefix", "end_of_word_suffix"]
        .into_iter()
        .find(|key| {
            model
                .get(*key)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        })
        .map(|key| format!("BPE {key}"))
}

/// One id of the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    /// The token's text: the vocabulary's spelling, or an added token's content.
    pub(crate) text: &'a str,
    /// Whether the text is a key of the model's `vocab`.
    pub(crate) in_vocab: bool,
    /// `Some(special)` when an added token has this id.
    pub(crate) added: Option<bool>,
}

/// One entry of `added_tokens`, with the id it resolved to.
#[derive(Debug, Clone)]
pub(crate) struct Added<'a> {
    /// The token's text.
    pub(crate) content: &'a str,
    /// Its id, lstrip/rstrip and normalized flags, for the tokenizer's builder.
    pub(crate) spec: AddedTokenSpec,
}

/// The vocabulary and added tokens of a `tokenizer.json`.
pub(crate) struct Vocabulary<'a> {
    /// Entry `i` is the token of id `i`.
    pub(crate) entries: Vec<Entry<'a>>,
    /// The added tokens, in the file's order (empty contents skipped).
    pub(crate) added: Vec<Added<'a>>,
    vocab: &'a Map<String, Value>,
    capacity: usize,
}

impl<'a> Vocabulary<'a> {
    /// Reads `model.vocab` (text → id) and `root.added_tokens`.
    ///
    /// Errors: [`Error::Invalid`] for a missing vocabulary, an id that is not an integer
    /// below the number of tokens, two tokens with one id, an added token that is not an
    /// object or takes another token's id, or an id no token has;
    /// [`Error::Unsupported`] for a `single_word` added token.
    pub(crate) fn read(root: &'a Value, model: &'a Map<String, Value>) -> Result<Self> {
        let vocab = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid("BPE model without a vocab object"))?;
        let added = root.get("added_tokens").and_then(Value::as_array);
        let added = added.map(Vec::as_slice).unwrap_or_default();
        let mut table = Vocabulary {
            entries: Vec::new(),
            added: Vec::with_capacity(added.len()),
            vocab,
            capacity: vocab.len() + added.len(),
        };
        let mut slots: Vec<Option<Entry<'a>>> = vec![None; table.capacity];
        for (text, id) in vocab {
            let id = table
                .id_of(id)
                .ok_or_else(|| invalid(format!("bad id for {text:?}: {id}")))?;
            let entry = Entry {
                text,
                in_vocab: true,
                added: None,
            };
            if slots[id as usize].replace(entry).is_some() {
                return Err(invalid(format!("id {id} is given to two tokens")));
            }
        }
        for t in added {
            if !t.is_object() {
                return Err(invalid("added token is not an object"));
            }
            let content = t.get("content").and_then(Value::as_str).unwrap_or("");
            let id = t.get("id").and_then(|v| table.id_of(v));
            let id = id.ok_or_else(|| invalid(format!("bad id for added token {content:?}")))?;
            if content.is_empty() {
                continue;
            }
            if flag(t, "single_word", false) {
                return Err(Error::Unsupported(format!(
                    "tokenizer.json: single_word added token {content:?}"
                )));
            }
            let special = flag(t, "special", false);
            let id = table.vocab_id(content).unwrap_or(id);
            let slot = &mut slots[id as usize];
            match slot {
                Some(e) if e.text != content => {
                    return Err(invalid(format!(
                        "added token {content:?} has the id of another token"
                    )));
                }
                Some(e) => e.added = Some(special || e.added == Some(true)),
                None => {
                    *slot = Some(Entry {
                        text: content,
                        in_vocab: false,
                        added: Some(special),
                    })
                }
            }
            table.added.push(Added {
                content,
                spec: AddedTokenSpec {
                    id,
                    lstrip: flag(t, "lstrip", false),
                    rstrip: flag(t, "rstrip", false),
                    normalized: flag(t, "normalized", !special),
                },
            });
        }
        let size = slots.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
        table.entries = slots
            .into_iter()
            .take(size)
            .enumerate()
            .map(|(i, e)| e.ok_or_else(|| invalid(format!("no token has id {i}"))))
            .collect::<Result<_>>()?;
        Ok(table)
    }

    /// `v` as an id, if it is an integer below the number of vocabulary and added tokens.
    fn id_of(&self, v: &Value) -> Option<u32> {
        v.as_u64()
            .filter(|&id| id < self.capacity as u64)
            .map(|id| id as u32)
    }

    /// The id of `text` in the model's vocabulary.
    pub(crate) fn vocab_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).and_then(|v| self.id_of(v))
    }

    /// The id of the last added token whose content is one of `names`.
    pub(crate) fn added_id(&self, names: &[&str]) -> Option<u32> {
        self.added
            .iter()
            .rev()
            .find(|a| names.contains(&a.content))
            .map(|a| a.spec.id)
    }

    /// The added tokens' specifications, for the builder.
    pub(crate) fn added_specs(&self) -> Vec<AddedTokenSpec> {
        self.added.iter().map(|a| a.spec.clone()).collect()
    }
}
