//! Activation functions.

// The SIMD kernels run where an instruction set implements `Simd` (x86-64 so far; NEON is
// to come): elsewhere only the portable twins are called.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use flm_core::{Data, Result};

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
use super::simd::neon;
#[cfg(target_arch = "x86_64")]
use super::simd::x86;
use super::simd::{self, Kernel, Simd};
use super::{shape_err, Isa};

/// SwiGLU gate: `out = silu(gate) * up`, `silu(x) = x / (1 + e^-x)` (llama2.c `forward`),
/// element-wise over f32 tensors of one shape.
///
/// Computed as `x · σ(x)` with `σ(x) = 1 / (1 + e)` for `x >= 0` and `e / (1 + e)` for
/// `x < 0`, `e = e^-|x|` from the polynomial [`simd::exp`]: `e <= 1` never overflows, and
/// each step is within a rounding or two, so the result is within a few units of rounding
/// of the true value (and 0 where it is below about `1e-36`).
pub(crate) fn silu_mul(isa: Isa, gate: &Data, up: &Data, output: &mut Data) -> Result<()> {
    if gate.shape() != up.shape() || gate.shape() != output.shape() {
        return Err(shape_err(
            "SiluMul",
            format!(
                "gate {:?}, up {:?}, output {:?}",
                gate.shape(),
                up.shape(),
                output.shape()
            ),
        ));
    }
    let k = SiluMul {
        g: gate.as_f32()?,
        u: up.as_f32()?,
        out: output.as_f32_mut()?,
    };
    match isa {
        // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512(k) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => unsafe { x86::avx2(k) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon | Isa::NeonDot => neon::neon(k),
        _ => k.portable(),
    }
    Ok(())
}

/// The operands of [`silu_mul`], as f32 slices of one length.
struct SiluMul<'a> {
    g: &'a [f32],
    u: &'a [f32],
    out: &'a mut [f32],
}

impl SiluMul<'_> {
    /// The portable twin of the SIMD kernel below: the same steps.
    fn portable(self) {
        for ((o, &g), &u) in self.out.iter_mut().zip(self.g).zip(self.u) {
            let e = simd::exp(-g.abs());
            let num = if g.is_sign_negative() { e } else { 1.0 };
            *o = g * (num / (1.0 + e)) * u;
        }
    }
}

impl Kernel for SiluMul<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (n, l) = (self.out.len(), S::LANES);
        let (g, u) = (&self.g[..n], &self.u[..n]);
        let mut c = 0;
        while c + l <= n {
            let v = silu_mul_v(s, s.load(&g[c..]), s.load(&u[c..]));
            s.store(&mut self.out[c..], v);
            c += l;
        }
        if c < n {
            let v = silu_mul_v(s, s.load_part(&g[c..]), s.load_part(&u[c..]));
            s.store_part(&mut self.out[c..], v);
        }
    }
}

/// `silu(g) · u` on a vector, as [`SiluMul::portable`].
#[inline(always)]
fn silu_mul_v<S: Simd>(s: S, g: S::V, u: S::V) -> S::V {
    let one = s.splat(1.0);
    let e = simd::exp_simd(s, s.sub(s.zero(), s.abs(g)));
    let sig = s.div(s.select_neg(g, e, one), s.add(one, e));
    s.mul(s.mul(g, sig), u)
}
