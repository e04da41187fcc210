//! Causal language models with LoRA, on candle: the crate every other part
//! of trace-train runs a model through. Nothing here knows about datasets,
//! environments or training loops; the compiler keeps it so, since this
//! crate depends on nothing of the project's but `trace-train-base`.
//!
//! Owns loading a Hugging Face model folder (`config.json` plus
//! `model.safetensors` or a sharded `model.safetensors.index.json`) into a
//! [`LoadedModel`]: the architecture with frozen, mmapped base weights and,
//! optionally, LoRA factors in a `VarMap` (the only parameters an optimizer
//! should see). The folders, by concern:
//!
//! - [`arch`]: each architecture as a config adapter onto the shared decoder
//!   ([`arch::qwen3`], [`arch::llama`]) and [`arch::tiny`], small random
//!   models for tests.
//! - [`layers`]: the building blocks, one a file: [`layers::decoder`] (the
//!   decoder both architectures share, with gradient checkpointing),
//!   [`layers::attention`] (with the KV cache), [`layers::lora`],
//!   [`layers::nf4`], [`layers::norm`], [`layers::rope`], [`layers::ops`]
//!   (linear layers with hand-written backward passes), [`layers::fused`],
//!   [`layers::segments`] (packed rows).
//! - [`decode`]: batched decoding ([`decode::generate`], greedy or sampled),
//!   the scheduler's rows ([`decode::slots`]), prefill, the sampling rule
//!   ([`decode::draw`]) and, on CUDA, the fused decode step.
//! - [`cuda`]: the project's own CUDA kernels (`kernels/*.cu`, compiled by
//!   this crate's `build.rs`) and, with the `cudnn` feature, fused attention
//!   with a backward through cuDNN.
//! - [`io`]: adapters on disk in PEFT's format ([`io::adapter`]), finding a
//!   model folder ([`io::resolve`]), importing a llama.cpp GGUF ([`io::gguf`]).
//!
//! Tensor code takes its device from the weights or a `&Device`, so the same
//! code runs on CPU and CUDA.

pub mod arch;
mod common;
pub mod cuda;
pub mod decode;
pub mod io;
pub mod layers;

pub use decode::generate::{Generation, Sampling, greedy, sample};
pub use io::resolve::resolve;
pub use layers::attention::Cache;
pub use layers::lora::{
    BaseLinear, BasePrecision, LoraAdapter, LoraConfig, LoraInit, LoraLinear, TargetModule,
};

pub use arch::{Architecture, LoadedModel, Model, build, load};
pub use common::{
    CONFIG_FILE, ModelError, Result, Unsupported, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, max_abs_diff,
    save_safetensors, weight_files,
};
pub use cuda::attention_graph_builds;
