//! The kit every recipe builds its run from: the SFT recipe
//! ([`crate::recipes::sft`]), PPO/GRPO ([`crate::recipes::ppo`]) and DPO
//! ([`crate::recipes::dpo`]) each are one loop over their own steps, and take
//! everything around that loop from here, never from each other:
//!
//! - [`Run`]: the output folder's lock, the stop flag, the resume decision
//!   (the newest valid checkpoint, refused with the differences when the
//!   run changed), rank 0's weights shared at the start, the run log and
//!   the curves at the end;
//! - [`step`]: the next step's micro-batches from the data position, the
//!   non-finite guard, gradient clipping;
//! - [`load`]: tokenizer and model with a fresh LoRA adapter, the training
//!   dtype, the base held in bf16, NF4 or FP8, the target modules; the
//!   model for inference (`eval`, `serve`) held the same way;
//! - [`fingerprint`]: what a resume must find unchanged;
//! - [`checkpoint`]: atomic, hashed checkpoints that resume bit for bit;
//! - [`outputs`] and [`card`]: `final/` (PEFT's layout), `merged/`, their
//!   model cards and `generation_config.json`, `train_config.json`.
//!
//! Below the kit are the parts (`model`, `data`, `runlog`, `dist`,
//! `train::optim`, `train::loss`); nothing here knows a recipe.

pub mod card;
pub mod checkpoint;
pub mod fingerprint;
pub mod load;
pub mod outputs;
mod run;
pub mod step;

pub use run::{Resume, Run, RunOptions};
pub use step::{Guard, clip_scale, next_micro_batches, planned_steps, summed_over_ranks};
