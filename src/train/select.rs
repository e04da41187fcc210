//! Choosing the checkpoint of Stages 1-2 (`select` in the stage config,
//! [`crate::config::SelectConfig`]): the adapter is scored every N steps
//! and after the last; the best score so far is remembered with its step,
//! saved in every checkpoint's trainer state (so a resumed run chooses as
//! the uninterrupted one did) and its weights kept in `best/`. The choice
//! is pure (scores in, the step out); [`write_best`] and [`restore_best`]
//! keep and read back the weights.
//!
//! `best/` holds the adapter in PEFT's layout (`eval --adapter` reads it),
//! the trainable tensors by name (`trainable.safetensors`, restored into
//! the run's variables at the end) and `select.json` (the step, metric and
//! score). It is built in a temp folder and renamed into place, as
//! checkpoints are, before the step's checkpoint is written. A run killed
//! after a new best and before the next checkpoint resumes with the
//! checkpoint's best-so-far and repeats the steps bit for bit, so it
//! writes the same `best/` again; the end checks that `best/` holds the
//! chosen step.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;

use anyhow::{Context, bail};
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::model::LoadedModel;

const TRAINABLE: &str = "trainable.safetensors";
const RECORD: &str = "select.json";
const TMP_PREFIX: &str = ".tmp-best-";

/// The folder of the best-scoring adapter under a run's output folder.
pub const BEST_DIR: &str = "best";

/// What chooses the stage's `final/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// The highest exact match on the select set.
    HeldoutExactMatch,
    /// The lowest eval loss on the stage's eval file.
    EvalLoss,
    /// The last weights; exact match is still scored and its best kept.
    Last,
}

impl Metric {
    /// The config's spelling ([`crate::config::SELECT_METRICS`]).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "heldout_exact_match" => Some(Self::HeldoutExactMatch),
            "eval_loss" => Some(Self::EvalLoss),
            "last" => Some(Self::Last),
            _ => None,
        }
    }

    /// What is scored: eval loss for `eval_loss`, else exact match.
    pub fn scores_loss(self) -> bool {
        self == Self::EvalLoss
    }

    /// The name of the scored value in the run log (`select/<name>`).
    pub fn scored(self) -> &'static str {
        if self.scores_loss() {
            "eval_loss"
        } else {
            "exact_match"
        }
    }
}

/// A scored step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pick {
    pub step: u64,
    /// Exact match (0 to 1) or eval loss, as the metric scores.
    pub score: f64,
}

/// The best scored step so far; what a checkpoint saves of the selection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    pub best: Option<Pick>,
}

impl Selection {
    /// The selection saved in a trainer state's `extra` (none: a fresh one).
    pub fn from_extra(extra: &serde_json::Value) -> anyhow::Result<Self> {
        match extra.get("select") {
            None | Some(serde_json::Value::Null) => Ok(Self::default()),
            Some(v) => Ok(serde_json::from_value(v.clone())?),
        }
    }

    /// `extra` with this selection in it.
    pub fn into_extra(&self, extra: &mut serde_json::Value) -> anyhow::Result<()> {
        if !extra.is_object() {
            *extra = serde_json::json!({});
        }
        extra["select"] = serde_json::to_value(self)?;
        Ok(())
    }

    /// Records `score` at `step`; true when it is the new best: higher
    /// exact match, or lower eval loss when `metric` scores the loss. A tie
    /// keeps the earlier step; a score that is not finite never wins.
    pub fn offer(&mut self, metric: Metric, step: u64, score: f64) -> bool {
        if !score.is_finite() {
            return false;
        }
        let better = match self.best {
            None => true,
            Some(b) if metric.scores_loss() => score < b.score,
            Some(b) => score > b.score,
        };
        if better {
            self.best = Some(Pick { step, score });
        }
        better
    }

    /// The step whose weights become `final/` after `last_step`: the best
    /// one, or the last one for [`Metric::Last`] (or when nothing scored).
    pub fn chosen(&self, metric: Metric, last_step: u64) -> u64 {
        match (metric, self.best) {
            (Metric::Last, _) | (_, None) => last_step,
            (_, Some(b)) => b.step,
        }
    }
}

/// Whether the adapter is scored after step `step` of `total` (counted
/// from 1): every `every` steps and after the last.
pub fn due(step: u64, total: u64, every: usize) -> bool {
    every > 0 && (step.is_multiple_of(every as u64) || step == total)
}

/// Writes `best/` under `out_dir`: the adapter of `loaded` (PEFT's
/// layout), `vars` by name and the pick, atomically (temp folder, fsync,
/// rename).
pub fn write_best(
    out_dir: &Path,
    loaded: &LoadedModel,
    vars: &[(String, Var)],
    base_name: &str,
    metric: &str,
    pick: Pick,
) -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempdir_in(out_dir)
        .with_context(|| format!("cannot create a temp folder in `{}`", out_dir.display()))?;
    let write = || -> anyhow::Result<()> {
        crate::model::io::adapter::save(loaded, tmp.path(), base_name)?;
        let tensors: HashMap<String, Tensor> = vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        crate::model::save_safetensors(&tensors, tmp.path().join(TRAINABLE))?;
        std::fs::write(
            tmp.path().join(RECORD),
            serde_json::to_vec_pretty(&serde_json::json!({
                "step": pick.step, "metric": metric, "score": pick.score,
            }))?,
        )?;
        for e in std::fs::read_dir(tmp.path())? {
            File::open(e?.path())?.sync_all()?;
        }
        File::open(tmp.path())?.sync_all()?;
        Ok(())
    };
    write().with_context(|| {
        format!(
            "saving the best adapter (step {}) in `{}` failed",
            pick.step,
            out_dir.display()
        )
    })?;
    let dest = out_dir.join(BEST_DIR);
    if dest.exists() {
        std::fs::remove_dir_all(&dest)
            .with_context(|| format!("cannot replace `{}`", dest.display()))?;
    }
    let tmp_path = tmp.keep();
    std::fs::rename(&tmp_path, &dest)
        .with_context(|| format!("cannot move the best adapter to `{}`", dest.display()))?;
    File::open(out_dir)?.sync_all()?;
    tracing::info!("step {}: new best ({metric} {:.4})", pick.step, pick.score);
    Ok(())
}

/// The step `best/` under `out_dir` holds, if any.
pub fn best_step(out_dir: &Path) -> anyhow::Result<Option<u64>> {
    let p = out_dir.join(BEST_DIR).join(RECORD);
    if !p.is_file() {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p)?)
        .with_context(|| format!("`{}`: unreadable", p.display()))?;
    Ok(v["step"].as_u64())
}

/// Sets `vars` to the weights `best/` holds, which must be `step`'s.
pub fn restore_best(out_dir: &Path, step: u64, vars: &[(String, Var)]) -> anyhow::Result<()> {
    let dir = out_dir.join(BEST_DIR);
    let held = best_step(out_dir)?;
    if held != Some(step) {
        bail!(
            "`{}` holds {} but the run chose step {step}\nhint: the run was not repeated exactly after a resume; train again without --resume, or evaluate the checkpoints with `eval --adapter`",
            dir.display(),
            held.map_or("nothing".into(), |s| format!("step {s}"))
        );
    }
    let saved: BTreeMap<String, Tensor> =
        candle_core::safetensors::load(dir.join(TRAINABLE), &candle_core::Device::Cpu)?
            .into_iter()
            .collect();
    for (name, var) in vars {
        let t = saved
            .get(name)
            .with_context(|| format!("`{}` lacks `{name}`", dir.display()))?;
        var.set(&t.to_device(var.device())?.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// Removes temp folders of a `best/` save a kill interrupted.
pub fn remove_interrupted(out_dir: &Path) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(out_dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            std::fs::remove_dir_all(e.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_score_wins_and_ties_keep_the_earlier_step() {
        let mut s = Selection::default();
        let m = Metric::HeldoutExactMatch;
        assert!(s.offer(m, 2, 0.25));
        assert!(s.offer(m, 4, 0.5));
        assert!(!s.offer(m, 6, 0.5), "a tie keeps step 4");
        assert!(!s.offer(m, 8, 0.125));
        assert!(!s.offer(m, 9, f64::NAN));
        assert_eq!(
            s.best,
            Some(Pick {
                step: 4,
                score: 0.5
            })
        );
        assert_eq!(s.chosen(m, 9), 4);
    }

    #[test]
    fn eval_loss_keeps_the_lowest() {
        let mut s = Selection::default();
        let m = Metric::EvalLoss;
        assert!(s.offer(m, 1, 2.0));
        assert!(s.offer(m, 2, 1.5));
        assert!(!s.offer(m, 3, 1.5));
        assert!(!s.offer(m, 4, 1.75));
        assert!(!s.offer(m, 5, f64::INFINITY));
        assert_eq!(s.chosen(m, 5), 2);
    }

    #[test]
    fn last_chooses_the_last_step_whatever_scored_best() {
        let mut s = Selection::default();
        assert!(s.offer(Metric::Last, 3, 0.9));
        assert!(!s.offer(Metric::Last, 6, 0.1));
        assert_eq!(s.best.unwrap().step, 3, "best/ still holds the best");
        assert_eq!(s.chosen(Metric::Last, 6), 6);
        // Nothing scored: the last step, whatever the metric.
        assert_eq!(Selection::default().chosen(Metric::HeldoutExactMatch, 7), 7);
    }

    #[test]
    fn the_selection_survives_a_trainer_state() {
        let mut s = Selection::default();
        s.offer(Metric::HeldoutExactMatch, 5, 0.375);
        let mut extra = serde_json::Value::Null;
        s.into_extra(&mut extra).unwrap();
        let text = serde_json::to_string(&extra).unwrap();
        let back = Selection::from_extra(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            Selection::from_extra(&serde_json::Value::Null).unwrap(),
            Selection::default()
        );
    }

    #[test]
    fn scoring_is_due_every_n_steps_and_after_the_last() {
        let due_at: Vec<u64> = (1..=7).filter(|&s| due(s, 7, 3)).collect();
        assert_eq!(due_at, vec![3, 6, 7]);
        assert!(!due(1, 7, 0));
        for m in crate::config::SELECT_METRICS {
            assert!(Metric::parse(m).is_some(), "{m}");
        }
        assert_eq!(Metric::parse("loss"), None);
    }
}
