//! Decoding: batched generation, the scheduler's rows, prefill, the
//! sampling rule, and on CUDA the fused decode step.

pub mod draw;
#[cfg(feature = "cuda")]
pub mod fast_decode;
pub mod generate;
#[cfg(feature = "cuda")]
pub mod lt_products;
pub mod prefill;
pub mod slots;
