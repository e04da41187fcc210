//! Helpers shared by the integration tests: the binary, a shared sandbox,
//! and what the host can see of the sandbox (processes, fds, temp entries,
//! mounts) before and after runs. The sandbox tests need root, as CI has.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use trace_train::sandbox::{Executor, ExecutorConfig};

pub mod agentgym;
pub mod train;

/// One sandbox for a whole test binary (2 workers).
pub fn exec() -> &'static Executor {
    static EXEC: OnceLock<Executor> = OnceLock::new();
    EXEC.get_or_init(|| {
        Executor::new(ExecutorConfig::new("/usr/bin/python3", 2, false))
            .expect("the sandbox needs root and /usr/bin/python3")
    })
}

/// Serves `state` on a free local port from a thread and runtime of its
/// own, until the test binary ends; the server's `/v1` URL.
pub fn serve_in_process(state: std::sync::Arc<trace_train::serve::AppState>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            trace_train::serve::serve(l, state, std::future::pending(), std::future::pending())
                .await
                .unwrap();
        });
    });
    url
}

/// `n` DPO pairs at `dir/pairs.jsonl` of the `word` environment's kind:
/// the asked word chosen over "no idea".
pub fn write_word_pairs(dir: &Path, n: usize) {
    let words = ["apple", "river", "stone", "cloud"];
    let text: String = (0..n)
        .map(|i| {
            let (w, o) = (words[i % 4], "no idea");
            let p = serde_json::json!({
                "prompt_id": i, "prompt": format!("Answer with the word {w} and nothing else."),
                "chosen": w, "rejected": o, "kind": "correctness",
                "chosen_reward": 1.0, "rejected_reward": 0.0, "edit_distance": 5
            });
            format!("{p}\n")
        })
        .collect();
    std::fs::write(dir.join("pairs.jsonl"), text).unwrap();
}

/// The `trace-train` binary, run in `dir`.
pub fn trace_train(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trace-train"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run trace-train")
}

/// The `trace-train` binary started in `dir`, its standard output dropped
/// and its standard error sent to `stderr` (piped, for a test that reads it
/// after the run; null, for one that kills it).
pub fn start(dir: &Path, args: &[&str], stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_trace-train"))
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start trace-train")
}

/// Waits until a run's metrics file holds `steps` lines (steps logged);
/// fails after `limit`.
pub fn wait_for_steps(metrics: &Path, steps: usize, limit: Duration) {
    let t = Instant::now();
    while std::fs::read_to_string(metrics).map_or(0, |s| s.lines().count()) < steps {
        assert!(
            t.elapsed() < limit,
            "run too slow: {steps} steps not logged in {limit:?} in `{}`",
            metrics.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends SIGTERM to a started run once `logged` steps are in its metrics
/// file (the last step running), and checks that the run still ends as a
/// whole one: exit 0, no "stopped by a signal", each of `parts` written in
/// `run`. Returns the run's stderr.
pub fn sigterm_during_last_step(
    child: Child,
    metrics: &Path,
    logged: usize,
    run: &Path,
    parts: &[&str],
) -> String {
    wait_for_steps(metrics, logged, Duration::from_secs(300));
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("stopped by a signal"), "{err}");
    for part in parts {
        assert!(run.join(part).exists(), "no {part}: {err}");
    }
    err
}

/// Sends `signal` to a started process.
pub fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal)
        .expect("signal the run");
}

/// The Stage 3 command line of the RL tests: the model `base`, the config
/// `s3.json`, on the CPU.
pub fn ppo_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "ppo",
        "--model",
        "base",
        "--config",
        "s3.json",
        "--output_dir",
        out,
        "--device",
        "cpu",
    ];
    v.extend_from_slice(extra);
    v
}

/// The tiny chat model as `base` in `dir` and, as `s3.json`, GRPO on the
/// word environment (no sandbox, no checkpoints but the last) with
/// `batch` prompts x 2, `steps` steps and `new_tokens` new tokens.
pub fn word_grpo(dir: &Path, batch: usize, steps: usize, new_tokens: usize) {
    let o = trace_train(dir, &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(
        dir.join("s3.json"),
        format!(
            r#"{{"ppo": {{"algorithm": "grpo", "environment": "word", "group_size": 2,
                    "dynamic_sampling": false, "batch_size": {batch}, "num_train_steps": {steps},
                    "max_new_tokens": {new_tokens}, "mini_batch_size": {batch}, "save_steps": 0,
                    "learning_rate": 0.001, "kl_coef": 0.01}}}}"#
        ),
    )
    .unwrap();
}

/// The largest absolute elementwise difference of two same-shaped tensors.
pub fn max_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs()?.max_all()?.to_scalar())
        .expect("tensors of the same shape")
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;

use trace_train::sandbox::{DEFAULT_UID_BASE, Isolation, Limits};

/// Debian's interpreter: readable and runnable by the sandbox uids.
pub const PYTHON: &str = "/usr/bin/python3";

/// A sandboxed executor whose slot `i` runs as uid `uid_base + i`.
///
/// Each test binary takes its own uids inside the sandbox range, clear of
/// `DEFAULT_UID_BASE`: other executors on a shared machine (a benchmark, a
/// generation run) use the default uids, and both RLIMIT_NPROC and the
/// leftover census below count per uid, machine-wide.
pub fn sandbox_config(workers: usize, uid_base: u32) -> ExecutorConfig {
    assert!(uid_base > DEFAULT_UID_BASE && uid_base + (workers as u32) < DEFAULT_UID_BASE + 100);
    let mut config = ExecutorConfig::new(PYTHON, workers, false);
    match &mut config.isolation {
        Isolation::Sandbox { uid_base: base, .. } => *base = Some(uid_base),
        Isolation::Rootless { .. } | Isolation::Unsafe => unreachable!("asked for a sandbox"),
    }
    config
}

/// Small limits, so hostile programs end quickly.
pub fn small_limits() -> Limits {
    Limits {
        cpu_seconds: 2,
        wall_ms: 3_000,
        memory_bytes: 256 << 20,
        stdout_bytes: 1 << 20,
        stderr_bytes: 1 << 20,
        file_size_bytes: 8 << 20,
        open_files: 64,
        processes: 16,
    }
}

/// A field of `/proc/<pid>/status` (`Uid`, `PPid`, `NSpid`, `VmHWM`, ...).
pub fn status_field(pid: i32, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// Pids of every process on the host (the host's /proc sees into every pid
/// namespace).
pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Every live process with any of its uids (real, effective, saved, fs) in
/// `uids`, described as `pid name uid`. A process that exits while we look
/// is skipped.
pub fn processes_of(uids: &Range<u32>) -> Vec<String> {
    all_pids()
        .into_iter()
        .filter_map(|pid| {
            let ids = status_field(pid, "Uid")?;
            let uid = ids
                .split_whitespace()
                .filter_map(|u| u.parse::<u32>().ok())
                .find(|u| uids.contains(u))?;
            let name = status_field(pid, "Name").unwrap_or_default();
            Some(format!("{pid} {name} uid {uid}"))
        })
        .collect()
}

/// Direct children of `pid` (from each process's parent pid).
pub fn children_of(pid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| status_field(p, "PPid").and_then(|v| v.parse().ok()) == Some(pid))
        .collect()
}

/// Every process below `pid`.
pub fn descendants_of(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let kids = children_of(p);
        found.extend(&kids);
        todo.extend(kids);
    }
    found
}

/// Whether `pid` is the init of a pid namespace below ours, as a worker's
/// zygote is (its last `NSpid` is 1).
pub fn is_namespace_init(pid: i32) -> bool {
    status_field(pid, "NSpid").is_some_and(|v| {
        let ids: Vec<&str> = v.split_whitespace().collect();
        ids.len() >= 2 && ids.last() == Some(&"1")
    })
}

/// Asserts that nothing a program started is still alive: no process of the
/// slot uids `uids` anywhere, and below this test process only idle zygotes
/// (namespace inits without children).
pub fn assert_nothing_left(what: &str, uids: &Range<u32>) {
    let left = processes_of(uids);
    assert!(left.is_empty(), "{what}: sandbox processes left: {left:?}");
    let me = std::process::id() as i32;
    for child in children_of(me) {
        let name = status_field(child, "Name").unwrap_or_default();
        assert!(
            is_namespace_init(child),
            "{what}: child {child} ({name}) of the test process is not a worker zygote"
        );
        let grandchildren = descendants_of(child);
        assert!(
            grandchildren.is_empty(),
            "{what}: zygote {child} still has processes {grandchildren:?}"
        );
    }
}

/// Number of open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Entries of the host's `/tmp` that programs run as `uids` could have left
/// (owned by one of them, or named with `prefix`). Other builds share this
/// machine's /tmp, so unrelated entries are not counted.
pub fn tmp_entries_of(uids: &Range<u32>, prefix: &str) -> BTreeSet<OsString> {
    std::fs::read_dir("/tmp")
        .expect("read /tmp")
        .filter_map(|e| {
            let e = e.ok()?;
            let meta = e.metadata().ok()?;
            let name = e.file_name();
            let ours = uids.contains(&meta.uid())
                || uids.contains(&meta.gid())
                || name.to_string_lossy().starts_with(prefix);
            ours.then_some(name)
        })
        .collect()
}

/// All entry names of a host folder.
pub fn dir_entries(dir: &Path) -> BTreeSet<OsString> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| Some(e.ok()?.file_name())).collect())
        .unwrap_or_default()
}

/// Mount points at `/tmp` in the mount namespace of `pid`.
pub fn tmp_mounts_of(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map(|t| {
            t.lines()
                .filter(|l| l.split_whitespace().nth(4) == Some("/tmp"))
                .count()
        })
        .unwrap_or(0)
}

/// Open fds of another process (root may look).
pub fn fds_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

/// Peak resident memory of this process, in KiB.
pub fn peak_rss_kib() -> u64 {
    let v = status_field(std::process::id() as i32, "VmHWM").expect("VmHWM");
    v.trim_end_matches("kB")
        .trim()
        .parse()
        .expect("VmHWM in kB")
}
