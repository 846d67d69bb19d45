//! The vector layer of the CPU kernels: f32 vectors behind one trait, so that each SIMD
//! kernel is written once and compiled for every instruction set.
//!
//! A [`Simd`] value is a zero-sized token for one level (`x86::Avx512`, AVX2 and NEON as
//! [`wide::Wide`] pairs and quads of `x86::Avx2` and `neon::Neon` vectors,
//! [`portable::Portable`]); it exists only inside a runner (`x86::avx2`, `x86::avx512` with
//! `#[target_feature]`, entered after checking the level; `neon::neon`, whose features every
//! aarch64 target has), and its methods are safe. A kernel is a [`Kernel`] whose `run` is
//! `#[inline(always)]`, so that the runner compiles it, and every helper it calls, with the
//! level's features.
//!
//! **The same bits at every level.** Every level's vectors have [`LANES`] lanes (AVX2 and
//! NEON hold them in 2 and 4 registers), every lane-wise method is one IEEE operation
//! (`fma` rounds once, `round` ties to even, `max` is x86 `maxps`), and every level sums the
//! lanes of a vector by one tree (lane `l` plus lane `l + 8`, then `l + 4`, `l + 2`, `l + 1`).
//! So a kernel, whose order of operations depends on its operands' sizes only, gives the
//! same bits on a laptop (AVX2), a server (AVX-512, AMX), an ARM board (NEON) and at the
//! portable level ([`crate::cpu::Isa::Scalar`], the twin the others are tested against).
//!
//! Kernels must not call closures that could stay out of line (rayon tasks, boxed
//! functions): closures do not inherit the runner's target features. Parallel ops split the
//! work first and enter a runner per task.

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
pub(crate) mod neon;
mod portable;
pub(crate) use portable::fma;
mod wide;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use super::Isa;
use half::{bf16, f16};

/// One SIMD level's f32 vectors. Every method is `#[inline(always)]` in the implementations.
///
/// Slices passed to `load`/`store` must hold at least [`Simd::LANES`] values (checked);
/// the `_part` forms read or write `min(len, LANES)` values and zero the other lanes.
pub(crate) trait Simd: Copy {
    /// f32 lanes per vector.
    const LANES: usize;
    /// Vector registers of the level (16 for AVX2, 32 for AVX-512 and NEON): tile shapes
    /// follow it.
    const REGS: usize;
    /// A vector of [`Simd::LANES`] f32.
    type V: Copy;

    /// All lanes 0.
    fn zero(self) -> Self::V;
    /// All lanes `x`.
    fn splat(self, x: f32) -> Self::V;
    /// `s[..LANES]`.
    fn load(self, s: &[f32]) -> Self::V;
    /// `s[..min(len, LANES)]`, zeros after.
    fn load_part(self, s: &[f32]) -> Self::V;
    /// `d[..LANES] = v`.
    fn store(self, d: &mut [f32], v: Self::V);
    /// `d[..min(len, LANES)] = v[..]`; nothing else is written.
    fn store_part(self, d: &mut [f32], v: Self::V);
    /// `s[..LANES]` widened (exactly) to f32: `vcvtph2ps`.
    fn load_f16(self, s: &[f16]) -> Self::V;
    /// [`Simd::load_f16`] of `min(len, LANES)` values, zeros after.
    fn load_f16_part(self, s: &[f16]) -> Self::V;
    /// `s[..LANES]` widened (exactly: a shift by 16) to f32.
    fn load_bf16(self, s: &[bf16]) -> Self::V;
    /// [`Simd::load_bf16`] of `min(len, LANES)` values, zeros after.
    fn load_bf16_part(self, s: &[bf16]) -> Self::V;

    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`, correctly rounded.
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a·b + c`, rounded once.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `c − a·b`, rounded once.
    fn fnma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Lane-wise maximum; a NaN in `b` is kept, one in `a` alone is not.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `|a|`.
    fn abs(self, a: Self::V) -> Self::V;
    /// Lanes whose sign bit is set take `a`, the others `b`.
    fn select_neg(self, x: Self::V, a: Self::V, b: Self::V) -> Self::V;
    /// `v` where `x` is not below `lim` (NaN included), 0 elsewhere.
    fn zero_below(self, x: Self::V, lim: f32, v: Self::V) -> Self::V;
    /// Rounds to the nearest integer, ties to even.
    fn round(self, a: Self::V) -> Self::V;
    /// `2ⁿ` for integral `n` in `[-126, 127]`.
    fn exp2i(self, n: Self::V) -> Self::V;

    /// Sum of the lanes.
    fn sum(self, v: Self::V) -> f32;
    /// Maximum of the lanes (of a vector without NaN).
    fn max_lane(self, v: Self::V) -> f32;
    /// The lane sums of four vectors, each added with the same tree as by
    /// [`Simd::sums8`], so that a sum has the same bits whichever of the two computes it
    /// (batch invariance of the tiled kernels, see `linear`).
    fn sums4(self, v: [Self::V; 4]) -> [f32; 4];
    /// The lane sums of eight vectors.
    fn sums8(self, v: [Self::V; 8]) -> [f32; 8];
    /// `d[j] = scale · Σ lanes(v[j])` for `j < 8` (`d.len() >= 8`).
    fn store_sums8(self, v: [Self::V; 8], scale: f32, d: &mut [f32]);
    /// The first lane equal to `x`, if any.
    fn first_eq(self, v: Self::V, x: f32) -> Option<usize>;

    /// `LANES / 2` values of `s`, each repeated twice: `[s0, s0, s1, s1, ..]`.
    fn load_dup(self, s: &[f32]) -> Self::V;
    /// [`Simd::load_dup`] of `min(len, LANES / 2)` values, zeros after.
    fn load_dup_part(self, s: &[f32]) -> Self::V;
    /// Swaps adjacent lanes: `[v1, v0, v3, v2, ..]`.
    fn swap_pairs(self, v: Self::V) -> Self::V;
    /// `a·b − c` in even lanes and `a·b + c` in odd lanes, rounded once.
    fn fmaddsub(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
}

/// The f32 lanes of a vector at every level.
pub(crate) const LANES: usize = 16;

/// Runs `k` with the vectors of `isa` ([`Isa::Amx`] runs the AVX-512 code).
///
/// `isa` must be a level this CPU supports, as every [`crate::CpuDevice`]'s is.
#[inline(always)]
pub(crate) fn run<K: Kernel>(isa: Isa, k: K) -> K::Output {
    match isa.vector() {
        // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512(k) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => unsafe { x86::avx2(k) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon | Isa::NeonDot => neon::neon(k),
        _ => k.run(portable::Portable),
    }
}

/// Asks the CPU to bring the cache line holding `p` into L1 (`prefetcht0` on x86-64; nothing
/// elsewhere, where the kernels rely on the hardware prefetchers). Any address may be given:
/// a prefetch never faults and changes no memory.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    // SAFETY: prefetching has no side effects, whatever the address.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A kernel body, compiled once per level: see the module docs.
pub(crate) trait Kernel {
    /// What the kernel returns.
    type Output;
    /// Runs the kernel with the vectors of `s`. Implementations are `#[inline(always)]`.
    fn run<S: Simd>(self, s: S) -> Self::Output;
}

/// A float weight element (f32, f16, bf16): read as f32, one value or a vector at a time.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    /// `src[..LANES]` as f32 ([`Simd::load`], [`Simd::load_f16`], [`Simd::load_bf16`]).
    fn load<S: Simd>(s: S, src: &[Self]) -> S::V;
    /// `src[..min(len, LANES)]` as f32, zeros after.
    fn load_part<S: Simd>(s: S, src: &[Self]) -> S::V;
}

impl Elem for f32 {
    #[inline(always)]
    fn load<S: Simd>(s: S, src: &[f32]) -> S::V {
        s.load(src)
    }
    #[inline(always)]
    fn load_part<S: Simd>(s: S, src: &[f32]) -> S::V {
        s.load_part(src)
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn load<S: Simd>(s: S, src: &[f16]) -> S::V {
        s.load_f16(src)
    }
    #[inline(always)]
    fn load_part<S: Simd>(s: S, src: &[f16]) -> S::V {
        s.load_f16_part(src)
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn load<S: Simd>(s: S, src: &[bf16]) -> S::V {
        s.load_bf16(src)
    }
    #[inline(always)]
    fn load_part<S: Simd>(s: S, src: &[bf16]) -> S::V {
        s.load_bf16_part(src)
    }
}

/// `Σ a[i]·b[i]` over `min(a.len(), b.len())` elements, with four vector accumulators.
#[inline(always)]
pub(crate) fn dot<S: Simd, E: Elem>(s: S, a: &[f32], b: &[E]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b, l) = (&a[..n], &b[..n], S::LANES);
    let mut acc = [s.zero(); 4];
    let mut c = 0;
    while c + 4 * l <= n {
        for (u, acc) in acc.iter_mut().enumerate() {
            let o = c + u * l;
            *acc = s.fma(s.load(&a[o..]), E::load(s, &b[o..]), *acc);
        }
        c += 4 * l;
    }
    while c + l <= n {
        acc[0] = s.fma(s.load(&a[c..]), E::load(s, &b[c..]), acc[0]);
        c += l;
    }
    if c < n {
        acc[1] = s.fma(s.load_part(&a[c..]), E::load_part(s, &b[c..]), acc[1]);
    }
    s.sum(s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3])))
}

/// `dst[i] = src[i]` as f32, for `i < dst.len()` (`src.len() >= dst.len()`).
#[inline(always)]
pub(crate) fn widen<S: Simd, E: Elem>(s: S, src: &[E], dst: &mut [f32]) {
    let (n, l) = (dst.len(), S::LANES);
    let src = &src[..n];
    let mut c = 0;
    while c + l <= n {
        s.store(&mut dst[c..], E::load(s, &src[c..]));
        c += l;
    }
    if c < n {
        s.store_part(&mut dst[c..], E::load_part(s, &src[c..]));
    }
}

/// Below this, `e^x` is flushed to 0: `ln 2⁻¹²⁶`, the smallest normal f32's logarithm.
pub(crate) const EXP_MIN: f32 = -87.336_55;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split in two so that `n·EXP_C1` is exact for `|n| <= 2⁸` (Cephes `expf`).
const EXP_C1: f32 = 0.693_359_4;
const EXP_C2: f32 = -2.121_944_4e-4;
/// Cephes `expf` minimax polynomial for `(e^r − 1 − r) / r²` on `|r| <= ln2 / 2`.
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `e^x` for `x <= 88` (Cephes `expf`: `x = n·ln2 + r`, `e^r` by a degree-7 polynomial,
/// relative error below `2⁻²³`), 0 below [`EXP_MIN`], NaN for NaN: one lane of
/// [`exp_simd`], the same operations (fused where that one fuses), so the same bits.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let xc = if EXP_MIN > x { EXP_MIN } else { x };
    let n = (xc * LOG2E).round_ties_even();
    let r = fma(-n, EXP_C1, xc);
    let r = fma(-n, EXP_C2, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = fma(p, r, c);
    }
    let y = fma(p, r * r, r) + 1.0;
    let pow2 = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < EXP_MIN {
        0.0
    } else {
        y * pow2
    }
}

/// `tanh(u) = sign(u)·(1 − e)/(1 + e)` with `e = e^(−2|u|) <= 1` from [`exp`] (never
/// overflows): one lane of [`tanh_simd`], the same operations.
#[inline(always)]
pub(crate) fn tanh(u: f32) -> f32 {
    let e = exp(-2.0 * u.abs());
    let t = (1.0 - e) / (1.0 + e);
    if u.is_sign_negative() {
        0.0 - t
    } else {
        t
    }
}

/// [`tanh`] on a vector.
#[inline(always)]
pub(crate) fn tanh_simd<S: Simd>(s: S, u: S::V) -> S::V {
    let one = s.splat(1.0);
    let e = exp_simd(s, s.mul(s.splat(-2.0), s.abs(u)));
    let t = s.div(s.sub(one, e), s.add(one, e));
    s.select_neg(u, s.sub(s.zero(), t), t)
}

/// [`exp`] on a vector.
#[inline(always)]
pub(crate) fn exp_simd<S: Simd>(s: S, x: S::V) -> S::V {
    let xc = s.max(s.splat(EXP_MIN), x);
    let n = s.round(s.mul(xc, s.splat(LOG2E)));
    let r = s.fnma(n, s.splat(EXP_C1), xc);
    let r = s.fnma(n, s.splat(EXP_C2), r);
    let mut p = s.splat(EXP_P[0]);
    for &c in &EXP_P[1..] {
        p = s.fma(p, r, s.splat(c));
    }
    let y = s.add(s.fma(p, s.mul(r, r), r), s.splat(1.0));
    s.zero_below(x, EXP_MIN, s.mul(y, s.exp2i(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random values of mixed signs and magnitudes, whose sums depend on the order.
    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut seed = seed;
        (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let m = (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                m * [1e-3, 1.0, 1e3, 3e6][(seed & 3) as usize]
            })
            .collect()
    }

    /// Every reduction of eight vectors: [`Simd::sum`] of each, [`Simd::sums8`],
    /// [`Simd::sums4`] of each half, [`Simd::store_sums8`] scaled, and [`Simd::max_lane`] of
    /// each; then [`exp_simd`] and [`tanh_simd`] of every value.
    struct Reductions<'a>(&'a [f32]);

    impl Kernel for Reductions<'_> {
        type Output = Vec<u32>;

        #[inline(always)]
        fn run<S: Simd>(self, s: S) -> Vec<u32> {
            let v: [S::V; 8] = std::array::from_fn(|i| s.load(&self.0[i * S::LANES..]));
            let mut out: Vec<f32> = v.iter().map(|&v| s.sum(v)).collect();
            out.extend(s.sums8(v));
            out.extend(s.sums4([v[0], v[1], v[2], v[3]]));
            out.extend(s.sums4([v[4], v[5], v[6], v[7]]));
            let mut scaled = [0.0f32; 8];
            s.store_sums8(v, 0.37, &mut scaled);
            out.extend(scaled);
            out.extend(v.iter().map(|&v| s.max_lane(v)));
            for c in self.0.chunks_exact(S::LANES) {
                let x = s.mul(s.load(c), s.splat(1e-5));
                let mut e = [0.0f32; LANES];
                s.store(&mut e, exp_simd(s, s.sub(s.zero(), s.abs(x))));
                out.extend(e);
                s.store(&mut e, tanh_simd(s, x));
                out.extend(e);
            }
            out.iter().map(|x| x.to_bits()).collect()
        }
    }

    /// Every level reduces vectors, and computes `exp` and `tanh`, to the portable level's
    /// bits, and the portable level sums eight vectors as it sums each; its `exp` and `tanh`
    /// lanes are the scalar [`exp`] and [`tanh`].
    #[test]
    fn every_level_reduces_to_the_same_bits() {
        for seed in [7, 8, 9] {
            let values = values(8 * LANES, seed);
            let want = run(Isa::Scalar, Reductions(&values));
            assert_eq!(want[..8], want[8..16], "sums8 against sum");
            assert_eq!(want[8..16], want[16..24], "sums4 against sums8");
            for (i, x) in values.iter().enumerate() {
                let x = x * 1e-5;
                let at = 40 + (i / LANES) * 2 * LANES + i % LANES;
                assert_eq!(want[at], exp(-x.abs()).to_bits(), "exp({})", -x.abs());
                assert_eq!(want[at + LANES], tanh(x).to_bits(), "tanh({x})");
            }
            for isa in Isa::supported() {
                assert_eq!(run(isa, Reductions(&values)), want, "{isa}, seed {seed}");
            }
        }
    }

    /// The polynomial `exp` is within two units of rounding of the true value over its
    /// range, and flushes, saturates and propagates NaN as documented.
    #[test]
    fn exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = EXP_MIN;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max((got - want).abs() / want);
            x += 0.000_731;
        }
        assert!(
            worst < 2.0 * f32::EPSILON as f64,
            "relative error {worst:e}"
        );
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }
}
