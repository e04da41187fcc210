//! Token-level losses, shared by SFT and (later) the RL objectives.
//!
//! Labels are aligned with the inputs (`labels[t]` is the token at position
//! `t`, or -100 where it must not be learned); the logits at `t` predict the
//! token at `t + 1`, so both are shifted by one here.

use std::sync::Mutex;

use candle_core::{CpuStorage, CudaStorage, CustomOp1, D, DType, Layout, Result, Shape, Tensor};

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

/// Rows of logits materialised at once by [`lm_head_cross_entropy`]: about
/// 256 MiB of f32 whatever the vocabulary.
pub const LOGIT_CHUNK_BYTES: usize = 1 << 28;

/// [`cross_entropy_sum`] of `lm_head(hidden)`, computed without the logits
/// of the whole batch: `hidden: (B, L, H)`, `head: (V, H)` (frozen),
/// `labels: (B, L)` i64 aligned with the inputs.
///
/// Only the positions whose next token is learned go through the head, a
/// chunk of rows at a time, in f32 after a GEMM in the model's dtype. The
/// gradient with respect to `hidden` is computed in the same pass (the
/// softmax less the one-hot target, times the head: Liger-Kernel's fused
/// linear cross-entropy does the same) and kept, `(B, L, H)` in the model's
/// dtype, until the backward asks for it; no gradient reaches the head. The
/// returned sum is attached to `hidden` in the graph when `hidden` tracks.
pub fn lm_head_cross_entropy(
    hidden: &Tensor,
    head: &Tensor,
    labels: &Tensor,
) -> Result<(Tensor, usize)> {
    let vocab = head.dim(0)?;
    chunked_cross_entropy(
        hidden,
        head,
        labels,
        (LOGIT_CHUNK_BYTES / (4 * vocab)).max(1),
    )
}

/// [`lm_head_cross_entropy`] with `chunk` rows of logits at a time.
fn chunked_cross_entropy(
    hidden: &Tensor,
    head: &Tensor,
    labels: &Tensor,
    chunk: usize,
) -> Result<(Tensor, usize)> {
    let (b, l, h) = hidden.dims3()?;
    let (_, h2) = head.dims2()?;
    if h != h2 {
        candle_core::bail!("lm_head expects {h2} features, hidden states have {h}");
    }
    let device = hidden.device();
    // Flat positions t of (B*L) whose target labels[t + 1] is learned.
    let rows = labels.to_dtype(DType::I64)?.to_vec2::<i64>()?;
    let (mut at, mut targets) = (Vec::new(), Vec::new());
    let vocab = head.dim(0)?;
    for (r, row) in rows.iter().enumerate() {
        for t in 0..l.saturating_sub(1) {
            if row[t + 1] >= vocab as i64 {
                candle_core::bail!(
                    "label {} at row {r}, position {} is outside the vocabulary of {vocab}",
                    row[t + 1],
                    t + 1
                );
            }
            if row[t + 1] >= 0 {
                at.push((r * l + t) as u32);
                targets.push(row[t + 1] as u32);
            }
        }
    }
    let n = at.len();
    if n == 0 {
        let zero = (hidden.sum_all()?.to_dtype(DType::F32)? * 0.0)?;
        return Ok((zero, 0));
    }
    let want_grad = hidden.track_op();
    let flat = hidden.detach().reshape((b * l, h))?;
    let at = Tensor::from_vec(at, n, device)?;
    let targets = Tensor::from_vec(targets, n, device)?;
    let picked_rows = flat.index_select(&at, 0)?; // (n, H)
    let mut loss = Tensor::zeros((), DType::F32, device)?;
    let mut grads = Vec::new();
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let x = picked_rows.narrow(0, start, len)?; // (c, H)
        let tgt = targets.narrow(0, start, len)?; // (c,)
        let logits = x.matmul(&head.t()?)?; // (c, V)
        // Per-row loss and softmax - onehot(target), in one fused pass.
        let (rows_loss, dlogits) = crate::model::layers::fused::cross_entropy_rows(logits, &tgt)?;
        loss = (loss + rows_loss.sum_all()?)?;
        if want_grad {
            grads.push(dlogits.to_dtype(hidden.dtype())?.matmul(head)?); // (c, H)
        }
    }
    if !want_grad {
        return Ok((loss, n));
    }
    let grad = Tensor::zeros((b * l, h), hidden.dtype(), device)?
        .index_add(&at, &Tensor::cat(&grads, 0)?, 0)?
        .reshape((b, l, h))?;
    let node = hidden.apply_op1(Precomputed {
        value: Mutex::new(Some(loss)),
        grad,
    })?;
    Ok((node, n))
}

/// A scalar computed outside the graph, attached to its input with the
/// input's gradient (per unit of the scalar) computed beforehand.
struct Precomputed {
    value: Mutex<Option<Tensor>>,
    grad: Tensor,
}

impl Precomputed {
    fn take(&self) -> Result<Tensor> {
        match self.value.lock().expect("loss node poisoned").take() {
            Some(v) => Ok(v),
            None => candle_core::bail!("loss node evaluated twice"),
        }
    }
}

impl CustomOp1 for Precomputed {
    fn name(&self) -> &'static str {
        "lm-head-cross-entropy"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::model::layers::ops::cpu_storage_copy(&self.take()?)
    }

    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        crate::model::layers::ops::cuda_storage_copy(&self.take()?)
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let g = g.to_dtype(self.grad.dtype())?;
        Ok(Some(self.grad.broadcast_mul(&g)?))
    }
}

/// Log-probabilities and entropies of the next tokens under
/// `softmax(rows head^T / temperature)`, without the logits of all rows at
/// once: `rows: (R, H)`, `head: (V, H)` (frozen), `next: (R,)` u32 ->
/// `(R, 2)` f32, column 0 `log p(next)`, column 1 the entropy
/// `-sum_v p_v log p_v`. The RL objectives' forward: a minibatch's response
/// tokens times a 150k vocabulary would hold gigabytes of f32 logits (and
/// as much again for their softmax and its gradient).
///
/// A chunk of rows at a time goes through the head in the model's dtype,
/// then f32. When `rows` tracks, the gradients of both columns with
/// respect to each row are computed in the same pass and kept, `(R, H)`
/// each: `d log p(y) / d x = (onehot(y) - p) head / T` and `d H / d x = -(p
/// (log p + H)) head / T`; the backward scales them by the incoming
/// gradient of each column. The entropy's rows are made only when
/// `entropy_grad` (an entropy bonus is on); otherwise the entropy is a
/// metric and passes no gradient.
pub fn lm_head_logprobs(
    rows: &Tensor,
    head: &Tensor,
    next: &Tensor,
    temperature: f64,
    entropy_grad: bool,
) -> Result<Tensor> {
    let vocab = head.dim(0)?;
    chunked_logprobs(
        rows,
        head,
        next,
        temperature,
        entropy_grad,
        (LOGIT_CHUNK_BYTES / (4 * vocab)).max(1),
    )
}

/// [`lm_head_logprobs`] with `chunk` rows of logits at a time.
fn chunked_logprobs(
    rows: &Tensor,
    head: &Tensor,
    next: &Tensor,
    temperature: f64,
    entropy_grad: bool,
    chunk: usize,
) -> Result<Tensor> {
    let (r, h) = rows.dims2()?;
    let (_, h2) = head.dims2()?;
    if h != h2 {
        candle_core::bail!("lm_head expects {h2} features, the rows have {h}");
    }
    if !(temperature.is_finite() && temperature > 0.0) {
        candle_core::bail!("log-probabilities need a temperature > 0, not {temperature}");
    }
    let device = rows.device();
    if r == 0 {
        return Tensor::zeros((0, 2), DType::F32, device);
    }
    let want_grad = rows.track_op();
    let x_all = rows.detach();
    let next = next.to_dtype(DType::U32)?;
    let (mut values, mut g_logp, mut g_ent) = (Vec::new(), Vec::new(), Vec::new());
    for start in (0..r).step_by(chunk) {
        let len = chunk.min(r - start);
        let x = x_all.narrow(0, start, len)?;
        let tgt = next.narrow(0, start, len)?;
        let logits = (x.matmul(&head.t()?)?.to_dtype(DType::F32)? / temperature)?; // (c, V)
        let lp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let p = lp.exp()?;
        let ent = (&p * &lp)?.sum_keepdim(D::Minus1)?.neg()?; // (c, 1)
        let picked = lp.gather(&tgt.unsqueeze(1)?, 1)?; // (c, 1)
        values.push(Tensor::cat(&[&picked, &ent], 1)?);
        if want_grad {
            let back = |d: Tensor| -> Result<Tensor> {
                d.to_dtype(head.dtype())?
                    .matmul(head)?
                    .to_dtype(DType::F32)?
                    / temperature
            };
            // onehot(y) - p: 1 added at the targets of -p, no (c, V) one-hot.
            let minus_p = p.neg()?.scatter_add(
                &tgt.unsqueeze(1)?,
                &Tensor::ones((len, 1), DType::F32, device)?,
                1,
            )?;
            g_logp.push(back(minus_p)?);
            if entropy_grad {
                g_ent.push(back((p * lp.broadcast_add(&ent)?)?.neg()?)?);
            }
        }
    }
    let value = Tensor::cat(&values, 0)?.contiguous()?;
    if !want_grad {
        return Ok(value);
    }
    let cat = |v: Vec<Tensor>| -> Result<Option<Tensor>> {
        if v.is_empty() {
            Ok(None)
        } else {
            Tensor::cat(&v, 0).map(Some)
        }
    };
    rows.apply_op1(Linearised {
        value: Mutex::new(Some(value)),
        columns: [cat(g_logp)?, cat(g_ent)?],
    })
}

/// `(R, k)` values computed outside the graph and attached to their input
/// `(R, H)`, with each column's gradient rows `(R, H)` computed beforehand
/// (`None`: the column passes no gradient).
struct Linearised {
    value: Mutex<Option<Tensor>>,
    columns: [Option<Tensor>; 2],
}

impl Linearised {
    fn take(&self) -> Result<Tensor> {
        match self.value.lock().expect("log-prob node poisoned").take() {
            Some(v) => Ok(v),
            None => candle_core::bail!("log-prob node evaluated twice"),
        }
    }
}

impl CustomOp1 for Linearised {
    fn name(&self) -> &'static str {
        "lm-head-logprobs"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::model::layers::ops::cpu_storage_copy(&self.take()?)
    }

    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        crate::model::layers::ops::cuda_storage_copy(&self.take()?)
    }

    fn bwd(&self, arg: &Tensor, _: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let g = g.to_dtype(DType::F32)?;
        let mut total: Option<Tensor> = None;
        for (k, rows) in self.columns.iter().enumerate() {
            if let Some(rows) = rows {
                let part = rows.broadcast_mul(&g.narrow(1, k, 1)?)?;
                total = Some(match total {
                    Some(t) => (t + part)?,
                    None => part,
                });
            }
        }
        total.map(|t| t.to_dtype(arg.dtype())).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn chunked_lm_head_loss_matches_the_full_logits_forward_and_backward() {
        use crate::model::layers::init::Rng;
        let dev = Device::Cpu;
        let (b, l, h, v) = (2, 7, 16, 1000);
        let rand = |n: usize, name: &str| Rng::for_tensor(5, name).uniform(n, -1.0, 1.0);
        let hidden =
            Var::from_tensor(&Tensor::from_vec(rand(b * l * h, "h"), (b, l, h), &dev).unwrap())
                .unwrap();
        let head = Tensor::from_vec(rand(v * h, "w"), (v, h), &dev).unwrap();
        let labels = Tensor::new(
            &[
                [IGNORE, IGNORE, 5, 999, 0, 17, IGNORE],
                [IGNORE, 3, 4, 500, 2, 1, 7],
            ],
            &dev,
        )
        .unwrap();
        let logits = hidden
            .as_tensor()
            .broadcast_matmul(&head.t().unwrap())
            .unwrap();
        let (full, n_full) = cross_entropy_sum(&logits, &labels).unwrap();
        // Three rows a chunk: the ten learned positions take four chunks.
        let (chunked, n) = chunked_cross_entropy(hidden.as_tensor(), &head, &labels, 3).unwrap();
        assert_eq!((n, n_full), (10, 10));
        let (a, e) = (
            chunked.to_scalar::<f32>().unwrap(),
            full.to_scalar::<f32>().unwrap(),
        );
        assert!((a - e).abs() / e.abs() < 1e-5, "{a} vs {e}");
        let g1 = (chunked * 0.5).unwrap().backward().unwrap();
        let g2 = (full * 0.5).unwrap().backward().unwrap();
        let (d1, d2) = (
            g1.get(hidden.as_tensor()).unwrap(),
            g2.get(hidden.as_tensor()).unwrap(),
        );
        let err = crate::model::max_abs_diff(d1, d2);
        let scale: f32 = d2.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
        assert!(err / scale < 1e-4, "grad error {err} (max {scale})");
        // Positions whose next token is not learned get exactly zero.
        let row0: Vec<f32> = d1.get(0).unwrap().get(0).unwrap().to_vec1().unwrap();
        assert!(row0.iter().all(|x| *x == 0.0));
        assert!(g1.get(&head).is_none());
    }

    #[test]
    fn chunked_logprobs_and_entropy_match_the_full_logits_forward_and_backward() {
        use crate::model::layers::init::Rng;
        let dev = Device::Cpu;
        let (r, h, v, temp) = (9, 16, 700, 0.7);
        let rand = |n: usize, name: &str| Rng::for_tensor(8, name).uniform(n, -1.0, 1.0);
        let rows =
            Var::from_tensor(&Tensor::from_vec(rand(r * h, "x"), (r, h), &dev).unwrap()).unwrap();
        let head = Tensor::from_vec(rand(v * h, "w"), (v, h), &dev).unwrap();
        let next = Tensor::new(&[3u32, 699, 0, 17, 17, 250, 1, 42, 600], &dev).unwrap();
        // A loss that weighs each row's log-prob and entropy differently.
        let wl = Tensor::from_vec(rand(r, "wl"), r, &dev).unwrap();
        let we = Tensor::from_vec(rand(r, "we"), r, &dev).unwrap();
        let loss = |lp: &Tensor, ent: &Tensor| -> Tensor {
            ((lp * &wl).unwrap().sum_all().unwrap() + (ent * &we).unwrap().sum_all().unwrap())
                .unwrap()
        };
        // The full logits, as the RL forward computed them before.
        let logits = (rows.as_tensor().matmul(&head.t().unwrap()).unwrap() / temp).unwrap();
        let lp_all = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        let lp_full = lp_all
            .gather(&next.unsqueeze(1).unwrap(), 1)
            .unwrap()
            .squeeze(1)
            .unwrap();
        let ent_full = (lp_all.exp().unwrap() * &lp_all)
            .unwrap()
            .sum(D::Minus1)
            .unwrap()
            .neg()
            .unwrap();
        let g_full = loss(&lp_full, &ent_full).backward().unwrap();
        let d_full = g_full.get(rows.as_tensor()).unwrap();
        let scale: f32 = d_full
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        for entropy_grad in [true, false] {
            // Four rows a chunk: three chunks, the last one short.
            let out =
                chunked_logprobs(rows.as_tensor(), &head, &next, temp, entropy_grad, 4).unwrap();
            assert_eq!(out.dims(), &[r, 2]);
            let (lp, ent) = (
                out.narrow(1, 0, 1).unwrap().squeeze(1).unwrap(),
                out.narrow(1, 1, 1).unwrap().squeeze(1).unwrap(),
            );
            for (a, b) in [(&lp, &lp_full), (&ent, &ent_full)] {
                assert!(crate::model::max_abs_diff(a, b) < 1e-5);
            }
            let g = loss(&lp, &ent).backward().unwrap();
            let d = g.get(rows.as_tensor()).unwrap();
            let want = if entropy_grad {
                d_full.clone()
            } else {
                // The log-prob part alone.
                let g = (&lp_full * &wl)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                g.get(rows.as_tensor()).unwrap().clone()
            };
            let err = crate::model::max_abs_diff(d, &want);
            assert!(
                err / scale < 1e-4,
                "entropy_grad {entropy_grad}: grad error {err} (max {scale})"
            );
            assert!(g.get(&head).is_none());
        }
        // Without tracking: the values, no graph.
        let plain =
            lm_head_logprobs(&rows.as_tensor().detach(), &head, &next, temp, false).unwrap();
        assert!(!plain.track_op());
        assert!(chunked_logprobs(rows.as_tensor(), &head, &next, 0.0, false, 4).is_err());
        // By hand: the identity head makes the rows the logits; a uniform
        // row has log p = -ln 4 and entropy ln 4, a peaked one 0 and 0.
        let eye = Tensor::eye(4, DType::F32, &dev).unwrap();
        let x = Tensor::new(&[[0.0f32, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]], &dev).unwrap();
        let out = lm_head_logprobs(
            &x,
            &eye,
            &Tensor::new(&[2u32, 0], &dev).unwrap(),
            1.0,
            false,
        )
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
        let ln4 = 4f32.ln();
        assert!(
            (out[0][0] + ln4).abs() < 1e-6 && (out[0][1] - ln4).abs() < 1e-6,
            "{out:?}"
        );
        assert!(out[1][0].abs() < 1e-6 && out[1][1].abs() < 1e-6, "{out:?}");
    }

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
