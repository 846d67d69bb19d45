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

/// Precomputed `cos(p · f_j)` and `sin(p · f_j)` for positions `p < max_pos` and frequencies
/// `f_j = theta^(-2j / rotary_dim)`, `j < rotary_dim / 2`.
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
        let inv_freq: Vec<f32> = (0..half)
            .map(|j| 1.0 / theta.powf((2 * j) as f32 / rotary_dim as f32))
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
}
