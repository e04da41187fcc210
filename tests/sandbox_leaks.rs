//! 2,000 mixed runs through one 4-worker executor, then a census: no process
//! of a sandbox uid, no new temp entries, no fd leaked by the harness or by a
//! zygote, no /tmp mount left stacked in a worker, no worker replaced, and
//! every run ended as its program says it should.
//!
//! Needs root, like the sandbox itself. The only test in this binary, so the
//! process-wide counts (fds, children) are its own.

mod common;

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use common::*;
use trace_train::sandbox::{Executor, Limits, Outcome, Request, Status};

const RUNS: usize = 2_000;
const WORKERS: usize = 4;
/// Slot uids of this test's executor.
const UIDS: Range<u32> = 61_060..61_060 + WORKERS as u32;
/// Names the programs give their temp files, to look for them on the host.
const TMP_PREFIX: &str = "trace_train_leak_";

/// The kinds of program, each with its weight in a cycle of 20 runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Compute,
    Raise,
    ExitCode,
    Sleep,
    Busy,
    StdoutFlood,
    StderrFlood,
    ForkAndExit,
    BackgroundSleep,
    BackgroundChild,
    Memory,
    TempFiles,
    Abort,
}

const CYCLE: [(Kind, usize); 13] = [
    (Kind::Compute, 5),
    (Kind::Raise, 1),
    (Kind::ExitCode, 1),
    (Kind::Sleep, 1),
    (Kind::Busy, 1),
    (Kind::StdoutFlood, 1),
    (Kind::StderrFlood, 1),
    (Kind::ForkAndExit, 2),
    (Kind::BackgroundSleep, 2),
    (Kind::BackgroundChild, 1),
    (Kind::Memory, 1),
    (Kind::TempFiles, 2),
    (Kind::Abort, 1),
];

fn limits() -> Limits {
    Limits {
        cpu_seconds: 2,
        // Short, so timeouts cost little; the other kinds end well before.
        wall_ms: 1_500,
        memory_bytes: 256 << 20,
        stdout_bytes: 16 << 10,
        stderr_bytes: 16 << 10,
        ..small_limits()
    }
}

fn request(kind: Kind, i: usize) -> Request {
    let program = match kind {
        Kind::Compute => "n = int(input())\nprint(sum(range(n)))\n",
        Kind::Raise => "raise ValueError('boom %d' % int(input()))\n",
        Kind::ExitCode => "import sys\nsys.exit(int(input()) % 100 + 2)\n",
        Kind::Sleep => "import time\ntime.sleep(60)\n",
        Kind::Busy => "while True: pass\n",
        Kind::StdoutFlood => "while True:\n    print('x' * 1000)\n",
        Kind::StderrFlood => "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)\n",
        Kind::ForkAndExit => {
            "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('forked')\n"
        }
        Kind::BackgroundSleep => {
            "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('left sleep running')\n"
        }
        Kind::BackgroundChild => {
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('left a child')\n"
        }
        Kind::Memory => "x = bytearray(1 << 34)\n",
        Kind::TempFiles => {
            "import os, tempfile\nfor i in range(20):\n    open('/tmp/trace_train_leak_%d' % i, 'w').write('y')\nd = tempfile.mkdtemp(prefix='trace_train_leak_')\nopen(os.path.join(d, 'z'), 'w').write('z')\nprint(len(os.listdir('/tmp')))\n"
        }
        Kind::Abort => "import os\nos.abort()\n",
    };
    let mut limits = limits();
    if matches!(kind, Kind::Sleep | Kind::Busy) {
        limits.wall_ms = 150;
    }
    Request {
        limits,
        ..Request::new(program, format!("{i}\n"))
    }
}

/// Whether `out` is what a run of `kind` with input `i` must give; `Err`
/// says what differs.
fn check(kind: Kind, i: usize, out: &Outcome) -> Result<(), String> {
    let (status, exit, stdout): (Status, Option<i32>, Option<String>) = match kind {
        Kind::Compute => (
            Status::Ok,
            Some(0),
            Some(format!("{}\n", i * i.saturating_sub(1) / 2)),
        ),
        Kind::Raise => (Status::ErrorExit, Some(1), Some(String::new())),
        Kind::ExitCode => (
            Status::ErrorExit,
            Some((i % 100 + 2) as i32),
            Some(String::new()),
        ),
        Kind::Sleep | Kind::Busy => (Status::WallTimeout, None, None),
        Kind::StdoutFlood | Kind::StderrFlood => (Status::OutputLimit, None, None),
        Kind::ForkAndExit => (Status::Ok, Some(0), Some("forked\n".into())),
        Kind::BackgroundSleep => (Status::Ok, Some(0), Some("left sleep running\n".into())),
        Kind::BackgroundChild => (Status::Ok, Some(0), Some("left a child\n".into())),
        Kind::Memory => (Status::MemoryLimit, Some(1), Some(String::new())),
        // 20 files and the temp dir: /tmp is empty at every start.
        Kind::TempFiles => (Status::Ok, Some(0), Some("21\n".into())),
        Kind::Abort => (Status::Signal, None, Some(String::new())),
    };
    let mut bad = Vec::new();
    if out.status != status {
        bad.push(format!("status {:?}, want {status:?}", out.status));
    }
    if exit.is_some() && out.exit_code != exit {
        bad.push(format!("exit {:?}, want {exit:?}", out.exit_code));
    }
    if let Some(s) = stdout
        && out.stdout != s.as_bytes()
    {
        bad.push(format!(
            "stdout {:?}, want {s:?}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    match kind {
        Kind::Raise
            if !String::from_utf8_lossy(&out.stderr).contains(&format!("ValueError: boom {i}")) =>
        {
            bad.push("no ValueError on stderr".into())
        }
        Kind::StdoutFlood if !(out.stdout_truncated && out.stdout.len() == 16 << 10) => {
            bad.push(format!(
                "stdout {} bytes, truncated {}",
                out.stdout.len(),
                out.stdout_truncated
            ))
        }
        Kind::StderrFlood if !(out.stderr_truncated && out.stderr.len() == 16 << 10) => {
            bad.push(format!(
                "stderr {} bytes, truncated {}",
                out.stderr.len(),
                out.stderr_truncated
            ))
        }
        Kind::Abort if out.signal != Some(libc::SIGABRT) => {
            bad.push(format!("signal {:?}", out.signal))
        }
        _ => {}
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "run {i} ({kind:?}): {}; detail {:?}; stderr {:?}",
            bad.join(", "),
            out.detail,
            String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(300)])
        ))
    }
}

/// What each zygote holds: fds, /tmp mounts, resident memory (KiB).
fn zygote_state(pid: i32) -> (usize, usize, u64) {
    let rss = status_field(pid, "VmRSS")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (fds_of(pid), tmp_mounts_of(pid), rss)
}

#[test]
fn two_thousand_mixed_runs_leak_no_process_temp_entry_fd_or_mount() {
    let me = std::process::id() as i32;
    let fds_before = open_fds();
    let tmp_before = tmp_entries_of(&UIDS, TMP_PREFIX);
    assert_eq!(
        children_of(me),
        Vec::<i32>::new(),
        "test process already has children"
    );
    assert_eq!(
        processes_of(&UIDS),
        Vec::<String>::new(),
        "sandbox processes before the test"
    );

    let exec =
        Executor::new(sandbox_config(WORKERS, UIDS.start)).expect("sandbox executor (needs root)");
    let zygotes = children_of(me);
    assert_eq!(zygotes.len(), WORKERS, "one zygote per worker: {zygotes:?}");
    assert!(zygotes.iter().all(|&z| is_namespace_init(z)));
    // Warm up each worker once, so lazily created state is in the baseline.
    for out in exec.run_all(&vec![Request::new("print(1)\n", ""); WORKERS * 2]) {
        assert_eq!(out.status, Status::Ok, "{out:?}");
    }
    let zygote_before: BTreeMap<i32, _> = zygotes.iter().map(|&z| (z, zygote_state(z))).collect();

    let pattern: Vec<Kind> = CYCLE
        .iter()
        .flat_map(|&(k, n)| std::iter::repeat_n(k, n))
        .collect();
    // Interleave the kinds (7 is coprime to the cycle of 20), so slow and
    // fast runs mix on every worker.
    let kinds: Vec<Kind> = (0..RUNS)
        .map(|i| pattern[(i * 7) % pattern.len()])
        .collect();
    let reqs: Vec<Request> = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| request(k, i))
        .collect();

    let t = Instant::now();
    let outs = exec.run_all(&reqs);
    let took = t.elapsed();
    eprintln!("{RUNS} runs on {WORKERS} workers in {took:.1?}");

    let bad: Vec<String> = kinds
        .iter()
        .zip(&outs)
        .enumerate()
        .filter_map(|(i, (&k, out))| check(k, i, out).err())
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {RUNS} runs ended wrongly; first ones:\n{}",
        bad.len(),
        bad[..bad.len().min(10)].join("\n")
    );
    assert!(took < Duration::from_secs(120), "{RUNS} runs took {took:?}");

    let left = processes_of(&UIDS);
    assert!(left.is_empty(), "sandbox processes left: {left:?}");
    // The same zygotes (none replaced), each idle, with what it held before.
    assert_eq!(
        children_of(me),
        zygotes,
        "a worker was replaced or a child escaped"
    );
    for &z in &zygotes {
        assert_eq!(
            descendants_of(z),
            Vec::<i32>::new(),
            "zygote {z} has processes"
        );
        let (fds, mounts, rss) = zygote_state(z);
        let (fds0, mounts0, rss0) = zygote_before[&z];
        assert_eq!(fds, fds0, "zygote {z} fds");
        assert_eq!(mounts, mounts0, "zygote {z} /tmp mounts");
        assert!(
            rss < rss0 + (16 << 10),
            "zygote {z} grew from {rss0} to {rss} KiB"
        );
    }

    drop(exec);
    assert_eq!(
        children_of(me),
        Vec::<i32>::new(),
        "zygotes left after drop"
    );
    assert_eq!(processes_of(&UIDS), Vec::<String>::new());
    assert_eq!(open_fds(), fds_before, "harness fds leaked");
    assert_eq!(
        tmp_entries_of(&UIDS, TMP_PREFIX),
        tmp_before,
        "entries left in /tmp"
    );
}
