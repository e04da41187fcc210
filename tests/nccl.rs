//! The NCCL communicator on the GPUs of this machine (`cargo test --features
//! cuda --test nccl`): one thread a GPU (two at most; one GPU makes a group
//! of one, which still goes through NCCL), each with its own communicator,
//! against the sums computed on the host. Without a device each test prints
//! SKIPPED (libnccl.so.2 must be on the loader path: see docs/GPU.md).
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use trace_train::dist::nccl::{Nccl, unique_id_hex};
use trace_train::dist::{self, Communicator};

/// One rank's results: all-reduce, broadcast, scalar sums, and samples
/// (first, second, last value) of each bucketed all-reduced tensor.
type RankResults = (Vec<f32>, Vec<f32>, Vec<f64>, Vec<Vec<f32>>);

#[test]
fn collectives_and_bucketed_all_reduce_on_the_gpus() {
    let world = dist::visible_gpus().min(2);
    if world == 0 {
        eprintln!("SKIPPED: no CUDA device");
        return;
    }
    let id = unique_id_hex().unwrap();
    let results: Vec<RankResults> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let id = id.clone();
                s.spawn(move || {
                    let dev = Device::new_cuda(rank).unwrap();
                    let c = Nccl::new(&dev, rank, world, &id).unwrap();
                    assert_eq!((c.rank(), c.world()), (rank, world));
                    let r = rank as f32;
                    let t = Tensor::new(&[r + 1.0, 10.0 * r], &dev).unwrap();
                    let sum = c.all_reduce_f32(&t).unwrap().to_vec1::<f32>().unwrap();
                    let b = c
                        .broadcast_f32(&t, world - 1)
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap();
                    let s = c.sum_f64(&[1.0, rank as f64]).unwrap();
                    c.barrier().unwrap();
                    // Many tensors of mixed dtypes and shapes, larger than a
                    // bucket in all.
                    let ts: Vec<Tensor> = (0..5)
                        .map(|k| {
                            let n = if k == 2 {
                                dist::BUCKET_ELEMS + 3
                            } else {
                                1000 * (k + 1)
                            };
                            let t = (Tensor::arange(0f32, n as f32, &dev).unwrap()
                                * (r + 1.0) as f64)
                                .unwrap();
                            if k == 1 {
                                t.to_dtype(DType::BF16).unwrap()
                            } else {
                                t
                            }
                        })
                        .collect();
                    let red = dist::all_reduce_sum(&c, &ts).unwrap();
                    let samples: Vec<Vec<f32>> = red
                        .iter()
                        .map(|t| {
                            assert_eq!(t.device().location(), dev.location());
                            let v = t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
                            vec![v[0], v[1], v[v.len() - 1]]
                        })
                        .collect();
                    dist::check_in_sync(&c, &red).unwrap();
                    (sum, b, s, samples)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let w = world as f32;
    let scale = w * (w + 1.0) / 2.0; // sum over ranks of (rank + 1)
    for (sum, b, s, samples) in results {
        assert_eq!(sum, [scale, 10.0 * (w - 1.0) * w / 2.0]);
        assert_eq!(b, [w, 10.0 * (w - 1.0)]);
        assert_eq!(s, [world as f64, ((world - 1) * world / 2) as f64]);
        for (k, v) in samples.iter().enumerate() {
            let n = if k == 2 {
                dist::BUCKET_ELEMS + 3
            } else {
                1000 * (k + 1)
            };
            let last = (n - 1) as f32 * scale;
            let tol = if k == 1 { 1e-2 * last } else { 1e-6 * last };
            assert_eq!(v[0], 0.0);
            assert_eq!(v[1], scale);
            assert!((v[2] - last).abs() <= tol, "tensor {k}: {} vs {last}", v[2]);
        }
    }
}

/// One rank's view of a split: its place and group size, the group's sum,
/// the broadcast from the group's first member, and its own sum alone.
type SplitResults = (usize, usize, Vec<f32>, Vec<f32>, Vec<f32>);

/// `Communicator::split` on the GPUs (two to four): the world as two groups
/// when there are four (the odd ranks from the last down, the even ones;
/// one group in the other order with two), each group its own NCCL
/// communicator with the ids handed out over the world's; then as groups
/// of one. Sums and a broadcast from the group's first member, against the
/// host's.
#[test]
fn split_groups_on_the_gpus() {
    let world = dist::visible_gpus().min(4);
    if world < 2 {
        eprintln!("SKIPPED: fewer than two CUDA devices");
        return;
    }
    let groups: Vec<Vec<usize>> = if world == 4 {
        vec![vec![3, 1], vec![0, 2]]
    } else {
        vec![(0..world).rev().collect()]
    };
    let id = unique_id_hex().unwrap();
    let results: Vec<SplitResults> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (id, groups) = (id.clone(), groups.clone());
                s.spawn(move || {
                    let dev = Device::new_cuda(rank).unwrap();
                    let all = Nccl::new(&dev, rank, world, &id).unwrap();
                    let t = Tensor::new(&[rank as f32 + 1.0, 5.0], &dev).unwrap();
                    let mine = all.split(&groups).unwrap();
                    let sum = mine.all_reduce_f32(&t).unwrap().to_vec1::<f32>().unwrap();
                    let first = mine.broadcast_f32(&t, 0).unwrap().to_vec1::<f32>().unwrap();
                    let ones: Vec<Vec<usize>> = (0..world).map(|r| vec![r]).collect();
                    let alone = all.split(&ones).unwrap();
                    assert_eq!((alone.rank(), alone.world()), (0, 1));
                    let own = alone.all_reduce_f32(&t).unwrap().to_vec1::<f32>().unwrap();
                    (mine.rank(), mine.world(), sum, first, own)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (place, members, sum, first, own)) in results.into_iter().enumerate() {
        let group = groups.iter().find(|g| g.contains(&rank)).unwrap();
        let at = group.iter().position(|&r| r == rank).unwrap();
        assert_eq!((place, members), (at, group.len()), "world rank {rank}");
        let total: f32 = group.iter().map(|&r| r as f32 + 1.0).sum();
        assert_eq!(sum, [total, 5.0 * group.len() as f32], "world rank {rank}");
        assert_eq!(first, [group[0] as f32 + 1.0, 5.0], "world rank {rank}");
        assert_eq!(own, [rank as f32 + 1.0, 5.0]);
    }
}
