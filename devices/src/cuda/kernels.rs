//! The CUDA C kernels of the device, embedded in the binary and compiled by NVRTC at run
//! time ([`super::nvrtc`]). Each module is `prelude.cuh` (shared conversions and
//! reductions) followed by one source file; every kernel is `extern "C"`, so its name in
//! the PTX is the name in [`Module::kernels`].

/// One compilation unit and the kernels the device loads from it.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// Module name, used as the NVRTC program name and in the disk cache key.
    pub name: &'static str,
    /// The source file's text (without the prelude).
    pub source: &'static str,
    /// The `extern "C"` kernels the device looks up in it.
    pub kernels: &'static [&'static str],
}

/// Shared by every module: f16/bf16 conversions, warp and block reductions, the .flm
/// quantised row layouts.
pub const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// Every module of the device.
pub const MODULES: &[Module] = &[
    Module {
        name: "norm",
        source: include_str!("kernels/norm.cu"),
        kernels: &[
            "rms_norm_f32",
            "rms_norm_f16",
            "rms_norm_bf16",
            "layer_norm_f32",
            "layer_norm_f16",
            "layer_norm_bf16",
        ],
    },
    Module {
        name: "elementwise",
        source: include_str!("kernels/elementwise.cu"),
        kernels: &[
            "silu_mul",
            "gelu",
            "add",
            "scale",
            "f32_to_f16_rows",
            "f32_to_bf16_rows",
        ],
    },
    Module {
        name: "embedding",
        source: include_str!("kernels/embedding.cu"),
        kernels: &[
            "embedding_f32",
            "embedding_f16",
            "embedding_bf16",
            "embedding_quant",
        ],
    },
    Module {
        name: "qgemv",
        source: include_str!("kernels/qgemv.cu"),
        kernels: &["qgemv_i8", "qgemv_i4", "gemv_f16", "gemv_bf16", "add_bias"],
    },
    Module {
        name: "rope",
        source: include_str!("kernels/rope.cu"),
        kernels: &["rope"],
    },
    Module {
        name: "attention",
        source: include_str!("kernels/attention.cu"),
        kernels: &["attn_partial", "attn_combine"],
    },
    Module {
        name: "sample",
        source: include_str!("kernels/sample.cu"),
        kernels: &["argmax_rows", "top_k_rows"],
    },
];

/// Positions one attention block covers (`ATTN_CHUNK` in `attention.cu`).
pub const ATTN_CHUNK: usize = 256;

/// Output rows per block of the dequantise-GEMV kernels (`QGEMV_ROWS` in `qgemv.cu`).
pub const QGEMV_ROWS: usize = 4;

impl Module {
    /// The text NVRTC compiles: the prelude, then the module's source.
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n{}", self.source)
    }
}
