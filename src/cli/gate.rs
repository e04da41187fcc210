//! The pipeline's gate between stages, the glue: evaluates a stage's
//! merged model on the gate's held-out sets through `eval`'s own path
//! ([`evaluate`]), compares it with the model the stage started from
//! ([`trace_train::eval::gate`] holds the rule, the decision and the
//! table), writes `<checkpoints>/gate.json` and acts on the mode.
//!
//! Each model's report of each set goes to
//! `<checkpoints>/gate/<stage>_<name>/<set>.json`; a run with `--resume`
//! reads those back instead of evaluating again (a finished stage's model
//! does not change). A fresh run removes `gate/` first, and a stage that
//! trains removes its own reports ([`Gate::forget`]), so no report outlives
//! its model.

use std::path::{Path, PathBuf};

use anyhow::Context;

use trace_train::config::GateConfig;
use trace_train::config::GateMode;
use trace_train::eval::gate::{self, Action, GateReport, Score, StageScores};
use trace_train::eval::{EvalItem, Report};

use super::eval::{EvalArgs, eval_items, evaluate};

/// A model the gate evaluates: its stage (0 for the base model), the
/// stage's short name, the DPO round it ends (each round is gated), where
/// it is and, for a hub id, its revision.
#[derive(Debug, Clone)]
pub struct Gated {
    pub stage: u8,
    pub name: &'static str,
    pub round: Option<usize>,
    pub model: PathBuf,
    pub revision: Option<String>,
}

impl Gated {
    fn place(&self) -> gate::Place {
        (self.stage, self.round)
    }

    /// Its reports' folder under `gate/`: `2_sft`, `3_dpo_r1`.
    fn folder(&self) -> String {
        match self.round {
            Some(r) => format!("{}_{}_r{r}", self.stage, self.name),
            None => format!("{}_{}", self.stage, self.name),
        }
    }
}

/// One of the gate's sets: its name and the eval arguments that make its
/// items (the held-out set, or a JSONL file).
struct Set {
    name: String,
    /// The report's file name under a model's folder.
    file: String,
    heldout: Option<String>,
    data: Option<PathBuf>,
}

pub struct Gate {
    cfg: GateConfig,
    mode: GateMode,
    /// `<checkpoints>`: `gate.json` and `gate/` go there.
    root: PathBuf,
    device: String,
    unsafe_no_sandbox: bool,
    resume: bool,
    sets: Vec<Set>,
    /// Each set's items, made once a run on first use.
    items: Vec<Option<Vec<EvalItem>>>,
    /// The models gated so far, for keep_best's choice.
    gated: Vec<Gated>,
    report: GateReport,
}

impl Gate {
    /// The gate of a pipeline whose Stage 0 writes to `data_dir`; `None`
    /// when `cfg.mode` is `off`. Without `resume`, the reports of an
    /// earlier run are removed.
    pub fn new(
        cfg: &GateConfig,
        root: &Path,
        data_dir: &Path,
        device: &str,
        unsafe_no_sandbox: bool,
        resume: bool,
    ) -> anyhow::Result<Option<Self>> {
        let mode = cfg.mode();
        if mode == GateMode::Off {
            return Ok(None);
        }
        let reports = root.join("gate");
        if !resume && reports.exists() {
            std::fs::remove_dir_all(&reports)
                .with_context(|| format!("cannot remove `{}`", reports.display()))?;
        }
        let mut sets: Vec<Set> = cfg
            .sets
            .iter()
            .map(|s| {
                let (heldout, data) = match s.as_str() {
                    "heldout_short" => (Some("short".to_owned()), None),
                    "original_test" => (None, Some(data_dir.join("stage1_original_test.jsonl"))),
                    _ => (None, Some(data_dir.join("stage2_transformed_test.jsonl"))),
                };
                Set {
                    name: s.clone(),
                    file: format!("{s}.json"),
                    heldout,
                    data,
                }
            })
            .collect();
        for (i, f) in cfg.files.iter().enumerate() {
            let stem = f
                .file_stem()
                .map(|s| {
                    s.to_string_lossy()
                        .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
                })
                .unwrap_or_default();
            sets.push(Set {
                name: f.display().to_string(),
                file: format!("file{i}_{stem}.json"),
                heldout: None,
                data: Some(f.clone()),
            });
        }
        let items = sets.iter().map(|_| None).collect();
        Ok(Some(Self {
            cfg: cfg.clone(),
            mode,
            root: root.to_owned(),
            device: device.to_owned(),
            unsafe_no_sandbox,
            resume,
            sets,
            items,
            gated: Vec::new(),
            report: GateReport::new(mode),
        }))
    }

    /// Removes what the gate knows of `stage`'s model (its reports, its
    /// scores and comparison): the stage is about to train it anew.
    pub fn forget(&mut self, stage: u8) -> anyhow::Result<()> {
        let reports = self.root.join("gate");
        if reports.is_dir() {
            let prefix = format!("{stage}_");
            for e in std::fs::read_dir(&reports)
                .with_context(|| format!("cannot read `{}`", reports.display()))?
            {
                let path = e?.path();
                if path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
                {
                    std::fs::remove_dir_all(&path)
                        .with_context(|| format!("cannot remove `{}`", path.display()))?;
                }
            }
        }
        self.report.stages.retain(|s| s.stage != stage);
        self.report.comparisons.retain(|c| c.stage != stage);
        self.gated.retain(|g| g.stage != stage);
        Ok(())
    }

    fn args(&self, set: &Set, model: &Gated, out: PathBuf) -> EvalArgs {
        EvalArgs {
            model: Some(model.model.clone()),
            adapter: None,
            compare: None,
            heldout: set.heldout.clone(),
            prompt: "original".into(),
            variants: 1,
            data: set.data.clone(),
            output: Some(out),
            limit: self.cfg.limit,
            max_new_tokens: self.cfg.max_new_tokens,
            batch_size: self.cfg.batch_size,
            // The gate compares stages on one answer an item: the earlier
            // stages never trained on feedback turns.
            max_turns: 1,
            feedback: None,
            max_steps_per_episode: trace_train::config::RlConfig::default().max_steps_per_episode,
            device: Some(self.device.clone()),
            // Every stage's model measured as loaded, whatever base the
            // stages trained on: reports stay comparable across runs.
            base_precision: trace_train::model::BasePrecision::Bf16,
            revision: model.revision.clone(),
            unsafe_no_sandbox: self.unsafe_no_sandbox,
            envs: Default::default(),
        }
    }

    /// `m`'s scores on every set: read back from its reports with
    /// `--resume`, else evaluated (and its reports written).
    fn scores(&mut self, m: &Gated) -> anyhow::Result<StageScores> {
        if let Some(s) = self.report.stages.iter().find(|s| s.place() == m.place()) {
            return Ok(s.clone());
        }
        let dir = self.root.join("gate").join(m.folder());
        let mut said = false;
        let mut sets = Vec::new();
        for i in 0..self.sets.len() {
            let out = dir.join(&self.sets[i].file);
            let report = if self.resume && out.is_file() {
                eprintln!(
                    "gate: {} on `{}`: the report of an earlier run, `{}`",
                    m.name,
                    self.sets[i].name,
                    out.display()
                );
                Report::read(&out)?
            } else {
                if !std::mem::replace(&mut said, true) {
                    eprintln!(
                        "== gate: {} (`{}`), reports in `{}`",
                        m.name,
                        m.model.display(),
                        dir.display()
                    );
                }
                let args = self.args(&self.sets[i], m, out);
                if self.items[i].is_none() {
                    self.items[i] = Some(eval_items(&args).with_context(|| {
                        format!("gate: cannot read the set `{}`", self.sets[i].name)
                    })?);
                }
                let items = self.items[i].as_deref().expect("made above");
                let (report, _) = evaluate(&args, items).with_context(|| {
                    format!(
                        "gate: cannot evaluate {} (`{}`) on `{}`",
                        m.name,
                        m.model.display(),
                        self.sets[i].name
                    )
                })?;
                eprintln!("{}: {}", self.sets[i].name, report.summary());
                report
            };
            sets.push((self.sets[i].name.clone(), Score::of(&report)));
        }
        let s = StageScores {
            stage: m.stage,
            name: m.name.to_owned(),
            round: m.round,
            model: m.model.display().to_string(),
            sets,
        };
        self.report.add_stage(s.clone());
        self.gated.retain(|g| g.place() != m.place());
        self.gated.push(m.clone());
        Ok(s)
    }

    /// Evaluates the model a stage starts from before the stage runs, so
    /// that a set the gate cannot read fails the pipeline before training.
    pub fn before(&mut self, start: &Gated) -> anyhow::Result<()> {
        self.scores(start)?;
        self.write()
    }

    /// After a stage: its model `after` against `before` (the model it
    /// started from), written and printed; warns, or fails in `stop` mode
    /// when a set fell.
    pub fn after(&mut self, before: &Gated, after: &Gated) -> anyhow::Result<()> {
        let b = self.scores(before)?;
        let a = self.scores(after)?;
        let mut c = gate::compare(&b, &a)?;
        self.add_item_changes(&mut c, before, after);
        let action = gate::decide(self.mode, &c);
        self.report.add_comparison(c);
        self.write()?;
        // The two models compared; the whole table ends the pipeline.
        eprint!(
            "{}",
            self.report
                .table_of(|s| s.place() == before.place() || s.place() == after.place())
        );
        match action {
            Action::Continue => Ok(()),
            Action::Warn(m) => {
                eprintln!("{m}");
                Ok(())
            }
            Action::Stop(m) => Err(anyhow::anyhow!(
                "{m}\nthe gate's table: `{}`",
                self.path().display()
            )),
        }
    }

    /// Each set of `c` item by item, from the two models' reports under
    /// `gate/`. A report that cannot be read (removed since an earlier
    /// run) leaves that set without items, and says so: the verdict does
    /// not need them.
    fn add_item_changes(&self, c: &mut gate::Comparison, before: &Gated, after: &Gated) {
        let dir = self.root.join("gate");
        for change in &mut c.sets {
            let Some(set) = self.sets.iter().find(|s| s.name == change.set) else {
                continue;
            };
            let read = |m: &Gated| Report::read(&dir.join(m.folder()).join(&set.file));
            change.items = match (read(before), read(after)) {
                (Ok(b), Ok(a)) => gate::ItemChange::of(&b, &a)
                    .map_err(|why| {
                        eprintln!("gate: `{}` not compared item by item: {why}", set.name)
                    })
                    .ok(),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("gate: `{}` not compared item by item: {e:#}", set.name);
                    None
                }
            };
        }
    }

    /// The pipeline's final model: with `keep_best`, the best gated model
    /// ([`gate::best`]), recorded in `gate.json` and said; else `default`.
    pub fn final_model(&mut self, default: Gated) -> anyhow::Result<Gated> {
        if self.mode != GateMode::KeepBest {
            return Ok(default);
        }
        let Some(best) = self.report.best().cloned() else {
            eprintln!(
                "gate: keep_best: no model was gated in this run; the final model is `{}`",
                default.model.display()
            );
            return Ok(default);
        };
        self.report.kept = Some(best.stage);
        self.report.kept_round = best.round;
        self.write()?;
        eprintln!(
            "gate: keep_best: the final model is {} (`{}`), the highest mean exact match over the gate's sets ({:.1}%; ties go to the earlier stage)",
            match (best.stage, best.round) {
                (0, _) => "the base model".to_owned(),
                (s, Some(r)) => format!("stage {s}'s round {r}"),
                (s, None) => format!("stage {s}'s"),
            },
            best.model,
            100.0 * best.mean_accuracy()
        );
        Ok(self
            .gated
            .iter()
            .find(|g| g.place() == best.place())
            .cloned()
            .expect("every scored stage is recorded"))
    }

    /// Every gated model's row, as `gate.json` has them.
    pub fn table(&self) -> String {
        self.report.table()
    }

    /// `gate.json`: the gate's scores, comparisons and verdicts.
    pub fn path(&self) -> PathBuf {
        self.root.join("gate.json")
    }

    fn write(&self) -> anyhow::Result<()> {
        trace_train::atomic::write(&self.path(), &serde_json::to_vec_pretty(&self.report)?)
    }
}
