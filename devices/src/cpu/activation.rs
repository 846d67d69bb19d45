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
        s.mul(g, sigmoid(s, g))
    }
}

/// `σ(x) = 1 / (1 + e)` for `x >= 0` and `e / (1 + e)` below, `e = e^-|x|` (see [`Silu`]).
#[inline(always)]
fn sigmoid<S: Simd>(s: S, x: S::V) -> S::V {
    let one = s.splat(1.0);
    let e = simd::exp_simd(s, s.sub(s.zero(), s.abs(x)));
    s.div(s.select_neg(x, e, one), s.add(one, e))
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

/// gpt-oss's clamped SwiGLU (transformers' `GptOssExperts`, `swiglu_limit`), element-wise
/// over f32 tensors of one shape: `out = (clamp(up, −limit, limit) + 1) · g·σ(α·g)` with
/// `g = min(gate, limit)`; a NaN gate counts as `limit` (as `f32::min`), a NaN up stays NaN.
pub(crate) fn clamped_swiglu(
    isa: Isa,
    (gate, up): (&Data, &Data),
    (alpha, limit): (f32, f32),
    output: &mut Data,
) -> Result<()> {
    let k = ClampedSwiGlu {
        g: gate.as_f32()?,
        u: up.as_f32()?,
        out: output.as_f32_mut()?,
        alpha,
        limit,
    };
    simd::run(isa, k);
    Ok(())
}

/// The operands of [`clamped_swiglu`], as f32 slices of one length.
struct ClampedSwiGlu<'a> {
    g: &'a [f32],
    u: &'a [f32],
    out: &'a mut [f32],
    alpha: f32,
    limit: f32,
}

impl ClampedSwiGlu<'_> {
    #[inline(always)]
    fn vector<S: Simd>(&self, s: S, g: S::V, u: S::V) -> S::V {
        // min(a, limit) as −max(−a, −limit): negation by −1 keeps a zero's sign, and `max`
        // passes over a NaN in its first operand, keeps one in its second.
        let (minus, low) = (s.splat(-1.0), s.splat(-self.limit));
        let g = s.mul(s.max(s.mul(g, minus), low), minus);
        let u = s.mul(s.max(low, s.mul(s.max(low, u), minus)), minus);
        let glu = s.mul(g, sigmoid(s, s.mul(s.splat(self.alpha), g)));
        s.mul(s.add(u, s.splat(1.0)), glu)
    }
}

impl Kernel for ClampedSwiGlu<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (n, l) = (self.out.len(), S::LANES);
        let mut c = 0;
        while c + l <= n {
            let v = self.vector(s, s.load(&self.g[c..]), s.load(&self.u[c..]));
            s.store(&mut self.out[c..], v);
            c += l;
        }
        if c < n {
            let v = self.vector(s, s.load_part(&self.g[c..]), s.load_part(&self.u[c..]));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// At every level, the clamped SwiGLU is, bit for bit, its scalar formula over the
    /// router's scalar `σ` (the same operations on one lane), on values around the limit,
    /// signed zeros, infinities and NaNs (any NaN counts as one: its sign and payload are
    /// not values).
    fn bits(v: f32) -> u32 {
        if v.is_nan() {
            f32::NAN.to_bits()
        } else {
            v.to_bits()
        }
    }

    #[test]
    fn clamped_swiglu_is_its_scalar_formula_at_every_level() {
        let (alpha, limit) = (1.702f32, 7.0f32);
        let special = [0.0, -0.0, 7.0, -7.0, 7.5, -7.5, 1e30, -1e30, f32::INFINITY];
        let special = [&special[..], &[f32::NEG_INFINITY, f32::NAN, -60.0, 60.0]].concat();
        let mut values: Vec<f32> = (0..200).map(|i| (i as f32 - 100.0) * 0.173).collect();
        values.extend(&special);
        let (g, u): (Vec<f32>, Vec<f32>) = values
            .iter()
            .flat_map(|&g| special.iter().chain(&values[..7]).map(move |&u| (g, u)))
            .unzip();
        let want: Vec<u32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                bits((u + 1.0) * (g * super::super::moe::sigmoid(alpha * g)))
            })
            .collect();
        let gate = Data::from_f32(&[g.len()], &g).unwrap();
        let up = Data::from_f32(&[u.len()], &u).unwrap();
        for isa in Isa::supported() {
            let mut out = Data::from_f32(&[g.len()], &vec![0.0; g.len()]).unwrap();
            clamped_swiglu(isa, (&gate, &up), (alpha, limit), &mut out).unwrap();
            let got: Vec<u32> = out.as_f32().unwrap().iter().map(|&v| bits(v)).collect();
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a, b, "{isa}: gate {} up {}", g[i], u[i]);
            }
        }
    }
}
