//! trace-train: post-training language models on the Trace task.
//!
//! Data flows one way: `cli` → `pipeline` → stages (`generate`, later
//! `train`, `eval`) → parts (`sandbox`, `transform`, `reward`, `dataset`,
//! `config`). See ARCHITECTURE.md.

pub mod config;
pub mod model;
pub mod reward;
pub mod sandbox;
