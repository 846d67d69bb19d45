//! SentencePiece models ready to encode: the vocabulary checks of
//! `ModelInterface::InitializePieces` (model_interface.cc) and the identity normaliser of
//! `Normalizer::Normalize` (normalizer.cc), as of sentencepiece 0.2.3. Shared by
//! `.model` files (`sp_proto.rs`) and llama2.c `tokenizer.bin` (`llama2c.rs`).
//!
//! Normalisation is implemented for models whose `precompiled_charsmap` is empty, i.e.
//! the identity normaliser used by Llama, Mistral, ChatGLM2 and llama2.c's models. A
//! model with precompiled NFKC rules is rejected with [`Error::Unsupported`] rather than
//! tokenised differently from SentencePiece.

use std::collections::HashMap;

use crate::decode::DecodeOptions;
use crate::fast_hash::{pair_key, FastMap};
use crate::spec::{SentencePieceSpec, TokenizerKind};
use crate::trie::{Trie, TrieBuilder};
use crate::vocab::{PieceKind, VocabEntry};
use crate::{Encoder, Error, Result, Tokenizer};

/// The identity normaliser's switches (`NormalizerSpec`, defaults all true).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NormalizerOptions {
    pub(crate) add_dummy_prefix: bool,
    pub(crate) remove_extra_whitespaces: bool,
    pub(crate) escape_whitespaces: bool,
}

/// "▁" (U+2581), SentencePiece's visible space.
pub(crate) const SPACE_SYMBOL: &[u8] = "\u{2581}".as_bytes();

/// A SentencePiece BPE model ready to encode: the lookup structures of
/// `ModelInterface` plus the normaliser. The merge loop is in `bpe.rs`.
#[derive(Debug, Clone)]
pub(crate) struct SpModel {
    /// NORMAL, USER_DEFINED and UNUSED pieces: the possible merge results, and the only
    /// pieces a symbol can be emitted as (anything else becomes unknown).
    pub(crate) normal: Trie,
    /// The pairs of merge targets (left id, right id, as [`pair_key`]) whose
    /// concatenation is a merge target, with its id and score: `bpe.rs` merges two
    /// symbols that spell pieces by one lookup here instead of walking `normal` along
    /// their bytes.
    pub(crate) pairs: FastMap<u64, (u32, f32)>,
    /// USER_DEFINED pieces, matched longest-first before splitting into characters.
    pub(crate) user_defined: Trie,
    /// The UNKNOWN piece; optional with byte fallback.
    pub(crate) unk_id: Option<u32>,
    /// The `<0xHH>` piece ids, when byte fallback is on.
    pub(crate) byte_ids: Option<Box<[u32; 256]>>,
    pub(crate) normalizer: NormalizerOptions,
    /// No merge can join a character other than "▁" to a following "▁": no merge
    /// target has "▁" after another character, and none is UNUSED (their resegmenting
    /// depends on the order of merges across the whole text). Then the text is merged
    /// word by word, each word starting at such a "▁" (`bpe.rs`), with the same result.
    pub(crate) merges_within_words: bool,
}

/// Whether `piece` has "▁" right after a character other than "▁".
fn joins_a_space(piece: &[u8]) -> bool {
    (1..piece.len())
        .any(|k| piece[k..].starts_with(SPACE_SYMBOL) && !piece[..k].ends_with(SPACE_SYMBOL))
}

/// sentencepiece's `kMaxPieceSize`.
const MAX_PIECE_SIZE: usize = 8000;

impl SpModel {
    /// Builds the lookups with the checks of `ModelInterface::InitializePieces`
    /// (sentencepiece 0.2.3, BPE: one map for all pieces): no empty, overlong or
    /// duplicate piece, no NUL byte except in an UNUSED "\0" piece (which is skipped),
    /// at most one UNKNOWN piece (required without byte fallback), byte pieces only with
    /// byte fallback and then all 256 of them.
    pub(crate) fn new(
        pieces: &[VocabEntry],
        byte_fallback: bool,
        normalizer: NormalizerOptions,
    ) -> Result<SpModel> {
        if pieces.len() >= u32::MAX as usize {
            return Err(Error::Invalid(format!("{} pieces", pieces.len())));
        }
        let name = |p: &VocabEntry| String::from_utf8_lossy(&p.bytes).into_owned();
        let mut all = HashMap::with_capacity(pieces.len());
        let mut normal = TrieBuilder::new();
        let mut user_defined = TrieBuilder::new();
        let mut unk_id = None;
        let mut byte_ids = [u32::MAX; 256];
        let mut merges_within_words = true;
        for (id, p) in pieces.iter().enumerate() {
            let id = id as u32;
            if p.bytes.is_empty() {
                return Err(Error::Invalid(format!("piece {id} is empty")));
            }
            if p.bytes.len() >= MAX_PIECE_SIZE {
                return Err(Error::Invalid(format!("piece {id} is too long")));
            }
            if *p.bytes == *b"\0" && p.kind == PieceKind::Unused {
                continue;
            }
            if p.bytes.contains(&0) {
                return Err(Error::Invalid(format!("piece {id} contains a NUL byte")));
            }
            if let Some(first) = all.insert(&p.bytes[..], id) {
                return Err(Error::Invalid(format!(
                    "piece {:?} is defined twice (ids {first} and {id})",
                    name(p)
                )));
            }
            if p.kind.is_merge_target() {
                normal.insert(&p.bytes, id);
                merges_within_words &= p.kind != PieceKind::Unused && !joins_a_space(&p.bytes);
            }
            match p.kind {
                PieceKind::UserDefined => {
                    user_defined.insert(&p.bytes, id);
                }
                PieceKind::Unknown if unk_id.is_some() => {
                    return Err(Error::Invalid("more than one unknown piece".into()));
                }
                PieceKind::Unknown => unk_id = Some(id),
                PieceKind::Byte(_) if !byte_fallback => {
                    return Err(Error::Invalid(format!(
                        "byte piece {} although byte_fallback is off",
                        name(p)
                    )));
                }
                PieceKind::Byte(b) => byte_ids[b as usize] = id,
                _ => {}
            }
        }
        if unk_id.is_none() && !byte_fallback {
            return Err(Error::Invalid("no unknown piece (<unk>)".into()));
        }
        if byte_fallback && byte_ids.contains(&u32::MAX) {
            return Err(Error::Invalid(
                "byte_fallback is on but not all 256 byte pieces <0xHH> exist".into(),
            ));
        }
        let normal = normal.build();
        let mut pairs = FastMap::default();
        for (id, p) in (0u32..).zip(pieces) {
            if !p.kind.is_merge_target() || normal.get(&p.bytes) != Some(id) {
                continue;
            }
            for k in 1..p.bytes.len() {
                if let (Some(a), Some(b)) = (normal.get(&p.bytes[..k]), normal.get(&p.bytes[k..])) {
                    pairs.insert(pair_key(a, b), (id, p.score));
                }
            }
        }
        Ok(SpModel {
            normal,
            pairs,
            user_defined: user_defined.build(),
            unk_id,
            byte_ids: byte_fallback.then(|| Box::new(byte_ids)),
            normalizer,
            merges_within_words,
        })
    }

    /// Length of the symbol starting `text`, and whether it is a user-defined symbol
    /// (`PrefixMatcher::PrefixMatch`): the longest user-defined symbol, else one UTF-8
    /// character as `OneCharLen` measures it.
    pub(crate) fn prefix_match(&self, text: &[u8]) -> (usize, bool) {
        if let Some((len, _)) = self.user_defined.longest_prefix(text) {
            return (len, true);
        }
        const LEN: &[u8; 16] = b"\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x02\x02\x03\x04";
        let len = LEN[(text[0] >> 4) as usize] as usize;
        (len.min(text.len()), false)
    }

    /// `Normalizer::Normalize` with an empty charsmap: optionally drop leading, trailing
    /// and repeated spaces, add the dummy prefix, and write spaces as "▁".
    pub(crate) fn normalize(&self, text: &str) -> Vec<u8> {
        let opts = self.normalizer;
        let mut input = text.as_bytes();
        let mut out = Vec::with_capacity(input.len() + input.len() / 2 + 3);
        if opts.remove_extra_whitespaces {
            while !input.is_empty() && self.prefix_match(input).0 == 1 && input[0] == b' ' {
                input = &input[1..];
            }
        }
        if input.is_empty() {
            return out;
        }
        let ws: &[u8] = if opts.escape_whitespaces {
            SPACE_SYMBOL
        } else {
            b" "
        };
        if opts.add_dummy_prefix {
            out.extend_from_slice(ws);
        }
        let mut is_prev_space = opts.remove_extra_whitespaces;
        while !input.is_empty() {
            let consumed = self.prefix_match(input).0;
            let mut sp = &input[..consumed];
            if is_prev_space {
                while let Some(rest) = sp.strip_prefix(b" ") {
                    sp = rest;
                }
            }
            if !sp.is_empty() {
                for &b in sp {
                    if opts.escape_whitespaces && b == b' ' {
                        out.extend_from_slice(SPACE_SYMBOL);
                    } else {
                        out.push(b);
                    }
                }
                is_prev_space = sp.ends_with(b" ");
            }
            input = &input[consumed..];
            if !opts.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if opts.remove_extra_whitespaces {
            while out.ends_with(ws) {
                out.truncate(out.len() - ws.len());
            }
        }
        out
    }
}

/// Builds a SentencePiece-style tokenizer from its pieces (shared by `.model` and
/// llama2.c `.bin`) with the builder of [`crate::Tokenizer::from_spec`]. BOS/EOS are the
/// CONTROL pieces named `bos_piece`/`eos_piece`, as `SentencePieceProcessor::bos_id`
/// finds them.
pub(crate) fn build_tokenizer(
    pieces: Vec<VocabEntry>,
    byte_fallback: bool,
    normalizer: NormalizerOptions,
    special: (&[u8], &[u8]),
    unk_surface: Option<Vec<u8>>,
) -> Result<Tokenizer> {
    let control = |name: &[u8]| {
        let id = pieces.iter().position(|p| *p.bytes == *name)?;
        (pieces[id].kind == PieceKind::Control).then_some(id as u32)
    };
    let (bos, eos) = (control(special.0), control(special.1));
    // `SpModel::new` rejects a second unknown piece before this is compared with its own.
    let unk_id = pieces.iter().position(|p| p.kind == PieceKind::Unknown);
    let kind = TokenizerKind::SentencePieceBpe(SentencePieceSpec {
        add_dummy_prefix: normalizer.add_dummy_prefix,
        remove_extra_whitespaces: normalizer.remove_extra_whitespaces,
        escape_whitespaces: normalizer.escape_whitespaces,
        unk_surface: unk_surface.unwrap_or_else(crate::spec::default_unk_surface),
    });
    let unk_id = unk_id.map(|id| id as u32);
    crate::spec_build::build(pieces, kind, byte_fallback, unk_id, (bos, eos))
}

/// Assembles a SentencePiece tokenizer; the decoder's space handling follows from the
/// normaliser (sentencepiece_processor.cc `Decode`).
pub(crate) fn sp_tokenizer(
    pieces: Vec<VocabEntry>,
    model: SpModel,
    (bos, eos): (Option<u32>, Option<u32>),
    unk_surface: Vec<u8>,
) -> Tokenizer {
    let normalizer = model.normalizer;
    let decoding = DecodeOptions {
        strip_bos_space: normalizer.add_dummy_prefix || normalizer.remove_extra_whitespaces,
        strip_all_leading_spaces: normalizer.remove_extra_whitespaces,
        unk_surface: unk_surface.into(),
        byte_level: false,
    };
    Tokenizer {
        pieces,
        bos,
        eos,
        encoder: Encoder::SentencePiece(model),
        decoding,
        add_bos: true,
        chat_template: None,
        prefix: None,
        chat_format: None,
        template_time: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(add_dummy_prefix: bool, remove_extra_whitespaces: bool, user: &[&str]) -> SpModel {
        let mut pieces = vec![VocabEntry {
            bytes: b"<unk>"[..].into(),
            score: 0.0,
            kind: PieceKind::Unknown,
        }];
        for u in user {
            pieces.push(VocabEntry {
                bytes: u.as_bytes().into(),
                score: 0.0,
                kind: PieceKind::UserDefined,
            });
        }
        let opts = NormalizerOptions {
            add_dummy_prefix,
            remove_extra_whitespaces,
            escape_whitespaces: true,
        };
        SpModel::new(&pieces, false, opts).unwrap()
    }

    fn norm(m: &SpModel, s: &str) -> String {
        String::from_utf8(m.normalize(s)).unwrap()
    }

    // Expected values: sentencepiece 0.2.3 `normalize` with the same NormalizerSpec.
    #[test]
    fn identity_normaliser() {
        let llama = model(true, false, &[]);
        assert_eq!(norm(&llama, ""), "");
        assert_eq!(norm(&llama, "Hello world"), "▁Hello▁world");
        assert_eq!(norm(&llama, "  a  b "), "▁▁▁a▁▁b▁");
        assert_eq!(norm(&llama, "\n"), "▁\n");
        let collapse = model(true, true, &[]);
        assert_eq!(norm(&collapse, "  a  b "), "▁a▁b");
        assert_eq!(norm(&collapse, "   "), "");
        assert_eq!(norm(&collapse, "a\t  b"), "▁a\t▁b");
        assert_eq!(norm(&collapse, "a ▁"), "▁a");
        let bare = model(false, false, &[]);
        assert_eq!(norm(&bare, " a"), "▁a");
    }

    #[test]
    fn user_defined_symbols_pass_whole() {
        let m = model(true, true, &["<b>", "a  b"]);
        // Inside a user-defined symbol spaces are not collapsed, only escaped.
        assert_eq!(norm(&m, "x  a  b  <b>"), "▁x▁a▁▁b▁<b>");
        assert_eq!(m.prefix_match("<b>x".as_bytes()), (3, true));
        assert_eq!(m.prefix_match("éx".as_bytes()), (2, false));
    }

    #[test]
    fn vocabulary_checks() {
        let opts = NormalizerOptions {
            add_dummy_prefix: true,
            remove_extra_whitespaces: false,
            escape_whitespaces: true,
        };
        let piece = |s: &str, kind| VocabEntry {
            bytes: s.as_bytes().into(),
            score: 0.0,
            kind,
        };
        let unk = piece("<unk>", PieceKind::Unknown);
        let a = piece("a", PieceKind::Normal);
        assert!(SpModel::new(&[unk.clone(), a.clone()], false, opts).is_ok());
        // Merging word by word needs pieces with "▁" only after "▁" (or first), and no
        // UNUSED piece.
        for (pieces, words) in [
            (&["▁a", "▁▁", "▁▁a", "a"][..], true),
            (&["a▁"], false),
            (&["▁a▁"], false),
            (&["é▁▁"], false),
        ] {
            let mut all = vec![unk.clone()];
            all.extend(pieces.iter().map(|p| piece(p, PieceKind::Normal)));
            let m = SpModel::new(&all, false, opts).unwrap();
            assert_eq!(m.merges_within_words, words, "{pieces:?}");
        }
        let unused = piece("▁b", PieceKind::Unused);
        let m = SpModel::new(&[unk.clone(), unused], false, opts).unwrap();
        assert!(!m.merges_within_words);
        assert!(
            SpModel::new(std::slice::from_ref(&a), false, opts).is_err(),
            "no <unk>"
        );
        assert!(SpModel::new(&[unk.clone(), a.clone(), a.clone()], false, opts).is_err());
        let ctl = piece("a", PieceKind::Control);
        assert!(SpModel::new(&[unk.clone(), a, ctl], false, opts).is_err());
        let byte = piece("<0x41>", PieceKind::Byte(0x41));
        assert!(SpModel::new(&[unk.clone(), byte.clone()], false, opts).is_err());
        assert!(
            SpModel::new(&[unk, byte], true, opts).is_err(),
            "255 bytes missing"
        );
        let empty = piece("", PieceKind::Normal);
        assert!(SpModel::new(&[empty], true, opts).is_err());
    }
}
