//! Weight quantisation: the byte layouts of the int8 and int4 dtypes, and the int8
//! activation blocks they are dotted against (the pairing FastLLM and ggml use: integer
//! dot products between quantised weights and activations quantised on the fly).
//!
//! A quantised matrix `[rows, cols]` is stored row after row; each row is padded with
//! zeros to a multiple of [`BLOCK`] (int8) or of the group size (int4).
//!
//! **int8, per output channel** ([`DataType::I8`]). Row: an f32 scale `s`, then
//! `cols_padded` int8 values `q`. `s = max|w| / 127`, `q = round(w / s)` in `[-127, 127]`,
//! `ŵ = s · q`. Error bound: `|w − ŵ| ≤ s / 2 = max|w| / 254` per row.
//!
//! **int4, group-wise, asymmetric** ([`DataType::I4G32`], `I4G64`, `I4G128`). Groups of `G`
//! values, each with an f16 scale `d` and an f16 minimum `m`; codes
//! `q = round((w − m) / d)` clamped to `[0, 15]`; `ŵ = d · q + m`. `(d, m)` start from the
//! min/max fit `((max − min) / 15, min)` and are refined by a least-squares search
//! ([`quantize_row`]) that only ever lowers the group's squared error. A row of `P` padded
//! values with `n = P / G` groups is laid out for SIMD kernels (structure of arrays): first
//! the `P / 2` bytes of codes, then the `n` scales `d`, then the `n` minimums `m`. Within each
//! run of 32 values, byte `i` of the run holds value `i` in its low nibble and value
//! `i + 16` in its high nibble (ggml's order, which SIMD kernels unpack with one mask and
//! one shift; see [`nibble`]). Error bound of the min/max fit: `|w − ŵ| ≤ d / 2 + ε`, where
//! `ε ≤ 2⁻¹¹ (|m| + 15 d)` covers the f16 rounding of `d` and `m`, about
//! `(max − min) / 30` per group; the refined fit has a lower or equal squared error (its
//! worst single value may exceed that bound slightly where clamping trades it for a lower
//! total).
//!
//! **int4, group-wise, symmetric** ([`DataType::I4SymG32`], `I4SymG64`, `I4SymG128`; ggml's
//! Q4_0 at groups of 32). Groups of `G` values, each with one f16 scale `d`, which may be
//! negative; codes `q = round(w / d) + 8` clamped to `[0, 15]`; `ŵ = d · (q − 8)`. `d`
//! starts from ggml's `quantize_row_q4_0` fit, `w* / −8` for the value `w*` of largest
//! magnitude (so that it gets code 0 and the other side of the group the 7 steps left), and
//! is refined by a least-squares search ([`quantize_row`]) that only lowers the group's
//! squared error. A row: the `P / 2` bytes of codes, in the order above, then the `n`
//! scales. This is the asymmetric form with the minimum `m = −8 d` implied, which is how
//! every kernel reads it ([`Int4Row::min_factor`]). Error bound of the initial fit:
//! `|w − ŵ| ≤ |d| / 2 + 2⁻¹¹ · 8 |d|`, about `max|w| / 16` per group.
//!
//! **ggml's Q8_0** ([`DataType::Q8_0`]): blocks of [`BLOCK`] values as ggml stores them,
//! an f16 scale `d` then 32 int8 codes (34 bytes); `d = max|w| / 127`, `q = round(w / d)`
//! (`quantize_row_q8_0_ref`), `ŵ = d · q`. Error bound: `|w − ŵ| ≤ d / 2` plus the f16
//! rounding of `d` (`2⁻¹¹ · 127 d`), per block.
//!
//! **int4, group-wise, integer zero point** ([`DataType::I4ZpG32`], `I4ZpG64`, `I4ZpG128`;
//! the asymmetric scheme of GPTQ and AWQ, `w = scale · (q − zero)`). The layout of int4
//! with the f16 zero point `z` (an integer in `[0, 15]`, exact in f16) where int4 has its
//! minimum: `ŵ = d · (q − z)`. Kernels read it as int4 with the minimum `m = −d · z`
//! formed in f32, which is exact (an 11-bit significand times a 4-bit integer), so
//! `d · q + m` is `d · (q − z)` to the bit ([`Int4Row::times_scale`]); int4's f16 minimum
//! would round `−d · z`, which needs up to 15 significant bits. The fit is GPTQ's
//! (`Quantizer.find_params`): the range widened to hold 0, `d = (max − min) / 15`,
//! `z = round(−min / d)`, then a least-squares search over `d` ([`quantize_row`]) that only
//! lowers the group's squared error. Error bound of the initial fit: `|w − ŵ| ≤ d / 2 + ε`
//! with `ε ≤ 2⁻¹¹ · 15 d` for the f16 rounding of `d`, plus up to `d / 2` at the far end
//! of the range from rounding `z`.
//!
//! **Importance** ([`quantize_row_weighted`]): given llama.cpp's importance matrix (one
//! weight per input column), every fit above minimises the importance-weighted squared
//! error instead, with llama.cpp's block weights and wider searches; without it the bytes
//! are those of [`quantize_row`].
//!
//! The CPU kernels dot these rows against activations quantised to int8 in blocks of
//! [`BLOCK`] values (scale `a`, codes `q_x`), so that
//! `Σ ŵ·x ≈ Σ_blocks a · (d · Σ q_w q_x + m · Σ q_x)` (int4) or `s · Σ_blocks a · Σ q_w q_x`
//! (int8), with every inner sum an exact integer.

use half::f16;

use crate::blocks;
use crate::ggml::GgmlType;
use crate::{DataType, Format, Int4Form};

/// Values per activation block, and the unit int8 rows are padded to.
pub const BLOCK: usize = 32;

/// `cols` rounded up to the padding unit of `dtype` (saturating at `usize::MAX`, which no
/// allocation or file can reach).
pub fn padded_cols(dtype: DataType, cols: usize) -> usize {
    let unit = pad_unit(dtype);
    cols.div_ceil(unit).saturating_mul(unit)
}

/// The unit rows of `dtype` are padded to: the int4 group, the ggml block, or [`BLOCK`].
fn pad_unit(dtype: DataType) -> usize {
    match dtype.format() {
        Some(Format::Int4 { group, .. }) => group,
        Some(Format::Ggml(ty)) => ty.block_len(),
        _ => BLOCK,
    }
}

/// Bytes of one row of `cols` values of a quantised `dtype`; `None` for float types or on
/// overflow.
pub fn row_bytes(dtype: DataType, cols: usize) -> Option<usize> {
    let unit = pad_unit(dtype);
    let padded = cols.div_ceil(unit).checked_mul(unit)?;
    match dtype.format()? {
        Format::Int8 => padded.checked_add(4),
        Format::Ggml(ty) => ty.byte_len(padded),
        Format::Int4 { group, .. } => (padded / group).checked_mul(group_bytes(dtype)?),
    }
}

/// Bytes of one int4 group: its codes and its f16 scale (and minimum, if asymmetric).
fn group_bytes(dtype: DataType) -> Option<usize> {
    let g = dtype.group_size()?;
    Some(g / 2 + if dtype.is_int4_symmetric() { 2 } else { 4 })
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Quantises one row of `src` (its `cols` values) into `dst` (`row_bytes(dtype, cols)`
/// bytes). Float dtypes are not handled here.
pub fn quantize_row(dtype: DataType, src: &[f32], dst: &mut [u8]) {
    quantize_row_weighted(dtype, src, None, dst)
}

/// Quantises one row as [`quantize_row`] does, choosing each block's parameters (scale, and
/// minimum or zero point) to minimise the importance-weighted squared error
/// `Σ_j w_j (x_j − x̂_j)²` where `importance` is given: one non-negative weight per value
/// of `src` (llama.cpp's imatrix `quant_weights`, the mean of `x_j²` over calibration
/// activations for input column `j`). `None` gives [`quantize_row`]'s bytes exactly.
///
/// The block weights are llama.cpp's (`ggml-quants.c`): `w_j = importance_j ·
/// sqrt(σ² + x_j²)` with `σ² = 2 Σ x² / n` over the row for int8 and the int4 forms
/// (`importance_weights`), over each super-block for Q4_K and Q5_K
/// (`quantize_row_q4_K_impl`, `quantize_row_q5_K_impl`) and IQ4_XS (`quantize_iq4_xs`),
/// over each block of 32 for IQ4_NL (`quantize_iq4_nl`), and `w_j = importance_j` for
/// Q6_K (`quantize_row_q6_K_impl`). Q8_0 and MXFP4 ignore importance, as ggml does. The
/// searches: int8 tries scales around `max|x| / 127` with a least-squares refit of each;
/// the int4 forms widen their searches to `make_qkx3_quants`' grid (asymmetric, zero
/// point) or `make_qx_quants`' (symmetric) with weighted least-squares refits; the
/// K-quants and IQ4 types are [`crate::blocks::quantize_weighted`]'s. The block weights
/// steer the search; each group (the int8 row, each int4 group, each K-quant
/// super-block) then keeps the better of that fit and the fit without importance by the
/// importance-weighted error `Σ importance_j (x_j − x̂_j)²` (the first-order output error
/// the imatrix stands for), so importance never makes a group worse by that measure and
/// uniform importance never does worse than none. IQ4_NL and IQ4_XS are the exception:
/// they keep llama.cpp's weighted fit as it is, so that their bytes are ggml's.
///
/// # Panics
/// If `importance` is not of `src.len()` values.
pub fn quantize_row_weighted(
    dtype: DataType,
    src: &[f32],
    importance: Option<&[f32]>,
    dst: &mut [u8],
) {
    if let Some(imp) = importance {
        assert_eq!(imp.len(), src.len(), "one importance per value");
    }
    if let Some(ty) = dtype.ggml_type() {
        return blocks::quantize_weighted(ty, src, importance, dst);
    }
    let weights = importance.map(|imp| importance_weights(src, imp));
    let weights = weights.as_deref();
    match dtype.group_size() {
        None => {
            let mut scale = fit_int8(src, None);
            if let (Some(imp), Some(w)) = (importance, weights) {
                let weighted = fit_int8(src, Some(w).filter(|w| has_weight(w)));
                if int8_error(src, imp, weighted) < int8_error(src, imp, scale) {
                    scale = weighted;
                }
            }
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            dst[..4].copy_from_slice(&scale.to_le_bytes());
            let (q, pad) = dst[4..].split_at_mut(src.len());
            for (q, &w) in q.iter_mut().zip(src) {
                *q = int8_code(w, inv);
            }
            pad.fill(0);
        }
        Some(g) => {
            let Int4RowMut {
                codes,
                scales: ds,
                mins: ms,
            } = Int4RowMut::split(dtype, dst);
            codes.fill(0);
            let form = dtype.int4_form().expect("an int4 dtype");
            for (gi, values) in chunks_padded(src, g).enumerate() {
                let from = (gi * g).min(src.len());
                let group = from..from + values.len();
                let mut fit = fit_group(form, values, None);
                if let (Some(imp), Some(w)) = (importance, weights) {
                    let w = &w[group.clone()];
                    if has_weight(w) {
                        let weighted = fit_group(form, values, Some(w));
                        let imp = Some(&imp[group]);
                        if int4_error(values, imp, weighted.d.to_f32(), weighted.m)
                            < int4_error(values, imp, fit.d.to_f32(), fit.m)
                        {
                            fit = weighted;
                        }
                    }
                }
                ds[2 * gi..2 * gi + 2].copy_from_slice(&fit.d.to_le_bytes());
                if let Some(stored) = fit.stored_min {
                    ms[2 * gi..2 * gi + 2].copy_from_slice(&stored.to_le_bytes());
                }
                let inv = inverse(fit.d.to_f32());
                for (i, &w) in values.iter().enumerate() {
                    let (byte, shift) = nibble(gi * g + i);
                    codes[byte] |= code(w, inv, fit.m) << shift;
                }
            }
        }
    }
}

/// The fit of one int4 group: its f16 scale, what the row stores as its minimum (none for
/// the symmetric form), and the minimum `m` that gives.
#[derive(Clone, Copy)]
struct GroupFit {
    d: f16,
    stored_min: Option<f16>,
    m: f32,
}

/// The fit of `values` as an int4 group of `form`, weighted by `w` where given.
fn fit_group(form: Int4Form, values: &[f32], w: Option<&[f32]>) -> GroupFit {
    match form {
        Int4Form::Symmetric => {
            let d = fit_int4_symmetric(values, w);
            GroupFit {
                d,
                stored_min: None,
                m: -8.0 * d.to_f32(),
            }
        }
        Int4Form::Min => {
            let (d, m) = fit_int4(values, w);
            GroupFit {
                d,
                stored_min: Some(m),
                m: m.to_f32(),
            }
        }
        Int4Form::ZeroPoint => {
            let (d, z) = fit_int4_zero_point(values, w);
            let z = f16::from_f32(f32::from(z));
            GroupFit {
                d,
                stored_min: Some(z),
                m: zero_point_min(d, z),
            }
        }
    }
}

/// llama.cpp's block weights for importance `importance` (one per value of `x`):
/// `importance_j · sqrt(σ² + x_j²)` with `σ² = 2 Σ x² / n` (`quantize_row_q4_K_impl`), so
/// that large values, which dominate a block's output, count more than their importance
/// alone says.
pub(crate) fn importance_weights(x: &[f32], importance: &[f32]) -> Vec<f32> {
    let sigma2 = 2.0 * x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32;
    x.iter()
        .zip(importance)
        .map(|(&v, &imp)| imp * (sigma2 + v * v).sqrt())
        .collect()
}

/// Whether some weight is positive: a group without is fitted as without importance.
fn has_weight(w: &[f32]) -> bool {
    w.iter().any(|&w| w > 0.0)
}

/// The weight of value `i`: 1 without weights.
#[inline(always)]
fn weight(w: Option<&[f32]>, i: usize) -> f32 {
    w.map_or(1.0, |w| w[i])
}

/// The int8 code of `w` for inverse scale `inv` (0 when the scale is 0).
fn int8_code(w: f32, inv: f32) -> u8 {
    (w * inv).round().clamp(-127.0, 127.0) as i8 as u8
}

/// Squared error of an int8 row coded with scale `s`, weighted by `w`.
fn int8_error(src: &[f32], w: &[f32], s: f32) -> f32 {
    let inv = inverse(s);
    src.iter()
        .zip(w)
        .map(|(&x, &wt)| {
            let e = s * f32::from(int8_code(x, inv) as i8) - x;
            wt * e * e
        })
        .sum()
}

/// The scale of an int8 row: `max|x| / 127`, and with weights the best of that and, for
/// candidate scales from a little above it down to 0.6 of it (clipping the largest values
/// where they weigh little), their codes' weighted least-squares scale `Σ w q x / Σ w q²`,
/// by weighted squared error.
fn fit_int8(src: &[f32], w: Option<&[f32]>) -> f32 {
    const SEARCH: std::ops::RangeInclusive<i32> = -4..=28;
    const SEARCH_DELTA: f32 = 0.025;
    let amax = absmax(src);
    let base = amax / 127.0;
    let Some(w) = w else { return base };
    if amax == 0.0 {
        return base;
    }
    let error = |s: f32| int8_error(src, w, s);
    let (mut best, mut best_err) = (base, error(base));
    for step in SEARCH {
        let s0 = base / (1.0 + step as f32 * SEARCH_DELTA);
        let inv = inverse(s0);
        let (mut sqq, mut sqx) = (0.0f32, 0.0f32);
        for (&x, &wt) in src.iter().zip(w) {
            let q = f32::from(int8_code(x, inv) as i8);
            sqq += wt * q * q;
            sqx += wt * q * x;
        }
        let refit = if sqq > 0.0 { sqx / sqq } else { s0 };
        for s in [s0, refit] {
            let err = error(s);
            if s > 0.0 && err < best_err {
                (best, best_err) = (s, err);
            }
        }
    }
    best
}

/// The 4-bit code of `w` for inverse scale `inv_d` (0 when the scale is 0) and minimum `m`.
fn code(w: f32, inv_d: f32, m: f32) -> u8 {
    ((w - m) * inv_d).round().clamp(0.0, 15.0) as u8
}

/// `1 / d`, or 0 for a zero (or non-finite) scale.
fn inverse(d: f32) -> f32 {
    if d != 0.0 && d.is_finite() {
        1.0 / d
    } else {
        0.0
    }
}

/// Squared error of a group coded with `(d, m)`, weighted by `w` where given.
fn int4_error(values: &[f32], w: Option<&[f32]>, d: f32, m: f32) -> f32 {
    let inv = inverse(d);
    values
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let e = d * code(x, inv, m) as f32 + m - x;
            weight(w, i) * e * e
        })
        .sum()
}

/// The candidate grid of an int4 search: without weights `(3, 0.3)`, the few steps flm
/// always used; with weights `(18, 0.05)`, `make_qkx3_quants`' finer grid over the same
/// span (`nmax ± 0.9`).
fn asymmetric_grid(w: Option<&[f32]>) -> (i32, f32) {
    if w.is_some() {
        (18, 0.05)
    } else {
        (3, 0.3)
    }
}

/// Scale and minimum of an int4 group, chosen to minimise the squared error (weighted by
/// `w` where given): the min/max fit `((max − min)/15, min)`, then for each of a few
/// candidate scales around it ([`asymmetric_grid`]) the codes are fixed and `(d, m)`
/// refitted by (weighted) least squares, keeping the best (the search of llama.cpp's
/// `make_qkx2_quants` and `make_qkx3_quants`). Both are rounded to f16 before they are
/// scored, since that is what is stored.
fn fit_int4(values: &[f32], w: Option<&[f32]>) -> (f16, f16) {
    const LLOYD_ROUNDS: usize = 2;
    let (search_steps, search_delta) = asymmetric_grid(w);
    let min = values.iter().copied().fold(f32::INFINITY, f32::min);
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if values.is_empty() || max <= min {
        return (
            f16::ZERO,
            f16::from_f32(if values.is_empty() { 0.0 } else { min }),
        );
    }
    let round = |d: f32, m: f32| (f16::from_f32(d), f16::from_f32(m));
    let sw: f32 = (0..values.len()).map(|i| weight(w, i)).sum();
    // Least-squares (d, m) for the codes that scale `d0` and minimum `m0` give.
    let refit = |d0: f32, m0: f32| -> Option<(f32, f32)> {
        let (mut sq, mut sqq, mut sx, mut sqx) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
        let inv = inverse(d0);
        for (i, &x) in values.iter().enumerate() {
            let (q, wt) = (code(x, inv, m0) as f32, weight(w, i));
            sq += wt * q;
            sqq += wt * q * q;
            sx += wt * x;
            sqx += wt * q * x;
        }
        let det = sw * sqq - sq * sq;
        let d = (sw * sqx - sq * sx) / det;
        (det > 0.0 && d > 0.0).then(|| (d, (sx - d * sq) / sw))
    };
    let mut best = round((max - min) / 15.0, min);
    let mut best_err = int4_error(values, w, best.0.to_f32(), best.1.to_f32());
    let mut consider = |d: f32, m: f32| {
        let candidate = round(d, m);
        let err = int4_error(values, w, candidate.0.to_f32(), candidate.1.to_f32());
        if err < best_err {
            best = candidate;
            best_err = err;
            true
        } else {
            false
        }
    };
    for step in -search_steps..=search_steps {
        let d0 = (max - min) / (15.0 + step as f32 * search_delta);
        let mut fit = refit(d0, min);
        // Alternate codes and least-squares fits while the error drops (Lloyd-Max style).
        for _ in 0..LLOYD_ROUNDS {
            let Some((d, m)) = fit else { break };
            if !consider(d, m) {
                break;
            }
            fit = refit(d, m);
        }
    }
    best
}

/// Squared error of a symmetric group coded with scale `d` (`ŵ = d · (q − 8)`), weighted
/// by `w` where given.
fn int4_symmetric_error(values: &[f32], w: Option<&[f32]>, d: f32) -> f32 {
    int4_error(values, w, d, -8.0 * d)
}

/// Scale of a symmetric int4 group, chosen to minimise the squared error (weighted by `w`
/// where given): ggml's `quantize_row_q4_0` fit `w* / −8` (`w*` the value of largest
/// magnitude), then for each of a few candidate scales around it the codes are fixed and
/// `d` refitted by (weighted) least squares, `d = Σ w (q − 8) x / Σ w (q − 8)²`, keeping
/// the best (the search of llama.cpp's `make_qx_quants`: ±4 steps of 0.1 without weights,
/// its ±9 with). Scales are rounded to f16 before they are scored, since that is what is
/// stored.
fn fit_int4_symmetric(values: &[f32], w: Option<&[f32]>) -> f16 {
    const SEARCH_DELTA: f32 = 0.1;
    let search_steps = if w.is_some() { 9 } else { 4 };
    let extreme = blocks::signed_extreme(values);
    if extreme == 0.0 {
        return f16::ZERO;
    }
    let mut best = f16::from_f32(extreme / -8.0);
    let mut best_err = int4_symmetric_error(values, w, best.to_f32());
    for step in -search_steps..=search_steps {
        let d0 = extreme / (-8.0 + step as f32 * SEARCH_DELTA);
        let inv = inverse(d0);
        let (mut sqq, mut sqx) = (0.0f32, 0.0f32);
        for (i, &x) in values.iter().enumerate() {
            let (q, wt) = (code(x, inv, -8.0 * d0) as f32 - 8.0, weight(w, i));
            sqq += wt * q * q;
            sqx += wt * q * x;
        }
        if sqq > 0.0 {
            let candidate = f16::from_f32(sqx / sqq);
            let err = int4_symmetric_error(values, w, candidate.to_f32());
            if err < best_err {
                best = candidate;
                best_err = err;
            }
        }
    }
    best
}

/// `m = −d · z`, exact in f32 (an 11-bit significand times an integer below 2¹¹).
fn zero_point_min(d: f16, z: f16) -> f32 {
    -(z.to_f32() * d.to_f32())
}

/// The zero point `round(−min / d)` in `[0, 15]` of a group with minimum `min` (`≤ 0`)
/// and scale `d` (0 for a zero scale).
fn zero_point(min: f32, d: f32) -> u8 {
    (-min * inverse(d)).round().clamp(0.0, 15.0) as u8
}

/// Scale and zero point of a zero-point int4 group, chosen to minimise the squared error
/// (weighted by `w` where given): GPTQ's fit (`Quantizer.find_params`: the range widened
/// to hold 0, `d = (max − min) / 15`, `z = round(−min / d)`), then for each of a few
/// candidate scales around it ([`asymmetric_grid`]) the zero point and codes are fixed and
/// `d` refitted by (weighted) least squares, `d = Σ w (q − z) x / Σ w (q − z)²`, keeping
/// the best. Scales are rounded to f16 before they are scored. A constant group `c` also
/// tries `d = |c| / 8` and `q − z = ±8`, exact whenever `c` is an f16 (as int4 and
/// int4-sym reproduce constants).
fn fit_int4_zero_point(values: &[f32], w: Option<&[f32]>) -> (f16, u8) {
    let (search_steps, search_delta) = asymmetric_grid(w);
    let min = values.iter().copied().fold(0.0f32, f32::min);
    let max = values.iter().copied().fold(0.0f32, f32::max);
    if max <= min {
        return (f16::ZERO, 0);
    }
    let error = |d: f16, z: u8| {
        let d = d.to_f32();
        int4_error(values, w, d, -(d * f32::from(z)))
    };
    let d = f16::from_f32((max - min) / 15.0);
    let mut best = (d, zero_point(min, d.to_f32()));
    let mut best_err = error(best.0, best.1);
    if values.iter().all(|&w| w == values[0]) {
        let c = values[0];
        let constant = (f16::from_f32(c.abs() / 8.0), if c < 0.0 { 8 } else { 0 });
        let err = error(constant.0, constant.1);
        if err < best_err {
            (best, best_err) = (constant, err);
        }
    }
    for step in -search_steps..=search_steps {
        let d0 = (max - min) / (15.0 + step as f32 * search_delta);
        let z = zero_point(min, d0);
        let (inv, m0) = (inverse(d0), -(d0 * f32::from(z)));
        let (mut sqq, mut sqx) = (0.0f32, 0.0f32);
        for (i, &x) in values.iter().enumerate() {
            let (q, wt) = (code(x, inv, m0) as f32 - f32::from(z), weight(w, i));
            sqq += wt * q * q;
            sqx += wt * q * x;
        }
        if sqq > 0.0 && sqx > 0.0 {
            let candidate = f16::from_f32(sqx / sqq);
            let err = error(candidate, z);
            if err < best_err {
                best = (candidate, z);
                best_err = err;
            }
        }
    }
    best
}

/// Splits `src` into chunks of `g` (the last may be shorter); one chunk for an empty row.
fn chunks_padded(src: &[f32], g: usize) -> impl Iterator<Item = &[f32]> {
    let n = src.len().div_ceil(g).max(1);
    (0..n).map(move |i| &src[(i * g).min(src.len())..((i + 1) * g).min(src.len())])
}

/// Byte and bit shift of value `i` in the codes of an int4 row.
#[inline]
pub fn nibble(i: usize) -> (usize, u32) {
    let (run, j) = (i / BLOCK, i % BLOCK);
    (run * BLOCK / 2 + j % 16, if j < 16 { 0 } else { 4 })
}

/// Dequantises one row (`row_bytes(dtype, dst.len())` bytes of `src`) into `dst`.
pub fn dequantize_row(dtype: DataType, src: &[u8], dst: &mut [f32]) {
    if let Some(ty) = dtype.ggml_type() {
        return blocks::dequantize(ty, src, dst);
    }
    match dtype.group_size() {
        None => {
            let scale = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
            for (d, &q) in dst.iter_mut().zip(&src[4..]) {
                *d = scale * q as i8 as f32;
            }
        }
        Some(g) => {
            let row = Int4Row::split(dtype, src);
            for (gi, out) in dst.chunks_mut(g).enumerate() {
                let (d, m) = (row.scale(gi), row.min(gi));
                for (i, o) in out.iter_mut().enumerate() {
                    let (byte, shift) = nibble(gi * g + i);
                    *o = d * ((row.codes[byte] >> shift) & 0x0f) as f32 + m;
                }
            }
        }
    }
}

/// The parts of an int4 row (see the module docs): codes, f16 scales `d_g` and f16
/// minimums, as little-endian bytes. The minimum of group `g` is
/// `m_g = min_factor · f16(mins[2g..2g + 2])`, times `d_g` where `times_scale`: the stored
/// minimum (factor 1) in an int4 row, `−8 d_g` (the scales, factor −8) in a symmetric one,
/// `−1 · z_g · d_g` (the zero points, factor −1, times the scales) in a zero-point one.
/// These products are exact in f32, so kernels that read minimums this way compute the
/// same bits as if `m_g` were stored.
#[derive(Clone, Copy)]
pub struct Int4Row<'a> {
    /// `P / 2` bytes of codes.
    pub codes: &'a [u8],
    /// `P / G` f16 scales.
    pub scales: &'a [u8],
    /// `P / G` f16 values that, times `min_factor`, are the minimums.
    pub mins: &'a [u8],
    /// 1 (int4), −8 (symmetric) or −1 (zero point).
    pub min_factor: f32,
    /// Whether `m_g` is also multiplied by `d_g` (zero point).
    pub times_scale: bool,
}

impl<'a> Int4Row<'a> {
    /// Splits the row `row` of the int4 `dtype`.
    ///
    /// # Panics
    /// If `dtype` is not an int4 type.
    pub fn split(dtype: DataType, row: &'a [u8]) -> Int4Row<'a> {
        let (g, groups) = int4_groups(dtype, row.len());
        let (codes, rest) = row.split_at(groups * g / 2);
        let mins = int4_mins(dtype, groups * g);
        Int4Row {
            codes,
            scales: &rest[..2 * groups],
            mins: &row[mins.offset..mins.offset + 2 * groups],
            min_factor: mins.factor,
            times_scale: mins.times_scale,
        }
    }

    /// `d_g` of group `g`.
    pub fn scale(&self, g: usize) -> f32 {
        f16::from_le_bytes([self.scales[2 * g], self.scales[2 * g + 1]]).to_f32()
    }

    /// `m_g` of group `g`.
    pub fn min(&self, g: usize) -> f32 {
        let m =
            self.min_factor * f16::from_le_bytes([self.mins[2 * g], self.mins[2 * g + 1]]).to_f32();
        if self.times_scale {
            m * self.scale(g)
        } else {
            m
        }
    }
}

/// Where and how a row of an int4 dtype holds its minimums (see [`Int4Row`]):
/// `m_g = factor · f16 value g at offset`, times `d_g` where `times_scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int4Mins {
    /// Byte offset in the row of the `P / G` f16 values.
    pub offset: usize,
    /// 1 (int4), −8 (symmetric) or −1 (zero point).
    pub factor: f32,
    /// Whether each value is also multiplied by its group's scale (zero point).
    pub times_scale: bool,
}

/// The minimums of a row of the int4 `dtype` with `kp` padded columns (its scales start
/// at byte `kp / 2`).
pub fn int4_mins(dtype: DataType, kp: usize) -> Int4Mins {
    let g = dtype.group_size().unwrap_or(BLOCK);
    let after_scales = kp / 2 + 2 * (kp / g);
    let (offset, factor, times_scale) = match dtype.int4_form() {
        Some(Int4Form::Symmetric) => (kp / 2, -8.0, false),
        Some(Int4Form::ZeroPoint) => (after_scales, -1.0, true),
        _ => (after_scales, 1.0, false),
    };
    Int4Mins {
        offset,
        factor,
        times_scale,
    }
}

/// Repacks one row of Q4_0 or Q4_1 blocks (`src`, [`GgmlType::byte_len`] of the row's
/// values) into a row of its [`GgmlType::lossless_dtype`] (`dst`,
/// [`row_bytes`] bytes): codes unchanged, the scales (and Q4_1's minimums)
/// gathered after them. Every value dequantises to the same number: `d · q + m` for Q4_1
/// (the same bits), and for Q4_0 `d · q + (−8 d)` equals `d · (q − 8)` exactly (both
/// products and the sum fit f32's mantissa: an f16 `d` times a 4-bit code); the one
/// difference is the sign of a zero, +0 where gguf-py's `d · (q − 8)` gives −0 (`q = 8`,
/// `d < 0`), which no sum or product can tell apart.
///
/// # Panics
/// If `ty` has no lossless dtype or the slices are not of the lengths above.
pub fn repack_ggml_row(ty: GgmlType, src: &[u8], dst: &mut [u8]) {
    let dtype = ty.lossless_dtype().expect("Q4_0 or Q4_1");
    let (bb, head) = (ty.block_bytes(), ty.block_bytes() - 16);
    let n = src.len() / bb;
    assert_eq!(src.len(), n * bb, "whole {} blocks", ty.name());
    let mins = int4_mins(dtype, n * 32).offset;
    for (g, b) in src.chunks_exact(bb).enumerate() {
        let (byte, _) = nibble(g * 32);
        dst[byte..byte + 16].copy_from_slice(&b[head..]);
        dst[n * 16 + 2 * g..n * 16 + 2 * g + 2].copy_from_slice(&b[..2]);
        if !dtype.is_int4_symmetric() {
            dst[mins + 2 * g..mins + 2 * g + 2].copy_from_slice(&b[2..4]);
        }
    }
}

/// Group size and groups of an int4 row of `len` bytes.
fn int4_groups(dtype: DataType, len: usize) -> (usize, usize) {
    match (dtype.group_size(), group_bytes(dtype)) {
        (Some(g), Some(bytes)) => (g, len / bytes),
        _ => panic!("{dtype} is not an int4 type"),
    }
}

/// An int4 row being written: codes, scales and (asymmetric only, else empty) minimums.
struct Int4RowMut<'a> {
    codes: &'a mut [u8],
    scales: &'a mut [u8],
    mins: &'a mut [u8],
}

impl<'a> Int4RowMut<'a> {
    fn split(dtype: DataType, row: &'a mut [u8]) -> Int4RowMut<'a> {
        let (g, groups) = int4_groups(dtype, row.len());
        let (codes, scales) = row.split_at_mut(groups * g / 2);
        let (scales, mins) = scales.split_at_mut(2 * groups);
        Int4RowMut {
            codes,
            scales,
            mins,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `n` values in `[-1, 1]`, a fixed pseudo-random function of `seed`.
    pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    fn round_trip(dtype: DataType, w: &[f32]) -> Vec<f32> {
        let mut bytes = vec![0u8; row_bytes(dtype, w.len()).unwrap()];
        quantize_row(dtype, w, &mut bytes);
        let mut back = vec![0.0; w.len()];
        dequantize_row(dtype, &bytes, &mut back);
        back
    }

    #[test]
    fn int8_stays_within_half_a_step() {
        for cols in [1, 31, 32, 33, 100, 172, 256] {
            let w = values(cols, 7);
            let amax = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            // s/2 = max|w|/254, plus one rounding of the f32 product.
            let bound = amax / 254.0 * 1.0001;
            for (a, b) in w.iter().zip(round_trip(DataType::I8, &w)) {
                assert!((a - b).abs() <= bound, "cols {cols}: {a} vs {b}");
            }
        }
    }

    /// Asserts that every group of `dtypes`' round trip has a squared error no larger than
    /// `reference_err` gives for it, over the test sizes and `seeds`.
    fn assert_fit_beats(
        dtypes: [DataType; 3],
        seeds: &[u32],
        reference_err: impl Fn(&[f32]) -> f32,
    ) {
        for cols in [1, 31, 32, 33, 100, 172, 256] {
            for &seed in seeds {
                let w = values(cols, seed);
                for dtype in dtypes {
                    let g = dtype.group_size().unwrap();
                    let back = round_trip(dtype, &w);
                    for (group, got) in w.chunks(g).zip(back.chunks(g)) {
                        let want = reference_err(group);
                        let err: f32 = group.iter().zip(got).map(|(a, b)| (a - b).powi(2)).sum();
                        assert!(err <= want * 1.0001 + 1e-12, "{dtype}: {err} > {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn int4_fit_beats_the_min_max_fit() {
        let dtypes = [DataType::I4G32, DataType::I4G64, DataType::I4G128];
        assert_fit_beats(dtypes, &[11], |group| {
            // The min/max fit, computed here from its definition.
            let lo = group.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = group.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = f16::from_f32((hi - lo) / 15.0).to_f32();
            let m = f16::from_f32(lo).to_f32();
            group
                .iter()
                .map(|&x| {
                    let q = if d > 0.0 {
                        ((x - m) / d).round().clamp(0.0, 15.0)
                    } else {
                        0.0
                    };
                    (d * q + m - x).powi(2)
                })
                .sum()
        });
    }

    #[test]
    fn int4_symmetric_fit_beats_the_q4_0_fit() {
        let dtypes = [DataType::I4SymG32, DataType::I4SymG64, DataType::I4SymG128];
        assert_fit_beats(dtypes, &[3, 11], |group| {
            // ggml's quantize_row_q4_0_ref, from its definition: d = max / -8 for the value
            // of largest magnitude, q = min(15, (i8)(x / d + 8.5)).
            let max = group
                .iter()
                .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
            let d = f16::from_f32(max / -8.0).to_f32();
            let id = if max != 0.0 { -8.0 / max } else { 0.0 };
            group
                .iter()
                .map(|&x| {
                    let q = ((x * id + 8.5) as i8).min(15);
                    (d * (q - 8) as f32 - x).powi(2)
                })
                .sum()
        });
    }

    #[test]
    fn int4_symmetric_rows_are_q4_0_sized_and_reproduce_f16_grids() {
        assert_eq!(row_bytes(DataType::I4SymG32, 2048), Some(2048 / 32 * 18));
        assert_eq!(row_bytes(DataType::I4SymG128, 100), Some(66));
        // Values d·(q − 8) on an f16 grid whose extreme has code 0 come back exactly.
        let d = -0.0625f32;
        let w: Vec<f32> = (0..64).map(|i| d * ((i * 7 % 16) as f32 - 8.0)).collect();
        assert_eq!(round_trip(DataType::I4SymG32, &w), w);
        let row = {
            let mut bytes = vec![0u8; row_bytes(DataType::I4SymG32, 64).unwrap()];
            quantize_row(DataType::I4SymG32, &w, &mut bytes);
            bytes
        };
        let parts = Int4Row::split(DataType::I4SymG32, &row);
        assert_eq!((parts.scale(0), parts.min(1)), (d, -8.0 * d));
    }

    #[test]
    fn int4_zero_point_fit_beats_gptqs_fit() {
        let dtypes = [DataType::I4ZpG32, DataType::I4ZpG64, DataType::I4ZpG128];
        assert_fit_beats(dtypes, &[3, 11], |group| {
            // GPTQ's Quantizer.find_params and quantize, from their definitions: the range
            // widened to 0, scale = (max - min) / 15, zero = round(-min / scale),
            // q = clamp(round(x / scale) + zero, 0, 15).
            let lo = group.iter().copied().fold(0.0f32, f32::min);
            let hi = group.iter().copied().fold(0.0f32, f32::max);
            if hi <= lo {
                return group.iter().map(|x| x * x).sum();
            }
            let d = f16::from_f32((hi - lo) / 15.0).to_f32();
            let z = (-lo / d).round();
            group
                .iter()
                .map(|&x| {
                    let q = ((x / d).round() + z).clamp(0.0, 15.0);
                    (d * (q - z) - x).powi(2)
                })
                .sum()
        });
    }

    #[test]
    fn int4_zero_point_rows_reproduce_integer_zero_grids_exactly() {
        assert_eq!(
            row_bytes(DataType::I4ZpG32, 2048),
            row_bytes(DataType::I4G32, 2048)
        );
        // d · (q − z) on a grid whose minimum −d · z is no f16 number (d has 11 significant
        // bits, z = 11 adds 3 more) comes back exactly.
        let d = f16::from_f32(0.0123).to_f32();
        let w: Vec<f32> = (0..64).map(|i| d * ((i * 7 % 16) as f32 - 11.0)).collect();
        assert_ne!(f16::from_f32(-11.0 * d).to_f32(), -11.0 * d);
        assert_eq!(round_trip(DataType::I4ZpG32, &w), w);
        let mut row = vec![0u8; row_bytes(DataType::I4ZpG32, 64).unwrap()];
        quantize_row(DataType::I4ZpG32, &w, &mut row);
        let parts = Int4Row::split(DataType::I4ZpG32, &row);
        assert_eq!((parts.scale(0), parts.min(1)), (d, -11.0 * d));
    }

    #[test]
    fn nibble_order_is_ggml_like() {
        assert_eq!(nibble(0), (0, 0));
        assert_eq!(nibble(15), (15, 0));
        assert_eq!(nibble(16), (0, 4));
        assert_eq!(nibble(33), (17, 0));
        assert_eq!(nibble(63), (31, 4));
    }
}
