//! How much of a Stage 3 batch one forward or backward pass holds.
//!
//! Every training pass of Stage 3 (old log-probs and values, reference
//! log-probs, the clipped update) runs in micro-batches of at most a token
//! budget, counted as the packed tensors hold them: rows times the longest
//! row's prompt + response tokens (padding included). The update sums the
//! micro-batches' gradients before its one optimizer step a minibatch, so
//! the budget decides memory, never the numbers (up to the order of
//! additions).
//!
//! The budget is `ppo.micro_batch_tokens` when set (> 0); else, on a GPU,
//! chosen from the device's free memory after loading ([`auto_tokens`]), and
//! on the CPU [`CPU_TOKENS`].

use candle_core::Device;

use crate::config::RlConfig;
use crate::model::Model;
use crate::train::loss::LOGIT_CHUNK_BYTES;

/// The CPU's budget when none is set: host memory is rarely the limit of a
/// CPU run (tiny models, tests), and a fixed figure keeps every CPU run's
/// grouping, and so its numbers, the same on any machine.
pub const CPU_TOKENS: usize = 8192;

/// The share of the free memory the auto budget plans to fill: the rest
/// covers the allocator's fragmentation and what the model below leaves out.
const FREE_SHARE: f64 = 0.7;

/// Kept free beyond the modelled peak.
const MARGIN_BYTES: u64 = 1 << 30;

/// The sizes the memory model reads from a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    /// Query heads, and the widths of all queries and of all keys (values
    /// are as wide as keys).
    pub heads: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    /// Bytes of one activation (the training dtype's).
    pub dtype_bytes: usize,
    /// Fused attention (cuDNN): no `(heads, L, L)` scores are materialised.
    pub fused_attention: bool,
}

impl Shape {
    /// The shape of `model` (its decoder's projections and head).
    pub fn of(model: &Model, dtype: candle_core::DType) -> candle_core::Result<Self> {
        let projections = model.projections();
        // Seven projections a layer: q, k, v, o, gate, up, down.
        let dim = |i: usize| -> candle_core::Result<usize> {
            Ok(projections
                .get(i)
                .map(|p| p.base().dims())
                .transpose()?
                .map_or(0, |d| d.0))
        };
        Ok(Self {
            hidden: model.lm_head().dims()?.1,
            intermediate: dim(4)?,
            layers: projections.len() / 7,
            heads: model.decoder().num_attention_heads(),
            q_dim: dim(0)?,
            kv_dim: dim(1)?,
            dtype_bytes: dtype.size_in_bytes(),
            fused_attention: model.decoder().fused_attention(),
        })
    }

    /// Modelled bytes a token of a training micro-batch holds at its peak,
    /// for rows of at most `max_len` tokens, with or without per-layer
    /// gradient checkpointing. With `e` the activation dtype's bytes, `h`,
    /// `q`, `kv`, `i` the hidden, query, key and MLP widths, `N` layers and
    /// `H` query heads:
    ///
    /// - `a = 2h + 3q + 3kv + 2i`: the elements a layer saves for its
    ///   backward a token (`decoder::Acts`: input, residual, q and k before
    ///   and after norm and rotation, v, attention output, gate, up);
    /// - kept until the backward: `N a e` (or `N h e` with checkpointing:
    ///   each layer's input only);
    /// - the layer being differentiated: `4 a e` (its recomputed
    ///   activations, their gradients and the temporaries between);
    /// - the residual stream and the head: `8 h * 4` (final hidden states,
    ///   f32 gradients, the log-prob gradient rows of `lm_head_logprobs`);
    /// - plain (unfused) attention: `6 * 4 H max_len`: about six f32
    ///   `(H, L, L)` score-sized tensors alive in a layer's backward,
    ///   `H L` elements a token of a row of `L <= max_len`.
    pub fn bytes_per_token(&self, checkpointing: bool, max_len: usize) -> u64 {
        let (e, h) = (self.dtype_bytes as u64, self.hidden as u64);
        let a =
            2 * h + 3 * self.q_dim as u64 + 3 * self.kv_dim as u64 + 2 * self.intermediate as u64;
        let layers = self.layers as u64;
        let kept = if checkpointing {
            layers * h
        } else {
            layers * a
        } * e;
        let work = 4 * a * e;
        let stream = 8 * h * 4;
        let attention = if self.fused_attention {
            0
        } else {
            6 * 4 * self.heads as u64 * max_len as u64
        };
        kept + work + stream + attention
    }

    /// Bytes a pass holds whatever its size: `lm_head_logprobs` turns one
    /// chunk of about [`LOGIT_CHUNK_BYTES`] of f32 logits into its softmax,
    /// log-softmax, entropy terms and gradient rows (ten chunk-sized
    /// tensors at most), plus [`MARGIN_BYTES`].
    pub fn fixed_bytes(&self) -> u64 {
        10 * LOGIT_CHUNK_BYTES as u64 + MARGIN_BYTES
    }
}

/// The auto budget: `(FREE_SHARE * free - fixed) / bytes_per_token` tokens,
/// at least one row of `max_len` (a row never splits; with less memory
/// than that the run may still fail, and [`choose`] warns) and at most
/// `cap`.
pub fn auto_tokens(
    shape: &Shape,
    checkpointing: bool,
    free_bytes: u64,
    max_len: usize,
    cap: usize,
) -> usize {
    let usable = (free_bytes as f64 * FREE_SHARE) as u64;
    let per = shape.bytes_per_token(checkpointing, max_len).max(1);
    let tokens = usable.saturating_sub(shape.fixed_bytes()) / per;
    (tokens as usize).min(cap).max(max_len.max(1))
}

/// The budget of a run and how it was chosen (for the log).
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub tokens: usize,
    pub how: String,
}

/// The budget of `cfg` for `model` on `device` (call after the weights and
/// optimizers are on the device: the auto choice reads what is left).
pub fn choose(
    cfg: &RlConfig,
    model: &Model,
    dtype: candle_core::DType,
    device: &Device,
    checkpointing: bool,
) -> anyhow::Result<Budget> {
    if let Some(n) = cfg.micro_batch_tokens.filter(|&n| n > 0) {
        return Ok(Budget {
            tokens: n,
            how: "ppo.micro_batch_tokens".into(),
        });
    }
    let max_len = cfg.max_prompt_tokens + cfg.max_new_tokens;
    // No pass holds more than the whole batch.
    let rows = (cfg.batch_size * cfg.group_size()).max(cfg.mini_batch_size);
    let cap = rows.saturating_mul(max_len).max(1);
    let Some(free) = crate::gpu::free_memory(device)? else {
        return Ok(Budget {
            tokens: CPU_TOKENS,
            how: "the CPU's fixed default".into(),
        });
    };
    let shape = Shape::of(model, dtype)?;
    let tokens = auto_tokens(&shape, checkpointing, free, max_len, cap);
    let per = shape.bytes_per_token(checkpointing, max_len);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if (tokens as u64).saturating_mul(per) + shape.fixed_bytes() > free {
        tracing::warn!(
            "stage 3: {:.1} GiB free on the device may not hold one row of {max_len} tokens in training ({:.2} MiB a token)\nhint: lower max_prompt_tokens or max_new_tokens, turn gradient checkpointing on, or load the base in 4 bits",
            gib(free),
            per as f64 / (1u64 << 20) as f64
        );
    }
    Ok(Budget {
        tokens,
        how: format!(
            "auto: {:.1} GiB free, {:.2} MiB a token with checkpointing {}",
            gib(free),
            per as f64 / (1u64 << 20) as f64,
            if checkpointing { "on" } else { "off" }
        ),
    })
}

/// Indices of rows of `lens` tokens in micro-batches whose packed size
/// (rows x the longest row) is at most `budget`: longest rows first (least
/// padding), each micro-batch filled in that order; a row longer than the
/// budget goes alone. Deterministic in `lens`.
pub fn micro_batches(lens: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for i in order {
        // Longest first: the micro-batch's first row is its longest.
        let longest = current.first().map_or(lens[i], |&f| lens[f]);
        if !current.is_empty() && (current.len() + 1).saturating_mul(longest) > budget {
            out.push(std::mem::take(&mut current));
        }
        current.push(i);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-4B: hidden 2560, MLP 9728, 36 layers, 32 query heads and 8
    /// key/value heads of 128.
    fn qwen3_4b(fused_attention: bool) -> Shape {
        Shape {
            hidden: 2560,
            intermediate: 9728,
            layers: 36,
            heads: 32,
            q_dim: 32 * 128,
            kv_dim: 8 * 128,
            dtype_bytes: 2,
            fused_attention,
        }
    }

    #[test]
    fn micro_batches_hold_the_budget_and_every_row_once() {
        let lens = [30, 10, 25, 5, 40, 12, 12, 7];
        for budget in [1, 20, 40, 50, 64, 100, 1000] {
            let parts = micro_batches(&lens, budget);
            let mut seen: Vec<usize> = parts.iter().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..lens.len()).collect::<Vec<_>>(), "budget {budget}");
            for p in &parts {
                let longest = p.iter().map(|&i| lens[i]).max().unwrap();
                assert!(
                    p.len() == 1 || p.len() * longest <= budget,
                    "budget {budget}: {p:?}"
                );
            }
        }
        assert_eq!(micro_batches(&lens, usize::MAX).len(), 1);
        assert_eq!(micro_batches(&lens, 1).len(), lens.len());
        // Longest first: 40 alone, then 30 + 25, ...
        assert_eq!(micro_batches(&lens, 60)[..2], [vec![4], vec![0, 2]]);
        assert!(micro_batches(&[], 10).is_empty());
    }

    #[test]
    fn the_auto_budget_fits_qwen3_4b_qlora_on_a_24_gb_card() {
        // 24 GB (22.35 GiB) less the CUDA context (~0.5 GiB) and Qwen3-4B in
        // NF4 with its bf16 embeddings, LoRA r16 and AdamW (~3.5 GiB).
        let gib = 1u64 << 30;
        let card = 24_000_000_000u64;
        let free = card - gib / 2 - 7 * gib / 2;
        let max_len = 1536 + 512;
        for fused in [false, true] {
            let s = qwen3_4b(fused);
            let t = auto_tokens(&s, true, free, max_len, 16 * max_len);
            // At least one whole row, and the modelled peak under the card.
            assert!(t >= max_len, "{t}");
            let peak = card - free + t as u64 * s.bytes_per_token(true, max_len) + s.fixed_bytes();
            assert!(peak < card * 8 / 10, "{fused}: {t} tokens, peak {peak}");
        }
        // Never below what was measured: docs/BENCHMARKS.md, Qwen3-4B
        // shape on an H200 (bf16 base, 7.5 GiB of weights, cuDNN attention),
        // LoRA r16 at batch 4 x 1024: peaks of 10.07 GiB with checkpointing
        // and 19.95 GiB without (SFT's pass; Stage 3's is the same decoder).
        let s = qwen3_4b(true);
        let weights = 7.5 * gib as f64;
        for (ckpt, measured) in [(true, 10.07), (false, 19.95)] {
            let predicted = 4096 * s.bytes_per_token(ckpt, 1024) + s.fixed_bytes();
            assert!(
                predicted as f64 + weights > measured * gib as f64,
                "checkpointing {ckpt}: {predicted}"
            );
        }
        // The `--b200` preset's fixed budget fits an 80 GB card in the
        // worst case the model knows: bf16 weights, no checkpointing, plain
        // attention, rows of 2048 tokens.
        let plain = qwen3_4b(false);
        let b200 = crate::config::B200_MICRO_BATCH_TOKENS as u64
            * plain.bytes_per_token(false, max_len)
            + plain.fixed_bytes()
            + (weights as u64);
        assert!(b200 < 78 * gib, "{b200}");
        let auto = auto_tokens(&plain, true, card - 4 * gib, max_len, usize::MAX);
        assert!(
            (2 * auto..3 * auto).contains(&crate::config::B200_MICRO_BATCH_TOKENS),
            "{auto}"
        );
        // Checkpointing keeps a layer's input only.
        assert!(s.bytes_per_token(true, max_len) < s.bytes_per_token(false, max_len) / 2);
    }

    #[test]
    fn the_auto_budget_grows_with_memory_and_is_capped() {
        let s = qwen3_4b(true);
        let gib = 1u64 << 30;
        let small = auto_tokens(&s, true, 20 * gib, 2048, usize::MAX);
        let big = auto_tokens(&s, true, 160 * gib, 2048, usize::MAX);
        assert!(big > 4 * small, "{small} {big}");
        assert_eq!(auto_tokens(&s, true, 160 * gib, 2048, 10_000), 10_000);
        // Too little memory for a row: one row (and `choose` warns).
        assert_eq!(auto_tokens(&s, false, gib, 2048, usize::MAX), 2048);
    }
}
