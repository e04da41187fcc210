//! The statistics an RL step needs over its whole batch when each rank holds
//! a share of it: which GRPO groups a rank samples and scores (groups stay
//! whole on one rank), advantage whitening over every rank's valid tokens,
//! batch-level reward scaling, reward summaries and counts. Each function
//! gives every rank the single-process result, up to the order of
//! additions.
//!
//! Means and variances are computed in two passes (the global mean first,
//! then the global sum of squared deviations), as a single process would,
//! rather than from sums of squares, which lose digits when the mean is
//! large against the spread.

use std::collections::BTreeMap;
use std::ops::Range;

use anyhow::Context;

use candle_core::{DType, Tensor};

use super::Communicator;

/// The groups rank `rank` samples and scores: a contiguous block of
/// `0..groups`, the first `groups % world` ranks one longer. Whole groups
/// only, so a group's mean and standard deviation need no communication.
pub fn groups_of_rank(groups: usize, world: usize, rank: usize) -> Range<usize> {
    let (lo, hi) = super::shard::slice_bounds(groups, world, rank);
    lo..hi
}

/// Count, mean and variance (unbiased, Bessel-corrected, as `torch.var`)
/// of values pooled over all ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    pub count: f64,
    pub mean: f64,
    pub var: f64,
}

/// [`Moments`] of the values of every rank (`values` are this rank's).
pub fn moments(comm: &dyn Communicator, values: &[f64]) -> anyhow::Result<Moments> {
    let s = comm.sum_f64(&[values.len() as f64, values.iter().sum()])?;
    let (count, mean) = (s[0], s[1] / s[0].max(1.0));
    let dev: f64 = values.iter().map(|v| (v - mean).powi(2)).sum();
    let ss = comm.sum_f64(&[dev])?[0];
    Ok(Moments {
        count,
        mean,
        var: if count > 1.0 { ss / (count - 1.0) } else { 0.0 },
    })
}

/// [`Moments`] of `values` where `mask` is 1, pooled over all ranks
/// (tensors of any shape, the same on both; computed on the device, only
/// three numbers travel).
pub fn masked_moments(
    comm: &dyn Communicator,
    values: &Tensor,
    mask: &Tensor,
) -> anyhow::Result<Moments> {
    let x = values.to_dtype(DType::F64)?;
    let m = mask.to_dtype(DType::F64)?;
    let n = m.sum_all()?.to_scalar::<f64>()?;
    let s = (&x * &m)?.sum_all()?.to_scalar::<f64>()?;
    let g = comm.sum_f64(&[n, s])?;
    let (count, mean) = (g[0], g[1] / g[0].max(1.0));
    let dev = ((x - mean)?.sqr()? * &m)?.sum_all()?.to_scalar::<f64>()?;
    let ss = comm.sum_f64(&[dev])?[0];
    Ok(Moments {
        count,
        mean,
        var: if count > 1.0 { ss / (count - 1.0) } else { 0.0 },
    })
}

/// Advantages whitened over every rank's valid tokens:
/// `(x - mean) / sqrt(var + 1e-8)` with the pooled [`masked_moments`]
/// (PPO's advantage normalisation, as TRL's `masked_whiten`), the mean
/// added back when `shift_mean` is false; 0 where `mask` is 0. In
/// `values`' dtype.
pub fn whiten(
    comm: &dyn Communicator,
    values: &Tensor,
    mask: &Tensor,
    shift_mean: bool,
) -> anyhow::Result<Tensor> {
    let mo = masked_moments(comm, values, mask)?;
    let x = values.to_dtype(DType::F64)?;
    let mut w = ((x - mo.mean)? * (1.0 / (mo.var + 1e-8).sqrt()))?;
    if !shift_mean {
        w = (w + mo.mean)?;
    }
    Ok((w * mask.to_dtype(DType::F64)?)?.to_dtype(values.dtype())?)
}

/// How GRPO scales a group's centred rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewardScale {
    /// By the group's own standard deviation (DeepSeekMath's GRPO).
    Group,
    /// By the standard deviation of the whole batch, over all ranks.
    Batch,
    /// Not at all (Dr. GRPO).
    None,
}

/// GRPO advantages of this rank's whole groups (`rewards` in group order,
/// `group_size` each): `r - mean(group)`, divided by the scale's standard
/// deviation plus 1e-4 (Shao et al., "DeepSeekMath", 2024, section 4.1.2,
/// outcome supervision; the batch and no-scaling variants as TRL offers
/// them). Only `RewardScale::Batch` communicates.
pub fn grpo_advantages(
    comm: &dyn Communicator,
    rewards: &[f64],
    group_size: usize,
    scale: RewardScale,
) -> anyhow::Result<Vec<f64>> {
    anyhow::ensure!(
        group_size > 0 && rewards.len().is_multiple_of(group_size),
        "{} rewards are not whole groups of {group_size}\nhint: a rank must hold whole groups (see groups_of_rank)",
        rewards.len()
    );
    let batch_std = match scale {
        RewardScale::Batch => Some(moments(comm, rewards)?.var.sqrt()),
        _ => None,
    };
    let mut out = Vec::with_capacity(rewards.len());
    for g in rewards.chunks(group_size) {
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let std = match scale {
            RewardScale::Group => sample_std(g, mean),
            RewardScale::Batch => batch_std.unwrap_or(0.0),
            RewardScale::None => 0.0,
        };
        let denom = if scale == RewardScale::None {
            1.0
        } else {
            std + 1e-4
        };
        out.extend(g.iter().map(|r| (r - mean) / denom));
    }
    Ok(out)
}

fn sample_std(g: &[f64], mean: f64) -> f64 {
    if g.len() < 2 {
        return 0.0;
    }
    (g.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (g.len() - 1) as f64).sqrt()
}

/// A step's rewards summarised over all ranks, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RewardSummary {
    pub count: f64,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    /// Groups whose rewards are all equal (no learning signal), as a
    /// fraction of all groups.
    pub frac_zero_std_groups: f64,
}

/// [`RewardSummary`] of every rank's rewards (this rank's whole groups of
/// `group_size`).
pub fn reward_summary(
    comm: &dyn Communicator,
    rewards: &[f64],
    group_size: usize,
) -> anyhow::Result<RewardSummary> {
    let mo = moments(comm, rewards)?;
    let groups = rewards.chunks(group_size.max(1));
    let flat = groups
        .clone()
        .filter(|g| g.iter().all(|r| *r == g[0]))
        .count() as f64;
    let (lo, hi) = rewards
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &r| {
            (a.min(r), b.max(r))
        });
    let all = comm.all_gather_f64(&[lo, hi, flat, groups.count() as f64])?;
    let total_groups: f64 = all.iter().map(|v| v[3]).sum();
    Ok(RewardSummary {
        count: mo.count,
        mean: mo.mean,
        std: mo.var.sqrt(),
        min: all.iter().map(|v| v[0]).fold(f64::INFINITY, f64::min),
        max: all.iter().map(|v| v[1]).fold(f64::NEG_INFINITY, f64::max),
        frac_zero_std_groups: all.iter().map(|v| v[2]).sum::<f64>() / total_groups.max(1.0),
    })
}

/// A count summed over all ranks (valid tokens for a token-mean loss,
/// sequences, truncated answers).
pub fn global_count(comm: &dyn Communicator, n: usize) -> anyhow::Result<usize> {
    Ok(comm.sum_f64(&[n as f64])?[0].round() as usize)
}

/// Every rank's `values`, whatever their lengths, in rank order (two
/// collectives: the lengths, then the values padded to the longest).
pub fn all_gather_varlen(comm: &dyn Communicator, values: &[f64]) -> anyhow::Result<Vec<Vec<f64>>> {
    if comm.world() == 1 {
        return Ok(vec![values.to_vec()]);
    }
    let lens: Vec<usize> = comm
        .all_gather_f64(&[values.len() as f64])?
        .iter()
        .map(|v| v[0] as usize)
        .collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let mut padded = values.to_vec();
    padded.resize(longest, 0.0);
    let all = comm.all_gather_f64(&padded)?;
    Ok(all
        .into_iter()
        .zip(lens)
        .map(|(mut v, n)| {
            v.truncate(n);
            v
        })
        .collect())
}

/// Bytes a value carries in [`all_gather_bytes`]: six, so every packed
/// value is an integer below 2^48, exact in an f64.
const BYTES_PER_VALUE: usize = 6;

/// Every rank's `bytes`, whatever their lengths, in rank order (serialized
/// records: tasks, named counts), packed six to a value.
pub fn all_gather_bytes(comm: &dyn Communicator, bytes: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
    if comm.world() == 1 {
        return Ok(vec![bytes.to_vec()]);
    }
    let mut packed = vec![bytes.len() as f64];
    packed.extend(bytes.chunks(BYTES_PER_VALUE).map(|c| {
        let mut v = [0u8; 8];
        v[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(v) as f64
    }));
    all_gather_varlen(comm, &packed)?
        .into_iter()
        .map(|v| {
            let n = *v.first().context("a rank sent no length")? as usize;
            let mut out: Vec<u8> = v[1..]
                .iter()
                .flat_map(|&x| (x as u64).to_le_bytes().into_iter().take(BYTES_PER_VALUE))
                .collect();
            out.truncate(n);
            Ok(out)
        })
        .collect()
}

/// Named counts (masked completions by reason, ...) summed over all ranks,
/// whatever names each rank saw.
pub fn sum_counts(
    comm: &dyn Communicator,
    counts: &BTreeMap<String, u64>,
) -> anyhow::Result<BTreeMap<String, u64>> {
    if comm.world() == 1 {
        return Ok(counts.clone());
    }
    let mut out = BTreeMap::new();
    for bytes in all_gather_bytes(comm, &serde_json::to_vec(counts)?)? {
        let theirs: BTreeMap<String, u64> =
            serde_json::from_slice(&bytes).context("a rank sent unreadable counts")?;
        for (name, n) in theirs {
            *out.entry(name).or_default() += n;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::Single;
    use crate::dist::inprocess::run_ranks;
    use candle_core::Device;

    const G: usize = 4;

    /// 7 groups of 4 rewards: mixed, flat and binary groups.
    fn rewards() -> Vec<f64> {
        (0..7 * G)
            .map(|i| match i / G {
                2 => 1.0,
                5 => 0.0,
                g => ((i * 37 + g) % 5) as f64 / 4.0,
            })
            .collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn ragged_gathers_and_named_counts_combine_every_rank() {
        let out = run_ranks(3, |c| {
            let mine: Vec<f64> = (0..c.rank() * 2)
                .map(|i| (10 * c.rank() + i) as f64)
                .collect();
            let gathered = all_gather_varlen(&c, &mine)?;
            let mut counts = BTreeMap::new();
            counts.insert("truncated".to_string(), 1 + c.rank() as u64);
            if c.rank() == 2 {
                counts.insert("sandbox_failure".to_string(), 5);
            }
            let text = "é".repeat(c.rank() * 7 + 1);
            let bytes = all_gather_bytes(&c, text.as_bytes())?;
            Ok((gathered, sum_counts(&c, &counts)?, bytes))
        })
        .unwrap();
        for (gathered, counts, bytes) in out {
            for (r, b) in bytes.iter().enumerate() {
                assert_eq!(String::from_utf8(b.clone()).unwrap(), "é".repeat(r * 7 + 1));
            }
            assert_eq!(
                gathered,
                vec![vec![], vec![10.0, 11.0], vec![20.0, 21.0, 22.0, 23.0]]
            );
            assert_eq!(counts.len(), 2);
            assert_eq!(counts["truncated"], 1 + 2 + 3);
            assert_eq!(counts["sandbox_failure"], 5);
        }
        let one: BTreeMap<String, u64> = [("x".to_string(), 2)].into();
        assert_eq!(sum_counts(&Single, &one).unwrap(), one);
    }

    #[test]
    fn groups_are_whole_and_cover_the_batch() {
        for world in 1..=4 {
            let mut all: Vec<usize> = (0..world)
                .flat_map(|r| groups_of_rank(7, world, r))
                .collect();
            all.sort();
            assert_eq!(all, (0..7).collect::<Vec<_>>());
        }
        assert_eq!(groups_of_rank(7, 3, 0), 0..3);
    }

    #[test]
    fn rl_statistics_on_several_ranks_match_one_process() {
        let r = rewards();
        let single_adv = {
            let mut v = Vec::new();
            for s in [RewardScale::Group, RewardScale::Batch, RewardScale::None] {
                v.push(grpo_advantages(&Single, &r, G, s).unwrap());
            }
            v
        };
        let single_sum = reward_summary(&Single, &r, G).unwrap();
        assert_eq!(single_sum.frac_zero_std_groups, 2.0 / 7.0);
        // Token-level values: 28 sequences of 5 positions, a ragged mask.
        let values: Vec<f32> = (0..28 * 5).map(|i| ((i * 13) % 11) as f32 - 3.0).collect();
        let mask: Vec<f32> = (0..28 * 5)
            .map(|i| f32::from(i % 5 < 1 + (i / 5) % 4))
            .collect();
        let dev = Device::Cpu;
        let tv = Tensor::from_vec(values.clone(), (28, 5), &dev).unwrap();
        let tm = Tensor::from_vec(mask.clone(), (28, 5), &dev).unwrap();
        let single_w = whiten(&Single, &tv, &tm, true)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let single_mo = masked_moments(&Single, &tv, &tm).unwrap();
        assert!(close(single_mo.count, mask.iter().sum::<f32>() as f64));

        for world in [2, 3] {
            let per_rank = run_ranks(world, |c| {
                let groups = groups_of_rank(7, world, c.rank());
                let mine = &r[groups.start * G..groups.end * G];
                let adv = [RewardScale::Group, RewardScale::Batch, RewardScale::None]
                    .map(|s| grpo_advantages(&c, mine, G, s).unwrap());
                let sum = reward_summary(&c, mine, G)?;
                let rows = groups.start * G..groups.end * G;
                let v = tv.narrow(0, rows.start, rows.len())?;
                let m = tm.narrow(0, rows.start, rows.len())?;
                let w = whiten(&c, &v, &m, true)?.to_vec2::<f32>()?;
                let mo = masked_moments(&c, &v, &m)?;
                let n = global_count(&c, rows.len())?;
                Ok((adv, sum, w, mo, n))
            })
            .unwrap();
            let mut adv: [Vec<f64>; 3] = Default::default();
            let mut w = Vec::new();
            for (a, sum, wr, mo, n) in per_rank {
                for k in 0..3 {
                    adv[k].extend(&a[k]);
                }
                w.extend(wr);
                assert_eq!(n, 28);
                assert!(close(mo.mean, single_mo.mean) && close(mo.var, single_mo.var));
                assert_eq!(sum.count, single_sum.count);
                assert!(close(sum.mean, single_sum.mean) && close(sum.std, single_sum.std));
                assert_eq!((sum.min, sum.max), (single_sum.min, single_sum.max));
                assert_eq!(sum.frac_zero_std_groups, single_sum.frac_zero_std_groups);
            }
            for k in 0..3 {
                assert_eq!(adv[k].len(), single_adv[k].len());
                for (a, b) in adv[k].iter().zip(&single_adv[k]) {
                    assert!(close(*a, *b), "scale {k} on {world} ranks: {a} vs {b}");
                }
            }
            for (a, b) in w.iter().flatten().zip(single_w.iter().flatten()) {
                assert!((a - b).abs() < 1e-6, "whitened {a} vs {b}");
            }
        }
        // The whitened valid values have mean 0 and unit variance.
        let valid: Vec<f64> = single_w
            .iter()
            .flatten()
            .zip(&mask)
            .filter(|(_, m)| **m > 0.0)
            .map(|(w, _)| *w as f64)
            .collect();
        let mean = valid.iter().sum::<f64>() / valid.len() as f64;
        assert!(mean.abs() < 1e-6, "{mean}");
        assert!(grpo_advantages(&Single, &r[..5], G, RewardScale::Group).is_err());
    }
}
