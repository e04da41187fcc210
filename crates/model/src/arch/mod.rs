//! Architectures: each reads its `config.json` into the shared decoder's
//! spec, and tiny random models for tests.

pub mod llama;
pub mod qwen3;
pub mod tiny;
