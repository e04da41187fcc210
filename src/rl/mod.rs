//! Stage 3: online RL against an environment (PPO with a value head and
//! GAE, or GRPO with group-relative advantages), and its parts.
//!
//! Parts, one a file: [`advantage`] (per-token rewards, GAE, whitening,
//! GRPO advantages, dynamic sampling), [`loss`] (clipped policy and value
//! losses, entropy, KL estimators, aggregation), [`value`] (the critic's
//! MLP head), [`curriculum`] (difficulty buckets, promotion), [`memory`]
//! (the token budget of a pass's micro-batches); the recipe is
//! `recipes::ppo`, the environments are `env`'s. Nothing here knows a
//! recipe or the command line.

pub mod advantage;
pub mod curriculum;
pub mod loss;
pub mod memory;
pub mod value;
