//! Stage 3: online RL against an environment (PPO with a value head and
//! GAE, or GRPO with group-relative advantages), and its parts.
//!
//! Parts, one a file: [`advantage`] (per-token rewards, GAE, whitening,
//! GRPO advantages, dynamic sampling), [`loss`] (clipped policy and value
//! losses, entropy, KL estimators, aggregation), [`value`] (the critic's
//! MLP head), [`curriculum`] (difficulty buckets, promotion), [`env`] (the
//! environment trait, the trace and word environments, the task stream made
//! on a worker thread), [`memory`] (the token budget of a pass's
//! micro-batches); the recipe is [`ppo`]. Nothing here
//! knows about the command line.

pub mod advantage;
pub mod curriculum;
pub mod env;
pub mod loss;
pub mod memory;
pub mod mixture;
pub mod ppo;
pub mod value;
