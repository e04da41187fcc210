//! Benchmarks against the peer, each side measured in the same run.
//! `bench train` / `bench gen` ([`train`]) and `bench rl` ([`rl`]) measure
//! training, sampling and a whole Stage 3 step on random weights.
//!
//! `bench sandbox`: our executor against the peer approach, in one run, on
//! the same cores and the same programs.
//!
//! The peer (`benches/peer_sandbox.py`, shipped inside the binary) is what
//! Trace data pipelines commonly do: a `concurrent.futures` thread pool and a
//! fresh `subprocess.run([python, file])` a program, with no isolation. We
//! measure programs per second over the built-in corpus, and the per-program
//! overhead on a program that does nothing, for both, and report ratios.

pub mod fp8;
pub mod rl;
pub mod serve;
pub mod train;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::dataset::builtin;
use crate::sandbox::{Executor, ExecutorConfig, Request, Status};

pub const PEER_SCRIPT: &str = include_str!("../benches/peer_sandbox.py");

#[derive(Debug, Clone)]
pub struct SandboxBenchOptions {
    pub python: PathBuf,
    pub workers: usize,
    /// Passes over the corpus.
    pub repeat: usize,
    /// Runs of the empty program, for the overhead measurement.
    pub overhead_runs: usize,
    /// Interleaved rounds; the median is reported.
    pub rounds: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub programs: usize,
    pub ok: usize,
    pub seconds: f64,
    pub programs_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SandboxBench {
    pub cores: usize,
    pub workers: usize,
    pub python: String,
    pub corpus_programs: usize,
    pub ours: Side,
    /// The peer with one thread a core, and with two.
    pub peer_one_per_core: Side,
    pub peer_two_per_core: Side,
    /// ours / the peer's better run, programs per second.
    pub throughput_ratio: f64,
    /// Milliseconds a program, one worker, empty program.
    pub ours_overhead_ms: f64,
    pub peer_overhead_ms: f64,
}

pub fn bench_sandbox(o: &SandboxBenchOptions) -> anyhow::Result<SandboxBench> {
    let corpus = builtin::programs();
    let items: Vec<(String, String)> = corpus
        .iter()
        .map(|r| (r.program.clone(), r.inputs.clone()))
        .collect();

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let reqs: Vec<Request> = (0..o.repeat)
        .flat_map(|_| {
            items
                .iter()
                .map(|(p, i)| Request::new(p.as_bytes(), i.as_bytes()))
        })
        .collect();

    // Rounds interleave the three contenders, so a slow spell of the machine
    // hits all of them; each side's median round is reported.
    let (mut ours_runs, mut peer1_runs, mut peer2_runs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.rounds.max(1) {
        peer1_runs.push(run_peer(o, &items, cores, o.repeat)?);
        peer2_runs.push(run_peer(o, &items, 2 * cores, o.repeat)?);
        // Timed from before the workers start: their start-up is ours to pay.
        let t = Instant::now();
        let exec = Executor::new(ExecutorConfig::new(&o.python, o.workers, false))?;
        let outs = exec.run_all(&reqs);
        let secs = t.elapsed().as_secs_f64();
        ours_runs.push(Side {
            programs: reqs.len(),
            ok: outs.iter().filter(|o| o.status == Status::Ok).count(),
            seconds: secs,
            programs_per_s: reqs.len() as f64 / secs,
        });
    }
    let (ours, peer_one_per_core, peer_two_per_core) =
        (median(ours_runs), median(peer1_runs), median(peer2_runs));
    let peer_best = peer_one_per_core
        .programs_per_s
        .max(peer_two_per_core.programs_per_s);

    let empty = vec![(String::from("pass\n"), String::new())];
    let peer_overhead = run_peer(o, &empty, 1, o.overhead_runs)?;
    let empty_reqs: Vec<Request> = (0..o.overhead_runs)
        .map(|_| Request::new("pass\n", ""))
        .collect();
    let one = Executor::new(ExecutorConfig::new(&o.python, 1, false))?;
    let t = Instant::now();
    let outs = one.run_all(&empty_reqs);
    let ours_overhead_ms = t.elapsed().as_secs_f64() * 1000.0 / empty_reqs.len() as f64;
    if outs.iter().any(|o| o.status != Status::Ok) {
        bail!("the empty program failed in the sandbox");
    }

    Ok(SandboxBench {
        cores,
        workers: o.workers,
        python: one.python_version().to_owned(),
        corpus_programs: items.len(),
        throughput_ratio: ours.programs_per_s / peer_best,
        ours,
        peer_one_per_core,
        peer_two_per_core,
        ours_overhead_ms,
        peer_overhead_ms: peer_overhead.seconds * 1000.0 / peer_overhead.programs as f64,
    })
}

fn run_peer(
    o: &SandboxBenchOptions,
    items: &[(String, String)],
    workers: usize,
    repeat: usize,
) -> anyhow::Result<Side> {
    let script = tempfile::Builder::new()
        .prefix("peer_sandbox")
        .suffix(".py")
        .tempfile()?;
    std::fs::write(script.path(), PEER_SCRIPT)?;
    let input: Vec<_> = items
        .iter()
        .map(|(p, i)| serde_json::json!({"program": p, "stdin": i}))
        .collect();
    let mut child = Command::new(&o.python)
        .arg(script.path())
        .args(["--python", &o.python.to_string_lossy()])
        .args(["--workers", &workers.to_string()])
        .args(["--repeat", &repeat.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the peer benchmark")?;
    let data = serde_json::to_vec(&input)?;
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    if !out.status.success() {
        bail!("peer benchmark failed");
    }
    #[derive(serde::Deserialize)]
    struct PeerOut {
        programs: usize,
        ok: usize,
        seconds: f64,
        programs_per_s: f64,
    }
    let p: PeerOut = serde_json::from_slice(&out.stdout).context("peer benchmark output")?;
    Ok(Side {
        programs: p.programs,
        ok: p.ok,
        seconds: p.seconds,
        programs_per_s: p.programs_per_s,
    })
}

/// The round with the median rate.
fn median(mut runs: Vec<Side>) -> Side {
    runs.sort_by(|a, b| a.programs_per_s.total_cmp(&b.programs_per_s));
    runs.swap_remove(runs.len() / 2)
}
