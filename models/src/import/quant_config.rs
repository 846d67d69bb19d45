//! The quantisation scheme of a GPTQ or AWQ checkpoint ([`super::packed`]): transformers'
//! `quantization_config` in `config.json` (`GPTQConfig`, `AwqConfig`), else AutoGPTQ's
//! `quantize_config.json` or AutoAWQ's `quant_config.json` beside it.

use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result};

/// Which packer wrote the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    /// AutoGPTQ/GPTQModel; `v1`: the `gptq` checkpoint format's zero-point offset.
    Gptq { v1: bool },
    /// AutoAWQ GEMM.
    Awq,
}

/// A checkpoint's quantisation scheme.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scheme {
    /// Which packer wrote it.
    pub method: Method,
    /// Bits per code: 4 (or 8 for GPTQ).
    pub bits: u32,
    /// Input channels per group; `None` for one group per row (`group_size` −1).
    pub group_size: Option<usize>,
}

impl Scheme {
    /// "GPTQ" or "AWQ", for messages.
    pub(super) fn name(&self) -> &'static str {
        match self.method {
            Method::Gptq { .. } => "GPTQ",
            Method::Awq => "AWQ",
        }
    }
}

/// The fields of a quantisation config that flm reads (transformers' `GPTQConfig` and
/// `AwqConfig` names; AutoAWQ's `quant_config.json` names as aliases).
#[derive(Deserialize)]
struct QuantConfig {
    quant_method: Option<String>,
    #[serde(alias = "w_bit")]
    bits: Option<u32>,
    #[serde(alias = "q_group_size")]
    group_size: Option<i64>,
    checkpoint_format: Option<String>,
    version: Option<String>,
    zero_point: Option<bool>,
}

/// The scheme of the checkpoint in `dir` (`config` is its `config.json`), or `None` if it is
/// not quantised (or quantised as gpt-oss's MXFP4, which is no GPTQ/AWQ scheme).
///
/// Errors: [`Error::Format`] for a quantisation method or option flm does not read.
pub(super) fn scheme(dir: &Path, config: &Path) -> Result<Option<Scheme>> {
    #[derive(Deserialize)]
    struct Outer {
        quantization_config: Option<QuantConfig>,
    }
    let parse = |path: &Path, text: &str| -> Result<QuantConfig> {
        serde_json::from_str(text)
            .map_err(|e| Error::format(path, format!("invalid quantisation config: {e}")))
    };
    let text = std::fs::read_to_string(config).map_err(|e| Error::io(config, e))?;
    let outer: Outer = serde_json::from_str(&text)
        .map_err(|e| Error::format(config, format!("invalid quantization_config: {e}")))?;
    let (path, q, default_method) = match outer.quantization_config {
        Some(q) => (config.to_path_buf(), q, None),
        None => {
            let mut found = None;
            for (file, method) in [
                ("quantize_config.json", "gptq"),
                ("quant_config.json", "awq"),
            ] {
                let path = dir.join(file);
                if path.is_file() {
                    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
                    found = Some((path.clone(), parse(&path, &text)?, Some(method)));
                    break;
                }
            }
            match found {
                Some(found) => found,
                None => return Ok(None),
            }
        }
    };
    let unsupported =
        |what: String| Error::format(&path, format!("unsupported quantisation: {what}"));
    let method = q
        .quant_method
        .as_deref()
        .or(default_method)
        .unwrap_or("gptq")
        .to_ascii_lowercase();
    let method = match method.as_str() {
        "gptq" => Method::Gptq {
            v1: match q.checkpoint_format.as_deref() {
                None | Some("gptq") => true,
                Some("gptq_v2") => false,
                Some(other) => {
                    return Err(unsupported(format!(
                        "GPTQ checkpoint_format \"{other}\" (gptq and gptq_v2 are read)"
                    )))
                }
            },
        },
        "awq" => {
            let version = q.version.as_deref().unwrap_or("gemm").to_ascii_lowercase();
            if version != "gemm" {
                return Err(unsupported(format!(
                    "AWQ version \"{version}\" (the GEMM layout is read)"
                )));
            }
            if q.zero_point == Some(false) {
                return Err(unsupported("AWQ without zero points".into()));
            }
            Method::Awq
        }
        // gpt-oss's MXFP4 experts are read by `super::gpt_oss`, not packed here.
        "mxfp4" => return Ok(None),
        other => return Err(unsupported(format!("quant_method \"{other}\""))),
    };
    let bits = q.bits.unwrap_or(4);
    let bits_ok = match method {
        Method::Gptq { .. } => bits == 4 || bits == 8,
        Method::Awq => bits == 4,
    };
    if !bits_ok {
        return Err(unsupported(format!("{bits}-bit {method:?}")));
    }
    let group_size = match q.group_size {
        None | Some(-1) => None,
        Some(g) if g > 0 => Some(g as usize),
        Some(g) => return Err(unsupported(format!("group_size {g}"))),
    };
    Ok(Some(Scheme {
        method,
        bits,
        group_size,
    }))
}
