//! A run's hold on its output folder and on its ranks: the lock, the stop
//! flag, the resume decision, the starting weights every rank shares, the
//! run log, and the curves drawn at the end.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::bail;
use candle_core::{Device, Tensor, Var};

use super::checkpoint::{self, Fingerprint, RunLock, SFT_PREFIX, TrainerState};
use crate::dist::{self, Communicator};
use crate::runlog::{self, RunLog};
use crate::train::optim::AdamW;

/// One rank's side of a run over `comm`'s ranks: rank 0 (the lead) holds
/// the output folder's lock and alone writes there.
pub struct Run<'a> {
    /// Names the run in messages (`warmup`, `sft`, `Stage 3`, `dpo`).
    pub name: String,
    pub output_dir: PathBuf,
    pub comm: &'a dyn Communicator,
    stop: Arc<AtomicBool>,
    /// A stop the ranks agreed on at some step (see [`Run::after_step`]).
    stop_seen: Cell<bool>,
    _lock: Option<RunLock>,
}

/// Where and how a recipe runs, beside its settings: the output folder,
/// the device, whether to resume (and despite changes), a step limit.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub output_dir: PathBuf,
    pub device: Device,
    /// Continue from the newest valid checkpoint.
    pub resume: bool,
    /// Resume even if the settings, model or data changed.
    pub force: bool,
    /// Stop after this many optimizer steps (tests, quick runs).
    pub max_steps: Option<u64>,
}

/// What a run asks of the checkpoints in its folder.
#[derive(Debug, Clone, Copy)]
pub struct Resume<'p> {
    /// Continue from the newest valid checkpoint.
    pub resume: bool,
    /// Even if the fingerprint changed.
    pub force: bool,
    /// The checkpoint folders' prefix (`checkpoint-`, `step_`).
    pub prefix: &'p str,
}

impl<'a> Run<'a> {
    /// Locks `output_dir` (rank 0) and installs the process's stop flag.
    pub fn begin(
        name: &str,
        output_dir: &Path,
        comm: &'a dyn Communicator,
    ) -> anyhow::Result<Self> {
        let lock = if comm.rank() == 0 {
            Some(RunLock::acquire(output_dir)?)
        } else {
            None
        };
        Ok(Self {
            name: name.to_owned(),
            output_dir: output_dir.to_owned(),
            comm,
            stop: crate::stop::flag()?,
            stop_seen: Cell::new(false),
            _lock: lock,
        })
    }

    /// Rank 0, which logs and writes.
    pub fn lead(&self) -> bool {
        self.comm.rank() == 0
    }

    /// Whether a stop signal came: one the ranks agreed on at a step, or
    /// one that reached this process since (whether or not it cut the run:
    /// one during the last step does not).
    pub fn stop_requested(&self) -> bool {
        self.stop_seen.get() || self.stop.load(Ordering::Relaxed)
    }

    /// This process's stop request as a number to sum over ranks (1 when
    /// asked): the recipes add it to their per-step sums, so every rank
    /// stops at the same step.
    pub fn stop_vote(&self) -> f64 {
        f64::from(u8::from(self.stop.load(Ordering::Relaxed)))
    }

    /// The checkpoint to continue from, its state carrying `fingerprint`:
    /// none on a fresh start; an error when the folder holds checkpoints
    /// and no resume was asked, or when the run changed since (unless
    /// forced), naming the differences.
    pub fn resume_point(
        &self,
        how: Resume,
        fingerprint: &Fingerprint,
        device: &Device,
    ) -> anyhow::Result<Option<checkpoint::Loaded>> {
        // Rank 0 looks first (it removes interrupted saves), the others after.
        let latest = if self.lead() {
            let l = checkpoint::latest_as(&self.output_dir, how.prefix, device)?;
            self.comm.barrier()?;
            l
        } else {
            self.comm.barrier()?;
            checkpoint::latest_as(&self.output_dir, how.prefix, device)?
        };
        match (how.resume, latest) {
            (true, Some(mut ck)) => {
                let diff = fingerprint.differences(&ck.state.fingerprint);
                if !diff.is_empty() && !how.force {
                    bail!(
                        "cannot resume {} from `{}`: the run changed:\n  - {}\nhint: restore the original settings, or pass --force to resume anyway",
                        self.name,
                        ck.dir.display(),
                        diff.join("\n  - ")
                    );
                }
                ck.state.fingerprint = fingerprint.clone();
                tracing::info!("resuming {} at step {}", self.name, ck.state.step);
                Ok(Some(ck))
            }
            (false, Some(ck)) => bail!(
                "`{}` holds checkpoints of an earlier run (latest `{}`)\nhint: pass --resume to continue it, or choose another output folder",
                self.output_dir.display(),
                ck.dir.display()
            ),
            (_, None) => Ok(None),
        }
    }

    /// The start of a recipe that trains only `opt`'s variables (SFT,
    /// DPO), checkpoints `checkpoint-N`: the run's state, fresh, or the
    /// checkpoint's with the weights and the optimizer's moments restored
    /// ([`Run::resume_point`]; `resume` and `force` as there); rank 0's
    /// weights on every rank; the step it resumed at; the run log.
    pub fn start_optimizer(
        &self,
        resume: bool,
        force: bool,
        fingerprint: &Fingerprint,
        device: &Device,
        opt: &mut AdamW,
    ) -> anyhow::Result<(TrainerState, Option<u64>, Option<RunLog>)> {
        let how = Resume {
            resume,
            force,
            prefix: SFT_PREFIX,
        };
        let (state, resumed_from) = match self.resume_point(how, fingerprint, device)? {
            Some(ck) => {
                ck.restore(opt.vars())?;
                opt.load_state(&ck.optim, ck.state.step)?;
                let at = ck.state.step;
                (ck.state, Some(at))
            }
            None => (TrainerState::new(fingerprint.clone()), None),
        };
        self.share_lead_weights(opt.vars().iter().map(|(_, v)| v))?;
        Ok((state, resumed_from, self.log(resumed_from)?))
    }

    /// The end of a step: after step `step` of `total` (counted from 1), a
    /// checkpoint when `save_steps` divides it or the ranks agreed to stop
    /// (`stopping`), unless it was the last step (the run's outputs follow
    /// it); the ranks' `vars` are checked equal first and `save` runs on
    /// rank 0. Returns whether the run stops here: a stop during the last
    /// step comes too late to cut anything, and the run ends as a whole one.
    pub fn after_step<'v, T>(
        &self,
        step: u64,
        total: u64,
        save_steps: usize,
        stopping: bool,
        vars: impl IntoIterator<Item = &'v Var>,
        save: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<bool> {
        let periodic = save_steps > 0 && step.is_multiple_of(save_steps as u64);
        if (periodic || stopping) && step < total {
            self.check_in_sync(vars)?;
            if self.lead() {
                save()?;
            }
        }
        if stopping {
            self.stop_seen.set(true);
        }
        if stopping && step < total {
            crate::stop::cut_short();
        }
        Ok(stopping && step < total)
    }

    /// [`Run::after_step`] for a recipe that trains only `opt`'s
    /// variables (SFT, DPO): its checkpoint `checkpoint-N` holds them and
    /// their moments, the newest `keep` kept.
    pub fn after_optimizer_step(
        &self,
        state: &TrainerState,
        total: u64,
        save_steps: usize,
        keep: usize,
        stopping: bool,
        opt: &AdamW,
    ) -> anyhow::Result<bool> {
        let vars = opt.vars().iter().map(|(_, v)| v);
        self.after_step(state.step, total, save_steps, stopping, vars, || {
            checkpoint::save_optimizer(&self.output_dir, SFT_PREFIX, state, opt, keep)
        })
    }

    /// The end of such a run's loop: the ranks' weights checked equal and,
    /// unless a stop `interrupted` it, the last checkpoint saved on rank 0.
    /// Whether this rank now writes the run's outputs (rank 0 of a run
    /// that was not interrupted).
    pub fn finish_optimizer(
        &self,
        state: &TrainerState,
        keep: usize,
        interrupted: bool,
        opt: &AdamW,
    ) -> anyhow::Result<bool> {
        self.check_in_sync(opt.vars().iter().map(|(_, v)| v))?;
        let write = !interrupted && self.lead();
        if write {
            checkpoint::save_optimizer(&self.output_dir, SFT_PREFIX, state, opt, keep)?;
        }
        Ok(write)
    }

    /// Every rank takes rank 0's values of `vars` (equal already when
    /// initialisation and checkpoint agree; this makes it certain).
    pub fn share_lead_weights<'v>(
        &self,
        vars: impl IntoIterator<Item = &'v Var>,
    ) -> anyhow::Result<()> {
        let vars: Vec<&Var> = vars.into_iter().collect();
        dist::share_lead(self.comm, &vars)
    }

    /// Fails unless every rank holds the same values of `vars` (a digest
    /// compared over ranks).
    pub fn check_in_sync<'v>(&self, vars: impl IntoIterator<Item = &'v Var>) -> anyhow::Result<()> {
        let ts: Vec<Tensor> = vars.into_iter().map(|v| v.as_tensor().clone()).collect();
        dist::check_in_sync(self.comm, &ts)
    }

    /// The run log on rank 0 (none elsewhere), keeping the steps up to
    /// `resumed_from` (all of them on a fresh start: none).
    pub fn log(&self, resumed_from: Option<u64>) -> anyhow::Result<Option<RunLog>> {
        Ok(if self.lead() {
            Some(RunLog::open(&self.output_dir, resumed_from)?)
        } else {
            None
        })
    }

    /// Logs a step's `scalars` on rank 0 (`log` is [`Run::log`]'s), with
    /// the step's peak device memory (on a GPU) and the world size added.
    pub fn log_step(
        &self,
        log: &mut Option<RunLog>,
        step: u64,
        mut scalars: Vec<(&str, f64)>,
        device: &Device,
    ) -> anyhow::Result<()> {
        if let Some(gib) = crate::gpu::peak_memory_gib(device)? {
            scalars.push(("peak_mem_gib", gib));
        }
        if let Some(log) = log.as_mut() {
            scalars.push(("world_size", self.comm.world() as f64));
            log.log(step, &scalars)?;
        }
        Ok(())
    }

    /// The curves of the run log (rank 0). The trained outputs are safe
    /// by the time this runs: a failed drawing only warns.
    pub fn draw_curves(&self) {
        if !self.lead() {
            return;
        }
        if let Err(e) = runlog::read_metrics(&self.output_dir.join(runlog::METRICS_FILE))
            .and_then(|r| runlog::curves::draw(&self.output_dir, &r))
        {
            tracing::warn!(
                "{}: curves not drawn: {e:#}\nhint: `trace-train report {}` draws them again",
                self.name,
                self.output_dir.display()
            );
        }
    }
}
