//! What every recipe does around its optimizer step: the next step's
//! micro-batches from the saved data position, the non-finite guard, and
//! the clipping factor.

use anyhow::bail;

use super::checkpoint::TrainerState;

/// Consecutive non-finite steps tolerated before a run stops.
pub const MAX_BAD_STEPS: u64 = 10;

/// Optimizer steps of a run of `epochs` epochs of `per_epoch`
/// micro-batches, `accum` a step (an epoch's last step may be shorter), at
/// most `max_steps`.
pub fn planned_steps(per_epoch: usize, accum: usize, epochs: usize, max_steps: Option<u64>) -> u64 {
    let all = per_epoch.div_ceil(accum) as u64 * epochs as u64;
    max_steps.map_or(all, |m| all.min(m))
}

/// The micro-batches of the next optimizer step: up to `accum` entries of
/// `plan`, the epoch's plan, from the data position in `state` (advanced
/// past them); at an epoch's end the step is shorter, and the next one
/// starts the next epoch with `replan(epoch)`.
pub fn next_micro_batches(
    state: &mut TrainerState,
    accum: usize,
    plan: &mut Vec<Vec<usize>>,
    replan: impl Fn(u64) -> Vec<Vec<usize>>,
) -> Vec<Vec<usize>> {
    let mut micro: Vec<Vec<usize>> = Vec::with_capacity(accum);
    while micro.len() < accum {
        if state.batch >= plan.len() {
            if !micro.is_empty() {
                break; // the epoch's last, shorter step
            }
            state.epoch += 1;
            state.batch = 0;
            *plan = replan(state.epoch as u64);
        }
        micro.push(plan[state.batch].clone());
        state.batch += 1;
    }
    micro
}

/// A step's gradients of `opt`'s variables summed over `comm`'s ranks; a
/// rank with no share of the step (an epoch's short last step on many
/// ranks) adds zeros.
pub fn summed_over_ranks(
    comm: &dyn crate::dist::Communicator,
    grads: Option<Vec<candle_core::Tensor>>,
    opt: &crate::train::optim::AdamW,
) -> anyhow::Result<Vec<candle_core::Tensor>> {
    let grads = match grads {
        Some(g) => g,
        None => opt
            .vars()
            .iter()
            .map(|(_, v)| v.as_tensor().zeros_like())
            .collect::<candle_core::Result<_>>()?,
    };
    crate::dist::all_reduce_sum(comm, &grads)
}

/// Consecutive dead steps (see [`Guard`]) that mean the weights diverged.
pub const MAX_DEAD_STEPS: u64 = 5;

/// Watches each step's loss and gradient norm for a run gone wrong:
///
/// - a non-finite loss or gradient skips the step; [`MAX_BAD_STEPS`] in a
///   row stop the run;
/// - a dead step, whose gradient norm is zero (nothing reaches the
///   adapter) or whose token loss sits at the uniform distribution's
///   entropy ln(vocabulary) (the logits no longer depend on the input),
///   is taken; [`MAX_DEAD_STEPS`] in a row stop the run as diverged. A
///   live model, even a random one, has a gradient and a loss off ln(V).
///
/// Either stop sets aside the checkpoints saved since the streak began (the
/// weights that produced it), renamed `diverged-<name>` so that no resume
/// and no final model comes from them, and names the last good one.
#[derive(Debug, Default)]
pub struct Guard {
    bad_in_a_row: u64,
    dead_in_a_row: u64,
    /// The step whose weights began the current streak.
    onset: Option<u64>,
    /// ln(vocabulary), for a recipe whose loss is the token cross-entropy.
    uniform_loss: Option<f64>,
    /// The lead rank's output folder and its checkpoints' prefix.
    checkpoints: Option<(std::path::PathBuf, String)>,
}

impl Guard {
    /// A guard that sets aside `out_dir`'s `<prefix><step>` checkpoints
    /// when it stops a run (give `None` on every rank but the lead).
    pub fn new(out_dir: Option<&std::path::Path>, prefix: &str) -> Self {
        Guard {
            checkpoints: out_dir.map(|d| (d.to_owned(), prefix.to_owned())),
            ..Guard::default()
        }
    }

    /// Also counts a token loss pinned at ln(`vocab`) as dead.
    pub fn with_vocab(mut self, vocab: usize) -> Self {
        self.uniform_loss = (vocab > 1).then(|| (vocab as f64).ln());
        self
    }

    /// Whether the step (numbered from 0) may update the weights; a skipped
    /// one is counted in `state.skipped_steps`, and the tenth in a row is
    /// an error naming `stage`; the fifth dead step in a row is too.
    pub fn admits(
        &mut self,
        stage: &str,
        state: &mut TrainerState,
        loss: f64,
        grad_norm: f64,
    ) -> anyhow::Result<bool> {
        if loss.is_finite() && grad_norm.is_finite() {
            self.bad_in_a_row = 0;
            if let Some(why) = self.dead(loss, grad_norm) {
                self.onset.get_or_insert(state.step);
                self.dead_in_a_row += 1;
                if self.dead_in_a_row >= MAX_DEAD_STEPS {
                    let aside = self.set_aside()?;
                    bail!(
                        "{stage} diverged: {why} for {} steps in a row, from step {}{aside}\nhint: lower the learning rate",
                        self.dead_in_a_row,
                        self.onset.unwrap_or(state.step) + 1
                    );
                }
            } else {
                self.dead_in_a_row = 0;
                self.onset = None;
            }
            return Ok(true);
        }
        self.dead_in_a_row = 0;
        if self.bad_in_a_row == 0 {
            self.onset = Some(state.step);
        }
        state.skipped_steps += 1;
        self.bad_in_a_row += 1;
        tracing::warn!(
            "step {}: non-finite loss or gradient, skipped",
            state.step + 1
        );
        if self.bad_in_a_row >= MAX_BAD_STEPS {
            let aside = self.set_aside()?;
            bail!(
                "{stage} stopped: {} steps in a row had a non-finite loss or gradient{aside}\nhint: lower the learning rate",
                self.bad_in_a_row
            );
        }
        Ok(false)
    }

    /// RL's check after a step's update, in place of [`Self::admits`]:
    /// `finite` is false when every minibatch of the step had a non-finite
    /// loss or gradient (and was skipped); `entropy` is the policy's mean
    /// token entropy over the step, in nats. A policy at ln(vocabulary) is
    /// uniform: its logits no longer depend on the input, the mark of
    /// weights blown apart. A zero gradient is no sign in RL (a batch whose
    /// groups all scored alike has no advantage to follow), so it is not
    /// counted. Stops the run as [`Self::admits`] does.
    pub fn admits_rl(
        &mut self,
        stage: &str,
        state: &mut TrainerState,
        finite: bool,
        entropy: f64,
    ) -> anyhow::Result<()> {
        if !finite {
            // Counted as skipped where the minibatches were.
            self.dead_in_a_row = 0;
            if self.bad_in_a_row == 0 {
                self.onset = Some(state.step);
            }
            self.bad_in_a_row += 1;
            if self.bad_in_a_row >= MAX_BAD_STEPS {
                let aside = self.set_aside()?;
                bail!(
                    "{stage} stopped: {} steps in a row had a non-finite loss or gradient in every minibatch{aside}\nhint: lower the learning rate",
                    self.bad_in_a_row
                );
            }
            return Ok(());
        }
        self.bad_in_a_row = 0;
        let uniform = self
            .uniform_loss
            .filter(|u| entropy.is_finite() && (entropy - u).abs() <= 1e-3 * u);
        match uniform {
            Some(u) => {
                self.onset.get_or_insert(state.step);
                self.dead_in_a_row += 1;
                if self.dead_in_a_row >= MAX_DEAD_STEPS {
                    let aside = self.set_aside()?;
                    bail!(
                        "{stage} diverged: the policy's entropy sat at ln(vocabulary) = {u:.4}, the uniform distribution's, for {} steps in a row, from step {}{aside}\nhint: lower the learning rate",
                        self.dead_in_a_row,
                        self.onset.unwrap_or(state.step) + 1
                    );
                }
            }
            None => {
                self.dead_in_a_row = 0;
                self.onset = None;
            }
        }
        Ok(())
    }

    /// The end of a run that was not interrupted: a streak of dead or
    /// non-finite steps still running at the last step stops it too, so no
    /// final model comes from the weights that produced it.
    pub fn finish(&self, stage: &str) -> anyhow::Result<()> {
        if self.dead_in_a_row == 0 && self.bad_in_a_row == 0 {
            return Ok(());
        }
        let aside = self.set_aside()?;
        bail!(
            "{stage} diverged: its last {} steps had a zero gradient, a loss at the uniform prediction's or a non-finite one{aside}\nhint: lower the learning rate",
            self.dead_in_a_row + self.bad_in_a_row
        )
    }

    /// How many checkpoints to keep when `keep` are asked for: during a
    /// streak, the streak's too, so that rotation never removes the good
    /// checkpoints before it while the doubtful ones pile up.
    pub fn keep(&self, keep: usize) -> usize {
        match self.dead_in_a_row + self.bad_in_a_row {
            0 => keep,
            n => keep.saturating_add(n as usize + 1),
        }
    }

    /// Why a finite step is dead, if it is.
    fn dead(&self, loss: f64, grad_norm: f64) -> Option<String> {
        if grad_norm == 0.0 {
            return Some("the gradient norm was 0".into());
        }
        let u = self.uniform_loss?;
        ((loss - u).abs() <= 1e-6 * u)
            .then(|| format!("the loss sat at ln(vocabulary) = {u:.4}, the uniform prediction's"))
    }

    /// Sets aside the streak's checkpoints; says what is left.
    fn set_aside(&self) -> anyhow::Result<String> {
        let Some((dir, prefix)) = &self.checkpoints else {
            return Ok(String::new());
        };
        let from = self.onset.unwrap_or(0);
        let (aside, kept) = super::checkpoint::set_aside_from(dir, prefix, from)?;
        let mut said = String::new();
        if !aside.is_empty() {
            let names: Vec<String> = aside.iter().map(|p| format!("`{}`", p.display())).collect();
            said += &format!(
                "\nthe checkpoints saved since are set aside: {}",
                names.join(", ")
            );
        }
        said += &match kept {
            Some(k) => format!(
                "\nthe last good checkpoint is `{}`; no final model was written",
                k.display()
            ),
            None => "\nno checkpoint precedes it; no final model was written".into(),
        };
        Ok(said)
    }
}

/// The factor that clips a gradient of global norm `norm` to `max` (1 when
/// within it, or when `max` is 0: no clipping).
pub fn clip_scale(norm: f64, max: f64) -> f64 {
    if norm > max && max > 0.0 {
        max / norm
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::checkpoint::{SFT_PREFIX, TrainerState};

    fn state() -> TrainerState {
        serde_json::from_value(serde_json::json!({
            "step": 0, "epoch": 0, "batch": 0, "tokens_seen": 0, "skipped_steps": 0,
            "extra": null,
            "fingerprint": {"config": {}, "base_model": "m", "base_weights": "w",
                            "train_data_sha256": "d", "tokenizer_sha256": "t"}
        }))
        .unwrap()
    }

    /// Feeds `(loss, grad_norm)` steps; the step at which the guard stopped.
    fn run(guard: &mut Guard, steps: &[(f64, f64)]) -> Option<(u64, String)> {
        let mut s = state();
        for &(loss, norm) in steps {
            if let Err(e) = guard.admits("warmup", &mut s, loss, norm) {
                return Some((s.step, format!("{e:#}")));
            }
            s.step += 1;
        }
        guard
            .finish("warmup")
            .err()
            .map(|e| (s.step, format!("{e:#}")))
    }

    /// RL: `(finite, entropy)` a step; the step at which it stopped.
    fn run_rl(guard: &mut Guard, steps: &[(bool, f64)]) -> Option<(u64, String)> {
        let mut s = state();
        for &(finite, entropy) in steps {
            if let Err(e) = guard.admits_rl("stage3_ppo", &mut s, finite, entropy) {
                return Some((s.step, format!("{e:#}")));
            }
            s.step += 1;
        }
        guard
            .finish("stage3_ppo")
            .err()
            .map(|e| (s.step, format!("{e:#}")))
    }

    #[test]
    fn an_rl_policy_collapsed_to_uniform_stops_and_its_checkpoints_go_aside() {
        let v = 50_000f64.ln();
        // A live policy, even a near-uniform random one, passes; zero
        // gradients are not counted in RL (GRPO groups that all scored
        // alike have none).
        let live: Vec<_> = (0..20).map(|i| (true, v - 0.05 - 0.1 * i as f64)).collect();
        assert!(run_rl(&mut Guard::default().with_vocab(50_000), &live).is_none());
        let d = tempfile::tempdir().unwrap();
        for step in [2, 4, 6] {
            std::fs::create_dir(d.path().join(format!("step_{step}"))).unwrap();
        }
        let mut steps = vec![(true, 3.0); 3];
        steps.extend([(true, v); 10]);
        let mut g = Guard::new(Some(d.path()), "step_").with_vocab(50_000);
        let (at, e) = run_rl(&mut g, &steps).unwrap();
        assert_eq!(at, 3 + MAX_DEAD_STEPS - 1);
        assert!(
            e.contains("stage3_ppo diverged") && e.contains("entropy") && e.contains("from step 4"),
            "{e}"
        );
        assert!(d.path().join("step_2").is_dir());
        assert!(
            d.path().join("diverged-step_4").is_dir() && d.path().join("diverged-step_6").is_dir()
        );
        assert!(e.contains("`step_2`") || e.contains("step_2`"), "{e}");
        // Every minibatch non-finite, ten steps in a row: stopped too.
        let mut steps = vec![(true, 3.0)];
        steps.extend([(false, f64::NAN); 10]);
        let (at, e) = run_rl(&mut Guard::default().with_vocab(50_000), &steps).unwrap();
        assert_eq!(at, 10);
        assert!(e.contains("non-finite"), "{e}");
    }

    #[test]
    fn a_live_run_passes() {
        let v = 50_000f64.ln();
        // A random model starts near ln(V) but not on it, and learns.
        let steps: Vec<_> = (0..20).map(|i| (v + 0.01 - 0.1 * i as f64, 1.0)).collect();
        assert!(run(&mut Guard::default().with_vocab(50_000), &steps).is_none());
    }

    #[test]
    fn a_loss_pinned_at_ln_vocab_stops_the_run() {
        let v = 50_000f64.ln();
        let mut steps = vec![(10.0, 3.0), (8.0, 2.0)];
        steps.extend([(v, 0.5); 10]);
        let (at, e) = run(&mut Guard::default().with_vocab(50_000), &steps).unwrap();
        assert_eq!(at, 2 + MAX_DEAD_STEPS - 1, "stopped on the fifth dead step");
        assert!(
            e.contains("diverged") && e.contains("ln(vocabulary)"),
            "{e}"
        );
        assert!(
            e.contains("from step 3") && e.contains("learning rate"),
            "{e}"
        );
        // Without the vocabulary the loss alone says nothing.
        assert!(run(&mut Guard::default(), &steps).is_none());
    }

    #[test]
    fn a_zero_gradient_stops_the_run_and_a_break_resets_the_count() {
        let mut steps = vec![(1.0, 0.0); 4];
        steps.push((1.0, 0.3));
        steps.extend([(1.0, 0.0); 4]);
        steps.push((0.9, 0.2));
        assert!(run(&mut Guard::default(), &steps).is_none());
        steps.extend([(1.0, 0.0); 5]);
        let (at, e) = run(&mut Guard::default(), &steps).unwrap();
        assert_eq!(at, 14);
        assert!(e.contains("gradient norm was 0"), "{e}");
    }

    #[test]
    fn a_streak_at_the_end_writes_no_final_model() {
        let (at, e) = run(&mut Guard::default(), &[(1.0, 0.5), (1.0, 0.0)]).unwrap();
        assert_eq!(at, 2, "stopped at the end, not in the loop");
        assert!(e.contains("diverged"), "{e}");
        let nan = run(&mut Guard::default(), &[(1.0, 0.5), (f64::NAN, 1.0)]).unwrap();
        assert!(nan.1.contains("non-finite"), "{}", nan.1);
    }

    #[test]
    fn the_streaks_checkpoints_are_set_aside_and_the_last_good_named() {
        let d = tempfile::tempdir().unwrap();
        for step in [2, 4, 6, 8] {
            std::fs::create_dir(d.path().join(format!("{SFT_PREFIX}{step}"))).unwrap();
        }
        let mut g = Guard::new(Some(d.path()), SFT_PREFIX);
        // Steps 0-3 live, 4 onwards dead: the weights of checkpoints 4, 6
        // and 8 produced dead steps.
        let mut steps = vec![(2.0, 1.0); 4];
        steps.extend([(2.0, 0.0); 5]);
        let (_, e) = run(&mut g, &steps).unwrap();
        let names = |p: &str| d.path().join(p).is_dir();
        assert!(names("checkpoint-2"), "the good one stays");
        for step in [4, 6, 8] {
            assert!(!names(&format!("checkpoint-{step}")), "{step} moved");
            assert!(
                names(&format!("diverged-checkpoint-{step}")),
                "{step} kept aside"
            );
        }
        assert!(
            e.contains("last good checkpoint") && e.contains("checkpoint-2`"),
            "{e}"
        );
    }

    #[test]
    fn non_finite_steps_stop_after_ten_and_set_aside_from_the_first() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("checkpoint-1")).unwrap();
        std::fs::create_dir(d.path().join("checkpoint-3")).unwrap();
        let mut steps = vec![(1.0, 1.0); 2];
        steps.extend([(f64::INFINITY, 1.0); 10]);
        let (at, e) = run(&mut Guard::new(Some(d.path()), SFT_PREFIX), &steps).unwrap();
        assert_eq!(at, 11);
        assert!(e.contains("non-finite"), "{e}");
        assert!(d.path().join("checkpoint-1").is_dir());
        assert!(d.path().join("diverged-checkpoint-3").is_dir());
    }
}
