//! The portable implementation of [`Simd`]: 16 f32 lanes held in an array, each lane
//! computed as the vector instructions compute it (one rounding per `fma`, `round` ties to
//! even, `max` as x86 `maxps`), so that a kernel gives the bits here that it gives with
//! AVX2, AVX-512 or NEON vectors. It is the [`crate::cpu::Isa::Scalar`] level, the twin
//! every other level is tested against bit for bit.

use half::{bf16, f16};

use super::{Simd, LANES};

/// The portable level: [`LANES`] f32 lanes in an array.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

type V = [f32; LANES];

/// `f(a[l], b[l])` in every lane.
#[inline(always)]
fn map2(a: V, b: V, f: impl Fn(f32, f32) -> f32) -> V {
    let mut r = a;
    for (r, b) in r.iter_mut().zip(b) {
        *r = f(*r, b);
    }
    r
}

/// The first `min(s.len(), LANES)` values of `s` through `f`, zeros after.
#[inline(always)]
fn load_with<T: Copy>(s: &[T], f: impl Fn(T) -> f32) -> V {
    let mut v = [0.0; LANES];
    for (v, &x) in v.iter_mut().zip(s) {
        *v = f(x);
    }
    v
}

/// `a·b + c` rounded once to f32, as `f32::mul_add` and every FMA instruction compute it: the
/// portable levels' fused multiply-add.
///
/// Where the target has no FMA instruction (x86-64 below AVX2, the portable level's
/// baseline), `mul_add` is a call into a software `fmaf`, which the compiler cannot
/// vectorise; this computes it in f64 instead, in straight-line code that vectorises: the
/// product of two f32 is exact in f64 (48 of 53 bits), the sum is rounded to odd (Knuth's
/// TwoSum gives its exact error; an inexact even result moves one ulp toward the error),
/// and rounding to odd in f64 then to nearest in f32 rounds once (Boldo and Melquiond,
/// "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
/// IEEE Trans. Computers 57(4), 2008: `53 ≥ 24 + 2`). NaN and infinities come out as from
/// `mul_add`.
#[cfg(all(target_arch = "x86_64", not(target_feature = "fma")))]
#[inline(always)]
pub(crate) fn fma(a: f32, b: f32, c: f32) -> f32 {
    let (p, c) = (f64::from(a) * f64::from(b), f64::from(c));
    let s = p + c;
    let back = s - p;
    let err = (p - (s - back)) + (c - back);
    let bits = s.to_bits() as i64;
    // One ulp away from zero when the error has the sum's sign, else toward it; as
    // arithmetic on the conditions rather than branches, so that it vectorises.
    let inexact_even = (err != 0.0) & (bits & 1 == 0) & s.is_finite();
    let away = i64::from((err > 0.0) == (s > 0.0));
    let odd = bits + i64::from(inexact_even) * (2 * away - 1);
    f64::from_bits(odd as u64) as f32
}

/// See the other `fma`: targets with an FMA instruction use it.
#[cfg(any(not(target_arch = "x86_64"), target_feature = "fma"))]
#[inline(always)]
pub(crate) fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// Lane `l` plus lane `l + LANES/2`, then `l + LANES/4`, … down to one lane: the tree every
/// level sums a vector with (see [`Simd::sum`]).
#[inline(always)]
fn halving_sum(mut v: V) -> f32 {
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for l in 0..n {
            v[l] += v[l + n];
        }
    }
    v[0]
}

impl Simd for Portable {
    const LANES: usize = LANES;
    const REGS: usize = 16;
    type V = V;

    #[inline(always)]
    fn zero(self) -> V {
        [0.0; LANES]
    }
    #[inline(always)]
    fn splat(self, x: f32) -> V {
        [x; LANES]
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> V {
        assert!(s.len() >= LANES);
        load_with(s, |x| x)
    }
    #[inline(always)]
    fn load_part(self, s: &[f32]) -> V {
        load_with(s, |x| x)
    }
    #[inline(always)]
    fn store(self, d: &mut [f32], v: V) {
        d[..LANES].copy_from_slice(&v);
    }
    #[inline(always)]
    fn store_part(self, d: &mut [f32], v: V) {
        let n = d.len().min(LANES);
        d[..n].copy_from_slice(&v[..n]);
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> V {
        assert!(s.len() >= LANES);
        load_with(s, f16::to_f32)
    }
    #[inline(always)]
    fn load_f16_part(self, s: &[f16]) -> V {
        load_with(s, f16::to_f32)
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> V {
        assert!(s.len() >= LANES);
        load_with(s, bf16::to_f32)
    }
    #[inline(always)]
    fn load_bf16_part(self, s: &[bf16]) -> V {
        load_with(s, bf16::to_f32)
    }

    #[inline(always)]
    fn add(self, a: V, b: V) -> V {
        map2(a, b, |a, b| a + b)
    }
    #[inline(always)]
    fn sub(self, a: V, b: V) -> V {
        map2(a, b, |a, b| a - b)
    }
    #[inline(always)]
    fn mul(self, a: V, b: V) -> V {
        map2(a, b, |a, b| a * b)
    }
    #[inline(always)]
    fn div(self, a: V, b: V) -> V {
        map2(a, b, |a, b| a / b)
    }
    #[inline(always)]
    fn fma(self, a: V, b: V, c: V) -> V {
        let mut r = c;
        for l in 0..LANES {
            r[l] = fma(a[l], b[l], c[l]);
        }
        r
    }
    #[inline(always)]
    fn fnma(self, a: V, b: V, c: V) -> V {
        let mut r = c;
        for l in 0..LANES {
            r[l] = fma(-a[l], b[l], c[l]);
        }
        r
    }
    #[inline(always)]
    fn max(self, a: V, b: V) -> V {
        map2(a, b, |a, b| if a > b { a } else { b })
    }
    #[inline(always)]
    fn abs(self, a: V) -> V {
        a.map(f32::abs)
    }
    #[inline(always)]
    fn select_neg(self, x: V, a: V, b: V) -> V {
        let mut r = b;
        for l in 0..LANES {
            if x[l].is_sign_negative() {
                r[l] = a[l];
            }
        }
        r
    }
    #[inline(always)]
    fn zero_below(self, x: V, lim: f32, v: V) -> V {
        let mut r = v;
        for l in 0..LANES {
            if x[l] < lim {
                r[l] = 0.0;
            }
        }
        r
    }
    #[inline(always)]
    fn round(self, a: V) -> V {
        a.map(f32::round_ties_even)
    }
    #[inline(always)]
    fn exp2i(self, n: V) -> V {
        n.map(|n| f32::from_bits(((n as i32 + 127) as u32) << 23))
    }

    #[inline(always)]
    fn sum(self, v: V) -> f32 {
        halving_sum(v)
    }
    #[inline(always)]
    fn max_lane(self, mut v: V) -> f32 {
        let mut n = LANES;
        while n > 1 {
            n /= 2;
            for l in 0..n {
                v[l] = if v[l] > v[l + n] { v[l] } else { v[l + n] };
            }
        }
        v[0]
    }
    #[inline(always)]
    fn sums4(self, v: [V; 4]) -> [f32; 4] {
        v.map(halving_sum)
    }
    #[inline(always)]
    fn sums8(self, v: [V; 8]) -> [f32; 8] {
        v.map(halving_sum)
    }
    #[inline(always)]
    fn store_sums8(self, v: [V; 8], scale: f32, d: &mut [f32]) {
        for (d, s) in d[..8].iter_mut().zip(self.sums8(v)) {
            *d = scale * s;
        }
    }
    #[inline(always)]
    fn first_eq(self, v: V, x: f32) -> Option<usize> {
        v.iter().position(|&e| e == x)
    }

    #[inline(always)]
    fn load_dup(self, s: &[f32]) -> V {
        assert!(s.len() >= LANES / 2);
        self.load_dup_part(s)
    }
    #[inline(always)]
    fn load_dup_part(self, s: &[f32]) -> V {
        let mut v = [0.0; LANES];
        for (pair, &x) in v.chunks_exact_mut(2).zip(s) {
            pair.fill(x);
        }
        v
    }
    #[inline(always)]
    fn swap_pairs(self, v: V) -> V {
        let mut r = v;
        for pair in r.chunks_exact_mut(2) {
            pair.swap(0, 1);
        }
        r
    }
    #[inline(always)]
    fn fmaddsub(self, a: V, b: V, c: V) -> V {
        let mut r = c;
        for l in 0..LANES {
            let c = if l % 2 == 0 { -c[l] } else { c[l] };
            r[l] = fma(a[l], b[l], c);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::fma;

    /// The same bits as `f32::mul_add` (the reference: one rounding, compiler-builtins'
    /// `fmaf` where the target has no instruction), NaN as NaN.
    fn check(a: f32, b: f32, c: f32) {
        let (got, want) = (fma(a, b, c), a.mul_add(b, c));
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "fma({a:e}, {b:e}, {c:e}) = {got:e}, not {want:e}"
        );
    }

    #[test]
    fn fma_rounds_once() {
        // Double rounding would meet here: 1 + 2⁻¹¹ + 2⁻²⁴ is halfway between two f32, and
        // the tiny addend, lost when rounding the sum to f64, decides the direction.
        let a = 1.0 + 2f32.powi(-12);
        for c in [
            2f32.powi(-80),
            -(2f32.powi(-80)),
            2f32.powi(-140),
            0.0,
            -0.0,
        ] {
            check(a, a, c);
            check(-a, a, c);
        }
        let special = [
            0.0,
            -0.0,
            1.0,
            f32::MIN_POSITIVE,
            1e-45,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for &a in &special {
            for &b in &special {
                for &c in &special {
                    check(a, b, c);
                }
            }
        }
        // Random bit patterns (every exponent, subnormals and NaN included), and operands of
        // the kernels' sizes: products near the addend, where cancellation happens.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..1_000_000 {
            let r = next();
            let (a, b, c) = (
                f32::from_bits(r as u32),
                f32::from_bits((r >> 32) as u32),
                f32::from_bits(next() as u32),
            );
            check(a, b, c);
            let (x, y) = (
                (r % 65_536) as f32 - 32_768.0,
                f32::from_bits(next() as u32),
            );
            let y = f32::from_bits(y.to_bits() & 0x3fff_ffff) * 1e-3;
            check(x, y, -(x * y));
            check(x, y, x * y * 1e-9);
        }
    }
}
