//! Rotary position embedding tables (Su et al. 2021, "RoFormer").

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

/// A rescaling of the RoPE frequencies for contexts longer than the pre-training one.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Llama 3.1's (Meta's `apply_scaling`; transformers `_compute_llama3_parameters`): with
    /// the wavelength `λ_j = 2π / f_j` and the pre-training context `L`, frequencies of
    /// `λ_j < L / high_freq_factor` stay, those of `λ_j > L / low_freq_factor` are divided by
    /// `factor`, and in between `f_j ← (1 − s)·f_j / factor + s·f_j` with
    /// `s = (L / λ_j − low_freq_factor) / (high_freq_factor − low_freq_factor)`.
    Llama3 {
        /// Division of the low frequencies (8 for Llama 3.1).
        factor: f32,
        /// Sets the low-frequency wavelength threshold `L / low_freq_factor` (1).
        low_freq_factor: f32,
        /// Sets the high-frequency wavelength threshold `L / high_freq_factor` (4).
        high_freq_factor: f32,
        /// `L`: the pre-training context length (8192).
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// Checks the parameters: positive finite factors, `high_freq_factor > low_freq_factor`
    /// (the smoothing divides by their difference), `L > 0`.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the parameter.
    pub fn validate(&self) -> Result<()> {
        match *self {
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let positive = [
                    ("factor", factor),
                    ("low_freq_factor", low_freq_factor),
                    ("high_freq_factor", high_freq_factor),
                ];
                if let Some((name, v)) = positive.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0))
                {
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
                        "llama3 RoPE scaling: original_max_position_embeddings must be positive"
                            .into(),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The scaled frequency of the unscaled `f`, in f32 and in the order of operations of
    /// transformers' `_compute_llama3_parameters`.
    fn apply(&self, f: f32) -> f32 {
        match *self {
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = original_max_position_embeddings as f32;
                // torch evaluates `scalar / tensor` as `tensor.reciprocal() * scalar`.
                let wavelen = f.recip() * (2.0 * std::f32::consts::PI);
                if wavelen < old / high_freq_factor {
                    f
                } else if wavelen > old / low_freq_factor {
                    f / factor
                } else {
                    let s = (wavelen.recip() * old - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - s) * f / factor + s * f
                }
            }
        }
    }
}

/// Precomputed `cos(p · f_j)` and `sin(p · f_j)` for positions `p < max_pos` and frequencies
/// `f_j = theta^(-2j / rotary_dim)`, `j < rotary_dim / 2`, optionally rescaled by a
/// [`RopeScaling`].
///
/// Computed in f32 as llama2.c `run.c` and Hugging Face `LlamaRotaryEmbedding` do, so the
/// rotated values match those references bit for bit in the angle.
#[derive(Debug, Clone)]
pub struct RopeTable {
    style: RopeStyle,
    head_dim: usize,
    rotary_dim: usize,
    max_pos: usize,
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
        if let Some(scaling) = scaling {
            scaling.validate()?;
        }
        let half = rotary_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|j| 1.0 / theta.powf((2 * j) as f32 / rotary_dim as f32))
            .map(|f| scaling.map_or(f, |s| s.apply(f)))
            .collect();
        let too_large =
            || Error::InvalidArgument(format!("a RoPE table of {max_pos} positions is too large"));
        let len = max_pos.checked_mul(half).ok_or_else(too_large)?;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        cos.try_reserve_exact(len).map_err(|_| too_large())?;
        sin.try_reserve_exact(len).map_err(|_| too_large())?;
        for p in 0..max_pos {
            for f in &inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok(RopeTable {
            style,
            head_dim,
            rotary_dim,
            max_pos,
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

    /// Number of positions in the table.
    pub fn max_pos(&self) -> usize {
        self.max_pos
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
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
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
        let bad = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let err = RopeTable::scaled(RopeStyle::RotateHalf, 8, 8, 1e4, Some(&bad), 2).unwrap_err();
        assert!(err.to_string().contains("high_freq_factor"), "{err}");
    }
}
