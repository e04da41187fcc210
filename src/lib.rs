//! trace-train: post-training language models on verifiable tasks, first
//! the Trace task.
//!
//! Data flows one way: the binary's command line and stages (`generate`,
//! the pipeline) → [`recipes`] (one training loop a method) → [`kit`] (what
//! every recipe's run is built from) → [`env`] (the tasks and their scores)
//! → parts (`eval`, `rl`, `pref`, `train`, `model`, `data`, `sandbox`, ...).
//! `tests/layers.rs` holds the layers and refuses an import that runs back
//! up. See ARCHITECTURE.md.

pub mod bench;
pub mod config;
pub mod data;
pub mod dataset;
pub mod dist;
pub mod env;
pub mod eval;
pub mod generate;
pub mod kit;
pub mod pref;
pub mod prompt;
pub mod recipes;
pub mod reward;
pub mod rl;
pub mod runlog;
pub mod serve;
pub mod train;
pub mod transform;

// The crates below this one, under the names the rest of the library and
// its users have always used (`crate::model::...`, `trace_train::sandbox`).
pub use trace_train_base::{atomic, gpu, hex, progress, rng, stop};
pub use trace_train_model as model;
pub use trace_train_sandbox as sandbox;
