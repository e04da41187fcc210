//! Which examples of an optimizer step each rank computes.
//!
//! A step is the same global batch whatever the number of ranks: the
//! `gradient_accumulation_steps` micro-batches the batcher plans. When the
//! ranks divide the micro-batches evenly, rank r takes micro-batches
//! r, r + world, ... whole, so each keeps the single-GPU micro-batch size and
//! dropout masks (keyed by the micro-batch's index in the step) are those of
//! a one-GPU run. Otherwise (fewer micro-batches than ranks, or an epoch's
//! shorter last step) every micro-batch's rows are cut into `world`
//! contiguous slices (rows of a micro-batch have similar lengths, so each
//! slice is padded little) and rank r takes slice r of each.
//!
//! The loss stays the single-GPU one: every rank divides its summed
//! cross-entropy by the step's global answer-token count, and the gradients
//! are summed over ranks.

/// One piece of a step that a rank computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The micro-batch's index within the step.
    pub micro: usize,
    /// `None` for a whole micro-batch; `Some(s)` for its `s`-th row slice.
    pub slice: Option<usize>,
    /// Example indices, in the micro-batch's row order.
    pub rows: Vec<usize>,
}

/// Rank `rank`'s parts of a step whose micro-batches are `micro` (example
/// indices each). Over all ranks the parts hold every row exactly once.
pub fn split_step(micro: &[Vec<usize>], world: usize, rank: usize) -> Vec<Part> {
    assert!(rank < world, "rank {rank} of {world}");
    if micro.len().is_multiple_of(world) {
        return micro
            .iter()
            .enumerate()
            .filter(|(i, _)| i % world == rank)
            .map(|(i, rows)| Part {
                micro: i,
                slice: None,
                rows: rows.clone(),
            })
            .collect();
    }
    micro
        .iter()
        .enumerate()
        .filter_map(|(i, rows)| {
            let (lo, hi) = slice_bounds(rows.len(), world, rank);
            (lo < hi).then(|| Part {
                micro: i,
                slice: Some(rank),
                rows: rows[lo..hi].to_vec(),
            })
        })
        .collect()
}

/// The `[lo, hi)` of slice `k` of `n` items cut into `parts` near-equal
/// contiguous slices (the first `n % parts` one longer).
pub fn slice_bounds(n: usize, parts: usize, k: usize) -> (usize, usize) {
    let base = n / parts;
    let extra = n % parts;
    let lo = k * base + k.min(extra);
    (lo, lo + base + usize::from(k < extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(sizes: &[usize]) -> Vec<Vec<usize>> {
        let mut next = 0;
        sizes
            .iter()
            .map(|&n| {
                let v: Vec<usize> = (next..next + n).collect();
                next += n;
                v
            })
            .collect()
    }

    fn all_rows(micro: &[Vec<usize>], world: usize) -> Vec<usize> {
        let mut rows: Vec<usize> = (0..world)
            .flat_map(|r| split_step(micro, world, r))
            .flat_map(|p| p.rows)
            .collect();
        rows.sort();
        rows
    }

    #[test]
    fn every_row_once_whatever_the_world() {
        for sizes in [
            &[4, 4, 4, 4][..],
            &[4, 4, 3],
            &[4],
            &[2, 1],
            &[5, 5, 5, 5, 5, 5],
        ] {
            let micro = step(sizes);
            let n: usize = sizes.iter().sum();
            for world in 1..=5 {
                assert_eq!(
                    all_rows(&micro, world),
                    (0..n).collect::<Vec<_>>(),
                    "{sizes:?} on {world}"
                );
            }
        }
    }

    #[test]
    fn whole_micro_batches_when_they_divide() {
        let micro = step(&[4, 4, 4, 4]);
        let p = split_step(&micro, 2, 1);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].micro, p[0].slice, p[1].micro), (1, None, 3));
        assert_eq!(p[0].rows, micro[1]);
        // One rank: the step unchanged.
        let one = split_step(&micro, 1, 0);
        assert_eq!(
            one.iter().map(|p| p.rows.clone()).collect::<Vec<_>>(),
            micro
        );
    }

    #[test]
    fn rows_are_sliced_when_they_do_not() {
        let micro = step(&[4]);
        let p: Vec<Vec<usize>> = (0..3)
            .map(|r| split_step(&micro, 3, r)[0].rows.clone())
            .collect();
        assert_eq!(p, [vec![0, 1], vec![2], vec![3]]);
        assert_eq!(slice_bounds(10, 4, 3), (8, 10));
        // More ranks than rows: the extra ranks get nothing.
        assert!(split_step(&step(&[1]), 2, 1).is_empty());
    }
}
