//! Running untrusted Python exactly, fast and safely.
//!
//! The sandbox owns processes and bytes, nothing else: it knows no datasets,
//! tensors or prompts. An [`Executor`] keeps one pre-started, isolated Python
//! zygote per worker slot (see `zygote.py` for the process tree and the wire
//! format) and runs [`Request`]s on them in parallel. A program's failure is
//! data in its [`Outcome`]; a [`SandboxError`] means the sandbox itself could
//! not be set up.
//!
//! Isolation, per worker slot: its own unprivileged uid/gid, private mount
//! (read-only system, hidden home folders), network (no interfaces up), IPC
//! and UTS namespaces. Per program: a fresh pid namespace whose init is ours,
//! a fresh size-capped tmpfs as `/tmp`, rlimits, no_new_privs, seccomp, a
//! cleared environment, output caps enforced while reading, a wall deadline.

mod check;
mod seccomp;
mod worker;

use std::path::PathBuf;
use std::sync::{Condvar, Mutex};

use serde::{Deserialize, Serialize};

pub use check::{Protection, ProtectionReport, check_protections};
use worker::Worker;

/// What a program may use. Defaults follow the trace environment's executor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// CPU seconds (RLIMIT_CPU; SIGKILL one second later).
    pub cpu_seconds: u64,
    /// Wall-clock deadline for the whole program tree, in milliseconds.
    pub wall_ms: u64,
    /// Address-space limit (RLIMIT_AS) in bytes.
    pub memory_bytes: u64,
    /// Bytes of stdout kept; more kills the program (status `output_limit`).
    pub stdout_bytes: u64,
    /// Bytes of stderr kept; more kills the program.
    pub stderr_bytes: u64,
    /// Largest file the program may write (RLIMIT_FSIZE).
    pub file_size_bytes: u64,
    /// Open file descriptors (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Processes and threads of the slot's uid (RLIMIT_NPROC).
    pub processes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_seconds: 10,
            wall_ms: 30_000,
            memory_bytes: 512 << 20,
            stdout_bytes: 1 << 20,
            stderr_bytes: 1 << 20,
            file_size_bytes: 16 << 20,
            open_files: 256,
            processes: 32,
        }
    }
}

/// How programs are isolated.
#[derive(Debug, Clone, PartialEq)]
pub enum Isolation {
    /// Full isolation (needs root). Slot `i` runs as uid/gid `uid_base + i`;
    /// `None` claims a free block of uids for the executor's lifetime, so
    /// that executors running at once never share a uid (RLIMIT_NPROC is
    /// counted per uid, machine-wide).
    Sandbox {
        uid_base: Option<u32>,
        /// Paths hidden behind an empty read-only tmpfs.
        hide: Vec<PathBuf>,
    },
    /// `--unsafe-no-sandbox`: rlimits, a session and a temp dir only.
    Unsafe,
}

/// Executor settings.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The interpreter. Must be usable by an unprivileged uid.
    pub python: PathBuf,
    /// Worker slots, hence programs run at once.
    pub workers: usize,
    pub isolation: Isolation,
    /// Size of each slot's private `/tmp` (emptied after every program).
    pub tmp_bytes: u64,
    /// Inodes of each slot's private `/tmp`.
    pub tmp_inodes: u64,
}

impl ExecutorConfig {
    pub fn new(python: impl Into<PathBuf>, workers: usize, unsafe_no_sandbox: bool) -> Self {
        let isolation = if unsafe_no_sandbox {
            Isolation::Unsafe
        } else {
            Isolation::Sandbox {
                uid_base: None,
                hide: vec![PathBuf::from("/root"), PathBuf::from("/home")],
            }
        };
        ExecutorConfig {
            python: python.into(),
            workers: workers.max(1),
            isolation,
            tmp_bytes: 64 << 20,
            tmp_inodes: 4096,
        }
    }
}

/// Worker slots when the user names none: two a core. A slot's zygote is
/// idle for part of every program (while the kernel forks, tears down and
/// the executor answers), so one slot a core leaves the cores partly idle.
pub fn default_workers() -> usize {
    2 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Fixed uid bases (`Isolation::Sandbox { uid_base: Some(..) }`) belong in
/// `DEFAULT_UID_BASE..AUTO_UID_FIRST`; claimed blocks start at `AUTO_UID_FIRST`.
pub const DEFAULT_UID_BASE: u32 = 61_000;
const AUTO_UID_FIRST: u32 = 62_000;
const UID_BLOCK: u32 = 256;
const UID_BLOCKS: u32 = 16;

/// Claims the first free block of slot uids: a lock file per block, held
/// (flock) for as long as the returned guard lives, released by the kernel
/// even if the process dies.
fn claim_uid_block(
    workers: usize,
) -> Result<(u32, nix::fcntl::Flock<std::fs::File>), SandboxError> {
    use nix::fcntl::{Flock, FlockArg};
    if workers as u32 > UID_BLOCK {
        return Err(SandboxError::Setup(format!(
            "{workers} workers is more than the {UID_BLOCK} a sandbox supports"
        )));
    }
    let dir = ["/run/lock", "/run"]
        .iter()
        .map(PathBuf::from)
        .find(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    for k in 0..UID_BLOCKS {
        let base = AUTO_UID_FIRST + k * UID_BLOCK;
        let path = dir.join(format!("trace-train-uids-{base}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| SandboxError::Setup(format!("cannot open `{}`: {e}", path.display())))?;
        if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            return Ok((base, lock));
        }
    }
    Err(SandboxError::Setup(format!(
        "all {UID_BLOCKS} sandbox uid blocks are in use by other executors\nhint: wait for other trace-train runs to finish"
    )))
}

/// One program to run.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub program: Vec<u8>,
    pub stdin: Vec<u8>,
    pub limits: Limits,
}

impl Request {
    pub fn new(program: impl Into<Vec<u8>>, stdin: impl Into<Vec<u8>>) -> Self {
        Request {
            program: program.into(),
            stdin: stdin.into(),
            limits: Limits::default(),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    ErrorExit,
    Signal,
    CpuTimeout,
    WallTimeout,
    OutputLimit,
    MemoryLimit,
    /// The sandbox could not run the program; says nothing about the program.
    SandboxFailure,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::ErrorExit => "error_exit",
            Status::Signal => "signal",
            Status::CpuTimeout => "cpu_timeout",
            Status::WallTimeout => "wall_timeout",
            Status::OutputLimit => "output_limit",
            Status::MemoryLimit => "memory_limit",
            Status::SandboxFailure => "sandbox_failure",
        }
    }
}

/// Everything known about one run. Output is kept as exact bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub cpu_ms: f64,
    pub wall_ms: f64,
    pub max_rss_kb: u64,
    /// Why the sandbox failed, for `SandboxFailure`.
    pub detail: Option<String>,
}

impl Outcome {
    pub fn sandbox_failure(detail: impl Into<String>) -> Self {
        Outcome {
            status: Status::SandboxFailure,
            exit_code: None,
            signal: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            cpu_ms: 0.0,
            wall_ms: 0.0,
            max_rss_kb: 0,
            detail: Some(detail.into()),
        }
    }

    pub fn stdout_is_utf8(&self) -> bool {
        std::str::from_utf8(&self.stdout).is_ok()
    }

    /// JSON for `sandbox run`: text where the bytes are UTF-8, hex where not.
    pub fn to_json(&self) -> serde_json::Value {
        fn bytes(v: &[u8]) -> serde_json::Value {
            match std::str::from_utf8(v) {
                Ok(s) => serde_json::Value::String(s.to_owned()),
                Err(_) => serde_json::json!({ "hex": trace_train_base::hex(v) }),
            }
        }
        serde_json::json!({
            "status": self.status,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "stdout": bytes(&self.stdout),
            "stderr": bytes(&self.stderr),
            "stdout_utf8": self.stdout_is_utf8(),
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "cpu_ms": (self.cpu_ms * 1000.0).round() / 1000.0,
            "wall_ms": (self.wall_ms * 1000.0).round() / 1000.0,
            "max_rss_kb": self.max_rss_kb,
            "detail": self.detail,
        })
    }
}

/// The sandbox itself could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "python interpreter `{path}` is not usable: {reason}\nhint: pass `--python PATH` with an interpreter every uid can read and run, such as /usr/bin/python3"
    )]
    Python { path: PathBuf, reason: String },
    #[error(
        "the sandbox needs root to drop each worker to its own uid and create namespaces (running as uid {uid})\nhint: run as root, or pass `--unsafe-no-sandbox` to run programs without isolation on a machine you trust"
    )]
    NotRoot { uid: u32 },
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("sandbox worker failed to start: {0}")]
    Spawn(String),
}

/// A pool of isolated workers that runs programs.
pub struct Executor {
    config: ExecutorConfig,
    /// Holds this executor's block of slot uids (see `claim_uid_block`).
    _uid_block: Option<nix::fcntl::Flock<std::fs::File>>,
    seccomp: Vec<Vec<u8>>,
    idle: Mutex<Vec<Worker>>,
    freed: Condvar,
    pool: rayon::ThreadPool,
    python_version: String,
}

impl Executor {
    /// Starts every worker slot now, so set-up problems surface before work.
    pub fn new(mut config: ExecutorConfig) -> Result<Self, SandboxError> {
        let mut uid_block = None;
        if let Isolation::Sandbox { uid_base, .. } = &mut config.isolation {
            let uid = nix::unistd::geteuid().as_raw();
            if uid != 0 {
                return Err(SandboxError::NotRoot { uid });
            }
            if uid_base.is_none() {
                let (base, guard) = claim_uid_block(config.workers)?;
                *uid_base = Some(base);
                uid_block = Some(guard);
            }
        }
        check_python(&config.python)?;
        let seccomp = match config.isolation {
            Isolation::Sandbox { .. } => seccomp::filters()?,
            Isolation::Unsafe => Vec::new(),
        };
        // Zygotes start in parallel: each spends ~60 ms importing.
        let workers = std::thread::scope(|s| {
            let handles: Vec<_> = (0..config.workers)
                .map(|slot| {
                    let (config, seccomp) = (&config, &seccomp);
                    s.spawn(move || Worker::spawn(slot, config, seccomp))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("worker start-up thread panicked"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        let python_version = workers
            .first()
            .map(|w| w.python_version.clone())
            .unwrap_or_default();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.workers)
            .thread_name(|i| format!("sandbox-{i}"))
            .build()
            .map_err(|e| SandboxError::Setup(format!("thread pool: {e}")))?;
        Ok(Executor {
            config,
            _uid_block: uid_block,
            seccomp,
            idle: Mutex::new(workers),
            freed: Condvar::new(),
            pool,
            python_version,
        })
    }

    /// The interpreter's version (`3.11.2`), as the zygote reports it.
    pub fn python_version(&self) -> &str {
        &self.python_version
    }

    pub fn workers(&self) -> usize {
        self.config.workers
    }

    pub fn isolation(&self) -> &Isolation {
        &self.config.isolation
    }

    /// Runs one program on the next free worker. Never fails: problems of
    /// the sandbox come back as `Status::SandboxFailure`.
    pub fn run(&self, req: &Request) -> Outcome {
        let mut worker = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(w) = idle.pop() {
                    break w;
                }
                idle = self.freed.wait(idle).unwrap_or_else(|e| e.into_inner());
            }
        };
        let outcome = match worker.run(req) {
            Ok(o) if !worker.retired => o,
            Ok(o) => {
                // The zygote could not clean up after the program: start a
                // fresh one rather than let anything reach the next program.
                let slot = worker.slot;
                drop(worker);
                worker = Worker::spawn(slot, &self.config, &self.seccomp)
                    .unwrap_or_else(|_| Worker::dead(slot));
                o
            }
            Err(detail) => {
                // The worker is in an unknown state: replace it.
                let slot = worker.slot;
                drop(worker);
                let out = Outcome::sandbox_failure(detail);
                worker = match Worker::spawn(slot, &self.config, &self.seccomp) {
                    Ok(w) => w,
                    Err(e) => {
                        // Keep the slot count: a later run retries the spawn.
                        tracing::error!("sandbox worker {slot} could not restart: {e}");
                        Worker::dead(slot)
                    }
                };
                out
            }
        };
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(worker);
        self.freed.notify_one();
        outcome
    }

    /// Runs many programs in parallel over the worker slots, in order.
    pub fn run_all(&self, reqs: &[Request]) -> Vec<Outcome> {
        use rayon::prelude::*;
        self.pool
            .install(|| reqs.par_iter().map(|r| self.run(r)).collect())
    }

    /// Runs `f` inside the executor's thread pool (one thread per slot).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

fn check_python(path: &std::path::Path) -> Result<(), SandboxError> {
    let out = std::process::Command::new(path)
        .args([
            "-c",
            "import sys; print(sys.version_info[0], sys.version_info[1])",
        ])
        .env_clear()
        .output()
        .map_err(|e| SandboxError::Python {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .map(|s| s.parse::<u32>().unwrap_or(0));
    let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    if !out.status.success() || major != 3 || minor < 9 {
        return Err(SandboxError::Python {
            path: path.to_owned(),
            reason: format!(
                "needs Python 3.9 or newer, got `{}`{}",
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}
