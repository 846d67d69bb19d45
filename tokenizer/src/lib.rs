//! flm's tokenizer: SentencePiece BPE, bit-exact with the `sentencepiece` library, read
//! from any of the three files a Llama-family checkpoint ships with:
//!
//! - a SentencePiece `tokenizer.model` (`ModelProto` protobuf; `sp_proto.rs`),
//! - a llama2.c `tokenizer.bin` (`llama2c.rs`),
//! - a Hugging Face `tokenizer.json` of the SentencePiece-BPE kind (`hf_json.rs`,
//!   encoded as `tokenizers` does in `hf_bpe.rs`), or of GPT-2's byte-level BPE kind
//!   (`hf_byte_level.rs`, with GPT-2's byte spelling and the families' regexes in
//!   `gpt2.rs`, several in turn for DeepSeek's; encoded by `byte_bpe.rs`). GGUF's `gpt2` tokenizer metadata becomes the same
//!   tokenizer through [`gguf_gpt2_spec`].
//!
//! The format is recognised from the bytes, never from the file name. Vocabulary
//! lookups go through a byte trie (`trie.rs`). SentencePiece models are normalised
//! (`sentencepiece.rs`) and merged (`bpe.rs`) exactly as sentencepiece's
//! normalizer.cc and bpe_model.cc do; decoding, whole or streamed token by token, follows
//! sentencepiece_processor.cc (`decode.rs`).
//!
//! A tokenizer can also be described as a [`TokenizerSpec`] ([`Tokenizer::spec`]), a
//! serde-serialisable value from which [`Tokenizer::from_spec`] rebuilds an identical
//! tokenizer (`spec.rs`, `spec_build.rs`): .flm files store it, and the GGUF importer of
//! flm-models builds one from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! A tiktoken ranks file (GLM-4's `tokenizer.model`, lines of `BASE64 RANK`; `tiktoken.rs`)
//! is read as GLM-4's byte-level BPE (`byte_bpe.rs`, `chatglm.rs`);
//! [`Tokenizer::into_chatglm`] turns a ChatGLM2/3 SentencePiece model into the ChatGLM
//! tokenizer. Chat prompts, built-in (ChatGLM) or from a Jinja template, are built by
//! [`Tokenizer::encode_chat`] (`chat.rs`, `jinja.rs`); gpt-oss's harmony replies are split
//! into reasoning and answer by [`HarmonySplitter`] (`harmony.rs`).
//!
//! What is not implemented is refused with [`Error::Unsupported`] rather than tokenised
//! differently from the reference: Unigram models, precompiled normalisation rules
//! (NFKC), other `tokenizer.json` normalisers than `Prepend`/`Replace` (SentencePiece kind)
//! and `NFC` (byte-level kind), pre-tokenizers other than regex `Split`s, `Digits` and
//! `ByteLevel`, WordPiece.
//!
//! ```no_run
//! # fn main() -> flm_tokenizer::Result<()> {
//! let tok = flm_tokenizer::Tokenizer::from_file("tokenizer.model".as_ref())?;
//! let ids = tok.encode("Hello world", true)?;
//! assert_eq!(tok.decode(&ids[1..])?, "Hello world");
//! # Ok(()) }
//! ```

mod bpe;
mod byte_bpe;
mod chat;
mod chatglm;
mod decode;
mod digit_groups;
mod error;
mod fast_hash;
mod gpt2;
mod harmony;
mod hf_bpe;
mod hf_byte_level;
mod hf_config;
mod hf_json;
mod hf_vocab;
mod jinja;
mod jinja_compile;
mod jinja_limits;
mod llama2c;
mod sentencepiece;
mod sp_proto;
mod spec;
mod spec_build;
mod split;
mod strftime;
mod tiktoken;
mod trie;
mod vocab;

use std::path::Path;

pub use chat::{ChatFormat, ChatPrompt, Message, TemplateArgs};
pub use decode::StreamDecoder;
pub use error::{Error, Result};
pub use gpt2::gguf_gpt2_spec;
pub use harmony::{HarmonyCall, HarmonySplitter, HarmonyText, HarmonyTokens};
pub use hf_config::chat_template_from_hf_config;
pub use jinja::{check_template_args, template_reads};
pub use jinja_compile::{MAX_TAG_OPERATORS, MAX_TEMPLATE_OPERATORS, MAX_TEMPLATE_SOURCE};
pub use jinja_limits::{MAX_TEMPLATE_BUILT, MAX_TEMPLATE_ITEMS, MAX_TEMPLATE_TEXT, TEMPLATE_FUEL};
pub use spec::{
    AddedTokenSpec, ByteLevelBpeSpec, HfBpeSpec, MetaspaceSpec, NormalizerStep, PieceType,
    PrependScheme, SentencePieceSpec, TokenizerKind, TokenizerSpec,
};

use decode::DecodeOptions;
use hf_bpe::HfModel;
use sentencepiece::SpModel;
use vocab::VocabEntry;

/// A loaded tokenizer: vocabulary, encoder and decoder settings.
#[derive(Debug)]
pub struct Tokenizer {
    /// Indexed by id.
    pieces: Vec<VocabEntry>,
    bos: Option<u32>,
    eos: Option<u32>,
    encoder: Encoder,
    decoding: DecodeOptions,
    /// Whether prompts should start with BOS (informational; see [`Tokenizer::add_bos`]).
    add_bos: bool,
    /// The model's Jinja chat template and where it came from.
    chat_template: Option<jinja::ChatTemplate>,
    /// What `encode(.., true)` puts first; `None`: BOS.
    prefix: Option<Vec<u32>>,
    /// The built-in prompt format.
    chat_format: Option<ChatFormat>,
    /// The time chat templates' `strftime_now` formats, in Unix seconds; `None`: the
    /// system clock at each render ([`Tokenizer::set_template_time`]).
    template_time: Option<i64>,
}

/// The encoding algorithm of the file the tokenizer came from.
#[derive(Debug)]
enum Encoder {
    /// sentencepiece's normaliser + bpe_model.cc (`.model` and llama2.c `.bin`).
    SentencePiece(SpModel),
    /// Hugging Face `tokenizers` BPE (`tokenizer.json`).
    HuggingFace(HfModel),
    /// Byte-level BPE: GPT-2 style (`tokenizer.json`, GGUF `gpt2`) or tiktoken style
    /// (GLM-4).
    ByteLevel(byte_bpe::ByteBpe),
}

impl Tokenizer {
    /// Reads a tokenizer file; see [`Tokenizer::from_bytes`] for the formats.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        Tokenizer::from_bytes(&bytes).map_err(|e| match e {
            Error::NotATokenizer(why) => Error::NotATokenizer(format!("{}: {why}", path.display())),
            Error::Truncated(what) => Error::Truncated(format!("{what} ({})", path.display())),
            e => e,
        })
    }

    /// Detects the format from the bytes (not the file name):
    ///
    /// - a llama2.c `tokenizer.bin`: u32 `max_token_length`, then per token an f32 score,
    ///   an i32 length and the bytes, parsed to the end of the data (the vocabulary size is
    ///   the number of entries);
    /// - a JSON object with a `"model"` object: Hugging Face `tokenizer.json`;
    /// - a first line `BASE64 RANK`: a tiktoken ranks file, read as GLM-4's tokenizer
    ///   (its pre-tokenisation regex and special tokens; see `chatglm.rs`);
    /// - a protobuf starting with field 1 (the pieces): SentencePiece `ModelProto`.
    ///
    /// Any other bytes give [`Error::NotATokenizer`]; a file cut short gives
    /// [`Error::Truncated`]. Never panics, whatever the bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Tokenizer> {
        // llama2.c first: its check is strict (lengths within max_token_length, exactly
        // to the end), and its first byte may be anything, '{' included.
        let llama2c = match llama2c::parse(bytes) {
            Ok(entries) => return llama2c::build(&entries),
            Err(reject) => reject,
        };
        let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
        if text.trim_ascii_start().starts_with(b"{") {
            return hf_json::load(text);
        }
        if tiktoken::looks_like_ranks(bytes) {
            return chatglm::glm4(tiktoken::parse_ranks(bytes)?);
        }
        // A serialised ModelProto starts with its first piece: field 1, length-delimited.
        if bytes.first() == Some(&0x0a) {
            return sp_proto::load(bytes);
        }
        match llama2c {
            llama2c::Reject::Truncated(n) => Err(Error::Truncated(format!(
                "llama2.c tokenizer.bin: the data ends inside entry {n}"
            ))),
            llama2c::Reject::NotLlama2c(why) if bytes.is_empty() => {
                Err(Error::NotATokenizer(format!("empty file ({why})")))
            }
            llama2c::Reject::NotLlama2c(why) => Err(Error::NotATokenizer(format!(
                "neither a SentencePiece model, a tokenizer.json, a tiktoken ranks file \
                 nor a llama2.c tokenizer.bin ({why})"
            ))),
        }
    }

    /// Encodes `text`, with the prefix tokens first if `add_bos`: BOS, or ChatGLM's
    /// `[gMASK] sop` ([`Tokenizer::prefix`]).
    ///
    /// SentencePiece files (`.model`, llama2.c `.bin`) give the ids of
    /// `SentencePieceProcessor::Encode` (normalizer.cc + bpe_model.cc); `tokenizer.json`
    /// gives those of `tokenizers`' `encode(text, add_special_tokens=False)`, so special
    /// tokens written in the text (`<s>`, `<|endoftext|>`) are recognised there, as in
    /// `tokenizers` (also for GGUF `gpt2` vocabularies, whose control and user-defined
    /// tokens are matched likewise); GLM-4's ranks file gives tiktoken's `encode_ordinary`.
    /// Fails if `add_bos` is asked of a tokenizer without BOS or prefix, or if the
    /// byte-level pre-tokeniser's regex engine gives up.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            match &self.prefix {
                Some(prefix) => ids.extend_from_slice(prefix),
                None => ids.push(self.bos.ok_or(Error::NoBos)?),
            }
        }
        match &self.encoder {
            Encoder::SentencePiece(m) => {
                let normalized = m.normalize(text);
                m.encode_normalized(&self.pieces, &normalized, &mut ids);
            }
            Encoder::HuggingFace(m) => m.encode(text, &mut ids),
            Encoder::ByteLevel(m) => m.encode(text, &mut ids)?,
        }
        Ok(ids)
    }

    /// Decodes ids to text as `SentencePieceProcessor::Decode` does: pieces joined, "▁"
    /// as a space, byte pieces as raw bytes (invalid UTF-8 as U+FFFD), control tokens
    /// (BOS, EOS) as nothing, and the leading space of the first piece dropped when the
    /// tokenizer adds a dummy prefix. Errors on an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut stream = self.stream_decoder(true);
        let mut text = String::new();
        for &id in ids {
            text.push_str(&stream.push(id)?);
        }
        text.push_str(&stream.finish());
        Ok(text)
    }

    /// The number of tokens (ids are `0..vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The beginning-of-sequence token (`<s>`), if the vocabulary has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token (`</s>`), if the vocabulary has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the model expects prompts to start with BOS: GGUF's
    /// `tokenizer.ggml.add_bos_token`, true for the other formats (Llama-family files all
    /// prepend `<s>`). [`Tokenizer::encode`] takes the flag from its caller.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The model's chat template (a Jinja string), if its files carry one (GGUF
    /// `tokenizer.chat_template`, HF `tokenizer_config.json`).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_ref().map(|t| t.text.as_str())
    }

    /// Sets the model's Jinja chat template, `origin` saying where it came from (such as
    /// "GGUF metadata `tokenizer.chat_template`"), named in the errors it causes. The
    /// template is checked first: it is compiled within the limits of every request's
    /// compile ([`MAX_TEMPLATE_SOURCE`], [`MAX_TAG_OPERATORS`], [`MAX_TEMPLATE_OPERATORS`],
    /// and constants folded to at most [`MAX_TEMPLATE_TEXT`] bytes) and rendered for sample
    /// conversations (system, user, assistant, user; and user, assistant, user) under the
    /// render budget of every request ([`TEMPLATE_FUEL`], [`MAX_TEMPLATE_TEXT`],
    /// [`MAX_TEMPLATE_ITEMS`], [`MAX_TEMPLATE_BUILT`]), so that a hostile or broken
    /// template fails when the model is loaded. `None` removes the template.
    ///
    /// Errors: [`Error::Template`] naming `origin`, for a syntax error or a template that
    /// runs past a limit. The template's own errors on a sample are accepted: it may refuse
    /// it with `raise_exception` (Gemma refuses system turns) or need keyword arguments
    /// that only requests give.
    pub fn with_chat_template(
        mut self,
        template: Option<String>,
        origin: &'static str,
    ) -> Result<Tokenizer> {
        self.chat_template = template.map(|text| jinja::ChatTemplate { text, origin });
        if self.chat_format.is_none() {
            if let Some(t) = &self.chat_template {
                jinja::check(&self, t)?;
            }
        }
        Ok(self)
    }

    /// Fixes the time that chat templates' `strftime_now(format)` formats (gpt-oss's writes
    /// `Current date: %Y-%m-%d` into its system message; Llama 3.1's too) to `unix_seconds`
    /// (seconds since 1970-01-01 00:00 UTC, read as UTC), so that prompts are reproducible;
    /// `None` (the default) reads the system clock at each render.
    pub fn set_template_time(&mut self, unix_seconds: Option<i64>) {
        self.template_time = unix_seconds;
    }

    /// The tokens `encode(.., true)` starts with: `[BOS]`, ChatGLM's `[gMASK] sop`, or
    /// nothing when the tokenizer has neither.
    pub fn prefix(&self) -> &[u32] {
        match &self.prefix {
            Some(p) => p,
            None => self.bos.as_slice(),
        }
    }

    /// The raw bytes of a piece in SentencePiece form ("▁" for a space, `<0x0A>` for a
    /// byte piece, `<s>` for BOS, also for llama2.c files, which store `" "` and `"\n<s>\n"`).
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(|p| &*p.bytes)
    }

    /// A decoder for ids that arrive one at a time. `at_start`: nothing but BOS came
    /// before, so the dummy-prefix space of the first piece is dropped (as SentencePiece
    /// decode and llama2.c run.c do).
    pub fn stream_decoder(&self, at_start: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, at_start)
    }
}
