//! Training: the SFT recipe (`sft.rs`, one loop read top to bottom) and the
//! parts recipes share: the optimizer, the schedule, token losses and
//! checkpoints. Only this module brings model, data and optimizer together.

pub mod checkpoint;
pub mod loss;
pub mod optim;
pub mod schedule;
pub mod sft;
