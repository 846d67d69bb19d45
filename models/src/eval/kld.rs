//! KL divergence of a model's next-token distributions from a base model's saved
//! log-probabilities, with the statistics `llama-perplexity --kl-divergence` prints,
//! computed as `tools/perplexity/perplexity.cpp` computes them (the same f32 and f64
//! steps, and base probabilities below e⁻¹⁶ left out of the sum), so that the two tools'
//! figures compare.

use super::logits_file::LogProbRow;

/// Running sums of a KL-divergence evaluation; [`KlDivergence::summary`] gives the figures.
#[derive(Debug, Clone, Default)]
pub struct KlDivergence {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    same_top: usize,
    /// Each position's KL divergence, in nats.
    klds: Vec<f32>,
}

/// A mean and its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The mean.
    pub value: f64,
    /// Its standard error (0 for fewer than 11 values, as llama.cpp).
    pub error: f64,
}

/// The figures of a KL-divergence evaluation (llama-perplexity's "Perplexity statistics"
/// and "KL divergence statistics").
#[derive(Debug, Clone, PartialEq)]
pub struct KlSummary {
    /// Scored positions.
    pub count: usize,
    /// Perplexity of the evaluated model, `exp` of its mean negative log-likelihood.
    pub ppl: Estimate,
    /// Perplexity of the base model, from the saved rows.
    pub ppl_base: Estimate,
    /// `PPL / PPL(base)`.
    pub ppl_ratio: Estimate,
    /// Mean KL divergence `Σᵢ p_base(i) · (ln p_base(i) − ln p(i))`, in nats.
    pub kld: Estimate,
    /// Median KL divergence.
    pub kld_median: f64,
    /// 99th percentile of the KL divergence (linear interpolation, as llama.cpp).
    pub kld_p99: f64,
    /// Largest KL divergence.
    pub kld_max: f64,
    /// Fraction of positions where both models' most likely token is the same.
    pub same_top: Estimate,
    /// Root mean square of `p(target) − p_base(target)`.
    pub rms_p_diff: f64,
}

/// Mean and standard error from a sum and a sum of squares (llama.cpp's
/// `mean_and_uncertainty`).
fn mean_and_error(sum: f64, sum2: f64, count: usize) -> Estimate {
    if count < 1 {
        return Estimate {
            value: 0.0,
            error: 0.0,
        };
    }
    let n = count as f64;
    let value = sum / n;
    let variance = sum2 / n - value * value;
    let error = if variance > 0.0 && count > 10 {
        (variance / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Estimate { value, error }
}

/// Linear interpolation between sorted `values` at `fraction` (llama.cpp's `percentile`).
fn percentile(sorted: &[f32], fraction: f32) -> f64 {
    let p = fraction * (sorted.len() - 1) as f32;
    let i = p as usize;
    let t = p - i as f32;
    f64::from((1.0 - t) * sorted[i] + t * sorted[(i + 1).min(sorted.len() - 1)])
}

impl KlDivergence {
    /// Adds one position: the evaluated model's `logits` (`[vocab]` f32), the base row, and
    /// the token that followed.
    ///
    /// `logits` and `base` must be of one vocabulary, and `target` in it.
    pub fn add(&mut self, logits: &[f32], base: &LogProbRow, target: u32) {
        let target = target as usize;
        let (mut top, mut max) = (0, logits[0]);
        for (i, &v) in logits.iter().enumerate().skip(1) {
            if v > max {
                (top, max) = (i, v);
            }
        }
        let sum_exp: f64 = logits.iter().map(|&v| f64::from((v - max).exp())).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let nll = max + log_sum_exp - logits[target];
        let nll_base = -base.log_prob(target);
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);
        let log_norm = max + log_sum_exp;
        let (mut kld, mut top_base, mut best_base) = (0.0f64, 0, 0.0f32);
        for (i, &v) in logits.iter().enumerate() {
            let log_p_base = base.log_prob(i);
            if i == 0 || log_p_base > best_base {
                (top_base, best_base) = (i, log_p_base);
            }
            if log_p_base > -16.0 {
                kld += f64::from(log_p_base.exp() * (log_p_base - v + log_norm));
            }
        }
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.same_top += usize::from(top == top_base);
        let p_diff = f64::from((-nll).exp() - (-nll_base).exp());
        self.sum_p_diff += p_diff;
        self.sum_p_diff2 += p_diff * p_diff;
        self.sum_p_diff4 += p_diff.powi(4);
        self.klds.push(kld as f32);
    }

    /// Positions added.
    pub fn count(&self) -> usize {
        self.klds.len()
    }

    /// The figures so far; `None` before any position.
    pub fn summary(&self) -> Option<KlSummary> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let log_ppl = mean_and_error(self.sum_nll, self.sum_nll2, count);
        let log_base = mean_and_error(self.sum_nll_base, self.sum_nll_base2, count);
        let n = count as f64;
        // llama.cpp's `covariance`: 0 below 10 values.
        let covariance = if count < 10 {
            0.0
        } else {
            (self.sum_nll_nll_base / n - (self.sum_nll / n) * (self.sum_nll_base / n)) / (n - 1.0)
        };
        let ln_ratio = log_ppl.value - log_base.value;
        let ln_ratio_error = (log_ppl.error.powi(2) + log_base.error.powi(2) - 2.0 * covariance)
            .max(0.0)
            .sqrt();
        let exp_of = |e: Estimate| Estimate {
            value: e.value.exp(),
            error: e.value.exp() * e.error,
        };
        let mut sorted = self.klds.clone();
        sorted.sort_by(f32::total_cmp);
        let median = if count.is_multiple_of(2) {
            0.5 * f64::from(sorted[count / 2] + sorted[count / 2 - 1])
        } else {
            f64::from(sorted[count / 2])
        };
        let same = self.same_top as f64 / n;
        Some(KlSummary {
            count,
            ppl: exp_of(log_ppl),
            ppl_base: exp_of(log_base),
            ppl_ratio: exp_of(Estimate {
                value: ln_ratio,
                error: ln_ratio_error,
            }),
            kld: mean_and_error(self.sum_kld, self.sum_kld2, count),
            kld_median: median,
            kld_p99: percentile(&sorted, 0.99),
            kld_max: f64::from(sorted[count - 1]),
            same_top: Estimate {
                value: same,
                error: if count > 1 {
                    (same * (1.0 - same) / (n - 1.0)).sqrt()
                } else {
                    0.0
                },
            },
            rms_p_diff: mean_and_error(self.sum_p_diff2, self.sum_p_diff4, count)
                .value
                .sqrt(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_against_its_own_rows_diverges_by_the_codes_rounding_only() {
        let logits: Vec<Vec<f32>> = (0..40)
            .map(|r| {
                (0..32)
                    .map(|i| ((i * 13 + r * 7) % 17) as f32 * 0.5)
                    .collect()
            })
            .collect();
        let mut kld = KlDivergence::default();
        for (r, row) in logits.iter().enumerate() {
            kld.add(row, &LogProbRow::encode(row), (r % 32) as u32);
        }
        let s = kld.summary().unwrap();
        assert_eq!(s.count, 40);
        // The 16-bit codes leave the base's probabilities summing to 1 within 1e-5.
        assert!(s.kld.value.abs() < 1e-4 && s.kld_max.abs() < 1e-4, "{s:?}");
        assert_eq!(s.same_top.value, 1.0);
        assert!((s.ppl_ratio.value - 1.0).abs() < 1e-4, "{s:?}");
    }

    #[test]
    fn a_shifted_distribution_gives_its_divergence() {
        // Base: uniform over two tokens; the model: 3/4 and 1/4.
        let base = LogProbRow::encode(&[0.0, 0.0]);
        let mut kld = KlDivergence::default();
        kld.add(&[3f32.ln(), 0.0], &base, 1);
        let want = 0.5 * (0.5f64 / 0.75).ln() + 0.5 * (0.5f64 / 0.25).ln();
        let s = kld.summary().unwrap();
        assert!((s.kld.value - want).abs() < 1e-6, "{} {want}", s.kld.value);
        assert!((s.ppl.value - 4.0).abs() < 1e-5 && (s.ppl_base.value - 2.0).abs() < 1e-5);
    }
}
