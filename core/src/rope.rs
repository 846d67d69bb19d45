//! Rotary position embedding tables (Su et al. 2021, "RoFormer").

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// Which dimensions of a head are rotated together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Pairs `(2j, 2j + 1)`: Meta's original checkpoints, llama2.c `run.c`, GPT-J.
    AdjacentPairs,
    /// Pairs `(j, j + rotary_dim / 2)`: Hugging Face `rotate_half`, GPT-NeoX.
    RotateHalf,
}

/// Llama 3.1's (Meta's `apply_scaling`; transformers `_compute_llama3_parameters`): with
/// the wavelength `λ_j = 2π / f_j` and the pre-training context `L`, frequencies of
/// `λ_j < L / high_freq_factor` stay, those of `λ_j > L / low_freq_factor` are divided by
/// `factor`, and in between `f_j ← (1 − s)·f_j / factor + s·f_j` with
/// `s = (L / λ_j − low_freq_factor) / (high_freq_factor − low_freq_factor)`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Llama3Scaling {
    /// Division of the low frequencies (8 for Llama 3.1).
    pub factor: f32,
    /// Sets the low-frequency wavelength threshold `L / low_freq_factor` (1).
    pub low_freq_factor: f32,
    /// Sets the high-frequency wavelength threshold `L / high_freq_factor` (4).
    pub high_freq_factor: f32,
    /// `L`: the pre-training context length (8192).
    pub original_max_position_embeddings: usize,
}

/// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
/// Models"; transformers `_compute_yarn_parameters`; DeepSeek-V2/V3, Qwen2/Qwen3 long-context
/// configs, gpt-oss). Over `d = rotary_dim` with `θ` and the pre-training context `L`, pair
/// `j`'s frequency `f_j = θ^(-2j / d)` is blended from `f_j` (extrapolation) and
/// `f_j / factor` (interpolation): with the correction dimensions
/// `c(β) = d·ln(L / (2π·β)) / (2·ln θ)`, `low = max(⌊c(beta_fast)⌋, 0)` and
/// `high = min(⌈c(beta_slow)⌉, d − 1)` (not rounded without `truncate`), the ramp
/// `r_j = clamp((j − low) / (high − low), 0, 1)` and `e_j = 1 − r_j`, the frequency is
/// `(f_j / factor)·(1 − e_j) + f_j·e_j`, so that fast-turning pairs (`j ≤ low`) keep their
/// frequency and slow ones (`j ≥ high`) are divided by `factor`; cos and sin are multiplied
/// by `attention_factor`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct YarnScaling {
    /// The context extension: interpolated frequencies are divided by it (40 for
    /// DeepSeek-V2; at least 1).
    pub factor: f32,
    /// `L`: the pre-training context length (4096 for DeepSeek-V2).
    pub original_max_position_embeddings: usize,
    /// Pairs that turn more than `beta_fast` times over `L` keep their frequency (32).
    pub beta_fast: f32,
    /// Pairs that turn fewer than `beta_slow` times over `L` are fully interpolated (1).
    pub beta_slow: f32,
    /// Multiplies cos and sin (transformers' `attention_scaling`): the config's
    /// `attention_factor`, else [`YarnScaling::default_attention_factor`].
    pub attention_factor: f32,
    /// Rounds the correction range outwards to whole pairs (transformers' default; gpt-oss
    /// turns it off).
    pub truncate: bool,
    /// DeepSeek's `mscale_all_dim`: MLA models also multiply their softmax scale by
    /// [`YarnScaling::softmax_scale_factor`]; `None` where the config has none (or 0).
    pub mscale_all_dim: Option<f32>,
}

/// YaRN's attention temperature (Peng et al. 2023, eq. 21; transformers' `yarn_get_mscale`):
/// `0.1·mscale·ln(scale) + 1` for `scale > 1`, else 1; computed in f64 as Python does.
pub fn yarn_mscale(scale: f32, mscale: f32) -> f32 {
    mscale_f64(scale.into(), mscale.into()) as f32
}

/// [`yarn_mscale`] in f64.
fn mscale_f64(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// A rescaling of the RoPE frequencies for contexts longer than the pre-training one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Llama 3.1's: see [`Llama3Scaling`].
    Llama3(Llama3Scaling),
    /// Linear position interpolation (Chen et al. 2023; transformers
    /// `_compute_linear_scaling_rope_parameters`; Gemma 3's global layers): every frequency
    /// divided by `factor`.
    Linear {
        /// The divisor (8 for Gemma 3 4B and up).
        factor: f32,
    },
    /// LongRoPE (Ding et al. 2024; Phi-3, Phi-4-mini; transformers
    /// `_compute_longrope_parameters`): frequency `j` is `1 / (e_j · θ^(2j / rotary_dim))`,
    /// with `e` the long factors for a forward pass over a sequence longer than the
    /// pre-training context and the short factors otherwise (transformers'
    /// `longrope_frequency_update`: see [`RopeTable::offset`]), and cos and sin are
    /// multiplied by `attention_factor`.
    LongRope {
        /// Per-frequency divisors for contexts up to the pre-training length.
        short_factor: Vec<f32>,
        /// Per-frequency divisors beyond it.
        long_factor: Vec<f32>,
        /// The pre-training context length.
        original_max_position_embeddings: usize,
        /// Multiplies cos and sin (transformers' `attention_scaling`):
        /// `sqrt(1 + ln(s) / ln(original_max_position_embeddings))` for the context
        /// extension `s > 1` when the checkpoint does not give it.
        attention_factor: f32,
    },
    /// YaRN's: see [`YarnScaling`].
    Yarn(YarnScaling),
}

impl Llama3Scaling {
    /// Checks the parameters: positive finite factors, `high_freq_factor > low_freq_factor`
    /// (the smoothing divides by their difference), `L > 0`.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the parameter.
    fn validate(&self) -> Result<()> {
        let Llama3Scaling {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = *self;
        let positive = [
            ("factor", factor),
            ("low_freq_factor", low_freq_factor),
            ("high_freq_factor", high_freq_factor),
        ];
        if let Some((name, v)) = positive.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            return Err(Error::InvalidArgument(format!(
                "llama3 RoPE scaling: {name} must be positive, got {v}"
            )));
        }
        if high_freq_factor <= low_freq_factor {
            return Err(Error::InvalidArgument(format!(
                "llama3 RoPE scaling: high_freq_factor ({high_freq_factor}) must exceed \
                 low_freq_factor ({low_freq_factor})"
            )));
        }
        if original_max_position_embeddings == 0 {
            return Err(Error::InvalidArgument(
                "llama3 RoPE scaling: original_max_position_embeddings must be positive".into(),
            ));
        }
        Ok(())
    }

    /// The scaled frequency `f`, in the order of operations of transformers'
    /// `_compute_llama3_parameters`.
    fn frequency(&self, f: f32) -> f32 {
        let (factor, low_freq_factor, high_freq_factor) =
            (self.factor, self.low_freq_factor, self.high_freq_factor);
        let old = self.original_max_position_embeddings as f32;
        // torch evaluates `scalar / tensor` as `tensor.reciprocal() * scalar`.
        let wavelen = f.recip() * (2.0 * std::f32::consts::PI);
        if wavelen < old / high_freq_factor {
            f
        } else if wavelen > old / low_freq_factor {
            f / factor
        } else {
            let s =
                (wavelen.recip() * old - low_freq_factor) / (high_freq_factor - low_freq_factor);
            (1.0 - s) * f / factor + s * f
        }
    }
}

impl YarnScaling {
    /// The attention factor transformers' `_compute_yarn_parameters` derives when the config
    /// gives none: `yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)` when
    /// both are given and non-zero (DeepSeek), else `yarn_mscale(factor, 1)`; in f64.
    pub fn default_attention_factor(
        factor: f32,
        mscale: Option<f32>,
        mscale_all_dim: Option<f32>,
    ) -> f32 {
        let factor = f64::from(factor);
        let non_zero = |m: Option<f32>| m.filter(|&m| m != 0.0).map(f64::from);
        match (non_zero(mscale), non_zero(mscale_all_dim)) {
            (Some(m), Some(all)) => (mscale_f64(factor, m) / mscale_f64(factor, all)) as f32,
            _ => mscale_f64(factor, 1.0) as f32,
        }
    }

    /// The factor MLA models (DeepSeek-V2/V3) multiply their softmax scale by:
    /// `yarn_mscale(factor, mscale_all_dim)²`, 1 without `mscale_all_dim` (transformers'
    /// `yarn_apply_mscale`, which folds into the scale the temperature the non-rotated
    /// dimensions do not get from `attention_factor`); in f64.
    pub fn softmax_scale_factor(&self) -> f32 {
        match self.mscale_all_dim.filter(|&m| m != 0.0) {
            Some(m) => {
                let m = mscale_f64(self.factor.into(), m.into());
                (m * m) as f32
            }
            None => 1.0,
        }
    }

    /// Checks the parameters: a finite `factor >= 1`, `L > 0`,
    /// `beta_fast > beta_slow > 0` (the ramp runs from the one to the other), a positive
    /// finite attention factor and a finite `mscale_all_dim`.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the parameter.
    fn validate(&self) -> Result<()> {
        let YarnScaling {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            mscale_all_dim,
            ..
        } = *self;
        let invalid =
            |what: String| Err(Error::InvalidArgument(format!("yarn RoPE scaling: {what}")));
        if !(factor.is_finite() && factor >= 1.0) {
            return invalid(format!("factor must be at least 1, got {factor}"));
        }
        if original_max_position_embeddings == 0 {
            return invalid("original_max_position_embeddings must be positive".into());
        }
        if !(beta_fast.is_finite() && beta_slow > 0.0 && beta_fast > beta_slow) {
            return invalid(format!(
                "beta_fast ({beta_fast}) must exceed beta_slow ({beta_slow}), which must be \
                 positive"
            ));
        }
        if !(attention_factor.is_finite() && attention_factor > 0.0) {
            return invalid(format!(
                "attention_factor must be positive, got {attention_factor}"
            ));
        }
        if let Some(m) = mscale_all_dim.filter(|m| !m.is_finite()) {
            return invalid(format!("mscale_all_dim must be finite, got {m}"));
        }
        Ok(())
    }

    /// The bounds `(low, high)` of the ramp over the `dim / 2` pairs for `theta`, in f64 as
    /// transformers' `find_correction_range` computes them in Python floats.
    fn correction_range(&self, dim: usize, theta: f32) -> (f64, f64) {
        let (dim, base) = (dim as f64, f64::from(theta));
        let original = self.original_max_position_embeddings as f64;
        let correction_dim = |rotations: f32| {
            let turns = f64::from(rotations) * 2.0 * std::f64::consts::PI;
            dim * (original / turns).ln() / (2.0 * base.ln())
        };
        let (low, high) = (
            correction_dim(self.beta_fast),
            correction_dim(self.beta_slow),
        );
        let (low, high) = if self.truncate {
            (low.floor(), high.ceil())
        } else {
            (low, high)
        };
        (low.max(0.0), high.min(dim - 1.0))
    }

    /// The frequency of pair `j` of `half` whose unscaled one is `1 / power`, in f32 and in
    /// the order of operations of transformers' `_compute_yarn_parameters`.
    fn frequency(&self, j: usize, half: usize, theta: f32, power: f32) -> f32 {
        let (low, high) = self.correction_range(2 * half, theta);
        // transformers' `linear_ramp_factor` widens an empty range to avoid dividing by 0.
        let high = if low == high { high + 0.001 } else { high };
        let ramp = ((j as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
        // transformers weighs by `1 − ramp` and then by `1 − (1 − ramp)`, which f32 may round
        // differently from `ramp`.
        let extrapolation_weight = 1.0 - ramp;
        let interpolation = 1.0 / (self.factor * power);
        let extrapolation = 1.0 / power;
        interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight
    }
}

impl RopeScaling {
    /// Checks the parameters of each kind: for llama3, positive finite factors,
    /// `high_freq_factor > low_freq_factor` (the smoothing divides by their difference) and
    /// `L > 0`; for linear, a positive finite factor; for longrope, positive factors, as
    /// many short as long; for yarn, a finite `factor >= 1`, `L > 0`,
    /// `beta_fast > beta_slow > 0` and a positive attention factor.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the parameter.
    pub fn validate(&self) -> Result<()> {
        match *self {
            RopeScaling::Linear { factor } => {
                if factor.is_finite() && factor > 0.0 {
                    Ok(())
                } else {
                    Err(Error::InvalidArgument(format!(
                        "linear RoPE scaling: factor must be positive, got {factor}"
                    )))
                }
            }
            RopeScaling::LongRope {
                ref short_factor,
                ref long_factor,
                original_max_position_embeddings,
                attention_factor,
            } => {
                let positive = |v: f32| v.is_finite() && v > 0.0;
                if !short_factor.iter().chain(long_factor).all(|&v| positive(v))
                    || short_factor.len() != long_factor.len()
                {
                    return Err(Error::InvalidArgument(
                        "longrope RoPE scaling: the short and long factors must be positive \
                         and as many"
                            .into(),
                    ));
                }
                if original_max_position_embeddings == 0 || !positive(attention_factor) {
                    return Err(Error::InvalidArgument(format!(
                        "longrope RoPE scaling: original_max_position_embeddings \
                         ({original_max_position_embeddings}) and attention_factor \
                         ({attention_factor}) must be positive"
                    )));
                }
                Ok(())
            }
            RopeScaling::Llama3(llama3) => llama3.validate(),
            RopeScaling::Yarn(yarn) => yarn.validate(),
        }
    }

    /// The frequency of pair `j` of `half` for `theta` (LongRoPE's long factors if `long`),
    /// in f32 and in the order of operations of transformers' `_compute_*_parameters`.
    fn frequency(&self, j: usize, half: usize, theta: f32, long: bool) -> f32 {
        let power = theta.powf((2 * j) as f32 / (2 * half) as f32);
        match *self {
            RopeScaling::Linear { factor } => 1.0 / power / factor,
            RopeScaling::Llama3(llama3) => llama3.frequency(1.0 / power),
            RopeScaling::LongRope {
                ref short_factor,
                ref long_factor,
                ..
            } => {
                let factors = if long { long_factor } else { short_factor };
                1.0 / (factors[j] * power)
            }
            RopeScaling::Yarn(yarn) => yarn.frequency(j, half, theta, power),
        }
    }

    /// What cos and sin are multiplied by: LongRoPE's and YaRN's attention factor, else 1.
    fn magnitude(&self) -> f32 {
        match self {
            RopeScaling::LongRope {
                attention_factor, ..
            }
            | RopeScaling::Yarn(YarnScaling {
                attention_factor, ..
            }) => *attention_factor,
            RopeScaling::Llama3(_) | RopeScaling::Linear { .. } => 1.0,
        }
    }
}

/// The `rotary_dim / 2` frequencies `f_j` (radians per position) for `theta`, rescaled by
/// `scaling` (with LongRoPE's long factors if `long`).
fn frequencies(
    scaling: Option<&RopeScaling>,
    rotary_dim: usize,
    theta: f32,
    long: bool,
) -> Vec<f32> {
    let half = rotary_dim / 2;
    (0..half)
        .map(|j| match scaling {
            None => 1.0 / theta.powf((2 * j) as f32 / rotary_dim as f32),
            Some(s) => s.frequency(j, half, theta, long),
        })
        .collect()
}

/// The id of the next [`RopeTable`] built.
static NEXT_TABLE_ID: AtomicU64 = AtomicU64::new(1);

/// Precomputed `cos(p · f_j)` and `sin(p · f_j)` for positions `p < max_pos` and frequencies
/// `f_j = theta^(-2j / rotary_dim)`, `j < rotary_dim / 2`, optionally rescaled by a
/// [`RopeScaling`].
///
/// Computed in f32 as llama2.c `run.c` and Hugging Face `LlamaRotaryEmbedding` do, so the
/// rotated values match those references bit for bit in the angle.
///
/// With LongRoPE over a context longer than the pre-training one, the table holds both
/// sets of frequencies: the short factors' rows for positions `0..positions`, then the long
/// factors' for the same positions; a forward pass rotates at `position +`
/// [`RopeTable::offset`] of its sequence length.
#[derive(Debug, Clone)]
pub struct RopeTable {
    /// Unique per table built, kept by clones (their values are the same): a device keys
    /// its copy of the table by it ([`RopeTable::id`]).
    id: u64,
    style: RopeStyle,
    head_dim: usize,
    rotary_dim: usize,
    max_pos: usize,
    /// LongRoPE's switch: sequences longer than `switch_after` positions read the rows
    /// `long_offset` after their positions (the long factors'); `usize::MAX` and 0 without
    /// one (plain integers, so that no comparison reads an absent variant's bytes).
    switch_after: usize,
    long_offset: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// A table for heads of `head_dim` whose first `rotary_dim` dimensions are rotated
    /// (`rotary_dim == head_dim` for Llama; half of it for ChatGLM2).
    ///
    /// Errors: [`Error::InvalidArgument`] if `rotary_dim` is odd, zero or exceeds `head_dim`,
    /// or `theta <= 0`.
    pub fn new(
        style: RopeStyle,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
        max_pos: usize,
    ) -> Result<RopeTable> {
        RopeTable::scaled(style, head_dim, rotary_dim, theta, None, max_pos)
    }

    /// As [`RopeTable::new`], with the frequencies rescaled by `scaling`.
    ///
    /// Errors: as [`RopeTable::new`], and invalid scaling parameters
    /// ([`RopeScaling::validate`]).
    pub fn scaled(
        style: RopeStyle,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
        scaling: Option<&RopeScaling>,
        max_pos: usize,
    ) -> Result<RopeTable> {
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(Error::InvalidArgument(format!(
                "rotary dimension {rotary_dim} must be even, non-zero and at most the head \
                 dimension {head_dim}"
            )));
        }
        if theta.is_nan() || theta <= 0.0 {
            return Err(Error::InvalidArgument(format!(
                "RoPE theta must be positive, got {theta}"
            )));
        }
        let half = rotary_dim / 2;
        if let Some(scaling) = scaling {
            scaling.validate()?;
            if let RopeScaling::LongRope { short_factor, .. } = scaling {
                if short_factor.len() != half {
                    return Err(Error::InvalidArgument(format!(
                        "longrope RoPE scaling: {} factors for {half} frequencies",
                        short_factor.len()
                    )));
                }
            }
        }
        let switch_after = match scaling {
            Some(RopeScaling::LongRope {
                original_max_position_embeddings: original,
                ..
            }) if max_pos > *original => *original,
            _ => usize::MAX,
        };
        let long = switch_after != usize::MAX;
        let sets: &[bool] = if long { &[false, true] } else { &[false] };
        let magnitude = scaling.map_or(1.0, RopeScaling::magnitude);
        let rows = max_pos * sets.len();
        let too_large =
            || Error::InvalidArgument(format!("a RoPE table of {max_pos} positions is too large"));
        let len = rows.checked_mul(half).ok_or_else(too_large)?;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        cos.try_reserve_exact(len).map_err(|_| too_large())?;
        sin.try_reserve_exact(len).map_err(|_| too_large())?;
        for &set in sets {
            let inv_freq = frequencies(scaling, rotary_dim, theta, set);
            for p in 0..max_pos {
                for f in &inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos() * magnitude);
                    sin.push(angle.sin() * magnitude);
                }
            }
        }
        Ok(RopeTable {
            id: NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed),
            style,
            head_dim,
            rotary_dim,
            max_pos: rows,
            switch_after,
            long_offset: if long { max_pos } else { 0 },
            cos,
            sin,
        })
    }

    /// The pairing convention.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// Dimensions per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rotated dimensions per head (the rest pass through).
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// An id unique to this table and its clones, which hold the same values: a device
    /// that keeps a copy of the table in its memory looks it up by this id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The cos values `[max_pos, rotary_dim / 2]`, row `p` for position `p`.
    pub fn cos_rows(&self) -> &[f32] {
        &self.cos
    }

    /// The sin values `[max_pos, rotary_dim / 2]`, row `p` for position `p`.
    pub fn sin_rows(&self) -> &[f32] {
        &self.sin
    }

    /// Number of rows in the table: the positions, twice over with LongRoPE's two sets.
    pub fn max_pos(&self) -> usize {
        self.max_pos
    }

    /// What a forward pass over a sequence of `seq_len` positions adds to each position to
    /// read its rows: the number of positions when LongRoPE's long factors apply
    /// (`seq_len` beyond the pre-training context; transformers'
    /// `longrope_frequency_update`, which keeps the keys already cached as they were
    /// rotated), else 0.
    pub fn offset(&self, seq_len: usize) -> usize {
        if seq_len > self.switch_after {
            self.long_offset
        } else {
            0
        }
    }

    /// Whether [`RopeTable::offset`] depends on the sequence length.
    pub fn switches(&self) -> bool {
        self.switch_after != usize::MAX
    }

    /// `(cos, sin)` for position `pos`, each `rotary_dim / 2` values; `None` past `max_pos`.
    pub fn at(&self, pos: usize) -> Option<(&[f32], &[f32])> {
        let half = self.rotary_dim / 2;
        let range = pos.checked_mul(half)?..(pos + 1).checked_mul(half)?;
        Some((self.cos.get(range.clone())?, self.sin.get(range)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn angles_follow_the_frequency_formula() {
        let t = RopeTable::new(RopeStyle::RotateHalf, 8, 8, 10000.0, 4).unwrap();
        let (c, s) = t.at(3).unwrap();
        for j in 0..4 {
            let angle = 3.0f64 * 10000f64.powf(-(2.0 * j as f64) / 8.0);
            assert!((c[j] as f64 - angle.cos()).abs() < 1e-6);
            assert!((s[j] as f64 - angle.sin()).abs() < 1e-6);
        }
        assert!(t.at(4).is_none());
        assert!(RopeTable::new(RopeStyle::RotateHalf, 8, 7, 1e4, 4).is_err());
    }

    /// Llama 3.1's scaling (θ = 500000, 128-dim heads, factor 8, thresholds 8192 and 2048
    /// positions): the highest frequency (λ ≈ 6.3) stays, the lowest (λ ≈ 3·10⁶) is divided
    /// by 8, and one in between follows the smoothing formula, evaluated here in f64.
    #[test]
    fn llama3_scaling_keeps_high_divides_low_and_smooths_between() {
        let scaling = RopeScaling::Llama3(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        let t = RopeTable::scaled(RopeStyle::RotateHalf, 128, 128, 5e5, Some(&scaling), 2);
        let table = t.unwrap();
        // At position 1 the angle is the frequency itself; sin keeps it to f32 precision.
        let (_, sin) = table.at(1).unwrap();
        let f = |j: usize| 5e5f64.powf(-(2.0 * j as f64) / 128.0);
        let close = |j: usize, want: f64| {
            let got = sin[j] as f64;
            assert!(
                (got - want.sin()).abs() <= 1e-5 * want.sin(),
                "{j}: {got} vs {want}"
            );
        };
        close(0, f(0));
        close(63, f(63) / 8.0);
        // j = 32: λ ≈ 4400 lies between 2048 and 8192.
        let wavelen = 2.0 * std::f64::consts::PI / f(32);
        assert!(wavelen > 2048.0 && wavelen < 8192.0);
        let s = (8192.0 / wavelen - 1.0) / 3.0;
        close(32, (1.0 - s) * f(32) / 8.0 + s * f(32));
        let bad = RopeScaling::Llama3(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        let err = RopeTable::scaled(RopeStyle::RotateHalf, 8, 8, 1e4, Some(&bad), 2).unwrap_err();
        assert!(err.to_string().contains("high_freq_factor"), "{err}");
    }

    fn deepseek_v2_lite() -> YarnScaling {
        YarnScaling {
            factor: 40.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.0,
            truncate: true,
            mscale_all_dim: Some(0.707),
        }
    }

    /// .flm files store YaRN as `{"type": "yarn", ..}` beside the other kinds, whose JSON
    /// forms stay as they were, and read every kind back unchanged.
    #[test]
    fn yarn_round_trips_beside_the_other_kinds() {
        let yarn = RopeScaling::Yarn(deepseek_v2_lite());
        let text = serde_json::to_string(&yarn).unwrap();
        assert_eq!(
            text,
            r#"{"type":"yarn","factor":40.0,"original_max_position_embeddings":4096,"beta_fast":32.0,"beta_slow":1.0,"attention_factor":1.0,"truncate":true,"mscale_all_dim":0.707}"#
        );
        let llama3 = RopeScaling::Llama3(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        let llama3_text = r#"{"type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}"#;
        assert_eq!(serde_json::to_string(&llama3).unwrap(), llama3_text);
        let linear = RopeScaling::Linear { factor: 8.0 };
        assert_eq!(
            serde_json::to_string(&linear).unwrap(),
            r#"{"type":"linear","factor":8.0}"#
        );
        for scaling in [yarn, llama3, linear] {
            let text = serde_json::to_string(&scaling).unwrap();
            assert_eq!(serde_json::from_str::<RopeScaling>(&text).unwrap(), scaling);
        }
        let without_mscale = r#"{"type":"yarn","factor":4,"original_max_position_embeddings":32768,"beta_fast":32,"beta_slow":1,"attention_factor":1.1386,"truncate":true}"#;
        let Ok(RopeScaling::Yarn(qwen)) = serde_json::from_str(without_mscale) else {
            panic!("{without_mscale}");
        };
        assert_eq!((qwen.factor, qwen.mscale_all_dim), (4.0, None));
        assert_eq!(qwen.softmax_scale_factor(), 1.0);
    }

    /// Each out-of-range YaRN parameter is refused, named in the error.
    #[test]
    fn yarn_parameters_are_checked() {
        let refused = |edit: fn(&mut YarnScaling), needle: &str| {
            let mut yarn = deepseek_v2_lite();
            edit(&mut yarn);
            let scaling = RopeScaling::Yarn(yarn);
            let err = RopeTable::scaled(RopeStyle::RotateHalf, 8, 8, 1e4, Some(&scaling), 2)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err}");
        };
        refused(|y| y.factor = 0.5, "factor");
        refused(|y| y.factor = f32::INFINITY, "factor");
        refused(|y| y.original_max_position_embeddings = 0, "original");
        refused(|y| y.beta_slow = 32.0, "beta_fast");
        refused(|y| y.beta_slow = 0.0, "beta_slow");
        refused(|y| y.attention_factor = f32::NAN, "attention_factor");
        refused(|y| y.mscale_all_dim = Some(f32::NAN), "mscale_all_dim");
        assert_eq!(yarn_mscale(1.0, 0.707), 1.0);
    }

    /// Within 1e-6 relative and 1e-7 absolute of transformers' value, plus `slack`.
    fn close(got: f32, want: f64, slack: f64) -> bool {
        (f64::from(got) - want).abs() <= 1e-7 + 1e-6 * want.abs() + slack
    }

    /// YaRN against Hugging Face transformers 5.25: `tests/data/yarn/yarn.json` holds, for
    /// six configurations (DeepSeek-V2-Lite's, mscales that differ, Qwen's factor 4, an
    /// untruncated range as gpt-oss, an explicit attention factor, a factor from the
    /// context lengths), the parameters in flm's form and transformers' frequencies,
    /// attention and softmax scale factors, and cos and sin at four positions up to 100000,
    /// written by `tests/data/yarn/make.py`. torch's vectorised `pow` (SLEEF, within 1 ulp)
    /// gave, where the file was written, 3 of the 256 powers `θ^(2j/d)` one ulp from the
    /// correctly rounded value flm's `powf` gives, so a frequency may differ by one ulp, and
    /// its cos and sin by the angle that makes.
    #[test]
    fn yarn_matches_transformers() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/yarn/yarn.json");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let numbers = |v: &serde_json::Value| -> Vec<f64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let mut failures = Vec::new();
        for case in json["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let scaling: RopeScaling = serde_json::from_value(case["flm"].clone()).unwrap();
            let RopeScaling::Yarn(yarn) = scaling else {
                panic!("{name}: {scaling:?}");
            };
            let config = &case["config"];
            let rope = config
                .get("rope_parameters")
                .unwrap_or(&config["rope_scaling"]);
            let attention_factor = case["attention_factor"].as_f64().unwrap();
            let derived = match rope.get("attention_factor") {
                Some(_) => yarn.attention_factor,
                None => {
                    let m = |key: &str| rope.get(key).and_then(|m| m.as_f64()).map(|m| m as f32);
                    YarnScaling::default_attention_factor(
                        yarn.factor,
                        m("mscale"),
                        m("mscale_all_dim"),
                    )
                }
            };
            let softmax = case["softmax_scale_factor"].as_f64().unwrap();
            for (what, got, want) in [
                ("attention factor", derived, attention_factor),
                ("softmax scale factor", yarn.softmax_scale_factor(), softmax),
            ] {
                if !close(got, want, 0.0) {
                    failures.push(format!("{name}: {what} {got}, transformers {want}"));
                }
            }
            let theta = rope.get("rope_theta").unwrap_or(&config["rope_theta"]);
            let theta = theta.as_f64().unwrap() as f32;
            let dim = |key: &str| case[key].as_u64().unwrap() as usize;
            let (head_dim, rotary_dim, half) =
                (dim("head_dim"), dim("rotary_dim"), dim("rotary_dim") / 2);
            let positions: Vec<usize> = numbers(&case["positions"])
                .iter()
                .map(|&p| p as usize)
                .collect();
            let max_pos = positions.iter().max().unwrap() + 1;
            let ours = frequencies(Some(&scaling), rotary_dim, theta, false);
            let theirs: Vec<f32> = numbers(&case["inv_freq"])
                .iter()
                .map(|&f| f as f32)
                .collect();
            for (j, (f, t)) in ours.iter().zip(&theirs).enumerate() {
                if f.to_bits().abs_diff(t.to_bits()) > 1 {
                    failures.push(format!("{name}: frequency {j} {f}, transformers {t}"));
                }
            }
            let style = RopeStyle::RotateHalf;
            let table =
                RopeTable::scaled(style, head_dim, rotary_dim, theta, Some(&scaling), max_pos);
            let table = table.unwrap();
            let (want_cos, want_sin) = (numbers(&case["cos"]), numbers(&case["sin"]));
            for (i, &p) in positions.iter().enumerate() {
                let (cos, sin) = table.at(p).unwrap();
                for j in 0..half {
                    let angle_gap = f64::from((p as f32 * ours[j] - p as f32 * theirs[j]).abs());
                    let slack = angle_gap * attention_factor;
                    let (wc, ws) = (want_cos[i * half + j], want_sin[i * half + j]);
                    if !close(cos[j], wc, slack) || !close(sin[j], ws, slack) {
                        failures.push(format!(
                            "{name}: position {p}, pair {j}: ({}, {}), transformers ({wc}, {ws})",
                            cos[j], sin[j]
                        ));
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
