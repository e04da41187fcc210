//! The Jeffreys interval for a binomial proportion (Brown, Cai and
//! DasGupta 2001, "Interval Estimation for a Binomial Proportion",
//! Statistical Science 16(2), sec. 4.1.2): the equal-tailed credible
//! interval of the posterior Beta(s + 1/2, n - s + 1/2) under the Jeffreys
//! prior Beta(1/2, 1/2). It keeps close to its nominal coverage for small n
//! and for accuracies near 0 or 1, where the normal (Wald) interval fails.
//!
//! Both ends are plain posterior quantiles; Brown et al.'s boundary
//! convention (lower end 0 when s = 0, upper end 1 when s = n) is not
//! applied, so the interval equals scipy's `beta.ppf` at both tails.

use statrs::distribution::{Beta, ContinuousCDF};

/// The level eval reports: the 10th to the 90th percentile.
pub const DEFAULT_LEVEL: f64 = 0.8;

/// The `level` (e.g. 0.8) Jeffreys interval `(lo, hi)` of `successes` out
/// of `n`: the `(1 - level) / 2` and `(1 + level) / 2` quantiles of
/// Beta(0.5 + successes, 0.5 + n - successes). With `n = 0` it is the
/// prior's interval.
///
/// # Panics
/// If `successes > n` or `level` is not in (0, 1).
pub fn jeffreys_interval(successes: u64, n: u64, level: f64) -> (f64, f64) {
    assert!(successes <= n, "{successes} successes out of {n}");
    assert!(level > 0.0 && level < 1.0, "level {level} is not in (0, 1)");
    let posterior = Beta::new(0.5 + successes as f64, 0.5 + (n - successes) as f64)
        .expect("both shapes are at least 0.5");
    let tail = (1.0 - level) / 2.0;
    (
        posterior.inverse_cdf(tail),
        posterior.inverse_cdf(1.0 - tail),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(successes, n, level, lo, hi)` from scipy 1.17.1:
    /// ```python
    /// from scipy.stats import beta
    /// a, b = s + 0.5, n - s + 0.5
    /// lo, hi = beta.ppf((1 - level) / 2, a, b), beta.ppf((1 + level) / 2, a, b)
    /// ```
    const SCIPY: [(u64, u64, f64, f64, f64); 16] = [
        (0, 0, 0.8, 0.024471741852423207, 0.9755282581475768),
        (0, 1, 0.8, 0.006181243938429667, 0.6486428019743724),
        (1, 1, 0.8, 0.35135719802562754, 0.9938187560615703),
        (1, 3, 0.8, 0.1015373255475093, 0.6847103216080093),
        (0, 10, 0.8, 0.000769755304684768, 0.12357420632868017),
        (3, 10, 0.8, 0.1505912258762015, 0.5017811181000884),
        (10, 10, 0.8, 0.8764257936713198, 0.9992302446953152),
        (37, 100, 0.8, 0.31035472908171524, 0.43332658760676523),
        (50, 100, 0.8, 0.436342872552161, 0.563657127447839),
        (0, 500, 0.8, 1.5782756121837735e-05, 0.0027005376860463628),
        (250, 500, 0.8, 0.4713814452336853, 0.5286185547663147),
        (499, 500, 0.8, 0.9937649999639021, 0.9994155040406673),
        (812, 1000, 0.8, 0.7957270608902451, 0.8273824984460407),
        (3, 10, 0.95, 0.09269459393815317, 0.6058183181486713),
        (37, 100, 0.5, 0.3383722669825894, 0.40327830018520133),
        (12345, 23303, 0.8, 0.5255682617107358, 0.5339483238540125),
    ];

    #[test]
    fn matches_scipy() {
        for (s, n, level, lo, hi) in SCIPY {
            let (got_lo, got_hi) = jeffreys_interval(s, n, level);
            // Relative: the lower end of 0/500 is 1.6e-5.
            for (got, want) in [(got_lo, lo), (got_hi, hi)] {
                let err = (got - want).abs() / want;
                assert!(err < 1e-9, "{s}/{n} at {level}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn is_symmetric_and_narrows_with_n() {
        let (lo, hi) = jeffreys_interval(3, 10, DEFAULT_LEVEL);
        let (lo2, hi2) = jeffreys_interval(7, 10, DEFAULT_LEVEL);
        assert!((lo - (1.0 - hi2)).abs() < 1e-12 && (hi - (1.0 - lo2)).abs() < 1e-12);
        let width = |s, n| {
            let (lo, hi) = jeffreys_interval(s, n, DEFAULT_LEVEL);
            hi - lo
        };
        assert!(width(30, 100) < width(3, 10));
        assert!(width(300, 1000) < width(30, 100));
    }

    #[test]
    #[should_panic(expected = "11 successes out of 10")]
    fn more_successes_than_trials_is_a_bug() {
        jeffreys_interval(11, 10, DEFAULT_LEVEL);
    }
}
