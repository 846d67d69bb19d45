//! [`TokenizerSpec`]: a serialisable description of a [`crate::Tokenizer`], from which
//! [`crate::Tokenizer::from_spec`] rebuilds an identical one (same ids for every text, same
//! decoded text for every id sequence). .flm files store it as JSON inside the model file;
//! the GGUF importer builds one from the `tokenizer.ggml.*` metadata.
//!
//! JSON shape: pieces are strings when they are valid UTF-8 and arrays of byte values
//! otherwise; piece types are SentencePiece's `Type` numbers (1 normal, 2 unknown,
//! 3 control, 4 user-defined, 5 unused, 6 byte — also GGUF's `tokenizer.ggml.token_type`);
//! scores are numbers, or the strings `"NaN"`, `"inf"`, `"-inf"` for non-finite ones, so
//! every tokenizer serialises and reads back. Fields added later get a serde default so
//! older descriptions stay readable.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// Everything needed to rebuild a tokenizer. Build one with [`crate::Tokenizer::spec`] or
/// field by field (the GGUF importer does); [`crate::Tokenizer::from_spec`] checks it.
///
/// `pieces`, `scores` and `types` are indexed by token id and have the same length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizerSpec {
    /// The encoding algorithm and its settings.
    pub kind: TokenizerKind,
    /// The vocabulary in SentencePiece form ("▁" U+2581 for a space, `<0xHH>` for byte
    /// pieces), raw bytes.
    #[serde(with = "bytes_list")]
    pub pieces: Vec<Vec<u8>>,
    /// Merge priority of each piece for SentencePiece BPE (higher merges first); unused by
    /// the Hugging Face kind (zeros).
    #[serde(with = "scores")]
    pub scores: Vec<f32>,
    /// What each piece is.
    pub types: Vec<PieceType>,
    /// Characters missing from the vocabulary are encoded as their UTF-8 bytes' `<0xHH>`
    /// pieces (rather than as the unknown piece).
    pub byte_fallback: bool,
    /// The unknown piece. For the SentencePiece kind it must be the one piece of type
    /// [`PieceType::Unknown`] (or `None` if there is none).
    pub unk_id: Option<u32>,
    /// The beginning-of-sequence token.
    pub bos_id: Option<u32>,
    /// The end-of-sequence token.
    pub eos_id: Option<u32>,
    /// Whether the model expects prompts to start with BOS (GGUF
    /// `tokenizer.ggml.add_bos_token`); informational, [`crate::Tokenizer::encode`] takes
    /// the flag. Default true.
    #[serde(default = "yes")]
    pub add_bos: bool,
    /// The model's chat template: a Jinja string (GGUF `tokenizer.chat_template`, HF
    /// `tokenizer_config.json` `chat_template`), rendered by
    /// [`crate::Tokenizer::encode_chat`] unless `chat_format` is set.
    #[serde(default)]
    pub chat_template: Option<String>,
    /// The tokens `encode(.., true)` puts first; `None` means `[bos_id]`. ChatGLM2/3 and
    /// GLM-4 use `[gMASK] sop` here (THUDM's `get_prefix_tokens`).
    #[serde(default)]
    pub prefix: Option<Vec<u32>>,
    /// A built-in prompt format (ChatGLM2/3, GLM-4), preferred to `chat_template`.
    #[serde(default)]
    pub chat_format: Option<crate::ChatFormat>,
}

fn yes() -> bool {
    true
}

/// The encoding algorithm of a [`TokenizerSpec`], with its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TokenizerKind {
    /// SentencePiece BPE (`.model`, llama2.c `.bin`, GGUF "llama"): the identity
    /// normaliser, then merges by piece score.
    SentencePieceBpe(SentencePieceSpec),
    /// Hugging Face `tokenizers` BPE of the SentencePiece kind (`tokenizer.json`): merges
    /// by rank, normaliser steps, a `Metaspace` pre-tokenizer and added tokens.
    HfBpe(HfBpeSpec),
    /// Byte-level BPE: a regex pre-tokeniser, then merges of each pre-token's UTF-8 bytes,
    /// either by token rank (OpenAI's `tiktoken`, GLM-4: a piece's rank is its id) or by
    /// merge rank (GPT-2, Llama 3, Qwen2, Mistral-Nemo: `merges`). `pieces` are raw bytes
    /// (not GPT-2's byte-to-unicode spelling); the [`PieceType::Normal`] ones are the
    /// vocabulary (all 256 single bytes among them in the tiktoken style; a GPT-2-style one
    /// may lack some, which are then dropped from the text), [`PieceType::Control`] ones are
    /// special tokens and [`PieceType::UserDefined`] ones added tokens.
    ByteLevelBpe(ByteLevelBpeSpec),
}

/// The settings of a byte-level BPE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteLevelBpeSpec {
    /// The pre-tokenisation regex (fancy-regex syntax, as tiktoken's `pat_str` or
    /// `tokenizers`' `Split` pattern). Text between matches is a pre-token too
    /// (`tokenizers`' `Isolated` split behaviour). Runs in linear time on any text if its
    /// only look-around is a final `(?!\S)` on a `\s` repetition in a top-level
    /// alternative (GPT-2's, Llama 3's, Qwen2's, tiktoken's...); other look-arounds and
    /// possessive quantifiers fall back to fancy-regex's backtracking, which may refuse
    /// very long texts with [`crate::Error::Encode`].
    pub pattern: String,
    /// Regexes that cut the text before `pattern` does, in order: each cuts every piece
    /// the previous one left (matches and the text between them), and `pattern` cuts
    /// the pieces of the last (llama.cpp's `unicode_regex_split` with several regexes;
    /// `tokenizers`' `Sequence` of `Split`s). Empty for a single regex.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_split: Vec<String>,
    /// The merges, best (lowest rank) first, as (left, right) token ids, GPT-2 style: the
    /// merged token is the piece spelled as their concatenation. `None`: tiktoken style,
    /// the pair whose concatenation has the lowest id merges first.
    #[serde(default)]
    pub merges: Option<Vec<[u32; 2]>>,
    /// A pre-token that is a whole token is not merged (`tokenizers`' `ignore_merges`,
    /// Llama 3). Always so for the tiktoken style, as `tiktoken` does.
    #[serde(default)]
    pub ignore_merges: bool,
    /// The text is put in Unicode normalisation form C before pre-tokenisation
    /// (`tokenizers`' `NFC` normalizer, Qwen2), after the added tokens that are not
    /// `normalized` are cut out.
    #[serde(default)]
    pub nfc: bool,
    /// Tokens cut out of the text before pre-tokenisation, leftmost-longest, as
    /// `tokenizers` matches its added tokens: those not `normalized` in the raw text first,
    /// the others in the normalised rest.
    #[serde(default)]
    pub added_tokens: Vec<AddedTokenSpec>,
}

/// The settings of a SentencePiece BPE model (`NormalizerSpec` and `TrainerSpec` fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentencePieceSpec {
    /// Prepend "▁" to the text (`add_dummy_prefix`).
    pub add_dummy_prefix: bool,
    /// Drop leading, trailing and repeated spaces (`remove_extra_whitespaces`).
    pub remove_extra_whitespaces: bool,
    /// Write spaces as "▁" (`escape_whitespaces`).
    pub escape_whitespaces: bool,
    /// What the unknown piece decodes to (`unk_surface`, default " ⁇ ").
    #[serde(with = "bytes_one", default = "default_unk_surface")]
    pub unk_surface: Vec<u8>,
}

/// The unknown piece's surface when the model does not set one (" ⁇ ").
pub(crate) fn default_unk_surface() -> Vec<u8> {
    " \u{2047} ".into()
}

/// The settings of a Hugging Face BPE model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HfBpeSpec {
    /// The merges, best (lowest rank) first, as (left, right) token ids; the merged token
    /// is the vocabulary entry spelled as their concatenation.
    pub merges: Vec<[u32; 2]>,
    /// Normaliser steps, applied in order.
    pub normalizer: Vec<NormalizerStep>,
    /// The `Metaspace` pre-tokenizer (replacement "▁"), if any.
    pub metaspace: Option<MetaspaceSpec>,
    /// The `Split` pre-tokenizer on a string (Gemma's `Split(" ", MergedWithPrevious)`),
    /// if any; never beside a `Metaspace`.
    #[serde(default)]
    pub split: Option<SplitSpec>,
    /// Consecutive unknown characters become one unknown token (`fuse_unk`).
    pub fuse_unk: bool,
    /// A word found whole in the vocabulary is not merged (`ignore_merges`).
    pub ignore_merges: bool,
    /// Tokens cut out of the text before the model sees it, in matching priority order.
    pub added_tokens: Vec<AddedTokenSpec>,
    /// Ids of tokens that exist only as added tokens, outside the model's `vocab`.
    pub added_only: Vec<u32>,
}

/// An added token of a Hugging Face tokenizer; its text is `pieces[id]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddedTokenSpec {
    /// The token id.
    pub id: u32,
    /// Also swallow the whitespace before the token.
    pub lstrip: bool,
    /// Also swallow the whitespace after the token.
    pub rstrip: bool,
    /// Match the token in the normalised text (rather than the raw input).
    pub normalized: bool,
}

/// A `tokenizers` normaliser step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NormalizerStep {
    /// `Prepend`: put `prepend` before non-empty text.
    Prepend {
        /// The text to prepend.
        prepend: String,
    },
    /// `Replace` with a string pattern: replace every `pattern` by `content`.
    Replace {
        /// What to replace (non-empty).
        pattern: String,
        /// The replacement.
        content: String,
    },
}

/// The `Metaspace` pre-tokenizer: spaces become "▁".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaspaceSpec {
    /// When "▁" is prepended to a piece of text that does not start with it.
    pub prepend_scheme: PrependScheme,
    /// Split words before every "▁".
    pub split: bool,
}

/// The `Split` pre-tokenizer of `tokenizers` with a string pattern (not inverted): the
/// text is cut at every occurrence of `pattern`, which goes where `behavior` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitSpec {
    /// The delimiter.
    pub pattern: String,
    /// What becomes of each delimiter.
    pub behavior: SplitBehavior,
}

/// `SplitDelimiterBehavior` of `tokenizers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitBehavior {
    /// Dropped.
    Removed,
    /// A piece of its own.
    Isolated,
    /// The end of the piece before it.
    MergedWithPrevious,
    /// The start of the piece after it.
    MergedWithNext,
}

impl SplitSpec {
    /// The non-empty pieces of `text`, in order.
    pub(crate) fn pieces<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut out = Vec::new();
        let mut start = 0;
        for (i, m) in text.match_indices(self.pattern.as_str()) {
            let end = i + m.len();
            match self.behavior {
                SplitBehavior::Removed => out.push(&text[start..i]),
                SplitBehavior::Isolated => out.extend([&text[start..i], m]),
                SplitBehavior::MergedWithPrevious => out.push(&text[start..end]),
                SplitBehavior::MergedWithNext => {
                    out.push(&text[start..i]);
                    start = i;
                    continue;
                }
            }
            start = end;
        }
        out.push(&text[start..]);
        out.retain(|p| !p.is_empty());
        out
    }
}

/// `Metaspace`'s `prepend_scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrependScheme {
    /// Before every piece of text.
    Always,
    /// Only before the text at the start of the input.
    First,
    /// Never.
    Never,
}

/// What a piece is: SentencePiece's `ModelProto.SentencePiece.Type`, serialised as its
/// number (also GGUF's `tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub enum PieceType {
    /// 1: an ordinary piece.
    Normal = 1,
    /// 2: the unknown piece.
    Unknown = 2,
    /// 3: a control symbol (BOS, EOS, special tokens), decoded as nothing.
    Control = 3,
    /// 4: a user-defined symbol, matched whole in the input.
    UserDefined = 4,
    /// 5: an unused piece, split back into its parts when merged.
    Unused = 5,
    /// 6: a byte-fallback piece; its text must be `<0xHH>`.
    Byte = 6,
}

impl TryFrom<u8> for PieceType {
    type Error = String;

    fn try_from(n: u8) -> Result<Self, String> {
        Ok(match n {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return Err(format!("piece type {n} (expected 1 to 6)")),
        })
    }
}

impl From<PieceType> for u8 {
    fn from(t: PieceType) -> u8 {
        t as u8
    }
}

/// Bytes as a string when valid UTF-8, else as an array of byte values.
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => s.collect_seq(self.0),
        }
    }
}

/// Reads what [`Bytes`] writes (a string, an array of byte values, or bytes).
struct OwnedBytes(Vec<u8>);

impl<'de> Deserialize<'de> for OwnedBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OwnedBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of byte values")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OwnedBytes, E> {
                Ok(OwnedBytes(v.as_bytes().to_vec()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<OwnedBytes, E> {
                Ok(OwnedBytes(v.to_vec()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OwnedBytes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(OwnedBytes(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// Serde adapter for one byte string (see [`Bytes`]).
mod bytes_one {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        Bytes(v).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        OwnedBytes::deserialize(d).map(|b| b.0)
    }
}

/// Serde adapter for a list of byte strings (see [`Bytes`]).
mod bytes_list {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|p| Bytes(p)))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let list = Vec::<OwnedBytes>::deserialize(d)?;
        Ok(list.into_iter().map(|b| b.0).collect())
    }
}

/// Serde adapter for scores: finite values as numbers, others as "NaN", "inf", "-inf"
/// (JSON has no number for them).
mod scores {
    use super::*;

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Score {
        Number(f32),
        Special(String),
    }

    pub(super) fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|&x| {
            if x.is_finite() {
                Score::Number(x)
            } else if x.is_nan() {
                Score::Special("NaN".into())
            } else if x > 0.0 {
                Score::Special("inf".into())
            } else {
                Score::Special("-inf".into())
            }
        }))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        Vec::<Score>::deserialize(d)?
            .into_iter()
            .map(|s| match s {
                Score::Number(x) => Ok(x),
                Score::Special(s) => match s.as_str() {
                    "NaN" => Ok(f32::NAN),
                    "inf" => Ok(f32::INFINITY),
                    "-inf" => Ok(f32::NEG_INFINITY),
                    _ => Err(de::Error::custom(format!("score {s:?} is not a number"))),
                },
            })
            .collect()
    }
}
