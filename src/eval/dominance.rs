//! Dominance between models over several environments (`trace-train
//! compare`), by the three rules the Affine network has used, and the
//! Pareto frontier each gives (the models no other dominates). The models
//! are taken in the order given: an earlier one is the incumbent, which
//! the Beta and threshold rules favour (the network's anti-copy rule, by
//! first commit block).
//!
//! - **Pareto** (ε-Pareto, Aug–Oct 2025): per environment, with
//!   `n_eff = min(n, 1000)`, `var = p_a(1-p_a)/n_a + p_b(1-p_b)/n_b`, a
//!   not-worse tolerance `nw = max(0.005, 1.28 sqrt(var))` and a win margin
//!   `bet = min(max(0.015, 0.5 sqrt(var)), nw)`. A dominates B iff A is
//!   not worse anywhere (`a >= b - nw`) and better somewhere
//!   (`a >= b + bet`), or A is earlier and every difference is within
//!   `nw`.
//! - **Beta** (Oct–Nov 2025): per environment the Jeffreys interval of the
//!   score sum, `Beta(0.5 + s, 0.5 + n - s)`, equal-tailed at the level
//!   (0.9 by default); the later model wins an environment only when its
//!   lower end is above the earlier one's upper end, else the earlier one
//!   wins it. The later model dominates iff it wins every environment;
//!   the earlier one iff the later wins none.
//! - **Threshold** (from Dec 2025): `t(p) = min(p + min(max(0.2(1-p), 0.02),
//!   0.1), 1)`; the later model wins an environment iff its score is above
//!   `t(earlier's) + 1e-9`, else the earlier wins it (ties included); the
//!   same "every environment" rule. A later model never beats an earlier
//!   one with p >= 0.98.

use serde::{Deserialize, Serialize};
use statrs::distribution::{Beta, ContinuousCDF};

/// The interval level of the Beta rule when none is given (the network's
/// final `CONFIDENCE_LEVEL`).
pub const BETA_LEVEL: f64 = 0.9;

/// One model's result in one environment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EnvScore {
    /// Scored samples.
    pub n: usize,
    /// Sum of the scores.
    pub sum: f64,
}

impl EnvScore {
    /// The mean score (0 without samples).
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum / self.n as f64
        }
    }
}

/// A dominance rule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    Pareto,
    Beta { level: f64 },
    Threshold,
}

impl Rule {
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Pareto => "pareto",
            Rule::Beta { .. } => "beta",
            Rule::Threshold => "threshold",
        }
    }
}

/// The ε-Pareto tolerances of one environment: (not-worse, better-by).
pub fn pareto_margins(a: EnvScore, b: EnvScore) -> (f64, f64) {
    let term = |s: EnvScore| {
        let p = s.mean();
        p * (1.0 - p) / s.n.clamp(1, 1000) as f64
    };
    let sd = (term(a) + term(b)).sqrt();
    let nw = (1.28 * sd).max(0.005);
    (nw, (0.5 * sd).max(0.015).min(nw))
}

/// The equal-tailed Jeffreys interval of a score sum `s` out of `n` (s
/// clamped to `[0, n]`); `(0, 0)` without samples, as the network has it.
pub fn beta_interval(s: f64, n: usize, level: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let n = n as f64;
    let s = s.clamp(0.0, n);
    let Ok(post) = Beta::new(0.5 + s, 0.5 + n - s) else {
        return (0.0, 1.0);
    };
    let tail = (1.0 - level) / 2.0;
    let (lo, hi) = (post.inverse_cdf(tail), post.inverse_cdf(1.0 - tail));
    (
        if lo.is_nan() { 0.0 } else { lo },
        if hi.is_nan() { 1.0 } else { hi },
    )
}

/// The threshold a later model must beat: `t(p)`.
pub fn threshold(p: f64) -> f64 {
    (p + (0.2 * (1.0 - p)).clamp(0.02, 0.1)).min(1.0)
}

/// Whether the later model wins one environment against the earlier.
fn later_wins(rule: Rule, earlier: EnvScore, later: EnvScore) -> bool {
    match rule {
        Rule::Beta { level } => {
            beta_interval(later.sum, later.n, level).0
                > beta_interval(earlier.sum, earlier.n, level).1
        }
        Rule::Threshold => later.mean() > threshold(earlier.mean()) + 1e-9,
        Rule::Pareto => unreachable!("pareto has no duel"),
    }
}

/// Whether `a` dominates `b` (same environments, in the same order);
/// `a_earlier` says which came first.
pub fn dominates(rule: Rule, a: &[EnvScore], b: &[EnvScore], a_earlier: bool) -> bool {
    assert_eq!(a.len(), b.len(), "the same environments on both sides");
    if a.is_empty() {
        return false;
    }
    match rule {
        Rule::Pareto => {
            let mut not_worse = true;
            let mut better = false;
            let mut within = true;
            for (&x, &y) in a.iter().zip(b) {
                let (nw, bet) = pareto_margins(x, y);
                let (p, q) = (x.mean(), y.mean());
                not_worse &= p >= q - nw;
                better |= p >= q + bet;
                within &= (p - q).abs() <= nw;
            }
            (not_worse && better) || (within && a_earlier)
        }
        _ if a_earlier => a.iter().zip(b).all(|(&x, &y)| !later_wins(rule, x, y)),
        _ => a.iter().zip(b).all(|(&x, &y)| later_wins(rule, y, x)),
    }
}

/// What one rule finds among the models (indices in the given order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub rule: Rule,
    /// `(a, b)`: model a dominates model b.
    pub dominates: Vec<(usize, usize)>,
    /// The models no other dominates (every model, should each be dominated).
    pub frontier: Vec<usize>,
}

/// Applies `rule` to every ordered pair of `models` (each one's scores, in
/// the same environment order; earlier in the slice = earlier model).
pub fn verdict(rule: Rule, models: &[Vec<EnvScore>]) -> Verdict {
    let mut pairs = Vec::new();
    for i in 0..models.len() {
        for j in 0..models.len() {
            if i != j && dominates(rule, &models[i], &models[j], i < j) {
                pairs.push((i, j));
            }
        }
    }
    let mut frontier: Vec<usize> = (0..models.len())
        .filter(|&j| !pairs.iter().any(|&(_, b)| b == j))
        .collect();
    if frontier.is_empty() {
        frontier = (0..models.len()).collect();
    }
    Verdict {
        rule,
        dominates: pairs,
        frontier,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(mean: f64, n: usize) -> EnvScore {
        EnvScore {
            n,
            sum: mean * n as f64,
        }
    }

    #[test]
    fn pareto_margins_match_the_documented_example() {
        // a = 0.80, b = 0.75, n = 500: sqrt(var) = 0.02636, nw = 0.03374, bet = 0.015.
        let (nw, bet) = pareto_margins(s(0.80, 500), s(0.75, 500));
        assert!((nw - 0.03374).abs() < 5e-5, "{nw}");
        assert_eq!(bet, 0.015);
        assert!(dominates(
            Rule::Pareto,
            &[s(0.80, 500)],
            &[s(0.75, 500)],
            false
        ));
        assert!(!dominates(
            Rule::Pareto,
            &[s(0.75, 500)],
            &[s(0.80, 500)],
            true
        ));
        // Within the tolerance everywhere: only the earlier model dominates.
        let (a, b) = ([s(0.70, 500), s(0.5, 500)], [s(0.71, 500), s(0.49, 500)]);
        assert!(dominates(Rule::Pareto, &a, &b, true));
        assert!(!dominates(Rule::Pareto, &a, &b, false));
        // Better on one, much worse on another: neither.
        let (a, b) = ([s(0.9, 500), s(0.2, 500)], [s(0.6, 500), s(0.6, 500)]);
        assert!(!dominates(Rule::Pareto, &a, &b, false) && !dominates(Rule::Pareto, &b, &a, false));
    }

    #[test]
    fn beta_intervals_match_the_documented_vectors() {
        // At c = 0.9 (mpmath).
        for (k, n, lo, hi) in [
            (80.0, 100, 0.728290, 0.859055),
            (0.0, 10, 0.000192, 0.170773),
            (200.0, 400, 0.458974, 0.541026),
            (360.0, 400, 0.873198, 0.922544),
            (400.0, 400, 0.995213, 0.999995),
        ] {
            let (l, h) = beta_interval(k, n, 0.9);
            assert!(
                (l - lo).abs() < 1e-6 && (h - hi).abs() < 1e-6,
                "{k}/{n}: {l} {h}"
            );
        }
        assert_eq!(beta_interval(3.0, 0, 0.9), (0.0, 0.0));
        // The sum is clamped to [0, n].
        assert_eq!(
            beta_interval(120.0, 100, 0.9),
            beta_interval(100.0, 100, 0.9)
        );
    }

    #[test]
    fn the_beta_duel_favours_the_earlier_model() {
        let (a, b) = ([s(0.80, 100)], [s(0.86, 100)]);
        // B's lower end (~0.79) is not above A's upper end (~0.86): A keeps it.
        assert!(dominates(Rule::Beta { level: 0.9 }, &a, &b, true));
        assert!(!dominates(Rule::Beta { level: 0.9 }, &b, &a, false));
        // Far apart: the later model wins.
        let b = [s(0.97, 400)];
        assert!(dominates(
            Rule::Beta { level: 0.9 },
            &b,
            &[s(0.80, 400)],
            false
        ));
        assert!(!dominates(
            Rule::Beta { level: 0.9 },
            &[s(0.80, 400)],
            &b,
            true
        ));
        // A wider level makes the later model's win harder.
        let (a, b) = ([s(0.5, 200)], [s(0.59, 200)]);
        assert!(dominates(Rule::Beta { level: 0.5 }, &b, &a, false));
        assert!(!dominates(Rule::Beta { level: 0.99 }, &b, &a, false));
    }

    #[test]
    fn threshold_rule() {
        for (p, t) in [
            (0.5, 0.6),
            (0.9, 0.92),
            (0.95, 0.97),
            (0.09, 0.19),
            (0.98, 1.0),
            (0.99, 1.0),
        ] {
            assert!(
                (threshold(p) - t).abs() < 1e-12,
                "t({p}) = {}",
                threshold(p)
            );
        }
        let r = Rule::Threshold;
        // Equal scores: the earlier model wins.
        assert!(dominates(r, &[s(0.5, 10)], &[s(0.5, 10)], true));
        // The later one must clear t(p) in every environment.
        assert!(dominates(
            r,
            &[s(0.61, 10), s(0.93, 100)],
            &[s(0.5, 10), s(0.9, 100)],
            false
        ));
        assert!(!dominates(
            r,
            &[s(0.61, 10), s(0.92, 100)],
            &[s(0.5, 10), s(0.9, 100)],
            false
        ));
        // Nobody beats an earlier 0.98.
        assert!(!dominates(r, &[s(1.0, 10)], &[s(0.98, 10)], false));
    }

    #[test]
    fn verdicts_and_frontiers() {
        // m0 earlier and strong on env 0, m1 strong on env 1, m2 worse than both.
        let models = vec![
            vec![s(0.9, 500), s(0.3, 500)],
            vec![s(0.3, 500), s(0.9, 500)],
            vec![s(0.2, 500), s(0.2, 500)],
        ];
        for rule in [Rule::Pareto, Rule::Beta { level: 0.9 }, Rule::Threshold] {
            let v = verdict(rule, &models);
            assert_eq!(v.frontier, [0, 1], "{rule:?}");
            assert!(
                v.dominates.contains(&(0, 2)) && v.dominates.contains(&(1, 2)),
                "{rule:?}"
            );
            assert!(
                !v.dominates.contains(&(0, 1)) && !v.dominates.contains(&(1, 0)),
                "{rule:?}"
            );
        }
        // Copies: a later copy of a model is dominated by the earlier one.
        let models = vec![vec![s(0.6, 500)], vec![s(0.6, 500)]];
        for rule in [Rule::Pareto, Rule::Beta { level: 0.9 }, Rule::Threshold] {
            assert_eq!(verdict(rule, &models).dominates, [(0, 1)], "{rule:?}");
        }
    }
}
