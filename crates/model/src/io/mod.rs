//! Models on disk: PEFT adapters, finding a model folder, importing a GGUF.

pub mod adapter;
pub mod gguf;
pub mod resolve;
