//! The buckets that `generate`'s stats and the eval report count by, so a
//! training mix and an accuracy table speak of the same groups: output
//! lines (1, 2-3, 4-10, 11+) and the difficulty features every record
//! carries (loop depth, program lines, injected prints), and the
//! [`Difficulty`] a record's metadata gives.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How hard an item is, from its record's metadata; `None` where the
/// record does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difficulty {
    /// Deepest loop nesting of the program.
    pub loop_depth: Option<u32>,
    /// Lines of the program (after `ast.unparse`).
    pub lines: Option<u32>,
    /// Debug prints injected (absent for original programs).
    pub injections: Option<u32>,
    /// Lines of the expected output.
    pub output_lines: Option<u32>,
}

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
    /// The feature of [`FEATURES`] called `name`.
    pub fn named(name: &str) -> Option<Feature> {
        FEATURES.iter().copied().find(|f| f.name == name)
    }

    /// The feature called `name`, or what the features are.
    pub fn parse(name: &str) -> Result<Feature, String> {
        Self::named(name).ok_or_else(|| {
            let names: Vec<&str> = FEATURES.iter().map(|f| f.name).collect();
            format!(
                "`{name}` is not a feature; the features are {}",
                names.join(", ")
            )
        })
    }

    /// Its buckets up to the one labelled `label`, or what the labels are.
    pub fn up_to(self, label: &str) -> Result<UpToBucket, String> {
        let labels = self.labels();
        let last = labels.iter().position(|l| l == label).ok_or_else(|| {
            format!(
                "`{label}` is not a bucket of {}; its buckets are {}",
                self.name,
                labels.join(", ")
            )
        })?;
        Ok(UpToBucket {
            feature: self,
            last,
        })
    }

    /// The index of `d`'s bucket (0 = the lowest), `None` when its record
    /// lacks the feature.
    pub fn index_of(&self, d: &Difficulty) -> Option<usize> {
        let v = (self.get)(d)?;
        Some(
            self.edges
                .iter()
                .position(|&hi| v <= hi)
                .unwrap_or(self.edges.len()),
        )
    }

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

/// Tasks up to a bucket of one feature: what `rollouts --last_bucket`
/// and `stage3.dpo.last_bucket` admit. A task whose record lacks the
/// feature is admitted, as the curriculum does.
#[derive(Clone, Copy)]
pub struct UpToBucket {
    pub feature: Feature,
    /// The index of the last bucket admitted.
    pub last: usize,
}

/// What is wrong with a bucket cap's settings: its feature, or its last
/// bucket's label.
#[derive(Debug, Clone, PartialEq)]
pub enum CapError {
    Feature(String),
    Bucket(String),
}

impl CapError {
    /// The message after the name of the setting at fault.
    pub fn named(&self, feature_setting: &str, bucket_setting: &str) -> String {
        match self {
            Self::Feature(e) => format!("{feature_setting}: {e}"),
            Self::Bucket(e) => format!("{bucket_setting}: {e}"),
        }
    }
}

impl UpToBucket {
    /// The cap that settings ask for: the feature called `feature` up to
    /// the bucket labelled `last`, `None` without a label. The feature is
    /// checked whether or not a label is given, and a bad one is reported
    /// alone (not again under the label).
    pub fn from_settings(feature: &str, last: Option<&str>) -> Result<Option<Self>, CapError> {
        let f = Feature::parse(feature).map_err(CapError::Feature)?;
        last.map(|label| f.up_to(label))
            .transpose()
            .map_err(CapError::Bucket)
    }

    pub fn admits(&self, d: &Difficulty) -> bool {
        self.feature.index_of(d).is_none_or(|b| b <= self.last)
    }

    /// Whether a task known to print at least `lines` lines is above the
    /// cap whatever else it prints: only a cap on output lines can say (a
    /// feature's buckets rise with its value).
    pub fn rules_out_output_lines(&self, lines: u32) -> bool {
        self.feature.name == OUTPUT_LINES.name
            && !self.admits(&Difficulty {
                output_lines: Some(lines),
                ..Difficulty::default()
            })
    }
}

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
    fn up_to_a_bucket_admits_the_buckets_below_it_and_unrecorded_tasks() {
        let lines = |n| Difficulty {
            output_lines: Some(n),
            ..Difficulty::default()
        };
        let one = Feature::parse("output_lines")
            .and_then(|f| f.up_to("1"))
            .unwrap();
        assert_eq!(
            [0, 1, 2, 3, 11].map(|n| one.admits(&lines(n))),
            [true, true, false, false, false]
        );
        assert!(one.admits(&Difficulty::default()), "no record: admitted");
        let few = Feature::parse("output_lines")
            .and_then(|f| f.up_to("2-3"))
            .unwrap();
        assert!(few.admits(&lines(3)) && !few.admits(&lines(4)));
        // The loops' feature counts by its own buckets.
        let flat = Feature::parse("loop_depth")
            .and_then(|f| f.up_to("0"))
            .unwrap();
        let depth = |n| Difficulty {
            loop_depth: Some(n),
            output_lines: Some(50),
            ..Difficulty::default()
        };
        assert!(flat.admits(&depth(0)) && !flat.admits(&depth(1)));
        // Errors name what is wrong and list what would do.
        let e = Feature::parse("output_lines")
            .and_then(|f| f.up_to("2"))
            .err()
            .unwrap();
        assert!(e.contains("`2`") && e.contains("2-3, 4-10, 11+"), "{e}");
        let e = Feature::parse("colour")
            .and_then(|f| f.up_to("1"))
            .err()
            .unwrap();
        assert!(
            e.contains("`colour`") && e.contains("output_lines, loop_depth"),
            "{e}"
        );
        // Settings: no label, no cap; a bad feature is named as the
        // feature's setting even with a label, a bad label as the label's.
        assert!(
            UpToBucket::from_settings("loop_depth", None)
                .unwrap()
                .is_none()
        );
        let cap = UpToBucket::from_settings("output_lines", Some("1"))
            .unwrap()
            .unwrap();
        assert!(cap.admits(&lines(1)) && !cap.admits(&lines(2)));
        // A lower bound of output lines rules a task out above the cap.
        assert!(!cap.rules_out_output_lines(1) && cap.rules_out_output_lines(2));
        let few = UpToBucket::from_settings("output_lines", Some("2-3"))
            .unwrap()
            .unwrap();
        assert_eq!([3, 4].map(|n| few.rules_out_output_lines(n)), [false, true]);
        // A cap on another feature rules nothing out by output lines.
        let flat = UpToBucket::from_settings("loop_depth", Some("0"))
            .unwrap()
            .unwrap();
        assert!(!flat.rules_out_output_lines(1_000));
        for last in [None, Some("1")] {
            let e = UpToBucket::from_settings("colour", last).err().unwrap();
            let e = e.named("feature", "last_bucket");
            assert!(e.starts_with("feature: `colour`"), "{e}");
        }
        let e = UpToBucket::from_settings("output_lines", Some("2"))
            .err()
            .unwrap();
        assert!(
            e.named("feature", "last_bucket")
                .starts_with("last_bucket: `2`")
        );
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
