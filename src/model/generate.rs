//! Batched decoding with the KV cache: greedy ([`greedy`]) and sampled
//! ([`sample`]) continuations of a batch of token prompts.
//!
//! Prompts of different lengths are left-padded to the longest and
//! prefilled together, [`PREFILL_CHUNK`] columns a pass; the cache gives
//! each row its own positions and hides its padding (see [`Cache`]), so a
//! row decodes to the tokens it would decode alone. Then one token a step
//! for every unfinished row. A row finishes on a stop id (not kept) or
//! after `max_new_tokens`; a finished row is fed `pad_id` and its output
//! ignored until finished rows are half the batch, when they leave it (one
//! copy of the cache each time, at most log2(B) times). Decoding ends when
//! every row has finished.
//!
//! The cache is allocated once, for the longest prompt plus
//! `max_new_tokens - 1` columns a row: the memory a generation can need,
//! used or not (Qwen3-4B in bf16: 144 KiB a column a row). Every row pays
//! for the longest prompt's columns, so callers should batch prompts of
//! similar length (sort by length).
//!
//! Every kept token comes with its log-probability under the untruncated
//! `softmax(logits / temperature)`, the number an RL trainer recomputes.
//! Greedy picks on the device and moves `B` ids and log-probs a step to the
//! host. Sampling moves the `(B, vocab)` logits to the host in f32 a step
//! and draws there (temperature, then top-k, then top-p), each prompt from
//! its own seeded stream, so a prompt's sample does not depend on the
//! others in the batch.
//! Nothing here knows about tokenizers or text.

use candle_core::{D, DType, Device, Result, Tensor};

use super::Model;
use super::init::Rng;

/// Columns a prefill pass takes. Eager attention holds `(B, H, L, T)` f32
/// scores, so one pass over a whole batch of long prompts would not fit
/// (64 prompts of 3,000 tokens, 32 heads: 74 GB); chunks of 256 bound that
/// to `B * H * 256 * T * 4` bytes (6 GB there) at a few more launches.
pub const PREFILL_CHUNK: usize = 256;

/// One prompt's continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The new tokens, without the stop token.
    pub tokens: Vec<u32>,
    /// One per token of `tokens`: its log-probability under
    /// `softmax(logits / temperature)` over the whole vocabulary, before
    /// top-k and top-p truncation (the raw logits at temperature 0 and in
    /// [`greedy`]). That is what a trainer's forward over prompt + tokens
    /// computes (`train::loss::next_token_logprobs` of the logits divided by
    /// the temperature), so the two can be compared.
    pub logprobs: Vec<f32>,
    /// Whether a stop id ended it (else `max_new_tokens` did).
    pub stopped: bool,
}

/// How [`sample`] draws a token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Logits are divided by it; 0 picks the most likely token.
    pub temperature: f64,
    /// Nucleus sampling (Holtzman et al. 2020, "The Curious Case of Neural
    /// Text Degeneration", sec. 3.1): draw from the fewest most likely
    /// tokens whose probability reaches `top_p` of what top-k kept; 1 keeps
    /// every token.
    pub top_p: f64,
    /// Draw from the `top_k` most likely tokens only (Fan et al. 2018,
    /// "Hierarchical Neural Story Generation", sec. 5.4), before top-p;
    /// 0 keeps every token.
    pub top_k: usize,
    /// Prompt `i` draws from the stream `(seed, i)`.
    pub seed: u64,
}

impl Default for Sampling {
    /// Plain sampling from the model's distribution.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

/// Greedy continuations of `prompts` (token ids, none empty), at most
/// `max_rows` decoding at once (0: all of them). See the module header for
/// stopping and padding.
pub fn greedy(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    max_rows: usize,
    device: &Device,
) -> Result<Vec<Generation>> {
    let mut pick = |logits: &Tensor, _: &[(usize, usize)]| pick_greedy(logits);
    decode(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        max_rows,
        device,
        PREFILL_CHUNK,
        &mut pick,
    )
}

/// Sampled continuations of `prompts`, at most `max_rows` decoding at once
/// (0: all of them); reproducible for a given `sampling.seed`, and each
/// prompt's sample is the one it gets alone.
#[allow(clippy::too_many_arguments)] // each is a separate knob of one call
pub fn sample(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    max_rows: usize,
    sampling: &Sampling,
    device: &Device,
) -> Result<Vec<Generation>> {
    let Sampling {
        temperature, top_p, ..
    } = *sampling;
    if !(temperature.is_finite() && temperature >= 0.0) {
        candle_core::bail!("temperature must be finite and >= 0, not {temperature}");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        candle_core::bail!("top_p must be in (0, 1], not {top_p}");
    }
    let mut rngs: Vec<Rng> = (0..prompts.len())
        .map(|i| Rng::for_tensor(sampling.seed, &format!("sample/{i}")))
        .collect();
    let mut pick = |logits: &Tensor, live: &[(usize, usize)]| -> Result<Vec<(u32, f32)>> {
        let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut out = vec![(0, 0.0); rows.len()];
        for &(row, prompt) in live {
            out[row] = draw(&rows[row], sampling, &mut rngs[prompt]);
        }
        Ok(out)
    };
    decode(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        max_rows,
        device,
        PREFILL_CHUNK,
        &mut pick,
    )
}

/// The most likely token of each row of `logits: (B, vocab)` and its
/// log-probability, picked on the device: only `2 B` numbers move.
fn pick_greedy(logits: &Tensor) -> Result<Vec<(u32, f32)>> {
    let ids = logits.argmax_keepdim(D::Minus1)?; // (B, 1)
    let logp = candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?
        .gather(&ids, 1)?
        .squeeze(1)?;
    let ids = ids.squeeze(1)?.to_vec1::<u32>()?;
    Ok(ids.into_iter().zip(logp.to_vec1::<f32>()?).collect())
}

/// Picks the next token of each batch row, with its log-probability, from
/// the last logits `(B, vocab)`; only the `(batch row, prompt)` pairs given
/// are still decoding.
type Pick<'a> = dyn FnMut(&Tensor, &[(usize, usize)]) -> Result<Vec<(u32, f32)>> + 'a;

#[allow(clippy::too_many_arguments)] // private; the public entry points name them
fn decode(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    max_rows: usize,
    device: &Device,
    prefill_chunk: usize,
    pick: &mut Pick,
) -> Result<Vec<Generation>> {
    let mut out = vec![
        Generation {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            stopped: false,
        };
        prompts.len()
    ];
    if prompts.is_empty() || max_new_tokens == 0 {
        return Ok(out);
    }
    if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
        candle_core::bail!("prompt {i} is empty: decoding needs at least one token");
    }
    let cap = if max_rows == 0 {
        prompts.len()
    } else {
        max_rows
    };
    let all: Vec<usize> = (0..prompts.len()).collect();
    for group in all.chunks(cap) {
        decode_group(
            model,
            prompts,
            group,
            &mut out,
            max_new_tokens,
            stop_ids,
            pad_id,
            device,
            prefill_chunk,
            pick,
        )?;
    }
    Ok(out)
}

/// Decodes the prompts `group` (indices into `prompts`) together.
#[allow(clippy::too_many_arguments)] // private
fn decode_group(
    model: &Model,
    prompts: &[Vec<u32>],
    group: &[usize],
    out: &mut [Generation],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    device: &Device,
    prefill_chunk: usize,
    pick: &mut Pick,
) -> Result<()> {
    let width = group.iter().map(|&p| prompts[p].len()).max().unwrap_or(0);
    let pads: Vec<usize> = group.iter().map(|&p| width - prompts[p].len()).collect();
    let ids: Vec<u32> = group
        .iter()
        .flat_map(|&p| {
            let p = &prompts[p];
            std::iter::repeat_n(pad_id, width - p.len()).chain(p.iter().copied())
        })
        .collect();
    let ids = Tensor::from_vec(ids, (group.len(), width), device)?; // (B, W)
    // The last new token is never fed back, so it needs no column.
    let mut cache = model
        .new_cache()
        .with_capacity(width + max_new_tokens - 1)
        .with_left_padding(pads);
    let mut logits = None;
    for start in (0..width).step_by(prefill_chunk.max(1)) {
        let len = prefill_chunk.min(width - start);
        logits = Some(model.forward_with_cache(&ids.narrow(1, start, len)?, start, &mut cache)?);
    }
    let mut logits = logits.expect("prompts are not empty"); // (B, vocab)
    // Batch row i decodes prompt rows[i]; live[i] while it has not finished.
    let mut rows: Vec<usize> = group.to_vec();
    let mut live = vec![true; rows.len()];
    loop {
        let decoding: Vec<(usize, usize)> = (0..rows.len())
            .filter(|&i| live[i])
            .map(|i| (i, rows[i]))
            .collect();
        let picked = pick(&logits, &decoding)?;
        let mut next: Vec<u32> = picked.iter().map(|&(t, _)| t).collect();
        for &(i, prompt) in &decoding {
            let g = &mut out[prompt];
            let (token, logprob) = picked[i];
            if stop_ids.contains(&token) {
                g.stopped = true;
                live[i] = false;
            } else {
                g.tokens.push(token);
                g.logprobs.push(logprob);
                live[i] = g.tokens.len() < max_new_tokens;
            }
        }
        let n_live = live.iter().filter(|&&l| l).count();
        if n_live == 0 {
            break;
        }
        if 2 * n_live <= rows.len() {
            let keep: Vec<usize> = (0..rows.len()).filter(|&i| live[i]).collect();
            cache.retain_rows(&keep)?;
            rows = keep.iter().map(|&i| rows[i]).collect();
            next = keep.iter().map(|&i| next[i]).collect();
            live = vec![true; n_live];
        }
        let feed: Vec<u32> = (0..rows.len())
            .map(|i| if live[i] { next[i] } else { pad_id })
            .collect();
        let ids = Tensor::from_vec(feed, (rows.len(), 1), device)?; // (B', 1)
        logits = model.forward_with_cache(&ids, cache.len(), &mut cache)?;
    }
    Ok(())
}

/// Draws a token from one row of logits: the token and its log-probability
/// under `softmax(logits / temperature)` over the whole row (the raw logits
/// at temperature 0), before any truncation.
fn draw(logits: &[f32], s: &Sampling, rng: &mut Rng) -> (u32, f32) {
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let max = f64::from(logits.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let temperature = if s.temperature == 0.0 {
        1.0
    } else {
        s.temperature
    };
    let weights: Vec<f64> = logits
        .iter()
        .map(|&x| ((f64::from(x) - max) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let logprob = |t: usize| ((f64::from(logits[t]) - max) / temperature - total.ln()) as f32;
    if s.temperature == 0.0 {
        let t = (0..logits.len()).min_by(by_logit).unwrap_or(0);
        return (t as u32, logprob(t));
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let mut kept = total;
    if s.top_k > 0 && s.top_k < order.len() {
        order.select_nth_unstable_by(s.top_k - 1, by_logit);
        order.truncate(s.top_k);
        kept = order.iter().map(|&t| weights[t]).sum();
    }
    let nucleus: &[usize] = if s.top_p >= 1.0 {
        &order
    } else {
        // The nucleus is usually small: sort a top-k that grows until it
        // holds `top_p` of the mass, rather than the whole vocabulary.
        let mut k = 64.min(order.len());
        loop {
            if k < order.len() {
                order.select_nth_unstable_by(k - 1, by_logit);
            }
            order[..k].sort_unstable_by(by_logit);
            let mut mass = 0.0;
            let end = order[..k].iter().position(|&t| {
                mass += weights[t];
                mass >= s.top_p * kept
            });
            match end {
                Some(end) => break &order[..=end],
                None if k == order.len() => break &order,
                None => k = (4 * k).min(order.len()),
            }
        }
    };
    let mass: f64 = nucleus.iter().map(|&t| weights[t]).sum();
    let mut u = rng.next_f64() * mass;
    for &t in nucleus {
        u -= weights[t];
        if u < 0.0 {
            return (t as u32, logprob(t));
        }
    }
    let t = *nucleus.last().unwrap_or(&0);
    (t as u32, logprob(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{load, tiny};

    #[test]
    fn chunked_prefill_decodes_like_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        tiny::write_tiny_qwen3(dir.path(), 42).unwrap();
        let m = load(dir.path(), None, DType::F32, &Device::Cpu).unwrap();
        let prompts: Vec<Vec<u32>> = vec![(1..10).collect(), (20..24).collect()];
        let run = |chunk| {
            let mut pick = |logits: &Tensor, _: &[(usize, usize)]| pick_greedy(logits);
            decode(
                &m.model,
                &prompts,
                6,
                &[],
                0,
                0,
                &Device::Cpu,
                chunk,
                &mut pick,
            )
            .unwrap()
        };
        let whole = run(64);
        for chunk in [2, 1] {
            for (a, b) in run(chunk).iter().zip(&whole) {
                assert_eq!(
                    (&a.tokens, a.stopped),
                    (&b.tokens, b.stopped),
                    "chunk {chunk}"
                );
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() < 1e-5, "chunk {chunk}: {x} vs {y}");
                }
            }
        }
    }

    fn draws(logits: &[f32], temperature: f64, top_p: f64, n: usize) -> Vec<u32> {
        let s = Sampling {
            temperature,
            top_p,
            ..Sampling::default()
        };
        let mut rng = Rng::for_tensor(3, "t");
        (0..n).map(|_| draw(logits, &s, &mut rng).0).collect()
    }

    #[test]
    fn zero_temperature_and_tiny_top_p_pick_the_most_likely() {
        let logits = [0.1, 2.0, -1.0, 2.0, 0.5];
        // Ties go to the lower id, as argmax does.
        assert!(draws(&logits, 0.0, 1.0, 20).iter().all(|&t| t == 1));
        assert!(draws(&logits, 1.0, 1e-9, 20).iter().all(|&t| t == 1));
    }

    #[test]
    fn top_p_keeps_the_fewest_tokens_reaching_the_mass() {
        // Probabilities 0.5, 0.3, 0.2 (+ one of about 0): top_p 0.75 keeps 2.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln(), -100.0];
        let d = draws(&logits, 1.0, 0.75, 4000);
        assert!(d.iter().all(|&t| t < 2), "{d:?}");
        let share0 = d.iter().filter(|&&t| t == 0).count() as f64 / d.len() as f64;
        assert!((share0 - 0.625).abs() < 0.03, "{share0}");
        // A vocabulary larger than the first top-k: the nucleus grows.
        let flat = vec![0.0f32; 1000];
        let d = draws(&flat, 1.0, 0.9, 2000);
        let distinct: std::collections::BTreeSet<_> = d.iter().collect();
        assert!(distinct.len() > 500, "{}", distinct.len());
    }

    #[test]
    fn full_distribution_matches_the_softmax() {
        let logits = [1.0f32, 0.0, -1.0];
        let d = draws(&logits, 1.0, 1.0, 20_000);
        let z: f64 = [1f64, 0.0, -1.0].iter().map(|x| x.exp()).sum();
        for t in 0..3 {
            let share = d.iter().filter(|&&x| x == t).count() as f64 / d.len() as f64;
            let p = (1.0 - t as f64).exp() / z;
            assert!((share - p).abs() < 0.015, "token {t}: {share} vs {p}");
        }
    }

    #[test]
    fn top_k_keeps_the_k_most_likely_and_logprobs_ignore_truncation() {
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln(), -100.0];
        let s = Sampling {
            top_k: 2,
            ..Sampling::default()
        };
        let mut rng = Rng::for_tensor(4, "k");
        let mut zeros = 0;
        for _ in 0..4000 {
            let (t, lp) = draw(&logits, &s, &mut rng);
            assert!(t < 2, "{t}");
            zeros += usize::from(t == 0);
            // The log-prob is the full distribution's, not the truncated one's.
            assert!((lp - logits[t as usize]).abs() < 1e-6, "{lp}");
        }
        assert!((zeros as f64 / 4000.0 - 0.625).abs() < 0.03, "{zeros}");
        // At temperature 2 the log-prob is that of softmax(logits / 2).
        let hot = Sampling {
            temperature: 2.0,
            ..Sampling::default()
        };
        let (t, lp) = draw(&logits, &hot, &mut rng);
        let z: f64 = logits.iter().map(|&x| (f64::from(x) / 2.0).exp()).sum();
        let want = f64::from(logits[t as usize]) / 2.0 - z.ln();
        assert!((f64::from(lp) - want).abs() < 1e-6, "{lp} vs {want}");
    }
}
