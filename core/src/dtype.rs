//! Element types of tensors.

/// The element type of a [`crate::Data`].
///
/// Append-only (as ggml's `ggml_type`): .flm files name dtypes by [`DataType::name`] and
/// docs/flm-format.md lists the discriminants, so a variant is never renamed, renumbered or
/// removed, and new ones take the next number.
///
/// Float types store one element each. Quantised types store a matrix `[rows, cols]`
/// (rows = the product of all dimensions but the last) in blocks along each row; rows are
/// padded with zeros to a whole number of blocks. Their layouts and math are in
/// [`crate::quant`].
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// IEEE 754 binary32.
    F32 = 0,
    /// IEEE 754 binary16.
    F16 = 1,
    /// bfloat16: the upper 16 bits of a binary32.
    BF16 = 2,
    /// int8, symmetric, one f32 scale per row (per output channel).
    I8 = 3,
    /// int4, asymmetric, an f16 scale and minimum per group of 32 values of a row.
    I4G32 = 4,
    /// As [`DataType::I4G32`] with groups of 64.
    I4G64 = 5,
    /// As [`DataType::I4G32`] with groups of 128.
    I4G128 = 6,
    /// int4, symmetric, an f16 scale per group of 32 values of a row (no minimum: 4.5 bits
    /// per weight, the bytes of ggml's Q4_0).
    I4SymG32 = 7,
    /// As [`DataType::I4SymG32`] with groups of 64.
    I4SymG64 = 8,
    /// As [`DataType::I4SymG32`] with groups of 128.
    I4SymG128 = 9,
    /// ggml's Q4_K, its bytes as they are: super-blocks of 256 values (144 bytes: f16 `d`
    /// and `dmin`, 6-bit scales and minimums per 32 values, 4-bit codes), 4.5 bits per
    /// weight (layout in [`crate::ggml`]).
    Q4K = 10,
    /// ggml's Q5_K, as [`DataType::Q4K`] with a fifth bit per code: 176 bytes per 256
    /// values, 5.5 bits per weight.
    Q5K = 11,
    /// ggml's Q6_K: super-blocks of 256 values (210 bytes: 6-bit codes, an i8 scale per 16
    /// values, an f16 `d`), 6.5625 bits per weight.
    Q6K = 12,
    /// ggml's Q8_0, its bytes as they are: blocks of 32 values (34 bytes: an f16 scale `d`,
    /// 32 int8 codes; `w = d·q`), 8.5 bits per weight (layout in [`crate::ggml`]).
    Q8_0 = 13,
    /// int4, asymmetric with an integer zero point: an f16 scale `d` and an f16 zero point
    /// `z` (an integer in `[0, 15]`) per group of 32 values of a row, `ŵ = d · (q − z)`
    /// (GPTQ's and AWQ's asymmetric scheme, which int4's f16 minimum `−d · z` rounds).
    I4ZpG32 = 14,
    /// As [`DataType::I4ZpG32`] with groups of 64.
    I4ZpG64 = 15,
    /// As [`DataType::I4ZpG32`] with groups of 128.
    I4ZpG128 = 16,
    /// Signed 32-bit integers: indices, not weights (the input permutation of an
    /// act-order GPTQ weight, [`crate::Data::input_perm`]); no op takes it as a weight.
    I32 = 17,
    /// ggml's IQ4_NL, its bytes as they are: blocks of 32 values (18 bytes: an f16 scale
    /// `d`, 4-bit codes into ggml's 16 non-linear levels `K`; `w = d·K[q]`), 4.5 bits per
    /// weight (layout in [`crate::ggml`]).
    IQ4NL = 18,
    /// ggml's IQ4_XS: super-blocks of 256 values (136 bytes: an f16 `d`, a 6-bit scale per
    /// 32 values, 4-bit codes into IQ4_NL's levels; `w = d·(sc − 32)·K[q]`), 4.25 bits per
    /// weight.
    IQ4XS = 19,
    /// MXFP4 (OCP Microscaling), as ggml stores it: blocks of 32 values (17 bytes: an E8M0
    /// exponent `e`, 4-bit E2M1 codes; `w = 2^(e − 127) · E2M1[q]`), 4.25 bits per weight
    /// (gpt-oss's experts).
    MXFP4 = 20,
    /// ggml's Q5_0, its bytes as they are: blocks of 32 values (22 bytes: an f16 scale `d`,
    /// the codes' fifth bits in a u32, their low nibbles; `w = d·(q − 16)`), 5.5 bits per
    /// weight (layout in [`crate::ggml`]): what llama.cpp's K-quant files hold where a row
    /// is not a whole number of 256-value super-blocks.
    Q5_0 = 21,
}

/// How an int4 dtype gives each group's minimum `m` in `ŵ = d · q + m` (layouts in
/// [`crate::quant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Int4Form {
    /// An f16 minimum per group.
    Min,
    /// None stored: `m = −8 d` (ggml's Q4_0).
    Symmetric,
    /// An integer zero point `z` per group, stored as f16: `m = −d · z`.
    ZeroPoint,
}

/// How the rows of a quantised dtype are laid out (layouts and math in [`crate::quant`]
/// and [`crate::blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// int8 per output channel: an f32 scale, then the codes.
    Int8,
    /// int4 in groups of `group` values: the codes, then the f16 scales (and minimums or
    /// zero points, as `form` says).
    Int4 {
        /// Values per group: 32, 64 or 128.
        group: usize,
        /// How each group's minimum is given.
        form: Int4Form,
    },
    /// ggml's blocks of this type, byte for byte.
    Ggml(crate::ggml::GgmlType),
}

impl DataType {
    /// Every dtype that holds values (a weight or an activation), in discriminant order
    /// (but [`DataType::I32`], which is not one of them).
    pub const VALUES: [DataType; 21] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::I4G32,
        DataType::I4G64,
        DataType::I4G128,
        DataType::I4SymG32,
        DataType::I4SymG64,
        DataType::I4SymG128,
        DataType::Q4K,
        DataType::Q5K,
        DataType::Q6K,
        DataType::Q8_0,
        DataType::I4ZpG32,
        DataType::I4ZpG64,
        DataType::I4ZpG128,
        DataType::IQ4NL,
        DataType::IQ4XS,
        DataType::MXFP4,
        DataType::Q5_0,
    ];

    /// Every dtype, in discriminant order.
    pub const ALL: [DataType; 22] = {
        let mut all = [DataType::I32; 22];
        let mut i = 0;
        while i < DataType::VALUES.len() {
            let d = DataType::VALUES[i];
            all[d as usize] = d;
            i += 1;
        }
        all
    };

    /// How rows of this dtype are laid out, if it is quantised: the one map from a dtype to
    /// its format, which every other fact of a quantised dtype here, the row functions of
    /// [`crate::quant`], the file readers and the kernels' dispatch are read from.
    pub const fn format(self) -> Option<Format> {
        use crate::ggml::GgmlType;
        use Int4Form::{Min, Symmetric, ZeroPoint};
        const fn int4(group: usize, form: Int4Form) -> Format {
            Format::Int4 { group, form }
        }
        Some(match self {
            DataType::F32 | DataType::F16 | DataType::BF16 | DataType::I32 => return None,
            DataType::I8 => Format::Int8,
            DataType::I4G32 => int4(32, Min),
            DataType::I4G64 => int4(64, Min),
            DataType::I4G128 => int4(128, Min),
            DataType::I4SymG32 => int4(32, Symmetric),
            DataType::I4SymG64 => int4(64, Symmetric),
            DataType::I4SymG128 => int4(128, Symmetric),
            DataType::I4ZpG32 => int4(32, ZeroPoint),
            DataType::I4ZpG64 => int4(64, ZeroPoint),
            DataType::I4ZpG128 => int4(128, ZeroPoint),
            DataType::Q4K => Format::Ggml(GgmlType::Q4K),
            DataType::Q5K => Format::Ggml(GgmlType::Q5K),
            DataType::Q6K => Format::Ggml(GgmlType::Q6K),
            DataType::Q8_0 => Format::Ggml(GgmlType::Q8_0),
            DataType::IQ4NL => Format::Ggml(GgmlType::IQ4NL),
            DataType::IQ4XS => Format::Ggml(GgmlType::IQ4XS),
            DataType::MXFP4 => Format::Ggml(GgmlType::MXFP4),
            DataType::Q5_0 => Format::Ggml(GgmlType::Q5_0),
        })
    }

    /// Whether this is a quantised (block) type.
    pub const fn is_quantized(self) -> bool {
        self.format().is_some()
    }

    /// Whether this is one of ggml's K-quant types (Q4_K, Q5_K, Q6_K), kept in ggml's
    /// super-block layout.
    pub const fn is_k_quant(self) -> bool {
        matches!(self, DataType::Q4K | DataType::Q5K | DataType::Q6K)
    }

    /// The ggml type whose blocks a dtype holds as they are (the K-quants, Q5_0, Q8_0, the
    /// IQ4 types and MXFP4).
    pub const fn ggml_type(self) -> Option<crate::ggml::GgmlType> {
        match self.format() {
            Some(Format::Ggml(t)) => Some(t),
            _ => None,
        }
    }

    /// Size of one element of a float type in bytes (0 for quantised types).
    pub const fn size_of(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 => 4,
            DataType::F16 | DataType::BF16 => 2,
            _ => 0,
        }
    }

    /// Group size of an int4 type.
    pub const fn group_size(self) -> Option<usize> {
        match self.format() {
            Some(Format::Int4 { group, .. }) => Some(group),
            _ => None,
        }
    }

    /// How an int4 dtype stores its minimums; `None` for other dtypes.
    pub const fn int4_form(self) -> Option<Int4Form> {
        match self.format() {
            Some(Format::Int4 { form, .. }) => Some(form),
            _ => None,
        }
    }

    /// Whether this is a symmetric int4 type (a scale per group, no minimum).
    pub const fn is_int4_symmetric(self) -> bool {
        matches!(self.int4_form(), Some(Int4Form::Symmetric))
    }

    /// The int4 type of `form` with groups of `group` values (32, 64 or 128); `None` for
    /// other group sizes.
    pub fn int4(group: usize, form: Int4Form) -> Option<DataType> {
        let want = Some(Format::Int4 { group, form });
        DataType::VALUES.into_iter().find(|d| d.format() == want)
    }

    /// Bytes a tensor of `shape` takes, or `None` on overflow.
    pub fn byte_len(self, shape: &[usize]) -> Option<usize> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        if !self.is_quantized() {
            return numel.checked_mul(self.size_of());
        }
        let cols = shape.last().copied().unwrap_or(1);
        let rows = numel.checked_div(cols).unwrap_or(0);
        rows.checked_mul(crate::quant::row_bytes(self, cols)?)
    }

    /// Lower-case name, as used on the command line and in error messages.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::I8 => "int8",
            DataType::I4G32 => "int4-g32",
            DataType::I4G64 => "int4-g64",
            DataType::I4G128 => "int4-g128",
            DataType::I4SymG32 => "int4-sym-g32",
            DataType::I4SymG64 => "int4-sym-g64",
            DataType::I4SymG128 => "int4-sym-g128",
            DataType::Q4K => "q4_k",
            DataType::Q5K => "q5_k",
            DataType::Q6K => "q6_k",
            DataType::Q8_0 => "q8_0",
            DataType::I4ZpG32 => "int4-zp-g32",
            DataType::I4ZpG64 => "int4-zp-g64",
            DataType::I4ZpG128 => "int4-zp-g128",
            DataType::I32 => "i32",
            DataType::IQ4NL => "iq4_nl",
            DataType::IQ4XS => "iq4_xs",
            DataType::MXFP4 => "mxfp4",
            DataType::Q5_0 => "q5_0",
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
