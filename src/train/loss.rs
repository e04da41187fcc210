//! Token-level losses, shared by SFT and (later) the RL objectives.
//!
//! Labels are aligned with the inputs (`labels[t]` is the token at position
//! `t`, or -100 where it must not be learned); the logits at `t` predict the
//! token at `t + 1`, so both are shifted by one here.

use candle_core::{D, DType, Result, Tensor};

/// Label value that is never learned (prompt tokens, padding).
pub const IGNORE: i64 = -100;

/// Summed cross-entropy over the learned positions, and their count.
///
/// `logits`: (B, L, V); `labels`: (B, L) i64. Computed in f32.
pub fn cross_entropy_sum(logits: &Tensor, labels: &Tensor) -> Result<(Tensor, usize)> {
    let (b, l, v) = logits.dims3()?;
    let logits = logits.narrow(1, 0, l - 1)?.to_dtype(DType::F32)?; // (B, L-1, V)
    let targets = labels.narrow(1, 1, l - 1)?; // (B, L-1)
    let mask = targets.ge(0i64)?; // (B, L-1) u8
    let count = mask.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()? as usize;
    let safe = mask.where_cond(&targets, &targets.zeros_like()?)?; // -100 -> 0
    let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?; // (B, L-1, V)
    let picked = logp
        .reshape((b * (l - 1), v))?
        .gather(&safe.reshape((b * (l - 1), 1))?.to_dtype(DType::U32)?, 1)?
        .reshape((b, l - 1))?; // (B, L-1)
    let nll = (picked.neg()? * mask.to_dtype(DType::F32)?)?;
    Ok((nll.sum_all()?, count))
}

/// Log-probabilities of the given next tokens: (B, L-1) from logits (B, L, V)
/// and ids (B, L). The RL objectives build on this.
pub fn next_token_logprobs(logits: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (b, l, v) = logits.dims3()?;
    let logp = candle_nn::ops::log_softmax(
        &logits.narrow(1, 0, l - 1)?.to_dtype(DType::F32)?,
        D::Minus1,
    )?;
    let next = ids.narrow(1, 1, l - 1)?.to_dtype(DType::U32)?;
    logp.reshape((b * (l - 1), v))?
        .gather(&next.reshape((b * (l - 1), 1))?, 1)?
        .reshape((b, l - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_a_hand_computation_and_ignores_masked_positions() {
        let dev = Device::Cpu;
        // B=1, L=3, V=2: positions 0 and 1 predict labels[1], labels[2].
        let logits = Tensor::new(&[[[0.0f32, 0.0], [2.0, 0.0], [9.0, 9.0]]], &dev).unwrap();
        let labels = Tensor::new(&[[IGNORE, 1, 0]], &dev).unwrap();
        let (sum, n) = cross_entropy_sum(&logits, &labels).unwrap();
        let want = std::f32::consts::LN_2 + (1.0 + (-2.0f32).exp()).ln();
        assert_eq!(n, 2);
        assert!((sum.to_scalar::<f32>().unwrap() - want).abs() < 1e-5);
        let labels = Tensor::new(&[[IGNORE, IGNORE, 0]], &dev).unwrap();
        let (sum, n) = cross_entropy_sum(&logits, &labels).unwrap();
        assert_eq!(n, 1);
        assert!((sum.to_scalar::<f32>().unwrap() - (1.0 + (-2.0f32).exp()).ln()).abs() < 1e-5);
    }
}
