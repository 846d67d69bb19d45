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
    /// with `e` the long factors when the context exceeds the pre-training one and the short
    /// factors otherwise (chosen once from the context length, as llama.cpp does;
    /// transformers switches on the current sequence length), and cos and sin are
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

impl RopeScaling {
    /// Checks the parameters: positive finite factors, `high_freq_factor > low_freq_factor`
    /// (the smoothing divides by their difference), `L > 0`.
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
        }
    }

    /// The frequency of pair `j` of `half` for `theta`, in a table of `max_pos` positions,
    /// in f32 and in the order of operations of transformers' `_compute_*_parameters`.
    fn frequency(&self, j: usize, half: usize, theta: f32, max_pos: usize) -> f32 {
        let power = theta.powf((2 * j) as f32 / (2 * half) as f32);
        match *self {
            RopeScaling::Linear { factor } => 1.0 / power / factor,
            RopeScaling::Llama3(llama3) => llama3.frequency(1.0 / power),
            RopeScaling::LongRope {
                ref short_factor,
                ref long_factor,
                original_max_position_embeddings,
                ..
            } => {
                let factors = if max_pos > original_max_position_embeddings {
                    long_factor
                } else {
                    short_factor
                };
                1.0 / (factors[j] * power)
            }
        }
    }

    /// What cos and sin are multiplied by: LongRoPE's attention factor, else 1.
    fn magnitude(&self) -> f32 {
        match self {
            RopeScaling::LongRope {
                attention_factor, ..
            } => *attention_factor,
            RopeScaling::Llama3(_) | RopeScaling::Linear { .. } => 1.0,
        }
    }
}

/// The id of the next [`RopeTable`] built.
static NEXT_TABLE_ID: AtomicU64 = AtomicU64::new(1);

/// Precomputed `cos(p · f_j)` and `sin(p · f_j)` for positions `p < max_pos` and frequencies
/// `f_j = theta^(-2j / rotary_dim)`, `j < rotary_dim / 2`, optionally rescaled by a
/// [`RopeScaling`].
///
/// Computed in f32 as llama2.c `run.c` and Hugging Face `LlamaRotaryEmbedding` do, so the
/// rotated values match those references bit for bit in the angle.
#[derive(Debug, Clone)]
pub struct RopeTable {
    /// Unique per table built, kept by clones (their values are the same): a device keys
    /// its copy of the table by it ([`RopeTable::id`]).
    id: u64,
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
        let inv_freq: Vec<f32> = (0..half)
            .map(|j| match scaling {
                None => 1.0 / theta.powf((2 * j) as f32 / rotary_dim as f32),
                Some(s) => s.frequency(j, half, theta, max_pos),
            })
            .collect();
        let magnitude = scaling.map_or(1.0, RopeScaling::magnitude);
        let too_large =
            || Error::InvalidArgument(format!("a RoPE table of {max_pos} positions is too large"));
        let len = max_pos.checked_mul(half).ok_or_else(too_large)?;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        cos.try_reserve_exact(len).map_err(|_| too_large())?;
        sin.try_reserve_exact(len).map_err(|_| too_large())?;
        for p in 0..max_pos {
            for f in &inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos() * magnitude);
                sin.push(angle.sin() * magnitude);
            }
        }
        Ok(RopeTable {
            id: NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed),
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
}
