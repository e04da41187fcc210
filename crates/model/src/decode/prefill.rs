//! Prefill: a batch of prompts into a cache, a chunk of columns a pass,
//! and the padded id tensors it reads. Shared by batched decoding
//! ([`crate::decode::generate`]) and its fused rows ([`crate::decode::slots`]).

use candle_core::{Device, Result, Tensor};

use crate::arch::Model;
use crate::layers::attention::Cache;

/// Columns a prefill pass takes. Eager attention holds `(B, H, L, T)` f32
/// scores, so one pass over a whole batch of long prompts would not fit
/// (64 prompts of 3,000 tokens, 32 heads: 74 GB); chunks of 256 bound that
/// to `B * H * 256 * T * 4` bytes (6 GB there) at a few more launches.
pub const PREFILL_CHUNK: usize = 256;

/// `(k, width)` ids of `prompts`, each left-padded to `width` with
/// `pad_id`.
pub(crate) fn left_padded(
    prompts: &[&[u32]],
    width: usize,
    pad_id: u32,
    device: &Device,
) -> Result<Tensor> {
    padded(prompts, width, pad_id, device, true)
}

/// `(k, width)` ids of `prompts`, each followed by `pad_id`s up to `width`
/// (the fused rows' prefill, CUDA only).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn right_padded(
    prompts: &[&[u32]],
    width: usize,
    pad_id: u32,
    device: &Device,
) -> Result<Tensor> {
    padded(prompts, width, pad_id, device, false)
}

fn padded(
    prompts: &[&[u32]],
    width: usize,
    pad_id: u32,
    device: &Device,
    left: bool,
) -> Result<Tensor> {
    let mut ids = Vec::with_capacity(prompts.len() * width);
    for p in prompts {
        let pads = std::iter::repeat_n(pad_id, width - p.len());
        if left {
            ids.extend(pads.chain(p.iter().copied()));
        } else {
            ids.extend(p.iter().copied().chain(pads));
        }
    }
    Tensor::from_vec(ids, (prompts.len(), width), device)
}

/// Runs `ids: (k, W)` into columns `start..start + W` of `cache`, `chunk`
/// columns a pass; the last column's logits `(k, vocab)`.
pub(crate) fn prefill(
    model: &Model,
    ids: &Tensor,
    start: usize,
    cache: &mut Cache,
    chunk: usize,
) -> Result<Tensor> {
    let width = ids.dim(1)?;
    let mut logits = None;
    for s in (0..width).step_by(chunk) {
        let len = chunk.min(width - s);
        logits = Some(model.forward_with_cache(&ids.narrow(1, s, len)?, start + s, cache)?);
    }
    logits.ok_or_else(|| candle_core::Error::Msg("prefill of an empty prompt".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Left padding puts the pads before each prompt, right padding after.
    #[test]
    fn prompts_pad_on_either_side() {
        let (a, b): (&[u32], &[u32]) = (&[5, 6, 7], &[9]);
        let rows = |t: Tensor| t.to_vec2::<u32>().unwrap();
        let left = left_padded(&[a, b], 4, 0, &Device::Cpu).unwrap();
        assert_eq!(rows(left), vec![vec![0, 5, 6, 7], vec![0, 0, 0, 9]]);
        let right = right_padded(&[a, b], 4, 0, &Device::Cpu).unwrap();
        assert_eq!(rows(right), vec![vec![5, 6, 7, 0], vec![9, 0, 0, 0]]);
    }
}
