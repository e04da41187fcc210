//! What runs only on CUDA: the project's own kernels and cuDNN's attention.

#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cudnn")]
pub mod sdpa_cudnn;
