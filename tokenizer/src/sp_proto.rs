//! SentencePiece `.model` files: a serialised `ModelProto` (sentencepiece_model.proto,
//! proto2). Only the fields flm needs are declared, as hand-written prost messages (no
//! build script, no protoc); prost skips every other field. Field numbers and defaults
//! are those of the .proto file.

use prost::Message;

use crate::sentencepiece::{build_tokenizer, NormalizerOptions};
use crate::vocab::{parse_byte_piece, PieceKind, VocabEntry};
use crate::{Error, Result, Tokenizer};

/// `ModelProto` (sentencepiece_model.proto), the fields flm reads.
#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, repeated, tag = "1")]
    pieces: Vec<SentencePiece>,
    #[prost(message, optional, tag = "2")]
    trainer_spec: Option<TrainerSpec>,
    #[prost(message, optional, tag = "3")]
    normalizer_spec: Option<NormalizerSpec>,
    #[prost(message, optional, tag = "5")]
    denormalizer_spec: Option<NormalizerSpec>,
}

/// `ModelProto.SentencePiece`. The piece is read as bytes: protobuf C++ does not check
/// proto2 strings for UTF-8 either.
#[derive(Clone, PartialEq, Message)]
struct SentencePiece {
    #[prost(bytes = "vec", optional, tag = "1")]
    piece: Option<Vec<u8>>,
    #[prost(float, optional, tag = "2")]
    score: Option<f32>,
    /// `Type`: NORMAL = 1 (default), UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4,
    /// UNUSED = 5, BYTE = 6.
    #[prost(int32, optional, tag = "3")]
    r#type: Option<i32>,
}

/// `TrainerSpec`, the fields that matter at inference time. Its `unk_id`/`bos_id`/`eos_id`
/// are training settings: at run time SentencePiece finds these tokens by piece name
/// (`SentencePieceProcessor::bos_id` looks up `bos_piece` and requires a CONTROL piece),
/// and so does flm.
#[derive(Clone, PartialEq, Message)]
struct TrainerSpec {
    /// `ModelType`: UNIGRAM = 1 (default), BPE = 2, WORD = 3, CHAR = 4.
    #[prost(int32, optional, tag = "3")]
    model_type: Option<i32>,
    #[prost(bool, optional, tag = "24")]
    treat_whitespace_as_suffix: Option<bool>,
    #[prost(bool, optional, tag = "35")]
    byte_fallback: Option<bool>,
    #[prost(bytes = "vec", optional, tag = "44")]
    unk_surface: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "46")]
    bos_piece: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "47")]
    eos_piece: Option<Vec<u8>>,
}

/// `NormalizerSpec`.
#[derive(Clone, PartialEq, Message)]
struct NormalizerSpec {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(bytes = "vec", optional, tag = "2")]
    precompiled_charsmap: Option<Vec<u8>>,
    #[prost(bool, optional, tag = "3")]
    add_dummy_prefix: Option<bool>,
    #[prost(bool, optional, tag = "4")]
    remove_extra_whitespaces: Option<bool>,
    #[prost(bool, optional, tag = "5")]
    escape_whitespaces: Option<bool>,
}

/// How far a protobuf top-level message is well formed.
enum Wire {
    Complete,
    Truncated,
    Malformed(&'static str),
}

/// Walks the top-level fields of a protobuf message without decoding them, to tell a
/// truncated file from a corrupt one (prost reports both as a decode error).
fn scan_wire(mut b: &[u8]) -> Wire {
    fn varint(b: &mut &[u8]) -> Option<Option<u64>> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some(Some(v));
            }
        }
        Some(None)
    }
    while !b.is_empty() {
        let tag = match varint(&mut b) {
            None => return Wire::Truncated,
            Some(None) => return Wire::Malformed("varint longer than 10 bytes"),
            Some(Some(t)) => t,
        };
        if tag >> 3 == 0 {
            return Wire::Malformed("field number 0");
        }
        let skip = match tag & 7 {
            0 => match varint(&mut b) {
                None => return Wire::Truncated,
                Some(None) => return Wire::Malformed("varint longer than 10 bytes"),
                Some(Some(_)) => 0,
            },
            1 => 8,
            5 => 4,
            2 => match varint(&mut b) {
                None => return Wire::Truncated,
                Some(None) => return Wire::Malformed("varint longer than 10 bytes"),
                Some(Some(len)) => len,
            },
            _ => return Wire::Malformed("unexpected wire type"),
        };
        if skip > b.len() as u64 {
            return Wire::Truncated;
        }
        b = &b[skip as usize..];
    }
    Wire::Complete
}

/// Reads a serialised `ModelProto`.
pub(crate) fn load(bytes: &[u8]) -> Result<Tokenizer> {
    const WHAT: &str = "SentencePiece model";
    match scan_wire(bytes) {
        Wire::Complete => {}
        Wire::Truncated => {
            return Err(Error::Truncated(format!(
                "{WHAT}: a protobuf field runs past the end of the data"
            )))
        }
        Wire::Malformed(why) => return Err(Error::Invalid(format!("{WHAT}: {why}"))),
    }
    let proto = ModelProto::decode(bytes).map_err(|e| Error::Invalid(format!("{WHAT}: {e}")))?;
    let (Some(trainer), Some(norm)) = (proto.trainer_spec, proto.normalizer_spec) else {
        return Err(Error::Truncated(format!(
            "{WHAT}: no trainer_spec or normalizer_spec after the pieces"
        )));
    };
    match trainer.model_type.unwrap_or(1) {
        2 => {}
        t => {
            let name = match t {
                1 => "Unigram",
                3 => "Word",
                4 => "Char",
                _ => "unknown",
            };
            return Err(Error::Unsupported(format!(
                "SentencePiece model type {name} ({t}); only BPE (2) is supported"
            )));
        }
    }
    if trainer.treat_whitespace_as_suffix.unwrap_or(false) {
        return Err(Error::Unsupported(
            "SentencePiece treat_whitespace_as_suffix".into(),
        ));
    }
    for spec in std::iter::once(&norm).chain(proto.denormalizer_spec.as_ref()) {
        if spec
            .precompiled_charsmap
            .as_ref()
            .is_some_and(|m| !m.is_empty())
        {
            return Err(Error::Unsupported(format!(
                "SentencePiece normaliser {:?} with precompiled rules (only the identity \
                 normaliser is implemented)",
                spec.name.as_deref().unwrap_or("")
            )));
        }
    }
    let byte_fallback = trainer.byte_fallback.unwrap_or(false);
    let mut pieces = Vec::with_capacity(proto.pieces.len());
    for (id, p) in proto.pieces.into_iter().enumerate() {
        let bytes = p.piece.unwrap_or_default();
        // sentencepiece 0.2.3 `Load`: a raw "\0" piece next to byte fallback is UNUSED.
        let kind = if byte_fallback && bytes == b"\0" {
            5
        } else {
            p.r#type.unwrap_or(1)
        };
        let kind = match kind {
            1 => PieceKind::Normal,
            2 => PieceKind::Unknown,
            3 => PieceKind::Control,
            4 => PieceKind::UserDefined,
            5 => PieceKind::Unused,
            6 => PieceKind::Byte(parse_byte_piece(&bytes).ok_or_else(|| {
                Error::Invalid(format!(
                    "byte piece {id} is {:?}, not <0xHH>",
                    String::from_utf8_lossy(&bytes)
                ))
            })?),
            t => return Err(Error::Invalid(format!("piece {id} has unknown type {t}"))),
        };
        pieces.push(VocabEntry {
            bytes: bytes.into(),
            score: p.score.unwrap_or(0.0),
            kind,
        });
    }
    let normalizer = NormalizerOptions {
        add_dummy_prefix: norm.add_dummy_prefix.unwrap_or(true),
        remove_extra_whitespaces: norm.remove_extra_whitespaces.unwrap_or(true),
        escape_whitespaces: norm.escape_whitespaces.unwrap_or(true),
    };
    let bos = trainer.bos_piece.unwrap_or_else(|| b"<s>".to_vec());
    let eos = trainer.eos_piece.unwrap_or_else(|| b"</s>".to_vec());
    build_tokenizer(
        pieces,
        byte_fallback,
        normalizer,
        (&bos, &eos),
        trainer.unk_surface,
    )
}
