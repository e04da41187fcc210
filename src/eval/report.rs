//! The eval report: accuracy with its Jeffreys interval, the same by
//! output-line and difficulty bucket, the diagnostics of the misses
//! (answers longer or shorter than expected, where they first go wrong,
//! whether they ended on end-of-turn or at the token budget), and every
//! prediction; written as one JSON file. [`compare`] sets two reports side
//! by side.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::{Prediction, Turns, jeffreys_interval};
use crate::atomic;
use crate::data::buckets::{self, BucketCount, Difficulty, FEATURES};
use crate::reward::{normalize, python_strip};

/// The report layout this code writes. Reports without the field (version
/// 1: no miss diagnostics, older buckets) are recounted from their
/// predictions when read.
pub const REPORT_VERSION: u32 = 2;

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

/// The predictions of one value range of a feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// `"2"`, a range such as `"11-20"` or `"81+"`, or `"n/a"` for items
    /// whose record does not give the feature.
    pub bucket: String,
    pub n: usize,
    pub correct: usize,
    pub accuracy: f64,
    pub interval: Interval,
    #[serde(default)]
    pub misses: Misses,
}

/// What the wrong answers of a group look like.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Misses {
    /// Wrong answers.
    pub n: usize,
    /// Wrong answers with more lines than expected (the model went on).
    pub longer: usize,
    /// Wrong answers with fewer lines than expected.
    pub shorter: usize,
    /// Wrong answers with as many lines as expected.
    pub same_lines: usize,
    /// Wrong answers that ended on a stop token (end of turn).
    pub stopped: usize,
    /// Wrong answers that the token budget cut.
    pub cut: usize,
    /// The first line (1-based) where a wrong answer differs from the
    /// expected output, each line compared as the environment compares
    /// whole answers; a missing or extra line counts as different.
    /// Buckets 1, 2, 3, 4-10, 11+.
    pub first_wrong_line: Vec<BucketCount>,
    /// The mean of that line number (0 without misses).
    pub first_wrong_line_mean: f64,
}

const FIRST_WRONG_EDGES: &[u32] = &[0, 1, 2, 3, 10];

/// Lines of the answer and of the expected output, and the first line
/// (1-based) where they differ (`None` when every line matches).
pub fn line_diff(answer: &str, expected: &str) -> (usize, usize, Option<usize>) {
    let a: Vec<String> = python_strip(answer).lines().map(normalize).collect();
    let e: Vec<String> = python_strip(expected).lines().map(normalize).collect();
    let first = (0..a.len().max(e.len()))
        .find(|&i| a.get(i) != e.get(i))
        .map(|i| i + 1);
    (a.len(), e.len(), first)
}

#[derive(Default)]
struct MissTally {
    m: Misses,
    first: BTreeMap<u32, (String, u64)>,
    first_sum: usize,
}

impl MissTally {
    fn add(&mut self, p: &Prediction) {
        if p.correct() {
            return;
        }
        let (got, want, first) = line_diff(&p.answer, &p.expected);
        let m = &mut self.m;
        m.n += 1;
        match got.cmp(&want) {
            std::cmp::Ordering::Greater => m.longer += 1,
            std::cmp::Ordering::Less => m.shorter += 1,
            std::cmp::Ordering::Equal => m.same_lines += 1,
        }
        if p.stopped {
            m.stopped += 1;
        } else {
            m.cut += 1;
        }
        // A miss whose lines all match (whitespace inside a line moved
        // across lines) is counted at the line after the shorter side.
        let first = first.unwrap_or(got.min(want) + 1);
        self.first_sum += first;
        let (key, label) = buckets::bucket(u32::try_from(first).ok(), FIRST_WRONG_EDGES);
        self.first.entry(key).or_insert((label, 0)).1 += 1;
    }

    fn finish(self) -> Misses {
        let mut m = self.m;
        m.first_wrong_line = self
            .first
            .into_values()
            .map(|(bucket, n)| BucketCount { bucket, n })
            .collect();
        m.first_wrong_line_mean = ratio(self.first_sum, m.n);
        m
    }
}

/// What an eval run found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`REPORT_VERSION`] when written by this code; 1 when absent.
    #[serde(default = "version_one")]
    pub version: u32,
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
    /// The wrong answers: longer or shorter than expected, where they
    /// first go wrong, how they ended.
    #[serde(default)]
    pub misses: Misses,
    /// A multi-turn eval's accuracy after each turn and its retries
    /// (`--max_turns` above 1; absent, and not written, otherwise). The
    /// other numbers are those of each item's last answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<Turns>,
    /// Per feature, its buckets in increasing order: `output_lines` (of the
    /// expected output: 1, 2-3, 4-10, 11+) and the difficulty features
    /// `loop_depth`, `lines` (of the program) and `injections`. An item
    /// whose record lacks a feature is in that feature's `n/a` bucket, so
    /// every feature's buckets add up to the totals.
    pub by: BTreeMap<String, Vec<Bucket>>,
    /// In the order given.
    pub predictions: Vec<Prediction>,
}

fn version_one() -> u32 {
    1
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
        let mut misses = MissTally::default();
        for p in &predictions {
            misses.add(p);
        }
        let mut by = BTreeMap::new();
        for f in FEATURES {
            let mut groups: BTreeMap<u32, (String, usize, usize, MissTally)> = BTreeMap::new();
            for p in &predictions {
                // Output lines are those of the expected output itself.
                let d = Difficulty {
                    output_lines: u32::try_from(python_strip(&p.expected).lines().count()).ok(),
                    ..p.difficulty
                };
                let (key, label) = buckets::bucket((f.get)(&d), f.edges);
                let g = groups
                    .entry(key)
                    .or_insert_with(|| (label, 0, 0, MissTally::default()));
                g.1 += 1;
                g.2 += usize::from(p.correct());
                g.3.add(p);
            }
            let buckets = groups
                .into_values()
                .map(|(bucket, n, correct, misses)| Bucket {
                    bucket,
                    n,
                    correct,
                    accuracy: correct as f64 / n as f64,
                    interval: Interval::jeffreys(correct, n, level),
                    misses: misses.finish(),
                })
                .collect();
            by.insert(f.name.to_owned(), buckets);
        }
        Self {
            version: REPORT_VERSION,
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
            misses: misses.finish(),
            turns: None,
            by,
            predictions,
        }
    }

    /// The report of a multi-turn eval: `predictions` are each item's last
    /// answer with its earlier ones, in episodes of at most `max_turns`
    /// answers with `feedback`; [`Report::new`]'s numbers of the last
    /// answers, plus [`Turns`] when `max_turns` is above 1 (with 1, the
    /// single-turn report).
    pub fn multi_turn(
        predictions: Vec<Prediction>,
        level: f64,
        max_turns: usize,
        feedback: &str,
    ) -> Self {
        let turns = (max_turns > 1).then(|| Turns::count(&predictions, max_turns, feedback, level));
        Self {
            turns,
            ..Self::new(predictions, level)
        }
    }

    /// Reads a report file. One written before the miss diagnostics
    /// (version 1) is recounted from its predictions, at its own level.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read eval report `{}`", path.display()))?;
        let r: Report = serde_json::from_str(&text).with_context(|| {
            let envs = serde_json::from_str::<serde_json::Value>(&text)
                .is_ok_and(|v| v.get("environments").is_some());
            match envs {
                true => format!(
                    "`{}` is a report of `eval --environment`, not a Trace report of `eval`\nhint: compare reports of `eval --environment` with `trace-train compare A.json B.json`",
                    path.display()
                ),
                false => format!(
                    "`{}` is not an eval report\nhint: pass the JSON files `trace-train eval` writes (--output)",
                    path.display()
                ),
            }
        })?;
        anyhow::ensure!(
            r.version <= REPORT_VERSION,
            "`{}`: report version {} is newer than this trace-train reads ({REPORT_VERSION})\nhint: compare it with the trace-train that wrote it",
            path.display(),
            r.version
        );
        Ok(if r.version < REPORT_VERSION {
            Report {
                turns: r.turns,
                ..Report::new(r.predictions, r.interval.level)
            }
        } else {
            r
        })
    }

    /// One line for a log: `accuracy 37.0% (80% interval 31.0-43.3%), n 100,
    /// truncated 3; partial credit: lines 61.2%, first lines 80.0%; misses:
    /// 5 longer, 10 shorter, 48 same lines`, then with turns `; after turn
    /// 1 30.0%, 2 37.0%; retries 70, unchanged 12.9%`.
    pub fn summary(&self) -> String {
        let i = &self.interval;
        let turns = self
            .turns
            .as_ref()
            .map_or_else(String::new, |t| format!("; {}", t.summary()));
        format!(
            "accuracy {:.1}% ({:.0}% interval {:.1}-{:.1}%), n {}, truncated {}; partial credit: lines {:.1}%, first lines {:.1}%; misses: {} longer, {} shorter, {} same lines{turns}",
            100.0 * self.accuracy,
            100.0 * i.level,
            100.0 * i.lo,
            100.0 * i.hi,
            self.n,
            self.truncated,
            100.0 * self.line_accuracy,
            100.0 * self.first_line_accuracy,
            self.misses.longer,
            self.misses.shorter,
            self.misses.same_lines,
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
        // Odd items have no injection count: the `n/a` bucket.
        assert_eq!(
            labels(&r.by["injections"]),
            [
                ("0", 1, 1),
                ("1", 1, 1),
                ("2", 1, 1),
                ("3", 1, 0),
                ("4", 1, 0),
                ("n/a", 5, 3)
            ]
        );
        // Output lines come from the expected output ("42": one line).
        assert_eq!(labels(&r.by["output_lines"]), [("1", 10, 6)]);
        let b = &r.by["loop_depth"][0];
        assert_eq!(b.accuracy, 0.5);
        assert_eq!((b.interval.lo, b.interval.hi), jeffreys_interval(2, 4, 0.8));
        assert_eq!(r.predictions.len(), 10);
        assert_eq!(
            r.summary(),
            format!(
                "accuracy 60.0% (80% interval {:.1}-{:.1}%), n 10, truncated 3; partial credit: lines 60.0%, first lines 60.0%; misses: 0 longer, 0 shorter, 4 same lines",
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

    fn item(i: usize, expected: &str, d: Difficulty) -> EvalItem {
        EvalItem {
            id: i.to_string(),
            prompt: String::new(),
            expected: expected.into(),
            difficulty: d,
        }
    }

    #[test]
    fn misses_say_longer_shorter_where_and_how_they_ended() {
        let d = Difficulty::default();
        let preds = vec![
            // Right line, then the model went on: longer, wrong at line 2.
            Prediction::new(&item(0, "[]", d), "[]\n[]\n[]".into(), false),
            // Stopped after two of three lines: shorter, wrong at line 3.
            Prediction::new(&item(1, "a\nb\nc", d), "a\nb".into(), true),
            // Same count, second line wrong.
            Prediction::new(&item(2, "1\n2", d), "1\n3".into(), true),
            // Right.
            Prediction::new(&item(3, "x", d), "x".into(), true),
            // Empty answer: shorter, wrong at line 1.
            Prediction::new(&item(4, "5\n6", d), "".into(), true),
        ];
        assert_eq!(line_diff("[]\n[]", "[]"), (2, 1, Some(2)));
        assert_eq!(line_diff("a\n B", "a\nb"), (2, 2, None));
        let r = Report::new(preds, DEFAULT_LEVEL);
        let m = &r.misses;
        assert_eq!(
            (m.n, m.longer, m.shorter, m.same_lines, m.stopped, m.cut),
            (4, 1, 2, 1, 3, 1)
        );
        let hist: Vec<(&str, u64)> = m
            .first_wrong_line
            .iter()
            .map(|b| (b.bucket.as_str(), b.n))
            .collect();
        assert_eq!(hist, [("1", 1), ("2", 2), ("3", 1)]);
        assert!((m.first_wrong_line_mean - 8.0 / 4.0).abs() < 1e-12);
        // By output lines: "[]" and "x" are one line, the others 2 or 3.
        let b = &r.by["output_lines"];
        assert_eq!(labels(b), [("1", 2, 1), ("2-3", 3, 0)]);
        assert_eq!((b[0].misses.longer, b[1].misses.shorter), (1, 2));
    }

    /// Every feature's buckets add up to the report's totals, for the
    /// counts and for every miss diagnostic.
    fn assert_buckets_add_up(r: &Report) {
        for (name, buckets) in &r.by {
            let sum = |f: &dyn Fn(&Bucket) -> usize| buckets.iter().map(f).sum::<usize>();
            assert_eq!(sum(&|b| b.n), r.n, "{name}: n");
            assert_eq!(sum(&|b| b.correct), r.correct, "{name}: correct");
            assert_eq!(sum(&|b| b.misses.n), r.misses.n, "{name}: misses");
            assert_eq!(sum(&|b| b.misses.longer), r.misses.longer, "{name}");
            assert_eq!(sum(&|b| b.misses.shorter), r.misses.shorter, "{name}");
            assert_eq!(sum(&|b| b.misses.same_lines), r.misses.same_lines);
            assert_eq!(sum(&|b| b.misses.stopped), r.misses.stopped, "{name}");
            assert_eq!(sum(&|b| b.misses.cut), r.misses.cut, "{name}");
            for b in buckets {
                assert_eq!(b.misses.n, b.n - b.correct, "{name} {}", b.bucket);
                assert_eq!(
                    b.misses.longer + b.misses.shorter + b.misses.same_lines,
                    b.misses.n
                );
                assert_eq!(b.misses.stopped + b.misses.cut, b.misses.n);
                // JSON keeps floats to within their last bit.
                let (lo, hi) = jeffreys_interval(b.correct as u64, b.n as u64, 0.8);
                assert!((b.interval.lo - lo).abs() < 1e-12 && (b.interval.hi - hi).abs() < 1e-12);
            }
        }
        assert_eq!(
            r.misses.first_wrong_line.iter().map(|b| b.n).sum::<u64>(),
            r.misses.n as u64
        );
    }

    #[test]
    fn per_bucket_numbers_add_up_to_the_totals() {
        // 200 varied predictions from a fixed generator: answers right,
        // longer, shorter or wrong in place; features sometimes missing.
        let mut x = 12345u64;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let preds: Vec<Prediction> = (0..200)
            .map(|i| {
                let lines = 1 + next(14) as usize;
                let expected: Vec<String> = (0..lines).map(|l| format!("v{l}")).collect();
                let mut answer = expected.clone();
                match next(4) {
                    0 => {}
                    1 => answer.extend(["extra".to_owned(), "more".to_owned()]),
                    2 => answer.truncate(next(lines as u64) as usize),
                    _ => answer[next(lines as u64) as usize] = "wrong".into(),
                }
                let d = Difficulty {
                    loop_depth: (next(5) > 0).then(|| next(4) as u32),
                    lines: Some(next(120) as u32),
                    injections: (next(2) == 0).then(|| next(7) as u32),
                    output_lines: Some(lines as u32),
                };
                Prediction::new(
                    &item(i, &expected.join("\n"), d),
                    answer.join("\n"),
                    next(3) > 0,
                )
            })
            .collect();
        let r = Report::new(preds, DEFAULT_LEVEL);
        assert!(r.correct > 20 && r.misses.n > 100, "{}", r.summary());
        assert!(r.misses.longer > 0 && r.misses.shorter > 0 && r.misses.same_lines > 0);
        assert_eq!(
            r.by.keys().map(String::as_str).collect::<Vec<_>>(),
            ["injections", "lines", "loop_depth", "output_lines"]
        );
        let lines: Vec<&str> = r.by["output_lines"]
            .iter()
            .map(|b| b.bucket.as_str())
            .collect();
        assert_eq!(lines, ["1", "2-3", "4-10", "11+"]);
        assert_buckets_add_up(&r);
        // And the same after a round trip through the file.
        let dir = tempfile::tempdir().unwrap();
        r.write(&dir.path().join("r.json")).unwrap();
        assert_buckets_add_up(&Report::read(&dir.path().join("r.json")).unwrap());
    }

    #[test]
    fn a_report_written_before_the_diagnostics_is_recounted_when_read() {
        let preds = vec![
            Prediction::new(
                &item(0, "[]", Difficulty::default()),
                "[]\n[]".into(),
                false,
            ),
            Prediction::new(&item(1, "1", Difficulty::default()), "1".into(), true),
        ];
        let now = Report::new(preds, DEFAULT_LEVEL);
        let mut v = serde_json::to_value(&now).unwrap();
        // Version 1: no version, no misses, no misses in the buckets.
        let o = v.as_object_mut().unwrap();
        o.remove("version");
        o.remove("misses");
        for buckets in o["by"].as_object_mut().unwrap().values_mut() {
            for b in buckets.as_array_mut().unwrap() {
                b.as_object_mut().unwrap().remove("misses");
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        std::fs::write(&path, v.to_string()).unwrap();
        let back = Report::read(&path).unwrap();
        assert_eq!(back, now);
        assert_eq!(back.misses.longer, 1);
        std::fs::write(&path, "{\"n\": 3}").unwrap();
        let e = format!("{:#}", Report::read(&path).unwrap_err());
        assert!(e.contains("old.json") && e.contains("hint:"), "{e}");
    }
}
