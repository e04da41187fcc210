//! [`InProcess`]: ranks as threads of one process, exchanging values
//! through shared memory. It exists to test the data-parallel logic on the
//! CPU (sharding, reductions, the training loop) against a single-process
//! run; real runs use NCCL.
//!
//! Each collective is one round: every rank leaves its values in its slot;
//! the last to arrive publishes all of them and starts the next round.
//! Reductions are summed by each rank in rank order, so every rank gets
//! the same bits. A rank that drops its communicator (its thread ended or
//! failed) makes the others' waiting collectives fail instead of hang.

use std::sync::{Arc, Condvar, Mutex};

use candle_core::Tensor;

use super::Communicator;

/// One rank of a group made by [`InProcess::group`].
pub struct InProcess {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    world: usize,
    round: Mutex<Round>,
    done: Condvar,
    /// The communicators of a split, by world rank, until each rank takes
    /// its own ([`Communicator::split`]).
    split: Mutex<Vec<Option<InProcess>>>,
}

#[derive(Default)]
struct Round {
    /// Rounds completed so far.
    generation: u64,
    slots: Vec<Option<Vec<f64>>>,
    arrived: usize,
    /// The last completed round's values, by rank.
    result: Arc<Vec<Vec<f64>>>,
    /// A rank that left the group (its communicator was dropped).
    left: Option<usize>,
}

impl InProcess {
    /// `world` communicators, one for each rank's thread.
    pub fn group(world: usize) -> Vec<InProcess> {
        assert!(world > 0, "a group has at least one rank");
        let shared = Arc::new(Shared {
            world,
            round: Mutex::new(Round {
                slots: vec![None; world],
                ..Round::default()
            }),
            done: Condvar::new(),
            split: Mutex::new(Vec::new()),
        });
        (0..world)
            .map(|rank| InProcess {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect()
    }

    /// Every rank's `values`, by rank, once all ranks have sent theirs.
    fn exchange(&self, values: Vec<f64>) -> anyhow::Result<Arc<Vec<Vec<f64>>>> {
        let s = &self.shared;
        let mut r = s
            .round
            .lock()
            .map_err(|_| anyhow::anyhow!("a rank panicked during a collective"))?;
        if let Some(gone) = r.left {
            anyhow::bail!(
                "rank {gone} left the group; rank {} cannot continue",
                self.rank
            );
        }
        r.slots[self.rank] = Some(values);
        r.arrived += 1;
        if r.arrived == s.world {
            let all: Vec<Vec<f64>> = r
                .slots
                .iter_mut()
                .map(|v| v.take().unwrap_or_default())
                .collect();
            let lengths: Vec<usize> = all.iter().map(Vec::len).collect();
            r.result = Arc::new(all);
            r.arrived = 0;
            r.generation += 1;
            s.done.notify_all();
            anyhow::ensure!(
                lengths.iter().all(|&n| n == lengths[0]),
                "ranks sent different lengths to one collective: {lengths:?}"
            );
            return Ok(Arc::clone(&r.result));
        }
        let generation = r.generation;
        while r.generation == generation {
            if let Some(gone) = r.left {
                anyhow::bail!(
                    "rank {gone} left the group; rank {} cannot continue",
                    self.rank
                );
            }
            r = s
                .done
                .wait(r)
                .map_err(|_| anyhow::anyhow!("a rank panicked during a collective"))?;
        }
        let lengths: Vec<usize> = r.result.iter().map(Vec::len).collect();
        anyhow::ensure!(
            lengths.iter().all(|&n| n == lengths[0]),
            "ranks sent different lengths to one collective: {lengths:?}"
        );
        Ok(Arc::clone(&r.result))
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Ok(mut r) = self.shared.round.lock() {
            r.left.get_or_insert(self.rank);
            self.shared.done.notify_all();
        }
    }
}

impl Communicator for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_f32(&self, flat: &Tensor) -> anyhow::Result<Tensor> {
        let mine: Vec<f64> = flat.to_vec1::<f32>()?.into_iter().map(f64::from).collect();
        let all = self.exchange(mine)?;
        // Summed in f32, in rank order: what an f32 ring would compute up to
        // the order of the additions.
        let mut sum = vec![0f32; flat.elem_count()];
        for v in all.iter() {
            for (s, x) in sum.iter_mut().zip(v) {
                *s += *x as f32;
            }
        }
        Ok(Tensor::from_vec(sum, flat.elem_count(), flat.device())?)
    }

    fn broadcast_f32(&self, flat: &Tensor, root: usize) -> anyhow::Result<Tensor> {
        anyhow::ensure!(
            root < self.world(),
            "broadcast from rank {root} of {}",
            self.world()
        );
        let mine: Vec<f64> = flat.to_vec1::<f32>()?.into_iter().map(f64::from).collect();
        let all = self.exchange(mine)?;
        let v: Vec<f32> = all[root].iter().map(|&x| x as f32).collect();
        Ok(Tensor::from_vec(v, flat.elem_count(), flat.device())?)
    }

    fn all_gather_f64(&self, values: &[f64]) -> anyhow::Result<Vec<Vec<f64>>> {
        Ok(self.exchange(values.to_vec())?.as_ref().clone())
    }

    /// Rank 0 makes every group's communicators and leaves them by world
    /// rank; each rank takes its own between two barriers.
    fn split(&self, groups: &[Vec<usize>]) -> anyhow::Result<Box<dyn Communicator>> {
        super::place_in(groups, self.rank, self.world())?;
        let lock = || {
            self.shared
                .split
                .lock()
                .map_err(|_| anyhow::anyhow!("a rank panicked during a split"))
        };
        if self.rank == 0 {
            let mut made: Vec<Option<InProcess>> = (0..self.world()).map(|_| None).collect();
            for members in groups {
                for (c, &r) in InProcess::group(members.len()).into_iter().zip(members) {
                    made[r] = Some(c);
                }
            }
            *lock()? = made;
        }
        self.barrier()?;
        let mine = lock()?[self.rank].take();
        self.barrier()?;
        Ok(Box::new(
            mine.expect("rank 0 made a communicator for every rank"),
        ))
    }
}

/// Runs `f(rank's communicator)` on `world` threads and returns the
/// results by rank; the first error (by rank) if any rank failed.
pub fn run_ranks<T: Send>(
    world: usize,
    f: impl Fn(InProcess) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let comms = InProcess::group(world);
    let results: Vec<anyhow::Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(c))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("rank {rank} panicked")))
            })
            .collect()
    });
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.map_err(|e| e.context(format!("rank {rank}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn collectives_agree_on_every_rank() {
        let out = run_ranks(3, |c| {
            let r = c.rank() as f32;
            let t = Tensor::new(&[r, 10.0 * r], &Device::Cpu)?;
            let sum = c.all_reduce_f32(&t)?.to_vec1::<f32>()?;
            let b = c.broadcast_f32(&t, 2)?.to_vec1::<f32>()?;
            let s = c.sum_f64(&[1.0, r as f64])?;
            let g = c.all_gather_f64(&[r as f64])?;
            c.barrier()?;
            Ok((sum, b, s, g))
        })
        .unwrap();
        for (sum, b, s, g) in out {
            assert_eq!(sum, [3.0, 30.0]);
            assert_eq!(b, [2.0, 20.0]);
            assert_eq!(s, [3.0, 3.0]);
            assert_eq!(g, [[0.0], [1.0], [2.0]]);
        }
    }

    #[test]
    fn a_split_gives_each_group_its_own_collectives() {
        let groups = vec![vec![2, 0], vec![1], vec![3]];
        let out = run_ranks(4, |c| {
            let sub = c.split(&groups)?;
            // Rank 2 is the first of its group: its values come first.
            let g = sub.all_gather_f64(&[c.rank() as f64])?;
            Ok((sub.rank(), sub.world(), g))
        })
        .unwrap();
        assert_eq!(out[0], (1, 2, vec![vec![2.0], vec![0.0]]));
        assert_eq!(out[2], (0, 2, vec![vec![2.0], vec![0.0]]));
        assert_eq!(out[1], (0, 1, vec![vec![1.0]]));
        assert_eq!(out[3], (0, 1, vec![vec![3.0]]));
        for bad in [vec![vec![0, 1]], vec![vec![0, 1, 2], vec![2, 3]]] {
            let err = run_ranks(4, |c| c.split(&bad).map(|_| ())).unwrap_err();
            assert!(format!("{err:#}").contains("ranks"), "{err:#}");
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others_instead_of_hanging() {
        let err = run_ranks(2, |c| {
            if c.rank() == 1 {
                anyhow::bail!("rank 1 broke");
            }
            c.barrier()?;
            Ok(())
        })
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("rank 0") && text.contains("left the group"),
            "{text}"
        );
    }
}
