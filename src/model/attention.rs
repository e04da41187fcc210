//! Causal scaled dot-product attention with grouped-query heads (Ainslie et
//! al. 2023, "GQA"), its additive masks, and the KV cache for decoding.
//!
//! Shared by the Qwen3 and Llama decoders: both project, normalise and
//! rotate in their own files, then call [`attend`]. Scores are softmaxed in
//! f32, as HF's eager attention does.

use candle_core::{D, DType, Device, Result, Tensor};

/// Added to the score of a key a query must not see. Finite, so a row with
/// no visible key (a padding query) gives a uniform row rather than NaN.
const MASKED: f32 = -1e30;

/// Keys and values of earlier positions, one entry a layer.
#[derive(Debug, Clone)]
pub struct Cache {
    /// Per layer: `k, v: (B, H_kv, T, D)`.
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl Cache {
    /// An empty cache for a model of `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        match &self.layers.first() {
            Some(Some((k, _))) => k.dim(2).unwrap_or(0),
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
    }

    /// Appends `k, v: (B, H_kv, L, D)` to layer `layer` and returns all of
    /// that layer's keys and values, `(B, H_kv, T + L, D)`.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let slot = &mut self.layers[layer];
        let (k, v) = match slot.take() {
            Some((pk, pv)) => (Tensor::cat(&[&pk, k], 2)?, Tensor::cat(&[&pv, v], 2)?),
            None => (k.clone(), v.clone()),
        };
        *slot = Some((k.clone(), v.clone()));
        Ok((k, v))
    }
}

/// The additive mask for `len` queries at positions `offset..offset + len`
/// over keys `0..offset + len`: `(1, 1, L, T)`, or `(B, 1, L, T)` when
/// `padding: (B, T)` (1 = token, 0 = padding, any dtype) hides keys too.
/// `None` when nothing needs hiding (one query, no padding).
pub fn mask(
    len: usize,
    offset: usize,
    padding: Option<&Tensor>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let total = offset + len;
    let causal = if len > 1 {
        let values: Vec<f32> = (0..len)
            .flat_map(|i| (0..total).map(move |j| if j <= offset + i { 0.0 } else { MASKED }))
            .collect();
        Some(Tensor::from_vec(values, (1, 1, len, total), device)?)
    } else {
        None
    };
    let Some(padding) = padding else {
        return Ok(causal);
    };
    let (b, t) = padding.dims2()?;
    if t != total {
        candle_core::bail!("attention mask covers {t} positions, expected {total}");
    }
    // (B, T) of 1/0 -> (B, 1, 1, T) of 0/MASKED
    let hidden =
        ((padding.to_dtype(DType::F32)? - 1.0)? * (-MASKED as f64))?.reshape((b, 1, 1, t))?;
    match causal {
        Some(causal) => Ok(Some(causal.broadcast_add(&hidden)?)),
        None => Ok(Some(hidden)),
    }
}

/// `softmax(q k^T / sqrt(D) + mask) v` with `q: (B, H, L, D)`,
/// `k, v: (B, H_kv, T, D)`, `mask: (B or 1, 1, L, T)`; returns `(B, H, L, D)`.
///
/// Query head `h` reads key head `h / (H / H_kv)`, as HF's `repeat_kv`,
/// without materialising the repeated keys: the `H / H_kv` query heads of a
/// group are stacked along the length instead.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, h, l, d) = q.dims4()?;
    let (_, h_kv, t, _) = k.dims4()?;
    let groups = h / h_kv;
    let q = q.contiguous()?.reshape((b, h_kv, groups * l, d))?; // (B, H_kv, G*L, D)
    let scores = q.matmul(&k.contiguous()?.t()?)?; // (B, H_kv, G*L, T)
    let scores =
        (scores.to_dtype(DType::F32)? * (1.0 / (d as f64).sqrt()))?.reshape((b, h, l, t))?;
    let scores = match mask {
        Some(mask) => scores.broadcast_add(mask)?,
        None => scores,
    };
    let probs = if scores.track_op() {
        candle_nn::ops::softmax(&scores, D::Minus1)?
    } else {
        candle_nn::ops::softmax_last_dim(&scores)?
    };
    let probs = probs
        .to_dtype(v.dtype())?
        .reshape((b, h_kv, groups * l, t))?;
    probs.matmul(&v.contiguous()?)?.reshape((b, h, l, d)) // (B, H_kv, G*L, D) -> (B, H, L, D)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(m: &Tensor) -> Vec<f32> {
        m.flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn causal_mask_with_offset_hides_the_future_only() {
        let m = mask(2, 1, None, &Device::Cpu).unwrap().unwrap();
        assert_eq!(m.dims(), &[1, 1, 2, 3]);
        assert_eq!(values(&m), [0.0, 0.0, MASKED, 0.0, 0.0, 0.0]);
        assert!(mask(1, 5, None, &Device::Cpu).unwrap().is_none());
    }

    #[test]
    fn padding_hides_keys() {
        let pad = Tensor::new(&[[1u32, 1, 0]], &Device::Cpu).unwrap();
        let m = mask(3, 0, Some(&pad), &Device::Cpu).unwrap().unwrap();
        assert_eq!(m.dims(), &[1, 1, 3, 3]);
        let v = values(&m);
        let hidden: Vec<bool> = v.iter().map(|x| *x < -1e29).collect();
        // Row i sees keys j <= i that are tokens: key 2 (padding) never.
        assert_eq!(
            hidden,
            [false, true, true, false, false, true, false, false, true]
        );
    }

    #[test]
    fn grouped_heads_match_repeated_keys() {
        let dev = Device::Cpu;
        let q = Tensor::arange(0f32, 2. * 4. * 3. * 2., &dev)
            .unwrap()
            .reshape((2, 4, 3, 2))
            .unwrap()
            .affine(0.05, -0.5)
            .unwrap();
        let k = Tensor::arange(0f32, 2. * 2. * 3. * 2., &dev)
            .unwrap()
            .reshape((2, 2, 3, 2))
            .unwrap()
            .affine(-0.07, 0.4)
            .unwrap();
        let v = k.affine(1.3, 0.1).unwrap();
        let m = mask(3, 0, None, &dev).unwrap();
        let out = attend(&q, &k, &v, m.as_ref()).unwrap();
        // Reference: repeat each kv head twice, plain attention per head.
        let rep = |x: &Tensor| {
            let (b, hk, t, d) = x.dims4().unwrap();
            x.unsqueeze(2)
                .unwrap()
                .expand((b, hk, 2, t, d))
                .unwrap()
                .reshape((b, hk * 2, t, d))
                .unwrap()
        };
        let (k2, v2) = (rep(&k), rep(&v));
        let s = (q.matmul(&k2.t().unwrap()).unwrap() / 2f64.sqrt())
            .unwrap()
            .broadcast_add(m.as_ref().unwrap())
            .unwrap();
        let expected = candle_nn::ops::softmax(&s, D::Minus1)
            .unwrap()
            .matmul(&v2)
            .unwrap();
        let diff: f32 = (out - expected)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(diff < 1e-6, "{diff}");
    }
}
