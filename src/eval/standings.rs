//! `trace-train compare A.json B.json ...`: the models of several
//! `eval --environment` reports side by side, environment by environment
//! (accuracy with its interval, mean score), then who dominates whom by
//! each of the three rules of [`super::dominance`] and each rule's Pareto
//! frontier. The reports are taken in the order given: earlier is the
//! incumbent.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::dominance::{self, EnvScore, Rule, Verdict};
use super::envs::EnvsReport;

/// One model's row in one environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub n: usize,
    pub accuracy: f64,
    pub mean_score: f64,
    /// The Beta rule's interval of the mean score, at the comparison's level.
    pub lo: f64,
    pub hi: f64,
}

/// One model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// As the user named it (the report's file).
    pub name: String,
    /// The model the report evaluated, `MODEL + ADAPTER` where an adapter
    /// was applied to it.
    pub model: String,
    /// In [`Standings::environments`] order.
    pub cells: Vec<Cell>,
    pub weighted_mean_score: f64,
}

/// The comparison: what `compare --output` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Standings {
    /// The environments every report has, in the first report's order.
    pub environments: Vec<String>,
    /// Environments some report lacks (left out of the comparison).
    pub left_out: Vec<String>,
    /// The interval level of the table and of the Beta rule.
    pub level: f64,
    /// In the order given (earlier first).
    pub models: Vec<Entry>,
    /// Pareto, Beta, threshold.
    pub verdicts: Vec<Verdict>,
}

impl Standings {
    /// Compares `reports` (named), earlier first.
    pub fn new(reports: &[(String, EnvsReport)], level: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            reports.len() >= 2,
            "compare needs at least two reports, got {}",
            reports.len()
        );
        anyhow::ensure!(
            level > 0.0 && level < 1.0,
            "--level {level} is not in (0, 1)"
        );
        let names = |r: &EnvsReport| -> Vec<String> {
            r.environments
                .iter()
                .map(|e| e.metrics.environment.clone())
                .collect()
        };
        let first = names(&reports[0].1);
        let mut all: Vec<String> = Vec::new();
        for (_, r) in reports {
            for n in names(r) {
                if !all.contains(&n) {
                    all.push(n);
                }
            }
        }
        let environments: Vec<String> = first
            .into_iter()
            .filter(|e| reports.iter().all(|(_, r)| names(r).contains(e)))
            .collect();
        anyhow::ensure!(
            !environments.is_empty(),
            "the reports share no environment: {}\nhint: evaluate every model on the same `--environment` list",
            reports
                .iter()
                .map(|(n, r)| format!("`{n}` has {}", names(r).join("+")))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let left_out = all
            .into_iter()
            .filter(|e| !environments.contains(e))
            .collect();
        let models: Vec<Entry> = reports
            .iter()
            .map(|(name, r)| {
                let cells = environments
                    .iter()
                    .map(|e| {
                        let m = &r
                            .environments
                            .iter()
                            .find(|s| &s.metrics.environment == e)
                            .expect("filtered above")
                            .metrics;
                        let (lo, hi) = dominance::beta_interval(m.score_sum, m.n, level);
                        Cell {
                            n: m.n,
                            accuracy: m.accuracy,
                            mean_score: m.mean_score,
                            lo,
                            hi,
                        }
                    })
                    .collect();
                Entry {
                    name: name.clone(),
                    model: match &r.adapter {
                        Some(a) => format!("{} + {a}", r.model),
                        None => r.model.clone(),
                    },
                    cells,
                    weighted_mean_score: r.aggregate.weighted_mean_score,
                }
            })
            .collect();
        let scores: Vec<Vec<EnvScore>> = models
            .iter()
            .map(|m| {
                m.cells
                    .iter()
                    .map(|c| EnvScore {
                        n: c.n,
                        sum: c.mean_score * c.n as f64,
                    })
                    .collect()
            })
            .collect();
        let verdicts = [Rule::Pareto, Rule::Beta { level }, Rule::Threshold]
            .into_iter()
            .map(|rule| dominance::verdict(rule, &scores))
            .collect();
        Ok(Self {
            environments,
            left_out,
            level,
            models,
            verdicts,
        })
    }

    /// The verdict of the rule named `name`.
    pub fn verdict(&self, name: &str) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.rule.name() == name)
    }

    /// The table and the verdicts, for the terminal.
    pub fn text(&self) -> String {
        let mut w = String::new();
        let label = |i: usize| {
            format!(
                "{} {}",
                (b'A' + (i % 26) as u8) as char,
                self.models[i].name
            )
        };
        for (i, _) in self.models.iter().enumerate() {
            writeln!(w, "{}", label(i)).unwrap();
        }
        writeln!(
            w,
            "\nper environment: n, accuracy, mean score with its {:.0}% Jeffreys interval (models in the order given; earlier is the incumbent)",
            100.0 * self.level
        )
        .unwrap();
        for (e, env) in self.environments.iter().enumerate() {
            writeln!(w, "{env}").unwrap();
            for (i, m) in self.models.iter().enumerate() {
                let c = &m.cells[e];
                writeln!(
                    w,
                    "  {}  {:>6}  {:>6.1}%  {:.3} [{:.3}, {:.3}]",
                    (b'A' + (i % 26) as u8) as char,
                    c.n,
                    100.0 * c.accuracy,
                    c.mean_score,
                    c.lo,
                    c.hi
                )
                .unwrap();
            }
        }
        if !self.left_out.is_empty() {
            writeln!(
                w,
                "left out (not in every report): {}",
                self.left_out.join(", ")
            )
            .unwrap();
        }
        let letter = |i: usize| ((b'A' + (i % 26) as u8) as char).to_string();
        for v in &self.verdicts {
            let rule = match v.rule {
                Rule::Pareto => "pareto (epsilon-Pareto)".to_owned(),
                Rule::Beta { level } => format!("beta (Jeffreys duel at {level})"),
                Rule::Threshold => {
                    "threshold (t(p) = min(p + min(max(0.2(1-p), 0.02), 0.1), 1))".to_owned()
                }
            };
            let pairs: Vec<String> = v
                .dominates
                .iter()
                .map(|&(a, b)| format!("{} > {}", letter(a), letter(b)))
                .collect();
            writeln!(
                w,
                "\n{rule}\n  dominates: {}\n  frontier:  {}",
                if pairs.is_empty() {
                    "none".to_owned()
                } else {
                    pairs.join(", ")
                },
                v.frontier
                    .iter()
                    .map(|&i| letter(i))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
            .unwrap();
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::envs::EnvPrediction;

    fn report(model: &str, envs: &[(&str, usize, usize)]) -> EnvsReport {
        let envs = envs
            .iter()
            .map(|&(name, n, right)| {
                let preds = (0..n)
                    .map(|i| EnvPrediction {
                        task_id: i as u64,
                        own_id: None,
                        completion: String::new(),
                        score: Some(if i < right { 1.0 } else { 0.0 }),
                        masked: None,
                        stopped: true,
                        earlier: Vec::new(),
                        success: None,
                    })
                    .collect();
                (name.to_owned(), preds)
            })
            .collect();
        EnvsReport::new(model, envs, None, 0.8).unwrap()
    }

    /// Two evals of one model, one with a step's adapter: the report keeps
    /// the adapter (and leaves the key out without one), and the standings
    /// tell the two apart.
    #[test]
    fn an_adapter_is_named_beside_its_model() {
        let mut with = report("bc/merged", &[("babyai", 10, 9)]);
        with.adapter = Some("grpo/step_5/adapter".to_owned());
        let without = report("bc/merged", &[("babyai", 10, 7)]);
        let back: EnvsReport =
            serde_json::from_str(&serde_json::to_string(&with).unwrap()).unwrap();
        assert_eq!(back.adapter.as_deref(), Some("grpo/step_5/adapter"));
        assert!(!serde_json::to_string(&without).unwrap().contains("adapter"));
        let s = Standings::new(
            &[
                ("bc.json".to_owned(), without),
                ("grpo.json".to_owned(), with),
            ],
            0.8,
        )
        .unwrap();
        assert_eq!(s.models[0].model, "bc/merged");
        assert_eq!(s.models[1].model, "bc/merged + grpo/step_5/adapter");
    }

    #[test]
    fn standings_of_three_models() {
        let reports = vec![
            (
                "a.json".to_owned(),
                report("a", &[("sat", 400, 360), ("abd", 400, 100), ("ded", 10, 1)]),
            ),
            (
                "b.json".to_owned(),
                report("b", &[("abd", 400, 360), ("sat", 400, 100)]),
            ),
            (
                "c.json".to_owned(),
                report("c", &[("sat", 400, 80), ("abd", 400, 80)]),
            ),
        ];
        let s = Standings::new(&reports, 0.9).unwrap();
        assert_eq!(s.environments, ["sat", "abd"]);
        assert_eq!(s.left_out, ["ded"]);
        // B's columns follow A's environment order.
        assert_eq!(s.models[1].cells[0].accuracy, 0.25);
        for v in &s.verdicts {
            assert_eq!(v.frontier, [0, 1], "{:?}", v.rule);
            assert!(v.dominates.contains(&(0, 2)) && v.dominates.contains(&(1, 2)));
        }
        let text = s.text();
        assert!(text.contains("A > C, B > C"), "{text}");
        assert!(
            text.contains("left out (not in every report): ded"),
            "{text}"
        );
        // The interval is the Beta rule's, at the comparison's level.
        let (lo, hi) = dominance::beta_interval(360.0, 400, 0.9);
        assert_eq!((s.models[0].cells[0].lo, s.models[0].cells[0].hi), (lo, hi));
        assert!(Standings::new(&reports[..1], 0.9).is_err());
        let none = vec![
            reports[0].clone(),
            ("d".to_owned(), report("d", &[("trace", 1, 1)])),
        ];
        assert!(
            format!("{:#}", Standings::new(&none, 0.9).unwrap_err())
                .contains("share no environment")
        );
    }
}
