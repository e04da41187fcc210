//! trace-train: post-training language models on the Trace task.
//!
//! Data flows one way: the binary's `main` (command line) → stages
//! (`generate`, `eval`; training stages join them) → parts (`sandbox`,
//! `transform`, `reward`, `prompt`, `dataset`, `config`, `atomic`, `model`,
//! `affine`: the sibling tasks SAT, ABD and DED).
//! See ARCHITECTURE.md.

pub mod affine;
pub mod atomic;
pub mod bench;
pub mod config;
pub mod data;
pub mod dataset;
pub mod dist;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod kit;
pub mod model;
pub mod pref;
pub mod progress;
pub mod prompt;
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
