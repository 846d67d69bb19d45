//! Normalisation layers.

use flm_core::{Data, Result};

use super::simd::{self, Elem, Kernel, Simd};
use super::weights::WeightRows;
use super::Isa;

/// RMSNorm (Zhang & Sennrich 2019) as in llama2.c `rmsnorm` and HF `LlamaRMSNorm`:
/// `out = x / sqrt(mean(x²) + eps) * weight`, per row of `input` `[n, dim]`, accumulated in
/// f32; `weight` `[dim]` is f32, f16, bf16 (or quantised, dequantised first).
pub(crate) fn rms_norm(
    isa: Isa,
    input: &Data,
    weight: &Data,
    eps: f32,
    output: &mut Data,
) -> Result<()> {
    let dim = input.cols();
    let x = input.as_f32()?;
    let out = output.as_f32_mut()?;
    match WeightRows::new(weight)? {
        WeightRows::F32(w) => rms_norm_rows(isa, x, w, eps, out),
        WeightRows::F16(w) => rms_norm_rows(isa, x, w, eps, out),
        WeightRows::BF16(w) => rms_norm_rows(isa, x, w, eps, out),
        rows @ WeightRows::Quant { .. } => {
            // Quantised gains are not produced by any converter; dequantise them (once).
            let mut buf = Vec::new();
            let w = rows.row(0, dim, &mut buf)?.to_vec();
            rms_norm_rows(isa, x, &w, eps, out)
        }
    }
    Ok(())
}

/// The rows of `x` `[n, w.len()]` normalised into `out`.
struct RmsNormRows<'a, E> {
    x: &'a [f32],
    w: &'a [E],
    eps: f32,
    out: &'a mut [f32],
}

/// [`rms_norm`] of `x` `[n, w.len()]` with gains `w`, at `isa`.
fn rms_norm_rows<E: Elem>(isa: Isa, x: &[f32], w: &[E], eps: f32, out: &mut [f32]) {
    let k = RmsNormRows { x, w, eps, out };
    simd::run(isa, k)
}

impl<E: Elem> Kernel for RmsNormRows<'_, E> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (dim, l) = (self.w.len(), S::LANES);
        let w = self.w;
        for (src, dst) in self.x.chunks_exact(dim).zip(self.out.chunks_exact_mut(dim)) {
            let scale = 1.0 / (simd::dot(s, src, src) / dim as f32 + self.eps).sqrt();
            let scale = s.splat(scale);
            let mut c = 0;
            while c + l <= dim {
                let v = s.mul(s.mul(s.load(&src[c..]), scale), E::load(s, &w[c..]));
                s.store(&mut dst[c..], v);
                c += l;
            }
            if c < dim {
                let v = s.mul(
                    s.mul(s.load_part(&src[c..]), scale),
                    E::load_part(s, &w[c..]),
                );
                s.store_part(&mut dst[c..], v);
            }
        }
    }
}

/// LayerNorm (Ba et al. 2016) as `torch.nn.LayerNorm`: per row of `input` `[n, dim]`,
/// `out = (x − mean) / sqrt(var + eps) * weight + bias` with the biased variance,
/// accumulated in f32 in two passes (mean, then the squared deviations), so that a large
/// mean does not cancel the variance. `weight` and `bias` `[dim]` are any dtype (widened to
/// f32 once per call).
pub(crate) fn layer_norm(
    isa: Isa,
    input: &Data,
    weight: &Data,
    bias: &Data,
    eps: f32,
    output: &mut Data,
) -> Result<()> {
    let (w, b) = (weight.to_f32_vec()?, bias.to_f32_vec()?);
    let k = LayerNormRows {
        x: input.as_f32()?,
        w: &w,
        b: &b,
        eps,
        out: output.as_f32_mut()?,
    };
    simd::run(isa, k);
    Ok(())
}

/// The rows of `x` `[n, w.len()]` layer-normalised into `out`.
struct LayerNormRows<'a> {
    x: &'a [f32],
    w: &'a [f32],
    b: &'a [f32],
    eps: f32,
    out: &'a mut [f32],
}

impl Kernel for LayerNormRows<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (dim, l) = (self.w.len(), S::LANES);
        let full = dim / l * l;
        for (src, dst) in self.x.chunks_exact(dim).zip(self.out.chunks_exact_mut(dim)) {
            let mut acc = s.zero();
            let mut c = 0;
            while c < full {
                acc = s.add(acc, s.load(&src[c..]));
                c += l;
            }
            if c < dim {
                acc = s.add(acc, s.load_part(&src[c..]));
            }
            let m = s.sum(acc) / dim as f32;
            let mean = s.splat(m);
            // Squared deviations: whole vectors, then the tail one value at a time (zero
            // padding would add `mean²` per padded lane).
            let mut acc = s.zero();
            c = 0;
            while c < full {
                let d = s.sub(s.load(&src[c..]), mean);
                acc = s.fma(d, d, acc);
                c += l;
            }
            let tail: f32 = src[full..].iter().map(|v| (v - m) * (v - m)).sum();
            let var = (s.sum(acc) + tail) / dim as f32;
            let inv = s.splat(1.0 / (var + self.eps).sqrt());
            c = 0;
            while c < full {
                let d = s.mul(s.sub(s.load(&src[c..]), mean), inv);
                let v = s.fma(d, s.load(&self.w[c..]), s.load(&self.b[c..]));
                s.store(&mut dst[c..], v);
                c += l;
            }
            if c < dim {
                let d = s.mul(s.sub(s.load_part(&src[c..]), mean), inv);
                let v = s.fma(d, s.load_part(&self.w[c..]), s.load_part(&self.b[c..]));
                s.store_part(&mut dst[c..], v);
            }
        }
    }
}
