//! Rotary position embedding (Su et al. 2021, "RoFormer", eq. (34)) in the
//! HF layout: the head dimension is split in halves, not interleaved.
//!
//! Like [`crate::layers::norm`], it uses candle's fused kernel (no backward) only
//! for inputs that carry no gradient.

use candle_core::{D, DType, Device, Result, Tensor};
use serde::{Deserialize, Serialize};

use crate::common::Unsupported;

/// The RoPE fields of a `config.json`: `rope_theta` and `rope_scaling`
/// (transformers 4) or `rope_parameters` (transformers 5).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RopeFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Value>,
}

impl RopeFields {
    /// The base frequency, or `default` (the architecture's) when unstated.
    pub fn theta(&self, default: f64) -> f64 {
        let from_parameters = || {
            self.rope_parameters
                .as_ref()
                .and_then(|p| p.get("rope_theta"))
                .and_then(|t| t.as_f64())
        };
        self.rope_theta.or_else(from_parameters).unwrap_or(default)
    }

    /// Scaled variants (linear, dynamic, yarn, llama3) are not implemented.
    pub fn unsupported(&self) -> Vec<Unsupported> {
        [
            ("rope_scaling", &self.rope_scaling),
            ("rope_parameters", &self.rope_parameters),
        ]
        .into_iter()
        .filter_map(|(field, value)| {
            let value = value.as_ref().filter(|v| !v.is_null())?;
            let kind = value
                .get("rope_type")
                .or_else(|| value.get("type"))
                .and_then(|t| t.as_str())
                .unwrap_or("default");
            (kind != "default").then(|| Unsupported {
                field: field.to_owned(),
                value: value.to_string(),
                hint: "only unscaled RoPE (`rope_type` \"default\") is implemented".to_owned(),
            })
        })
        .collect()
    }
}

/// Precomputed `cos` and `sin` tables.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    /// `(max_positions, head_dim / 2)`, in the model's dtype.
    cos: Tensor,
    sin: Tensor,
}

impl RotaryEmbedding {
    /// Tables for positions `0..max_positions` with frequencies
    /// `theta^(-2i / head_dim)`, computed in f32.
    pub fn new(
        head_dim: usize,
        theta: f64,
        max_positions: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let inv_freq: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| (1.0 / theta.powf(i as f64 / head_dim as f64)) as f32)
            .collect();
        let half = inv_freq.len();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?; // (1, D/2)
        let positions = Tensor::arange(0u32, max_positions as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_positions, 1))?; // (P, 1)
        let freqs = positions.matmul(&inv_freq)?; // (P, D/2)
        Ok(Self {
            cos: freqs.cos()?.to_dtype(dtype)?,
            sin: freqs.sin()?.to_dtype(dtype)?,
        })
    }

    /// The `(cos, sin)` tables, `(max_positions, head_dim / 2)` each.
    pub fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    /// Rotates `x: (B, H, L, D)` whose first position is `offset`.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (_, _, len, _) = x.dims4()?;
        self.at(&Positions::Offset(offset), len)?.apply(x)
    }

    /// The rows of the tables for `len` positions: `(L, D/2)` from an offset
    /// (a view, no copy), `(B, L, D/2)` gathered for per-row positions.
    pub fn at(&self, positions: &Positions, len: usize) -> Result<Rotation> {
        match positions {
            Positions::Offset(offset) => Ok(Rotation {
                cos: self.cos.narrow(0, *offset, len)?,
                sin: self.sin.narrow(0, *offset, len)?,
            }),
            Positions::PerRow(p) => {
                let (b, l) = p.dims2()?;
                if l != len {
                    candle_core::bail!("{l} positions a row for {len} queries");
                }
                let flat = p.flatten_all()?;
                let gather = |t: &Tensor| t.index_select(&flat, 0)?.reshape((b, l, ()));
                Ok(Rotation {
                    cos: gather(&self.cos)?,
                    sin: gather(&self.sin)?,
                })
            }
        }
    }
}

/// Where one forward pass's queries sit.
#[derive(Debug, Clone)]
pub enum Positions {
    /// Every row at `offset..offset + L`.
    Offset(usize),
    /// `(B, L)` u32, a row each: left-padded rows of a batch start late.
    PerRow(Tensor),
}

/// The cos and sin rows of one forward pass: `(L, D/2)`, shared by every
/// row, or `(B, L, D/2)`. Computed once a pass, applied to every layer's
/// queries and keys.
#[derive(Debug, Clone)]
pub struct Rotation {
    cos: Tensor,
    sin: Tensor,
}

impl Rotation {
    /// Rotates `x: (B, L, H, D)` (heads after positions, as projections
    /// produce them) with candle's fused kernel; builds no graph.
    pub fn apply_thd(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::rotary_emb::rope_thd(
            &x.detach().contiguous()?,
            &self.cos.contiguous()?,
            &self.sin.contiguous()?,
        )
    }

    /// The inverse (and transpose) of [`Self::apply_thd`]: the rotation by
    /// minus the angle, which maps an output gradient to the input's.
    pub fn invert_thd(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::rotary_emb::rope_thd(
            &x.detach().contiguous()?,
            &self.cos.contiguous()?,
            &self.sin.neg()?.contiguous()?,
        )
    }

    /// Rotates `x: (B, H, L, D)`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        if x.track_op() {
            // x * [cos, cos] + rotate_half(x) * [sin, sin]
            let full = |t: &Tensor| -> Result<Tensor> {
                let t = Tensor::cat(&[t, t], D::Minus1)?;
                match t.rank() {
                    2 => t.unsqueeze(0)?.unsqueeze(0), // (1, 1, L, D)
                    _ => t.unsqueeze(1),               // (B, 1, L, D)
                }
            };
            let (cos, sin) = (full(&self.cos)?, full(&self.sin)?);
            let half = x.dim(D::Minus1)? / 2;
            let x1 = x.narrow(D::Minus1, 0, half)?;
            let x2 = x.narrow(D::Minus1, half, half)?;
            let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
            x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
        } else {
            candle_nn::rotary_emb::rope(
                &x.contiguous()?,
                &self.cos.contiguous()?,
                &self.sin.contiguous()?,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Var;

    use super::*;

    #[test]
    fn fused_and_differentiable_paths_agree() {
        let dev = Device::Cpu;
        let rope = RotaryEmbedding::new(8, 10_000.0, 32, DType::F32, &dev).unwrap();
        let x = Tensor::arange(0f32, 2. * 3. * 5. * 8., &dev)
            .unwrap()
            .reshape((2, 3, 5, 8))
            .unwrap()
            .affine(0.01, -1.0)
            .unwrap();
        let fused = rope.apply(&x, 7).unwrap();
        let var = Var::from_tensor(&x).unwrap();
        let slow = rope.apply(var.as_tensor(), 7).unwrap();
        assert!(slow.track_op());
        let diff: f32 = crate::common::max_abs_diff(&fused, &slow);
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn per_row_positions_rotate_each_row_as_its_offset_would() {
        let dev = Device::Cpu;
        let rope = RotaryEmbedding::new(8, 10_000.0, 32, DType::F32, &dev).unwrap();
        let x = Tensor::arange(0f32, 2. * 3. * 2. * 8., &dev)
            .unwrap()
            .reshape((2, 3, 2, 8))
            .unwrap()
            .affine(0.01, -0.3)
            .unwrap();
        let positions = Tensor::new(&[[5u32, 6], [0, 1]], &dev).unwrap();
        let rotation = rope.at(&Positions::PerRow(positions), 2).unwrap();
        let var = Var::from_tensor(&x).unwrap();
        for (out, path) in [
            (rotation.apply(&x).unwrap(), "fused"),
            (rotation.apply(var.as_tensor()).unwrap(), "differentiable"),
        ] {
            for (row, offset) in [(0, 5), (1, 0)] {
                let alone = rope.apply(&x.narrow(0, row, 1).unwrap(), offset).unwrap();
                let diff = crate::common::max_abs_diff(&out.narrow(0, row, 1).unwrap(), &alone);
                assert!(diff < 1e-6, "{path} row {row}: {diff}");
            }
        }
    }

    #[test]
    fn position_zero_is_the_identity() {
        let dev = Device::Cpu;
        let rope = RotaryEmbedding::new(4, 10_000.0, 4, DType::F32, &dev).unwrap();
        let x = Tensor::arange(1f32, 5., &dev)
            .unwrap()
            .reshape((1, 1, 1, 4))
            .unwrap();
        let y = rope.apply(&x, 0).unwrap();
        assert_eq!(
            y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            [1., 2., 3., 4.]
        );
    }
}
