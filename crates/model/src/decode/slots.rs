//! A fixed number of decoding rows that prompts join and leave between
//! steps, each row with its own sampling: the scheduler's view of a
//! decoder. `serve` admits a request into a free row as soon as one is
//! free and frees a row the moment its answer ends or its client leaves;
//! the batched sampler ([`crate::decode::generate`]) runs its prompts through the
//! same rows.
//!
//! Two kinds of rows:
//! - [`FusedSlots`] (CUDA): the fused decode step (`fast_decode::Engine`),
//!   every row a slot of the KV cache of `capacity` columns, one CUDA graph
//!   a step for all rows, newcomers prefilled together by the model's
//!   forward and copied into their slots. Draws on the device.
//! - [`HostSlots`] (any device, the CPU's path): the model's own forward,
//!   every row its own KV cache, one forward a row a step. Draws by
//!   [`crate::decode::draw::device_rule`], the kernel's rule on the host, so a seed
//!   means the same token on the CPU and the GPU.
//!
//! A row holds `capacity` tokens: its prompt and every drawn token but the
//! last (which is never fed back).

use candle_core::{Device, Result, Tensor, bail};

use crate::arch::Model;
use crate::decode::draw::{Draw, pick_rows};

/// Prompt tokens (padding included) the fused rows prefill together when
/// prompts join (a longer prompt alone): 16,384 tokens of Qwen3-4B's keys
/// and values take 2.3 GB.
pub const PREFILL_TOKENS: usize = 16_384;

/// A prompt joining free row `row`.
#[derive(Debug, Clone, Copy)]
pub struct Join<'a> {
    pub row: usize,
    pub prompt: &'a [u32],
    /// The most tokens it may draw (its row holds `prompt + budget - 1`).
    pub budget: usize,
    pub draw: Draw,
    /// The seed of its first draw.
    pub seed: u64,
    /// Its adapter among several served side by side (0: the base alone;
    /// see [`crate::layers::lora::with_row_adapters`]); 0 for a model
    /// without them.
    pub adapter: usize,
}

/// A live row fed its last drawn token.
#[derive(Debug, Clone, Copy)]
pub struct Feed {
    pub row: usize,
    pub token: u32,
    pub draw: Draw,
    pub seed: u64,
}

/// Decoding rows; see the module header.
pub trait Slots {
    /// Rows decoding at once.
    fn rows(&self) -> usize;
    /// Tokens a row holds: its prompt and its drawn tokens but the last.
    fn capacity(&self) -> usize;
    /// Prefills each joining prompt into its (free) row and draws its first
    /// token: the `(token, log-prob)` of each, in order.
    fn admit(&mut self, joins: &[Join]) -> Result<Vec<(u32, f32)>>;
    /// Feeds each live row its token at its next position and draws the
    /// next one: the `(token, log-prob)` of each feed, in order. Rows not
    /// fed stay as they are.
    fn step(&mut self, feeds: &[Feed]) -> Result<Vec<(u32, f32)>>;
    /// Row `row` is free; its next [`Slots::admit`] starts it afresh.
    fn free(&mut self, row: usize);
}

/// Checks that every join names a free row of `rows` and fits `capacity`.
fn check_joins(
    joins: &[Join],
    busy: impl Fn(usize) -> bool,
    rows: usize,
    cap: usize,
) -> Result<()> {
    for (i, j) in joins.iter().enumerate() {
        if j.row >= rows || busy(j.row) {
            bail!("admit: row {} is not a free row of {rows}", j.row);
        }
        if joins[..i].iter().any(|o| o.row == j.row) {
            bail!("admit: row {} joined twice", j.row);
        }
        if j.prompt.is_empty() || j.budget == 0 {
            bail!("admit: an empty prompt or a budget of 0 tokens");
        }
        if j.prompt.len() + j.budget - 1 > cap {
            bail!(
                "admit: a prompt of {} tokens and {} more do not fit rows of {cap}",
                j.prompt.len(),
                j.budget
            );
        }
    }
    Ok(())
}

/// Rows on the model's own forward, the live ones in one left-padded KV
/// cache: a step is one forward of the cache's rows. Prompts join as the
/// batched sampler's continuous batching admits them (`generate.rs`:
/// prefilled in a cache of their own that starts where their tokens do,
/// their last token on the batch's last column), into cache rows that
/// finished rows left or appended to the cache; leading columns no live
/// row uses are dropped when they are a quarter of the cache, and finished
/// rows leave the cache once they are half of it (so a lone request does
/// not pay for `rows` rows). When every row is free the next prompts start
/// a fresh cache. Each row's keys are its own and its padding is hidden, so
/// a prompt decodes as it would alone.
pub struct HostSlots<'m> {
    model: &'m Model,
    device: Device,
    cap: usize,
    pad_id: u32,
    /// The live rows' keys and values (and finished rows' until they leave).
    cache: Option<crate::layers::attention::Cache>,
    /// Tokens in each live row (prompt and fed tokens); `None` while free.
    len: Vec<Option<usize>>,
    /// Each live row's row of the cache.
    at: Vec<Option<usize>>,
    /// Each cache row's row, `None` once it finished.
    of: Vec<Option<usize>>,
    /// Each row's adapter ([`Join::adapter`]).
    adapter: Vec<usize>,
}

impl<'m> HostSlots<'m> {
    pub fn new(
        model: &'m Model,
        device: &Device,
        rows: usize,
        capacity: usize,
        pad_id: u32,
    ) -> Self {
        Self {
            model,
            device: device.clone(),
            cap: capacity,
            pad_id,
            cache: None,
            len: vec![None; rows],
            at: vec![None; rows],
            of: Vec::new(),
            adapter: vec![0; rows],
        }
    }

    /// `(k, width)` ids: each prompt left-padded to `width`.
    fn padded(&self, prompts: &[&[u32]], width: usize) -> Result<Tensor> {
        crate::decode::prefill::left_padded(prompts, width, self.pad_id, &self.device)
    }

    /// Prefills `joins` into a fresh cache of their rows; their last logits.
    fn start_fresh(&mut self, joins: &[Join]) -> Result<Tensor> {
        let width = joins.iter().map(|j| j.prompt.len()).max().unwrap_or(1);
        let budget = joins.iter().map(|j| j.budget).max().unwrap_or(1);
        let prompts: Vec<&[u32]> = joins.iter().map(|j| j.prompt).collect();
        let pads: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
        let ids = self.padded(&prompts, width)?;
        let mut cache = self
            .model
            .new_cache()
            .with_capacity(width + budget)
            .with_left_padding(pads);
        let adapters: Vec<usize> = joins.iter().map(|j| j.adapter).collect();
        let logits = crate::layers::lora::with_row_adapters(&adapters, || {
            crate::decode::prefill::prefill(
                self.model,
                &ids,
                0,
                &mut cache,
                crate::decode::prefill::PREFILL_CHUNK,
            )
        })?;
        self.cache = Some(cache);
        self.of = joins.iter().map(|j| Some(j.row)).collect();
        for (i, j) in joins.iter().enumerate() {
            self.at[j.row] = Some(i);
        }
        Ok(logits)
    }

    /// Prefills `joins` into the running cache: into the rows finished rows
    /// left, then after the others; their last logits.
    fn join_running(&mut self, joins: &[Join]) -> Result<Tensor> {
        let live: Vec<usize> = (0..self.of.len())
            .filter(|&c| self.of[c].is_some())
            .collect();
        let longest = joins.iter().map(|j| j.prompt.len()).max().unwrap_or(1);
        let budget = joins.iter().map(|j| j.budget).max().unwrap_or(1);
        let cache = self.cache.as_mut().expect("a running cache");
        let len = cache.len();
        let pad = |c: usize| cache.pads().get(c).copied().unwrap_or(0);
        let unused = live.iter().map(|&c| pad(c)).min().unwrap_or(len);
        let drop = unused.min(len.saturating_sub(longest));
        if drop > 0 && 4 * drop >= len {
            cache.trim_front(drop, &live)?;
        }
        let len = cache.len();
        if longest > len {
            cache.grow_front(longest - len)?;
        }
        let len = cache.len();
        cache.reserve(len + budget)?;
        let capacity = cache.capacity();
        let pads: Vec<usize> = joins.iter().map(|j| len - j.prompt.len()).collect();
        let start = len - longest;
        let mut fresh = self
            .model
            .new_cache()
            .with_capacity(capacity)
            .with_left_padding(pads)
            .starting_at(start);
        let prompts: Vec<&[u32]> = joins.iter().map(|j| j.prompt).collect();
        let ids = self.padded(&prompts, longest)?;
        let adapters: Vec<usize> = joins.iter().map(|j| j.adapter).collect();
        let logits = crate::layers::lora::with_row_adapters(&adapters, || {
            crate::decode::prefill::prefill(
                self.model,
                &ids,
                start,
                &mut fresh,
                crate::decode::prefill::PREFILL_CHUNK,
            )
        })?;
        let free: Vec<usize> = (0..self.of.len())
            .filter(|&c| self.of[c].is_none())
            .collect();
        let reuse = free.len().min(joins.len());
        let cache = self.cache.as_mut().expect("a running cache");
        if reuse == joins.len() {
            cache.set_rows(&free[..reuse], &fresh)?;
        } else {
            if reuse > 0 {
                let mut first = fresh.clone();
                first.retain_rows(&(0..reuse).collect::<Vec<_>>())?;
                cache.set_rows(&free[..reuse], &first)?;
            }
            fresh.retain_rows(&(reuse..joins.len()).collect::<Vec<_>>())?;
            cache.append_rows(&fresh)?;
        }
        for (i, j) in joins.iter().enumerate() {
            let c = if i < reuse {
                free[i]
            } else {
                self.of.push(None);
                self.of.len() - 1
            };
            self.of[c] = Some(j.row);
            self.at[j.row] = Some(c);
        }
        Ok(logits)
    }
}

impl Slots for HostSlots<'_> {
    fn rows(&self) -> usize {
        self.len.len()
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    fn admit(&mut self, joins: &[Join]) -> Result<Vec<(u32, f32)>> {
        check_joins(joins, |r| self.len[r].is_some(), self.len.len(), self.cap)?;
        if joins.is_empty() {
            return Ok(Vec::new());
        }
        let logits = if self.cache.is_none() {
            self.start_fresh(joins)?
        } else {
            self.join_running(joins)?
        };
        let seeds: Vec<u64> = joins.iter().map(|j| j.seed).collect();
        let draws: Vec<Draw> = joins.iter().map(|j| j.draw).collect();
        let picks = pick_rows(&logits, &seeds, &draws)?;
        for j in joins {
            self.len[j.row] = Some(j.prompt.len());
            self.adapter[j.row] = j.adapter;
        }
        Ok(picks)
    }

    fn step(&mut self, feeds: &[Feed]) -> Result<Vec<(u32, f32)>> {
        let mut ids = vec![self.pad_id; self.of.len()];
        let mut fed = vec![false; self.of.len()];
        for f in feeds {
            match (
                self.len.get(f.row).copied().flatten(),
                self.at.get(f.row).copied().flatten(),
            ) {
                (Some(n), _) if n >= self.cap => {
                    bail!("step: row {} is full ({} tokens)", f.row, self.cap)
                }
                (Some(_), Some(c)) => {
                    ids[c] = f.token;
                    fed[c] = true;
                }
                _ => bail!("step: row {} is not live", f.row),
            }
        }
        if let Some(c) = (0..self.of.len()).find(|&c| self.of[c].is_some() && !fed[c]) {
            // The shared cache takes a column for every row a step.
            bail!(
                "step: live row {} was not fed (rows on one cache step together)",
                self.of[c].unwrap_or(0)
            );
        }
        if feeds.is_empty() {
            return Ok(Vec::new());
        }
        let cache = self.cache.as_mut().expect("live rows have a cache");
        let len = cache.len();
        if cache.capacity() < len + 1 {
            // Room for many steps at once: growing copies the cache.
            cache.reserve(len + 64.max(len / 2))?;
        }
        let rows = ids.len();
        let ids = Tensor::from_vec(ids, (rows, 1), &self.device)?;
        let adapters: Vec<usize> = self
            .of
            .iter()
            .map(|r| r.map_or(0, |r| self.adapter[r]))
            .collect();
        let logits = crate::layers::lora::with_row_adapters(&adapters, || {
            self.model.forward_with_cache(&ids, len, cache)
        })?;
        let at = Tensor::from_vec(
            feeds
                .iter()
                .map(|f| self.at[f.row].expect("checked above") as u32)
                .collect::<Vec<_>>(),
            feeds.len(),
            &self.device,
        )?;
        let seeds: Vec<u64> = feeds.iter().map(|f| f.seed).collect();
        let draws: Vec<Draw> = feeds.iter().map(|f| f.draw).collect();
        let picks = pick_rows(&logits.index_select(&at, 0)?, &seeds, &draws)?;
        for f in feeds {
            if let Some(n) = &mut self.len[f.row] {
                *n += 1;
            }
        }
        Ok(picks)
    }

    fn free(&mut self, row: usize) {
        let Some(c) = self.at.get_mut(row).and_then(Option::take) else {
            return;
        };
        self.len[row] = None;
        self.of[c] = None;
        let live: Vec<usize> = (0..self.of.len())
            .filter(|&c| self.of[c].is_some())
            .collect();
        if live.is_empty() {
            self.cache = None;
            self.of.clear();
        } else if 2 * live.len() <= self.of.len()
            && let Some(cache) = self.cache.as_mut()
        {
            // Finished rows leave the cache (one copy, at most log2(rows)
            // times as a batch drains).
            match cache.retain_rows(&live) {
                Ok(()) => {
                    self.of = live.iter().map(|&c| self.of[c]).collect();
                    for (c, r) in self.of.iter().enumerate() {
                        if let Some(r) = r {
                            self.at[*r] = Some(c);
                        }
                    }
                }
                // The finished rows stay (still correct, only slower).
                Err(e) => tracing::warn!("cannot drop finished rows from the cache: {e}"),
            }
        }
    }
}

#[cfg(feature = "cuda")]
pub use fused::{FusedSlots, Plan, plan, read_in_place};

#[cfg(feature = "cuda")]
mod fused {
    use candle_core::cuda_backend::{WrapErr, cudarc};
    use candle_core::{Device, Result, Tensor, bail};

    use super::{Feed, Join, Slots, check_joins};
    use crate::arch::Model;
    use crate::decode::draw::{Draw, sample_rows};
    use crate::decode::fast_decode::{self, Engine, Mode};
    use crate::layers::attention::Cache;
    use crate::layers::decoder::DecodeWeights;

    /// Memory kept free beside the decode weights and the cache slots:
    /// prefill's activations and scores, cuBLAS's workspace, the logits.
    pub const HEADROOM: usize = 2 << 30;

    /// How the fused step fits on the card.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Plan {
        /// Read the bases in place (the decode kernel) instead of a folded
        /// dense copy (cuBLAS).
        pub in_place: bool,
        /// Rows that fit, at most the rows wanted.
        pub rows: usize,
    }

    /// How many of `want` rows of `cap` columns the fused step can hold
    /// beside its weights and a prefill cache of `prefill` tokens (the
    /// most that join at once: [`FusedSlots::new`]'s budget); `in_place` as
    /// the caller decides from the memory ([`read_in_place`]); `Err(why)`
    /// where it cannot run.
    pub fn plan(
        model: &Model,
        device: &Device,
        want: usize,
        cap: usize,
        prefill: usize,
        in_place: &dyn Fn(usize, usize) -> Result<bool>,
    ) -> Result<std::result::Result<Plan, String>> {
        if !device.is_cuda() {
            return Ok(Err("the device is not a CUDA device".into()));
        }
        let banked = model.projections().iter().any(|p| p.bank().is_some());
        if banked && !model.decoder().decode_can_read_bases() {
            return Ok(Err(
                "several adapters need the bases read in place (a bf16 model, inner sizes in 64s)"
                    .into(),
            ));
        }
        let dec = model.decoder();
        let Some(free) = fast_decode::free_memory(device)? else {
            return Ok(Err("the free memory is not known".into()));
        };
        let per_token = dec.kv_bytes_per_token();
        let (per_row, joining) = (per_token * cap, per_token * prefill);
        let in_place = in_place(free, want * per_row + joining)?;
        let weights = dec.decode_weights_bytes(in_place)?;
        let Some(spare) = free.checked_sub(weights + HEADROOM + joining) else {
            return Ok(Err(format!(
                "the fused step's weights take {:.1} GiB and {:.1} GiB are free",
                weights as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64
            )));
        };
        let rows = want.min(spare / per_row.max(1));
        if rows == 0 {
            return Ok(Err("too little free memory for one cache slot".into()));
        }
        Ok(Ok(Plan { in_place, rows }))
    }

    /// Whether the step reads the bases in place or one folded copy, by
    /// `TRACE_TRAIN_DECODE_WEIGHTS` (`copy`, `base`, or `auto`: the copy
    /// when it fits in `free` beside `rows_bytes` and the headroom), or
    /// `forced` when given.
    pub fn read_in_place(
        model: &Model,
        forced: Option<bool>,
        free: usize,
        rows_bytes: usize,
    ) -> Result<bool> {
        let dec = model.decoder();
        if !dec.decode_can_read_bases() {
            return Ok(false);
        }
        if model.projections().iter().any(|p| p.bank().is_some()) {
            // Several adapters side by side are never folded.
            return Ok(true);
        }
        if let Some(forced) = forced {
            return Ok(forced);
        }
        Ok(
            match std::env::var("TRACE_TRAIN_DECODE_WEIGHTS").as_deref() {
                Ok("copy") => false,
                Ok("base") => true,
                Ok("auto") | Err(_) => {
                    dec.decode_weights_bytes(false)? + rows_bytes + HEADROOM > free
                }
                Ok(other) => candle_core::bail!(
                    "TRACE_TRAIN_DECODE_WEIGHTS={other}\nhint: copy, base or auto"
                ),
            },
        )
    }

    /// Rows on the fused decode step.
    pub struct FusedSlots<'w> {
        model: &'w Model,
        device: Device,
        pad_id: u32,
        prefill_chunk: usize,
        /// Most prompt tokens (padding included) prefilled together.
        prefill_tokens: usize,
        eng: Engine<'w>,
        /// Tokens in each live row's slot; `None` while free.
        len: Vec<Option<u32>>,
        /// Each row's adapter ([`Join::adapter`]), and what the engine's
        /// row mask holds now.
        adapter: Vec<usize>,
        masked: Option<Vec<usize>>,
    }

    impl<'w> FusedSlots<'w> {
        /// `rows` slots of `cap` columns over `w` (the model's decode
        /// weights); joining prompts are prefilled in groups of at most
        /// `prefill_tokens` tokens (each left-padded to its group's longest;
        /// a longer prompt alone), `prefill_chunk` columns a pass.
        #[allow(clippy::too_many_arguments)] // each is its own knob
        pub fn new(
            model: &'w Model,
            w: &'w DecodeWeights,
            device: &Device,
            rows: usize,
            cap: usize,
            pad_id: u32,
            prefill_tokens: usize,
            prefill_chunk: usize,
            mode: Mode,
        ) -> Result<Self> {
            Ok(Self {
                model,
                device: device.clone(),
                pad_id,
                prefill_chunk: prefill_chunk.max(1),
                prefill_tokens: prefill_tokens.max(1),
                eng: Engine::new(w, device, rows, cap, mode)?,
                len: vec![None; rows],
                adapter: vec![0; rows],
                masked: None,
            })
        }

        /// Whether steps replay a captured graph.
        pub fn captured(&self) -> bool {
            self.eng.captured()
        }

        /// How the step's attention runs.
        pub fn attention(&self) -> &crate::decode::fast_decode::AttentionPlan {
            self.eng.attention()
        }

        /// Prefills `prompts` together with the model's forward: their last
        /// logits `(k, vocab)`, the cache and each row's leading padding.
        /// Right-padded in one pass with fused causal attention where it
        /// serves ([`Decoder::prefill_right_padded`]: no mask and no score
        /// matrix); otherwise left-padded to the longest, a chunk of
        /// columns a pass, with a mask.
        ///
        /// [`Decoder::prefill_right_padded`]: crate::layers::decoder::Decoder::prefill_right_padded
        fn prefill(&self, prompts: &[&[u32]]) -> Result<(Tensor, Cache, Vec<usize>)> {
            let width = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
            // `TRACE_TRAIN_DECODE_NCU_PREFILL=1`: the prefills run inside
            // the profiler's range (`ncu --profile-from-start off`).
            let profiling = if std::env::var_os("TRACE_TRAIN_DECODE_NCU_PREFILL").is_some() {
                Some(cudarc::driver::Profiler::new().w()?)
            } else {
                None
            };
            let dec = self.model.decoder();
            // A prompt longer than the budget, alone, goes in chunks.
            if dec.fused_prefill_usable()? && width * prompts.len() <= self.prefill_tokens {
                // Widths in steps of 64, so that a run builds few attention
                // graphs (one a shape, about 80 ms each on an H100).
                let wide = width.next_multiple_of(64);
                let width = if wide * prompts.len() <= self.prefill_tokens {
                    wide
                } else {
                    width
                };
                let lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
                let ids = crate::decode::prefill::right_padded(
                    prompts,
                    width,
                    self.pad_id,
                    &self.device,
                )?;
                let mut cache = self.model.new_cache().with_capacity(width);
                let logits = dec.prefill_right_padded(&ids, &lens, &mut cache)?;
                if profiling.is_some() {
                    self.device.synchronize()?;
                }
                return Ok((logits, cache, vec![0; prompts.len()]));
            }
            let pads: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
            let ids =
                crate::decode::prefill::left_padded(prompts, width, self.pad_id, &self.device)?;
            let mut cache = self
                .model
                .new_cache()
                .with_capacity(width)
                .with_left_padding(pads.clone());
            let logits = crate::decode::prefill::prefill(
                self.model,
                &ids,
                0,
                &mut cache,
                self.prefill_chunk,
            )?;
            if profiling.is_some() {
                self.device.synchronize()?;
            }
            Ok((logits, cache, pads))
        }
    }

    impl Slots for FusedSlots<'_> {
        fn rows(&self) -> usize {
            self.len.len()
        }

        fn capacity(&self) -> usize {
            self.eng.cap()
        }

        fn admit(&mut self, joins: &[Join]) -> Result<Vec<(u32, f32)>> {
            check_joins(
                joins,
                |r| self.len[r].is_some(),
                self.len.len(),
                self.eng.cap(),
            )?;
            let mut picks = Vec::with_capacity(joins.len());
            let mut rest = joins;
            while !rest.is_empty() {
                // The longest run of joins whose padded prefill fits the budget.
                let mut n = 0;
                let mut width = 0;
                while n < rest.len() {
                    let w = width.max(rest[n].prompt.len());
                    if n > 0 && w * (n + 1) > self.prefill_tokens {
                        break;
                    }
                    width = w;
                    n += 1;
                }
                let (group, later) = rest.split_at(n);
                rest = later;
                let prompts: Vec<&[u32]> = group.iter().map(|j| j.prompt).collect();
                let adapters: Vec<usize> = group.iter().map(|j| j.adapter).collect();
                let (logits, cache, pads) =
                    crate::layers::lora::with_row_adapters(&adapters, || self.prefill(&prompts))?;
                let at: Vec<usize> = group.iter().map(|j| j.row).collect();
                let lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
                self.eng.load_rows(&cache, &at, &pads, &lens)?;
                drop(cache);
                let seeds: Vec<u64> = group.iter().map(|j| j.seed).collect();
                let draws: Vec<Draw> = group.iter().map(|j| j.draw).collect();
                picks.extend(sample_rows(&logits, &seeds, &draws)?);
                for j in group {
                    self.len[j.row] = Some(j.prompt.len() as u32);
                    self.adapter[j.row] = j.adapter;
                }
            }
            Ok(picks)
        }

        fn step(&mut self, feeds: &[Feed]) -> Result<Vec<(u32, f32)>> {
            let rows = self.len.len();
            let mut seeds = vec![0u64; rows];
            let mut pos = vec![0u32; rows];
            let mut ids = vec![self.pad_id; rows];
            let mut draws = vec![Draw::GREEDY; rows];
            for f in feeds {
                let Some(len) = self.len.get(f.row).copied().flatten() else {
                    bail!("step: row {} is not live", f.row);
                };
                seeds[f.row] = f.seed;
                pos[f.row] = len;
                ids[f.row] = f.token;
                draws[f.row] = f.draw;
            }
            if self.eng.row_adapters() && self.masked.as_ref() != Some(&self.adapter) {
                self.eng.set_row_adapters(&self.adapter)?;
                self.masked = Some(self.adapter.clone());
            }
            let picks = self.eng.step(&seeds, &ids, &pos, &draws)?;
            for f in feeds {
                if let Some(len) = &mut self.len[f.row] {
                    *len += 1;
                }
            }
            Ok(feeds.iter().map(|f| picks[f.row]).collect())
        }

        fn free(&mut self, row: usize) {
            if let Some(l) = self.len.get_mut(row) {
                *l = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{load, tiny};
    use candle_core::DType;

    /// Runs prompts through `slots`: they join in two waves (the second
    /// while the first decodes), each row with its own settings; returns
    /// each prompt's tokens.
    fn drive(
        slots: &mut dyn Slots,
        prompts: &[Vec<u32>],
        draws: &[Draw],
        n: usize,
    ) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); prompts.len()];
        let half = prompts.len() / 2;
        let join =
            |slots: &mut dyn Slots, which: std::ops::Range<usize>, out: &mut Vec<Vec<u32>>| {
                let joins: Vec<Join> = which
                    .clone()
                    .map(|p| Join {
                        row: p,
                        prompt: &prompts[p],
                        budget: n,
                        draw: draws[p],
                        seed: 1000 + p as u64,
                        adapter: 0,
                    })
                    .collect();
                for (p, (t, _)) in which.zip(slots.admit(&joins).unwrap()) {
                    out[p].push(t);
                }
            };
        join(slots, 0..half, &mut out);
        let mut step = 0;
        loop {
            step += 1;
            if step == 2 {
                join(slots, half..prompts.len(), &mut out);
            }
            // Every live row, fed together; a row that has its n tokens is
            // freed.
            let feeds: Vec<Feed> = (0..prompts.len())
                .filter(|&p| !out[p].is_empty() && out[p].len() < n)
                .map(|p| Feed {
                    row: p,
                    token: *out[p].last().unwrap(),
                    draw: draws[p],
                    seed: 1000 + (p as u64) * 7919 + out[p].len() as u64,
                })
                .collect();
            if feeds.is_empty() && step > 2 {
                break;
            }
            for (f, (t, _)) in feeds.iter().zip(slots.step(&feeds).unwrap()) {
                out[f.row].push(t);
                if out[f.row].len() == n {
                    slots.free(f.row);
                }
            }
        }
        out
    }

    fn setup() -> (tempfile::TempDir, Vec<Vec<u32>>, Vec<Draw>) {
        let dir = tempfile::tempdir().unwrap();
        tiny::write_tiny_qwen3(dir.path(), 42).unwrap();
        let prompts: Vec<Vec<u32>> = vec![
            (1..10).collect(),
            vec![7],
            (100..130).collect(),
            (20..24).collect(),
            (300..340).collect(),
            (50..53).collect(),
        ];
        let draws = vec![
            Draw::GREEDY,
            Draw::new(0.8, 0, 1.0),
            Draw::new(1.2, 20, 0.9),
            Draw::new(0.5, 0, 0.8),
            Draw::GREEDY,
            Draw::new(1.0, 5, 1.0),
        ];
        (dir, prompts, draws)
    }

    #[test]
    fn host_rows_decode_each_prompt_as_it_decodes_alone() {
        let (dir, prompts, draws) = setup();
        let m = load(dir.path(), None, DType::F32, &Device::Cpu).unwrap();
        let mut all = HostSlots::new(&m.model, &Device::Cpu, prompts.len(), 64, 0);
        let together = drive(&mut all, &prompts, &draws, 8);
        for p in 0..prompts.len() {
            let mut one = HostSlots::new(&m.model, &Device::Cpu, prompts.len(), 64, 0);
            // Alone: only prompt p, in its own row, with the same seeds.
            let mut alone = vec![Vec::new(); prompts.len()];
            let first = one
                .admit(&[Join {
                    row: p,
                    prompt: &prompts[p],
                    budget: 8,
                    draw: draws[p],
                    seed: 1000 + p as u64,
                    adapter: 0,
                }])
                .unwrap();
            alone[p].push(first[0].0);
            while alone[p].len() < 8 {
                let f = Feed {
                    row: p,
                    token: *alone[p].last().unwrap(),
                    draw: draws[p],
                    seed: 1000 + (p as u64) * 7919 + alone[p].len() as u64,
                };
                alone[p].push(one.step(&[f]).unwrap()[0].0);
            }
            assert_eq!(together[p], alone[p], "prompt {p}");
        }
        // Checks: a row too small, a busy row, a row fed while free.
        let mut s = HostSlots::new(&m.model, &Device::Cpu, 2, 10, 0);
        let j = |row, budget| Join {
            row,
            prompt: &prompts[0],
            budget,
            draw: Draw::GREEDY,
            seed: 0,
            adapter: 0,
        };
        assert!(
            s.admit(&[j(0, 3)])
                .unwrap_err()
                .to_string()
                .contains("do not fit")
        );
        s.admit(&[j(0, 2)]).unwrap();
        assert!(
            s.admit(&[j(0, 1)])
                .unwrap_err()
                .to_string()
                .contains("not a free row")
        );
        let f = Feed {
            row: 1,
            token: 3,
            draw: Draw::GREEDY,
            seed: 0,
        };
        assert!(s.step(&[f]).unwrap_err().to_string().contains("not live"));
    }

    /// The fused rows against the host rows on the GPU: the same tokens for
    /// the same prompts, settings and seeds (f32), rows joining mid-way.
    #[cfg(feature = "cuda")]
    #[test]
    fn fused_rows_draw_what_host_rows_draw() {
        let Ok(dev) = Device::new_cuda(0) else {
            eprintln!("SKIPPED: no CUDA device");
            return;
        };
        let (dir, prompts, draws) = setup();
        let m = load(dir.path(), None, DType::F32, &dev).unwrap();
        let mut host = HostSlots::new(&m.model, &dev, prompts.len(), 64, 0);
        let want = drive(&mut host, &prompts, &draws, 10);
        let w = m.model.decoder().decode_weights(false).unwrap().unwrap();
        for mode in [fast_decode_mode(false), fast_decode_mode(true)] {
            // A small prefill budget: the joiners are prefilled in groups.
            let mut fused =
                FusedSlots::new(&m.model, &w, &dev, prompts.len(), 64, 0, 40, 16, mode).unwrap();
            let got = drive(&mut fused, &prompts, &draws, 10);
            assert_eq!(got, want, "{mode:?}");
        }
    }

    #[cfg(feature = "cuda")]
    fn fast_decode_mode(graph: bool) -> crate::decode::fast_decode::Mode {
        if graph {
            crate::decode::fast_decode::Mode::Graph
        } else {
            crate::decode::fast_decode::Mode::Eager
        }
    }

    /// Rows longer than the attention's splits x 128 keys (2,048) lengthen
    /// their chunks: greedy tokens and log-probs as the op-by-op path's.
    #[cfg(feature = "cuda")]
    #[test]
    fn fused_rows_longer_than_the_splits_decode_as_the_ops_path() {
        use crate::decode::generate::{DecodePath, greedy, with_decode_path};
        let Ok(dev) = Device::new_cuda(0) else {
            eprintln!("SKIPPED: no CUDA device");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        // The chat model: 8,192 positions.
        tiny::write_tiny_chat_model(dir.path(), 42).unwrap();
        let m = load(dir.path(), None, DType::F32, &dev).unwrap();
        let prompts: Vec<Vec<u32>> = vec![
            (0..1500).map(|i| 1 + (i * 37 % 250) as u32).collect(),
            (0..2100).map(|i| 1 + (i * 11 % 250) as u32).collect(),
            vec![5, 6, 7],
        ];
        let on = |path| {
            with_decode_path(path, || greedy(&m.model, &prompts, 6, &[], 0, 0, &dev)).unwrap()
        };
        let (fused, ops) = (on(DecodePath::Graph), on(DecodePath::Ops));
        for (a, b) in fused.iter().zip(&ops) {
            assert_eq!(a.tokens, b.tokens);
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-4, "{x} vs {y}");
            }
        }
    }
}
