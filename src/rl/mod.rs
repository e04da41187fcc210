//! Stage 3's parts: what online RL against an environment computes, below
//! its recipe (`recipes::ppo`), which alone knows the loop.
//!
//! Parts, one a file: [`algorithm`] (the seam: each algorithm's advantages,
//! policy loss and aggregation: PPO, GRPO, Dr. GRPO, GSPO), [`advantage`]
//! (per-token rewards, GAE, whitening, group advantages, dynamic sampling),
//! [`loss`] (clipped policy and value losses, entropy, KL estimators,
//! aggregation), [`value`] (the critic's MLP head), [`curriculum`]
//! (difficulty buckets, promotion), [`memory`] (the token budget of a
//! pass's micro-batches). Nothing here knows a recipe or the command line.

pub mod advantage;
pub mod algorithm;
pub mod curriculum;
pub mod loss;
pub mod memory;
pub mod value;
