//! The recipes: one training loop a method, each read top to bottom with
//! its phases as named functions, and each taking what surrounds its loop
//! (lock, load, resume, checkpoints, outputs) from the kit
//! ([`crate::kit`]), never from another recipe:
//!
//! - [`sft`]: LoRA supervised fine-tuning (Stages 1 and 2);
//! - [`ppo`]: online RL against an environment (PPO with a value head and
//!   GAE, or GRPO), with its off-policy sampler ranks;
//! - [`dpo`]: preference optimisation on scored pairs.
//!
//! Above the recipes are the command line and the pipeline; below them the
//! environments ([`crate::env`]) and the parts (`rl`, `train`, `pref`,
//! `eval`, `data`, `model`, `sandbox`), which never import a recipe.

pub mod dpo;
pub mod ppo;
pub mod sft;
