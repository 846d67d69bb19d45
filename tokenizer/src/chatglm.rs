//! THUDM's ChatGLM tokenizers, as their `tokenization_chatglm.py` files and chatglm.cpp
//! build them:
//!
//! - ChatGLM2-6B and ChatGLM3-6B: a SentencePiece BPE model (`tokenizer.model`, 64789
//!   pieces) with special tokens appended after the vocabulary: `[MASK] [gMASK] [sMASK]
//!   sop eop`, and for ChatGLM3 also `<|system|> <|user|> <|assistant|> <|observation|>`.
//!   Prompts start with `[gMASK] sop` (`get_prefix_tokens`).
//! - GLM-4: a tiktoken ranks file (`tokenizer.model`, 151329 tokens) with the GPT-4-style
//!   pre-tokenisation regex, followed by its 14 special tokens; prompts start with
//!   `[gMASK] <sop>`.
//!
//! The special tokens are CONTROL pieces: they decode to nothing and are not recognised in
//! text passed to [`Tokenizer::encode`] (as the reference tokenizers' default
//! `encode_special_tokens=False`); chat prompts insert them by id (`chat.rs`).

use crate::spec::{ByteLevelBpeSpec, PieceType, TokenizerKind, TokenizerSpec};
use crate::vocab::{PieceKind, VocabEntry};
use crate::{ChatFormat, Encoder, Error, Result, Tokenizer};

/// ChatGLM2's special tokens, appended after the SentencePiece vocabulary.
const GLM2_SPECIALS: [&str; 5] = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop"];

/// ChatGLM3's role tokens, appended after [`GLM2_SPECIALS`].
const GLM3_ROLES: [&str; 4] = ["<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"];

/// GLM-4's special tokens, appended after the ranks (its `tokenization_chatglm.py`).
const GLM4_SPECIALS: [&str; 14] = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
];

/// GLM-4's pre-tokenisation regex (`pat_str` of its `tokenization_chatglm.py`, the same as
/// tiktoken's `cl100k_base`).
pub(crate) const GLM4_PATTERN: &str = crate::gpt2::LLAMA3_PATTERN;

impl Tokenizer {
    /// The ChatGLM2 or ChatGLM3 tokenizer made from its SentencePiece model (`self`, read
    /// from the checkpoint's `tokenizer.model`): the special tokens appended as CONTROL
    /// pieces, the `[gMASK] sop` prefix, and the chat format `format`.
    ///
    /// Errors: [`Error::Invalid`] if `format` is not ChatGLM2/3, if `self` is not a
    /// SentencePiece tokenizer, or if it already has a piece of a special token's name.
    pub fn into_chatglm(mut self, format: ChatFormat) -> Result<Tokenizer> {
        let names: Vec<&str> = match format {
            ChatFormat::ChatGlm2 => GLM2_SPECIALS.to_vec(),
            ChatFormat::ChatGlm3 => [&GLM2_SPECIALS[..], &GLM3_ROLES[..]].concat(),
            ChatFormat::Glm4 => {
                return Err(Error::Invalid(
                    "GLM-4's tokenizer is a tiktoken ranks file, not a SentencePiece model".into(),
                ))
            }
        };
        if !matches!(self.encoder, Encoder::SentencePiece(_)) {
            return Err(Error::Invalid(
                "ChatGLM2/3 special tokens go after a SentencePiece model's pieces".into(),
            ));
        }
        // CONTROL pieces are neither merge targets nor matched in text, so the model's
        // lookups stay as they are (what `Tokenizer::from_spec` would rebuild).
        let first = self.pieces.len() as u32;
        for name in &names {
            if self.pieces.iter().any(|p| *p.bytes == *name.as_bytes()) {
                return Err(Error::Invalid(format!(
                    "the SentencePiece model already has a piece {name:?}"
                )));
            }
            self.pieces.push(VocabEntry {
                bytes: name.as_bytes().into(),
                score: 0.0,
                kind: PieceKind::Control,
            });
        }
        // [gMASK] and sop are the 2nd and 4th special tokens.
        self.prefix = Some(vec![first + 1, first + 3]);
        self.chat_format = Some(format);
        Ok(self)
    }

    /// The id of special (CONTROL) token `name`, e.g. `"<|user|>"`.
    pub fn special_id(&self, name: &str) -> Option<u32> {
        let id = self
            .pieces
            .iter()
            .rposition(|p| p.kind == PieceKind::Control && *p.bytes == *name.as_bytes())?;
        Some(id as u32)
    }
}

/// GLM-4's tokenizer from the pieces of its ranks file.
pub(crate) fn glm4(mut pieces: Vec<VocabEntry>) -> Result<Tokenizer> {
    let first = pieces.len() as u32;
    pieces.extend(GLM4_SPECIALS.iter().map(|name| VocabEntry {
        bytes: name.as_bytes().into(),
        score: 0.0,
        kind: PieceKind::Control,
    }));
    let spec = TokenizerSpec {
        kind: TokenizerKind::ByteLevelBpe(ByteLevelBpeSpec {
            pattern: GLM4_PATTERN.into(),
            pre_split: Vec::new(),
            merges: None,
            ignore_merges: false,
            nfc: false,
            added_tokens: Vec::new(),
        }),
        scores: vec![0.0; pieces.len()],
        types: pieces
            .iter()
            .map(|p| match p.kind {
                PieceKind::Control => PieceType::Control,
                _ => PieceType::Normal,
            })
            .collect(),
        pieces: pieces.into_iter().map(|p| p.bytes.into_vec()).collect(),
        byte_fallback: false,
        unk_id: None,
        bos_id: None,
        eos_id: Some(first),
        add_bos: true,
        chat_template: None,
        prefix: Some(vec![first + 2, first + 4]),
        chat_format: Some(ChatFormat::Glm4),
    };
    Tokenizer::from_spec(spec)
}
