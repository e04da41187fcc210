//! Two models scored on the same items, item by item: how many items each
//! got right that the other missed, and the exact McNemar test of that
//! split (McNemar 1947, "Note on the sampling error of the difference
//! between correlated proportions or percentages", Psychometrika 12(2);
//! the exact form is the two-sided binomial test of the discordant items
//! at probability 1/2).
//!
//! Two intervals side by side treat the two scores as independent samples,
//! but two models evaluated on one set share its items: most items are
//! right in both or in neither, and only the items where the models
//! disagree say which is better. A model that gains 11 items and loses
//! none moves the accuracy less than either interval is wide, yet a split
//! of 11 to 0 comes about by chance once in a thousand.

use std::collections::{HashMap, HashSet};

use statrs::distribution::{Binomial, DiscreteCDF};

use super::Report;

/// The two reports' items matched by id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// Items both reports scored.
    pub items: usize,
    pub both: usize,
    /// Right in A, wrong in B.
    pub a_only: usize,
    /// Right in B, wrong in A.
    pub b_only: usize,
    pub neither: usize,
    /// [`exact_mcnemar_p`] of `a_only` and `b_only`.
    pub p_value: f64,
}

/// The exact two-sided McNemar p-value: the chance, were both models
/// equally good on these items, that the items only one of them got right
/// split at least as unevenly as `a_only` to `b_only`. 1 when no item is
/// discordant.
pub fn exact_mcnemar_p(a_only: usize, b_only: usize) -> f64 {
    let n = (a_only + b_only) as u64;
    if n == 0 {
        return 1.0;
    }
    let tail = Binomial::new(0.5, n)
        .expect("1/2 is a probability")
        .cdf(a_only.min(b_only) as u64);
    (2.0 * tail).min(1.0)
}

/// `a` and `b` item by item. An error says why they cannot be paired: no
/// id in common, or an id that appears twice in one report.
pub fn paired(a: &Report, b: &Report) -> Result<Paired, String> {
    let mut right_in_a = HashMap::with_capacity(a.predictions.len());
    for p in &a.predictions {
        if right_in_a.insert(p.id.as_str(), p.correct()).is_some() {
            return Err(format!("item `{}` appears twice in A", p.id));
        }
    }
    let mut seen = HashSet::with_capacity(b.predictions.len());
    let (mut both, mut a_only, mut b_only, mut neither) = (0, 0, 0, 0);
    for p in &b.predictions {
        if !seen.insert(p.id.as_str()) {
            return Err(format!("item `{}` appears twice in B", p.id));
        }
        match (right_in_a.get(p.id.as_str()), p.correct()) {
            (None, _) => {}
            (Some(true), true) => both += 1,
            (Some(true), false) => a_only += 1,
            (Some(false), true) => b_only += 1,
            (Some(false), false) => neither += 1,
        }
    }
    let items = both + a_only + b_only + neither;
    if items == 0 {
        return Err("the reports have no item id in common".into());
    }
    Ok(Paired {
        items,
        both,
        a_only,
        b_only,
        neither,
        p_value: exact_mcnemar_p(a_only, b_only),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::buckets::Difficulty;
    use crate::eval::{DEFAULT_LEVEL, EvalItem, Prediction};

    /// `(a_only, b_only, p)`, p computed exactly with Python's integers:
    /// `min(1, 2 * sum(comb(n, i) for i in range(min(b, c) + 1)) / 2**n)`.
    const EXACT: [(usize, usize, f64); 10] = [
        (0, 11, 0.0009765625),
        (8, 1, 0.0390625),
        (5, 5, 1.0),
        (0, 0, 1.0),
        (1, 0, 1.0),
        (3, 10, 0.09228515625),
        (40, 60, 0.05688793364098079),
        (13, 33, 0.004533861582189047),
        (120, 80, 0.0056851559967503055),
        (500, 560, 0.06990955946026933),
    ];

    #[test]
    fn p_values_match_the_exact_binomial_sums() {
        for (b, c, want) in EXACT {
            let got = exact_mcnemar_p(b, c);
            assert!(
                (got - want).abs() <= 1e-9 * want,
                "{b}:{c}: {got} vs {want}"
            );
            assert_eq!(got, exact_mcnemar_p(c, b), "{b}:{c} is symmetric");
        }
    }

    fn report(items: &[(&str, bool)]) -> Report {
        let preds = items
            .iter()
            .map(|(id, right)| {
                let item = EvalItem {
                    id: (*id).into(),
                    prompt: String::new(),
                    expected: "1".into(),
                    difficulty: Difficulty::default(),
                };
                Prediction::new(&item, if *right { "1" } else { "2" }.into(), true)
            })
            .collect();
        Report::new(preds, DEFAULT_LEVEL)
    }

    #[test]
    fn items_pair_by_id_in_any_order() {
        let a = report(&[
            ("w", true),
            ("x", true),
            ("y", false),
            ("z", false),
            ("a", true),
        ]);
        // B in another order, without `a`, with `b` that A lacks.
        let b = report(&[
            ("z", true),
            ("y", false),
            ("x", false),
            ("w", true),
            ("b", true),
        ]);
        let p = paired(&a, &b).unwrap();
        assert_eq!(
            (p.items, p.both, p.a_only, p.b_only, p.neither),
            (4, 1, 1, 1, 1)
        );
        assert_eq!(p.p_value, 1.0);
    }

    #[test]
    fn reports_that_cannot_be_paired_say_why() {
        let a = report(&[("x", true)]);
        let e = paired(&a, &report(&[("y", true)])).unwrap_err();
        assert!(e.contains("no item id in common"), "{e}");
        let e = paired(&report(&[("x", true), ("x", false)]), &a).unwrap_err();
        assert!(e.contains("`x` appears twice in A"), "{e}");
        let e = paired(&a, &report(&[("x", true), ("x", true)])).unwrap_err();
        assert!(e.contains("`x` appears twice in B"), "{e}");
    }
}
