//! The buckets that `generate`'s stats and the eval report count by, so a
//! training mix and an accuracy table speak of the same groups: output
//! lines (1, 2-3, 4-10, 11+) and the difficulty features every record
//! carries (loop depth, program lines, injected prints).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Difficulty;

/// The label of items whose record does not give the feature (an original
/// program has no injection count). It sorts after every range.
pub const NOT_RECORDED: &str = "n/a";

/// A feature the reports break down by: its name, how to read it from a
/// [`Difficulty`], and the upper bounds of its buckets.
#[derive(Clone, Copy)]
pub struct Feature {
    pub name: &'static str,
    pub get: fn(&Difficulty) -> Option<u32>,
    /// Inclusive upper bounds; values above the last form an open bucket.
    pub edges: &'static [u32],
}

impl Feature {
    /// The label of every bucket, easiest first (`"0"`, `"1"`, `"2-3"`, ...).
    pub fn labels(&self) -> Vec<String> {
        (0..=self.edges.len())
            .map(|i| {
                let lowest = if i == 0 { 0 } else { self.edges[i - 1] + 1 };
                bucket(Some(lowest), self.edges).1
            })
            .collect()
    }
}

/// Output lines: `0` (only when empty outputs are kept), `1`, `2-3`,
/// `4-10`, `11+`.
pub const OUTPUT_LINES: Feature = Feature {
    name: "output_lines",
    get: |d| d.output_lines,
    edges: &[0, 1, 3, 10],
};

/// Every feature, output lines first.
pub const FEATURES: [Feature; 4] = [
    OUTPUT_LINES,
    Feature {
        name: "loop_depth",
        get: |d| d.loop_depth,
        edges: &[0, 1, 2],
    },
    Feature {
        name: "lines",
        get: |d| d.lines,
        edges: &[10, 20, 40, 80],
    },
    Feature {
        name: "injections",
        get: |d| d.injections,
        edges: &[0, 1, 2, 3, 4, 5],
    },
];

/// The bucket of `value` under upper bounds `edges`: its sort key and label
/// (`"3"`, `"4-10"`, `"11+"`, or [`NOT_RECORDED`]).
pub fn bucket(value: Option<u32>, edges: &[u32]) -> (u32, String) {
    let Some(value) = value else {
        return (u32::MAX, NOT_RECORDED.into());
    };
    let mut lo = 0;
    for &hi in edges {
        if value <= hi {
            let label = if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            };
            return (lo, label);
        }
        lo = hi + 1;
    }
    (lo, format!("{lo}+"))
}

/// A bucket's label and how many items it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketCount {
    pub bucket: String,
    pub n: u64,
}

/// Counts items by bucket of every [`FEATURES`] entry.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    by: BTreeMap<&'static str, BTreeMap<u32, (String, u64)>>,
}

impl Tally {
    pub fn add(&mut self, d: &Difficulty) {
        for f in FEATURES {
            let (key, label) = bucket((f.get)(d), f.edges);
            self.by
                .entry(f.name)
                .or_default()
                .entry(key)
                .or_insert((label, 0))
                .1 += 1;
        }
    }

    /// Feature name → its buckets in increasing order (only those holding
    /// items).
    pub fn counts(&self) -> BTreeMap<String, Vec<BucketCount>> {
        self.by
            .iter()
            .map(|(name, groups)| {
                let v = groups
                    .values()
                    .map(|(bucket, n)| BucketCount {
                        bucket: bucket.clone(),
                        n: *n,
                    })
                    .collect();
                ((*name).to_owned(), v)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_line_buckets_are_the_documented_ones() {
        let label = |v| bucket(Some(v), OUTPUT_LINES.edges).1;
        assert_eq!(
            [0, 1, 2, 3, 4, 10, 11, 500].map(label),
            ["0", "1", "2-3", "2-3", "4-10", "4-10", "11+", "11+"]
        );
        assert_eq!(bucket(None, OUTPUT_LINES.edges).1, NOT_RECORDED);
    }

    #[test]
    fn buckets_are_ranges_in_numeric_order() {
        let edges = [10, 20, 40];
        assert_eq!(bucket(Some(0), &edges), (0, "0-10".into()));
        assert_eq!(bucket(Some(10), &edges), (0, "0-10".into()));
        assert_eq!(bucket(Some(11), &edges), (11, "11-20".into()));
        assert_eq!(bucket(Some(41), &edges), (41, "41+".into()));
        assert_eq!(bucket(Some(3), &[]), (0, "0+".into()));
        assert!(bucket(None, &edges).0 > bucket(Some(u32::MAX - 1), &edges).0);
    }

    #[test]
    fn a_tally_counts_every_item_once_per_feature() {
        let mut t = Tally::default();
        for i in 0..12u32 {
            t.add(&Difficulty {
                loop_depth: Some(i % 4),
                lines: Some(3 * i),
                injections: (i % 2 == 0).then_some(i / 2),
                output_lines: Some(i + 1),
            });
        }
        let c = t.counts();
        for f in FEATURES {
            assert_eq!(c[f.name].iter().map(|b| b.n).sum::<u64>(), 12, "{}", f.name);
        }
        let labels: Vec<(&str, u64)> = c["output_lines"]
            .iter()
            .map(|b| (b.bucket.as_str(), b.n))
            .collect();
        assert_eq!(labels, [("1", 1), ("2-3", 2), ("4-10", 7), ("11+", 2)]);
        assert_eq!(c["loop_depth"].last().unwrap().bucket, "3+");
        assert_eq!(c["injections"].last().unwrap().bucket, NOT_RECORDED);
    }
}
