//! llama2.c `tokenizer.bin` (written by llama2.c tokenizer.py `export`, read by run.c
//! `build_tokenizer`): a little-endian u32 `max_token_length`, then per token an f32
//! score, an i32 byte length and the bytes. The file does not store the vocabulary size;
//! it is parsed to the end of the data.
//!
//! The file is a SentencePiece vocabulary with "▁" written as a space, `<s>`/`</s>` as
//! "\n<s>\n"/"\n</s>\n", and byte pieces `<0x00>`..`<0xFF>`. flm reads it back into
//! SentencePiece form (so [`crate::Tokenizer::piece`] gives the same bytes as for the
//! `.model`) and encodes it with the SentencePiece BPE of `bpe.rs`, with the settings of
//! the Llama 2 model: dummy prefix, no whitespace collapsing, byte fallback when all 256
//! byte pieces are present. run.c's own simplified encoder (highest-score pair first, no
//! tie or UNUSED rules) gives the same ids on SentencePiece-trained vocabularies; flm uses
//! the exact algorithm. Piece kinds the file cannot carry (USER_DEFINED, UNUSED) are lost
//! in the export; every other piece is NORMAL.

use crate::sentencepiece::{build_tokenizer, NormalizerOptions, SPACE_SYMBOL};
use crate::vocab::{parse_byte_piece, PieceKind, VocabEntry};
use crate::{Result, Tokenizer};

/// Longest `max_token_length` accepted as plausible (real files: 27 for Llama 2, 7 for
/// stories260K's tok512).
const MAX_TOKEN_LENGTH: u32 = 1 << 16;

/// Why bytes are not a complete llama2.c tokenizer.
pub(crate) enum Reject {
    /// Plausible so far, but the data stops inside an entry (after this many entries).
    Truncated(usize),
    /// Not this format.
    NotLlama2c(String),
}

/// Splits the file into (score, bytes) entries, checking that it is plausibly this
/// format: max_token_length in 1..=65536, every length within it, finite scores, the
/// last entry ending exactly at the end of the data.
pub(crate) fn parse(bytes: &[u8]) -> std::result::Result<Vec<(f32, &[u8])>, Reject> {
    let u32_at = |at: usize| -> Option<u32> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let Some(max_len) = u32_at(0) else {
        return Err(Reject::NotLlama2c("shorter than 4 bytes".into()));
    };
    if !(1..=MAX_TOKEN_LENGTH).contains(&max_len) {
        return Err(Reject::NotLlama2c(format!(
            "first u32 {max_len} is not a plausible max_token_length"
        )));
    }
    let mut entries = Vec::new();
    let mut at = 4;
    while at < bytes.len() {
        let (Some(score), Some(len)) = (u32_at(at), u32_at(at + 4)) else {
            return Err(Reject::Truncated(entries.len()));
        };
        let score = f32::from_bits(score);
        if !score.is_finite() || len > max_len {
            return Err(Reject::NotLlama2c(format!(
                "entry {} (score {score}, length {}) does not fit max_token_length {max_len}",
                entries.len(),
                len as i32
            )));
        }
        let start = at + 8;
        let Some(piece) = bytes.get(start..start + len as usize) else {
            return Err(Reject::Truncated(entries.len()));
        };
        entries.push((score, piece));
        at = start + len as usize;
    }
    if entries.is_empty() {
        return Err(Reject::Truncated(0));
    }
    Ok(entries)
}

/// Builds the tokenizer from parsed entries.
pub(crate) fn build(entries: &[(f32, &[u8])]) -> Result<Tokenizer> {
    let byte_fallback = {
        let mut seen = [false; 256];
        for (_, p) in entries {
            if let Some(b) = parse_byte_piece(p) {
                seen[b as usize] = true;
            }
        }
        !seen.contains(&false)
    };
    let pieces = entries
        .iter()
        .map(|&(score, p)| {
            let (bytes, kind) = match p {
                b"<unk>" => (p.to_vec(), PieceKind::Unknown),
                b"\n<s>\n" => (b"<s>".to_vec(), PieceKind::Control),
                b"\n</s>\n" => (b"</s>".to_vec(), PieceKind::Control),
                _ => match parse_byte_piece(p) {
                    Some(b) if byte_fallback => (p.to_vec(), PieceKind::Byte(b)),
                    _ => (spaces_to_symbol(p), PieceKind::Normal),
                },
            };
            VocabEntry {
                bytes: bytes.into(),
                score,
                kind,
            }
        })
        .collect();
    let normalizer = NormalizerOptions {
        add_dummy_prefix: true,
        remove_extra_whitespaces: false,
        escape_whitespaces: true,
    };
    build_tokenizer(pieces, byte_fallback, normalizer, (b"<s>", b"</s>"), None)
}

/// Undoes the export's `replace('▁', ' ')`.
fn spaces_to_symbol(p: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(p.len());
    for &b in p {
        if b == b' ' {
            out.extend_from_slice(SPACE_SYMBOL);
        } else {
            out.push(b);
        }
    }
    out
}
