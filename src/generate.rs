//! Stage 0, `generate`: source rows → runs in the sandbox → the original
//! (Stage 1) and transformed (Stage 2) training sets, split by program.
//!
//! Rows stream through in chunks, each chunk processed in parallel over the
//! executor's slots and written in input order, so memory stays flat and the
//! same inputs and seed always give the same bytes. Every file is written to
//! a temp file first and renamed into place only when the whole run
//! succeeded: an interrupted run leaves the previous outputs untouched.
//!
//! Per row: the transform (all variants in one sandboxed call), the original
//! run (its stdout must match the recorded output, or, with none recorded,
//! a second run), then one run a variant. Each drop is counted by reason.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use rayon::prelude::*;
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::atomic::{self, AtomicFile};
use crate::config::{Filters, GenerateConfig};
use crate::data::buckets::Difficulty;
use crate::data::buckets::{self, BucketCount, Tally};
use crate::dataset::{Source, SourceRow};
use crate::prompt;
use crate::reward::python_strip;
use crate::sandbox::{Executor, ExecutorConfig, Outcome, Request, Status};
use crate::transform::{self, Transformed};

pub use crate::progress::{NoProgress, Progress};
pub use crate::transform::strip_fence;

/// The files `generate` writes, relative to its output folder.
pub const STAGE1_TRAIN: &str = "stage1_original_train.jsonl";
pub const STAGE1_TEST: &str = "stage1_original_test.jsonl";
pub const STAGE2_TRAIN: &str = "stage2_transformed_train.jsonl";
pub const STAGE2_TEST: &str = "stage2_transformed_test.jsonl";
pub const STAGE1_STATS: &str = "stage1_stats.json";
pub const STAGE2_STATS: &str = "stage2_stats.json";

/// Options that only the command line may set.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Run programs without isolation (never from a config file).
    pub unsafe_no_sandbox: bool,
}

/// Counts for one stage's output.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageStats {
    pub records_train: u64,
    pub records_test: u64,
    pub programs_train: u64,
    pub programs_test: u64,
    /// Drops by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Histogram of a feature (`loop_depth`, `injections`) → count.
    pub histograms: BTreeMap<String, BTreeMap<String, u64>>,
    pub output_lines_total: u64,
    pub output_chars_total: u64,
    /// Records of each written split (`train`, `test`) by bucket of output
    /// lines (1, 2-3, 4-10, 11+) and of each difficulty feature
    /// (`loop_depth`, `lines`, `injections`), as the eval report counts
    /// them; each feature's buckets add up to the split's records.
    pub buckets: BTreeMap<String, BTreeMap<String, Vec<BucketCount>>>,
    /// What `balance_lines` did to the training split (absent when off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<Balance>,
}

/// How a training split was balanced.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Balance {
    /// The features whose (joint) buckets were capped.
    pub by: Vec<String>,
    pub ratio: f64,
    /// Most records a bucket kept: `ratio` times the smallest non-empty
    /// bucket.
    pub cap: u64,
    pub before: Vec<BucketCount>,
    pub after: Vec<BucketCount>,
    pub dropped: u64,
}

/// What a run did, as written into the stats files.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub dataset: String,
    pub python: String,
    pub isolation: String,
    pub seed_scheme: crate::config::SeedScheme,
    pub seed: u64,
    pub variants: usize,
    pub test_ratio: f64,
    pub rows_in_source: u64,
    pub rows_read: u64,
    pub malformed_lines: u64,
    pub malformed_examples: Vec<String>,
    /// Rows whose run did not reproduce the recorded output.
    pub output_mismatch_rows: Vec<String>,
    /// Rows whose own program does not parse or fails in the sandbox, as
    /// `name: reason` (the first 50; `dropped` counts them all by reason):
    /// their variants are never run.
    pub failed_rows: Vec<String>,
    pub stage1: StageStats,
    pub stage2: StageStats,
    pub filters: Filters,
    pub limits: crate::sandbox::Limits,
    pub timings: Timings,
}

/// Not reproducible by nature; everything else in the stats is.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    pub seconds_total: f64,
    pub sandbox_runs: u64,
    pub runs_per_second: f64,
    pub program_cpu_seconds: f64,
    pub peak_rss_kb: u64,
}

/// One output record, ready to be written.
struct Record {
    test: bool,
    json: String,
    info: RecordInfo,
}

/// What the stats and the balancing need of a written record.
#[derive(Debug, Clone, Copy)]
struct RecordInfo {
    row: u64,
    variant: u32,
    chars: u64,
    difficulty: Difficulty,
}

#[derive(Default)]
struct RowResult {
    stage1: Option<Record>,
    stage2: Vec<Record>,
    drops1: Vec<String>,
    drops2: Vec<String>,
    mismatch: Option<String>,
    /// Why the row's own program failed, when it did.
    failed: Option<String>,
    runs: u64,
    cpu_ms: f64,
    test: bool,
}

/// Runs Stage 0 with `cfg` and writes its outputs; returns the summary.
pub fn run(
    cfg: &GenerateConfig,
    opts: &RunOptions,
    progress: &dyn Progress,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let out_dir = cfg.output_dir.clone();
    atomic::ensure_writable_dir(&out_dir)?;
    let source = Source::resolve(&cfg.dataset, &cfg.hub_file)?;
    let rows_in_source = source.count()?;
    let total = cfg
        .max_samples
        .map_or(rows_in_source, |m| (m as u64).min(rows_in_source));

    let workers = if cfg.num_workers == 0 {
        crate::sandbox::default_workers()
    } else {
        cfg.num_workers
    };
    let exec = Executor::new(ExecutorConfig::new(
        &cfg.python,
        workers,
        opts.unsafe_no_sandbox,
    ))
    .context("cannot start the sandbox")?;

    let mut files = Outputs::create(&out_dir)?;
    let mut summary = Summary {
        dataset: source.describe(),
        python: exec.python_version().to_owned(),
        isolation: if opts.unsafe_no_sandbox {
            "none (--unsafe_no_sandbox)"
        } else {
            "sandbox"
        }
        .into(),
        seed_scheme: cfg.seed_scheme,
        seed: cfg.seed,
        variants: cfg.variants,
        test_ratio: cfg.test_ratio,
        rows_in_source,
        rows_read: 0,
        malformed_lines: 0,
        malformed_examples: Vec::new(),
        output_mismatch_rows: Vec::new(),
        failed_rows: Vec::new(),
        stage1: StageStats::default(),
        stage2: StageStats::default(),
        filters: cfg.filters.clone(),
        limits: cfg.limits,
        timings: Timings::default(),
    };

    progress.start(Some(total), 0);
    let chunk_size = (workers * 8).max(16);
    let mut rows = source.rows()?;
    let mut taken = 0u64;
    let mut sandbox_runs = 0u64;
    let mut cpu_ms = 0.0;
    // Per output file (see `Outputs::index`), its records in file order.
    let mut infos: [Vec<RecordInfo>; 4] = Default::default();
    loop {
        let mut chunk: Vec<SourceRow> = Vec::with_capacity(chunk_size);
        while chunk.len() < chunk_size && taken < total {
            match rows.next() {
                None => break,
                Some(Ok(row)) => {
                    chunk.push(row);
                    taken += 1;
                }
                Some(Err(e)) if cfg.skip_bad => {
                    summary.malformed_lines += 1;
                    if summary.malformed_examples.len() < 20 {
                        summary
                            .malformed_examples
                            .push(format!("line {}: {}", e.line, e.message));
                    }
                }
                Some(Err(e)) => {
                    return Err(anyhow::Error::new(e))
                        .context("stopped at a bad dataset row; nothing was written");
                }
            }
        }
        if chunk.is_empty() {
            break;
        }
        let results: Vec<RowResult> = exec.install(|| {
            chunk
                .par_iter()
                .map(|row| process_row(&exec, cfg, row, rows_in_source))
                .collect()
        });
        for r in results {
            summary.rows_read += 1;
            sandbox_runs += r.runs;
            cpu_ms += r.cpu_ms;
            if let Some(m) = r.mismatch
                && summary.output_mismatch_rows.len() < 50
            {
                summary.output_mismatch_rows.push(m);
            }
            if let Some(f) = r.failed
                && summary.failed_rows.len() < 50
            {
                summary.failed_rows.push(f);
            }
            for d in r.drops1 {
                *summary.stage1.dropped.entry(d).or_default() += 1;
            }
            for d in r.drops2 {
                *summary.stage2.dropped.entry(d).or_default() += 1;
            }
            for (stage, rec) in r
                .stage1
                .iter()
                .map(|x| (1, x))
                .chain(r.stage2.iter().map(|x| (2, x)))
            {
                files.write(stage, rec)?;
                infos[Outputs::index(stage, rec.test)].push(rec.info);
            }
        }
        progress.advance(chunk.len() as u64);
    }
    progress.finish();

    // Balancing, then the counts of what is written.
    let mut keep: [Option<Vec<bool>>; 4] = Default::default();
    for (stage, stats) in [(1u8, &mut summary.stage1), (2u8, &mut summary.stage2)] {
        let train = Outputs::index(stage, false);
        if cfg.balance_lines {
            let (mask, b) = balance(
                &infos[train],
                &cfg.balance_by,
                cfg.balance_ratio,
                cfg.seed,
                stage,
            );
            infos[train] = infos[train]
                .iter()
                .zip(&mask)
                .filter(|(_, k)| **k)
                .map(|(i, _)| *i)
                .collect();
            keep[train] = Some(mask);
            stats.balance = Some(b);
        }
        count_stage(
            stats,
            &infos[train],
            &infos[Outputs::index(stage, true)],
            stage,
        );
    }

    let seconds = started.elapsed().as_secs_f64();
    summary.timings = Timings {
        seconds_total: seconds,
        sandbox_runs,
        runs_per_second: sandbox_runs as f64 / seconds.max(1e-9),
        program_cpu_seconds: cpu_ms / 1000.0,
        peak_rss_kb: peak_rss_kb(),
    };
    files.commit(keep)?;
    for (name, stage) in [(STAGE1_STATS, 1), (STAGE2_STATS, 2)] {
        atomic::write(&out_dir.join(name), stats_json(&summary, stage).as_bytes())?;
    }
    Ok(summary)
}

fn bump(h: &mut BTreeMap<String, BTreeMap<String, u64>>, name: &str, key: String) {
    *h.entry(name.into()).or_default().entry(key).or_default() += 1;
}

/// Fills a stage's record, program, line and bucket counts from the
/// records written to its two splits.
fn count_stage(s: &mut StageStats, train: &[RecordInfo], test: &[RecordInfo], stage: u8) {
    let programs = |v: &[RecordInfo]| {
        v.iter()
            .map(|i| i.row)
            .collect::<std::collections::BTreeSet<_>>()
    };
    s.records_train = train.len() as u64;
    s.records_test = test.len() as u64;
    s.programs_train = programs(train).len() as u64;
    s.programs_test = programs(test).len() as u64;
    s.output_lines_total = 0;
    s.output_chars_total = 0;
    s.histograms.clear();
    // Loop depth once a program, injections once a record.
    let mut seen = std::collections::BTreeSet::new();
    for i in train.iter().chain(test) {
        s.output_lines_total += u64::from(i.difficulty.output_lines.unwrap_or(0));
        s.output_chars_total += i.chars;
        if seen.insert(i.row)
            && let Some(d) = i.difficulty.loop_depth
        {
            bump(&mut s.histograms, "loop_depth", d.to_string());
        }
        if stage == 2
            && let Some(n) = i.difficulty.injections
        {
            bump(&mut s.histograms, "injections", n.to_string());
        }
    }
    s.buckets.clear();
    for (split, v) in [("train", train), ("test", test)] {
        let mut t = Tally::default();
        for i in v {
            t.add(&i.difficulty);
        }
        s.buckets.insert(split.into(), t.counts());
    }
}

/// Which records of a training split `balance_lines` keeps: each bucket
/// (of output lines, or the joint bucket of the `by` features) at most
/// `ratio` times the smallest non-empty one,
/// the records of an over-full bucket ranked by a hash of the seed, the
/// stage and the record (so the choice is the same on every run and does
/// not follow the input order).
fn balance(
    infos: &[RecordInfo],
    by: &[String],
    ratio: f64,
    seed: u64,
    stage: u8,
) -> (Vec<bool>, Balance) {
    let features: Vec<buckets::Feature> = by
        .iter()
        .filter_map(|name| buckets::Feature::named(name))
        .collect();
    let key = |i: &RecordInfo| {
        let parts: Vec<(u32, String)> = features
            .iter()
            .map(|f| buckets::bucket((f.get)(&i.difficulty), f.edges))
            .collect();
        let label = if parts.len() == 1 {
            parts[0].1.clone()
        } else {
            features
                .iter()
                .zip(&parts)
                .map(|(f, (_, l))| format!("{}={l}", f.name))
                .collect::<Vec<_>>()
                .join(",")
        };
        (parts.into_iter().map(|p| p.0).collect::<Vec<u32>>(), label)
    };
    let mut groups: BTreeMap<Vec<u32>, (String, Vec<usize>)> = BTreeMap::new();
    for (n, i) in infos.iter().enumerate() {
        let (k, label) = key(i);
        groups.entry(k).or_insert((label, Vec::new())).1.push(n);
    }
    let smallest = groups.values().map(|g| g.1.len()).min().unwrap_or(0);
    let cap = ((ratio * smallest as f64).floor() as usize).max(smallest);
    let rank = |i: &RecordInfo| {
        let mut h = Sha256::new();
        h.update(b"balance_lines");
        h.update(seed.to_le_bytes());
        h.update([stage]);
        h.update(i.row.to_le_bytes());
        h.update(i.variant.to_le_bytes());
        u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
    };
    let mut keep = vec![true; infos.len()];
    let mut b = Balance {
        by: by.to_vec(),
        ratio,
        cap: cap as u64,
        ..Balance::default()
    };
    for (label, members) in groups.values() {
        b.before.push(BucketCount {
            bucket: label.clone(),
            n: members.len() as u64,
        });
        let mut ranked = members.clone();
        ranked.sort_by_key(|&n| (rank(&infos[n]), n));
        for &n in ranked.iter().skip(cap) {
            keep[n] = false;
        }
        b.after.push(BucketCount {
            bucket: label.clone(),
            n: members.len().min(cap) as u64,
        });
    }
    b.dropped = keep.iter().filter(|k| !**k).count() as u64;
    (keep, b)
}

/// One stage's stats file: the shared header plus that stage's counts.
fn stats_json(s: &Summary, stage: u8) -> String {
    let (this, other) = if stage == 1 {
        (&s.stage1, "stage2")
    } else {
        (&s.stage2, "stage1")
    };
    let mut v = serde_json::to_value(s).expect("summary serializes");
    let obj = v.as_object_mut().expect("object");
    obj.remove("stage1");
    obj.remove("stage2");
    obj.insert("stage".into(), json!(stage));
    obj.insert(
        "counts".into(),
        serde_json::to_value(this).expect("stats serialize"),
    );
    obj.insert(
        "other_stage_file".into(),
        json!(format!("{other}_stats.json")),
    );
    let mut text = serde_json::to_string_pretty(&v).expect("json");
    text.push('\n');
    text
}

/// Peak resident set of this process, from the kernel.
pub fn peak_rss_kb() -> u64 {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) == 0 {
            ru.ru_maxrss as u64
        } else {
            0
        }
    }
}

/// The four dataset files, written atomically together.
struct Outputs {
    files: Vec<(AtomicFile, std::io::BufWriter<std::fs::File>)>,
}

impl Outputs {
    fn create(dir: &Path) -> anyhow::Result<Self> {
        let mut files = Vec::new();
        for name in [STAGE1_TRAIN, STAGE1_TEST, STAGE2_TRAIN, STAGE2_TEST] {
            let f = AtomicFile::create(&dir.join(name))?;
            let w = std::io::BufWriter::with_capacity(1 << 16, f.handle()?);
            files.push((f, w));
        }
        Ok(Outputs { files })
    }

    /// The file of a stage's split: stage 1 train, test, stage 2 train, test.
    fn index(stage: u8, test: bool) -> usize {
        (stage as usize - 1) * 2 + usize::from(test)
    }

    fn write(&mut self, stage: u8, rec: &Record) -> anyhow::Result<()> {
        let w = &mut self.files[Self::index(stage, rec.test)].1;
        w.write_all(rec.json.as_bytes())?;
        w.write_all(b"\n")?;
        Ok(())
    }

    /// Renames every file into place; a file with a `keep` mask is first
    /// copied keeping only the lines the mask keeps.
    fn commit(self, keep: [Option<Vec<bool>>; 4]) -> anyhow::Result<()> {
        let mut pending = Vec::new();
        for ((f, mut w), keep) in self.files.into_iter().zip(keep) {
            w.flush().context("cannot write dataset file")?;
            drop(w);
            pending.push(match keep {
                None => f,
                Some(keep) => f.filter_lines(&keep)?,
            });
        }
        for f in pending {
            f.commit()?;
        }
        Ok(())
    }
}

/// Whether a program (by its normalized source) is held out for test.
pub fn is_test_program(normalized: &str, seed: u64, test_ratio: f64) -> bool {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(normalized.as_bytes());
    let d = h.finalize();
    let v = u64::from_le_bytes(d[..8].try_into().expect("8 bytes"));
    (v as f64 / u64::MAX as f64) < test_ratio
}

fn program_id(normalized: &str) -> String {
    let d = Sha256::digest(normalized.as_bytes());
    crate::hex(&d[..8])
}

/// Why an output fails the filters, if it does.
fn filter_output(
    out: &Outcome,
    expected: &str,
    f: &Filters,
    transformed: bool,
) -> Option<&'static str> {
    if f.drop_stderr && !out.stderr.is_empty() {
        return Some("stderr");
    }
    if f.drop_empty && expected.is_empty() {
        return Some("empty_output");
    }
    if expected.chars().count() > f.max_output_chars {
        return Some("output_too_long");
    }
    let lines = f.lines(transformed);
    let n = expected.lines().count();
    if n < lines.min_output_lines {
        return Some("too_few_lines");
    }
    if !lines.admits(n) {
        return Some("too_many_lines");
    }
    if transformed && f.require_dbg && !expected.contains("__DBG_") {
        return Some("no_dbg_output");
    }
    None
}

/// A run's stdout as the ground truth, or why it cannot be one.
fn ground_truth(out: &Outcome) -> Result<String, String> {
    if out.status != Status::Ok {
        return Err(out.status.as_str().to_owned());
    }
    match std::str::from_utf8(&out.stdout) {
        Ok(s) => Ok(python_strip(s).to_owned()),
        Err(_) => Err("non_utf8_output".into()),
    }
}

fn process_row(
    exec: &Executor,
    cfg: &GenerateConfig,
    row: &SourceRow,
    rows_in_source: u64,
) -> RowResult {
    let mut r = RowResult::default();
    let f = &cfg.filters;
    let drop_all = |r: &mut RowResult, reason: &str| {
        r.drops1.push(reason.to_owned());
        r.drops2.push(reason.to_owned());
    };
    let source = strip_fence(&row.program);
    if source.chars().count() > f.max_source_chars {
        drop_all(&mut r, "source_too_long");
        return r;
    }
    let seeds: Vec<u64> = (0..cfg.variants as u64)
        .map(|v| cfg.seed_scheme.seed(row.index, v, rows_in_source))
        .collect();
    let treq = transform::request(source, &seeds, cfg.max_injections, cfg.limits);
    let tout = exec.run(&treq);
    r.runs += 1;
    let t: Transformed = match transform::parse_outcome(&tout) {
        Ok(t) => t,
        Err(transform::TransformError::DoesNotParse(_)) => {
            drop_all(&mut r, "does_not_parse");
            r.failed = Some(format!("{}: does_not_parse", row.name));
            return r;
        }
        Err(transform::TransformError::Failed { status, .. }) => {
            drop_all(&mut r, &format!("transform_{status}"));
            return r;
        }
    };
    r.test = is_test_program(&t.normalized, cfg.seed, cfg.test_ratio);
    let info = |variant: u32, injections: Option<u32>, expected: &str| RecordInfo {
        row: row.index,
        variant,
        chars: expected.chars().count() as u64,
        difficulty: Difficulty {
            loop_depth: Some(t.features.loop_depth),
            lines: Some(t.features.lines),
            injections,
            output_lines: u32::try_from(expected.lines().count()).ok(),
        },
    };
    let pid = program_id(&t.normalized);

    let run = |program: &str, r: &mut RowResult| {
        let out = exec.run(&Request {
            program: program.as_bytes().to_vec(),
            stdin: row.inputs.as_bytes().to_vec(),
            limits: cfg.limits,
        });
        r.runs += 1;
        r.cpu_ms += out.cpu_ms;
        out
    };

    // The original program: it must run cleanly and reproduce its output.
    let orig = run(source, &mut r);
    let expected = match ground_truth(&orig) {
        Ok(e) => e,
        Err(reason) => {
            // None of its variants is run. A sandbox failure says nothing
            // of the row; any other failure is the row's own.
            drop_all(&mut r, &format!("original_{reason}"));
            if orig.status != Status::SandboxFailure {
                r.failed = Some(format!("{}: original_{reason}", row.name));
            }
            return r;
        }
    };
    match &row.output {
        Some(recorded) if python_strip(recorded) != expected => {
            drop_all(&mut r, "output_mismatch");
            r.mismatch = Some(row.name.clone());
            return r;
        }
        Some(_) => {}
        None => {
            let again = run(source, &mut r);
            if ground_truth(&again).as_deref() != Ok(expected.as_str()) {
                drop_all(&mut r, "nondeterministic");
                r.mismatch = Some(row.name.clone());
                return r;
            }
        }
    }
    let split = if r.test { "test" } else { "train" };
    let meta =
        |seed: Option<u64>, variant: Option<usize>, injections: Option<u32>, expected: &str| {
            json!({
                "row_index": row.index,
                "row_name": row.name,
                "program_id": pid,
                "seed": seed,
                "variant": variant,
                "injections": injections,
                "split": split,
                "output_lines": expected.lines().count(),
                "output_chars": expected.chars().count(),
                "features": t.features,
            })
        };
    match filter_output(&orig, &expected, f, false) {
        Some(reason) => r.drops1.push(reason.into()),
        None => {
            let rec = json!({
                "messages": [
                    {"role": "user", "content": prompt::original_prompt(source, &row.inputs)},
                    {"role": "assistant", "content": expected},
                ],
                "program": source,
                "input": row.inputs,
                "expected_output": expected,
                "metadata": meta(None, None, None, &expected),
            });
            r.stage1 = Some(Record {
                test: r.test,
                json: rec.to_string(),
                info: info(0, None, &expected),
            });
        }
    }

    for (i, v) in t.variants.iter().enumerate() {
        let out = run(&v.code, &mut r);
        let truth = match ground_truth(&out) {
            Ok(e) => e,
            Err(reason) => {
                r.drops2.push(format!("variant_{reason}"));
                continue;
            }
        };
        if let Some(reason) = filter_output(&out, &truth, f, true) {
            r.drops2.push(reason.into());
            continue;
        }
        let rec = json!({
            "messages": [
                {"role": "user", "content": prompt::trace_prompt(&v.code, &row.inputs)},
                {"role": "assistant", "content": truth},
            ],
            "program": v.code,
            "input": row.inputs,
            "expected_output": truth,
            "metadata": meta(Some(v.seed), Some(i), Some(v.injections), &truth),
        });
        r.stage2.push(Record {
            test: r.test,
            json: rec.to_string(),
            info: info(i as u32, Some(v.injections), &truth),
        });
    }
    r
}

/// The output folder's files, for callers that want to check them.
pub fn output_paths(dir: &Path) -> Vec<PathBuf> {
    [
        STAGE1_TRAIN,
        STAGE1_TEST,
        STAGE2_TRAIN,
        STAGE2_TEST,
        STAGE1_STATS,
        STAGE2_STATS,
    ]
    .iter()
    .map(|n| dir.join(n))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_stripped_like_the_environment() {
        assert_eq!(strip_fence("```python\nprint(1)\n```"), "print(1)");
        assert_eq!(strip_fence("  x = 1\n"), "x = 1");
        assert_eq!(strip_fence("```\nx\n"), "x");
    }

    #[test]
    fn split_is_stable_and_near_the_ratio() {
        let n = 4000;
        let test = (0..n)
            .filter(|i| is_test_program(&format!("p{i}"), 42, 0.05))
            .count();
        assert!((120..280).contains(&test), "{test}");
        assert_eq!(is_test_program("x", 1, 0.5), is_test_program("x", 1, 0.5));
    }
}
