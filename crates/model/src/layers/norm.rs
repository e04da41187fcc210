//! RMSNorm (Zhang & Sennrich 2019, eq. (4)): `x / sqrt(mean(x^2) + eps) * g`.
//!
//! candle's fused `rms_norm` kernel has no backward pass, so it would cut
//! the graph between two LoRA layers. This norm uses it only when its input
//! carries no gradient (inference, or ahead of the first adapter) and the
//! composed, differentiable form otherwise. Both compute in f32, as HF does.

use candle_core::{D, DType, Result, Tensor};
use candle_nn::VarBuilder;

/// A frozen RMSNorm over the last dimension.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `(size,)`, in the model's dtype.
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Reads `weight` of size `size` at `vb`'s prefix.
    pub fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get(size, "weight")?,
            eps,
        })
    }

    /// `(size,)`, in the model's dtype.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// `(.., size) -> (.., size)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.track_op() {
            self.forward_differentiable(x)
        } else {
            crate::layers::fused::rms_norm(x, &self.weight, self.eps as f32)
        }
    }

    /// The fused forward, building no graph.
    pub fn forward_detached(&self, x: &Tensor) -> Result<Tensor> {
        crate::layers::fused::rms_norm(&x.detach(), &self.weight, self.eps as f32)
    }

    /// `dL/dx` for `dL/dy = dy` at input `x` ([`crate::layers::fused::rmsnorm_backward`]).
    pub fn backward(&self, x: &Tensor, dy: &Tensor) -> Result<Tensor> {
        crate::layers::fused::rmsnorm_backward(x, &self.weight, dy, self.eps)
    }

    fn forward_differentiable(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let x = x.to_dtype(DType::F32)?;
        let mean_sq = x.sqr()?.mean_keepdim(D::Minus1)?; // (.., 1)
        let normed = x.broadcast_div(&(mean_sq + self.eps)?.sqrt()?)?;
        normed.to_dtype(dtype)?.broadcast_mul(&self.weight)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    #[test]
    fn fused_and_differentiable_paths_agree() {
        let dev = Device::Cpu;
        let norm = RmsNorm {
            weight: Tensor::arange(1f32, 9., &dev).unwrap(),
            eps: 1e-6,
        };
        let x = Tensor::arange(-12f32, 12., &dev)
            .unwrap()
            .reshape((3, 8))
            .unwrap();
        let fused = norm.forward(&x).unwrap();
        let var = Var::from_tensor(&x).unwrap();
        let slow = norm.forward(var.as_tensor()).unwrap();
        assert!(slow.track_op());
        let diff: f32 = crate::common::max_abs_diff(&fused, &slow);
        assert!(diff < 1e-5, "{diff}");
    }
}
