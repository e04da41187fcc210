//! Eval over several environments (`eval --environment sat+abd+ded`): the
//! scored completions of each environment's tasks, its metrics (accuracy
//! with its Jeffreys interval, mean score, standard deviation, median,
//! success rate) and the aggregates over environments, as one JSON report
//! that `compare` reads.
//!
//! Accuracy counts scores of 1.0; success counts scores above 0 (the
//! original's `success = score > 0`); with binary rewards the two agree.
//! A multi-step environment's episode counts by what the environment says
//! at its end: accuracy and success are the share of episodes that reached
//! their goal, the score is the return, and the mean steps are reported.
//! Completions that could not be scored (the sandbox failed) are counted
//! as `masked` and left out of every metric.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::{Interval, TurnAccuracy, jeffreys_interval};
use crate::atomic;

/// The layout this code writes.
pub const ENVS_REPORT_VERSION: u32 = 1;

/// One scored completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvPrediction {
    pub task_id: u64,
    /// The environment's own id of the task (`trace-train task
    /// --task_id`), where the eval's part renumbers (held-out tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_id: Option<u64>,
    pub completion: String,
    /// `None` when the completion could not be scored (see `masked`).
    pub score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masked: Option<String>,
    /// Whether the completion ended on a stop token.
    pub stopped: bool,
    /// With `--max_turns` above 1: the episode's earlier answers, each
    /// wrong and followed by the environment's feedback; this one is the
    /// last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<EnvAttempt>,
    /// A multi-step environment's episode: whether it reached its goal
    /// (`score` is then its return, the sum of its step rewards, and
    /// `earlier` its earlier actions, each with its step reward and the
    /// observation after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
}

/// An earlier answer of an environment's episode and the feedback turn
/// that followed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvAttempt {
    pub completion: String,
    pub score: f64,
    pub stopped: bool,
    /// The environment's reply, the next turn's user message.
    pub feedback: String,
}

impl EnvPrediction {
    /// Answers the episode took (1 without feedback turns).
    pub fn answers(&self) -> usize {
        self.earlier.len() + 1
    }

    /// Whether it counts as right: a multi-step episode's success, else a
    /// score of 1.
    pub fn correct(&self) -> bool {
        self.success.unwrap_or(self.score == Some(1.0))
    }
}

/// What one environment's completions scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvMetrics {
    pub environment: String,
    /// Scored completions.
    pub n: usize,
    /// Completions that could not be scored.
    pub masked: usize,
    /// Scores of 1.0.
    pub correct: usize,
    pub accuracy: f64,
    /// Jeffreys interval of `correct` out of `n`.
    pub interval: Interval,
    /// Sum of the scores (what the Beta duel of `compare` counts).
    pub score_sum: f64,
    pub mean_score: f64,
    /// Population standard deviation of the scores.
    pub std: f64,
    pub median: f64,
    /// Share of scores above 0 (of successes, for a multi-step
    /// environment's episodes).
    pub success_rate: f64,
    /// A multi-step environment's mean steps an episode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_steps: Option<f64>,
}

impl EnvMetrics {
    /// The metrics of `predictions` of `environment`.
    pub fn new(environment: &str, predictions: &[EnvPrediction], level: f64) -> Self {
        let mut scores: Vec<f64> = predictions.iter().filter_map(|p| p.score).collect();
        let n = scores.len();
        let masked = predictions.len() - n;
        let scored = || predictions.iter().filter(|p| p.score.is_some());
        let correct = scored().filter(|p| p.correct()).count();
        let stepped = scored().any(|p| p.success.is_some());
        let steps: usize = scored().map(EnvPrediction::answers).sum();
        let sum: f64 = scores.iter().sum();
        let mean = if n == 0 { 0.0 } else { sum / n as f64 };
        let var = if n == 0 {
            0.0
        } else {
            scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n as f64
        };
        scores.sort_by(f64::total_cmp);
        let median = match n {
            0 => 0.0,
            _ if n % 2 == 1 => scores[n / 2],
            _ => (scores[n / 2 - 1] + scores[n / 2]) / 2.0,
        };
        let (lo, hi) = jeffreys_interval(correct as u64, n as u64, level);
        Self {
            environment: environment.to_owned(),
            n,
            masked,
            correct,
            accuracy: ratio(correct as f64, n),
            interval: Interval { level, lo, hi },
            score_sum: sum,
            mean_score: mean,
            std: var.sqrt(),
            median,
            success_rate: if stepped {
                ratio(correct as f64, n)
            } else {
                ratio(scores.iter().filter(|&&s| s > 0.0).count() as f64, n)
            },
            mean_steps: stepped.then(|| ratio(steps as f64, n)),
        }
    }
}

fn ratio(a: f64, n: usize) -> f64 {
    if n == 0 { 0.0 } else { a / n as f64 }
}

/// The aggregates over environments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    /// The weight of each environment, in the report's order (by default
    /// its number of scored completions, so the weighted accuracy is the
    /// pooled one).
    pub weights: Vec<f64>,
    pub weighted_accuracy: f64,
    pub weighted_mean_score: f64,
    /// Scores above 0 over all scored completions.
    pub success_rate: f64,
    pub n: usize,
}

impl Aggregate {
    /// Over `envs`, each weighted by `weights` (`None`: by its `n`).
    pub fn new(envs: &[EnvMetrics], weights: Option<&[f64]>) -> Self {
        let weights: Vec<f64> = match weights {
            Some(w) => w.to_vec(),
            None => envs.iter().map(|e| e.n as f64).collect(),
        };
        let total: f64 = weights.iter().sum();
        let weighted = |f: fn(&EnvMetrics) -> f64| {
            if total > 0.0 {
                envs.iter()
                    .zip(&weights)
                    .map(|(e, w)| w * f(e))
                    .sum::<f64>()
                    / total
            } else {
                0.0
            }
        };
        let n: usize = envs.iter().map(|e| e.n).sum();
        let successes: f64 = envs.iter().map(|e| e.success_rate * e.n as f64).sum();
        Self {
            weighted_accuracy: weighted(|e| e.accuracy),
            weighted_mean_score: weighted(|e| e.mean_score),
            success_rate: ratio(successes.round(), n),
            n,
            weights,
        }
    }
}

/// One environment's section of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvSection {
    #[serde(flatten)]
    pub metrics: EnvMetrics,
    /// With `--max_turns` above 1: the accuracy after turn 1, 2, ..., K
    /// (a task counts as solved after turn k when one of its first k
    /// answers scored 1.0); the section's accuracy is the last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_turn: Vec<TurnAccuracy>,
    pub predictions: Vec<EnvPrediction>,
}

/// The report of an eval over several environments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvsReport {
    pub version: u32,
    /// The model evaluated, as given.
    pub model: String,
    /// The adapter applied to `model` (`eval --adapter`), as given; absent
    /// when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// SAT's, ABD's and DED's tasks evaluated (`heldout`, `train` or
    /// `all`; see `affine::split`); absent in reports made before the
    /// split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// The feedback kind of a multi-turn eval (`--max_turns` above 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    /// Seconds the answers took to make and score, every environment's
    /// together (they are decoded in one batch); absent in reports made
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    pub environments: Vec<EnvSection>,
    pub aggregate: Aggregate,
}

impl EnvsReport {
    /// The report of each environment's predictions, in order.
    pub fn new(
        model: &str,
        envs: Vec<(String, Vec<EnvPrediction>)>,
        weights: Option<&[f64]>,
        level: f64,
    ) -> anyhow::Result<Self> {
        if let Some(w) = weights {
            anyhow::ensure!(
                w.len() == envs.len() && w.iter().all(|x| x.is_finite() && *x >= 0.0),
                "{} weights for {} environments; each must be a number >= 0",
                w.len(),
                envs.len()
            );
        }
        let environments: Vec<EnvSection> = envs
            .into_iter()
            .map(|(name, predictions)| EnvSection {
                metrics: EnvMetrics::new(&name, &predictions, level),
                by_turn: Vec::new(),
                predictions,
            })
            .collect();
        let metrics: Vec<EnvMetrics> = environments.iter().map(|s| s.metrics.clone()).collect();
        Ok(Self {
            version: ENVS_REPORT_VERSION,
            model: model.to_owned(),
            adapter: None,
            split: None,
            feedback: None,
            seconds: None,
            aggregate: Aggregate::new(&metrics, weights),
            environments,
        })
    }

    /// Adds each environment's accuracy after turn 1 .. `max_turns` (a
    /// multi-turn eval's), with `level` intervals.
    pub fn count_turns(&mut self, max_turns: usize, feedback: &str, level: f64) {
        self.feedback = Some(feedback.to_owned());
        for s in &mut self.environments {
            let n = s.metrics.n;
            s.by_turn = (1..=max_turns)
                .map(|turn| {
                    let correct = s
                        .predictions
                        .iter()
                        .filter(|p| p.score == Some(1.0) && p.answers() <= turn)
                        .count();
                    let (lo, hi) = jeffreys_interval(correct as u64, n as u64, level);
                    TurnAccuracy {
                        turn,
                        correct,
                        accuracy: ratio(correct as f64, n),
                        interval: Interval { level, lo, hi },
                    }
                })
                .collect();
        }
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        atomic::write(path, serde_json::to_string_pretty(self)?.as_bytes())
    }

    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        serde_json::from_str(&text).with_context(|| {
            let trace = serde_json::from_str::<serde_json::Value>(&text)
                .is_ok_and(|v| v.get("predictions").is_some());
            match trace {
                true => format!(
                    "`{}` is a Trace report of `eval` (without --environment), not one of `eval --environment`\nhint: compare two Trace reports with `trace-train eval --compare A.json B.json`",
                    path.display()
                ),
                false => format!(
                    "`{}` is not a report of `eval --environment`\nhint: `compare` reads the JSON that `trace-train eval --environment ...` writes",
                    path.display()
                ),
            }
        })
    }

    /// One line an environment and the aggregates, for the terminal.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        // Names as long as `python:my_env.py` or a URL line up too.
        let width = self
            .environments
            .iter()
            .map(|s| s.metrics.environment.len())
            .max()
            .unwrap_or(0)
            .max(6);
        for s in &self.environments {
            let m = &s.metrics;
            out.push_str(&format!(
                "{:<width$} n {:>5}  acc {:>5.1}% [{:.1}, {:.1}]  mean {:.3}  std {:.3}  median {:.2}  success {:.1}%{}{}\n",
                m.environment,
                m.n,
                100.0 * m.accuracy,
                100.0 * m.interval.lo,
                100.0 * m.interval.hi,
                m.mean_score,
                m.std,
                m.median,
                100.0 * m.success_rate,
                m.mean_steps.map(|k| format!("  steps {k:.1}")).unwrap_or_default(),
                if m.masked > 0 { format!("  ({} masked)", m.masked) } else { String::new() }
            ));
            if !s.by_turn.is_empty() {
                let by: Vec<String> = s
                    .by_turn
                    .iter()
                    .map(|t| format!("{} {:.1}%", t.turn, 100.0 * t.accuracy))
                    .collect();
                out.push_str(&format!("{:width$} after turn {}\n", "", by.join(", ")));
            }
        }
        let a = &self.aggregate;
        out.push_str(&format!(
            "{:<width$} n {:>5}  weighted acc {:.1}%  weighted mean {:.3}  success {:.1}%",
            "all",
            a.n,
            100.0 * a.weighted_accuracy,
            a.weighted_mean_score,
            100.0 * a.success_rate
        ));
        if let Some(secs) = self.seconds.filter(|&s| s > 0.0) {
            // Answers made: a multi-step episode's actions, a multi-turn
            // task's turns, one a one-answer task.
            let answers: usize = self
                .environments
                .iter()
                .flat_map(|s| &s.predictions)
                .map(EnvPrediction::answers)
                .sum();
            out.push_str(&format!(
                "\n{answers} answers in {secs:.1} s ({:.1} a second)",
                answers as f64 / secs
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preds(scores: &[Option<f64>]) -> Vec<EnvPrediction> {
        scores
            .iter()
            .enumerate()
            .map(|(i, &score)| EnvPrediction {
                task_id: i as u64,
                own_id: None,
                completion: String::new(),
                score,
                masked: score.is_none().then(|| "sandbox_failure".into()),
                stopped: true,
                earlier: Vec::new(),
                success: None,
            })
            .collect()
    }

    #[test]
    fn metrics_of_one_environment() {
        let m = EnvMetrics::new(
            "sat",
            &preds(&[Some(1.0), Some(0.0), Some(1.0), None, Some(1.0)]),
            0.8,
        );
        assert_eq!((m.n, m.masked, m.correct), (4, 1, 3));
        assert_eq!(
            (m.accuracy, m.mean_score, m.median, m.success_rate),
            (0.75, 0.75, 1.0, 0.75)
        );
        assert!((m.std - 0.1875f64.sqrt()).abs() < 1e-12);
        let (lo, hi) = jeffreys_interval(3, 4, 0.8);
        assert_eq!((m.interval.lo, m.interval.hi), (lo, hi));
        // Even n: the median is the mean of the middle two.
        let m = EnvMetrics::new("x", &preds(&[Some(0.0), Some(1.0)]), 0.8);
        assert_eq!(m.median, 0.5);
        let m = EnvMetrics::new("x", &[], 0.8);
        assert_eq!((m.n, m.accuracy, m.median), (0, 0.0, 0.0));
    }

    #[test]
    fn summary_counts_answers_a_second_when_timed() {
        let mut r =
            EnvsReport::new("m", vec![("sat".into(), preds(&[Some(1.0); 4]))], None, 0.8).unwrap();
        assert!(!r.summary().contains("a second"));
        // A two-answer task: its earlier answer counts too.
        r.environments[0].predictions[0].earlier.push(EnvAttempt {
            completion: String::new(),
            score: 0.0,
            stopped: true,
            feedback: "again".into(),
        });
        r.seconds = Some(2.0);
        let s = r.summary();
        assert!(s.ends_with("5 answers in 2.0 s (2.5 a second)"), "{s}");
        let back: EnvsReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.seconds, Some(2.0));
    }

    #[test]
    fn aggregates_weight_by_count_or_by_weights() {
        let r = EnvsReport::new(
            "m",
            vec![
                ("sat".into(), preds(&[Some(1.0); 3])),
                ("abd".into(), preds(&[Some(0.0)])),
            ],
            None,
            0.8,
        )
        .unwrap();
        let a = &r.aggregate;
        assert_eq!((a.n, a.weighted_accuracy, a.success_rate), (4, 0.75, 0.75));
        let r = EnvsReport::new(
            "m",
            vec![
                ("sat".into(), preds(&[Some(1.0); 3])),
                ("abd".into(), preds(&[Some(0.0)])),
            ],
            Some(&[1.0, 1.0]),
            0.8,
        )
        .unwrap();
        assert_eq!(r.aggregate.weighted_accuracy, 0.5);
        assert_eq!(r.aggregate.weighted_mean_score, 0.5);
        assert!(EnvsReport::new("m", vec![("a".into(), vec![])], Some(&[1.0, 2.0]), 0.8).is_err());
        // A round trip through the file.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        r.write(&f).unwrap();
        let back = EnvsReport::read(&f).unwrap();
        assert_eq!((&back.aggregate, back.model.as_str()), (&r.aggregate, "m"));
        for (a, b) in back.environments.iter().zip(&r.environments) {
            assert_eq!(a.predictions, b.predictions);
            assert!((a.metrics.interval.hi - b.metrics.interval.hi).abs() < 1e-15);
        }
        std::fs::write(&f, "{}").unwrap();
        assert!(format!("{:#}", EnvsReport::read(&f).unwrap_err()).contains("eval --environment"));
    }
}
