//! The pipeline's gate between stages: each training stage's model is
//! evaluated on the gate's held-out sets and compared with the model it
//! started from (the base model before Stage 1), set by set.
//!
//! The rule, for one set, with the before and after exact match and their
//! Jeffreys intervals (80% by default, [`super::DEFAULT_LEVEL`]):
//!
//! - the set **fell** when the new exact match is below the lower end of the
//!   previous model's interval AND the previous exact match is above the
//!   upper end of the new model's interval;
//! - it **rose** in the mirror case (new above the previous upper end AND
//!   previous below the new lower end);
//! - otherwise it is **within** the intervals: no change the sample size
//!   can tell apart.
//!
//! Both conditions, not one: each point estimate must lie outside the other
//! model's interval, so a change counts only when it is beyond the noise
//! of either side (when the two sets have different sizes, the smaller
//! one's wider interval decides). With one condition a change half the
//! width of the smaller side's interval could be called.
//!
//! What the gate does with the verdicts is its [`GateMode`]; everything here is
//! pure (scores in, verdicts, a decision and a table out), so it is tested
//! on fixed numbers; `cli::pipeline` evaluates the models and acts.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::{Report, jeffreys_interval};
use crate::config::GateMode;

/// One model's exact match on one set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Score {
    pub n: usize,
    pub correct: usize,
    /// `correct / n` (0 when `n` is 0).
    pub accuracy: f64,
    /// The interval's level and ends.
    pub level: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Score {
    /// `correct` of `n` with its `level` Jeffreys interval.
    pub fn new(correct: usize, n: usize, level: f64) -> Self {
        let (lo, hi) = jeffreys_interval(correct as u64, n as u64, level);
        Self {
            n,
            correct,
            accuracy: if n == 0 {
                0.0
            } else {
                correct as f64 / n as f64
            },
            level,
            lo,
            hi,
        }
    }

    /// The totals of an eval report.
    pub fn of(r: &Report) -> Self {
        Self {
            n: r.n,
            correct: r.correct,
            accuracy: r.accuracy,
            level: r.interval.level,
            lo: r.interval.lo,
            hi: r.interval.hi,
        }
    }
}

/// How one set moved from one model to the next (the rule is the module's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Fell,
    Rose,
    Within,
}

/// The module's rule applied to `before` and `after`.
pub fn verdict(before: &Score, after: &Score) -> Verdict {
    if after.accuracy < before.lo && before.accuracy > after.hi {
        Verdict::Fell
    } else if after.accuracy > before.hi && before.accuracy < after.lo {
        Verdict::Rose
    } else {
        Verdict::Within
    }
}

/// Where a gated model sits in the pipeline: its stage (0 for the base
/// model) and, for DPO's rounds, the round. Ordered as the pipeline makes
/// them: a stage before its rounds, round 0 before round 1.
pub type Place = (u8, Option<usize>);

/// A gated model: a stage's (0 for the base model; each DPO round its own)
/// and its score on each of the gate's sets, in the gate's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageScores {
    pub stage: u8,
    /// `base`, `warmup`, `sft`, `ppo`, `dpo`.
    pub name: String,
    /// The DPO round whose model this is; none for a whole stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<usize>,
    pub model: String,
    pub sets: Vec<(String, Score)>,
}

impl StageScores {
    pub fn place(&self) -> Place {
        (self.stage, self.round)
    }

    /// The unweighted mean exact match over the sets (each set counts
    /// once, whatever its size); 0 without sets.
    pub fn mean_accuracy(&self) -> f64 {
        if self.sets.is_empty() {
            0.0
        } else {
            self.sets.iter().map(|(_, s)| s.accuracy).sum::<f64>() / self.sets.len() as f64
        }
    }

    fn label(&self) -> String {
        label(self.stage, &self.name, self.round)
    }
}

/// `base`, `stage 2 (sft)`, `stage 3 (dpo r1)`.
fn label(stage: u8, name: &str, round: Option<usize>) -> String {
    match (stage, round) {
        (0, _) => name.to_owned(),
        (_, Some(r)) => format!("stage {stage} ({name} r{r})"),
        (_, None) => format!("stage {stage} ({name})"),
    }
}

/// One set of one comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetChange {
    pub set: String,
    pub before: Score,
    pub after: Score,
    /// After minus before, in points of exact match.
    pub change_points: f64,
    pub verdict: Verdict,
    /// The set item by item, when both models' reports were read: what
    /// the verdict does not use but a reader should (two models on one set
    /// share its items; see [`super::paired`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<ItemChange>,
}

/// A set's items that only the model after got right (`gained`), that only
/// the model before got right (`lost`), and the exact McNemar p-value of
/// that split.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ItemChange {
    pub gained: usize,
    pub lost: usize,
    pub p_value: f64,
}

impl ItemChange {
    /// `after` against `before`, item by item.
    pub fn of(before: &super::Report, after: &super::Report) -> Result<Self, String> {
        super::paired::paired(before, after).map(|p| ItemChange {
            gained: p.b_only,
            lost: p.a_only,
            p_value: p.p_value,
        })
    }
}

/// A stage's model against the model it started from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub stage: u8,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<usize>,
    /// The stage it is compared with (0: the base model).
    pub against: u8,
    /// The round of `against` it is compared with (a DPO round after the
    /// first is compared with the round before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub against_round: Option<usize>,
    /// The name of `against` (`sft`, `dpo`; empty in records written
    /// before it was kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub against_name: String,
    pub sets: Vec<SetChange>,
}

impl Comparison {
    pub fn place(&self) -> Place {
        (self.stage, self.round)
    }

    /// The sets that fell, in order.
    pub fn fell(&self) -> Vec<&SetChange> {
        self.sets
            .iter()
            .filter(|c| c.verdict == Verdict::Fell)
            .collect()
    }
}

/// Compares `after` with `before` set by set. Both must hold the same sets
/// in the same order (the gate evaluates every model on the same sets);
/// anything else is an error naming the difference.
pub fn compare(before: &StageScores, after: &StageScores) -> anyhow::Result<Comparison> {
    let names = |s: &StageScores| s.sets.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    anyhow::ensure!(
        names(before) == names(after),
        "the gate's sets differ between {} ({:?}) and {} ({:?})\nhint: the gate's sets changed between runs; rerun without --resume, or restore the gate section",
        before.label(),
        names(before),
        after.label(),
        names(after)
    );
    let sets = before
        .sets
        .iter()
        .zip(&after.sets)
        .map(|((set, b), (_, a))| SetChange {
            set: set.clone(),
            before: *b,
            after: *a,
            change_points: 100.0 * (a.accuracy - b.accuracy),
            verdict: verdict(b, a),
            items: None,
        })
        .collect();
    Ok(Comparison {
        stage: after.stage,
        name: after.name.clone(),
        round: after.round,
        against: before.stage,
        against_round: before.round,
        against_name: before.name.clone(),
        sets,
    })
}

/// What the pipeline does after a comparison.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing fell, or the mode lets the pipeline go on regardless.
    Continue,
    /// Warn mode and a set fell: print the warning, go on.
    Warn(String),
    /// Stop mode and a set fell: the error to stop with.
    Stop(String),
}

/// The action `mode` takes on `c`. The messages name the stage, every set
/// that fell and its numbers; the stop message ends with a hint.
pub fn decide(mode: GateMode, c: &Comparison) -> Action {
    let fell = c.fell();
    if fell.is_empty() {
        return Action::Continue;
    }
    let what = fell
        .iter()
        .map(|f| {
            format!(
                "`{}` fell from {:.1}% [{:.1}, {:.1}] to {:.1}% [{:.1}, {:.1}] ({} items)",
                f.set,
                100.0 * f.before.accuracy,
                100.0 * f.before.lo,
                100.0 * f.before.hi,
                100.0 * f.after.accuracy,
                100.0 * f.after.lo,
                100.0 * f.after.hi,
                f.after.n
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let against = match (c.against, c.against_round) {
        (0, _) => "the base model".to_owned(),
        (s, r) if !c.against_name.is_empty() => label(s, &c.against_name, r),
        (s, Some(r)) => format!("stage {s} round {r}"),
        (s, None) => format!("stage {s}"),
    };
    let head = format!(
        "gate: {} made the model worse than {against}: {what}",
        label(c.stage, &c.name, c.round)
    );
    match mode {
        GateMode::Off | GateMode::KeepBest => Action::Continue,
        GateMode::Warn => Action::Warn(format!("warning: {head}")),
        GateMode::Stop => Action::Stop(format!(
            "{head}; the pipeline stopped (gate.mode `stop`)\nhint: to go on with this model, set gate.mode to `warn` and run again with --resume (finished stages are kept); or change the stage's recipe (learning rate, epochs, data) and rerun it with --start_stage {}",
            c.stage
        )),
    }
}

/// The best of the gated models: the highest [`StageScores::mean_accuracy`]
/// (each set weighted alike); a tie goes to the earlier stage or round
/// (fewer training steps away from the base model). `None` without models.
pub fn best(stages: &[StageScores]) -> Option<&StageScores> {
    stages.iter().min_by_key(|s| s.place()).map(|first| {
        stages.iter().fold(first, |b, s| {
            let (ms, mb) = (s.mean_accuracy(), b.mean_accuracy());
            if ms > mb || (ms == mb && s.place() < b.place()) {
                s
            } else {
                b
            }
        })
    })
}

/// What `gate.json` holds: the mode, the rule, every gated model's scores,
/// each stage's comparison with the model before it, and with keep_best
/// the model the pipeline kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub mode: GateMode,
    pub rule: String,
    pub stages: Vec<StageScores>,
    pub comparisons: Vec<Comparison>,
    /// keep_best: the stage whose model the pipeline reports as final.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<u8>,
    /// keep_best: the DPO round of `kept`, when the model kept is a round's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_round: Option<usize>,
}

/// The rule as the report states it.
pub const RULE: &str = "a set fell when the new exact match is below the lower end of the previous model's interval and the previous exact match is above the upper end of the new one's; rose in the mirror case; otherwise within";

impl GateReport {
    pub fn new(mode: GateMode) -> Self {
        Self {
            mode,
            rule: RULE.to_owned(),
            stages: Vec::new(),
            comparisons: Vec::new(),
            kept: None,
            kept_round: None,
        }
    }

    /// Records a model's scores, replacing an earlier record of its place
    /// (stage and round), and keeps the places in order.
    pub fn add_stage(&mut self, s: StageScores) {
        self.stages.retain(|x| x.place() != s.place());
        self.stages.push(s);
        self.stages.sort_by_key(|x| x.place());
    }

    /// Records a comparison, replacing an earlier one of its place.
    pub fn add_comparison(&mut self, c: Comparison) {
        self.comparisons.retain(|x| x.place() != c.place());
        self.comparisons.push(c);
        self.comparisons.sort_by_key(|x| x.place());
    }

    /// The gated models' best ([`best`]).
    pub fn best(&self) -> Option<&StageScores> {
        best(&self.stages)
    }

    /// The table printed after each stage and at the end: every gated
    /// model's exact match a set with its interval, the change from the
    /// model before it and the verdict, then the mean over the sets.
    pub fn table(&self) -> String {
        self.table_of(|_| true)
    }

    /// [`Self::table`] with only the models `keep` accepts.
    pub fn table_of(&self, keep: impl Fn(&StageScores) -> bool) -> String {
        let mut out = String::new();
        let w = &mut out;
        let level = self
            .stages
            .iter()
            .flat_map(|s| s.sets.iter().map(|(_, x)| x.level))
            .next()
            .unwrap_or(super::DEFAULT_LEVEL);
        writeln!(
            w,
            "gate ({}): exact match with its {:.0}% interval; change from the model before, in points;\nitems: gained and lost against the model before, item by item, with the exact McNemar p",
            serde_json::to_value(self.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            100.0 * level
        )
        .unwrap();
        writeln!(
            w,
            "{:<18} {:<24} {:>5} {:>7} {:>14} {:>8}  verdict",
            "model", "set", "n", "acc", "interval", "change"
        )
        .unwrap();
        for s in self.stages.iter().filter(|s| keep(s)) {
            let cmp = self.comparisons.iter().find(|c| c.place() == s.place());
            for (i, (set, x)) in s.sets.iter().enumerate() {
                let change = cmp.and_then(|c| c.sets.iter().find(|c| &c.set == set));
                let (delta, verdict, items) = match change {
                    Some(c) => (
                        format!("{:>+8.1}", c.change_points),
                        match c.verdict {
                            Verdict::Fell => "FELL",
                            Verdict::Rose => "rose",
                            Verdict::Within => "within",
                        },
                        c.items.map_or_else(String::new, |i| {
                            format!("items +{} -{}, p {:.3}", i.gained, i.lost, i.p_value)
                        }),
                    ),
                    None => (format!("{:>8}", ""), "", String::new()),
                };
                let line = format!(
                    "{:<18} {:<24} {:>5} {:>6.1}% [{:>5.1}, {:>5.1}] {delta}  {verdict:<7} {items}",
                    if i == 0 { s.label() } else { String::new() },
                    set,
                    x.n,
                    100.0 * x.accuracy,
                    100.0 * x.lo,
                    100.0 * x.hi,
                );
                writeln!(w, "{}", line.trim_end()).unwrap();
            }
            writeln!(
                w,
                "{:<18} {:<24} {:>5} {:>6.1}%",
                "",
                "mean over sets",
                "",
                100.0 * s.mean_accuracy()
            )
            .unwrap();
        }
        if let Some(k) = self.kept.and_then(|k| {
            self.stages
                .iter()
                .find(|s| s.place() == (k, self.kept_round))
        }) {
            writeln!(
                w,
                "keep_best: the final model is {}'s (`{}`): the highest mean exact match over the gate's sets ({:.1}%), ties to the earlier stage",
                k.label(),
                k.model,
                100.0 * k.mean_accuracy()
            )
            .unwrap();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::buckets::Difficulty;
    use crate::eval::{DEFAULT_LEVEL, EvalItem, Prediction};

    fn score(correct: usize, n: usize) -> Score {
        Score::new(correct, n, DEFAULT_LEVEL)
    }

    fn stage(stage: u8, name: &str, sets: &[(&str, usize, usize)]) -> StageScores {
        StageScores {
            stage,
            name: name.into(),
            round: None,
            model: format!("models/{name}"),
            sets: sets
                .iter()
                .map(|&(s, c, n)| (s.to_owned(), score(c, n)))
                .collect(),
        }
    }

    /// A fixed eval report: `correct` right answers of `n`.
    fn report(correct: usize, n: usize) -> Report {
        let preds = (0..n)
            .map(|i| {
                let item = EvalItem {
                    id: format!("p{i}"),
                    prompt: "print(1)".into(),
                    expected: "1".into(),
                    difficulty: Difficulty::default(),
                };
                let answer = if i < correct { "1" } else { "2" };
                Prediction::new(&item, answer.into(), true)
            })
            .collect();
        Report::new(preds, DEFAULT_LEVEL)
    }

    #[test]
    fn scores_of_a_report_are_its_totals_and_interval() {
        let r = report(30, 100);
        let s = Score::of(&r);
        assert_eq!((s.n, s.correct), (100, 30));
        assert!((s.accuracy - 0.3).abs() < 1e-12);
        assert_eq!(s, score(30, 100));
        assert!(s.lo < 0.3 && 0.3 < s.hi);
    }

    /// Items p0..p29 right before; p0..p39 right after: 10 gained, none
    /// lost; then a model right on p20..p59 instead: 30 gained, 20 lost.
    #[test]
    fn item_changes_count_the_items_each_model_alone_got_right() {
        let before = report(30, 100);
        let i = ItemChange::of(&before, &report(40, 100)).unwrap();
        assert_eq!((i.gained, i.lost), (10, 0));
        assert!((i.p_value - 2.0 / 1024.0).abs() < 1e-12, "{}", i.p_value);
        let mut shifted = report(40, 100);
        for (k, p) in shifted.predictions.iter_mut().enumerate() {
            p.score = if (20..60).contains(&k) { 1.0 } else { 0.0 };
        }
        let i = ItemChange::of(&before, &shifted).unwrap();
        assert_eq!((i.gained, i.lost), (30, 20));
        assert_eq!(i.p_value, super::super::paired::exact_mcnemar_p(20, 30));
    }

    #[test]
    fn fell_rose_and_within_follow_the_rule() {
        // 50/100 has the 80% interval [0.436, 0.564].
        let before = Score::of(&report(50, 100));
        assert_eq!(
            verdict(&before, &Score::of(&report(30, 100))),
            Verdict::Fell
        );
        assert_eq!(
            verdict(&before, &Score::of(&report(70, 100))),
            Verdict::Rose
        );
        // Inside the previous interval: no change either way.
        for c in [45, 50, 55] {
            assert_eq!(
                verdict(&before, &Score::of(&report(c, 100))),
                Verdict::Within,
                "{c}"
            );
        }
        // At the edge: 43/100 is below 50/100's lower end (0.436) and its
        // own interval, about [0.367, 0.494], ends below 50%: both hold, it
        // fell. 44/100 is inside 50/100's interval: within.
        let a43 = score(43, 100);
        assert!(
            a43.accuracy < before.lo && before.accuracy > a43.hi,
            "{a43:?}"
        );
        assert_eq!(verdict(&before, &a43), Verdict::Fell);
        assert_eq!(verdict(&before, &score(44, 100)), Verdict::Within);
        // One condition is not enough: 3/10 (0.3) is below 0.436, but 50%
        // is inside 3/10's wide interval [0.151, 0.502]: within.
        let small = score(3, 10);
        assert!(small.accuracy < before.lo);
        assert!(before.accuracy <= small.hi);
        assert_eq!(verdict(&before, &small), Verdict::Within);
        // The rule is symmetric: what fell one way rose the other.
        assert_eq!(verdict(&score(30, 100), &before), Verdict::Rose);
    }

    #[test]
    fn comparisons_name_every_set_and_refuse_different_sets() {
        let base = stage(0, "base", &[("heldout_short", 50, 100), ("test", 20, 200)]);
        let s1 = stage(
            1,
            "warmup",
            &[("heldout_short", 25, 100), ("test", 60, 200)],
        );
        let c = compare(&base, &s1).unwrap();
        assert_eq!((c.stage, c.against), (1, 0));
        assert_eq!(
            c.sets.iter().map(|x| x.verdict).collect::<Vec<_>>(),
            [Verdict::Fell, Verdict::Rose]
        );
        assert!((c.sets[0].change_points + 25.0).abs() < 1e-9);
        let other = stage(2, "sft", &[("heldout_short", 25, 100)]);
        let err = compare(&s1, &other).unwrap_err().to_string();
        assert!(
            err.contains("sets differ") && err.contains("hint:"),
            "{err}"
        );
    }

    #[test]
    fn warn_names_the_set_and_numbers_and_goes_on() {
        let c = compare(
            &stage(0, "base", &[("heldout_short", 50, 100), ("test", 20, 200)]),
            &stage(
                1,
                "warmup",
                &[("heldout_short", 25, 100), ("test", 21, 200)],
            ),
        )
        .unwrap();
        let Action::Warn(m) = decide(GateMode::Warn, &c) else {
            panic!("warn mode warns")
        };
        for want in [
            "stage 1 (warmup)",
            "`heldout_short`",
            "50.0%",
            "25.0%",
            "base model",
        ] {
            assert!(m.contains(want), "{want}: {m}");
        }
        // `test` stayed within its interval: not named.
        assert!(!m.contains("`test`"), "{m}");
    }

    #[test]
    fn stop_fails_with_stage_set_and_hint() {
        let c = compare(
            &stage(1, "warmup", &[("heldout_short", 50, 100)]),
            &stage(2, "sft", &[("heldout_short", 30, 100)]),
        )
        .unwrap();
        let Action::Stop(m) = decide(GateMode::Stop, &c) else {
            panic!("stop mode stops")
        };
        for want in [
            "stage 2 (sft)",
            "than stage 1",
            "`heldout_short`",
            "hint:",
            "--resume",
            "--start_stage 2",
        ] {
            assert!(m.contains(want), "{want}: {m}");
        }
    }

    #[test]
    fn nothing_fell_means_every_mode_goes_on() {
        // A rise and a change within the interval.
        let c = compare(
            &stage(0, "base", &[("a", 50, 100), ("b", 50, 100)]),
            &stage(1, "warmup", &[("a", 80, 100), ("b", 46, 100)]),
        )
        .unwrap();
        assert!(c.fell().is_empty());
        for mode in [
            GateMode::Off,
            GateMode::Warn,
            GateMode::Stop,
            GateMode::KeepBest,
        ] {
            assert_eq!(decide(mode, &c), Action::Continue, "{mode:?}");
        }
        // keep_best and off never stop, even when a set fell.
        let fell = compare(
            &stage(0, "base", &[("a", 50, 100)]),
            &stage(1, "warmup", &[("a", 10, 100)]),
        )
        .unwrap();
        assert_eq!(decide(GateMode::KeepBest, &fell), Action::Continue);
        assert_eq!(decide(GateMode::Off, &fell), Action::Continue);
    }

    #[test]
    fn keep_best_takes_the_highest_mean_and_ties_go_earlier() {
        let stages = vec![
            stage(0, "base", &[("a", 40, 100), ("b", 10, 100)]),
            // Mean 0.35: best so far.
            stage(1, "warmup", &[("a", 30, 100), ("b", 40, 100)]),
            // Mean 0.35 as well: the tie goes to stage 1.
            stage(2, "sft", &[("a", 40, 100), ("b", 30, 100)]),
            // Mean 0.30.
            stage(3, "ppo", &[("a", 50, 100), ("b", 10, 100)]),
        ];
        assert_eq!(best(&stages).unwrap().stage, 1);
        // Order of the list does not matter.
        let mut rev = stages.clone();
        rev.reverse();
        assert_eq!(best(&rev).unwrap().stage, 1);
        // Each set weighs alike, whatever its size.
        let sized = vec![
            stage(0, "base", &[("big", 500, 1000), ("small", 0, 10)]),
            stage(1, "warmup", &[("big", 400, 1000), ("small", 5, 10)]),
        ];
        assert_eq!(best(&sized).unwrap().stage, 1);
        assert!(best(&[]).is_none());

        let mut g = GateReport::new(GateMode::KeepBest);
        for s in stages {
            g.add_stage(s);
        }
        g.kept = g.best().map(|b| b.stage);
        let t = g.table();
        assert!(
            t.contains("keep_best: the final model is stage 1 (warmup)'s (`models/warmup`)"),
            "{t}"
        );
    }

    /// DPO's rounds are gated one by one: each its own place after its
    /// stage, compared with the round before it, and keep_best may keep one.
    #[test]
    fn dpo_rounds_are_places_of_their_own() {
        let round = |r: usize, correct: usize| StageScores {
            round: Some(r),
            model: format!("models/dpo/round_{r}"),
            ..stage(3, "dpo", &[("a", correct, 100)])
        };
        let s2 = stage(2, "sft", &[("a", 30, 100)]);
        let mut g = GateReport::new(GateMode::Stop);
        // Recorded out of order: kept in the pipeline's order, and a round
        // does not replace another.
        for s in [round(1, 10), s2.clone(), round(0, 45)] {
            g.add_stage(s);
        }
        let places: Vec<_> = g.stages.iter().map(|s| s.place()).collect();
        assert_eq!(places, [(2, None), (3, Some(0)), (3, Some(1))]);
        // Round 1 against round 0: it fell, and the message says so.
        let c = compare(&round(0, 45), &round(1, 10)).unwrap();
        assert_eq!(
            (c.place(), c.against, c.against_round),
            ((3, Some(1)), 3, Some(0))
        );
        let Action::Stop(m) = decide(GateMode::Stop, &c) else {
            panic!("stop mode stops")
        };
        assert!(
            m.contains("stage 3 (dpo r1) made the model worse than stage 3 (dpo r0)"),
            "{m}"
        );
        g.add_comparison(compare(&s2, &round(0, 45)).unwrap());
        g.add_comparison(c);
        assert_eq!(g.comparisons.len(), 2);
        // keep_best keeps the best round; a tie goes to the earlier one.
        let b = g.best().unwrap();
        assert_eq!(b.place(), (3, Some(0)));
        g.add_stage(round(1, 45));
        assert_eq!(g.best().unwrap().place(), (3, Some(0)));
        g.kept = Some(3);
        g.kept_round = Some(0);
        let t = g.table();
        assert!(
            t.contains("stage 3 (dpo r0)") && t.contains("stage 3 (dpo r1)"),
            "{t}"
        );
        assert!(
            t.contains("keep_best: the final model is stage 3 (dpo r0)'s (`models/dpo/round_0`)"),
            "{t}"
        );
        // A report of an older version (no rounds) still reads.
        let old = r#"{"mode": "warn", "rule": "r", "stages": [{"stage": 2, "name": "sft", "model": "m",
            "sets": []}], "comparisons": [{"stage": 2, "name": "sft", "against": 1, "sets": []}]}"#;
        let g: GateReport = serde_json::from_str(old).unwrap();
        assert_eq!(
            (g.stages[0].round, g.comparisons[0].against_round),
            (None, None)
        );
    }

    #[test]
    fn the_table_shows_every_model_set_change_and_verdict() {
        let base = stage(0, "base", &[("heldout_short", 50, 100), ("test", 20, 200)]);
        let s1 = stage(
            1,
            "warmup",
            &[("heldout_short", 25, 100), ("test", 60, 200)],
        );
        let mut g = GateReport::new(GateMode::Warn);
        let mut c = compare(&base, &s1).unwrap();
        assert!(
            c.sets.iter().all(|x| x.items.is_none()),
            "scores hold no items"
        );
        c.sets[1].items = Some(ItemChange {
            gained: 45,
            lost: 5,
            p_value: 1e-9,
        });
        g.add_comparison(c);
        g.add_stage(s1.clone());
        g.add_stage(base);
        // A re-evaluated stage replaces its record.
        g.add_stage(s1);
        assert_eq!(g.stages.iter().map(|s| s.stage).collect::<Vec<_>>(), [0, 1]);
        let t = g.table();
        assert!(
            t.starts_with("gate (warn): exact match with its 80% interval"),
            "{t}"
        );
        for want in [
            "base",
            "stage 1 (warmup)",
            "heldout_short",
            "  25.0% [",
            "-25.0  FELL",
            "+20.0  rose    items +45 -5, p 0.000",
            "mean over sets",
        ] {
            assert!(t.contains(want), "{want}: {t}");
        }
        // The report reads back from its JSON (serde_json's parser may be
        // one unit in the last place off on a float).
        let back: GateReport = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
        assert_eq!(back.comparisons[0].sets[0].verdict, Verdict::Fell);
        assert_eq!(back.comparisons[0].sets[1].verdict, Verdict::Rose);
        assert_eq!(back.comparisons[0].sets[0].items, None);
        assert_eq!(
            back.comparisons[0].sets[1]
                .items
                .map(|i| (i.gained, i.lost)),
            Some((45, 5))
        );
        assert_eq!(back.stages[1].sets[1].1.correct, 60);
        assert!((back.stages[0].sets[0].1.lo - g.stages[0].sets[0].1.lo).abs() < 1e-12);
        assert_eq!(back.table(), t);
    }

    #[test]
    fn modes_parse_from_the_configs_spelling() {
        for name in GateMode::NAMES {
            let m = GateMode::parse(name).unwrap();
            assert_eq!(serde_json::to_value(m).unwrap(), name);
        }
        assert_eq!(GateMode::parse("halt"), None);
    }
}
