//! aarch64 implementation of [`Simd`]: 128-bit NEON (Advanced SIMD) vectors of 4 f32, and
//! the runner that compiles a [`Kernel`] for them, four at a time ([`Wide`]: 16 lanes, whose
//! sums follow the halving tree of [`Simd::sum`]).
//!
//! NEON is part of every aarch64 target (the `neon` target feature is on by default), so
//! the runner needs no `#[target_feature]` and no run-time check: [`crate::cpu::Isa::Neon`]
//! and [`crate::cpu::Isa::NeonDot`] share it (the dot-product extension only matters to the
//! integer kernels in `qlinear`).
//!
//! f16 values are widened with `fcvtl` (FEAT_FP, every ARMv8-A core) through inline assembly:
//! the f16 vector intrinsics (`vcvt_f32_f16`) are not stable Rust yet.
//!
//! Soundness: every `unsafe` block below calls NEON intrinsics, which the target always has
//! (the module is compiled only with `target_feature = "neon"`); pointers come from slices
//! whose lengths are checked (full vectors) or from local arrays of a full vector (`_part`
//! forms copy through them).

use std::arch::aarch64::*;
use std::arch::asm;

use half::{bf16, f16};

use super::wide::Wide;
use super::{Kernel, Simd};

/// Runs `k` with NEON vectors.
#[inline]
pub(crate) fn neon<K: Kernel>(k: K) -> K::Output {
    k.run(Wide::<Neon, 4>(Neon(())))
}

/// NEON vectors: 4 f32 lanes, 32 registers (kernels see them four at a time, see [`neon`]).
#[derive(Clone, Copy)]
pub(crate) struct Neon(());

/// Four f16 values (as their bits) widened exactly to f32 with `fcvtl`.
#[inline(always)]
pub(crate) fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: `fcvtl` (FEAT_FP, baseline aarch64) reads and writes only vector registers.
    unsafe {
        asm!(
            "fcvtl {o:v}.4s, {h:v}.4h",
            o = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    out
}

/// Up to 4 values of `s` (zeros after) as a local array, for the `_part` loads.
#[inline(always)]
fn part4<T: Copy>(s: &[T], zero: T) -> [T; 4] {
    let mut b = [zero; 4];
    let n = s.len().min(4);
    b[..n].copy_from_slice(&s[..n]);
    b
}

impl Simd for Neon {
    const LANES: usize = 4;
    const REGS: usize = 32;
    type V = float32x4_t;

    #[inline(always)]
    fn zero(self) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vdupq_n_f32(0.0) }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vdupq_n_f32(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> float32x4_t {
        assert!(s.len() >= 4);
        // SAFETY: NEON (module docs); `s` holds the vector (asserted).
        unsafe { vld1q_f32(s.as_ptr()) }
    }
    #[inline(always)]
    fn load_part(self, s: &[f32]) -> float32x4_t {
        self.load(&part4(s, 0.0))
    }
    #[inline(always)]
    fn store(self, d: &mut [f32], v: float32x4_t) {
        assert!(d.len() >= 4);
        // SAFETY: NEON (module docs); `d` holds the vector (asserted).
        unsafe { vst1q_f32(d.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn store_part(self, d: &mut [f32], v: float32x4_t) {
        let mut b = [0.0f32; 4];
        self.store(&mut b, v);
        let n = d.len().min(4);
        d[..n].copy_from_slice(&b[..n]);
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> float32x4_t {
        assert!(s.len() >= 4);
        // SAFETY: NEON (module docs); `s` holds 4 values of 16 bits (asserted).
        f16x4_to_f32(unsafe { vld1_u16(s.as_ptr() as *const u16) })
    }
    #[inline(always)]
    fn load_f16_part(self, s: &[f16]) -> float32x4_t {
        self.load_f16(&part4(s, f16::ZERO))
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> float32x4_t {
        assert!(s.len() >= 4);
        // SAFETY: NEON (module docs); `s` holds 4 values of 16 bits (asserted).
        unsafe {
            let h = vld1_u16(s.as_ptr() as *const u16);
            vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
        }
    }
    #[inline(always)]
    fn load_bf16_part(self, s: &[bf16]) -> float32x4_t {
        self.load_bf16(&part4(s, bf16::ZERO))
    }

    #[inline(always)]
    fn add(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vaddq_f32(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vsubq_f32(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vmulq_f32(a, b) }
    }
    #[inline(always)]
    fn div(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vdivq_f32(a, b) }
    }
    #[inline(always)]
    fn fma(self, a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vfmaq_f32(c, a, b) }
    }
    #[inline(always)]
    fn fnma(self, a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vfmsq_f32(c, a, b) }
    }
    #[inline(always)]
    fn max(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // `a > b ? a : b`, as x86 `maxps` (not `fmax`, which keeps a NaN of either).
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vbslq_f32(vcgtq_f32(a, b), a, b) }
    }
    #[inline(always)]
    fn abs(self, a: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vabsq_f32(a) }
    }
    #[inline(always)]
    fn select_neg(self, x: float32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe {
            let neg = vreinterpretq_u32_s32(vshrq_n_s32::<31>(vreinterpretq_s32_f32(x)));
            vbslq_f32(neg, a, b)
        }
    }
    #[inline(always)]
    fn zero_below(self, x: float32x4_t, lim: f32, v: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe {
            let below = vcltq_f32(x, vdupq_n_f32(lim));
            vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), below))
        }
    }
    #[inline(always)]
    fn round(self, a: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vrndnq_f32(a) }
    }
    #[inline(always)]
    fn exp2i(self, n: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe {
            let e = vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127));
            vreinterpretq_f32_s32(vshlq_n_s32::<23>(e))
        }
    }

    #[inline(always)]
    fn sum(self, v: float32x4_t) -> f32 {
        // Lanes 0, 1 plus lanes 2, 3, then lane 0 plus lane 1 (`faddv` adds 0 + 1 first).
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vpadds_f32(vadd_f32(vget_low_f32(v), vget_high_f32(v))) }
    }
    #[inline(always)]
    fn max_lane(self, v: float32x4_t) -> f32 {
        // The halving tree of `a > b ? a : b`, as the other levels (`fmaxv` orders ±0).
        // SAFETY: NEON (module docs); no memory access.
        unsafe {
            let (lo, hi) = (vget_low_f32(v), vget_high_f32(v));
            let m = vbsl_f32(vcgt_f32(lo, hi), lo, hi);
            let (a, b) = (vget_lane_f32::<0>(m), vget_lane_f32::<1>(m));
            if a > b {
                a
            } else {
                b
            }
        }
    }
    #[inline(always)]
    fn sums4(self, v: [float32x4_t; 4]) -> [f32; 4] {
        let mut out = [0.0f32; 4];
        self.store(&mut out, sums4_vec(v));
        out
    }
    #[inline(always)]
    fn sums8(self, v: [float32x4_t; 8]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        self.store(&mut out, sums4_vec([v[0], v[1], v[2], v[3]]));
        self.store(&mut out[4..], sums4_vec([v[4], v[5], v[6], v[7]]));
        out
    }
    #[inline(always)]
    fn store_sums8(self, v: [float32x4_t; 8], scale: f32, d: &mut [f32]) {
        let s = self.splat(scale);
        self.store(d, self.mul(sums4_vec([v[0], v[1], v[2], v[3]]), s));
        self.store(
            &mut d[4..],
            self.mul(sums4_vec([v[4], v[5], v[6], v[7]]), s),
        );
    }
    #[inline(always)]
    fn first_eq(self, v: float32x4_t, x: f32) -> Option<usize> {
        let mut m = [0u32; 4];
        // SAFETY: NEON (module docs); stores 4 lanes into a local array of 4.
        unsafe { vst1q_u32(m.as_mut_ptr(), vceqq_f32(v, vdupq_n_f32(x))) };
        m.iter().position(|&e| e != 0)
    }

    #[inline(always)]
    fn load_dup(self, s: &[f32]) -> float32x4_t {
        assert!(s.len() >= 2);
        // SAFETY: NEON (module docs); `s` holds 2 values (asserted).
        unsafe {
            let c = vld1_f32(s.as_ptr());
            vzip1q_f32(vcombine_f32(c, c), vcombine_f32(c, c))
        }
    }
    #[inline(always)]
    fn load_dup_part(self, s: &[f32]) -> float32x4_t {
        let n = s.len().min(2);
        let mut b = [0.0f32; 2];
        b[..n].copy_from_slice(&s[..n]);
        self.load_dup(&b)
    }
    #[inline(always)]
    fn swap_pairs(self, v: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe { vrev64q_f32(v) }
    }
    #[inline(always)]
    fn fmaddsub(self, a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        // `a·b + (∓c)`: even lanes of `c` negated (exactly), then one fused multiply-add.
        // SAFETY: NEON (module docs); no memory access.
        unsafe {
            let sign = vreinterpretq_u32_u64(vdupq_n_u64(0x8000_0000));
            let nc = vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(c), sign));
            vfmaq_f32(nc, a, b)
        }
    }
}

/// `[Σ v0, Σ v1, Σ v2, Σ v3]`, each by the tree of [`Neon::sum`].
#[inline(always)]
fn sums4_vec(v: [float32x4_t; 4]) -> float32x4_t {
    /// `[a0 + a2, a1 + a3, b0 + b2, b1 + b3]`.
    #[inline(always)]
    fn halves(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (module docs); no memory access.
        unsafe {
            vcombine_f32(
                vadd_f32(vget_low_f32(a), vget_high_f32(a)),
                vadd_f32(vget_low_f32(b), vget_high_f32(b)),
            )
        }
    }
    // SAFETY: NEON (module docs); no memory access.
    unsafe { vpaddq_f32(halves(v[0], v[1]), halves(v[2], v[3])) }
}
