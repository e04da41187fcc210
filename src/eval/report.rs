//! The eval report: accuracy with its Jeffreys interval, the same by
//! difficulty bucket, and every prediction; written as one JSON file.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::{Difficulty, Prediction, jeffreys_interval};
use crate::atomic;

/// A credible interval for an accuracy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub level: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    fn jeffreys(correct: usize, n: usize, level: f64) -> Self {
        let (lo, hi) = jeffreys_interval(correct as u64, n as u64, level);
        Self { level, lo, hi }
    }
}

/// The predictions of one value range of a difficulty feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// `"2"`, or a range such as `"11-20"` or `"81+"`.
    pub bucket: String,
    pub n: usize,
    pub correct: usize,
    pub accuracy: f64,
    pub interval: Interval,
}

/// What an eval run found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub n: usize,
    pub correct: usize,
    /// `correct / n` (0 when `n` is 0).
    pub accuracy: f64,
    pub interval: Interval,
    /// Completions the token budget cut (no stop token): a budget too small
    /// for the model's answers, or its thinking, shows here first.
    pub truncated: usize,
    /// Partial credit, a diagnostic that moves before exact matches do:
    /// expected lines reproduced at their position over all expected lines.
    pub line_accuracy: f64,
    /// Items whose first answer line is the expected first line, over `n`.
    pub first_line_accuracy: f64,
    /// Per difficulty feature (`loop_depth`, `lines`, `injections`,
    /// `output_lines`), its buckets in increasing order. An item whose
    /// record lacks a feature is left out of that feature's buckets.
    pub by: BTreeMap<String, Vec<Bucket>>,
    /// In the order given.
    pub predictions: Vec<Prediction>,
}

/// A difficulty feature: its name, how to read it, and the upper bounds of
/// its buckets (none: one bucket a value).
type Feature = (&'static str, fn(&Difficulty) -> Option<u32>, &'static [u32]);

/// The features the report breaks down by.
const FEATURES: [Feature; 4] = [
    ("loop_depth", |d| d.loop_depth, &[]),
    ("lines", |d| d.lines, &[10, 20, 40, 80]),
    ("injections", |d| d.injections, &[]),
    ("output_lines", |d| d.output_lines, &[5, 10, 20, 50]),
];

/// The bucket of `value` under upper bounds `edges` (exact values when
/// empty): its sort key and label.
fn bucket(value: u32, edges: &[u32]) -> (u32, String) {
    if edges.is_empty() {
        return (value, value.to_string());
    }
    let mut lo = 0;
    for &hi in edges {
        if value <= hi {
            return (lo, format!("{lo}-{hi}"));
        }
        lo = hi + 1;
    }
    (lo, format!("{lo}+"))
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn first_line_matches(p: &Prediction) -> bool {
    let first = |s: &str| {
        crate::reward::python_strip(s)
            .lines()
            .next()
            .map(crate::reward::normalize)
    };
    first(&p.answer) == first(&p.expected)
}

impl Report {
    /// Counts `predictions` and gives each count its `level` interval.
    pub fn new(predictions: Vec<Prediction>, level: f64) -> Self {
        let tally = |preds: &mut dyn Iterator<Item = &Prediction>| {
            preds.fold((0, 0), |(n, c), p| (n + 1, c + usize::from(p.correct())))
        };
        let (n, correct) = tally(&mut predictions.iter());
        let mut by = BTreeMap::new();
        for (name, get, edges) in FEATURES {
            let mut groups: BTreeMap<u32, (String, usize, usize)> = BTreeMap::new();
            for p in &predictions {
                if let Some(value) = get(&p.difficulty) {
                    let (key, label) = bucket(value, edges);
                    let g = groups.entry(key).or_insert((label, 0, 0));
                    g.1 += 1;
                    g.2 += usize::from(p.correct());
                }
            }
            let buckets = groups
                .into_values()
                .map(|(bucket, n, correct)| Bucket {
                    bucket,
                    n,
                    correct,
                    accuracy: correct as f64 / n as f64,
                    interval: Interval::jeffreys(correct, n, level),
                })
                .collect();
            by.insert(name.to_owned(), buckets);
        }
        Self {
            n,
            correct,
            accuracy: if n == 0 {
                0.0
            } else {
                correct as f64 / n as f64
            },
            interval: Interval::jeffreys(correct, n, level),
            truncated: predictions.iter().filter(|p| !p.stopped).count(),
            line_accuracy: ratio(
                predictions.iter().map(|p| p.lines_matched).sum(),
                predictions.iter().map(|p| p.lines_expected).sum(),
            ),
            first_line_accuracy: ratio(
                predictions
                    .iter()
                    .filter(|p| p.lines_expected > 0 && first_line_matches(p))
                    .count(),
                n,
            ),
            by,
            predictions,
        }
    }

    /// One line for a log: `accuracy 37.0% (80% interval 31.0-43.3%), n 100,
    /// truncated 3; partial credit: lines 61.2%, first lines 80.0%`.
    pub fn summary(&self) -> String {
        let i = &self.interval;
        format!(
            "accuracy {:.1}% ({:.0}% interval {:.1}-{:.1}%), n {}, truncated {}; partial credit: lines {:.1}%, first lines {:.1}%",
            100.0 * self.accuracy,
            100.0 * i.level,
            100.0 * i.lo,
            100.0 * i.hi,
            self.n,
            self.truncated,
            100.0 * self.line_accuracy,
            100.0 * self.first_line_accuracy,
        )
    }

    /// Writes the report as pretty JSON to `path`, atomically.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_vec_pretty(self).context("cannot serialise the eval report")?;
        atomic::write(path, &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{DEFAULT_LEVEL, EvalItem};

    fn prediction(i: usize, correct: bool, difficulty: Difficulty) -> Prediction {
        let item = EvalItem {
            id: i.to_string(),
            prompt: String::new(),
            expected: "42".into(),
            difficulty,
        };
        let completion = if correct { "42" } else { "41" };
        Prediction::new(&item, completion.into(), !i.is_multiple_of(4))
    }

    #[test]
    fn partial_credit_counts_lines_at_their_position() {
        let item = |expected: &str| EvalItem {
            id: "x".into(),
            prompt: String::new(),
            expected: expected.into(),
            difficulty: Difficulty::default(),
        };
        let preds = vec![
            Prediction::new(&item("a\nb\nc"), "a\nb\nc".into(), true),
            Prediction::new(&item("a\nb\nc"), "a\nx\nc\nd".into(), true),
            Prediction::new(&item("p\nq"), "q".into(), false),
        ];
        let r = Report::new(preds, DEFAULT_LEVEL);
        assert_eq!(r.correct, 1);
        assert!(
            (r.line_accuracy - 5.0 / 8.0).abs() < 1e-12,
            "{}",
            r.line_accuracy
        );
        assert!((r.first_line_accuracy - 2.0 / 3.0).abs() < 1e-12);
        assert!(r.summary().contains("lines 62.5%"), "{}", r.summary());
    }

    fn labels(buckets: &[Bucket]) -> Vec<(&str, usize, usize)> {
        buckets
            .iter()
            .map(|b| (b.bucket.as_str(), b.n, b.correct))
            .collect()
    }

    #[test]
    fn buckets_are_ranges_in_numeric_order() {
        let edges = [10, 20, 40];
        assert_eq!(bucket(0, &edges), (0, "0-10".into()));
        assert_eq!(bucket(10, &edges), (0, "0-10".into()));
        assert_eq!(bucket(11, &edges), (11, "11-20".into()));
        assert_eq!(bucket(41, &edges), (41, "41+".into()));
        assert_eq!(bucket(3, &[]), (3, "3".into()));
    }

    #[test]
    fn report_counts_overall_and_by_difficulty() {
        // Items 0..10: loop depth i % 3, lines 5 * i, injections only on
        // even items; the first 6 are correct.
        let preds: Vec<Prediction> = (0..10)
            .map(|i| {
                let d = Difficulty {
                    loop_depth: Some(i as u32 % 3),
                    lines: Some(5 * i as u32),
                    injections: (i % 2 == 0).then_some(i as u32 / 2),
                    output_lines: None,
                };
                prediction(i, i < 6, d)
            })
            .collect();
        let r = Report::new(preds, DEFAULT_LEVEL);
        assert_eq!((r.n, r.correct, r.accuracy), (10, 6, 0.6));
        let (lo, hi) = jeffreys_interval(6, 10, 0.8);
        assert_eq!(
            (r.interval.lo, r.interval.hi, r.interval.level),
            (lo, hi, 0.8)
        );
        // Items 0, 4 and 8 have no stop token.
        assert_eq!(r.truncated, 3);
        assert_eq!(
            labels(&r.by["loop_depth"]),
            [("0", 4, 2), ("1", 3, 2), ("2", 3, 2)]
        );
        // Lines 0..45 by 5: 0-10 holds 0, 5, 10; 11-20 holds 15, 20; ...
        assert_eq!(
            labels(&r.by["lines"]),
            [
                ("0-10", 3, 3),
                ("11-20", 2, 2),
                ("21-40", 4, 1),
                ("41-80", 1, 0)
            ]
        );
        assert_eq!(
            labels(&r.by["injections"]),
            [
                ("0", 1, 1),
                ("1", 1, 1),
                ("2", 1, 1),
                ("3", 1, 0),
                ("4", 1, 0)
            ]
        );
        assert!(r.by["output_lines"].is_empty());
        let b = &r.by["loop_depth"][0];
        assert_eq!(b.accuracy, 0.5);
        assert_eq!((b.interval.lo, b.interval.hi), jeffreys_interval(2, 4, 0.8));
        assert_eq!(r.predictions.len(), 10);
        assert_eq!(
            r.summary(),
            format!(
                "accuracy 60.0% (80% interval {:.1}-{:.1}%), n 10, truncated 3; partial credit: lines 60.0%, first lines 60.0%",
                100.0 * lo,
                100.0 * hi
            )
        );
    }

    #[test]
    fn report_round_trips_through_its_json_file() {
        let preds = vec![
            prediction(1, true, Difficulty::default()),
            prediction(2, false, Difficulty::default()),
        ];
        let r = Report::new(preds, DEFAULT_LEVEL);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eval_report.json");
        r.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let p = &v["predictions"][1];
        for key in ["id", "completion", "answer", "expected", "score"] {
            assert!(p.get(key).is_some(), "{key}");
        }
        assert_eq!(p["answer"], "41");
    }

    #[test]
    fn an_empty_report_is_well_formed() {
        let r = Report::new(Vec::new(), DEFAULT_LEVEL);
        assert_eq!((r.n, r.accuracy, r.truncated), (0, 0.0, 0));
        assert!(r.interval.lo > 0.0 && r.interval.hi < 1.0);
        assert!(serde_json::to_string(&r).is_ok());
    }
}
