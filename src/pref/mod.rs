//! Preference optimisation from the model's own rollouts: sample and score
//! answers ([`rollout`]), pair correct over incorrect answers ([`pairs`]),
//! and train on the pairs with DPO ([`dpo`], the recipe; its losses and
//! metrics in [`loss`]). Nothing here knows about the command line.

pub mod loss;
pub mod pairs;
pub mod rollout;
