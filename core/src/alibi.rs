//! ALiBi head slopes (Press et al. 2022, "Train Short, Test Long").

/// The slope `m_h` of each of `n_heads` heads, as the paper's reference code
/// (`get_slopes` in ofirpress/attention_with_linear_biases) and Baichuan-13B's
/// `_get_interleave` compute them: for a power of two `n`, `m_h = 2^(−8(h+1)/n)`; otherwise
/// the slopes of the largest power of two `c < n`, followed by every other slope of `2c`
/// heads, up to `n` in all. Empty for `n_heads == 0`.
pub fn alibi_slopes(n_heads: usize) -> Vec<f32> {
    fn power_of_two(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-8.0 / n as f64);
        (1..=n).map(|i| start.powi(i as i32)).collect()
    }
    if n_heads == 0 {
        return Vec::new();
    }
    let closest = 1usize << n_heads.ilog2();
    let mut slopes = power_of_two(closest);
    if closest < n_heads {
        let extra = power_of_two(2 * closest);
        slopes.extend(extra.into_iter().step_by(2).take(n_heads - closest));
    }
    slopes.into_iter().map(|m| m as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_follow_the_paper() {
        // 8 heads: 1/2, 1/4, ..., 1/256 (Press et al. 2022, section 3).
        let s = alibi_slopes(8);
        for (h, m) in s.iter().enumerate() {
            assert_eq!(*m, 0.5f32.powi(h as i32 + 1));
        }
        // 12 heads: the 8-head slopes, then the odd-indexed 16-head ones 2^-0.5, 2^-1.5, ...
        let s = alibi_slopes(12);
        assert_eq!(s.len(), 12);
        assert_eq!(s[7], 1.0 / 256.0);
        for (i, m) in s[8..].iter().enumerate() {
            let expected = 2f64.powf(-0.5 - i as f64 * 1.0) as f32;
            assert!((m - expected).abs() < 1e-7, "{m} {expected}");
        }
        assert!(alibi_slopes(0).is_empty());
    }
}
