//! The CUDA C kernels of the device, embedded in the binary and compiled by NVRTC at run
//! time ([`super::nvrtc`]). Each module is `prelude.cuh` (shared conversions and
//! reductions) followed by one source file; every kernel is `extern "C"`, so its name in
//! the PTX is [`Kernel::name`] of the handles in [`Module::kernels`].

use flm_core::ggml::GgmlType;
use flm_core::{DataType, Int4Form};

use crate::gemv_layout::packed_in_gpu_memory;

/// One compilation unit and the kernels the device loads from it.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// Module name, used as the NVRTC program name and in the disk cache key.
    pub name: &'static str,
    /// The source file's text (without the prelude).
    pub source: &'static str,
    /// The `extern "C"` kernels the device loads from it.
    pub kernels: &'static [Kernel],
}

/// A float weight dtype the kernels read directly (`W` in `prelude.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FloatWeight {
    /// f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    Bf16,
}

impl FloatWeight {
    /// The kernels' variant for weights of `dtype`; `None` for quantised ones.
    pub fn of(dtype: DataType) -> Option<FloatWeight> {
        match dtype {
            DataType::F32 => Some(FloatWeight::F32),
            DataType::F16 => Some(FloatWeight::F16),
            DataType::BF16 => Some(FloatWeight::Bf16),
            _ => None,
        }
    }
}

/// The element type of a KV cache or paged pool ([`flm_core::KvDtype`]) that the
/// attention kernels read and the row stores write (the template parameter or variant of
/// `attention.cu`, `flash_attn.cu` and `paged_attention.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvType {
    /// f32.
    F32,
    /// f16 (IEEE half), widened exactly to f32 as it is read.
    F16,
}

impl KvType {
    /// The kernels' variant for a pool of `dtype`; `None` for a type without kernels.
    pub fn of(dtype: DataType) -> Option<KvType> {
        match dtype {
            DataType::F32 => Some(KvType::F32),
            DataType::F16 => Some(KvType::F16),
            _ => None,
        }
    }

    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

/// Whether the quantised-weight kernels read `dtype`: int8 and int4 (in the GPU GEMV layout,
/// [`packed_in_gpu_memory`]) and every dtype holding ggml's blocks ([`GgmlBlocks`]).
pub fn has_quant_kernels(dtype: DataType) -> bool {
    packed_in_gpu_memory(dtype) || GgmlBlocks::of(dtype).is_some()
}

/// A type of ggml's blocks that the kernels read as they are, in rows of whole blocks
/// (`gq_*` and `dequant_ggml` in prelude.cuh): each discriminant is its `gq` code there
/// (`GQ_*`), the argument of the kernels that read any of them, and each type has its own
/// decode kernel, `qgemv_<type>` (qgemv.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlBlocks {
    /// Q4_K.
    Q4K = 1,
    /// Q5_K.
    Q5K = 2,
    /// Q6_K.
    Q6K = 3,
    /// Q8_0.
    Q8_0 = 4,
    /// IQ4_NL.
    IQ4NL = 5,
    /// IQ4_XS.
    IQ4XS = 6,
    /// MXFP4.
    MXFP4 = 7,
    /// Q5_0.
    Q5_0 = 8,
}

impl GgmlBlocks {
    /// The blocks a weight of `dtype` holds; `None` for a dtype that does not hold ggml
    /// blocks, or whose blocks the kernels do not read.
    pub fn of(dtype: DataType) -> Option<GgmlBlocks> {
        Some(match dtype.ggml_type()? {
            GgmlType::Q4K => GgmlBlocks::Q4K,
            GgmlType::Q5K => GgmlBlocks::Q5K,
            GgmlType::Q6K => GgmlBlocks::Q6K,
            GgmlType::Q8_0 => GgmlBlocks::Q8_0,
            GgmlType::IQ4NL => GgmlBlocks::IQ4NL,
            GgmlType::IQ4XS => GgmlBlocks::IQ4XS,
            GgmlType::MXFP4 => GgmlBlocks::MXFP4,
            GgmlType::Q5_0 => GgmlBlocks::Q5_0,
            _ => return None,
        })
    }

    /// Its `gq` code.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// `qgemv.cu`'s decode kernel names by [`GgmlBlocks`] code − 1.
const QGEMV_NAMES: [&str; 8] = [
    "qgemv_q4_k",
    "qgemv_q5_k",
    "qgemv_q6_k",
    "qgemv_q8_0",
    "qgemv_iq4_nl",
    "qgemv_iq4_xs",
    "qgemv_mxfp4",
    "qgemv_q5_0",
];

/// The `form` argument of the kernels that read int4 weights (`dequant_packed` in
/// prelude.cuh): how a group's minimum is stored, 0 an f16 minimum (int4), 1 none
/// (int4-sym, `−8 d`), 2 an f16 integer zero point `z` (int4-zp, `−z d`).
pub fn int4_form_code(dtype: DataType) -> i32 {
    match dtype.int4_form() {
        Some(Int4Form::Symmetric) => 1,
        Some(Int4Form::ZeroPoint) => 2,
        _ => 0,
    }
}

/// A head dimension the flash attention kernels (`flash_attn.cu`) are instantiated for;
/// attention with another one runs on the flash-decoding kernels whatever its row count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlashHeadDim {
    /// 64 (Llama 1B-3B class, GPT-style models).
    D64,
    /// 128 (Llama-2/3 7B and up, ChatGLM).
    D128,
}

impl FlashHeadDim {
    /// The instantiation for `head_dim`, if there is one.
    pub fn of(head_dim: usize) -> Option<FlashHeadDim> {
        match head_dim {
            64 => Some(FlashHeadDim::D64),
            128 => Some(FlashHeadDim::D128),
            _ => None,
        }
    }
}

/// Every kernel of the device, the typed handle an op launches; [`Kernel::name`] is its
/// `extern "C"` name in the PTX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `rms_norm_<W>` (norm.cu).
    RmsNorm(FloatWeight),
    /// `layer_norm_<W>` (norm.cu).
    LayerNorm(FloatWeight),
    /// `silu_mul` (elementwise.cu).
    SiluMul,
    /// `gelu` (elementwise.cu).
    Gelu,
    /// `gelu_mul` (elementwise.cu).
    GeluMul,
    /// `soft_cap` (elementwise.cu).
    SoftCap,
    /// `add` (elementwise.cu).
    Add,
    /// `scale` (elementwise.cu).
    Scale,
    /// `f32_to_f16_rows` (elementwise.cu).
    F32ToF16Rows,
    /// `f32_to_bf16_rows` (elementwise.cu).
    F32ToBf16Rows,
    /// `gather_cols` (elementwise.cu).
    GatherCols,
    /// `copy_cols` (elementwise.cu).
    CopyCols,
    /// `copy_rows_at` (f32 destination) or `copy_rows_at_f16` (elementwise.cu).
    CopyRowsAt(KvType),
    /// `embedding_<W>` (embedding.cu).
    Embedding(FloatWeight),
    /// `embedding_quant` (embedding.cu).
    EmbeddingQuant,
    /// `qgemv_<type>` (qgemv.cu): `qgemv_q4_k`, ..., `qgemv_mxfp4`.
    QgemvGgml(GgmlBlocks),
    /// `add_bias` (qgemv.cu).
    AddBias,
    /// `gemv_<weight>_<rows>` (gemv.cu): `gemv_f16_1`, ..., `gemv_q4_8`.
    Gemv(GemvWeight, GemvTile),
    /// `quantize_q8_rows` (gemv.cu).
    QuantizeQ8Rows,
    /// `pad_cols_f32` (gemv.cu).
    PadColsF32,
    /// `hold_stream` (gemv.cu).
    HoldStream,
    /// `dequant_f16_rows` (dequant.cu).
    DequantF16Rows,
    /// `rope` (rope.cu).
    Rope,
    /// `attn_partial` (f32 cache) or `attn_partial_f16` (attention.cu).
    AttnPartial(KvType),
    /// `attn_combine` (attention.cu).
    AttnCombine,
    /// `flash_attn_<KV>_d<D>` (flash_attn.cu).
    FlashAttn(FlashHeadDim, KvType),
    /// `paged_attn_partial_<KV>` (paged_attention.cu).
    PagedAttnPartial(KvType),
    /// `scatter_rows_<KV>` (paged_attention.cu).
    ScatterRows(KvType),
    /// `argmax_rows` (sample.cu).
    ArgmaxRows,
    /// `top_k_rows` (sample.cu).
    TopKRows,
    /// `sample_row` (sample.cu).
    SampleRow,
}

impl Kernel {
    /// The kernel's name in the PTX.
    pub fn name(self) -> &'static str {
        use FloatWeight as W;
        match self {
            Kernel::RmsNorm(W::F32) => "rms_norm_f32",
            Kernel::RmsNorm(W::F16) => "rms_norm_f16",
            Kernel::RmsNorm(W::Bf16) => "rms_norm_bf16",
            Kernel::LayerNorm(W::F32) => "layer_norm_f32",
            Kernel::LayerNorm(W::F16) => "layer_norm_f16",
            Kernel::LayerNorm(W::Bf16) => "layer_norm_bf16",
            Kernel::SiluMul => "silu_mul",
            Kernel::Gelu => "gelu",
            Kernel::GeluMul => "gelu_mul",
            Kernel::SoftCap => "soft_cap",
            Kernel::Add => "add",
            Kernel::Scale => "scale",
            Kernel::F32ToF16Rows => "f32_to_f16_rows",
            Kernel::F32ToBf16Rows => "f32_to_bf16_rows",
            Kernel::GatherCols => "gather_cols",
            Kernel::CopyCols => "copy_cols",
            Kernel::CopyRowsAt(KvType::F32) => "copy_rows_at",
            Kernel::CopyRowsAt(KvType::F16) => "copy_rows_at_f16",
            Kernel::Embedding(W::F32) => "embedding_f32",
            Kernel::Embedding(W::F16) => "embedding_f16",
            Kernel::Embedding(W::Bf16) => "embedding_bf16",
            Kernel::EmbeddingQuant => "embedding_quant",
            Kernel::QgemvGgml(blocks) => QGEMV_NAMES[blocks as usize - 1],
            Kernel::Gemv(weight, tile) => GEMV_NAMES[weight as usize][tile as usize],
            Kernel::QuantizeQ8Rows => "quantize_q8_rows",
            Kernel::PadColsF32 => "pad_cols_f32",
            Kernel::HoldStream => "hold_stream",
            Kernel::AddBias => "add_bias",
            Kernel::DequantF16Rows => "dequant_f16_rows",
            Kernel::Rope => "rope",
            Kernel::AttnPartial(KvType::F32) => "attn_partial",
            Kernel::AttnPartial(KvType::F16) => "attn_partial_f16",
            Kernel::AttnCombine => "attn_combine",
            Kernel::FlashAttn(FlashHeadDim::D64, KvType::F32) => "flash_attn_f32_d64",
            Kernel::FlashAttn(FlashHeadDim::D128, KvType::F32) => "flash_attn_f32_d128",
            Kernel::FlashAttn(FlashHeadDim::D64, KvType::F16) => "flash_attn_f16_d64",
            Kernel::FlashAttn(FlashHeadDim::D128, KvType::F16) => "flash_attn_f16_d128",
            Kernel::PagedAttnPartial(KvType::F32) => "paged_attn_partial_f32",
            Kernel::PagedAttnPartial(KvType::F16) => "paged_attn_partial_f16",
            Kernel::ScatterRows(KvType::F32) => "scatter_rows_f32",
            Kernel::ScatterRows(KvType::F16) => "scatter_rows_f16",
            Kernel::ArgmaxRows => "argmax_rows",
            Kernel::TopKRows => "top_k_rows",
            Kernel::SampleRow => "sample_row",
        }
    }
}

/// Shared by every module: f16/bf16 conversions, warp and block reductions, the quantised
/// layouts (int8/int4 in the GPU GEMV layout, rows of ggml's blocks).
pub const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// Every module of the device.
pub const MODULES: &[Module] = &[
    Module {
        name: "norm",
        source: include_str!("kernels/norm.cu"),
        kernels: &[
            Kernel::RmsNorm(FloatWeight::F32),
            Kernel::RmsNorm(FloatWeight::F16),
            Kernel::RmsNorm(FloatWeight::Bf16),
            Kernel::LayerNorm(FloatWeight::F32),
            Kernel::LayerNorm(FloatWeight::F16),
            Kernel::LayerNorm(FloatWeight::Bf16),
        ],
    },
    Module {
        name: "elementwise",
        source: include_str!("kernels/elementwise.cu"),
        kernels: &[
            Kernel::SiluMul,
            Kernel::Gelu,
            Kernel::GeluMul,
            Kernel::SoftCap,
            Kernel::Add,
            Kernel::Scale,
            Kernel::F32ToF16Rows,
            Kernel::F32ToBf16Rows,
            Kernel::GatherCols,
            Kernel::CopyCols,
            Kernel::CopyRowsAt(KvType::F32),
            Kernel::CopyRowsAt(KvType::F16),
        ],
    },
    Module {
        name: "embedding",
        source: include_str!("kernels/embedding.cu"),
        kernels: &[
            Kernel::Embedding(FloatWeight::F32),
            Kernel::Embedding(FloatWeight::F16),
            Kernel::Embedding(FloatWeight::Bf16),
            Kernel::EmbeddingQuant,
        ],
    },
    Module {
        name: "qgemv",
        source: include_str!("kernels/qgemv.cu"),
        kernels: &[
            Kernel::QgemvGgml(GgmlBlocks::Q4K),
            Kernel::QgemvGgml(GgmlBlocks::Q5K),
            Kernel::QgemvGgml(GgmlBlocks::Q6K),
            Kernel::QgemvGgml(GgmlBlocks::Q8_0),
            Kernel::QgemvGgml(GgmlBlocks::IQ4NL),
            Kernel::QgemvGgml(GgmlBlocks::IQ4XS),
            Kernel::QgemvGgml(GgmlBlocks::MXFP4),
            Kernel::QgemvGgml(GgmlBlocks::Q5_0),
            Kernel::AddBias,
        ],
    },
    Module {
        name: "gemv",
        source: include_str!("kernels/gemv.cu"),
        kernels: &[
            Kernel::Gemv(GemvWeight::F16, GemvTile::Rows1),
            Kernel::Gemv(GemvWeight::F16, GemvTile::Rows2),
            Kernel::Gemv(GemvWeight::F16, GemvTile::Rows4),
            Kernel::Gemv(GemvWeight::F16, GemvTile::Rows8),
            Kernel::Gemv(GemvWeight::Bf16, GemvTile::Rows1),
            Kernel::Gemv(GemvWeight::Bf16, GemvTile::Rows2),
            Kernel::Gemv(GemvWeight::Bf16, GemvTile::Rows4),
            Kernel::Gemv(GemvWeight::Bf16, GemvTile::Rows8),
            Kernel::Gemv(GemvWeight::Int8, GemvTile::Rows1),
            Kernel::Gemv(GemvWeight::Int8, GemvTile::Rows2),
            Kernel::Gemv(GemvWeight::Int8, GemvTile::Rows4),
            Kernel::Gemv(GemvWeight::Int8, GemvTile::Rows8),
            Kernel::Gemv(GemvWeight::Int4, GemvTile::Rows1),
            Kernel::Gemv(GemvWeight::Int4, GemvTile::Rows2),
            Kernel::Gemv(GemvWeight::Int4, GemvTile::Rows4),
            Kernel::Gemv(GemvWeight::Int4, GemvTile::Rows8),
            Kernel::QuantizeQ8Rows,
            Kernel::PadColsF32,
            Kernel::HoldStream,
        ],
    },
    Module {
        name: "dequant",
        source: include_str!("kernels/dequant.cu"),
        kernels: &[Kernel::DequantF16Rows],
    },
    Module {
        name: "rope",
        source: include_str!("kernels/rope.cu"),
        kernels: &[Kernel::Rope],
    },
    Module {
        name: "attention",
        source: include_str!("kernels/attention.cu"),
        kernels: &[
            Kernel::AttnPartial(KvType::F32),
            Kernel::AttnPartial(KvType::F16),
            Kernel::AttnCombine,
        ],
    },
    Module {
        name: "flash_attn",
        source: include_str!("kernels/flash_attn.cu"),
        kernels: &[
            Kernel::FlashAttn(FlashHeadDim::D64, KvType::F32),
            Kernel::FlashAttn(FlashHeadDim::D128, KvType::F32),
            Kernel::FlashAttn(FlashHeadDim::D64, KvType::F16),
            Kernel::FlashAttn(FlashHeadDim::D128, KvType::F16),
        ],
    },
    Module {
        name: "paged_attention",
        source: include_str!("kernels/paged_attention.cu"),
        kernels: &[
            Kernel::PagedAttnPartial(KvType::F32),
            Kernel::ScatterRows(KvType::F32),
            Kernel::PagedAttnPartial(KvType::F16),
            Kernel::ScatterRows(KvType::F16),
        ],
    },
    Module {
        name: "sample",
        source: include_str!("kernels/sample.cu"),
        kernels: &[Kernel::ArgmaxRows, Kernel::TopKRows, Kernel::SampleRow],
    },
];

/// Query rows per flash attention block (`FA_BR` in `flash_attn.cu`).
pub const FLASH_ROWS: usize = 64;

/// Threads of a flash attention block (`FA_THREADS` in `flash_attn.cu`).
pub const FLASH_THREADS: u32 = 128;

/// Positions one attention block covers (`ATTN_CHUNK` in `attention.cu`).
pub const ATTN_CHUNK: usize = 256;

/// Threads of the one block of `sample_row` (`SAMPLE_THREADS` in `sample.cu`).
pub const SAMPLE_THREADS: u32 = 1024;

/// Positions one paged-attention block covers (`PAGED_CHUNK` in `paged_attention.cu`).
pub const PAGED_CHUNK: usize = 256;

/// Output rows per block of the dequantise-GEMV kernel of ggml's blocks (`QGEMV_ROWS` in
/// `qgemv.cu`).
pub const QGEMV_ROWS: usize = 4;

/// Output rows per block (one warp each) of the decode GEMV kernels (`GEMV_WARPS` in
/// `gemv.cu`).
pub const GEMV_WARPS: usize = 4;

/// Input rows up to which f16/bf16 weights go through the decode GEMV kernels rather than
/// cuBLAS: the most one launch row of them takes, each weight read once for all.
pub const GEMV_MAX_ROWS: usize = 8;

/// The weight a decode GEMV kernel reads (`gemv.cu`), in its GPU GEMV layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemvWeight {
    /// f16.
    F16 = 0,
    /// bf16.
    Bf16 = 1,
    /// int8 per channel.
    Int8 = 2,
    /// int4 of any group size and form.
    Int4 = 3,
}

/// Input rows per launch row of a decode GEMV kernel (`NR` in `gemv.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemvTile {
    /// One.
    Rows1 = 0,
    /// Two.
    Rows2 = 1,
    /// Four.
    Rows4 = 2,
    /// Eight ([`GEMV_MAX_ROWS`]).
    Rows8 = 3,
}

impl GemvTile {
    /// The smallest tile that takes `n` rows in one launch row, or eight.
    pub fn for_rows(n: usize) -> GemvTile {
        match n {
            0 | 1 => GemvTile::Rows1,
            2 => GemvTile::Rows2,
            3 | 4 => GemvTile::Rows4,
            _ => GemvTile::Rows8,
        }
    }

    /// Its rows.
    pub fn rows(self) -> usize {
        1 << self as usize
    }
}

/// `gemv.cu`'s kernel names by [`GemvWeight`] and [`GemvTile`].
const GEMV_NAMES: [[&str; 4]; 4] = [
    ["gemv_f16_1", "gemv_f16_2", "gemv_f16_4", "gemv_f16_8"],
    ["gemv_bf16_1", "gemv_bf16_2", "gemv_bf16_4", "gemv_bf16_8"],
    ["gemv_q8_1", "gemv_q8_2", "gemv_q8_4", "gemv_q8_8"],
    ["gemv_q4_1", "gemv_q4_2", "gemv_q4_4", "gemv_q4_8"],
];

impl Module {
    /// The text NVRTC compiles: the prelude, then the module's source.
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n{}", self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemv_tiles_are_the_smallest_that_take_the_rows() {
        let tiles = [
            GemvTile::Rows1,
            GemvTile::Rows2,
            GemvTile::Rows4,
            GemvTile::Rows8,
        ];
        assert_eq!(tiles.map(GemvTile::rows), [1, 2, 4, 8]);
        for n in 1..=3 * GEMV_MAX_ROWS {
            let tile = GemvTile::for_rows(n);
            let want = n.min(GEMV_MAX_ROWS);
            let smallest = tiles.iter().find(|t| t.rows() >= want).copied();
            assert_eq!(Some(tile), smallest, "{n} rows");
        }
    }

    /// The prelude's hand-written tables of ggml's blocks (`GQ_*`, `gq_block`, the packed
    /// levels) agree with flm_core's, and every dtype holding ggml blocks has a code and a
    /// decode kernel instantiated for it.
    #[test]
    fn prelude_ggml_tables_match_flm_core() {
        for dtype in DataType::VALUES {
            let Some(ty) = dtype.ggml_type() else {
                continue;
            };
            let blocks = GgmlBlocks::of(dtype).unwrap_or_else(|| panic!("{dtype} has no gq code"));
            let (code, name) = (blocks.code(), ty.name());
            let kernel = Kernel::QgemvGgml(blocks);
            assert!(
                MODULES.iter().any(|m| m.kernels.contains(&kernel)),
                "{} is in no module",
                kernel.name()
            );
            let instance = format!("QGEMV({}, GQ_{name})", &kernel.name()["qgemv_".len()..]);
            assert!(
                MODULES.iter().any(|m| m.source.contains(&instance)),
                "no `{instance}`"
            );
            let define = format!("#define GQ_{name} {code}\n");
            assert!(PRELUDE.contains(&define), "prelude lacks `{define}`");
            let case = format!(
                "case GQ_{name}: return make_int2({}, {});",
                ty.block_len(),
                ty.block_bytes()
            );
            assert!(PRELUDE.contains(&case), "prelude lacks `{case}`");
        }
        let words = |levels: [i8; 16]| {
            let bytes = levels.map(|v| v as u8);
            let w: Vec<String> = bytes
                .chunks_exact(4)
                .map(|c| format!("{:#010x}u", u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect();
            w.join(", ")
        };
        for (name, levels) in [
            ("IQ4_LEVEL_WORDS", flm_core::blocks::IQ4_LEVELS),
            ("MXFP4_LEVEL_WORDS", flm_core::blocks::MXFP4_LEVELS),
        ] {
            let define = format!("#define {name} {}\n", words(levels));
            assert!(PRELUDE.contains(&define), "prelude lacks `{define}`");
        }
    }
}
