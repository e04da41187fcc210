//! Training: the SFT recipe (`sft.rs`, one loop read top to bottom) and the
//! parts recipes share: the optimizer, the schedule, token losses and
//! checkpoints, and the model card a trained folder carries (`card.rs`). Only this module brings model, data and optimizer together.

pub mod card;
pub mod checkpoint;
pub mod loss;
pub mod optim;
pub mod schedule;
pub mod sft;
