//! Helpers of the tokenizer tests: tokenizers from `tests/data` and parsers for their golden
//! files (their provenance is in `tests/data/SOURCES.md`).

use std::path::{Path, PathBuf};

use flm_tokenizer::{gguf_gpt2_spec, PieceType, Tokenizer};
use serde_json::Value;

use crate::{data, ids, json};

/// The tokenizer file `rel` below `tests/data`, read by `Tokenizer::from_file`; panics with
/// the path and the error when it cannot be read.
pub fn load(rel: &str) -> Tokenizer {
    Tokenizer::from_file(&data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// GPT-2's byte-level BPE (`tokenizer/gpt2/tokenizer.json`) with the pre-tokenizer, normaliser
/// and `ignore_merges` of variant `name` of `tokenizer/gpt2/gpt2_cases.json` swapped in
/// (`make_gpt2_cases.py`).
pub struct Gpt2Variant {
    /// The tokenizer of the variant.
    pub tok: Tokenizer,
    /// Whether its normaliser is NFC.
    pub nfc: bool,
    /// (text, ids, decoded text), as `tokenizers` gives them for the variant.
    pub cases: Vec<(String, Vec<u32>, String)>,
}

/// Variant `name` of `tokenizer/gpt2/gpt2_cases.json`: GPT-2's tokenizer with the variant's
/// pre-tokenizer, normaliser and `ignore_merges`, and its golden cases.
pub fn gpt2_variant(name: &str) -> Gpt2Variant {
    let cases = json("tokenizer/gpt2/gpt2_cases.json");
    let v = &cases["variants"][name];
    let mut file: Value = json("tokenizer/gpt2/tokenizer.json");
    if !v["pre_tokenizer"].is_null() {
        file["pre_tokenizer"] = v["pre_tokenizer"].clone();
        file["normalizer"] = v["normalizer"].clone();
        file["model"]["ignore_merges"] = v["ignore_merges"].clone();
    }
    let tok = Tokenizer::from_bytes(&serde_json::to_vec(&file).unwrap())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let texts = cases["texts"].as_array().unwrap();
    let golden = (0..texts.len())
        .map(|i| {
            (
                texts[i].as_str().unwrap().to_owned(),
                ids(&v["ids"][i]),
                v["decoded"][i].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    Gpt2Variant {
        tok,
        nfc: v["normalizer"]["type"] == "NFC",
        cases: golden,
    }
}

/// GPT-2's vocabulary and merges (without the added tokens) as a GGUF `gpt2` tokenizer
/// with the pre-tokenizer `pre` (`tokenizer.ggml.pre`).
pub fn gguf_gpt2_variant(pre: &str) -> Tokenizer {
    let mut file = json("tokenizer/gpt2/tokenizer.json");
    file["added_tokens"] = Value::Array(Vec::new());
    gguf_of_tokenizer_json(&file, pre)
}

/// The GGUF `gpt2` tokenizer llama.cpp's converter writes for a byte-level `tokenizer.json`
/// (`file`), with the pre-tokenizer `pre`: its tokens by id (those of the model's `vocab`
/// NORMAL; added tokens CONTROL when `special`, else USER_DEFINED; ids no token has
/// `[PAD{id}]`, UNUSED) and its merges as "left right".
pub fn gguf_of_tokenizer_json(file: &Value, pre: &str) -> Tokenizer {
    let vocab = file["model"]["vocab"].as_object().unwrap();
    let added = file["added_tokens"].as_array().unwrap();
    let ids = vocab.values().chain(added.iter().map(|a| &a["id"]));
    let n = ids
        .map(|id| id.as_u64().unwrap() as usize + 1)
        .max()
        .unwrap();
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut types = vec![PieceType::Unused; n];
    for (token, id) in vocab {
        let id = id.as_u64().unwrap() as usize;
        tokens[id] = token.clone();
        types[id] = PieceType::Normal;
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = a["content"].as_str().unwrap().to_owned();
        types[id] = match a["special"].as_bool() {
            Some(true) => PieceType::Control,
            _ => PieceType::UserDefined,
        };
    }
    let merges: Vec<String> = file["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            m => format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap()),
        })
        .collect();
    let spec = gguf_gpt2_spec(&tokens, &types, &merges, pre).unwrap();
    Tokenizer::from_spec(spec).unwrap()
}

/// The bytes of the xz-compressed file `rel` below `tests/data`, decompressed.
pub fn xz(rel: &str) -> Vec<u8> {
    let file = std::fs::File::open(data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(file), &mut out)
        .unwrap_or_else(|e| panic!("{rel}: {e:?}"));
    out
}

/// The `tokenizer.json` of model `name` of `tokenizer/deepseek-glm` (SOURCES.md there),
/// parsed: the stored `tokenizer.json.xz`, or for DeepSeek-R1 DeepSeek-V3's with R1's two
/// changed added tokens (`added_tokens.json`), which `make_refs.py` checked is R1's file.
pub fn deepseek_glm_tokenizer_json(name: &str) -> Value {
    let dir = format!("tokenizer/deepseek-glm/{name}");
    if name != "deepseek-r1" {
        return serde_json::from_slice(&xz(&format!("{dir}/tokenizer.json.xz"))).unwrap();
    }
    let mut file = deepseek_glm_tokenizer_json("deepseek-v3");
    let changed = json(&format!("{dir}/added_tokens.json"));
    for token in file["added_tokens"].as_array_mut().unwrap() {
        if let Some(c) = changed
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == token["id"])
        {
            *token = c.clone();
        }
    }
    file
}

/// Model `name` of `tokenizer/deepseek-glm` as a Hugging Face directory below `into`:
/// its `tokenizer.json` ([`deepseek_glm_tokenizer_json`]; for a directory that holds only
/// a template, DeepSeek-V3.1's config and GLM-4.6's `chat_template.jinja`, the one of
/// its family: DeepSeek-V3's, GLM-4.5's) beside its `tokenizer_config.json` and
/// `chat_template.jinja` (GLM-4.6's beside GLM-4.5's config). Returns the path of the
/// `tokenizer.json`. Each file is written whole under another name and renamed, so that
/// tests running at once may make the same directory.
pub fn deepseek_glm_hf_dir(name: &str, into: &Path) -> PathBuf {
    let dir = into.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let put = |file: &str, bytes: &[u8]| {
        let tmp = dir.join(format!("{file}.{:?}.tmp", std::thread::current().id()));
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, dir.join(file)).unwrap();
    };
    let family = match name {
        "deepseek-v3.1" => "deepseek-v3",
        "glm-4.6" => "glm-4.5v",
        n => n,
    };
    let file = deepseek_glm_tokenizer_json(family);
    put("tokenizer.json", &serde_json::to_vec(&file).unwrap());
    for source in [family, name] {
        for f in ["tokenizer_config.json", "chat_template.jinja"] {
            let path = data(&format!("tokenizer/deepseek-glm/{source}/{f}"));
            if let Ok(bytes) = std::fs::read(path) {
                put(f, &bytes);
            }
        }
    }
    dir.join("tokenizer.json")
}

/// The 46 llama.cpp `ggml-vocab-llama-spm` cases: (text, ids without BOS). Format in
/// SOURCES.md section 4.
pub fn llama_cpp_cases() -> Vec<(String, Vec<u32>)> {
    llama_cpp_cases_of("llama-spm")
}

/// The 46 cases of llama.cpp's `ggml-vocab-{vocab}.gguf.inp` / `.out`.
pub fn llama_cpp_cases_of(vocab: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read(data(&format!("llama.cpp/ggml-vocab-{vocab}.gguf.inp"))).unwrap();
    let inp = String::from_utf8(inp).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(texts.pop(), Some(""), "separator after the last case");
    let out = data(&format!("llama.cpp/ggml-vocab-{vocab}.gguf.out"));
    let out = std::fs::read_to_string(out).unwrap();
    let lines: Vec<&str> = out.split('\n').collect();
    assert!(lines.len() >= texts.len());
    let cases: Vec<(String, Vec<u32>)> = texts
        .iter()
        .zip(lines)
        .map(|(t, l)| {
            let ids = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (t.to_string(), ids)
        })
        .collect();
    assert_eq!(cases.len(), 46);
    cases
}

/// The five llama2.c test.c cases: (text, ids with BOS).
pub fn llama2_c_cases() -> Vec<(String, Vec<u32>)> {
    let v = json("tokenizer/llama2_tokenizer_cases.json");
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), ids(&c["ids"])))
        .collect()
}

/// Decodes `ids` one at a time, returning each push's output.
pub fn stream(tok: &Tokenizer, ids: &[u32], at_start: bool) -> Vec<String> {
    let mut d = tok.stream_decoder(at_start);
    let mut parts: Vec<String> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
    parts.push(d.finish());
    parts
}

/// A small deterministic PRNG (xorshift64*), so the tests need no extra crate.
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
