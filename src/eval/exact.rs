//! Exact match of a model in memory on eval items: batched greedy decoding
//! (prompts of similar length together) and the environment's scoring, one
//! answer an item. `eval` and the pipeline's gate decode through
//! [`greedy_batches`]; Stages 1-2 choose their checkpoint with
//! [`exact_match`] (`train::select`), so a chosen adapter's score is the
//! score `eval` gives it.

use candle_core::Device;

use super::{DEFAULT_LEVEL, EvalItem, Report, turns};
use crate::data::ChatTokenizer;
use crate::model::Model;
use crate::model::decode::generate::{self, Generation};

/// Greedy generations of `prompts`, in order: `batch_size` at a time,
/// prompts of similar length together. With `stop_on_signal`, a stop
/// signal ends it between batches with an error (`eval`: nothing is
/// written); a training stage scores to the end and stops after.
pub fn greedy_batches(
    model: &Model,
    tok: &ChatTokenizer,
    prompts: &[Vec<u32>],
    batch_size: usize,
    max_new_tokens: usize,
    device: &Device,
    stop_on_signal: bool,
) -> anyhow::Result<Vec<Generation>> {
    // Similar lengths decode together: less padding.
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.sort_by_key(|&i| prompts[i].len());
    let stop = tok.stop_ids();
    let mut out: Vec<Option<Generation>> = vec![None; prompts.len()];
    for chunk in order.chunks(batch_size.max(1)) {
        if stop_on_signal && crate::stop::requested() {
            crate::stop::cut_short();
            anyhow::bail!("eval stopped by a signal before its report was written");
        }
        let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| prompts[i].clone()).collect();
        let gens = generate::greedy(
            model,
            &batch,
            max_new_tokens,
            &stop,
            tok.pad().id,
            0,
            device,
        )?;
        for (&i, g) in chunk.iter().zip(gens) {
            out[i] = Some(g);
        }
    }
    Ok(out
        .into_iter()
        .map(|g| g.expect("every prompt decoded"))
        .collect())
}

/// The report of `model` on `items`, one greedy answer an item, as `eval`
/// writes it for `--max_turns 1` (exact match with its
/// [`DEFAULT_LEVEL`] interval, buckets, misses).
pub fn exact_match(
    model: &Model,
    tok: &ChatTokenizer,
    items: &[EvalItem],
    batch_size: usize,
    max_new_tokens: usize,
    device: &Device,
) -> anyhow::Result<Report> {
    let predictions = turns::run_episodes(items, tok, 1, "first_diff", |p| {
        greedy_batches(model, tok, p, batch_size, max_new_tokens, device, false)
    })?;
    Ok(Report::multi_turn(
        predictions,
        DEFAULT_LEVEL,
        1,
        "first_diff",
    ))
}
