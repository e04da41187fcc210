//! Training parts every recipe uses (the optimizer, the schedule, token
//! losses) and the SFT recipe (`sft.rs`, one loop read top to bottom). The
//! run around a recipe's loop (lock, load, resume, checkpoints, outputs) is
//! the kit's ([`crate::kit`]).

pub mod completion;
pub mod loss;
pub mod optim;
pub mod schedule;
pub mod select;
