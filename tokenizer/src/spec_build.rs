//! [`Tokenizer::spec`] and [`Tokenizer::from_spec`]: a tokenizer to its description and
//! back. Rebuilding goes through [`build`], the builder the file readers use too (so it
//! runs their checks: `SpModel::new` for SentencePiece, the vocabulary and merge checks of
//! `hf_model` for Hugging Face BPE), after the consistency checks a hand-made description
//! needs (lengths, ids in range), so any description, valid or not, gives a tokenizer or
//! an [`Error::Invalid`], never a panic.

use std::collections::HashSet;

use crate::byte_bpe::ByteBpe;
use crate::decode::DecodeOptions;
use crate::fast_hash::FastMap;
use crate::hf_bpe::{
    normalize, AddedTokens, AddedTokensBuilder, HfModel, Metaspace, NormOp, Prepend,
};
use crate::sentencepiece::{sp_tokenizer, NormalizerOptions, SpModel};
use crate::spec::{
    AddedTokenSpec, HfBpeSpec, MetaspaceSpec, NormalizerStep, PieceType, PrependScheme,
    SentencePieceSpec, TokenizerKind, TokenizerSpec,
};
use crate::trie::TrieBuilder;
use crate::vocab::{byte_piece, parse_byte_piece, PieceKind, VocabEntry};
use crate::{Encoder, Error, Result, Tokenizer};

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("tokenizer spec: {what}"))
}

impl Tokenizer {
    /// A description from which [`Tokenizer::from_spec`] rebuilds this tokenizer exactly
    /// (same ids for every text, same text for every ids). Serialise it with serde (the
    /// .flm format stores it as JSON).
    pub fn spec(&self) -> TokenizerSpec {
        let kind = match &self.encoder {
            Encoder::SentencePiece(m) => TokenizerKind::SentencePieceBpe(SentencePieceSpec {
                add_dummy_prefix: m.normalizer.add_dummy_prefix,
                remove_extra_whitespaces: m.normalizer.remove_extra_whitespaces,
                escape_whitespaces: m.normalizer.escape_whitespaces,
                unk_surface: self.decoding.unk_surface.to_vec(),
            }),
            Encoder::HuggingFace(m) => TokenizerKind::HfBpe(hf_spec(m, &self.pieces)),
            Encoder::ByteLevel(m) => TokenizerKind::ByteLevelBpe(m.spec.clone()),
        };
        let (unk_id, byte_fallback) = match &self.encoder {
            Encoder::SentencePiece(m) => (m.unk_id, m.byte_ids.is_some()),
            Encoder::HuggingFace(m) => (m.unk, m.byte_ids.is_some()),
            Encoder::ByteLevel(_) => (None, false),
        };
        TokenizerSpec {
            kind,
            pieces: self.pieces.iter().map(|p| p.bytes.to_vec()).collect(),
            scores: self.pieces.iter().map(|p| p.score).collect(),
            types: self.pieces.iter().map(|p| piece_type(p.kind)).collect(),
            byte_fallback,
            unk_id,
            bos_id: self.bos,
            eos_id: self.eos,
            add_bos: self.add_bos,
            chat_template: self.chat_template().map(str::to_owned),
            prefix: self.prefix.clone(),
            chat_format: self.chat_format,
        }
    }

    /// Rebuilds a tokenizer from its description.
    ///
    /// Errors: [`Error::Invalid`] naming the first problem: `pieces`, `scores` and `types`
    /// of different lengths, an id out of range, a byte piece not spelled `<0xHH>`, a
    /// merge whose result is not in the vocabulary, and every check of the file readers
    /// (duplicate or empty pieces, a missing unknown piece, missing byte pieces...).
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer> {
        let n = spec.pieces.len();
        if n == 0 {
            return Err(invalid("no pieces"));
        }
        if n >= u32::MAX as usize {
            return Err(invalid(format!("{n} pieces")));
        }
        if spec.scores.len() != n || spec.types.len() != n {
            return Err(invalid(format!(
                "{n} pieces but {} scores and {} types",
                spec.scores.len(),
                spec.types.len()
            )));
        }
        let in_range = |name: &str, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(invalid(format!(
                "{name} {id} is outside the vocabulary of {n}"
            ))),
            _ => Ok(()),
        };
        in_range("bos_id", spec.bos_id)?;
        in_range("eos_id", spec.eos_id)?;
        in_range("unk_id", spec.unk_id)?;
        for &id in spec.prefix.iter().flatten() {
            in_range("prefix token", Some(id))?;
        }
        let mut pieces = Vec::with_capacity(n);
        for (id, ((bytes, score), ty)) in spec
            .pieces
            .into_iter()
            .zip(spec.scores)
            .zip(spec.types)
            .enumerate()
        {
            let kind = piece_kind(ty, &bytes).ok_or_else(|| {
                invalid(format!(
                    "piece {id} has type byte but is {:?}, not <0xHH>",
                    String::from_utf8_lossy(&bytes)
                ))
            })?;
            pieces.push(VocabEntry {
                bytes: bytes.into(),
                score,
                kind,
            });
        }
        let special = (spec.bos_id, spec.eos_id);
        let mut tok = build(pieces, spec.kind, spec.byte_fallback, spec.unk_id, special)?;
        tok.add_bos = spec.add_bos;
        tok.prefix = spec.prefix;
        tok.chat_format = spec.chat_format;
        tok.with_chat_template(
            spec.chat_template,
            "the tokenizer description's `chat_template`",
        )
    }
}

/// Assembles a tokenizer from its pieces and the settings of its kind: the one builder
/// behind [`Tokenizer::from_spec`] and every file reader (`sp_proto.rs` and `llama2c.rs`
/// through `sentencepiece::build_tokenizer`, `hf_json.rs`), so all of them make the same
/// lookups and run the same checks. `special` is (BOS, EOS); ids must be in range.
pub(crate) fn build(
    pieces: Vec<VocabEntry>,
    kind: TokenizerKind,
    byte_fallback: bool,
    unk_id: Option<u32>,
    special: (Option<u32>, Option<u32>),
) -> Result<Tokenizer> {
    Ok(match kind {
        TokenizerKind::SentencePieceBpe(sp) => {
            let normalizer = NormalizerOptions {
                add_dummy_prefix: sp.add_dummy_prefix,
                remove_extra_whitespaces: sp.remove_extra_whitespaces,
                escape_whitespaces: sp.escape_whitespaces,
            };
            let model = SpModel::new(&pieces, byte_fallback, normalizer)?;
            if model.unk_id != unk_id {
                let id = |id: Option<u32>| id.map_or_else(|| "none".to_string(), |i| i.to_string());
                return Err(invalid(format!(
                    "unk_id {} is not the unknown piece ({})",
                    id(unk_id),
                    id(model.unk_id)
                )));
            }
            sp_tokenizer(pieces, model, special, sp.unk_surface)
        }
        TokenizerKind::HfBpe(hf) => {
            let model = hf_model(hf, &pieces, unk_id, byte_fallback)?;
            model.into_tokenizer(pieces, special.0, special.1)
        }
        TokenizerKind::ByteLevelBpe(b) => {
            if byte_fallback || unk_id.is_some() {
                return Err(invalid(
                    "a byte-level BPE has neither byte fallback nor an unknown piece",
                ));
            }
            let model = ByteBpe::new(&pieces, b)?;
            Tokenizer {
                pieces,
                bos: special.0,
                eos: special.1,
                encoder: Encoder::ByteLevel(model),
                decoding: DecodeOptions {
                    strip_bos_space: false,
                    strip_all_leading_spaces: false,
                    unk_surface: Box::default(),
                    byte_level: true,
                },
                add_bos: true,
                chat_template: None,
                prefix: None,
                chat_format: None,
                template_time: None,
            }
        }
    })
}

fn piece_type(kind: PieceKind) -> PieceType {
    match kind {
        PieceKind::Normal => PieceType::Normal,
        PieceKind::Unknown => PieceType::Unknown,
        PieceKind::Control => PieceType::Control,
        PieceKind::UserDefined => PieceType::UserDefined,
        PieceKind::Unused => PieceType::Unused,
        PieceKind::Byte(_) => PieceType::Byte,
    }
}

/// The kind of a piece of type `ty`; `None` for a byte piece not spelled `<0xHH>`.
fn piece_kind(ty: PieceType, bytes: &[u8]) -> Option<PieceKind> {
    Some(match ty {
        PieceType::Normal => PieceKind::Normal,
        PieceType::Unknown => PieceKind::Unknown,
        PieceType::Control => PieceKind::Control,
        PieceType::UserDefined => PieceKind::UserDefined,
        PieceType::Unused => PieceKind::Unused,
        PieceType::Byte => PieceKind::Byte(parse_byte_piece(bytes)?),
    })
}

/// The description of a Hugging Face BPE model.
fn hf_spec(m: &HfModel, pieces: &[VocabEntry]) -> HfBpeSpec {
    let mut merges: Vec<(u32, [u32; 2])> = m
        .merges
        .iter()
        .map(|(&(l, r), &(rank, _))| (rank, [l, r]))
        .collect();
    merges.sort_unstable();
    let added = |set: &AddedTokens, normalized: bool| {
        set.tokens
            .iter()
            .map(|t| AddedTokenSpec {
                id: t.id,
                lstrip: t.lstrip,
                rstrip: t.rstrip,
                normalized,
            })
            .collect::<Vec<_>>()
    };
    let mut added_tokens = added(&m.added_raw, false);
    added_tokens.extend(added(&m.added_normalized, true));
    HfBpeSpec {
        merges: merges.into_iter().map(|(_, pair)| pair).collect(),
        normalizer: m
            .normalizer
            .iter()
            .map(|op| match op {
                NormOp::Prepend(p) => NormalizerStep::Prepend { prepend: p.clone() },
                NormOp::Replace(a, b) => NormalizerStep::Replace {
                    pattern: a.clone(),
                    content: b.clone(),
                },
            })
            .collect(),
        metaspace: m.metaspace.as_ref().map(|ms| MetaspaceSpec {
            prepend_scheme: match ms.prepend {
                Prepend::Always => PrependScheme::Always,
                Prepend::First => PrependScheme::First,
                Prepend::Never => PrependScheme::Never,
            },
            split: ms.split,
        }),
        split: m.split.clone(),
        fuse_unk: m.fuse_unk,
        ignore_merges: m.ignore_merges,
        added_tokens,
        added_only: (0..pieces.len() as u32)
            .filter(|&id| m.vocab.get(&pieces[id as usize].bytes) != Some(id))
            .collect(),
    }
}

/// Builds a Hugging Face BPE model: the vocabulary (every piece not in `added_only`), the
/// merges by rank, and the added-token tries, with the checks a hand-made description
/// needs (`hf_json.rs` has already run them, by token text, on a `tokenizer.json`).
fn hf_model(
    hf: HfBpeSpec,
    pieces: &[VocabEntry],
    unk: Option<u32>,
    byte_fallback: bool,
) -> Result<HfModel> {
    let n = pieces.len();
    let mut added_only = HashSet::with_capacity(hf.added_only.len());
    for &id in &hf.added_only {
        if id as usize >= n {
            return Err(invalid(format!("added-only token {id} is out of range")));
        }
        added_only.insert(id);
    }
    let mut vocab = TrieBuilder::new();
    for (id, p) in (0u32..).zip(pieces) {
        if !added_only.contains(&id) && vocab.insert(&p.bytes, id).is_some() {
            return Err(invalid(format!(
                "piece {:?} is in the vocabulary twice",
                String::from_utf8_lossy(&p.bytes)
            )));
        }
    }
    let vocab = vocab.build();
    let in_vocab = |id: u32| (id as usize) < n && !added_only.contains(&id);
    let mut merges = FastMap::with_capacity_and_hasher(hf.merges.len(), Default::default());
    for (rank, &[l, r]) in (0u32..).zip(&hf.merges) {
        if !in_vocab(l) || !in_vocab(r) {
            return Err(invalid(format!(
                "merge {l} {r} names a token outside the vocabulary"
            )));
        }
        let joined = [&pieces[l as usize].bytes[..], &pieces[r as usize].bytes[..]].concat();
        let merged = vocab.get(&joined).ok_or_else(|| {
            invalid(format!(
                "merge {l} {r}: {:?} is not in the vocabulary",
                String::from_utf8_lossy(&joined)
            ))
        })?;
        merges.insert((l, r), (rank, merged));
    }
    let mut normalizer = Vec::with_capacity(hf.normalizer.len());
    for step in hf.normalizer {
        normalizer.push(match step {
            NormalizerStep::Prepend { prepend } => NormOp::Prepend(prepend),
            NormalizerStep::Replace { pattern, .. } if pattern.is_empty() => {
                return Err(invalid("a Replace normaliser step with an empty pattern"))
            }
            NormalizerStep::Replace { pattern, content } => NormOp::Replace(pattern, content),
        });
    }
    let mut added = AddedTokensBuilder::new();
    for t in &hf.added_tokens {
        let content = pieces
            .get(t.id as usize)
            .and_then(|p| std::str::from_utf8(&p.bytes).ok())
            .ok_or_else(|| invalid(format!("added token {} is not a UTF-8 piece", t.id)))?;
        if t.normalized {
            added.add(t, &normalize(&normalizer, content));
        } else {
            added.add(t, content);
        }
    }
    let (added_raw, added_normalized) = added.build();
    let byte_ids = byte_fallback.then(|| {
        Box::new(std::array::from_fn(|b| {
            vocab.get(byte_piece(b as u8).as_bytes())
        }))
    });
    Ok(HfModel {
        vocab,
        merges,
        unk,
        fuse_unk: hf.fuse_unk,
        byte_ids,
        ignore_merges: hf.ignore_merges,
        added_raw,
        added_normalized,
        normalizer,
        metaspace: hf.metaspace.map(|m| Metaspace {
            replacement: '\u{2581}',
            prepend: match m.prepend_scheme {
                PrependScheme::Always => Prepend::Always,
                PrependScheme::First => Prepend::First,
                PrependScheme::Never => Prepend::Never,
            },
            split: m.split,
        }),
        split: hf.split,
    })
}
