//! Prompt + completion rows for one forward pass that scores the
//! completion's tokens: the policy-gradient recipes (PPO/GRPO) and DPO
//! both need each completion token's log-prob under the model, with the
//! prompt as context and no loss on it.

use candle_core::{Device, Tensor};

use crate::model::Model;
use crate::train::loss::lm_head_logprobs;

/// Rows packed for [`forward`]: right-padded ids and mask `(N, L)`, the
/// flat positions `(R,)` whose next token is a completion token, those
/// tokens `(R,)`, and each row's completion length (its share of `R`, in
/// row order).
pub struct Packed {
    pub ids: Tensor,
    pub mask: Tensor,
    pub at: Tensor,
    pub next: Tensor,
    pub lens: Vec<usize>,
}

/// Packs `(prompt, completion)` rows, padded with `pad` on the right.
pub fn pack(rows: &[(&[u32], &[u32])], pad: u32, dev: &Device) -> candle_core::Result<Packed> {
    let l = rows
        .iter()
        .map(|(p, c)| p.len() + c.len())
        .max()
        .unwrap_or(1);
    let (mut ids, mut mask, mut at, mut next, mut lens) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, (prompt, completion)) in rows.iter().enumerate() {
        let n = prompt.len() + completion.len();
        ids.extend(prompt.iter().chain(completion.iter()).copied());
        ids.extend(std::iter::repeat_n(pad, l - n));
        mask.extend(std::iter::repeat_n(1u32, n));
        mask.extend(std::iter::repeat_n(0u32, l - n));
        for (j, &t) in completion.iter().enumerate() {
            at.push((i * l + prompt.len() + j - 1) as u32);
            next.push(t);
        }
        lens.push(completion.len());
    }
    let (n, r) = (rows.len(), at.len());
    Ok(Packed {
        ids: Tensor::from_vec(ids, (n, l), dev)?,
        mask: Tensor::from_vec(mask, (n, l), dev)?,
        at: Tensor::from_vec(at, r, dev)?,
        next: Tensor::from_vec(next, r, dev)?,
        lens,
    })
}

/// The completion tokens' log-probs `(R,)` under `softmax(logits /
/// temperature)` and their entropies `(R,)`, and the hidden states that
/// predict them `(R, hidden)`; differentiable when `train` (the entropy
/// too when `entropy_grad`). The head runs a chunk of rows at a time, so
/// the `(R, V)` logits are never whole.
pub fn forward(
    model: &Model,
    p: &Packed,
    temperature: f64,
    train: bool,
    entropy_grad: bool,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let hidden = model.forward_hidden(&p.ids, Some(&p.mask), train)?;
    let (n, l, h) = hidden.dims3()?;
    let rows = hidden.reshape((n * l, h))?.index_select(&p.at, 0)?; // (R, H)
    let head = model.lm_head().weight()?;
    let out = lm_head_logprobs(&rows, &head, &p.next, temperature, entropy_grad)?;
    let logp = out.narrow(1, 0, 1)?.squeeze(1)?;
    let ent = out.narrow(1, 1, 1)?.squeeze(1)?;
    Ok((logp, ent, rows))
}

/// Sums of `values` (one a completion token, rows in order) over each
/// row's `lens` tokens.
pub fn row_sums(values: &[f32], lens: &[usize]) -> Vec<f64> {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            let s = values[at..at + n].iter().map(|&x| f64::from(x)).sum();
            at += n;
            s
        })
        .collect()
}
