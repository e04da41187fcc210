//! `trace-train eval --compare A.json B.json` on two fixed reports: the
//! printed table is the committed snapshot, and its numbers are the
//! reports' own.
//!
//! The two reports (`tests/fixtures/eval_report_{a,b}.json`) are made by
//! `write_compare_fixtures` below from fixed predictions: A a model that
//! stops after its answer, B one that learned "always several lines" and
//! runs on after single-line answers. Regenerate them, and the snapshot,
//! with `cargo test --release --test eval_compare -- --ignored` after a
//! deliberate change of the report, then review the diff.

mod common;

use std::path::{Path, PathBuf};

use common::{repo, stderr, trace_train};
use trace_train::data::buckets::Difficulty;
use trace_train::eval::{Attempt, DEFAULT_LEVEL, EvalItem, Prediction, Report, jeffreys_interval};

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures").join(name)
}

const A: &str = "tests/fixtures/eval_report_a.json";
const B: &str = "tests/fixtures/eval_report_b.json";
const EXPECTED: &str = "tests/fixtures/eval_compare_expected.txt";

fn compare_output() -> String {
    let o = trace_train(&repo(), &["eval", "--compare", A, B]);
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn compare_prints_the_expected_table() {
    let got = compare_output();
    let want = std::fs::read_to_string(repo().join(EXPECTED)).unwrap();
    assert_eq!(
        got, want,
        "eval --compare output changed; if deliberate, regenerate with --ignored and review"
    );
}

/// The table's numbers are those of the reports, not of the snapshot.
#[test]
fn compare_rows_carry_each_reports_numbers() {
    let out = compare_output();
    let a = Report::read(&fixture("eval_report_a.json")).unwrap();
    let b = Report::read(&fixture("eval_report_b.json")).unwrap();
    let cell = |n: usize, c: usize| {
        let (lo, hi) = jeffreys_interval(c as u64, n as u64, DEFAULT_LEVEL);
        format!(
            "{:>6} {:>6.1}% [{:>5.1}, {:>5.1}]",
            n,
            100.0 * c as f64 / n as f64,
            100.0 * lo,
            100.0 * hi
        )
    };
    let overall = out.lines().find(|l| l.starts_with("overall")).unwrap();
    assert!(overall.contains(&cell(a.n, a.correct)), "{overall}");
    assert!(overall.contains(&cell(b.n, b.correct)), "{overall}");
    let change = 100.0 * (b.accuracy - a.accuracy);
    assert!(overall.contains(&format!("{change:+.1}")), "{overall}");
    for (name, buckets) in &a.by {
        let section = out
            .split(&format!("\n{name}\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no section {name}:\n{out}"));
        for x in buckets {
            let y = b.by[name].iter().find(|y| y.bucket == x.bucket).unwrap();
            let line = section
                .lines()
                .find(|l| l.split_whitespace().next() == Some(x.bucket.as_str()))
                .unwrap();
            assert!(line.contains(&cell(x.n, x.correct)), "{line}");
            assert!(line.contains(&cell(y.n, y.correct)), "{line}");
        }
    }
    // Item by item: the counts are those of the two reports' predictions,
    // and the p-value the exact McNemar test of the split.
    let right = |r: &Report| -> std::collections::HashMap<String, bool> {
        r.predictions
            .iter()
            .map(|p| (p.id.clone(), p.correct()))
            .collect()
    };
    let (ra, rb) = (right(&a), right(&b));
    let count = |x: bool, y: bool| ra.iter().filter(|(id, r)| **r == x && rb[*id] == y).count();
    let paired = out.split("\npaired: ").nth(1).expect(&out);
    for (label, n) in [
        ("right in both", count(true, true)),
        ("right in A only", count(true, false)),
        ("right in B only", count(false, true)),
        ("right in neither", count(false, false)),
    ] {
        let line = paired
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap();
        assert_eq!(
            line.split_whitespace().last(),
            Some(n.to_string().as_str()),
            "{line}"
        );
    }
    let p = trace_train::eval::paired::exact_mcnemar_p(count(true, false), count(false, true));
    assert!(paired.contains(&format!("{p:.4}")), "{paired}");
    assert!(p < 1.0 && count(true, false) != count(false, true));
    // The length prior shows: B's single-line misses run on.
    let one = &b.by["output_lines"][0];
    assert_eq!(one.bucket, "1");
    assert!(one.misses.longer > 0 && a.by["output_lines"][0].misses.longer == 0);
}

#[test]
fn compare_names_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.json"), "{\"n\": 1}").unwrap();
    let o = trace_train(
        dir.path(),
        &[
            "eval",
            "--compare",
            "x.json",
            repo().join(A).to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("x.json") && e.contains("hint:"), "{e}");
    let o = trace_train(dir.path(), &["eval", "--compare", "missing.json", "x.json"]);
    assert!(!o.status.success() && stderr(&o).contains("missing.json"));
}

/// A multi-turn report: each `(expected, answers)` an episode whose
/// answers are tried in order, ending at the first right one.
fn multi_turn_report(episodes: &[(&str, &[&str])], max_turns: usize) -> Report {
    let preds = episodes
        .iter()
        .enumerate()
        .map(|(i, (expected, answers))| {
            let item = EvalItem {
                id: format!("{i}"),
                prompt: String::new(),
                expected: (*expected).into(),
                difficulty: Difficulty::default(),
            };
            let (last, before) = answers.split_last().unwrap();
            let mut p = Prediction::new(&item, (*last).into(), true);
            p.earlier = before
                .iter()
                .map(|c| Attempt {
                    completion: (*c).into(),
                    answer: (*c).into(),
                    stopped: true,
                    feedback: trace_train::reward::feedback(c, expected, "verdict"),
                })
                .collect();
            p
        })
        .collect();
    Report::multi_turn(preds, DEFAULT_LEVEL, max_turns, "verdict")
}

/// Reports of multi-turn evals compare with each other (the accuracy after
/// each turn side by side, the retries) and with single-turn ones (whose
/// one answer is their turn 1).
#[test]
fn compare_shows_the_accuracy_after_each_turn() {
    let dir = tempfile::tempdir().unwrap();
    let two = multi_turn_report(
        &[
            ("1", &["1"]),
            ("2", &["3", "2"]),
            ("3", &["4", "4"]),
            ("4", &["5", "6"]),
        ],
        2,
    );
    let three = multi_turn_report(
        &[
            ("1", &["0", "1"]),
            ("2", &["2"]),
            ("3", &["4", "5", "3"]),
            ("4", &["5", "5", "5"]),
        ],
        3,
    );
    two.write(&dir.path().join("two.json")).unwrap();
    three.write(&dir.path().join("three.json")).unwrap();
    let run = |a: &str, b: &str| {
        let o = trace_train(dir.path(), &["eval", "--compare", a, b]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let cell = |c: usize| {
        let (lo, hi) = jeffreys_interval(c as u64, 4, DEFAULT_LEVEL);
        format!(
            "{:>6} {:>6.1}% [{:>5.1}, {:>5.1}]",
            4,
            100.0 * c as f64 / 4.0,
            100.0 * lo,
            100.0 * hi
        )
    };
    let out = run("two.json", "three.json");
    let section = out.split("\nafter turn\n").nth(1).expect(&out);
    let rows: Vec<&str> = section.lines().take(3).collect();
    // Two: 1, 2, -; three: 1, 2, 3 right by turns 1, 2, 3.
    for (row, (turn, a, b)) in rows
        .iter()
        .zip([(1, Some(1), 1), (2, Some(2), 2), (3, None, 3)])
    {
        assert!(row.starts_with(&format!("  {turn} ")), "{row}");
        match a {
            Some(a) => assert!(row.contains(&cell(a)), "{row}"),
            None => assert!(row.contains(" - "), "{row}"),
        }
        assert!(row.contains(&cell(b)), "{row}");
    }
    fn line(out: &str, name: &str) -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name}:\n{out}"))
            .split_whitespace()
            .rev()
            .take(2)
            .map(str::to_owned)
            .collect()
    }
    // Retries 3 and 5 (right from the end: B, then A); unchanged: two's
    // "4, 4", three's "5, 5, 5".
    assert_eq!(line(&out, "retries"), ["5", "3"]);
    assert_eq!(line(&out, "  same answer as the turn before"), ["2", "1"]);
    // Against a single-turn report: its accuracy is its turn 1, nothing after.
    let out = run(repo().join(A).to_str().unwrap(), "two.json");
    let a = Report::read(&fixture("eval_report_a.json")).unwrap();
    let section = out.split("\nafter turn\n").nth(1).expect(&out);
    let rows: Vec<&str> = section.lines().take(2).collect();
    let (lo, hi) = jeffreys_interval(a.correct as u64, a.n as u64, DEFAULT_LEVEL);
    let one = format!(
        "{:>6} {:>6.1}% [{:>5.1}, {:>5.1}]",
        a.n,
        100.0 * a.accuracy,
        100.0 * lo,
        100.0 * hi
    );
    assert!(
        rows[0].contains(&one) && rows[0].contains(&cell(1)),
        "{}",
        rows[0]
    );
    assert!(
        rows[1].contains(" - ") && rows[1].contains(&cell(2)),
        "{}",
        rows[1]
    );
    assert_eq!(line(&out, "retries"), ["3", "-"]);
    assert!(out.contains("multi-turn:"), "{out}");
}

/// `(expected, completion, stopped, loop_depth, injections)`.
type Case = (&'static str, &'static str, bool, u32, Option<u32>);

fn report(cases: &[Case]) -> Report {
    let preds = cases
        .iter()
        .enumerate()
        .map(
            |(i, &(expected, completion, stopped, loop_depth, injections))| {
                let item = EvalItem {
                    id: format!("{i}"),
                    prompt: String::new(),
                    expected: expected.into(),
                    difficulty: Difficulty {
                        loop_depth: Some(loop_depth),
                        lines: Some(4 + 3 * i as u32),
                        injections,
                        output_lines: Some(expected.lines().count() as u32),
                    },
                };
                Prediction::new(&item, completion.into(), stopped)
            },
        )
        .collect();
    Report::new(preds, DEFAULT_LEVEL)
}

#[test]
#[ignore = "regenerates the fixtures; run deliberately and review the diff"]
fn write_compare_fixtures() {
    let a: &[Case] = &[
        ("[]", "[]", true, 0, None),
        ("7", "7", true, 0, Some(1)),
        ("True", "False", true, 1, None),
        ("12", "12", true, 1, Some(2)),
        ("hello", "hello", true, 0, None),
        ("3 4", "3 5", true, 2, Some(1)),
        ("a\nb", "a\nb", true, 1, Some(3)),
        ("1\n2\n3", "1\n2", true, 1, None),
        ("x\ny", "x\nz", true, 2, Some(2)),
        ("__DBG_0__ 1\n5\n6", "__DBG_0__ 1\n5\n6", true, 1, Some(1)),
        ("1\n2\n3\n4\n5", "1\n2\n3\n4\n5", true, 2, Some(4)),
        ("q\nw\ne\nr\nt\ny", "q\nw\ne", true, 3, Some(6)),
        ("0", "0", true, 0, None),
        ("None", "None", true, 0, None),
        ("-5", "-5", true, 1, None),
        ("abc", "abc", true, 0, None),
        ("3.5", "3.5", true, 1, None),
        ("[1, 2]", "[1, 2]", true, 1, None),
    ];
    let b: &[Case] = &[
        ("[]", "[]\n[]\n[]\n[]", false, 0, None),
        ("7", "7", true, 0, Some(1)),
        ("True", "True\nTrue\nFalse", true, 1, None),
        ("12", "12\n12\n12", false, 1, Some(2)),
        ("hello", "hello\nhello", true, 0, None),
        ("3 4", "3 4", true, 2, Some(1)),
        ("a\nb", "a\nb\nb", true, 1, Some(3)),
        ("1\n2\n3", "1\n2\n3", true, 1, None),
        ("x\ny", "x\ny", true, 2, Some(2)),
        ("__DBG_0__ 1\n5\n6", "__DBG_0__ 1\n5\n6", true, 1, Some(1)),
        ("1\n2\n3\n4\n5", "1\n2\n3\n4\n5", true, 2, Some(4)),
        ("q\nw\ne\nr\nt\ny", "q\nw\ne\nr\nt\ny", true, 3, Some(6)),
        ("0", "0\n0\n0\n0\n0\n0", false, 0, None),
        ("None", "None\nNone", true, 0, None),
        ("-5", "-5\n-5\n-5", true, 1, None),
        ("abc", "abc", true, 0, None),
        ("3.5", "3.5\n3.5\n3.5\n3.5", false, 1, None),
        ("[1, 2]", "[1, 2]\n[1, 2]", true, 1, None),
    ];
    report(a).write(&fixture("eval_report_a.json")).unwrap();
    report(b).write(&fixture("eval_report_b.json")).unwrap();
    let out = compare_output();
    std::fs::write(Path::new(&repo()).join(EXPECTED), out).unwrap();
}
