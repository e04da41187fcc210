//! Batched decoding with the KV cache: greedy ([`greedy`]) and sampled
//! ([`sample`]) continuations of a batch of token prompts, with continuous
//! batching.
//!
//! At most `max_rows` prompts decode at once (all of them for 0). The first
//! `max_rows` are left-padded to the longest and prefilled together,
//! [`PREFILL_CHUNK`] columns a pass; the cache gives each row its own
//! positions and hides its padding (see [`Cache`]), so a row decodes to the
//! tokens it would decode alone. Then one token a step for every row. A row
//! finishes on a stop id (not kept) or after `max_new_tokens`.
//!
//! Continuous batching within the one cache: the cache's columns are shared
//! by every row, each row with its own leading padding. When rows finish
//! and prompts wait, the waiting prompts take the free rows at once: they
//! are prefilled together in a cache of their own that starts where their
//! tokens do ([`Cache::starting_at`]), left-padded so that their last token
//! lands on the batch's last filled column, and their rows are copied into
//! the free rows ([`Cache::set_rows`]); from the next step they decode in
//! step with the others. A prompt longer than the filled length gets
//! padding columns in front of every row ([`Cache::grow_front`]); leading
//! columns that no decoding row uses any more (every row's padding) are
//! dropped when they are a quarter of the cache or more
//! ([`Cache::trim_front`]), so the cache holds about the longest prompt plus
//! `max_new_tokens` columns however many prompts pass through. Positions
//! never change (a row's column and padding move together). When no prompt
//! waits, finished rows are fed `pad_id` until they are half the batch and
//! then leave it (one copy of the cache each time, at most log2(B) times).
//! Each row's keys are its own and padding is hidden, so a prompt decodes
//! to the same tokens whatever its neighbours and `max_rows` (the tests
//! hold every prompt to its decoding alone).
//!
//! Every kept token comes with its log-probability under the untruncated
//! `softmax(logits / temperature)`, the number an RL trainer recomputes.
//! On CUDA one kernel picks each row's token and log-probability on the
//! device (`kernels/sample.cu`: top-k and top-p as one threshold found
//! by bisection, the draw by the Gumbel-max trick with noise hashed from
//! the row's seed), so `2 B` numbers reach the host a step instead of the
//! `(B, vocab)` logits (19 MB at Qwen3's vocabulary and batch 32, with a
//! host softmax over all of it). Elsewhere greedy picks with tensor ops and
//! sampling draws on the host from exact f64 probabilities (temperature,
//! then top-k, then top-p). Either way each prompt draws from its own
//! seeded stream (prompt `i`: `(seed, i)`; on CUDA one seed a step from that
//! stream), so a prompt's sample does not depend on the others in the batch
//! and a seed repeats it; the CUDA and CPU draws differ from each other
//! (`TRACE_TRAIN_HOST_SAMPLING` set draws on the host on CUDA too).
//! Nothing here knows about tokenizers or text.

use candle_core::{D, DType, Device, Result, Tensor};

use crate::arch::Model;
use crate::decode::prefill::{PREFILL_CHUNK, left_padded, prefill};
use crate::layers::attention::Cache;
use crate::layers::decoder::DecodeView;
use crate::layers::init::Rng;

/// One prompt's continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The new tokens, without the stop token.
    pub tokens: Vec<u32>,
    /// One per token of `tokens`: its log-probability under
    /// `softmax(logits / temperature)` over the whole vocabulary, before
    /// top-k and top-p truncation (the raw logits at temperature 0 and in
    /// [`greedy`]). That is what a trainer's forward over prompt + tokens
    /// computes (`ops::next_token_logprobs` of the logits divided by
    /// the temperature), so the two can be compared.
    pub logprobs: Vec<f32>,
    /// Whether a stop id ended it (else `max_new_tokens` did).
    pub stopped: bool,
    /// The stop token's log-probability where one ended it, as `logprobs`
    /// has it for the others (the stop token is not in `tokens`). A trainer
    /// scores the stop token too, so RL needs it beside theirs.
    pub stop_logprob: Option<f32>,
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
    /// Prompt `i` draws from the stream `(seed, first_stream + i)`.
    pub seed: u64,
    /// The stream of the first prompt: a batch split over ranks (each
    /// passing where its share starts) draws what the whole batch would.
    pub first_stream: u64,
}

impl Default for Sampling {
    /// Plain sampling from the model's distribution.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            first_stream: 0,
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
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        let draw = crate::decode::draw::Draw::GREEDY;
        let args = fast::Args {
            model,
            prompts,
            max_new_tokens,
            stop_ids,
            pad_id,
            max_rows,
            device,
            draw,
        };
        if let Some(out) = fast::decode(&args, &mut |_| 0)? {
            return Ok(out);
        }
    }
    let mut pick = |logits: &Tensor, _: &[(usize, usize)]| {
        #[cfg(feature = "cuda")]
        if logits.device().is_cuda() {
            let n = logits.dim(0)?;
            let greedy = vec![crate::decode::draw::Draw::GREEDY; n];
            return crate::decode::draw::sample_rows(logits, &vec![0; n], &greedy);
        }
        pick_greedy(logits)
    };
    decode_with(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        max_rows,
        device,
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
        .map(|i| {
            let stream = sampling.first_stream + i as u64;
            Rng::for_tensor(sampling.seed, &format!("sample/{stream}"))
        })
        .collect();
    #[cfg(feature = "cuda")]
    if device.is_cuda() && std::env::var_os("TRACE_TRAIN_HOST_SAMPLING").is_none() {
        let draw = crate::decode::draw::Draw::new(temperature, sampling.top_k, top_p);
        let args = fast::Args {
            model,
            prompts,
            max_new_tokens,
            stop_ids,
            pad_id,
            max_rows,
            device,
            draw,
        };
        if let Some(out) = fast::decode(&args, &mut |p| rngs[p].next_u64())? {
            return Ok(out);
        }
    }
    let mut pick = |logits: &Tensor, live: &[(usize, usize)]| -> Result<Vec<(u32, f32)>> {
        #[cfg(feature = "cuda")]
        if logits.device().is_cuda() && std::env::var_os("TRACE_TRAIN_HOST_SAMPLING").is_none() {
            // One seed a row a step from the prompt's own stream: a
            // prompt's draws do not depend on its batch row or neighbours.
            let mut seeds = vec![0u64; logits.dim(0)?];
            for &(row, prompt) in live {
                seeds[row] = rngs[prompt].next_u64();
            }
            let d = crate::decode::draw::Draw::new(temperature, sampling.top_k, top_p);
            return crate::decode::draw::sample_rows(logits, &seeds, &vec![d; seeds.len()]);
        }
        let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut out = vec![(0, 0.0); rows.len()];
        for &(row, prompt) in live {
            out[row] = draw(&rows[row], sampling, &mut rngs[prompt]);
        }
        Ok(out)
    };
    decode_with(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        max_rows,
        device,
        &mut pick,
    )
}

/// Which decoding path [`greedy`] and [`sample`] take on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePath {
    /// [`DecodePath::Graph`], unless `TRACE_TRAIN_DECODE` says `eager` or
    /// `ops`.
    Auto,
    /// The fused decode step (`model::decode::fast_decode`), launched kernel by
    /// kernel.
    Eager,
    /// The fused decode step captured once as a CUDA graph and replayed.
    Graph,
    /// The model's op-by-op forward over a shared-column cache (also what
    /// runs on the CPU, and on CUDA where the fused step does not apply).
    Ops,
}

thread_local! {
    static DECODE_PATH: std::cell::Cell<DecodePath> = const { std::cell::Cell::new(DecodePath::Auto) };
}

/// Runs `f` with [`greedy`] and [`sample`] on this thread decoding by
/// `path` (tests and benchmarks compare the paths).
pub fn with_decode_path<R>(path: DecodePath, f: impl FnOnce() -> R) -> R {
    let old = DECODE_PATH.with(|p| p.replace(path));
    let out = f();
    DECODE_PATH.with(|p| p.set(old));
    out
}

thread_local! {
    static IN_PLACE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the fused step's weights read in place (`true`: the
/// decode kernel on the bases, where the model allows) or from one folded
/// copy (`false`) on this thread, whatever `TRACE_TRAIN_DECODE_WEIGHTS`
/// says (for tests and benchmarks).
pub fn with_weights_in_place<R>(in_place: bool, f: impl FnOnce() -> R) -> R {
    let old = IN_PLACE.with(|p| p.replace(Some(in_place)));
    let out = f();
    IN_PLACE.with(|p| p.set(old));
    out
}

thread_local! {
    static LAST_PATH: std::cell::Cell<Option<DecodePath>> = const { std::cell::Cell::new(None) };
}

/// The path the last [`greedy`] or [`sample`] on this thread took:
/// [`DecodePath::Graph`] only when it replayed a captured graph.
pub fn last_path() -> Option<DecodePath> {
    LAST_PATH.with(|p| p.get())
}

fn set_last_path(path: DecodePath) {
    LAST_PATH.with(|p| p.set(Some(path)));
}

/// The path decoding takes now.
pub fn decode_path() -> DecodePath {
    match DECODE_PATH.with(|p| p.get()) {
        DecodePath::Auto => match std::env::var("TRACE_TRAIN_DECODE").as_deref() {
            Ok("eager") => DecodePath::Eager,
            Ok("ops") => DecodePath::Ops,
            _ => DecodePath::Graph,
        },
        path => path,
    }
}

/// Records a picked token in `g`; whether the row is done (a stop id, not
/// kept, or `max_new_tokens` reached).
fn record(
    g: &mut Generation,
    token: u32,
    logprob: f32,
    stop_ids: &[u32],
    max_new_tokens: usize,
) -> bool {
    if stop_ids.contains(&token) {
        g.stopped = true;
        g.stop_logprob = Some(logprob);
        true
    } else {
        g.tokens.push(token);
        g.logprobs.push(logprob);
        g.tokens.len() >= max_new_tokens
    }
}

/// The fused decode step's driver: every row its own cache slot, waiting
/// prompts prefilled by the model's forward into free slots, then one
/// [`Engine::step`] a token for all rows.
#[cfg(feature = "cuda")]
mod fast {
    use std::sync::atomic::{AtomicBool, Ordering};

    use candle_core::{Device, Result};

    use super::{
        DECODE_PATH, DecodePath, Generation, IN_PLACE, PREFILL_CHUNK, decode_path, record,
        set_last_path,
    };
    use crate::arch::Model;
    use crate::decode::draw::Draw;
    use crate::decode::fast_decode::Mode;
    use crate::decode::slots::{self, Feed, FusedSlots, Join, Slots};

    pub(super) struct Args<'a> {
        pub model: &'a Model,
        pub prompts: &'a [Vec<u32>],
        pub max_new_tokens: usize,
        pub stop_ids: &'a [u32],
        pub pad_id: u32,
        pub max_rows: usize,
        pub device: &'a Device,
        pub draw: Draw,
    }

    static SAID: AtomicBool = AtomicBool::new(false);

    /// Decoding op by op instead: said once a process; an error when the
    /// fused step was asked for by name ([`super::with_decode_path`]).
    fn fall_back(why: &str) -> Result<Option<Vec<Generation>>> {
        if DECODE_PATH.with(|p| p.get()) != DecodePath::Auto {
            candle_core::bail!("the fused decode step cannot run: {why}");
        }
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::info!("decoding op by op: {why}");
        }
        Ok(None)
    }

    /// The generations of `a.prompts` through the fused step; `None` where
    /// it does not apply (another path asked for, an architecture it does
    /// not cover, too little free memory for its weights), and the caller
    /// decodes op by op. `seed(p)` is prompt `p`'s next random seed.
    pub(super) fn decode(
        a: &Args,
        seed: &mut dyn FnMut(usize) -> u64,
    ) -> Result<Option<Vec<Generation>>> {
        let mode = match decode_path() {
            DecodePath::Ops => return Ok(None),
            DecodePath::Eager => Mode::Eager,
            DecodePath::Graph | DecodePath::Auto => Mode::Graph,
        };
        let prompts = a.prompts;
        if prompts.is_empty() || a.max_new_tokens == 0 || prompts.iter().any(|p| p.is_empty()) {
            // The op-by-op path answers these (nothing to do, or the error).
            return Ok(None);
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
        // The last new token is never fed back: it needs no column.
        let cap = longest + a.max_new_tokens - 1;
        let want = match a.max_rows {
            0 => prompts.len(),
            m => m.min(prompts.len()),
        };
        let forced = IN_PLACE.with(|p| p.get());
        let in_place = |free, rows_bytes| slots::read_in_place(a.model, forced, free, rows_bytes);
        // Prompts join in groups of this many tokens at most.
        let prefill = (want * longest).min(longest.max(slots::PREFILL_TOKENS));
        let plan = match slots::plan(a.model, a.device, want, cap, prefill, &in_place)? {
            Ok(plan) => plan,
            Err(why) => return fall_back(&why),
        };
        if plan.rows < want {
            tracing::info!("decoding {} rows at once (memory), not {want}", plan.rows);
        }
        // Seconds in each phase (logged at debug level): the decode
        // weights, the rows' setup, the prefills, the steps.
        let timed = tracing::enabled!(tracing::Level::DEBUG);
        let mut clock = std::time::Instant::now();
        let lap = |clock: &mut std::time::Instant| -> Result<f64> {
            if timed {
                a.device.synchronize()?;
            }
            let s = clock.elapsed().as_secs_f64();
            *clock = std::time::Instant::now();
            Ok(s)
        };
        let Some(w) = a.model.decoder().decode_weights(plan.in_place)? else {
            return fall_back("the fused step does not cover this architecture");
        };
        let weights_s = lap(&mut clock)?;
        let mut rows = FusedSlots::new(
            a.model,
            &w,
            a.device,
            plan.rows,
            cap,
            a.pad_id,
            prefill,
            PREFILL_CHUNK,
            mode,
        )?;
        let setup_s = lap(&mut clock)?;
        let (mut prefill_s, mut step_s, mut steps, mut first_step_s) = (0.0, 0.0, 0usize, 0.0);
        let empty = Generation {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            stopped: false,
            stop_logprob: None,
        };
        let mut out = vec![empty; prompts.len()];
        // The prompt each row decodes, and the token it feeds next.
        let mut slot: Vec<Option<(usize, u32)>> = vec![None; plan.rows];
        let mut waiting = 0..prompts.len();
        loop {
            let free = (0..plan.rows).filter(|&r| slot[r].is_none());
            // (row, prompt) of each prompt joining now.
            let joining: Vec<(usize, usize)> = free.zip(waiting.by_ref()).collect();
            let (picked, by) = if joining.is_empty() {
                let by: Vec<(usize, usize)> = (0..plan.rows)
                    .filter_map(|r| slot[r].map(|(p, _)| (r, p)))
                    .collect();
                if by.is_empty() {
                    break;
                }
                let feeds: Vec<Feed> = by
                    .iter()
                    .map(|&(row, p)| Feed {
                        row,
                        token: slot[row].expect("a live row").1,
                        draw: a.draw,
                        seed: seed(p),
                    })
                    .collect();
                let picked = rows.step(&feeds)?;
                let s = lap(&mut clock)?;
                if steps == 0 {
                    first_step_s = s;
                }
                steps += 1;
                step_s += s;
                (picked, by)
            } else {
                let joins: Vec<Join> = joining
                    .iter()
                    .map(|&(row, p)| Join {
                        row,
                        prompt: &prompts[p],
                        budget: a.max_new_tokens,
                        draw: a.draw,
                        seed: seed(p),
                        adapter: 0,
                    })
                    .collect();
                let picked = rows.admit(&joins)?;
                prefill_s += lap(&mut clock)?;
                (picked, joining)
            };
            for (&(token, logprob), &(r, p)) in picked.iter().zip(&by) {
                if record(&mut out[p], token, logprob, a.stop_ids, a.max_new_tokens) {
                    slot[r] = None;
                    rows.free(r);
                } else {
                    slot[r] = Some((p, token));
                }
            }
        }
        let (builds, build_s) = crate::cuda::attention_graph_builds();
        let att = rows.attention();
        tracing::debug!(
            "decode: weights {weights_s:.3} s, setup {setup_s:.3} s, prefills {prefill_s:.3} s, \
             {steps} steps {step_s:.3} s (the first {first_step_s:.3} s), attention {} \
             (chunk {}, {} splits); cuDNN attention graphs built in the process so far: \
             {builds} in {build_s:.3} s",
            att.kernel.name(),
            att.chunk,
            att.splits
        );
        set_last_path(if rows.captured() {
            DecodePath::Graph
        } else {
            DecodePath::Eager
        });
        Ok(Some(out))
    }
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

/// Picks the next token of each row of the last logits `(rows, vocab)`,
/// with its log-probability; only the `(logits row, prompt)` pairs given
/// are decoding (the other rows' picks are ignored).
pub type Pick<'a> = dyn FnMut(&Tensor, &[(usize, usize)]) -> Result<Vec<(u32, f32)>> + 'a;

/// Continuations of `prompts` decoded as [`sample`] does, `pick` choosing
/// every token: for callers with rules of their own per prompt (the
/// server: each request's sampling, stop strings, streaming, a client
/// gone). A pick ends a row early by returning one of `stop_ids`.
#[allow(clippy::too_many_arguments)] // the same knobs as `sample`, with the pick for the sampling
pub fn decode_with(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &[u32],
    pad_id: u32,
    max_rows: usize,
    device: &Device,
    pick: &mut Pick,
) -> Result<Vec<Generation>> {
    decode(
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        max_rows,
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
    max_rows: usize,
    device: &Device,
    prefill_chunk: usize,
    pick: &mut Pick,
) -> Result<Vec<Generation>> {
    let empty = Generation {
        tokens: Vec::new(),
        logprobs: Vec::new(),
        stopped: false,
        stop_logprob: None,
    };
    set_last_path(DecodePath::Ops);
    if prompts.is_empty() || max_new_tokens == 0 {
        return Ok(vec![empty; prompts.len()]);
    }
    if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
        candle_core::bail!("prompt {i} is empty: decoding needs at least one token");
    }
    let slots = match max_rows {
        0 => prompts.len(),
        cap => cap.min(prompts.len()),
    };
    let first: Vec<usize> = (0..slots).collect();
    let width = prompts[..slots].iter().map(Vec::len).max().unwrap_or(0);
    let pads: Vec<usize> = prompts[..slots].iter().map(|p| width - p.len()).collect();
    // The last new token is never fed back, so it needs no column.
    let cache = model
        .new_cache()
        .with_capacity(width + max_new_tokens - 1)
        .with_left_padding(pads);
    let mut d = Decoding {
        model,
        prompts,
        max_new_tokens,
        stop_ids,
        pad_id,
        device,
        prefill_chunk: prefill_chunk.max(1),
        out: vec![empty; prompts.len()],
        rows: first.iter().map(|&p| Some(p)).collect(),
        next: vec![pad_id; slots],
        cache,
        view: model.decode_view()?,
    };
    let ids = d.left_padded(&first, width)?;
    let logits = d.prefill(&ids, 0, None)?;
    d.take(
        &logits,
        &first.iter().map(|&r| (r, r)).collect::<Vec<_>>(),
        pick,
    )?;
    let mut waiting = slots..prompts.len();
    loop {
        // Finished rows make room for waiting prompts at once.
        loop {
            let free: Vec<usize> = (0..d.rows.len()).filter(|&r| d.rows[r].is_none()).collect();
            let joining: Vec<usize> = waiting.by_ref().take(free.len()).collect();
            if joining.is_empty() {
                break;
            }
            let at = &free[..joining.len()];
            let logits = d.admit(at, &joining)?;
            let pairs: Vec<(usize, usize)> = at.iter().copied().enumerate().collect();
            d.take(&logits, &pairs, pick)?;
        }
        let live = d.live();
        if live.is_empty() {
            break;
        }
        if waiting.is_empty() && 2 * live.len() <= d.rows.len() {
            // Nothing left to admit: the finished rows leave the batch
            // (one copy of the cache, at most log2(B) times).
            d.cache.retain_rows(&live)?;
            d.rows = live.iter().map(|&r| d.rows[r]).collect();
            d.next = live.iter().map(|&r| d.next[r]).collect();
        }
        let ids = Tensor::from_vec(d.next.clone(), (d.rows.len(), 1), device)?; // (B, 1)
        let logits = d
            .model
            .forward_with_view(&ids, d.cache.len(), &mut d.cache, &d.view)?;
        let at: Vec<(usize, usize)> = d.live().into_iter().map(|r| (r, r)).collect();
        d.take(&logits, &at, pick)?;
    }
    Ok(d.out)
}

/// The state of one [`decode`] call: a batch of rows over one cache, each
/// row decoding a prompt or free.
struct Decoding<'a> {
    model: &'a Model,
    prompts: &'a [Vec<u32>],
    max_new_tokens: usize,
    stop_ids: &'a [u32],
    pad_id: u32,
    device: &'a Device,
    prefill_chunk: usize,
    out: Vec<Generation>,
    /// The prompt batch row `i` decodes; `None` while it is free.
    rows: Vec<Option<usize>>,
    /// The token each row feeds at the next step (`pad_id` when free).
    next: Vec<u32>,
    cache: Cache,
    /// The weights as they are now, folded for decoding (built per call,
    /// so never older than the call).
    view: DecodeView,
}

impl Decoding<'_> {
    /// The rows still decoding.
    fn live(&self) -> Vec<usize> {
        (0..self.rows.len())
            .filter(|&r| self.rows[r].is_some())
            .collect()
    }

    /// `(k, width)` ids of the prompts `which`, each left-padded to `width`.
    fn left_padded(&self, which: &[usize], width: usize) -> Result<Tensor> {
        let prompts: Vec<&[u32]> = which.iter().map(|&p| self.prompts[p].as_slice()).collect();
        left_padded(&prompts, width, self.pad_id, self.device)
    }

    /// Runs `ids: (k, W)` into columns `start..start + W` of `fresh` (the
    /// batch's own cache when `None`), [`PREFILL_CHUNK`] columns a pass;
    /// the last column's logits `(k, vocab)`.
    fn prefill(&mut self, ids: &Tensor, start: usize, fresh: Option<&mut Cache>) -> Result<Tensor> {
        let cache = match fresh {
            Some(c) => c,
            None => &mut self.cache,
        };
        prefill(self.model, ids, start, cache, self.prefill_chunk)
    }

    /// Prefills the prompts `joining` into the free rows `at` and returns
    /// their last logits `(k, vocab)`. A joining prompt is left-padded so
    /// that its last token sits on the batch's last filled column, then
    /// decodes in step with the others; its own columns only are computed
    /// ([`Cache::starting_at`]). Leading columns that no live row uses any
    /// more are dropped first when they are a quarter of the cache or more,
    /// and columns are added in front when a prompt is longer than the
    /// filled length.
    fn admit(&mut self, at: &[usize], joining: &[usize]) -> Result<Tensor> {
        let longest = joining
            .iter()
            .map(|&p| self.prompts[p].len())
            .max()
            .unwrap_or(0);
        let live = self.live();
        let len = self.cache.len();
        let pad = |r: usize| self.cache.pads().get(r).copied().unwrap_or(0);
        let unused = live.iter().map(|&r| pad(r)).min().unwrap_or(len);
        let drop = unused.min(len.saturating_sub(longest));
        if drop > 0 && 4 * drop >= len {
            self.cache.trim_front(drop, &live)?;
        }
        let len = self.cache.len();
        if longest > len {
            self.cache.grow_front(longest - len)?;
        }
        let len = self.cache.len();
        self.cache.reserve(len + self.max_new_tokens - 1)?;
        let pads: Vec<usize> = joining
            .iter()
            .map(|&p| len - self.prompts[p].len())
            .collect();
        let start = len - longest;
        let mut fresh = self
            .model
            .new_cache()
            .with_capacity(self.cache.capacity())
            .with_left_padding(pads)
            .starting_at(start);
        let ids = self.left_padded(joining, longest)?;
        let logits = self.prefill(&ids, start, Some(&mut fresh))?;
        self.cache.set_rows(at, &fresh)?;
        for (&r, &p) in at.iter().zip(joining) {
            self.rows[r] = Some(p);
        }
        Ok(logits)
    }

    /// Picks from `logits` for the `(logits row, batch row)` pairs `at` and
    /// records each pick in its prompt's output; rows that finish are freed.
    fn take(&mut self, logits: &Tensor, at: &[(usize, usize)], pick: &mut Pick) -> Result<()> {
        let pairs: Vec<(usize, usize)> = at
            .iter()
            .map(|&(l, r)| (l, self.rows[r].expect("a decoding row")))
            .collect();
        let picked = pick(logits, &pairs)?;
        for (&(l, r), &(_, prompt)) in at.iter().zip(&pairs) {
            let (token, logprob) = picked[l];
            let done = record(
                &mut self.out[prompt],
                token,
                logprob,
                self.stop_ids,
                self.max_new_tokens,
            );
            if done {
                self.rows[r] = None;
                self.next[r] = self.pad_id;
            } else {
                self.next[r] = token;
            }
        }
        Ok(())
    }
}

/// Draws a token from one row of logits: the token and its log-probability
/// under `softmax(logits / temperature)` over the whole row (the raw logits
/// at temperature 0), before any truncation.
pub(crate) fn draw(logits: &[f32], s: &Sampling, rng: &mut Rng) -> (u32, f32) {
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
    use crate::arch::{load, tiny};

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

/// The CUDA sampler against the distributions it must draw from; run on a
/// machine with a GPU (`cargo test --features cuda`), skipped elsewhere.
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::arch::{load, tiny};
    use crate::decode::prefill::right_padded;

    fn gpu() -> Option<Device> {
        match Device::new_cuda(0) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("SKIPPED: no CUDA device ({e})");
                None
            }
        }
    }

    /// The kernel with one setting for every row.
    fn sample_all(
        logits: &Tensor,
        seeds: &[u64],
        inv_temp: f32,
        top_k: usize,
        top_p: f32,
    ) -> Result<Vec<(u32, f32)>> {
        let d = crate::decode::draw::Draw {
            inv_temp,
            top_k: top_k as i32,
            top_p,
        };
        crate::decode::draw::sample_rows(logits, seeds, &vec![d; seeds.len()])
    }

    fn share(picks: &[(u32, f32)], t: u32) -> f64 {
        picks.iter().filter(|p| p.0 == t).count() as f64 / picks.len() as f64
    }

    #[test]
    fn kernel_draws_follow_the_truncated_distribution() {
        let Some(dev) = gpu() else { return };
        let rows = 4000;
        let row = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln(), -100.0];
        let logits = Tensor::from_vec(row.repeat(rows), (rows, 4), &dev).unwrap();
        let seeds: Vec<u64> = (0..rows as u64).map(|i| i * 7919 + 1).collect();
        let all = sample_all(&logits, &seeds, 1.0, 0, 1.0).unwrap();
        for (t, p) in [(0, 0.5), (1, 0.3), (2, 0.2)] {
            assert!(
                (share(&all, t) - p).abs() < 0.03,
                "token {t}: {}",
                share(&all, t)
            );
        }
        for &(t, lp) in &all {
            assert!((lp - row[t as usize]).abs() < 1e-5, "{t}: {lp}");
        }
        let again = sample_all(&logits, &seeds, 1.0, 0, 1.0).unwrap();
        assert_eq!(all, again, "a seed repeats its draws");
        for (k, p) in [(2, 1.0), (0, 0.75), (3, 0.75)] {
            let cut = sample_all(&logits, &seeds, 1.0, k, p).unwrap();
            assert!(cut.iter().all(|x| x.0 < 2), "top_k {k} top_p {p}");
            assert!((share(&cut, 0) - 0.625).abs() < 0.03, "top_k {k} top_p {p}");
            // The log-prob stays the untruncated one.
            assert!(
                cut.iter()
                    .all(|&(t, lp)| (lp - row[t as usize]).abs() < 1e-5)
            );
        }
        let hot = sample_all(&logits, &seeds, 0.5, 0, 1.0).unwrap();
        let z: f64 = row.iter().map(|&x| (f64::from(x) / 2.0).exp()).sum();
        for &(t, lp) in &hot {
            let want = f64::from(row[t as usize]) / 2.0 - z.ln();
            assert!(
                (f64::from(lp) - want).abs() < 1e-5,
                "temperature 2: {lp} vs {want}"
            );
        }
        let greedy = sample_all(&logits, &seeds, 0.0, 0, 1.0).unwrap();
        assert!(greedy.iter().all(|x| x.0 == 0));
        // A Qwen3-sized row in bf16: log-probs as the host computes them.
        let v = 151_936;
        let big = Tensor::arange(0f32, v as f32, &dev)
            .unwrap()
            .affine(1e-3, 0.0)
            .unwrap()
            .sin()
            .unwrap()
            .affine(4.0, 0.0)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap()
            .unsqueeze(0)
            .unwrap()
            .repeat((8, 1))
            .unwrap();
        let host = big.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        let picks = sample_all(&big, &seeds[..8], 1.0, 50, 0.9).unwrap();
        for (r, &(t, lp)) in picks.iter().enumerate() {
            let max = host[r].iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max
                + host[r]
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            let exact = host[r][t as usize] as f64 - lse;
            assert!(
                (f64::from(lp) - exact).abs() < 1e-3,
                "row {r}: {lp} vs {exact}"
            );
            // Among the 50 most likely (ties included).
            let above = host[r].iter().filter(|&&x| x > host[r][t as usize]).count();
            assert!(above < 50, "row {r}: token {t} has {above} above it");
        }
    }

    /// The trainer's forward over `prompt` then `tokens`: its f32 logits
    /// divided by `temperature`, and each next token's log-prob under them.
    fn trainer_view(
        model: &Model,
        prompt: &[u32],
        tokens: &[u32],
        temperature: f64,
        dev: &Device,
    ) -> (Tensor, Vec<f32>) {
        let seq: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
        let ids = Tensor::new(seq.as_slice(), dev)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = (model
            .forward(&ids, None, false)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            / temperature)
            .unwrap();
        let lp = crate::layers::ops::next_token_logprobs(&logits, &ids)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        (logits, lp)
    }

    /// Five prompts of 1 to 40 tokens (a row far longer than the others)
    /// and the truncated sampling the fused-step tests decode them with.
    fn five_prompts() -> (Vec<Vec<u32>>, Sampling) {
        let prompts = vec![
            (1..10).collect(),
            (20..24).collect(),
            vec![7],
            (100..130).collect(),
            (300..340).collect(),
        ];
        let s = Sampling {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            seed: 5,
            first_stream: 0,
        };
        (prompts, s)
    }

    /// The fused decode step: a replayed graph gives the eager step's
    /// tokens and log-probs exactly, in f32 and bf16, all rows at once and
    /// two at a time; greedy decoding agrees with the op-by-op path; the
    /// log-probs are the trainer's; NF4 weights decode as their
    /// dequantised bf16 copy does.
    #[test]
    fn fused_step_replays_match_eager_and_the_trainer() {
        let Some(dev) = gpu() else { return };
        let dir = tempfile::tempdir().unwrap();
        tiny::write_tiny_qwen3(dir.path(), 42).unwrap();
        let (prompts, s) = five_prompts();
        for dtype in [DType::F32, DType::BF16] {
            let m = load(dir.path(), None, dtype, &dev).unwrap();
            let run = |path, rows, stop: &[u32]| {
                let out = with_decode_path(path, || {
                    sample(&m.model, &prompts, 12, stop, 0, rows, &s, &dev)
                })
                .unwrap();
                assert_eq!(last_path(), Some(path), "{dtype:?}: the path asked for ran");
                out
            };
            let graph = run(DecodePath::Graph, 0, &[]);
            let eager = run(DecodePath::Eager, 0, &[]);
            for (a, b) in graph.iter().zip(&eager) {
                assert_eq!(
                    (&a.tokens, a.stopped),
                    (&b.tokens, b.stopped),
                    "{dtype:?}: graph replay against eager"
                );
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() < 1e-5, "{dtype:?}: {x} vs {y}");
                }
            }
            let two = run(DecodePath::Graph, 2, &[]);
            for (a, b) in graph.iter().zip(&two) {
                assert_eq!(a.tokens, b.tokens, "{dtype:?}: two rows at a time");
            }
            // A stop id ends rows early and frees their slots for others.
            let t = &graph[0].tokens;
            let k = (1..t.len()).find(|&i| !t[..i].contains(&t[i])).unwrap();
            let stopped = run(DecodePath::Graph, 2, &[t[k]]);
            assert!(
                stopped[0].stopped && stopped[0].tokens == t[..k],
                "{dtype:?}"
            );
            // The sampler's log-probs are the trainer's forward's.
            let tol = if dtype == DType::F32 { 1e-4 } else { 0.1 };
            for (p, out) in prompts.iter().zip(&graph) {
                let (_, lp) = trainer_view(&m.model, p, &out.tokens, 0.8, &dev);
                for (x, y) in out.logprobs.iter().zip(&lp[p.len() - 1..]) {
                    assert!((x - y).abs() < tol, "{dtype:?}: {x} vs {y}");
                }
            }
            let greedy_on = |path| {
                with_decode_path(path, || greedy(&m.model, &prompts, 12, &[], 0, 0, &dev)).unwrap()
            };
            let (fused, ops) = (greedy_on(DecodePath::Graph), greedy_on(DecodePath::Ops));
            for (a, b) in fused.iter().zip(&ops) {
                if dtype == DType::F32 {
                    assert_eq!(a.tokens, b.tokens, "greedy, fused against op by op");
                }
                // The first token comes from the same prefill.
                assert_eq!(a.tokens[0], b.tokens[0], "{dtype:?}");
            }
        }
        // NF4: the fused step decodes the dequantised weights; the op-by-op
        // path dequantises at every step: the same logits up to rounding.
        let mut q = load(dir.path(), None, DType::BF16, &dev).unwrap();
        q.model
            .hold_base(crate::layers::lora::BasePrecision::Nf4)
            .unwrap();
        let on = |path| {
            with_decode_path(path, || greedy(&q.model, &prompts, 8, &[], 0, 0, &dev)).unwrap()
        };
        let (fused, ops) = (on(DecodePath::Graph), on(DecodePath::Ops));
        for (a, b) in fused.iter().zip(&ops) {
            assert_eq!(a.tokens[0], b.tokens[0]);
            assert!(
                (a.logprobs[0] - b.logprobs[0]).abs() < 0.05,
                "{} vs {}",
                a.logprobs[0],
                b.logprobs[0]
            );
        }
        // The decode kernel on the bases in place (bf16 rows, NF4 codes,
        // FP8 codes; LoRA beside them): graph replays give the eager step's
        // tokens, and the tokens' log-probs agree with the folded copy's
        // (the same values dequantised, LoRA folded in).
        let lora = crate::layers::lora::LoraConfig {
            r: 8,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: crate::layers::lora::TargetModule::ALL.to_vec(),
            seed: 3,
        };
        for base in crate::layers::lora::BasePrecision::ALL {
            let mut m = load(dir.path(), Some(&lora), DType::BF16, &dev).unwrap();
            m.model.hold_base(base).unwrap();
            let base = base.as_str();
            for p in m.model.decoder().projections() {
                let b = &p.adapter().unwrap().b;
                let noise = Tensor::randn(0f32, 0.05, b.shape(), &dev).unwrap();
                b.set(&noise).unwrap();
            }
            let run = |in_place, path| {
                with_weights_in_place(in_place, || {
                    with_decode_path(path, || {
                        sample(&m.model, &prompts, 10, &[], 0, 0, &s, &dev).unwrap()
                    })
                })
            };
            let (graph, eager) = (run(true, DecodePath::Graph), run(true, DecodePath::Eager));
            let copy = run(false, DecodePath::Graph);
            for ((a, b), c) in graph.iter().zip(&eager).zip(&copy) {
                assert_eq!(a.tokens, b.tokens, "{base}: in place, graph against eager");
                assert_eq!(a.tokens[0], c.tokens[0], "{base}: the same prefill");
                assert!(
                    (a.logprobs[0] - c.logprobs[0]).abs() < 0.05,
                    "{base}: {} vs {}",
                    a.logprobs[0],
                    c.logprobs[0]
                );
            }
        }
    }

    /// Greedy decoding of a bf16 model with each attention kernel, asked
    /// for by name (the tensor-core one is the default there): the kernel
    /// asked for runs, graph replays give the eager step's tokens, the first
    /// token is the op-by-op path's (the same prefill), every token is the
    /// trainer's forward's best up to bf16 rounding (within 0.2 of its
    /// largest logit) and its log-prob the trainer's within 0.1, as the
    /// other bf16 checks; rows of 1 to 200 tokens, past one split of keys.
    #[test]
    fn greedy_decoding_with_either_attention_kernel_matches_the_trainer() {
        use crate::decode::fast_decode::{
            AttentionKernel, last_attention_kernel, with_attention_kernel,
        };
        let Some(dev) = gpu() else { return };
        let dir = tempfile::tempdir().unwrap();
        tiny::write_tiny_qwen3(dir.path(), 42).unwrap();
        let m = load(dir.path(), None, DType::BF16, &dev).unwrap();
        let prompts: Vec<Vec<u32>> = vec![
            (0..200).map(|i| 1 + (i * 37 % 500) as u32).collect(),
            vec![7],
            (100..230).collect(),
            (1..10).collect(),
        ];
        let mut firsts = Vec::new();
        for kernel in [AttentionKernel::Mma, AttentionKernel::Warp] {
            let on = |path| {
                let out = with_attention_kernel(kernel, || {
                    with_decode_path(path, || greedy(&m.model, &prompts, 12, &[], 0, 0, &dev))
                })
                .unwrap();
                if path != DecodePath::Ops {
                    assert_eq!(last_path(), Some(path), "{kernel:?}");
                    assert_eq!(
                        last_attention_kernel(),
                        Some(kernel),
                        "the kernel asked for"
                    );
                }
                out
            };
            let (graph, eager, ops) = (
                on(DecodePath::Graph),
                on(DecodePath::Eager),
                on(DecodePath::Ops),
            );
            for ((a, b), c) in graph.iter().zip(&eager).zip(&ops) {
                assert_eq!(a.tokens, b.tokens, "{kernel:?}: graph replay against eager");
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() < 1e-5, "{kernel:?}: {x} vs {y}");
                }
                assert_eq!(a.tokens[0], c.tokens[0], "{kernel:?}: the same prefill");
            }
            for (p, out) in prompts.iter().zip(&graph) {
                let (logits, lp) = trainer_view(&m.model, p, &out.tokens, 1.0, &dev);
                let rows = logits.squeeze(0).unwrap().to_vec2::<f32>().unwrap();
                for (i, (&t, &x)) in out.tokens.iter().zip(&out.logprobs).enumerate() {
                    let at = p.len() - 1 + i;
                    let best = rows[at].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    assert!(
                        rows[at][t as usize] >= best - 0.2,
                        "{kernel:?}: token {i} ({t}) at {} against the best {best}",
                        rows[at][t as usize]
                    );
                    assert!((x - lp[at]).abs() < 0.1, "{kernel:?}: {x} vs {}", lp[at]);
                }
            }
            firsts.push(graph.iter().map(|g| g.tokens[0]).collect::<Vec<_>>());
        }
        assert_eq!(firsts[0], firsts[1], "the same prefill under both kernels");
    }

    #[test]
    fn gpu_decoding_matches_the_trainer_and_repeats() {
        let Some(dev) = gpu() else { return };
        let dir = tempfile::tempdir().unwrap();
        tiny::write_tiny_qwen3(dir.path(), 42).unwrap();
        let m = load(dir.path(), None, DType::F32, &dev).unwrap();
        let prompts: Vec<Vec<u32>> = vec![
            (1..10).collect(),
            (20..24).collect(),
            vec![7],
            (100..130).collect(),
        ];
        let g = greedy(&m.model, &prompts, 8, &[], 0, 0, &dev).unwrap();
        let s = Sampling {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            seed: 5,
            first_stream: 0,
        };
        let a = sample(&m.model, &prompts, 8, &[], 0, 0, &s, &dev).unwrap();
        let b = sample(&m.model, &prompts, 8, &[], 0, 2, &s, &dev).unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.tokens, y.tokens, "continuous batching on the GPU");
        }
        // The batch split in two (as over two ranks) draws the same.
        let tail = Sampling {
            first_stream: 1,
            ..s
        };
        let c = sample(&m.model, &prompts[1..], 8, &[], 0, 0, &tail, &dev).unwrap();
        for (x, y) in a[1..].iter().zip(&c) {
            assert_eq!(
                x.tokens, y.tokens,
                "a share of the batch from its first stream"
            );
        }
        for (gens, t) in [(&g, 1.0), (&a, 0.8)] {
            for (p, out) in prompts.iter().zip(gens) {
                let seq: Vec<u32> = p.iter().chain(&out.tokens).copied().collect();
                let ids = Tensor::new(seq.as_slice(), &dev)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let logits = (m.model.forward(&ids, None, false).unwrap() / t).unwrap();
                let lp: Vec<f32> = crate::layers::ops::next_token_logprobs(&logits, &ids)
                    .unwrap()
                    .squeeze(0)
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                for (x, y) in out.logprobs.iter().zip(&lp[p.len() - 1..]) {
                    assert!((x - y).abs() < 1e-3, "T {t}: {x} vs {y}");
                }
            }
        }
        let top1 = Sampling {
            top_k: 1,
            ..Sampling::default()
        };
        let t1 = sample(&m.model, &prompts, 8, &[], 0, 0, &top1, &dev).unwrap();
        for (x, y) in t1.iter().zip(&g) {
            assert_eq!(x.tokens, y.tokens, "top_k 1 is greedy");
        }
    }

    /// The fused prefill (right-padded, one pass, cuDNN's causal attention,
    /// no mask) against the masked one (left-padded, 32 columns a pass):
    /// each row's last logits and its cached keys and values, within bf16
    /// rounding, for rows of 39, 5 and 93 tokens.
    #[cfg(feature = "cudnn")]
    #[test]
    fn fused_prefill_matches_the_masked_prefill() {
        let Some(dev) = gpu() else { return };
        let dir = tempfile::tempdir().unwrap();
        tiny::write_tiny_qwen3(dir.path(), 42).unwrap();
        let m = load(dir.path(), None, DType::BF16, &dev).unwrap();
        let dec = m.model.decoder();
        assert!(
            dec.fused_prefill_usable().unwrap(),
            "the cudnn build on a GPU"
        );
        let prompts: Vec<Vec<u32>> =
            vec![(1..40).collect(), (50..55).collect(), (7..100).collect()];
        let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        let width = 93;
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let pads: Vec<usize> = lens.iter().map(|n| width - n).collect();
        let ids = left_padded(&refs, width, 0, &dev).unwrap();
        let mut masked = m
            .model
            .new_cache()
            .with_capacity(width)
            .with_left_padding(pads.clone());
        let want = prefill(&m.model, &ids, 0, &mut masked, 32).unwrap();
        let ids = right_padded(&refs, width, 0, &dev).unwrap();
        let mut fused = m.model.new_cache().with_capacity(width);
        let got = dec.prefill_right_padded(&ids, &lens, &mut fused).unwrap();
        assert_eq!(fused.len(), width);
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            let a = a.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
            let b = b.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
            let scale = a.abs().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            let diff = (a - b).unwrap().abs().unwrap().max(0).unwrap();
            let diff = diff.to_scalar::<f32>().unwrap();
            assert!(diff <= 3e-2 * scale, "{what}: off by {diff} of {scale}");
        };
        close(&want, &got, "last logits");
        for layer in 0..dec.projections().len() / 7 {
            let (mk, mv) = masked.layer(layer).unwrap();
            let (fk, fv) = fused.layer(layer).unwrap();
            for r in 0..3 {
                let cols =
                    |t: &Tensor, from: usize| t.get(r).unwrap().narrow(1, from, lens[r]).unwrap();
                close(
                    &cols(mk, pads[r]),
                    &cols(fk, 0),
                    &format!("layer {layer} row {r} keys"),
                );
                close(
                    &cols(mv, pads[r]),
                    &cols(fv, 0),
                    &format!("layer {layer} row {r} values"),
                );
            }
        }
        // The same rows alone, unpadded: the padding changes nothing.
        for r in [1, 2] {
            let ids = Tensor::new(prompts[r].as_slice(), &dev)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let mut alone = m.model.new_cache().with_capacity(lens[r]);
            let one = dec
                .prefill_right_padded(&ids, &lens[r..=r], &mut alone)
                .unwrap();
            close(
                &got.get(r).unwrap(),
                &one.get(0).unwrap(),
                &format!("row {r} alone"),
            );
        }
    }
}
