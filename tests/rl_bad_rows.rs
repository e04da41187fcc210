//! Stage 3 on datasets with broken rows: a row whose own program fails in
//! the sandbox runs once and is never drawn again (on one rank, on two, and
//! across a resume), is logged once and counted; a dataset of nothing but
//! broken rows stops the run with an error naming it. The task stream
//! directly, `ppo::run_with` in process, and the real binary.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use common::{ppo_args, stderr, trace_train};
use trace_train::config::{CurriculumConfig, ModelConfig, RlConfig};
use trace_train::dataset::SourceRow;
use trace_train::dist::inprocess::run_ranks;
use trace_train::dist::{Communicator, Single};
use trace_train::env::{BAD_ROW, Barren, Environment, MAX_BARREN_DRAWS, SharedTasks, TraceEnv};
use trace_train::recipes::ppo::{self, RlJob, RlState};
use trace_train::recipes::sft::NoProgress;
use trace_train::sandbox::{Executor, ExecutorConfig, Limits};

/// A row that runs cleanly: `n` squares.
const GOOD: &str = "n = int(input())\nfor i in range(n):\n    print(i * i)\n";

/// Hostile programs that fail at once, with the reason their row is
/// marked bad under.
const QUICK_HOSTILE: [(&str, &str); 6] = [
    ("raise SystemExit(1)\n", "original_error_exit"),
    ("import os\nos.kill(os.getpid(), 9)\n", "original_signal"),
    (
        "x = bytearray(1 << 40)\nprint(len(x))\n",
        "original_memory_limit",
    ),
    ("print('x' * (4 << 20))\n", "original_output_limit"),
    (
        "import sys\nprint('careful', file=sys.stderr)\nprint(1)\n",
        "original_stderr",
    ),
    (
        "def f(n):\n    return f(n + 1)\nprint(f(0))\n",
        "original_error_exit",
    ),
];

/// Hostile programs that run until a limit stops them (the busy loop by
/// its CPU or wall limit, whichever comes first on a loaded machine: see
/// [`same`]).
const SLOW_HOSTILE: [(&str, &str); 2] = [
    ("while True:\n    pass\n", "original_cpu_timeout"),
    ("import time\ntime.sleep(60)\n", "original_wall_timeout"),
];

/// Limits that end the slow ones in a second or two.
fn small_limits() -> Limits {
    Limits {
        cpu_seconds: 1,
        wall_ms: 1_500,
        ..Limits::default()
    }
}

/// Ten rows: good ones at `good`, the hostile programs (quick ones first,
/// then slow ones when `slow`) elsewhere; with the reason each hostile row
/// fails for.
fn rows(good: &[u64], slow: bool) -> (Vec<SourceRow>, BTreeMap<u64, String>) {
    let slow: &[(&str, &str)] = if slow { &SLOW_HOSTILE } else { &[] };
    let mut hostile = QUICK_HOSTILE.iter().chain(slow);
    let mut why = BTreeMap::new();
    let rows = (0..10u64)
        .map(|k| {
            let program = if good.contains(&k) {
                GOOD
            } else {
                let (p, reason) = hostile
                    .next()
                    .or(QUICK_HOSTILE.first())
                    .expect("hostile programs");
                why.insert(k, (*reason).to_owned());
                p
            };
            SourceRow {
                index: k,
                name: format!("line {}", k + 1),
                program: program.into(),
                inputs: "3\n".into(),
                output: None,
            }
        })
        .collect();
    (rows, why)
}

/// Bad rows and their reasons, a time limit's kind aside.
fn same(a: &BTreeMap<u64, String>, b: &BTreeMap<u64, String>) -> bool {
    let timeout = |s: &String| s.replace("cpu_timeout", "wall_timeout");
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ra, wa), (rb, wb))| ra == rb && timeout(wa) == timeout(wb))
}

fn trace_env(rows: Vec<SourceRow>, workers: usize) -> Arc<TraceEnv> {
    let exec = Executor::new(ExecutorConfig::new("/usr/bin/python3", workers, false))
        .expect("sandbox executor (needs root)");
    Arc::new(
        TraceEnv::new(rows, exec, 3)
            .unwrap()
            .with_dataset("hostile.jsonl")
            .with_limits(small_limits()),
    )
}

/// What a reader of the stream saw: rows found bad, draws by reason, and
/// which cursors made tasks.
#[derive(Debug, Default, PartialEq)]
struct Read {
    bad_rows: BTreeMap<u64, String>,
    skipped: BTreeMap<String, u64>,
    made: Vec<u64>,
}

/// Reads `draws` draws as Stage 3's `draw` does.
fn read(env: Arc<dyn Environment>, draws: usize, comm: &dyn Communicator) -> anyhow::Result<Read> {
    let mut r = Read::default();
    let mut stream = SharedTasks::start(env, 7, 0, 8, &BTreeMap::new(), comm);
    let mut barren = Barren::new(comm.rank() == 0);
    for _ in 0..draws {
        let (cursor, id, task) = stream.recv(comm)?;
        match task {
            Ok(_) => {
                barren.made();
                r.made.push(cursor);
            }
            Err(why) => {
                barren.skip(stream.env(), id, why, &mut r.bad_rows, &mut r.skipped)?;
            }
        }
    }
    Ok(r)
}

#[test]
fn a_broken_row_runs_once_and_is_never_drawn_again() {
    let (rows, why) = rows(&[0, 5], true);
    let env = trace_env(rows, 2);
    let t = Instant::now();
    let r = read(env.clone(), 200, &Single).unwrap();
    // Each hostile row is found bad for its own reason, once.
    assert!(same(&r.bad_rows, &why), "{:?}", r.bad_rows);
    let runs = env.rows().unwrap().runs();
    for (row, n) in runs.iter().enumerate() {
        if why.contains_key(&(row as u64)) {
            assert_eq!(*n, 1, "hostile row {row} ran {n} times: {runs:?}");
        } else {
            // The original once, then a variant a draw.
            assert!(*n > 10, "good row {row} ran {n} times: {runs:?}");
        }
    }
    // The good rows keep being drawn; every hostile draw after the first
    // of its row is counted as a bad row's.
    assert!(r.made.len() > 20, "{r:?}");
    let firsts: u64 = why.len() as u64;
    let skipped: u64 = r.skipped.values().sum();
    assert_eq!(r.made.len() as u64 + skipped, 200);
    assert_eq!(r.skipped[BAD_ROW], skipped - firsts, "{:?}", r.skipped);
    assert!(r.skipped[BAD_ROW] > 50, "{:?}", r.skipped);
    for reason in r.bad_rows.values() {
        assert!(r.skipped[reason] >= 1, "{reason}: {:?}", r.skipped);
    }
    // Two slow rows cost their limits once, not a draw each.
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
}

#[test]
fn ranks_agree_on_the_bad_rows_and_each_runs_a_broken_row_once() {
    let (rows, why) = rows(&[2, 7], false);
    let alone = read(trace_env(rows.clone(), 1), 120, &Single).unwrap();
    assert_eq!(alone.bad_rows, why);
    // Each rank with its own environment and sandbox, as separate
    // processes are: rank r makes every other draw.
    let envs: Vec<Arc<TraceEnv>> = (0..2).map(|_| trace_env(rows.clone(), 1)).collect();
    let got = run_ranks(2, |c| {
        let env: Arc<dyn Environment> = envs[c.rank()].clone();
        read(env, 120, &c)
    })
    .unwrap();
    for (rank, r) in got.iter().enumerate() {
        assert_eq!(r, &alone, "rank {rank}");
    }
    for (rank, env) in envs.iter().enumerate() {
        let runs = env.rows().unwrap().runs();
        for row in why.keys() {
            assert!(
                runs[*row as usize] <= 1,
                "rank {rank} ran hostile row {row} {} times: {runs:?}",
                runs[*row as usize]
            );
        }
    }
}

#[test]
fn a_dataset_of_broken_rows_stops_with_an_error_naming_it() {
    let (rows, why) = rows(&[], false);
    assert_eq!(why.len(), 10);
    let env = trace_env(rows, 2);
    let e = read(env.clone(), 10_000, &Single).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("dataset `hostile.jsonl`")
            && msg.contains("all 10 rows")
            && msg.contains("hint:"),
        "{msg}"
    );
    assert!(msg.contains("original_signal 1"), "{msg}");
    assert!(env.rows().unwrap().runs().iter().all(|&n| n == 1));
}

#[test]
fn a_thousand_draws_in_a_row_without_a_task_stop_the_run() {
    // Reasons that do not blame a row (a variant the injection broke, a
    // prompt too long) never mark it bad, but a run that draws nothing
    // else must not spin forever paying the sandbox for every draw.
    let (rows, _) = rows(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], false);
    let env = trace_env(rows, 1);
    let mut barren = Barren::new(true);
    let (mut bad, mut skipped) = (BTreeMap::new(), BTreeMap::new());
    let mut skip = |barren: &mut Barren, id: u64, why: &str| {
        barren.skip(&*env, id, why.into(), &mut bad, &mut skipped)
    };
    let n = MAX_BARREN_DRAWS - 1;
    for id in 0..n {
        skip(&mut barren, id, "error_exit").unwrap();
    }
    barren.made(); // a usable task ends the streak
    for id in 0..n {
        skip(&mut barren, id, "error_exit").unwrap();
    }
    let e = skip(&mut barren, n, "prompt_too_long").unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains(&format!(
            "dataset `hostile.jsonl`: {MAX_BARREN_DRAWS} draws in a row made no usable task (error_exit {n}, prompt_too_long 1); 0 of its 10 rows"
        )) && msg.contains("hint:"),
        "{msg}"
    );
    assert!(bad.is_empty());
    assert_eq!(skipped["error_exit"], 2 * n);
    // Nothing ran: the counting needs no sandbox.
    assert!(env.rows().unwrap().runs().iter().all(|&n| n == 0));
}

fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            // Wall-clock figures differ run to run; everything else must not.
            v.as_object_mut()
                .unwrap()
                .retain(|k, _| !k.starts_with("time_") && !k.contains("per_s") && k != "wall_time");
            v
        })
        .collect()
}

fn trainer_extra(run: &Path, step: u64) -> serde_json::Value {
    let s: serde_json::Value = serde_json::from_slice(
        &std::fs::read(run.join(format!("step_{step}/trainer_state.json"))).unwrap(),
    )
    .unwrap();
    s["extra"].clone()
}

#[test]
fn a_resumed_run_keeps_its_bad_rows_and_repeats_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    trace_train::model::arch::tiny::write_tiny_chat_model(&base, 7).unwrap();
    let (rows, why) = rows(&[0, 5], false);
    let config = RlConfig {
        algorithm: "grpo".into(),
        group_size: Some(2),
        dynamic_sampling: false,
        batch_size: 2,
        num_train_steps: 4,
        max_new_tokens: 2,
        mini_batch_size: 4,
        kl_coef: Some(0.01),
        max_prompt_tokens: 2000,
        save: trace_train::config::SaveSettings {
            save_steps: 2,
            ..RlConfig::default().save
        },
        optim: trace_train::config::OptimSettings {
            learning_rate: 1e-3,
            ..RlConfig::default().optim
        },
        lora: trace_train::config::LoraSettings {
            r: 8,
            alpha: 16.0,
            ..RlConfig::default().lora
        },
        ..RlConfig::default()
    };
    // A fresh environment each run, as a fresh process has.
    let run = |out: &str, resume: bool, max_steps: Option<u64>| {
        let env = trace_env(rows.clone(), 2);
        let job = RlJob {
            config: config.clone(),
            curriculum: CurriculumConfig::default(),
            model: ModelConfig::default(),
            base_dir: base.clone(),
            output_dir: dir.path().join(out),
            device: Device::Cpu,
            env: env.clone(),
            env_description: "trace:hostile".into(),
            resume,
            force: false,
            max_steps,
        };
        let s = ppo::run(&job, &NoProgress).unwrap();
        (s, env)
    };
    let (full, _) = run("full", false, None);
    assert_eq!(full.steps, 4);
    // Eight tasks made from two good rows among eight broken ones: every
    // broken row turns up, is marked once and then passed over unrun.
    assert_eq!(full.bad_rows, why);
    assert!(full.skipped_tasks[BAD_ROW] > 0, "{:?}", full.skipped_tasks);

    let (cut, _) = run("cut", false, Some(2));
    assert_eq!(cut.steps, 2);
    let known = trainer_extra(&dir.path().join("cut"), 2);
    let known: RlState = serde_json::from_value(known).unwrap();
    assert!(!known.bad_rows.is_empty());
    let (resumed, env) = run("cut", true, None);
    assert_eq!((resumed.resumed_from, resumed.steps), (Some(2), 4));
    // The checkpoint's bad rows were not run again.
    let runs = env.rows().unwrap().runs();
    for row in known.bad_rows.keys() {
        assert_eq!(runs[*row as usize], 0, "row {row}: {runs:?}");
    }
    let (a, b) = (
        lines_of(&dir.path().join("full/metrics.jsonl")),
        lines_of(&dir.path().join("cut/metrics.jsonl")),
    );
    assert_eq!(a.len(), 4);
    assert_eq!(a, b, "the resumed run's steps differ");
    assert_eq!(a[3]["bad_rows"], 8, "{}", a[3]);
    assert_eq!(
        trainer_extra(&dir.path().join("full"), 4),
        trainer_extra(&dir.path().join("cut"), 4)
    );

    // A checkpoint written before bad rows were kept still loads.
    let mut old = trainer_extra(&dir.path().join("cut"), 2);
    old.as_object_mut().unwrap().remove("bad_rows").unwrap();
    let old: RlState = serde_json::from_value(old).unwrap();
    assert!(old.bad_rows.is_empty());
    assert_eq!(old.skipped_tasks, known.skipped_tasks);
}

/// Ten rows as the rl-python JSONL has them: the hostile programs, with
/// good ones at `good`.
fn write_rows(path: &Path, good: &[u64]) -> BTreeMap<u64, String> {
    let (rows, why) = rows(good, false);
    let text: String = rows
        .iter()
        .map(|r| {
            format!(
                "{}\n",
                serde_json::json!({"program": r.program, "inputs": r.inputs, "output": ""})
            )
        })
        .collect();
    std::fs::write(path, text).unwrap();
    why
}

#[test]
fn the_binary_reports_each_broken_row_once_and_stops_on_a_dataset_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(dir.path(), &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let why = write_rows(&dir.path().join("rows.jsonl"), &[0, 5]);
    write_rows(&dir.path().join("broken.jsonl"), &[]);
    let config = |dataset: &str| {
        format!(
            r#"{{"ppo": {{"algorithm": "grpo", "group_size": 2, "dynamic_sampling": false, "batch_size": 2,
                    "num_train_steps": 3, "max_new_tokens": 2, "mini_batch_size": 4, "save_steps": 0,
                    "learning_rate": 0.001, "max_prompt_tokens": 2000, "num_workers": 2, "kl_coef": 0.01,
                    "dataset": "{dataset}"}}}}"#
        )
    };
    std::fs::write(dir.path().join("s3.json"), config("rows.jsonl")).unwrap();
    let t = Instant::now();
    let o = trace_train(dir.path(), &ppo_args("run", &[]));
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    // One line a broken row, naming it and why, however often it was drawn.
    for (row, reason) in &why {
        let line = format!("row {row} (line {})", row + 1);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(&line)).collect();
        assert_eq!(lines.len(), 1, "{line}: {err}");
        assert!(
            lines[0].contains("dataset `rows.jsonl`") && lines[0].contains(reason.as_str()),
            "{}",
            lines[0]
        );
    }
    assert!(
        err.contains("8 of the 10 rows of `rows.jsonl` fail"),
        "{err}"
    );
    let metrics = lines_of(&dir.path().join("run/metrics.jsonl"));
    let last = metrics.last().unwrap();
    assert_eq!(last["bad_rows"], 8, "{last}");
    assert!(
        last["skipped_tasks_total/bad_row_again"].as_f64().unwrap() > 0.0,
        "{last}"
    );
    assert!(t.elapsed() < Duration::from_secs(120), "{:?}", t.elapsed());

    // Nothing but broken rows: a clear error, soon, instead of a run that
    // never finishes a step.
    std::fs::write(dir.path().join("s3.json"), config("broken.jsonl")).unwrap();
    let t = Instant::now();
    let o = trace_train(dir.path(), &ppo_args("broken", &[]));
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("dataset `broken.jsonl`: all 10 rows fail") && err.contains("hint:"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
}
