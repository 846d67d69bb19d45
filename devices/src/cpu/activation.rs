//! Activation functions, one kernel each for every level (see [`simd`]).

use flm_core::{Data, Result};

use super::simd::{self, Kernel, Simd};
use super::Isa;

/// A gate activation.
pub(crate) trait GateAct {
    /// `act(x)` on a vector.
    fn vector<S: Simd>(s: S, x: S::V) -> S::V;
}

/// SiLU, `x / (1 + e^-x)` (llama2.c `forward`), computed as `x · σ(x)` with
/// `σ(x) = 1 / (1 + e)` for `x >= 0` and `e / (1 + e)` for `x < 0`, `e = e^-|x|` from the
/// polynomial [`simd::exp`]: `e <= 1` never overflows, and each step is within a rounding
/// or two, so the result is within a few units of rounding of the true value (and 0 where
/// it is below about `1e-36`).
pub(crate) struct Silu;

impl GateAct for Silu {
    #[inline(always)]
    fn vector<S: Simd>(s: S, g: S::V) -> S::V {
        let one = s.splat(1.0);
        let e = simd::exp_simd(s, s.sub(s.zero(), s.abs(g)));
        let sig = s.div(s.select_neg(g, e, one), s.add(one, e));
        s.mul(g, sig)
    }
}

/// GELU in its tanh approximation, as [`gelu`] (Gemma's `gelu_pytorch_tanh`).
pub(crate) struct GeluTanh;

impl GateAct for GeluTanh {
    #[inline(always)]
    fn vector<S: Simd>(s: S, x: S::V) -> S::V {
        gelu_v(s, x)
    }
}

/// A gated feed-forward's gate, element-wise over f32 tensors of one shape:
/// `out = act(gate) * up` (SwiGLU with [`Silu`], GeGLU with [`GeluTanh`]; Shazeer 2020).
pub(crate) fn gate_mul<A: GateAct>(
    isa: Isa,
    gate: &Data,
    up: &Data,
    output: &mut Data,
) -> Result<()> {
    let k = GateMul::<A> {
        g: gate.as_f32()?,
        u: up.as_f32()?,
        out: output.as_f32_mut()?,
        act: std::marker::PhantomData,
    };
    simd::run(isa, k);
    Ok(())
}

/// The operands of [`gate_mul`], as f32 slices of one length.
struct GateMul<'a, A> {
    g: &'a [f32],
    u: &'a [f32],
    out: &'a mut [f32],
    act: std::marker::PhantomData<A>,
}

impl<A: GateAct> Kernel for GateMul<'_, A> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (n, l) = (self.out.len(), S::LANES);
        let (g, u) = (&self.g[..n], &self.u[..n]);
        let mut c = 0;
        while c + l <= n {
            let v = s.mul(A::vector(s, s.load(&g[c..])), s.load(&u[c..]));
            s.store(&mut self.out[c..], v);
            c += l;
        }
        if c < n {
            let v = s.mul(A::vector(s, s.load_part(&g[c..])), s.load_part(&u[c..]));
            s.store_part(&mut self.out[c..], v);
        }
    }
}

/// `sqrt(2/π)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation.
const GELU_CUBIC: f32 = 0.044_715;

/// GELU, tanh approximation (Hendrycks & Gimpel 2016, section 2), in place:
/// `x = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`, as THUDM ChatGLM-6B's `gelu_impl`.
///
/// `tanh(u)` is [`simd::tanh`]: `sign(u)·(1 − e)/(1 + e)` with `e = e^(−2|u|) <= 1` from
/// the polynomial [`simd::exp`], which never overflows.
pub(crate) fn gelu(isa: Isa, x: &mut Data) -> Result<()> {
    let k = Gelu(x.as_f32_mut()?);
    simd::run(isa, k);
    Ok(())
}

/// The values [`gelu`] rewrites.
struct Gelu<'a>(&'a mut [f32]);

impl Kernel for Gelu<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (n, l) = (self.0.len(), S::LANES);
        let mut c = 0;
        while c + l <= n {
            let v = gelu_v(s, s.load(&self.0[c..]));
            s.store(&mut self.0[c..], v);
            c += l;
        }
        if c < n {
            let v = gelu_v(s, s.load_part(&self.0[c..]));
            s.store_part(&mut self.0[c..], v);
        }
    }
}

/// GELU of a vector: `0.5·x·(1 + tanh(sqrt(2/π)·(0.044715·x²·x + x)))`.
#[inline(always)]
fn gelu_v<S: Simd>(s: S, x: S::V) -> S::V {
    let one = s.splat(1.0);
    let cubic = s.mul(s.splat(GELU_CUBIC), s.mul(x, x));
    let u = s.mul(s.splat(SQRT_2_OVER_PI), s.fma(cubic, x, x));
    s.mul(s.mul(s.splat(0.5), x), s.add(one, simd::tanh_simd(s, u)))
}

/// Soft-capping in place, `x = cap · tanh(x / cap)` (Gemma 2's final logits; transformers
/// `Gemma2ForCausalLM.forward`), `tanh` as [`simd::tanh`].
pub(crate) fn soft_cap(isa: Isa, x: &mut Data, cap: f32) -> Result<()> {
    let k = SoftCap {
        x: x.as_f32_mut()?,
        cap,
    };
    simd::run(isa, k);
    Ok(())
}

/// The values [`soft_cap`] rewrites, and the cap.
struct SoftCap<'a> {
    x: &'a mut [f32],
    cap: f32,
}

impl Kernel for SoftCap<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (n, l) = (self.x.len(), S::LANES);
        let cap = s.splat(self.cap);
        let mut c = 0;
        while c + l <= n {
            let v = s.mul(cap, simd::tanh_simd(s, s.div(s.load(&self.x[c..]), cap)));
            s.store(&mut self.x[c..], v);
            c += l;
        }
        if c < n {
            let v = s.mul(
                cap,
                simd::tanh_simd(s, s.div(s.load_part(&self.x[c..]), cap)),
            );
            s.store_part(&mut self.x[c..], v);
        }
    }
}
