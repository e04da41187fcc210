//! Stage 0's settings (`config/generate.json`, the pipeline's `stage0`).

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;

/// How variant seeds are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SeedScheme {
    /// The environment's: task_id in [0, 10^6), row = task_id mod N,
    /// seed = task_id. Variant v of row r has seed r + v*N.
    Env,
    /// The peer pipeline's: seed = row * 1000 + variant.
    Peer,
}

impl SeedScheme {
    /// Seed of variant `variant` of row `row` in a dataset of `rows` rows.
    pub fn seed(self, row: u64, variant: u64, rows: u64) -> u64 {
        match self {
            SeedScheme::Env => row + variant * rows.max(1),
            SeedScheme::Peer => row * 1000 + variant,
        }
    }
}

/// Which rows are kept for training (the peer pipeline's filters, with the
/// line-count limits set per stage).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Filters {
    /// Longest program source in characters. Default 10000.
    pub max_source_chars: usize,
    /// Longest expected output in characters. Default 5000.
    pub max_output_chars: usize,
    /// The older spelling of `transformed.min_output_lines`, still read so
    /// that older config files load; when present it sets the transformed
    /// set's minimum (the original set keeps its own). Default absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_output_lines: Option<usize>,
    /// Output-line limits of the original programs (Stage 1). Default: every
    /// length (at least 1 line, no maximum).
    pub original: LineFilter,
    /// Output-line limits of the transformed programs (Stage 2). Default:
    /// every length (at least 1 line, no maximum), as the environment asks
    /// them.
    pub transformed: LineFilter,
    /// Drop runs that wrote anything on stderr. Default true.
    pub drop_stderr: bool,
    /// Drop empty outputs. Default true.
    pub drop_empty: bool,
    /// Drop transformed programs whose output has no `__DBG_` line (the
    /// injected prints never ran). Default false: the environment asks such
    /// tasks too, and without them no Stage 2 answer has a single line, so
    /// Stage 2 teaches a model to write more than one (docs/BENCHMARKS.md,
    /// "Fourth run"). The peer pipeline's filter sets it.
    pub require_dbg: bool,
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            max_source_chars: 10_000,
            max_output_chars: 5_000,
            min_output_lines: None,
            original: LineFilter::default(),
            transformed: LineFilter::default(),
            drop_stderr: true,
            drop_empty: true,
            require_dbg: false,
        }
    }
}

impl Filters {
    /// The line limits in force for one stage's set (`transformed` or not),
    /// with the older `min_output_lines` applied.
    pub fn lines(&self, transformed: bool) -> LineFilter {
        if transformed {
            let mut f = self.transformed;
            if let Some(min) = self.min_output_lines {
                f.min_output_lines = min;
            }
            f
        } else {
            self.original
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (name, f) in [
            ("original", self.original),
            ("transformed", self.lines(true)),
        ] {
            if let Some(max) = f.max_output_lines
                && max < f.min_output_lines
            {
                p.push(format!(
                    "filters.{name}: max_output_lines {max} is below min_output_lines {}",
                    f.min_output_lines
                ));
            }
        }
        p
    }
}

/// How many lines a kept output may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LineFilter {
    /// Fewest output lines. Default 1 (every non-empty output).
    pub min_output_lines: usize,
    /// Most output lines (null: no limit). Default null.
    pub max_output_lines: Option<usize>,
}

impl Default for LineFilter {
    fn default() -> Self {
        LineFilter {
            min_output_lines: 1,
            max_output_lines: None,
        }
    }
}

impl LineFilter {
    /// Whether an output of `lines` lines passes.
    pub fn admits(&self, lines: usize) -> bool {
        lines >= self.min_output_lines && self.max_output_lines.is_none_or(|max| lines <= max)
    }
}

/// Stage 0: `generate`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GenerateConfig {
    /// `builtin` (the shipped corpus), a local JSONL path, `humaneval:PATH`
    /// (HumanEval.jsonl[.gz]), `synthetic:N[:SEED]` (N programs made from a
    /// seed), or a hub dataset id; several joined by `+`
    /// are read one after another. Default `builtin`.
    pub dataset: String,
    /// File inside a hub dataset. Default `python_dataset.jsonl`.
    pub hub_file: String,
    /// Output folder. Default `datasets/trace_training`.
    pub output_dir: PathBuf,
    /// Use at most this many rows (null: all). Default null.
    pub max_samples: Option<usize>,
    /// Transformed variants a program (the Python pipeline's
    /// `variants_per_sample`). Default 3.
    #[serde(alias = "variants_per_sample")]
    pub variants: usize,
    /// `env` or `peer`. Default `env`.
    pub seed_scheme: SeedScheme,
    /// Seed of the train/test split. Default 42.
    pub seed: u64,
    /// Share of programs held out for test. Default 0.05.
    pub test_ratio: f64,
    /// Most injected prints a program. Default 6.
    pub max_injections: usize,
    /// Sandbox worker slots (0: two a core). Default 0.
    pub num_workers: usize,
    /// Interpreter, readable by every uid. Default `/usr/bin/python3`.
    pub python: PathBuf,
    /// Count and skip malformed lines instead of stopping. Default false.
    pub skip_bad: bool,
    pub filters: Filters,
    /// Balance each training split by output-line bucket (1, 2-3, 4-10,
    /// 11+), or by the joint buckets of `balance_by`: a bucket keeps at
    /// most `balance_ratio` times the records of the smallest non-empty
    /// bucket, chosen by a hash of `seed` and the record (deterministic).
    /// Test splits are never changed. Default false.
    pub balance_lines: bool,
    /// See `balance_lines`. At least 1. Default 2.0.
    pub balance_ratio: f64,
    /// The features `balance_lines` balances by, jointly: any of
    /// `output_lines`, `loop_depth`, `lines`, `injections`. Default
    /// `["output_lines"]`.
    pub balance_by: Vec<String>,
    /// Limits of each run. Default: 10 s CPU, 10 s wall (the environment's
    /// timeout), 512 MiB, 1 MiB a stream.
    pub limits: Limits,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        GenerateConfig {
            dataset: "builtin".into(),
            hub_file: "python_dataset.jsonl".into(),
            output_dir: PathBuf::from("datasets/trace_training"),
            max_samples: None,
            variants: 3,
            seed_scheme: SeedScheme::Env,
            seed: 42,
            test_ratio: 0.05,
            max_injections: 6,
            num_workers: 0,
            python: PathBuf::from("/usr/bin/python3"),
            skip_bad: false,
            filters: Filters::default(),
            balance_lines: false,
            balance_ratio: 2.0,
            balance_by: vec!["output_lines".into()],
            limits: Limits {
                wall_ms: 10_000,
                ..Limits::default()
            },
        }
    }
}

impl Validate for GenerateConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.dataset.trim().is_empty() {
            p.push("dataset: empty; use `builtin`, a path or a hub id".into());
        }
        if self.variants == 0 {
            p.push("variants: must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.test_ratio) {
            p.push(format!("test_ratio: {} is not in [0, 1)", self.test_ratio));
        }
        if self.max_injections == 0 || self.max_injections > 100 {
            p.push(format!(
                "max_injections: {} is not in 1..=100",
                self.max_injections
            ));
        }
        if self.limits.cpu_seconds == 0 || self.limits.wall_ms == 0 {
            p.push("limits: cpu_seconds and wall_ms must be positive".into());
        }
        if !(self.balance_ratio.is_finite() && self.balance_ratio >= 1.0) {
            p.push(format!(
                "balance_ratio: {} must be at least 1 (1 gives every line bucket the size of the smallest)",
                self.balance_ratio
            ));
        }
        let known = ["output_lines", "loop_depth", "lines", "injections"];
        if self.balance_by.is_empty() {
            p.push("balance_by: name at least one feature".into());
        }
        for f in &self.balance_by {
            if !known.contains(&f.as_str()) {
                p.push(format!(
                    "balance_by: `{f}` is not one of {}",
                    known.join(", ")
                ));
            }
        }
        p.extend(self.filters.problems());
        p
    }
}
