//! Models on disk and on the Hub: PEFT adapters, finding a model folder,
//! importing and exporting a GGUF, pushing a folder to the Hub.

pub mod adapter;
pub mod gguf;
pub mod push;
pub mod resolve;
