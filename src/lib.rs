//! trace-train: post-training language models on verifiable tasks, first
//! the Trace task.
//!
//! Data flows one way: the binary's command line and stages (`generate`,
//! the pipeline) → [`recipes`] (one training loop a method) → [`kit`] (what
//! every recipe's run is built from) → [`env`] (the tasks and their scores)
//! → parts (`eval`, `rl`, `pref`, `train`, `model`, `data`, `sandbox`, ...).
//! `tests/layers.rs` holds the layers and refuses an import that runs back
//! up. See ARCHITECTURE.md.

pub mod atomic;
pub mod bench;
pub mod config;
pub mod data;
pub mod dataset;
pub mod dist;
pub mod env;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod kit;
pub mod model;
pub mod pref;
pub mod progress;
pub mod prompt;
pub mod recipes;
pub mod reward;
pub mod rl;
pub mod rng;
pub mod runlog;
pub mod sandbox;
pub mod serve;
pub mod stop;
pub mod train;
pub mod transform;

/// Lowercase hex of `bytes` (digests, ids, raw bytes in reports).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
