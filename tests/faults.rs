//! The fault suite: each training stage (warmup, Stage 3 GRPO, DPO, and the
//! pipeline between stages) killed with SIGKILL at a seeded random moment,
//! stopped with SIGTERM at another, and killed then left with its newest
//! checkpoint damaged; each then resumed with `--resume` and compared with
//! an uninterrupted run of the same settings. Damaged inputs (a config, a
//! model, a dataset line) and the sandbox's workers killed in the middle of
//! a run are cells too. Every cell is asserted; the table prints with
//! `--nocapture`:
//!
//! ```text
//! cargo test --release --test faults -- --nocapture
//! ```
//!
//! The same binary drives a GPU build on the GPU machine:
//! `TRACE_TRAIN_BIN=/path/to/cuda/trace-train TRACE_TRAIN_FAULT_DEVICE=cuda`
//! (scripts/fault-suite-gpu.sh). There a resumed run's adapter need not be
//! the same bytes (a GPU's sums may run in another order): it must match
//! the uninterrupted run's within [`GPU_TOLERANCE`], and the cell says
//! which held. `FAULT_SEED` picks other random moments; `FAULT_STAGES`
//! (words of the stages' names, comma-separated: `warmup,GRPO`) runs some
//! stages only.
//!
//! Serve under slow, half-open, oversized and cancelled clients with a
//! shutdown in the middle is tests/serve.rs
//! (`slow_clients_are_cut_off_and_cannot_keep_the_server_from_stopping`,
//! `bench_serve_soaks_the_server_with_hang_ups_and_finds_every_answer_whole`);
//! a full disk is tests/train.rs; a worker killed inside one program is
//! tests/sandbox_hostile.rs.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use candle_core::Device;
use common::train::write_records;

/// The largest difference a GPU resume may leave in an adapter weight,
/// relative to the largest weight of that tensor.
const GPU_TOLERANCE: f64 = 2e-2;

fn binary() -> PathBuf {
    std::env::var_os("TRACE_TRAIN_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_trace-train")),
        PathBuf::from,
    )
}

fn device() -> String {
    std::env::var("TRACE_TRAIN_FAULT_DEVICE").unwrap_or_else(|_| "cpu".into())
}

fn run(dir: &Path, args: &[String]) -> Output {
    Command::new(binary())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run trace-train")
}

fn spawn(dir: &Path, args: &[String]) -> Child {
    Command::new(binary())
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trace-train")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A small seeded generator for the random moments (xorshift).
struct Moments(u64);

impl Moments {
    fn new() -> Self {
        let seed = std::env::var("FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20_261_129u64);
        eprintln!("fault suite: FAULT_SEED={seed}");
        Moments(seed.max(1))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// One training stage as the suite runs it.
struct Stage {
    name: &'static str,
    /// Lines of metrics.jsonl a whole run writes.
    steps: usize,
    /// Its checkpoints' folder prefix (the newest is damaged in one cell).
    prefix: &'static str,
    /// The file of an uninterrupted and a resumed run that must agree.
    result: &'static str,
    /// Where its metrics are, under the output folder.
    metrics: &'static str,
    prepare: fn(&Path),
    /// The command line writing into `out`.
    args: fn(&str, &str) -> Vec<String>,
}

fn tiny(dir: &Path) {
    let o = run(dir, &strings(&["model", "tiny", "base"]));
    assert!(o.status.success(), "{}", text(&o));
}

fn warmup_prepare(dir: &Path) {
    tiny(dir);
    write_records(&dir.join("train.jsonl"), 8);
}

fn warmup_args(out: &str, device: &str) -> Vec<String> {
    strings(&[
        "warmup",
        "--model",
        "base",
        "--train_file",
        "train.jsonl",
        "--eval_file",
        "none.jsonl",
        "--output_dir",
        out,
        "--batch_size",
        "2",
        "--gradient_accumulation_steps",
        "1",
        "--learning_rate",
        "0.003",
        "--max_steps",
        "12",
        "--save_steps",
        "2",
        "--epochs",
        "100",
        "--device",
        device,
    ])
}

fn grpo_prepare(dir: &Path) {
    tiny(dir);
    std::fs::write(
        dir.join("s3.json"),
        r#"{"ppo": {"algorithm": "grpo", "group_size": 2, "dynamic_sampling": false, "batch_size": 2,
                    "num_train_steps": 8, "max_new_tokens": 4, "mini_batch_size": 4, "save_steps": 2,
                    "learning_rate": 0.001, "max_prompt_tokens": 2000, "num_workers": 2,
                    "kl_coef": 0.01, "entropy_coef": 0.01}}"#,
    )
    .unwrap();
}

fn grpo_args(out: &str, device: &str) -> Vec<String> {
    strings(&[
        "ppo",
        "--model",
        "base",
        "--config",
        "s3.json",
        "--output_dir",
        out,
        "--device",
        device,
    ])
}

fn dpo_prepare(dir: &Path) {
    tiny(dir);
    common::write_word_pairs(dir, 8);
    std::fs::write(
        dir.join("dpo.json"),
        r#"{"learning_rate": 0.001, "batch_size": 2, "epochs": 30, "save_steps": 10,
            "save_total_limit": 0, "warmup_ratio": 0.0, "lora_r": 4, "lora_alpha": 8}"#,
    )
    .unwrap();
}

fn dpo_args(out: &str, device: &str) -> Vec<String> {
    strings(&[
        "dpo",
        "--model",
        "base",
        "--pairs",
        "pairs.jsonl",
        "--config",
        "dpo.json",
        "--output_dir",
        out,
        "--device",
        device,
    ])
}

fn pipeline_args(out: &str, device: &str) -> Vec<String> {
    strings(&[
        "pipeline",
        "--quick_test",
        "--checkpoints",
        out,
        "--device",
        device,
    ])
}

const STAGES: [Stage; 4] = [
    Stage {
        name: "warmup (SFT)",
        steps: 12,
        prefix: "checkpoint-",
        result: "final/adapter_model.safetensors",
        metrics: "metrics.jsonl",
        prepare: warmup_prepare,
        args: warmup_args,
    },
    Stage {
        name: "Stage 3 GRPO",
        steps: 8,
        prefix: "step_",
        result: "final/adapter_model.safetensors",
        metrics: "metrics.jsonl",
        prepare: grpo_prepare,
        args: grpo_args,
    },
    Stage {
        name: "DPO",
        steps: 120,
        prefix: "checkpoint-",
        result: "final/adapter_model.safetensors",
        metrics: "metrics.jsonl",
        prepare: dpo_prepare,
        args: dpo_args,
    },
    Stage {
        name: "pipeline (quick test)",
        // Stage 2's steps: the signal lands after Stage 1 and its gate
        // were recorded finished, in the middle of Stage 2.
        steps: 6,
        prefix: "",
        result: "stage3_ppo/final/adapter_model.safetensors",
        metrics: "stage2_sft/metrics.jsonl",
        prepare: |_| {},
        args: pipeline_args,
    },
];

/// Waits until `metrics` holds `lines` lines or the run ends; whether it
/// was still running.
fn wait_for(child: &mut Child, metrics: &Path, lines: usize) -> bool {
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        let n = std::fs::read_to_string(metrics).map_or(0, |s| s.lines().count());
        if n >= lines {
            return true;
        }
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "`{}` never reached {lines} lines",
            metrics.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Starts `stage` into `out`, waits for a random step in its first half
/// and a random part of a step (timed on the run itself), and sends
/// `signal`; the run's exit status and stderr.
fn interrupt(
    dir: &Path,
    stage: &Stage,
    out: &str,
    signal: nix::sys::signal::Signal,
    after_checkpoint: bool,
    moments: &mut Moments,
) -> (std::process::ExitStatus, String) {
    let mut child = spawn(dir, &(stage.args)(out, &device()));
    if after_checkpoint {
        // The moment comes after the run's first checkpoint.
        let t = Instant::now();
        while newest_checkpoint(&dir.join(out), stage.prefix).is_none() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "{}: ended before its first checkpoint",
                stage.name
            );
            assert!(t.elapsed() < Duration::from_secs(600), "no checkpoint");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let metrics = dir.join(out).join(stage.metrics);
    let done = std::fs::read_to_string(&metrics).map_or(0, |s| s.lines().count());
    let at = done + 2 + moments.below((stage.steps as u64 / 2).saturating_sub(1).max(1)) as usize;
    assert!(
        wait_for(&mut child, &metrics, done + 1),
        "{}: ended at once",
        stage.name
    );
    let first = Instant::now();
    let running = wait_for(&mut child, &metrics, at);
    assert!(
        running,
        "{}: the run ended before its step {at}",
        stage.name
    );
    let step = first.elapsed() / (at - done - 1) as u32;
    let micros = step.as_micros() as u64;
    std::thread::sleep(Duration::from_micros(moments.below(micros.max(1))));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    let o = child.wait_with_output().unwrap();
    (o.status, text(&o))
}

/// Resumes `out` and compares its result with the uninterrupted run's.
fn resume_and_compare(dir: &Path, stage: &Stage, out: &str) -> String {
    let mut args = (stage.args)(out, &device());
    args.push("--resume".into());
    let o = run(dir, &args);
    assert!(o.status.success(), "{} resume: {}", stage.name, text(&o));
    same_result(
        &dir.join("full").join(stage.result),
        &dir.join(out).join(stage.result),
    )
}

/// "identical" when the files are the same bytes; on a GPU, the largest
/// difference when within [`GPU_TOLERANCE`]; a failed assertion otherwise.
fn same_result(a: &Path, b: &Path) -> String {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    if x == y {
        return "identical".into();
    }
    assert_ne!(
        device(),
        "cpu",
        "`{}` and `{}` differ on the CPU",
        a.display(),
        b.display()
    );
    let ta = candle_core::safetensors::load(a, &Device::Cpu).unwrap();
    let tb = candle_core::safetensors::load(b, &Device::Cpu).unwrap();
    let mut worst = 0f64;
    for (name, t) in &ta {
        let u = &tb[name];
        let diff = (t - u)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64;
        let scale = t
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            .max(1e-12) as f64;
        worst = worst.max(diff / scale);
    }
    assert!(
        worst <= GPU_TOLERANCE,
        "relative difference {worst:.2e} over {GPU_TOLERANCE:.0e}"
    );
    format!("within {worst:.1e} (tolerance {GPU_TOLERANCE:.0e})")
}

/// The newest checkpoint folder of `out`.
fn newest_checkpoint(out: &Path, prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(out)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let n: u64 = e.file_name().to_str()?.strip_prefix(prefix)?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

fn cell(
    table: &mut BTreeMap<(usize, &'static str), String>,
    row: usize,
    col: &'static str,
    v: String,
) {
    eprintln!("  {} / {col}: {v}", STAGES[row].name);
    table.insert((row, col), v);
}

const COLUMNS: [&str; 4] = [
    "kill -9, resume",
    "SIGTERM, resume",
    "kill -9, newest checkpoint damaged, resume",
    "sandbox workers killed",
];

#[test]
fn every_stage_survives_its_faults_and_resumes_to_the_uninterrupted_result() {
    let mut moments = Moments::new();
    let mut table = BTreeMap::new();
    let dev = device();
    let only = std::env::var("FAULT_STAGES").ok();
    for (row, stage) in STAGES.iter().enumerate() {
        if let Some(only) = &only
            && !only.split(',').any(|w| stage.name.contains(w.trim()))
        {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        (stage.prepare)(d);
        let o = run(d, &(stage.args)("full", &dev));
        assert!(o.status.success(), "{}: {}", stage.name, text(&o));

        // kill -9 at a random moment, then resume.
        let (status, err) = interrupt(
            d,
            stage,
            "killed",
            nix::sys::signal::Signal::SIGKILL,
            false,
            &mut moments,
        );
        assert_eq!(status.code(), None, "{}: {err}", stage.name);
        let v = resume_and_compare(d, stage, "killed");
        cell(&mut table, row, COLUMNS[0], format!("resumed, {v}"));

        // SIGTERM: 143 after a checkpoint, then resume.
        let (status, err) = interrupt(
            d,
            stage,
            "stopped",
            nix::sys::signal::Signal::SIGTERM,
            false,
            &mut moments,
        );
        assert_eq!(status.code(), Some(143), "{}: {err}", stage.name);
        assert!(
            !d.join("stopped/.lock").exists(),
            "{}: a lock left",
            stage.name
        );
        let v = resume_and_compare(d, stage, "stopped");
        cell(
            &mut table,
            row,
            COLUMNS[1],
            format!("exit 143, resumed, {v}"),
        );

        if !stage.prefix.is_empty() {
            // kill -9, then the newest checkpoint's weights cut in half.
            let (status, err) = interrupt(
                d,
                stage,
                "damaged",
                nix::sys::signal::Signal::SIGKILL,
                true,
                &mut moments,
            );
            assert_eq!(status.code(), None, "{}: {err}", stage.name);
            let v = match newest_checkpoint(&d.join("damaged"), stage.prefix) {
                Some(ck) => {
                    let w = ck.join("trainable.safetensors");
                    let bytes = std::fs::read(&w).unwrap();
                    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
                    let v = resume_and_compare(d, stage, "damaged");
                    format!(
                        "`{}` skipped, resumed, {v}",
                        ck.file_name().unwrap().to_string_lossy()
                    )
                }
                None => panic!("{}: killed after a checkpoint, none found", stage.name),
            };
            cell(&mut table, row, COLUMNS[2], v);
        }

        if stage.name == "Stage 3 GRPO" {
            // The sandbox's workers killed while the run draws tasks: the
            // run goes on (the draws count as sandbox failures) and ends.
            let mut child = spawn(d, &(stage.args)("workers", &dev));
            assert!(wait_for(&mut child, &d.join("workers/metrics.jsonl"), 2));
            let killed = kill_descendants(child.id(), "python");
            let o = child.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", text(&o));
            assert!(killed > 0, "no sandbox worker found");
            assert!(d.join("workers/final/adapter_model.safetensors").is_file());
            cell(
                &mut table,
                row,
                COLUMNS[3],
                format!("{killed} killed; the run finished (exit 0)"),
            );
        }
    }
    inputs(&mut table);
    print_table(&table);
}

/// SIGKILLs every process below `pid` whose command name contains `name`;
/// how many.
fn kill_descendants(pid: u32, name: &str) -> usize {
    let mut parents = vec![pid as i32];
    let mut killed = 0;
    let all: Vec<(i32, i32, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let p: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim().to_owned())
            };
            Some((p, field("PPid:")?.parse().ok()?, field("Name:")?))
        })
        .collect();
    while let Some(parent) = parents.pop() {
        for (p, pp, n) in &all {
            if *pp == parent {
                parents.push(*p);
                if n.contains(name) {
                    // SAFETY: kill(2) of a process this test's run started.
                    unsafe { libc::kill(*p, libc::SIGKILL) };
                    killed += 1;
                }
            }
        }
    }
    killed
}

/// Damaged inputs: each refused with an error naming the file (and line),
/// exit 1, nothing written.
fn inputs(table: &mut BTreeMap<(usize, &'static str), String>) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    warmup_prepare(d);
    let dev = device();
    let mut refused = |what: &str, args: Vec<String>, names: &[&str]| {
        let o = run(d, &args);
        let err = text(&o);
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        for n in names {
            assert!(err.contains(n), "{what}: no `{n}` in {err}");
        }
        let first = err
            .lines()
            .find(|l| l.starts_with("error"))
            .unwrap_or("")
            .to_owned();
        eprintln!("  input / {what}: refused: {first}");
        table.insert(
            (STAGES.len(), Box::leak(what.to_owned().into_boxed_str())),
            format!("refused: {first}"),
        );
    };
    // A config with a syntax error.
    std::fs::write(
        d.join("bad.json"),
        "{\"sft\": {\"learning_rate\": 1e-4,,}}\n",
    )
    .unwrap();
    let mut args = warmup_args("c", &dev);
    args.extend(strings(&["--config", "bad.json"]));
    refused("config", args, &["bad.json", "line 1"]);
    // A dataset with a broken line.
    let mut text = std::fs::read_to_string(d.join("train.jsonl")).unwrap();
    text.push_str("{\"messages\": [\n");
    std::fs::write(d.join("broken.jsonl"), text).unwrap();
    let mut args = warmup_args("b", &dev);
    let i = args.iter().position(|a| a == "train.jsonl").unwrap();
    args[i] = "broken.jsonl".into();
    refused("dataset", args, &["broken.jsonl", "line 9"]);
    // A model whose weights are cut short.
    let w = d.join("base/model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 3]).unwrap();
    refused("model", warmup_args("m", &dev), &["model.safetensors"]);
    for out in ["c", "b", "m"] {
        assert!(
            !d.join(out).join("final").exists(),
            "{out}: a final model from refused input"
        );
    }
}

fn print_table(table: &BTreeMap<(usize, &'static str), String>) {
    let mut s = String::from("\n| stage | fault | outcome |\n|---|---|---|\n");
    for ((row, col), v) in table {
        let name = STAGES.get(*row).map_or("damaged input", |s| s.name);
        s.push_str(&format!("| {name} | {col} | {v} |\n"));
    }
    eprintln!("fault suite on `{}` ({}):{s}", binary().display(), device());
}
