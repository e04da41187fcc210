//! Two eval reports side by side (`trace-train eval --compare A.json
//! B.json`): overall and every bucket, each side's accuracy with its
//! interval and the change, then the miss diagnostics, so what a stage did
//! shows at a glance. When either report is a multi-turn eval's, the
//! accuracy after each turn and the retries too (a report without turns
//! answered once: its accuracy is its accuracy after turn 1). Then the
//! items both reports scored, item by item, with the exact McNemar test
//! ([`super::paired`]).

use std::fmt::Write;

use super::{Bucket, Interval, Report, Turns};
use crate::data::buckets::FEATURES;

/// One side of a row: n, correct, interval, and the misses with more
/// lines than expected (none in a row of turns).
type Side = Option<(usize, usize, Interval, Option<usize>)>;

fn side(b: Option<&Bucket>) -> Side {
    b.map(|b| (b.n, b.correct, b.interval, Some(b.misses.longer)))
}

fn cell(s: &Side) -> String {
    match s {
        None => format!("{:>6} {:>7} {:>14} {:>6}", "-", "", "", ""),
        Some((n, c, i, longer)) => format!(
            "{:>6} {:>6.1}% [{:>5.1}, {:>5.1}] {:>6}",
            n,
            100.0 * ratio(*c, *n),
            100.0 * i.lo,
            100.0 * i.hi,
            longer.map_or_else(String::new, |l| l.to_string())
        ),
    }
}

/// A report's accuracy after `turn`: from its turns, or, for a report
/// without them, its accuracy at turn 1 (its only answer) and nothing after.
fn after_turn(r: &Report, turn: usize) -> Side {
    match &r.turns {
        Some(t) => t
            .by_turn
            .iter()
            .find(|x| x.turn == turn)
            .map(|x| (r.n, x.correct, x.interval, None)),
        None => (turn == 1).then_some((r.n, r.correct, r.interval, None)),
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// `+12.5` points, with `*` when the two intervals do not overlap.
fn change(a: &Side, b: &Side) -> String {
    match (a, b) {
        (Some((na, ca, ia, _)), Some((nb, cb, ib, _))) => {
            let d = 100.0 * (ratio(*cb, *nb) - ratio(*ca, *na));
            let apart = ia.hi < ib.lo || ib.hi < ia.lo;
            format!("{d:>+7.1}{}", if apart { " *" } else { "" })
        }
        _ => String::new(),
    }
}

fn row(out: &mut String, label: &str, a: &Side, b: &Side) {
    let line = format!("{label:<16}{}  {}  {}", cell(a), cell(b), change(a, b));
    writeln!(out, "{}", line.trim_end()).expect("a String takes writes");
}

/// The items both reports scored, item by item ([`super::paired`]): the
/// test to read when A and B are two models on one eval set.
fn paired_section(w: &mut String, a: &Report, b: &Report) {
    match super::paired::paired(a, b) {
        Ok(p) => {
            writeln!(
                w,
                "\npaired: the {} items both reports scored (of A's {} and B's {}), item by item",
                p.items, a.n, b.n
            )
            .unwrap();
            for (label, x) in [
                ("  right in both", p.both),
                ("  right in A only", p.a_only),
                ("  right in B only", p.b_only),
                ("  right in neither", p.neither),
            ] {
                writeln!(w, "{label:<34}{x:>8}").unwrap();
            }
            writeln!(
                w,
                "{:<34}{:>8.4}\n  (the chance of a split of A only : B only this uneven or more if the\n  models were equally good on these items)",
                "  exact McNemar p, two-sided", p.p_value
            )
            .unwrap();
        }
        Err(why) => writeln!(w, "\npaired: not computed: {why}").unwrap(),
    }
}

/// The side-by-side table of reports `a` and `b`, named `a_name` and
/// `b_name` in its header.
pub fn compare(a: &Report, b: &Report, a_name: &str, b_name: &str) -> String {
    let mut out = String::new();
    let w = &mut out;
    let level = |r: &Report| format!("{:.0}%", 100.0 * r.interval.level);
    writeln!(w, "A: {a_name}\nB: {b_name}").unwrap();
    let levels = if a.interval.level == b.interval.level {
        level(a)
    } else {
        format!("A {}, B {}", level(a), level(b))
    };
    writeln!(
        w,
        "acc: exact match, with its {levels} Jeffreys interval; longer: wrong answers with more lines\nthan expected; change: B - A in points, * where the intervals do not overlap\n"
    )
    .unwrap();
    if a.turns.is_some() || b.turns.is_some() {
        writeln!(
            w,
            "multi-turn: overall and the buckets are each item's last answer; after turn k: items right\nwithin their first k answers (a report without turns answered once)\n"
        )
        .unwrap();
    }
    let head = format!("{:>6} {:>7} {:>14} {:>6}", "n", "acc", "interval", "longer");
    writeln!(w, "{:<16}{:-^36}  {:-^36}", "", " A ", " B ").unwrap();
    writeln!(w, "{:<16}{head}  {head}  {:>7}", "", "change").unwrap();
    let total = |r: &Report| Some((r.n, r.correct, r.interval, Some(r.misses.longer)));
    row(w, "overall", &total(a), &total(b));
    let turns = |r: &Report| r.turns.as_ref().map_or(1, |t| t.max_turns);
    let most = turns(a).max(turns(b));
    if most > 1 {
        writeln!(w, "after turn").unwrap();
        for turn in 1..=most {
            row(
                w,
                &format!("  {turn}"),
                &after_turn(a, turn),
                &after_turn(b, turn),
            );
        }
    }
    // The features this code reports first, in its order, then any other
    // the files hold.
    let mut names: Vec<&str> = FEATURES.iter().map(|f| f.name).collect();
    for name in a.by.keys().chain(b.by.keys()) {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    for name in names {
        let (ba, bb) = (
            a.by.get(name).map_or(&[][..], Vec::as_slice),
            b.by.get(name).map_or(&[][..], Vec::as_slice),
        );
        if ba.is_empty() && bb.is_empty() {
            continue;
        }
        writeln!(w, "{name}").unwrap();
        // Buckets in A's order, then those only B has.
        let mut labels: Vec<&str> = ba.iter().map(|x| x.bucket.as_str()).collect();
        for x in bb {
            if !labels.contains(&x.bucket.as_str()) {
                labels.push(&x.bucket);
            }
        }
        for label in labels {
            let find = |v: &[Bucket]| v.iter().find(|x| x.bucket == label).cloned();
            row(
                w,
                &format!("  {label}"),
                &side(find(ba).as_ref()),
                &side(find(bb).as_ref()),
            );
        }
    }
    paired_section(w, a, b);
    writeln!(w, "\n{:<34}{:>8}{:>8}", "misses", "A", "B").unwrap();
    let (ma, mb) = (&a.misses, &b.misses);
    for (label, x, y) in [
        ("wrong answers", ma.n, mb.n),
        ("  more lines than expected", ma.longer, mb.longer),
        ("  fewer lines than expected", ma.shorter, mb.shorter),
        ("  as many lines as expected", ma.same_lines, mb.same_lines),
        ("  ended on end-of-turn", ma.stopped, mb.stopped),
        ("  cut at the token limit", ma.cut, mb.cut),
    ] {
        writeln!(w, "{label:<34}{x:>8}{y:>8}").unwrap();
    }
    writeln!(
        w,
        "{:<34}{:>8.2}{:>8.2}",
        "  first wrong line (mean)", ma.first_wrong_line_mean, mb.first_wrong_line_mean
    )
    .unwrap();
    if most > 1 {
        writeln!(w, "\n{:<34}{:>12}{:>12}", "turns", "A", "B").unwrap();
        let values = |r: &Report| {
            r.turns.as_ref().map(|t: &Turns| {
                [
                    t.retries.to_string(),
                    t.unchanged_retries.to_string(),
                    format!("{:.1}%", 100.0 * t.unchanged_share),
                    t.feedback.clone(),
                ]
            })
        };
        let (va, vb) = (values(a), values(b));
        let labels = [
            "retries",
            "  same answer as the turn before",
            "  share",
            "feedback",
        ];
        for (k, label) in labels.iter().enumerate() {
            let cell =
                |v: &Option<[String; 4]>| v.as_ref().map_or("-", |v| v[k].as_str()).to_owned();
            writeln!(w, "{label:<34}{:>12}{:>12}", cell(&va), cell(&vb)).unwrap();
        }
    }
    out
}
