//! GPT-2-style byte-level BPE vocabularies (Radford et al. 2019, openai/gpt-2
//! `encoder.py`), as Hugging Face `tokenizer.json` (`ByteLevel` pre-tokenizer) and GGUF
//! (`tokenizer.ggml.model = "gpt2"`) store them: every byte is spelled as one printable
//! character (`bytes_to_unicode`: the printable Latin-1 bytes as themselves, the others as
//! U+0100 upwards in byte order, so a space is "Ġ"), tokens and "left right" merges are
//! written in that spelling, and special/added tokens as plain text.
//!
//! The spelling is undone here, so the [`TokenizerSpec`] (and `byte_bpe.rs`) see raw bytes.
//! The pre-tokenisation regex of each family is the one its `tokenizer.json` names (GGUF
//! names the family in `tokenizer.ggml.pre`; see [`gguf_pre_tokenizer`]).

use std::collections::HashMap;

use crate::spec::{AddedTokenSpec, ByteLevelBpeSpec, PieceType, TokenizerKind, TokenizerSpec};
use crate::{Error, Result};

/// GPT-2's pre-tokenisation regex (`encoder.py`; `tokenizers`' `ByteLevel` with
/// `use_regex`).
pub(crate) const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's regex (its `tokenizer.json` `Split` pattern), also tiktoken's `cl100k_base`
/// and GLM-4's `pat_str`.
pub(crate) const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's regex: Llama 3's with single digits.
pub(crate) const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral-Nemo's "tekken" regex (its `tokenizer.json`).
pub(crate) const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Bailing-MoE's regex (also Bailing-MoE 2's and LLaDA-MoE's), with possessive
/// quantifiers (`split.rs` runs it as an equivalent without them).
pub(crate) const BAILING_PATTERN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// Granite-Embedding multilingual 97M's regex, with a look-ahead in each letter class
/// (`split.rs` runs it as an equivalent with class intersections).
pub(crate) const GRANITE_EMBED_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek-V3's regexes (llama.cpp's `DEEPSEEK3_LLM`), also Hunyuan-Dense's, HY-V4's and
/// JoyAI's.
const DEEPSEEK3_PATTERNS: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// A GGUF pre-tokeniser: the regexes that cut the text in turn (the last is
/// [`ByteLevelBpeSpec::pattern`], the others [`ByteLevelBpeSpec::pre_split`]) and whether
/// a pre-token that is a whole token skips the merges.
pub(crate) struct PreTokenizer {
    pub(crate) regexes: &'static [&'static str],
    pub(crate) ignore_merges: bool,
}

/// GPT-2's regex as llama.cpp writes it (without the final `\s+`, which the text left
/// between matches makes redundant), for the families that cut digits first.
const GPT2_NO_TAIL: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// GPT-4o's regex (its `tokenizer.json`), also Llama 4's and MiniMax-M2's.
const GPT4O_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokeniser of a GGUF `tokenizer.ggml.pre` name, as llama.cpp's
/// `llama_vocab::load` maps the name to a pre-tokeniser type and `llm_tokenizer_bpe` the
/// type to its regexes (where llama.cpp rewrote a family's `tokenizer.json` regex for its
/// own regex engine, the original is used; `split.rs` runs each in linear time, the few
/// outside its automata's subset as equivalents).
/// `None` for a name llama.cpp does not list, for the few it splits with hand-written code
/// or a zero-width regex (`kimi-k2`, `afmoe`, `superbpe`), and for those that are not
/// byte-level BPE (`gemma4`, `granite-embed-multi-311m`, `sarvam-moe`, `whitespace`).
pub(crate) fn gguf_pre_tokenizer(name: &str) -> Option<PreTokenizer> {
    let (regexes, ignore_merges): (&'static [&'static str], bool) = match name {
        "default" => (
            &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_NO_TAIL,
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => (&[LLAMA3_PATTERN], true),
        "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => (&[LLAMA3_PATTERN], false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo"
        | "jais" | "exaone4" | "trillion" | "granite-docling" | "modern-bert" => {
            (&[GPT2_PATTERN], false)
        }
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => (&[r"\p{N}", GPT2_NO_TAIL], false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "stablelm2" | "hunyuan" | "megrez" | "grok-2"
        | "f2llmv2" | "solar-open" => (&[QWEN2_PATTERN], false),
        "tekken" => (&[TEKKEN_PATTERN], true),
        "gpt-4o" | "llama4" | "minimax-m2" | "kanana2" | "talkie" => (&[GPT4O_PATTERN], false),
        "deepseek-coder" => (
            &[
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            false,
        ),
        "deepseek-v3" | "hunyuan-dense" | "hy_v4" | "joyai-llm" => (&DEEPSEEK3_PATTERNS, false),
        "deepseek-llm" => (
            // The cased letters of its tokenizer.json, as escapes: the literal holds
            // canonical singletons (U+1FBE, U+2126, U+212A, ...) that editors normalise.
            &[
                r"[\r\n]",
                r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
                r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                r"\s+$",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}+",
            ],
            false,
        ),
        "spark2_5" => (
            &[
                r"\p{N}{1,3}",
                r"[一-龥぀-ゟ゠-ヿ]+",
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
                r"\p{N}",
            ],
            false,
        ),
        "youtu" => (
            &[
                r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "minicpm5" => (
            &[
                r"\p{N}{1,3}",
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "jais-2" => (
            &[
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
            ],
            false,
        ),
        "qwen35" => (
            &[
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            false,
        ),
        "exaone-moe" => (
            &[
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
            ],
            false,
        ),
        "granite-embed-multi-97m" => (&[GRANITE_EMBED_PATTERN], true),
        "tiny_aya" | "cohere2moe" => (&[r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O_PATTERN], false),
        "ufakzeka" => (
            &[r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
            false,
        ),
        "laguna" => (&[r"[^\n]+|[\n]+", QWEN2_PATTERN], false),
        "falcon" => (
            &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_NO_TAIL, r"[0-9][0-9][0-9]"],
            false,
        ),
        "poro-chat" | "bloom" | "gpt3-finnish" => (&[r" ?[^(\s|.,!?…。，、।۔،)]+"], false),
        "viking" => (&[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"], false),
        "chameleon" => (
            &[
                r"<sentinel:[0-9]+>",
                r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                r"([\t\n]|    |  )",
                r"\p{N}",
                r"[\p{P}!-/:-@\[-`{-~]",
                GPT2_NO_TAIL,
            ],
            false,
        ),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (&[BAILING_PATTERN], false),
        "seed-coder" => (
            &[
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            false,
        ),
        _ => return None,
    };
    Some(PreTokenizer {
        regexes,
        ignore_merges,
    })
}

/// GPT-2's `bytes_to_unicode`: the character that spells each byte.
pub(crate) fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    std::array::from_fn(|b| {
        let b = b as u8;
        if printable(b) {
            char::from(b)
        } else {
            // U+0100..U+0143: all valid scalar values.
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        }
    })
}

/// The inverse of [`byte_chars`].
pub(crate) struct Unspell(HashMap<char, u8>);

impl Unspell {
    pub(crate) fn new() -> Unspell {
        Unspell((0u8..=255).zip(byte_chars()).map(|(b, c)| (c, b)).collect())
    }

    /// The bytes a token spelled in GPT-2's characters stands for; `None` if a character
    /// is not one of the 256.
    pub(crate) fn bytes(&self, token: &str) -> Option<Vec<u8>> {
        token.chars().map(|c| self.0.get(&c).copied()).collect()
    }
}

/// A token of a GPT-2-style vocabulary before its spelling is undone.
pub(crate) struct Token<'a> {
    /// NORMAL tokens in GPT-2's spelling; CONTROL and USER_DEFINED ones as plain text.
    pub(crate) text: &'a str,
    pub(crate) kind: PieceType,
}

/// The description of a GPT-2-style tokenizer: pieces as raw bytes, merges resolved to
/// ids (by their text, among the NORMAL tokens) into `settings.merges`, the other
/// settings as given. BOS, EOS and `add_bos` are left for the caller to set (`None`,
/// `None`, false).
///
/// Errors: [`Error::Invalid`] for a NORMAL token not in GPT-2's spelling, a token kind
/// other than NORMAL, CONTROL and USER_DEFINED, or a merge naming a missing token.
pub(crate) fn build_spec<'a>(
    tokens: &[Token<'a>],
    merges: impl Iterator<Item = Result<(&'a str, &'a str)>>,
    mut settings: ByteLevelBpeSpec,
) -> Result<TokenizerSpec> {
    let unspell = Unspell::new();
    let mut pieces = Vec::with_capacity(tokens.len());
    let mut index = HashMap::with_capacity(tokens.len());
    for (id, t) in (0u32..).zip(tokens) {
        pieces.push(match t.kind {
            PieceType::Normal => {
                index.insert(t.text, id);
                unspell.bytes(t.text).ok_or_else(|| {
                    Error::Invalid(format!(
                        "byte-level token {id} {:?} is not spelled in GPT-2's byte characters",
                        t.text
                    ))
                })?
            }
            PieceType::Control | PieceType::UserDefined => t.text.as_bytes().to_vec(),
            other => {
                return Err(Error::Invalid(format!(
                    "byte-level token {id} {:?} is of type {other:?}",
                    t.text
                )))
            }
        });
    }
    let mut pairs = Vec::new();
    for m in merges {
        let (a, b) = m?;
        let id = |t: &str| {
            index
                .get(t)
                .copied()
                .ok_or_else(|| Error::Invalid(format!("merge {a:?} {b:?}: {t:?} is not a token")))
        };
        id(&format!("{a}{b}"))?;
        pairs.push([id(a)?, id(b)?]);
    }
    settings.merges = Some(pairs);
    let n = pieces.len();
    Ok(TokenizerSpec {
        kind: TokenizerKind::ByteLevelBpe(settings),
        pieces,
        scores: vec![0.0; n],
        types: tokens.iter().map(|t| t.kind).collect(),
        byte_fallback: false,
        unk_id: None,
        bos_id: None,
        eos_id: None,
        add_bos: false,
        chat_template: None,
        prefix: None,
        chat_format: None,
    })
}

/// The description of a GGUF `gpt2` tokenizer from its metadata: `tokens`
/// (`tokenizer.ggml.tokens`) and `types` (`.token_type`: 1 normal, 3 control, 4
/// user-defined, 5 unused, read as control), `merges` (`.merges`, "left right" in rank
/// order) and the pre-tokeniser `pre` (`.pre`), mapped as llama.cpp maps its names to
/// regexes: every byte-level name of its list but `kimi-k2`, `afmoe` and `superbpe`
/// (`gpt-2`, `llama-bpe`, `qwen2`, `smollm`, `tekken`, `gpt-4o`, `deepseek-llm`,
/// `default`, ...; see the table in `gpt2.rs`). CONTROL and USER_DEFINED tokens written in the text are
/// recognised, as `tokenizers` does with the added tokens of the `tokenizer.json` llama.cpp
/// converted. BOS, EOS and `add_bos` are left for the caller to set.
///
/// Errors: [`Error::Unsupported`] naming an unknown `pre`; [`Error::Invalid`] for `types` of
/// another length than `tokens`, a merge that is not two tokens, and the checks of
/// [`crate::Tokenizer::from_spec`] that can be made here (spelling, merges).
pub fn gguf_gpt2_spec(
    tokens: &[String],
    types: &[PieceType],
    merges: &[String],
    pre: &str,
) -> Result<TokenizerSpec> {
    let pre_tokenizer = gguf_pre_tokenizer(pre).ok_or_else(|| {
        Error::Unsupported(format!(
            "tokenizer.ggml.pre {pre:?}: not a pre-tokenizer flm implements (llama.cpp's \
             names that map to regexes, see flm_tokenizer::gguf_gpt2_spec)"
        ))
    })?;
    let (pattern, pre_split) = match pre_tokenizer.regexes.split_last() {
        Some((last, first)) => (*last, first.iter().map(|r| r.to_string()).collect()),
        None => (GPT2_PATTERN, Vec::new()),
    };
    if types.len() != tokens.len() {
        return Err(Error::Invalid(format!(
            "{} tokens but {} token types",
            tokens.len(),
            types.len()
        )));
    }
    let mut added = Vec::new();
    let tokens: Vec<Token> = (0u32..)
        .zip(tokens.iter().zip(types))
        .map(|(id, (text, &ty))| {
            let kind = match ty {
                PieceType::Unused => PieceType::Control,
                t => t,
            };
            if kind != PieceType::Normal {
                added.push(AddedTokenSpec {
                    id,
                    lstrip: false,
                    rstrip: false,
                    normalized: false,
                });
            }
            Token { text, kind }
        })
        .collect();
    let merges = merges
        .iter()
        .map(|m| match m.split(' ').collect::<Vec<_>>()[..] {
            [a, b] => Ok((a, b)),
            _ => Err(Error::Invalid(format!("merge {m:?} is not two tokens"))),
        });
    let settings = ByteLevelBpeSpec {
        pattern: pattern.into(),
        pre_split,
        merges: None,
        ignore_merges: pre_tokenizer.ignore_merges,
        nfc: false,
        added_tokens: added,
    };
    build_spec(&tokens, merges, settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Splitter;

    #[test]
    fn every_gguf_pre_tokenizer_regex_compiles() {
        let names = "default llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 \
            dbrx smaug-bpe glm4 chatglm-bpe gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es \
            jina-v2-de a.x-4.0 mellum jina-v1-en jina-v2-code roberta-bpe mpt olmo jais exaone4 \
            trillion granite-docling starcoder refact command-r smollm codeshell exaone \
            minerva-7b qwen2 deepseek-r1-qwen kormo stablelm2 hunyuan megrez grok-2 tekken \
            gpt-4o llama4 minimax-m2 deepseek-coder deepseek-v3 hunyuan-dense falcon poro-chat \
            bloom gpt3-finnish viking chameleon bailingmoe bailingmoe2 llada-moe seed-coder \
            jina-v5-nano modern-bert mellum2 f2llmv2 solar-open kanana2 talkie hy_v4 joyai-llm \
            deepseek-llm spark2_5 youtu minicpm5 jais-2 qwen35 exaone-moe \
            granite-embed-multi-97m tiny_aya cohere2moe ufakzeka laguna";
        for name in names.split_whitespace() {
            let pre = gguf_pre_tokenizer(name).unwrap_or_else(|| panic!("{name}"));
            for r in pre.regexes {
                let splitter = Splitter::new(r).unwrap_or_else(|e| panic!("{name}: {r:?}: {e}"));
                assert!(splitter.is_linear(), "{name}: {r:?}");
            }
        }
        for name in [
            "superbpe",
            "kimi-k2",
            "afmoe",
            "gemma4",
            "whitespace",
            "no-such-name",
        ] {
            assert!(gguf_pre_tokenizer(name).is_none(), "{name}");
        }
    }

    #[test]
    fn byte_characters_are_gpt2s() {
        let chars = byte_chars();
        // encoder.py: printable bytes map to themselves, the space to "Ġ" (U+0120, the
        // 33rd non-printable byte), newline to "Ċ" (U+010A), 0xAD to U+0143, the last.
        assert_eq!(chars[b'a' as usize], 'a');
        assert_eq!(chars[b' ' as usize], '\u{120}');
        assert_eq!(chars[b'\n' as usize], '\u{10A}');
        assert_eq!(chars[0xAD], '\u{143}');
        assert_eq!(chars[0xE9], '\u{E9}');
        let unspell = Unspell::new();
        let all: String = chars.iter().collect();
        assert_eq!(unspell.bytes(&all), Some((0..=255).collect()));
        assert_eq!(unspell.bytes("\u{144}"), None);
    }
}
