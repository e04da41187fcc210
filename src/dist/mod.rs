//! Data-parallel training over several ranks (one process a GPU, or threads
//! in tests): the [`Communicator`] interface and what is built on it.
//!
//! The module owns how ranks agree: gradients summed over ranks in a few
//! large buckets ([`all_reduce_sum`]), rank 0's weights handed to all
//! ([`broadcast`]), scalars summed or gathered ([`Communicator::sum_f64`],
//! [`Communicator::all_gather_f64`]), a check that every rank holds the same
//! weights ([`check_in_sync`]), how a step's micro-batches are split
//! ([`shard`]), the whole-batch statistics RL needs ([`stats`]) and how
//! the ranks agree on the NCCL id, on one host or several ([`meet`]).
//!
//! Implementations: [`Single`] (one rank, every call a no-op), [`InProcess`]
//! (threads of one process sharing memory: for CPU tests of the combination
//! logic) and, under the `cuda` feature, `nccl::Nccl` (NCCL through cudarc,
//! one process a GPU).

pub mod inprocess;
pub mod meet;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod shard;
pub mod stats;

use anyhow::Context;
use candle_core::{DType, Tensor, Var};
use sha2::{Digest, Sha256};

pub use inprocess::InProcess;

/// The collectives a data-parallel run needs. Every rank calls the same
/// collectives in the same order with tensors of the same lengths; results
/// are identical on every rank.
pub trait Communicator {
    /// This rank, `0..world()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// The sum over ranks of a 1-D f32 tensor (on this rank's device).
    fn all_reduce_f32(&self, flat: &Tensor) -> anyhow::Result<Tensor>;
    /// Rank `root`'s 1-D f32 tensor, on every rank (`flat` gives the length
    /// on the others).
    fn broadcast_f32(&self, flat: &Tensor, root: usize) -> anyhow::Result<Tensor>;
    /// Every rank's `values` (the same length on all ranks), in rank order.
    fn all_gather_f64(&self, values: &[f64]) -> anyhow::Result<Vec<Vec<f64>>>;

    /// Element-wise sums over ranks, added in rank order (so the same on
    /// every rank, and the same from run to run).
    fn sum_f64(&self, values: &[f64]) -> anyhow::Result<Vec<f64>> {
        if self.world() == 1 {
            return Ok(values.to_vec());
        }
        let all = self.all_gather_f64(values)?;
        Ok((0..values.len())
            .map(|i| all.iter().map(|v| v[i]).sum())
            .collect())
    }

    /// Returns once every rank has called it.
    fn barrier(&self) -> anyhow::Result<()> {
        self.all_gather_f64(&[0.0]).map(|_| ())
    }

    /// This rank's group of `groups` as a communicator of its own, the
    /// group's ranks numbered by their place in it. Every rank calls it
    /// together with the same `groups`: the world's ranks, each in exactly
    /// one group ([`place_in`] checks it). A group of one rank is
    /// [`Single`]; larger ones are this implementation's to make.
    fn split(&self, groups: &[Vec<usize>]) -> anyhow::Result<Box<dyn Communicator>> {
        let (group, _) = place_in(groups, self.rank(), self.world())?;
        anyhow::ensure!(
            groups[group].len() == 1,
            "this communicator cannot make groups of several ranks"
        );
        Ok(Box::new(Single))
    }
}

/// The group of `groups` that holds `rank`, and the rank's place in it;
/// an error unless `groups` holds each of the `world` ranks exactly once.
pub fn place_in(
    groups: &[Vec<usize>],
    rank: usize,
    world: usize,
) -> anyhow::Result<(usize, usize)> {
    let mut seen = vec![false; world];
    for &r in groups.iter().flatten() {
        anyhow::ensure!(
            r < world && !std::mem::replace(&mut seen[r], true),
            "groups {groups:?} do not part the {world} ranks: rank {r} is out of range or in two groups"
        );
    }
    anyhow::ensure!(
        seen.iter().all(|&s| s),
        "groups {groups:?} leave out some of the {world} ranks"
    );
    groups
        .iter()
        .enumerate()
        .find_map(|(g, m)| m.iter().position(|&r| r == rank).map(|p| (g, p)))
        .context("a rank outside every group")
}

/// GPUs this process can see (0 when built without CUDA or without a
/// driver). Counting does not create a context on any of them.
pub fn visible_gpus() -> usize {
    #[cfg(feature = "cuda")]
    {
        cudarc::driver::CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// One rank alone: nothing to exchange.
pub struct Single;

impl Communicator for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_reduce_f32(&self, flat: &Tensor) -> anyhow::Result<Tensor> {
        Ok(flat.clone())
    }
    fn broadcast_f32(&self, flat: &Tensor, _root: usize) -> anyhow::Result<Tensor> {
        Ok(flat.clone())
    }
    fn all_gather_f64(&self, values: &[f64]) -> anyhow::Result<Vec<Vec<f64>>> {
        Ok(vec![values.to_vec()])
    }
}

/// Elements a bucket holds at most (32 MiB of f32) before it is sent.
/// LoRA gives hundreds of small gradients (two a projection a layer); one
/// collective each would be latency-bound, one for all would hold a second
/// copy of every gradient. A few buffers of this size sit in between.
pub const BUCKET_ELEMS: usize = 8 << 20;

/// Each of `tensors` summed over ranks, with its shape and dtype. The
/// tensors are flattened to f32 and packed into buckets of about
/// [`BUCKET_ELEMS`], one collective a bucket.
pub fn all_reduce_sum(comm: &dyn Communicator, tensors: &[Tensor]) -> anyhow::Result<Vec<Tensor>> {
    if comm.world() == 1 {
        return Ok(tensors.to_vec());
    }
    bucketed(tensors, BUCKET_ELEMS, |flat| comm.all_reduce_f32(flat))
        .context("all-reduce of the gradients")
}

/// Rank `root`'s values of `tensors`, on every rank, bucketed as
/// [`all_reduce_sum`].
pub fn broadcast(
    comm: &dyn Communicator,
    tensors: &[Tensor],
    root: usize,
) -> anyhow::Result<Vec<Tensor>> {
    if comm.world() == 1 {
        return Ok(tensors.to_vec());
    }
    bucketed(tensors, BUCKET_ELEMS, |flat| comm.broadcast_f32(flat, root))
        .context("broadcast of the weights")
}

/// Every rank takes rank 0's values of `vars` ([`broadcast`]; rank 0's
/// stay as they are).
pub fn share_lead(comm: &dyn Communicator, vars: &[&Var]) -> anyhow::Result<()> {
    if comm.world() > 1 {
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let shared = broadcast(comm, &ts, 0)?;
        if comm.rank() != 0 {
            for (v, t) in vars.iter().zip(shared) {
                v.set(&t)?;
            }
        }
    }
    Ok(())
}

/// Packs consecutive tensors into f32 buckets of at most `limit` elements
/// (or one tensor, if larger), applies `f` to each and
/// unpacks the result into tensors of the inputs' shapes and dtypes.
fn bucketed(
    tensors: &[Tensor],
    limit: usize,
    mut f: impl FnMut(&Tensor) -> anyhow::Result<Tensor>,
) -> anyhow::Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(tensors.len());
    let mut start = 0;
    while start < tensors.len() {
        let mut end = start;
        let mut elems = 0;
        while end < tensors.len() && (end == start || elems + tensors[end].elem_count() <= limit) {
            elems += tensors[end].elem_count();
            end += 1;
        }
        let flat = tensors[start..end]
            .iter()
            .map(|t| t.to_dtype(DType::F32)?.flatten_all())
            .collect::<candle_core::Result<Vec<_>>>()?;
        let flat = Tensor::cat(&flat, 0)?;
        let reduced = f(&flat)?;
        anyhow::ensure!(
            reduced.elem_count() == elems,
            "a collective returned {} values for {elems}",
            reduced.elem_count()
        );
        let mut at = 0;
        for t in &tensors[start..end] {
            let n = t.elem_count();
            out.push(
                reduced
                    .narrow(0, at, n)?
                    .reshape(t.shape())?
                    .to_dtype(t.dtype())?,
            );
            at += n;
        }
        start = end;
    }
    Ok(out)
}

/// A digest of `tensors`' values (their bytes as f32, in order): equal on
/// two ranks when they hold the same weights.
pub fn digest(tensors: &[Tensor]) -> anyhow::Result<[u8; 32]> {
    let mut h = Sha256::new();
    for t in tensors {
        for v in t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()? {
            h.update(v.to_le_bytes());
        }
    }
    Ok(h.finalize().into())
}

/// Fails, naming the ranks, unless every rank holds the same `tensors`
/// (compared by [`digest`]; the first 48 bits travel, exactly as f64).
pub fn check_in_sync(comm: &dyn Communicator, tensors: &[Tensor]) -> anyhow::Result<()> {
    if comm.world() == 1 {
        return Ok(());
    }
    let d = digest(tensors)?;
    let mut key = [0u8; 8];
    key[..6].copy_from_slice(&d[..6]);
    let mine = u64::from_le_bytes(key) as f64;
    let all = comm.all_gather_f64(&[mine])?;
    let differ: Vec<usize> = (1..all.len()).filter(|&r| all[r][0] != all[0][0]).collect();
    anyhow::ensure!(
        differ.is_empty(),
        "the weights of rank(s) {differ:?} differ from rank 0's: the ranks no longer train the same model\nhint: this is a bug; rerun with --num_gpus 1 and report it"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn buckets_keep_shapes_dtypes_and_order() {
        let dev = Device::Cpu;
        let ts = vec![
            Tensor::arange(0f32, 6.0, &dev)
                .unwrap()
                .reshape((2, 3))
                .unwrap(),
            Tensor::new(&[7f32], &dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap(),
            Tensor::arange(0f32, 4.0, &dev).unwrap(),
        ];
        let mut calls = 0;
        let doubled = bucketed(&ts, 7, |f| {
            calls += 1;
            Ok((f * 2.0)?)
        })
        .unwrap();
        assert_eq!(calls, 2, "6 + 1 elements, then 4");
        assert_eq!(doubled[0].dims(), &[2, 3]);
        assert_eq!(doubled[1].dtype(), DType::BF16);
        assert_eq!(
            doubled[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            [0., 2., 4., 6., 8., 10.]
        );
        assert_eq!(doubled[2].to_vec1::<f32>().unwrap(), [0., 2., 4., 6.]);
        // Single is the identity.
        let same = all_reduce_sum(&Single, &ts).unwrap();
        assert_eq!(digest(&same).unwrap(), digest(&ts).unwrap());
        check_in_sync(&Single, &ts).unwrap();
    }
}
