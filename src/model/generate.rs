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
//! Greedy picks on the device and moves `B` ids a step to the host.
//! Sampling moves the `(B, vocab)` logits to the host in f32 a step and
//! draws there, each prompt from its own seeded stream, so a prompt's
//! sample does not depend on the others in the batch.
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// The new tokens, without the stop token.
    pub tokens: Vec<u32>,
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
    /// tokens whose probability reaches `top_p`; 1 keeps every token.
    pub top_p: f64,
    /// Prompt `i` draws from the stream `(seed, i)`.
    pub seed: u64,
}

/// Greedy continuations of `prompts` (token ids, none empty), decoded
/// together. See the module header for stopping and padding.
pub fn greedy(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    device: &Device,
) -> Result<Vec<Generation>> {
    let mut pick =
        |logits: &Tensor, _: &[(usize, usize)]| logits.argmax(D::Minus1)?.to_vec1::<u32>();
    decode(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        device,
        PREFILL_CHUNK,
        &mut pick,
    )
}

/// Sampled continuations of `prompts`, decoded together; reproducible for
/// a given `sampling.seed`.
pub fn sample(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    sampling: &Sampling,
    device: &Device,
) -> Result<Vec<Generation>> {
    let Sampling {
        temperature,
        top_p,
        seed,
    } = *sampling;
    if !(temperature.is_finite() && temperature >= 0.0) {
        candle_core::bail!("temperature must be finite and >= 0, not {temperature}");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        candle_core::bail!("top_p must be in (0, 1], not {top_p}");
    }
    let mut rngs: Vec<Rng> = (0..prompts.len())
        .map(|i| Rng::for_tensor(seed, &format!("sample/{i}")))
        .collect();
    let mut pick = |logits: &Tensor, live: &[(usize, usize)]| -> Result<Vec<u32>> {
        let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut out = vec![0; rows.len()];
        for &(row, prompt) in live {
            out[row] = draw(&rows[row], temperature, top_p, &mut rngs[prompt]);
        }
        Ok(out)
    };
    decode(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        device,
        PREFILL_CHUNK,
        &mut pick,
    )
}

/// Picks the next token of each batch row from the last logits `(B, vocab)`;
/// only the `(batch row, prompt)` pairs given are still decoding.
pub type Pick<'a> = dyn FnMut(&Tensor, &[(usize, usize)]) -> Result<Vec<u32>> + 'a;

/// Continuations of `prompts` decoded together, `pick` choosing every
/// token: for callers with rules of their own per prompt (the server: each
/// request's sampling, stop strings, streaming, a client gone). A pick
/// ends a row early by returning one of `stop_ids`.
pub fn decode_with(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    device: &Device,
    pick: &mut Pick,
) -> Result<Vec<Generation>> {
    decode(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        device,
        PREFILL_CHUNK,
        pick,
    )
}

#[allow(clippy::too_many_arguments)] // private; the public entry points name them
fn decode(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    device: &Device,
    prefill_chunk: usize,
    pick: &mut Pick,
) -> Result<Vec<Generation>> {
    let mut out = vec![
        Generation {
            tokens: Vec::new(),
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
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let pads: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
    let ids: Vec<u32> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(pad_id, width - p.len()).chain(p.iter().copied()))
        .collect();
    let ids = Tensor::from_vec(ids, (prompts.len(), width), device)?; // (B, W)
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
    let mut rows: Vec<usize> = (0..prompts.len()).collect();
    let mut live = vec![true; rows.len()];
    loop {
        let decoding: Vec<(usize, usize)> = (0..rows.len())
            .filter(|&i| live[i])
            .map(|i| (i, rows[i]))
            .collect();
        let mut next = pick(&logits, &decoding)?;
        for &(i, prompt) in &decoding {
            let g = &mut out[prompt];
            if stop_ids.contains(&next[i]) {
                g.stopped = true;
                live[i] = false;
            } else {
                g.tokens.push(next[i]);
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
    Ok(out)
}

/// Draws a token from one row of logits.
pub(crate) fn draw(logits: &[f32], temperature: f64, top_p: f64, rng: &mut Rng) -> u32 {
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    if temperature == 0.0 {
        return (0..logits.len()).min_by(by_logit).unwrap_or(0) as u32;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logits
        .iter()
        .map(|&x| ((f64::from(x) - f64::from(max)) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let nucleus: &[usize] = if top_p >= 1.0 {
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
                mass >= top_p * total
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
            return t as u32;
        }
    }
    *nucleus.last().unwrap_or(&0) as u32
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
            let mut pick =
                |logits: &Tensor, _: &[(usize, usize)]| logits.argmax(D::Minus1)?.to_vec1::<u32>();
            decode(
                &m.model,
                &prompts,
                6,
                &[],
                0,
                &Device::Cpu,
                chunk,
                &mut pick,
            )
            .unwrap()
        };
        let whole = run(64);
        assert_eq!(run(2), whole);
        assert_eq!(run(1), whole);
    }

    fn draws(logits: &[f32], temperature: f64, top_p: f64, n: usize) -> Vec<u32> {
        let mut rng = Rng::for_tensor(3, "t");
        (0..n)
            .map(|_| draw(logits, temperature, top_p, &mut rng))
            .collect()
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
}
