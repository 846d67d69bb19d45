//! The acceptance step on synthetic distributions: the tokens it returns follow the
//! target's distribution exactly (chi-square goodness of fit over many draws from a fixed
//! seed, so the test is deterministic), it accepts with probability `Σ min(p, q)`
//! (Leviathan et al. 2023, section 3.1, `β = 1 − D_LK(p, q)`), and for one-hot
//! distributions it is greedy decoding's rule.

use flm_core::{Sampler, SamplerConfig};

use super::{accept_or_resample, DraftStats};

fn sampler(seed: u64) -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: 1.0,
        seed,
        ..SamplerConfig::default()
    })
    .unwrap()
}

/// Drafts `x ~ q` and verifies it against `p`, `n` times; returns the counts of the tokens
/// that come out and the number of drafts accepted.
fn simulate(p: &[f32], q: &[f32], n: usize, seed: u64) -> (Vec<usize>, usize) {
    let mut draft = sampler(seed);
    let mut target = sampler(seed + 1);
    let mut residual = Vec::new();
    let mut counts = vec![0; p.len()];
    let mut accepted = 0;
    for _ in 0..n {
        let x = draft.draw(q).unwrap();
        let token = match accept_or_resample(&mut target, p, q, x, &mut residual).unwrap() {
            None => {
                accepted += 1;
                x
            }
            Some(t) => t,
        };
        counts[token as usize] += 1;
    }
    (counts, accepted)
}

/// Pearson's chi-square statistic of `counts` against `n · p` over the tokens with
/// `p > 0`, and its degrees of freedom; tokens with `p = 0` must never come out.
fn chi_square(counts: &[usize], p: &[f32], n: usize) -> (f64, usize) {
    let mut stat = 0.0;
    let mut bins = 0;
    for (&c, &p) in counts.iter().zip(p) {
        if p == 0.0 {
            assert_eq!(c, 0, "a token of probability 0 came out: {counts:?}");
            continue;
        }
        let expected = n as f64 * p as f64;
        stat += (c as f64 - expected).powi(2) / expected;
        bins += 1;
    }
    (stat, bins - 1)
}

/// Upper 0.1% points of the chi-square distribution (NIST/SEMATECH e-Handbook, table
/// 1.3.6.7.4), by degrees of freedom.
fn critical_value(df: usize) -> f64 {
    [10.828, 13.816, 16.266, 18.467, 20.515, 22.458][df - 1]
}

#[test]
fn output_follows_the_target_distribution() {
    let n = 40_000;
    // Draft and target disagree in every way: mass where the other has none (ids 0 and 5),
    // a draft that over- and under-estimates, and a draft close to the target.
    let cases: [([f32; 6], [f32; 6]); 3] = [
        (
            [0.0, 0.1, 0.2, 0.3, 0.25, 0.15],
            [0.3, 0.3, 0.1, 0.1, 0.2, 0.0],
        ),
        ([0.5, 0.05, 0.05, 0.1, 0.1, 0.2], [1.0 / 6.0; 6]),
        (
            [0.2, 0.2, 0.1, 0.1, 0.3, 0.1],
            [0.22, 0.18, 0.1, 0.12, 0.28, 0.1],
        ),
    ];
    for (case, (p, q)) in cases.iter().enumerate() {
        let (counts, accepted) = simulate(p, q, n, 17 + case as u64);
        let (stat, df) = chi_square(&counts, p, n);
        assert!(
            stat < critical_value(df),
            "case {case}: chi-square {stat:.2} with {df} degrees of freedom; {counts:?}"
        );
        let beta: f32 = p.iter().zip(q).map(|(p, q)| p.min(*q)).sum();
        let rate = accepted as f64 / n as f64;
        // Binomial standard deviation at n = 40000 is at most 0.0025: 4 of them.
        assert!(
            (rate - beta as f64).abs() < 0.01,
            "case {case}: acceptance {rate:.4}, expected {beta:.4}"
        );
    }
}

#[test]
fn the_draft_equal_to_the_target_is_always_accepted() {
    let p = [0.1f32, 0.4, 0.0, 0.5];
    let (counts, accepted) = simulate(&p, &p, 5000, 3);
    assert_eq!(accepted, 5000);
    assert_eq!(counts[2], 0);
}

#[test]
fn one_hot_distributions_give_the_greedy_rule() {
    let mut target = sampler(5);
    let mut residual = Vec::new();
    let one_hot = |i: usize| {
        let mut v = vec![0.0f32; 5];
        v[i] = 1.0;
        v
    };
    for seed in 0..50 {
        let mut target_seeded = sampler(seed);
        let same = accept_or_resample(
            &mut target_seeded,
            &one_hot(3),
            &one_hot(3),
            3,
            &mut residual,
        );
        assert_eq!(same.unwrap(), None, "the target's argmax is accepted");
    }
    let differ = accept_or_resample(&mut target, &one_hot(1), &one_hot(3), 3, &mut residual);
    assert_eq!(
        differ.unwrap(),
        Some(1),
        "else the target's argmax replaces it"
    );
}

#[test]
fn acceptance_rate_counts_accepted_over_proposed() {
    let stats = DraftStats {
        rounds: 2,
        proposed: 8,
        accepted: 6,
    };
    assert_eq!(stats.acceptance_rate(), Some(0.75));
    assert_eq!(DraftStats::default().acceptance_rate(), None);
}
