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

/// Skips steps whose loss or gradient is not finite, and stops a run that
/// has too many in a row.
#[derive(Debug, Default)]
pub struct Guard {
    bad_in_a_row: u64,
}

impl Guard {
    /// Whether the step (numbered from 0) may update the weights; a skipped
    /// one is counted in `state.skipped_steps`, and the tenth in a row is
    /// an error naming `stage`.
    pub fn admits(
        &mut self,
        stage: &str,
        state: &mut TrainerState,
        loss: f64,
        grad_norm: f64,
    ) -> anyhow::Result<bool> {
        if loss.is_finite() && grad_norm.is_finite() {
            self.bad_in_a_row = 0;
            return Ok(true);
        }
        state.skipped_steps += 1;
        self.bad_in_a_row += 1;
        tracing::warn!(
            "step {}: non-finite loss or gradient, skipped",
            state.step + 1
        );
        if self.bad_in_a_row >= MAX_BAD_STEPS {
            bail!(
                "{stage} stopped: {} steps in a row had a non-finite loss or gradient (last checkpoint is intact)\nhint: lower the learning rate",
                self.bad_in_a_row
            );
        }
        Ok(false)
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
