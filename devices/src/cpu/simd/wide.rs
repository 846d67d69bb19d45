//! [`Wide`]: `N` vectors of a narrower level as one vector of [`LANES`] lanes, so that the
//! AVX2 (2 × 8 lanes) and NEON (4 × 4 lanes) levels run every kernel with the lanes that
//! AVX-512 and the portable level have, and therefore give the same bits: a lane-wise
//! operation is the same IEEE operation in each, and the lanes of a vector are summed by
//! one tree ([`Simd::sum`]).
//!
//! Every method is `#[inline(always)]` and loops over the parts without closures, so that it
//! compiles inside the level's runner with its target features (see [`super`]).

use half::{bf16, f16};

use super::{Simd, LANES};

/// `N` vectors of `B` (`N · B::LANES == LANES`, `N` a power of two).
#[derive(Clone, Copy)]
pub(crate) struct Wide<B, const N: usize>(pub(crate) B);

impl<B: Simd, const N: usize> Wide<B, N> {
    /// The lanes of a part.
    const PART: usize = B::LANES;

    /// The vectors of the parts added by halves (part `i` plus part `i + N/2`, and so on
    /// down to one): the first levels of the halving tree of [`Simd::sum`].
    #[inline(always)]
    fn halve(self, mut v: [B::V; N]) -> B::V {
        let mut n = N;
        while n > 1 {
            n /= 2;
            for i in 0..n {
                v[i] = self.0.add(v[i], v[i + n]);
            }
        }
        v[0]
    }
}

/// `self.0.$op(a[i], ..)` in every part `i`, a loop and no closure (see the module docs).
macro_rules! each {
    ($self:ident, $op:ident($($arg:ident),+)) => {{
        let mut r = [$self.0.zero(); N];
        for i in 0..N {
            r[i] = $self.0.$op($($arg[i]),+);
        }
        r
    }};
}

/// Each part `i` loaded from `$s[i·PART..]` by `$full` where the part lies within `$s`, by
/// `$part` where it begins within it, zeros where it begins past its end.
macro_rules! load_parts {
    ($self:ident, $s:ident, $full:ident, $part:ident) => {{
        let mut v = [$self.0.zero(); N];
        for (i, v) in v.iter_mut().enumerate() {
            let o = i * Self::PART;
            if o + Self::PART <= $s.len() {
                *v = $self.0.$full(&$s[o..]);
            } else if o < $s.len() {
                *v = $self.0.$part(&$s[o..]);
            }
        }
        v
    }};
}

impl<B: Simd, const N: usize> Simd for Wide<B, N> {
    const LANES: usize = {
        assert!(N * B::LANES == LANES && N.is_power_of_two());
        LANES
    };
    const REGS: usize = B::REGS / N;
    type V = [B::V; N];

    #[inline(always)]
    fn zero(self) -> Self::V {
        [self.0.zero(); N]
    }
    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        [self.0.splat(x); N]
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> Self::V {
        assert!(s.len() >= Self::LANES);
        load_parts!(self, s, load, load_part)
    }
    #[inline(always)]
    fn load_part(self, s: &[f32]) -> Self::V {
        load_parts!(self, s, load, load_part)
    }
    #[inline(always)]
    fn store(self, d: &mut [f32], v: Self::V) {
        assert!(d.len() >= Self::LANES);
        for (i, v) in v.into_iter().enumerate() {
            self.0.store(&mut d[i * Self::PART..], v);
        }
    }
    #[inline(always)]
    fn store_part(self, d: &mut [f32], v: Self::V) {
        for (i, v) in v.into_iter().enumerate() {
            let o = i * Self::PART;
            if o + Self::PART <= d.len() {
                self.0.store(&mut d[o..], v);
            } else if o < d.len() {
                self.0.store_part(&mut d[o..], v);
            }
        }
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> Self::V {
        assert!(s.len() >= Self::LANES);
        load_parts!(self, s, load_f16, load_f16_part)
    }
    #[inline(always)]
    fn load_f16_part(self, s: &[f16]) -> Self::V {
        load_parts!(self, s, load_f16, load_f16_part)
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> Self::V {
        assert!(s.len() >= Self::LANES);
        load_parts!(self, s, load_bf16, load_bf16_part)
    }
    #[inline(always)]
    fn load_bf16_part(self, s: &[bf16]) -> Self::V {
        load_parts!(self, s, load_bf16, load_bf16_part)
    }

    #[inline(always)]
    fn add(self, a: Self::V, b: Self::V) -> Self::V {
        each!(self, add(a, b))
    }
    #[inline(always)]
    fn sub(self, a: Self::V, b: Self::V) -> Self::V {
        each!(self, sub(a, b))
    }
    #[inline(always)]
    fn mul(self, a: Self::V, b: Self::V) -> Self::V {
        each!(self, mul(a, b))
    }
    #[inline(always)]
    fn div(self, a: Self::V, b: Self::V) -> Self::V {
        each!(self, div(a, b))
    }
    #[inline(always)]
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        each!(self, fma(a, b, c))
    }
    #[inline(always)]
    fn fnma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        each!(self, fnma(a, b, c))
    }
    #[inline(always)]
    fn max(self, a: Self::V, b: Self::V) -> Self::V {
        each!(self, max(a, b))
    }
    #[inline(always)]
    fn abs(self, a: Self::V) -> Self::V {
        each!(self, abs(a))
    }
    #[inline(always)]
    fn select_neg(self, x: Self::V, a: Self::V, b: Self::V) -> Self::V {
        each!(self, select_neg(x, a, b))
    }
    #[inline(always)]
    fn zero_below(self, x: Self::V, lim: f32, v: Self::V) -> Self::V {
        {
            let mut r = v;
            for i in 0..N {
                r[i] = self.0.zero_below(x[i], lim, v[i]);
            }
            r
        }
    }
    #[inline(always)]
    fn round(self, a: Self::V) -> Self::V {
        each!(self, round(a))
    }
    #[inline(always)]
    fn exp2i(self, n: Self::V) -> Self::V {
        each!(self, exp2i(n))
    }

    #[inline(always)]
    fn sum(self, v: Self::V) -> f32 {
        self.0.sum(self.halve(v))
    }
    #[inline(always)]
    fn max_lane(self, mut v: Self::V) -> f32 {
        let mut n = N;
        while n > 1 {
            n /= 2;
            for i in 0..n {
                v[i] = self.0.max(v[i], v[i + n]);
            }
        }
        self.0.max_lane(v[0])
    }
    #[inline(always)]
    fn sums4(self, v: [Self::V; 4]) -> [f32; 4] {
        let mut h = [self.0.zero(); 4];
        for (h, v) in h.iter_mut().zip(v) {
            *h = self.halve(v);
        }
        self.0.sums4(h)
    }
    #[inline(always)]
    fn sums8(self, v: [Self::V; 8]) -> [f32; 8] {
        let mut h = [self.0.zero(); 8];
        for (h, v) in h.iter_mut().zip(v) {
            *h = self.halve(v);
        }
        self.0.sums8(h)
    }
    #[inline(always)]
    fn store_sums8(self, v: [Self::V; 8], scale: f32, d: &mut [f32]) {
        let mut h = [self.0.zero(); 8];
        for (h, v) in h.iter_mut().zip(v) {
            *h = self.halve(v);
        }
        self.0.store_sums8(h, scale, d)
    }
    #[inline(always)]
    fn first_eq(self, v: Self::V, x: f32) -> Option<usize> {
        for (i, v) in v.into_iter().enumerate() {
            if let Some(l) = self.0.first_eq(v, x) {
                return Some(i * Self::PART + l);
            }
        }
        None
    }

    #[inline(always)]
    fn load_dup(self, s: &[f32]) -> Self::V {
        assert!(s.len() >= Self::LANES / 2);
        self.load_dup_part(s)
    }
    #[inline(always)]
    fn load_dup_part(self, s: &[f32]) -> Self::V {
        let half = Self::PART / 2;
        let mut v = [self.0.zero(); N];
        for (i, v) in v.iter_mut().enumerate() {
            let o = i * half;
            if o + half <= s.len() {
                *v = self.0.load_dup(&s[o..]);
            } else if o < s.len() {
                *v = self.0.load_dup_part(&s[o..]);
            }
        }
        v
    }
    #[inline(always)]
    fn swap_pairs(self, v: Self::V) -> Self::V {
        each!(self, swap_pairs(v))
    }
    #[inline(always)]
    fn fmaddsub(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        each!(self, fmaddsub(a, b, c))
    }
}
