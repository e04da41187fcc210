//! The curriculum: tasks from one difficulty bucket at a time, easiest
//! first (Bengio et al. 2009, "Curriculum Learning"), the next bucket once
//! the rolling accuracy over the last `window` scored completions reaches
//! `promotion_threshold`.
//!
//! Buckets are those of one feature `generate` records and the eval report
//! counts by ([`crate::data::buckets::FEATURES`]: output lines 1, 2-3,
//! 4-10, 11+; loop depth; program lines; injected prints). Start: the
//! easiest bucket that has tasks at all. The curriculum counts the buckets
//! of every draw; once [`PROBE`] draws have been seen and none fell in the
//! current bucket, it is passed over for the easiest bucket above it that
//! has been drawn (so the empty `0` output-line bucket, or a bucket no
//! program of the dataset falls in, cannot stall the run). Tasks whose
//! record lacks the feature belong to every level. `last_bucket` caps the
//! levels: training stays on the buckets up to it. The whole state is plain
//! data, saved with each checkpoint, so a resumed run picks the same tasks.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::CurriculumConfig;
use crate::data::buckets::Difficulty;
use crate::data::buckets::{FEATURES, Feature};

/// Draws seen before a bucket none of them fell in is taken as empty.
pub const PROBE: u64 = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curriculum {
    pub enabled: bool,
    pub feature: String,
    pub threshold: f64,
    pub window: usize,
    /// Index of the current bucket (0 = easiest).
    pub level: usize,
    /// Rewards of the latest scored completions at this level, oldest first.
    pub recent: VecDeque<f64>,
    /// Draws seen in each bucket.
    pub seen: Vec<u64>,
    /// `(step, from, to, why)` for every change of level.
    pub history: Vec<(u64, usize, usize, String)>,
    /// The hardest level opened (the index of `last_bucket`); none: all.
    #[serde(default)]
    pub last: Option<usize>,
}

impl Curriculum {
    pub fn new(cfg: &CurriculumConfig) -> Self {
        let mut c = Self {
            enabled: cfg.enabled,
            feature: cfg.feature.clone(),
            threshold: cfg.promotion_threshold,
            window: cfg.window,
            level: 0,
            recent: VecDeque::new(),
            seen: Vec::new(),
            history: Vec::new(),
            last: None,
        };
        c.last = cfg
            .last_bucket
            .as_ref()
            .and_then(|label| c.spec().labels().iter().position(|l| l == label));
        c
    }

    /// Whether level `l` may be opened.
    fn open(&self, l: usize) -> bool {
        self.last.is_none_or(|last| l <= last)
    }

    fn spec(&self) -> Feature {
        Feature::named(&self.feature).unwrap_or(FEATURES[0])
    }

    /// Buckets of the feature: one per edge, plus the open one above.
    pub fn levels(&self) -> usize {
        self.spec().edges.len() + 1
    }

    /// The bucket index of a task, `None` when its record lacks the feature.
    pub fn bucket_of(&self, d: &Difficulty) -> Option<usize> {
        self.spec().index_of(d)
    }

    /// The label of bucket `index` (`"1"`, `"2-3"`, `"11+"`).
    pub fn label(&self, index: usize) -> String {
        let labels = self.spec().labels();
        labels[index.min(labels.len() - 1)].clone()
    }

    /// Whether a drawn task is admitted now; counts the draw towards
    /// passing over an empty bucket (`step` dates the change).
    pub fn admits(&mut self, d: &Difficulty, step: u64) -> bool {
        if !self.enabled {
            return true;
        }
        let Some(b) = self.bucket_of(d) else {
            return true;
        };
        self.seen.resize(self.levels(), 0);
        self.seen[b] += 1;
        if self.seen[self.level] == 0 && self.seen.iter().sum::<u64>() >= PROBE {
            // The easiest drawn bucket above, else the hardest below (the
            // level was promoted past the hardest bucket the data has).
            let above = (self.level + 1..self.levels()).find(|&l| self.seen[l] > 0 && self.open(l));
            let below = (0..self.level).rev().find(|&l| self.seen[l] > 0);
            if let Some(to) = above.or(below) {
                self.change(step, to, "empty");
            }
        }
        b == self.level
    }

    /// The bucket a promotion opens: the easiest drawn one above the
    /// current level; the next one while too few draws have been seen to
    /// know; none when the data has nothing harder.
    fn next_level(&self) -> Option<usize> {
        let drawn = |l: usize| self.seen.get(l).copied().unwrap_or(0) > 0;
        let above = (self.level + 1..self.levels()).find(|&l| drawn(l) && self.open(l));
        if above.is_some() || self.seen.iter().sum::<u64>() >= PROBE {
            above
        } else {
            (self.level + 1 < self.levels() && self.open(self.level + 1)).then_some(self.level + 1)
        }
    }

    /// Records the rewards of completions scored at the current level; opens
    /// the next bucket when the window is full and its mean reaches the
    /// threshold. Returns whether it did.
    pub fn record(&mut self, rewards: &[f64], step: u64) -> bool {
        if !self.enabled {
            return false;
        }
        for &r in rewards {
            self.recent.push_back(r);
            while self.recent.len() > self.window {
                self.recent.pop_front();
            }
        }
        if self.recent.len() == self.window
            && self.accuracy() >= self.threshold
            && let Some(to) = self.next_level()
        {
            let acc = self.accuracy();
            self.change(step, to, &format!("accuracy {acc:.3}"));
            return true;
        }
        false
    }

    /// Mean reward over the window (0 when empty).
    pub fn accuracy(&self) -> f64 {
        if self.recent.is_empty() {
            0.0
        } else {
            self.recent.iter().sum::<f64>() / self.recent.len() as f64
        }
    }

    fn change(&mut self, step: u64, to: usize, why: &str) {
        self.history.push((step, self.level, to, why.to_owned()));
        self.level = to;
        self.recent.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: u32) -> Difficulty {
        Difficulty {
            output_lines: Some(n),
            ..Default::default()
        }
    }

    fn cfg(window: usize) -> CurriculumConfig {
        CurriculumConfig {
            enabled: true,
            promotion_threshold: 0.7,
            window,
            feature: "output_lines".into(),
            last_bucket: None,
        }
    }

    #[test]
    fn buckets_and_labels_follow_the_report() {
        let c = Curriculum::new(&cfg(4));
        assert_eq!(c.levels(), 5);
        let idx: Vec<_> = [0, 1, 2, 3, 4, 10, 11]
            .map(|n| c.bucket_of(&lines(n)).unwrap())
            .to_vec();
        assert_eq!(idx, [0, 1, 2, 2, 3, 3, 4]);
        assert_eq!(
            (0..5).map(|i| c.label(i)).collect::<Vec<_>>(),
            ["0", "1", "2-3", "4-10", "11+"]
        );
        assert_eq!(c.spec().labels(), ["0", "1", "2-3", "4-10", "11+"]);
        assert_eq!(c.bucket_of(&Difficulty::default()), None);
    }

    #[test]
    fn promotes_when_the_full_window_passes_the_threshold() {
        let mut c = Curriculum::new(&cfg(4));
        c.level = 1;
        assert!(c.admits(&lines(1), 0) && !c.admits(&lines(2), 0));
        assert!(
            c.admits(&Difficulty::default(), 0),
            "no feature: every level"
        );
        // 3 of 4 = 0.75 but the window is not full until the 4th.
        assert!(!c.record(&[1.0, 1.0, 1.0], 5));
        assert!(!c.record(&[0.0, 0.0], 6), "window 1,1,0,0 = 0.5");
        assert!(!c.record(&[1.0, 1.0], 7), "window 0,0,1,1 = 0.5");
        assert!(c.record(&[1.0], 8), "window 0,1,1,1 = 0.75");
        assert_eq!(c.level, 2);
        assert!(c.recent.is_empty());
        assert_eq!(c.history, vec![(8, 1, 2, "accuracy 0.750".into())]);
        // The state round-trips through JSON (checkpoints).
        let back: Curriculum = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn an_empty_bucket_is_passed_over_for_the_easiest_drawn_one() {
        let mut c = Curriculum::new(&cfg(4));
        // Level 0 (no output) never comes up; buckets 2 and 4 do.
        for i in 0..PROBE - 1 {
            assert!(!c.admits(&lines(if i % 2 == 0 { 2 } else { 12 }), 3));
        }
        assert_eq!(c.level, 0);
        // The probe's last draw moves the level to bucket 2 and is admitted.
        assert!(c.admits(&lines(3), 3));
        assert_eq!(c.level, 2);
        assert_eq!(c.history, vec![(3, 0, 2, "empty".into())]);
        assert!(!c.admits(&lines(1), 4));
        // Nothing harder than bucket 4 was drawn: a promotion from it is
        // not possible, and a level past the data falls back.
        c.level = 4;
        assert!(!c.record(&[1.0; 4], 5));
        assert_eq!(c.level, 4);
        c.level = 3;
        c.seen[3] = 0;
        assert!(c.record(&[1.0; 4], 6));
        assert_eq!(c.level, 4);
        c.seen = vec![0, 5, 70, 0, 0];
        c.level = 4;
        assert!(c.admits(&lines(3), 7));
        assert_eq!(c.level, 2, "falls back to the hardest drawn bucket");
    }

    #[test]
    fn the_last_bucket_caps_promotion() {
        let mut c = Curriculum::new(&CurriculumConfig {
            last_bucket: Some("2-3".into()),
            ..cfg(2)
        });
        assert_eq!(c.last, Some(2));
        c.level = 1;
        for n in [1, 2, 5, 12] {
            c.admits(&lines(n), 0);
        }
        assert!(c.record(&[1.0, 1.0], 1), "1 -> 2-3");
        assert_eq!(c.level, 2);
        assert!(!c.record(&[1.0, 1.0, 1.0], 2), "2-3 is the last bucket");
        assert_eq!(c.level, 2);
        assert!(!c.admits(&lines(5), 3), "4-10 stays closed");
        // An old checkpoint's state (no cap) still reads.
        let mut v = serde_json::to_value(&c).unwrap();
        v.as_object_mut().unwrap().remove("last");
        let old: Curriculum = serde_json::from_value(v).unwrap();
        assert_eq!(old.last, None);
        // A label the feature does not have is refused by the config check.
        let bad = CurriculumConfig {
            last_bucket: Some("2-4".into()),
            ..cfg(2)
        };
        let problems = crate::config::Validate::problems(&bad);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("last_bucket") && p.contains("2-3")),
            "{problems:?}"
        );
    }

    #[test]
    fn disabled_admits_everything_and_never_moves() {
        let mut c = Curriculum::new(&CurriculumConfig::default());
        assert!(c.admits(&lines(50), 0));
        assert!(!c.record(&[1.0; 100], 0));
        assert_eq!(c.level, 0);
    }
}
