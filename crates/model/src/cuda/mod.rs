//! What runs only on CUDA: the project's own kernels and cuDNN's attention.

#[cfg(feature = "cuda")]
pub mod fp8;
#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod lt;
#[cfg(feature = "cudnn")]
pub mod sdpa_cudnn;

/// Fused-attention graphs built so far in this process and the seconds
/// their builds took (one a new shape and direction; none without the
/// `cudnn` feature).
pub fn attention_graph_builds() -> (u64, f64) {
    #[cfg(feature = "cudnn")]
    {
        sdpa_cudnn::graph_builds()
    }
    #[cfg(not(feature = "cudnn"))]
    {
        (0, 0.0)
    }
}
