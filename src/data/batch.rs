//! A deterministic, resumable, length-bucketed batcher.
//!
//! Owns the order in which examples are trained on. For epoch `e`:
//! 1. shuffle all example indices with an RNG seeded from `(seed, e)`;
//! 2. cut the order into pools of [`POOL_BATCHES`] batches and sort each
//!    pool by length (stable), so a batch holds examples of similar length
//!    and little compute goes to padding;
//! 3. cut into batches of `batch_size` (only the epoch's last batch may be
//!    smaller: every example is used exactly once an epoch);
//! 4. shuffle the batch order with the same RNG, so lengths do not drift
//!    through the epoch.
//!
//! The order is a pure function of `(seed, epoch, batch_size, lengths)`,
//! so training resumes exactly at a [`Position`]. The RNG is SplitMix64
//! (Steele, Lea and Flood, 2014) with Lemire's unbiased bounded sampling,
//! written here rather than taken from `rand`, whose shuffles may change
//! between versions and would silently change a resumed run's order.
//!
//! Batches are plain row-major `(B, L)` vectors, right-padded with the
//! tokenizer's pad id; padding is marked by `attention_mask = 0` and
//! [`IGNORE_INDEX`] labels, by position, never by comparing ids.

use serde::{Deserialize, Serialize};

use crate::rng::{SplitMix64, mix};

use super::example::{Example, IGNORE_INDEX};
use super::{DataError, Result};

/// Batches whose examples are sorted by length together.
pub const POOL_BATCHES: usize = 32;

/// The next batch to train on: resuming at it yields exactly the batches
/// an uninterrupted run would have seen from there.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Position {
    pub epoch: u64,
    /// Index of the batch within the epoch.
    pub batch: usize,
}

/// Padded tensors' contents, row-major `(batch, seq_len)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Token ids, pad id after each example's end.
    pub input_ids: Vec<u32>,
    /// 1 on real tokens, 0 on padding.
    pub attention_mask: Vec<u32>,
    /// Answer token ids; [`IGNORE_INDEX`] on prompt and padding (unshifted:
    /// `labels[i]` is the token at position `i`).
    pub labels: Vec<i64>,
    pub batch: usize,
    pub seq_len: usize,
    /// Non-pad tokens.
    pub tokens: usize,
    /// Positions with a label.
    pub answer_tokens: usize,
    /// Indices of the examples, row by row.
    pub examples: Vec<usize>,
}

/// The row length a batch whose longest example has `len` tokens is padded
/// to with [`Batcher::with_length_buckets`]: a multiple of 64 up to 512, of
/// 128 up to 1024, of 256 beyond: 16 lengths up to 2048 tokens, fewer than
/// 64 padding tokens in a row of up to 256 and under a quarter of a longer
/// one.
pub fn bucket_len(len: usize) -> usize {
    let step = match len {
        0..=512 => 64,
        513..=1024 => 128,
        _ => 256,
    };
    len.div_ceil(step) * step
}

/// A pass's examples end to end in one row (packing): the projections,
/// norms and the loss run over its real tokens with almost no padding,
/// while attention, which must stay inside each example, runs on the same
/// tokens laid out as `seqs` right-padded rows of `seq_len` slots (one
/// example a row), reached by two index lists.
///
/// The index lists are total, so both directions of the layout change are
/// plain gathers, forward and backward: every attention slot names a packed
/// position and every packed position names a slot. Real tokens and real
/// slots correspond one to one. Padding slots (past an example's end)
/// name the row's last position, which is always padding; padding
/// positions name a padding slot, of which there is always one. Padding
/// never reaches a real token: causal attention over right-padded rows
/// hides padding slots from real queries, and padding carries a zero
/// gradient in both layouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// `(1, len)`: the examples' tokens end to end, then padding.
    pub input_ids: Vec<u32>,
    /// Answer ids, [`IGNORE_INDEX`] elsewhere and on each example's first
    /// position (which an unpacked row never predicts either: the token
    /// before it is the previous example's last).
    pub labels: Vec<i64>,
    /// Each token's position within its example (RoPE restarts at each
    /// example); 0 on padding.
    pub positions: Vec<u32>,
    /// The row's length, at least one more than `tokens`.
    pub len: usize,
    /// The attention rows' length.
    pub seq_len: usize,
    /// `seqs() * seq_len`: the packed position each attention slot reads.
    pub gather: Vec<u32>,
    /// `len`: the attention slot each packed position reads.
    pub scatter: Vec<u32>,
    /// Each attention row's example length (0 for a row of padding; at
    /// least a row an example); the examples sit end to end from position 0
    /// in this order.
    pub lens: Vec<usize>,
    /// Non-pad tokens.
    pub tokens: usize,
    /// Positions with a label (as [`Batch::answer_tokens`]).
    pub answer_tokens: usize,
    pub examples: Vec<usize>,
}

impl Packed {
    /// Attention rows: at least the examples.
    pub fn seqs(&self) -> usize {
        self.lens.len()
    }
}

/// Plans and builds batches over a fixed set of examples.
#[derive(Debug, Clone)]
pub struct Batcher<'a> {
    examples: &'a [Example],
    batch_size: usize,
    seed: u64,
    pad_id: u32,
    buckets: bool,
}

impl<'a> Batcher<'a> {
    pub fn new(examples: &'a [Example], batch_size: usize, seed: u64, pad_id: u32) -> Result<Self> {
        if batch_size == 0 {
            return Err(DataError::Batch(
                "batch size 0\nhint: use a batch size of at least 1".into(),
            ));
        }
        if examples.is_empty() {
            return Err(DataError::Batch(
                "no training examples\nhint: check the dataset and `max_length` (over-long examples are dropped)".into(),
            ));
        }
        Ok(Batcher {
            examples,
            batch_size,
            seed,
            pad_id,
            buckets: false,
        })
    }

    /// Rows padded to [`bucket_len`] of the longest example instead of to
    /// the longest example itself: on a GPU a batch's shape picks the
    /// kernels, the cuDNN attention graphs (each built once a shape, tens
    /// of milliseconds) and the memory pool's blocks, so a few lengths are
    /// reused where every batch of real rows would otherwise bring a new
    /// one. The loss is unchanged: padding is masked by position.
    pub fn with_length_buckets(mut self, on: bool) -> Self {
        self.buckets = on;
        self
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.examples.len().div_ceil(self.batch_size)
    }

    /// A hash of what the order depends on (seed, batch size, example
    /// lengths): store it with a checkpoint and compare before resuming.
    pub fn fingerprint(&self) -> u64 {
        let mut h = mix(self.seed ^ mix(self.batch_size as u64));
        for e in self.examples {
            h = mix(h ^ e.len() as u64);
        }
        h
    }

    /// The example indices of every batch of `epoch`, in training order.
    pub fn plan(&self, epoch: u64) -> Vec<Vec<usize>> {
        let mut rng = SplitMix64::new(mix(self.seed ^ mix(epoch.wrapping_add(1))));
        let mut order: Vec<usize> = (0..self.examples.len()).collect();
        rng.shuffle(&mut order);
        for pool in order.chunks_mut(self.batch_size * POOL_BATCHES) {
            pool.sort_by_key(|&i| self.examples[i].len());
        }
        let mut batches: Vec<Vec<usize>> = order
            .chunks(self.batch_size)
            .map(<[usize]>::to_vec)
            .collect();
        rng.shuffle(&mut batches);
        batches
    }

    /// The row length of `indices`' batch: the longest example's (or its
    /// [`bucket_len`]).
    pub fn row_len(&self, indices: &[usize]) -> usize {
        let longest = indices
            .iter()
            .map(|&i| self.examples[i].len())
            .max()
            .unwrap_or(0);
        if self.buckets {
            bucket_len(longest)
        } else {
            longest
        }
    }

    /// Pads `indices`' examples to [`Self::row_len`].
    pub fn batch(&self, indices: &[usize]) -> Batch {
        let seq_len = self.row_len(indices);
        let n = indices.len() * seq_len;
        let mut input_ids = vec![self.pad_id; n];
        let mut attention_mask = vec![0u32; n];
        let mut labels = vec![IGNORE_INDEX; n];
        let (mut tokens, mut answer_tokens) = (0, 0);
        for (row, &i) in indices.iter().enumerate() {
            let e = &self.examples[i];
            let at = row * seq_len;
            input_ids[at..at + e.len()].copy_from_slice(&e.input_ids);
            attention_mask[at..at + e.len()].fill(1);
            labels[at..at + e.len()].copy_from_slice(&e.labels());
            tokens += e.len();
            answer_tokens += e.answer_len();
        }
        Batch {
            input_ids,
            attention_mask,
            labels,
            batch: indices.len(),
            seq_len,
            tokens,
            answer_tokens,
            examples: indices.to_vec(),
        }
    }

    /// A step's examples (its micro-batches of `batch_size` rows) regrouped
    /// into passes of at most `budget` positions each, rows x
    /// [`Self::row_len`], padding included: longest first, each pass taking
    /// rows while they fit (a row alone always does). The step keeps its
    /// examples and its token-weighted loss; fewer, fuller passes keep a GPU
    /// busier than many short ones (real rows are far shorter than
    /// `max_length`). A pure function of the step's examples, so resumed
    /// and several-rank runs regroup alike.
    pub fn regroup(&self, step: &[Vec<usize>], budget: usize) -> Vec<Vec<usize>> {
        let mut rows: Vec<usize> = step.iter().flatten().copied().collect();
        rows.sort_by_key(|&i| (std::cmp::Reverse(self.examples[i].len()), i));
        let mut passes: Vec<Vec<usize>> = Vec::new();
        for i in rows {
            match passes.last_mut() {
                Some(p) if (p.len() + 1) * self.row_len(&p[..1]) <= budget => p.push(i),
                _ => passes.push(vec![i]),
            }
        }
        passes
    }

    /// A step's examples cut into packed passes of at most `budget` real
    /// tokens each (an example longer than the budget alone), shortest
    /// first so that a pass's examples are of similar length and its
    /// attention rows waste little; as few passes as the budget allows,
    /// their tokens as even as greedy cutting makes them. A pure function
    /// of the step's examples, like [`Self::regroup`].
    pub fn pack_passes(&self, step: &[Vec<usize>], budget: usize) -> Vec<Vec<usize>> {
        let mut rows: Vec<usize> = step.iter().flatten().copied().collect();
        rows.sort_by_key(|&i| (self.examples[i].len(), i));
        let len = |i: usize| self.examples[i].len();
        let total: usize = rows.iter().map(|&i| len(i)).sum();
        let budget = budget.max(1);
        let greedy = |cap: usize| {
            let mut passes: Vec<Vec<usize>> = Vec::new();
            let mut used = 0;
            for &i in &rows {
                match passes.last_mut() {
                    Some(p) if used + len(i) <= cap => {
                        p.push(i);
                        used += len(i);
                    }
                    _ => {
                        passes.push(vec![i]);
                        used = len(i);
                    }
                }
            }
            passes
        };
        let fewest = greedy(budget);
        // Even out the passes: the smallest cap that still needs no more
        // passes than the budget does.
        let want = fewest.len();
        let mut cap = total.div_ceil(want.max(1));
        while cap < budget {
            let p = greedy(cap);
            if p.len() <= want {
                return p;
            }
            cap += cap.div_ceil(16).max(1);
        }
        fewest
    }

    /// The length of `indices`' packed row ([`Self::pack`]): their tokens
    /// and at least one padding position.
    pub fn packed_len(&self, indices: &[usize]) -> usize {
        self.packed_len_of(indices.iter().map(|&i| self.examples[i].len()).sum())
    }

    /// [`Self::packed_len`] of a pass of `tokens` tokens.
    fn packed_len_of(&self, tokens: usize) -> usize {
        if self.buckets {
            (tokens + 1).div_ceil(128) * 128
        } else {
            tokens + 1
        }
    }

    /// `indices`' examples packed into one row ([`Packed`]). With length
    /// buckets the row's length is a multiple of 128, the attention rows a
    /// multiple of 8 and their length a [`bucket_len`], so few shapes
    /// recur.
    pub fn pack(&self, indices: &[usize]) -> Packed {
        let lens: Vec<usize> = indices.iter().map(|&i| self.examples[i].len()).collect();
        let tokens: usize = lens.iter().sum();
        let longest = lens.iter().copied().max().unwrap_or(1).max(1);
        let len = self.packed_len_of(tokens);
        let (mut seqs, seq_len) = if self.buckets {
            (indices.len().max(1).div_ceil(8) * 8, bucket_len(longest))
        } else {
            (indices.len().max(1), longest)
        };
        if seqs * seq_len <= tokens {
            // Room for one padding slot.
            seqs += if self.buckets { 8 } else { 1 };
        }
        let mut input_ids = vec![self.pad_id; len];
        let mut labels = vec![IGNORE_INDEX; len];
        let mut positions = vec![0u32; len];
        let pad_token = (len - 1) as u32;
        let mut gather = vec![pad_token; seqs * seq_len];
        let mut scatter = vec![0u32; len];
        let (mut at, mut answer_tokens) = (0, 0);
        for (row, &i) in indices.iter().enumerate() {
            let e = &self.examples[i];
            let n = e.len();
            input_ids[at..at + n].copy_from_slice(&e.input_ids);
            labels[at..at + n].copy_from_slice(&e.labels());
            labels[at] = IGNORE_INDEX;
            for j in 0..n {
                positions[at + j] = j as u32;
                let slot = row * seq_len + j;
                gather[slot] = (at + j) as u32;
                scatter[at + j] = slot as u32;
            }
            at += n;
            answer_tokens += e.answer_len();
        }
        // Padding positions read the first padding slot.
        // (There is one: `seqs * seq_len > tokens`.)
        let pad_slot = lens
            .iter()
            .enumerate()
            .find(|&(_, &n)| n < seq_len)
            .map_or(indices.len() * seq_len, |(row, &n)| row * seq_len + n);
        scatter[tokens..].fill(pad_slot as u32);
        let mut row_lens = lens.clone();
        row_lens.resize(seqs, 0);
        Packed {
            input_ids,
            labels,
            positions,
            len,
            seq_len,
            gather,
            scatter,
            lens: row_lens,
            tokens,
            answer_tokens,
            examples: indices.to_vec(),
        }
    }

    /// The position after `pos` (the next epoch's first batch after an
    /// epoch's last).
    pub fn next_position(&self, pos: Position) -> Position {
        if pos.batch + 1 >= self.batches_per_epoch() {
            Position {
                epoch: pos.epoch + 1,
                batch: 0,
            }
        } else {
            Position {
                epoch: pos.epoch,
                batch: pos.batch + 1,
            }
        }
    }

    /// Every batch from `start` on, epoch after epoch, without end (stop
    /// with `take` or on the position's epoch), each with its position.
    /// A start past the epoch's end means the data changed: an error.
    pub fn batches_from(
        &self,
        start: Position,
    ) -> Result<impl Iterator<Item = (Position, Batch)> + '_> {
        let per_epoch = self.batches_per_epoch();
        if start.batch > per_epoch {
            return Err(DataError::Batch(format!(
                "cannot resume at batch {} of epoch {}: an epoch has {per_epoch} batches\nhint: resume with the same data, batch size and max_length as the checkpoint",
                start.batch, start.epoch
            )));
        }
        let start = if start.batch == per_epoch {
            Position {
                epoch: start.epoch + 1,
                batch: 0,
            }
        } else {
            start
        };
        Ok((start.epoch..).flat_map(move |epoch| {
            let skip = if epoch == start.epoch { start.batch } else { 0 };
            self.plan(epoch)
                .into_iter()
                .enumerate()
                .skip(skip)
                .map(move |(batch, idx)| (Position { epoch, batch }, self.batch(&idx)))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Examples of the given lengths: prompt ids 1.., answer the last 2.
    fn examples(lengths: &[usize]) -> Vec<Example> {
        lengths
            .iter()
            .enumerate()
            .map(|(k, &n)| Example {
                input_ids: (0..n as u32).map(|t| 1000 * k as u32 + t + 1).collect(),
                prompt_len: n.saturating_sub(2),
                line: k as u64 + 1,
            })
            .collect()
    }

    fn lengths(n: usize) -> Vec<usize> {
        (0..n).map(|i| 3 + (i * 37) % 50).collect()
    }

    #[test]
    fn rng_is_stable_across_versions() {
        // Pinned outputs: a change here changes every resumed run's order.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = SplitMix64::new(7);
        let mut v: Vec<u32> = (0..10).collect();
        r.shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(v, sorted);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = SplitMix64::new(1);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[r.below(6) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn deterministic_and_epochs_differ() {
        let ex = examples(&lengths(100));
        let a = Batcher::new(&ex, 8, 42, 0).unwrap();
        let b = Batcher::new(&ex, 8, 42, 0).unwrap();
        assert_eq!(a.plan(0), b.plan(0));
        assert_ne!(a.plan(0), a.plan(1));
        let c = Batcher::new(&ex, 8, 43, 0).unwrap();
        assert_ne!(a.plan(0), c.plan(0));
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn every_example_once_per_epoch() {
        let ex = examples(&lengths(101));
        let b = Batcher::new(&ex, 8, 1, 0).unwrap();
        assert_eq!(b.batches_per_epoch(), 13);
        for epoch in 0..3 {
            let plan = b.plan(epoch);
            assert_eq!(plan.len(), 13);
            assert_eq!(plan.iter().filter(|p| p.len() < 8).count(), 1);
            let mut all: Vec<usize> = plan.concat();
            all.sort();
            assert_eq!(all, (0..101).collect::<Vec<_>>());
        }
    }

    #[test]
    fn batches_group_similar_lengths() {
        // One pool: batches are consecutive runs of the length-sorted order.
        let ex = examples(&lengths(64));
        let b = Batcher::new(&ex, 4, 5, 0).unwrap();
        let mut sorted: Vec<usize> = (0..64).map(|i| ex[i].len()).collect();
        sorted.sort();
        let mut got: Vec<Vec<usize>> = b
            .plan(0)
            .iter()
            .map(|p| p.iter().map(|&i| ex[i].len()).collect())
            .collect();
        got.sort();
        let want: Vec<Vec<usize>> = sorted.chunks(4).map(<[usize]>::to_vec).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn padding_is_masked_by_position() {
        let mut ex = examples(&[5, 3]);
        // An answer that contains the pad id itself stays a label.
        ex[1].input_ids[2] = 0;
        let b = Batcher::new(&ex, 2, 0, 0).unwrap();
        let batch = b.batch(&[0, 1]);
        assert_eq!((batch.batch, batch.seq_len), (2, 5));
        assert_eq!(batch.tokens, 8);
        assert_eq!(batch.answer_tokens, 4);
        assert_eq!(&batch.input_ids[5..], &[1001, 1002, 0, 0, 0]);
        assert_eq!(batch.attention_mask, [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(
            batch.labels,
            [-100, -100, -100, 4, 5, -100, 1002, 0, -100, -100]
        );
    }

    #[test]
    fn resume_yields_the_remaining_batches() {
        let ex = examples(&lengths(50));
        let b = Batcher::new(&ex, 4, 9, 0).unwrap();
        let per = b.batches_per_epoch();
        let full: Vec<_> = b
            .batches_from(Position::default())
            .unwrap()
            .take(3 * per)
            .collect();
        for cut in [0, 1, 5, per - 1, per, per + 3, 2 * per + 1] {
            let resume = full[cut].0;
            let rest: Vec<_> = b
                .batches_from(resume)
                .unwrap()
                .take(3 * per - cut)
                .collect();
            assert_eq!(rest, full[cut..], "resuming at {resume:?}");
            if cut > 0 {
                assert_eq!(b.next_position(full[cut - 1].0), resume);
            }
        }
        // The end of an epoch resumes at the next one.
        let end = Position {
            epoch: 0,
            batch: per,
        };
        assert_eq!(b.batches_from(end).unwrap().next().unwrap().0.epoch, 1);
        let past = Position {
            epoch: 0,
            batch: per + 1,
        };
        assert!(b.batches_from(past).is_err());
    }

    #[test]
    fn bad_settings() {
        let ex = examples(&[3]);
        assert!(Batcher::new(&ex, 0, 0, 0).is_err());
    }

    #[test]
    fn length_buckets_pad_to_a_few_lengths_and_keep_the_tokens() {
        assert_eq!(
            [1, 64, 65, 500, 513, 1000, 1025, 2000].map(bucket_len),
            [64, 64, 128, 512, 640, 1024, 1280, 2048]
        );
        let lengths: std::collections::BTreeSet<usize> = (1..=2048).map(bucket_len).collect();
        assert_eq!(lengths.len(), 16);
        for l in 1..=2048 {
            let pad = bucket_len(l) - l;
            assert!(if l <= 256 { pad < 64 } else { 4 * pad < l }, "{l}: {pad}");
        }
        let ex = examples(&[3, 70, 5]);
        let plain = Batcher::new(&ex, 3, 0, 9).unwrap();
        let bucketed = Batcher::new(&ex, 3, 0, 9)
            .unwrap()
            .with_length_buckets(true);
        let (a, b) = (plain.batch(&[0, 1, 2]), bucketed.batch(&[0, 1, 2]));
        assert_eq!((a.seq_len, b.seq_len), (70, 128));
        assert_eq!(
            (plain.row_len(&[0, 1, 2]), bucketed.row_len(&[0, 2])),
            (70, 64)
        );
        assert_eq!((a.tokens, a.answer_tokens), (b.tokens, b.answer_tokens));
        for row in 0..3 {
            let (ra, rb) = (row * a.seq_len, row * b.seq_len);
            assert_eq!(a.input_ids[ra..ra + 70], b.input_ids[rb..rb + 70]);
            assert_eq!(a.labels[ra..ra + 70], b.labels[rb..rb + 70]);
            assert_eq!(a.attention_mask[ra..ra + 70], b.attention_mask[rb..rb + 70]);
            assert!(b.attention_mask[rb + 70..rb + 128].iter().all(|&m| m == 0));
            assert!(
                b.labels[rb + 70..rb + 128]
                    .iter()
                    .all(|&l| l == IGNORE_INDEX)
            );
            assert!(b.input_ids[rb + 70..rb + 128].iter().all(|&t| t == 9));
        }
        assert!(Batcher::new(&[], 1, 0, 0).is_err());
    }

    #[test]
    fn regrouped_passes_keep_the_step_and_fit_the_budget() {
        let lens = [30, 700, 64, 65, 5, 1500, 200, 90];
        let ex = examples(&lens);
        let b = Batcher::new(&ex, 2, 0, 9)
            .unwrap()
            .with_length_buckets(true);
        let step = vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]];
        for budget in [1, 1536, 2048, 4096, 100_000] {
            let passes = b.regroup(&step, budget);
            let mut seen: Vec<usize> = passes.iter().flatten().copied().collect();
            seen.sort();
            assert_eq!(seen, (0..8).collect::<Vec<_>>(), "budget {budget}");
            for p in &passes {
                assert!(
                    p.len() == 1 || p.len() * b.row_len(p) <= budget,
                    "budget {budget}: {p:?}"
                );
            }
            // Longest first: no pass holds a row longer than an earlier pass's.
            let longest: Vec<usize> = passes.iter().map(|p| b.row_len(p)).collect();
            assert!(longest.windows(2).all(|w| w[0] >= w[1]), "{longest:?}");
            assert_eq!(passes, b.regroup(&step, budget));
        }
        assert_eq!(b.regroup(&step, 1).len(), 8);
        assert_eq!(b.regroup(&step, 100_000).len(), 1);
        // 1536 (1500's bucket) alone, then 768 x 2 = 1536 for 700 with 200
        // (bucket 256 <= 768), and so on.
        assert_eq!(
            b.regroup(&step, 1536),
            vec![vec![5], vec![1, 6], vec![7, 3, 2, 0, 4]]
        );
    }

    #[test]
    fn packed_passes_keep_the_step_fit_the_budget_and_even_out() {
        let ex = examples(&lengths(40));
        let b = Batcher::new(&ex, 4, 3, 0).unwrap();
        let step: Vec<Vec<usize>> = b.plan(0).into_iter().take(5).collect();
        let mut all: Vec<usize> = step.iter().flatten().copied().collect();
        let total: usize = all.iter().map(|&i| ex[i].len()).sum();
        for budget in [1, 60, 150, total, 10 * total] {
            let passes = b.pack_passes(&step, budget);
            let mut got: Vec<usize> = passes.iter().flatten().copied().collect();
            got.sort();
            all.sort();
            assert_eq!(got, all, "budget {budget}: every example once");
            let tokens: Vec<usize> = passes
                .iter()
                .map(|p| p.iter().map(|&i| ex[i].len()).sum())
                .collect();
            for (p, &t) in passes.iter().zip(&tokens) {
                assert!(t <= budget || p.len() == 1, "budget {budget}: {t} tokens");
            }
            // No more passes than filling each to the budget in turn.
            let mut fill = 0;
            let mut greedy = 0;
            let mut sorted: Vec<usize> = all.iter().map(|&i| ex[i].len()).collect();
            sorted.sort();
            for n in sorted {
                if greedy == 0 || fill + n > budget {
                    greedy += 1;
                    fill = n;
                } else {
                    fill += n;
                }
            }
            assert_eq!(passes.len(), greedy, "budget {budget}");
            if budget == 150 {
                // Evened out: the smallest pass is not a leftover crumb.
                let (lo, hi) = (tokens.iter().min().unwrap(), tokens.iter().max().unwrap());
                assert!(hi - lo <= 60, "{tokens:?}");
            }
        }
        assert_eq!(b.pack_passes(&step, 150), b.pack_passes(&step, 150));
    }

    #[test]
    fn a_packed_row_maps_each_token_to_its_own_slot() {
        let ex = examples(&[5, 9, 3, 9]);
        for buckets in [false, true] {
            let b = Batcher::new(&ex, 4, 0, 7)
                .unwrap()
                .with_length_buckets(buckets);
            let p = b.pack(&[1, 0, 3, 2]);
            assert_eq!(p.tokens, 26);
            assert_eq!(p.len, b.packed_len(&[1, 0, 3, 2]));
            assert!(p.len > p.tokens);
            if buckets {
                assert_eq!((p.len, p.seqs(), p.seq_len), (128, 8, 64));
            } else {
                // Four rows of 9 hold 26 tokens with room to spare.
                assert_eq!((p.len, p.seqs(), p.seq_len), (27, 4, 9));
            }
            let mut at = 0;
            for (row, &i) in [1usize, 0, 3, 2].iter().enumerate() {
                let e = &ex[i];
                assert_eq!(&p.input_ids[at..at + e.len()], &e.input_ids[..]);
                let mut labels = e.labels();
                labels[0] = IGNORE_INDEX;
                assert_eq!(&p.labels[at..at + e.len()], &labels[..]);
                for j in 0..e.len() {
                    assert_eq!(p.positions[at + j], j as u32);
                    let slot = row * p.seq_len + j;
                    assert_eq!(p.gather[slot] as usize, at + j);
                    assert_eq!(p.scatter[at + j] as usize, slot);
                }
                // The row's padding slots read the row's last position.
                for slot in row * p.seq_len + e.len()..(row + 1) * p.seq_len {
                    assert_eq!(p.gather[slot] as usize, p.len - 1);
                }
                at += e.len();
            }
            assert!(p.input_ids[at..].iter().all(|&t| t == 7));
            assert!(p.labels[at..].iter().all(|&l| l == IGNORE_INDEX));
            // Padding positions read a padding slot.
            for &slot in &p.scatter[at..] {
                assert_eq!(p.gather[slot as usize] as usize, p.len - 1);
            }
        }
        // Every example as long as the longest: a row of padding is added.
        let same = examples(&[6, 6]);
        let p = Batcher::new(&same, 2, 0, 0).unwrap().pack(&[0, 1]);
        assert_eq!((p.seqs(), p.seq_len), (3, 6));
        assert_eq!(p.scatter[12], 12);
    }
}
