//! Instruction-set levels of the CPU kernels, detected at run time.
//!
//! Every SIMD kernel has a portable twin ([`Isa::Scalar`]) that computes the same math; tests
//! run each level the machine supports against it. `FLM_CPU_ISA` forces a level (for
//! example `FLM_CPU_ISA=avx2` on an AVX-512 machine, to exercise the AVX2 kernels, or
//! `FLM_CPU_ISA=neon` on an ARM board with dotprod, to exercise the plain NEON kernels).
//!
//! The levels of one binary are those of its architecture: x86-64 builds know
//! [`Isa::Avx2`], [`Isa::AvxVnni`] and [`Isa::Avx512`], aarch64 builds [`Isa::Neon`] and
//! [`Isa::NeonDot`]; the others are never supported.

use std::fmt;

use flm_core::{Error, Result};

/// One instruction-set level of the CPU kernels, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust, whatever the CPU: the reference twin of every kernel.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C: 256-bit vectors, int8 dot products with `vpmaddubsw`.
    Avx2,
    /// AVX2 plus AVX-VNNI (Alder Lake and later): 256-bit `vpdpbusd`.
    AvxVnni,
    /// AVX-512 F/BW/VL with VNNI (Ice Lake, Sapphire Rapids, Zen 4): 512-bit `vpdpbusd`.
    Avx512,
    /// AVX-512 plus AMX-TILE and AMX-INT8 (Sapphire Rapids and later): int8 and int4
    /// prefill as 16 × 16 tile multiplies; every other kernel is the AVX-512 one.
    Amx,
    /// aarch64 Advanced SIMD (NEON, every ARMv8-A core: Raspberry Pi 4's Cortex-A72):
    /// 128-bit vectors, int8 dot products with `smull`/`smlal` and `sadalp`.
    Neon,
    /// NEON plus the dot-product extension (FEAT_DotProd, ARMv8.2-A: Cortex-A55/A76,
    /// Raspberry Pi 5, RK3588): int8 dot products with `sdot`.
    NeonDot,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 7] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Amx,
        Isa::Neon,
        Isa::NeonDot,
    ];

    /// The name `FLM_CPU_ISA` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
            Isa::NeonDot => "dotprod",
        }
    }

    /// Whether this CPU can run the level's kernels.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => Isa::Avx2.is_supported() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.is_supported() && super::qlinear::amx::available(),
            // NEON is part of every aarch64 target Rust builds for std.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => {
                Isa::Neon.is_supported() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            _ => false,
        }
    }

    /// The level of the vector kernels: [`Isa::Amx`] adds tile kernels for the quantised
    /// Linear only, and uses the AVX-512 ones for everything else.
    pub const fn vector(self) -> Isa {
        match self {
            Isa::Amx => Isa::Avx512,
            isa => isa,
        }
    }

    /// The levels this CPU supports, lowest first.
    pub fn supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    /// The highest level this CPU supports.
    pub fn best() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|i| i.is_supported())
            .unwrap_or(Isa::Scalar)
    }

    /// The level named by `FLM_CPU_ISA`, or [`Isa::best`] when it is unset or empty.
    ///
    /// Errors: [`Error::InvalidArgument`] for an unknown name or a level this CPU lacks.
    pub fn from_env() -> Result<Isa> {
        match std::env::var("FLM_CPU_ISA") {
            Ok(name) if !name.is_empty() => Isa::parse(&name),
            _ => Ok(Isa::best()),
        }
    }

    /// The levels a check should cover: the one `FLM_CPU_ISA` names, or every level this CPU
    /// supports when it is unset or empty.
    ///
    /// Errors: as [`Isa::parse`], for the level `FLM_CPU_ISA` names.
    pub fn to_check() -> Result<Vec<Isa>> {
        match std::env::var("FLM_CPU_ISA") {
            Ok(name) if !name.is_empty() => Ok(vec![Isa::parse(&name)?]),
            _ => Ok(Isa::supported()),
        }
    }

    /// The level called `name` (see [`Isa::name`]), if this CPU supports it.
    ///
    /// Errors: [`Error::InvalidArgument`] for an unknown name or a level this CPU lacks.
    pub fn parse(name: &str) -> Result<Isa> {
        let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
        let isa = Isa::ALL
            .into_iter()
            .find(|i| i.name() == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "FLM_CPU_ISA={name} is not a known level (one of {})",
                    names.join(", ")
                ))
            })?;
        if !isa.is_supported() {
            let have: Vec<&str> = Isa::supported().iter().map(|i| i.name()).collect();
            return Err(Error::InvalidArgument(format!(
                "FLM_CPU_ISA={name}: this CPU lacks it (it supports {})",
                have.join(", ")
            )));
        }
        Ok(isa)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_levels_are_refused() {
        for isa in Isa::supported() {
            assert_eq!(Isa::parse(isa.name()).unwrap(), isa);
        }
        assert!(Isa::supported().contains(&Isa::best()));
        let err = Isa::parse("sse9").unwrap_err().to_string();
        assert!(err.contains("not a known level"), "{err}");
    }

    /// `.ci/run` sets `FLM_EXPECT_BEST_ISA` to the level the (emulated) CPU must get: under
    /// `qemu-aarch64 -cpu cortex-a72` that is `neon`, so the dotprod kernels are neither
    /// chosen nor accepted there (and any `sdot` executed would end the run with SIGILL).
    #[test]
    fn best_level_is_the_one_expected() {
        let Ok(want) = std::env::var("FLM_EXPECT_BEST_ISA") else {
            return;
        };
        assert_eq!(Isa::best().name(), want);
        for isa in Isa::ALL.into_iter().filter(|&i| i > Isa::best()) {
            assert!(!isa.is_supported(), "{isa} above the best level");
            let err = Isa::parse(isa.name()).unwrap_err().to_string();
            assert!(err.contains("this CPU lacks it"), "{err}");
        }
    }
}
