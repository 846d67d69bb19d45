//! Element types of tensors.

/// The element type of a [`crate::Data`].
///
/// Append-only (as ggml's `ggml_type`): the discriminants are written into files, so a
/// variant is never renumbered or removed, and new ones take the next number.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// IEEE 754 binary32.
    F32 = 0,
    /// IEEE 754 binary16.
    F16 = 1,
    /// bfloat16: the upper 16 bits of a binary32.
    BF16 = 2,
}

impl DataType {
    /// Size of one element in bytes.
    pub const fn size_of(self) -> usize {
        match self {
            DataType::F32 => 4,
            DataType::F16 | DataType::BF16 => 2,
        }
    }

    /// Lower-case name, as used on the command line and in error messages.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
