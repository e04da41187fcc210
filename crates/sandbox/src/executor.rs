//! The [`Executor`]: a pool of warm, isolated Python workers that runs
//! requests in parallel, each worker slot under its own uid (as root) or in
//! its own user namespace (without root).

use std::path::PathBuf;
use std::sync::Arc;

use crate::request::{ExecutorConfig, Isolation, Limits, Outcome, Request, SandboxError};
use crate::seccomp;
use crate::session::{Session, SessionError};
use crate::slots::Slots;
use crate::worker::Worker;

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

/// A pool of isolated workers that runs programs.
pub struct Executor {
    slots: Arc<Slots>,
    pool: rayon::ThreadPool,
    python_version: String,
}

impl Executor {
    /// Starts every worker slot now, so set-up problems surface before work.
    pub fn new(mut config: ExecutorConfig) -> Result<Self, SandboxError> {
        let mut uid_block = None;
        let uid = nix::unistd::geteuid().as_raw();
        if uid != 0
            && let Isolation::Sandbox { uid_base, hide } = &mut config.isolation
        {
            // Without root: user namespaces, where the kernel allows them.
            config.isolation = Isolation::Rootless {
                uid_base: uid_base.unwrap_or(DEFAULT_UID_BASE),
                hide: std::mem::take(hide),
            };
            if config.workers as u32 > UID_BLOCK {
                return Err(SandboxError::Setup(format!(
                    "{} workers is more than the {UID_BLOCK} a sandbox supports",
                    config.workers
                )));
            }
            crate::worker::probe_rootless(&config).map_err(|e| SandboxError::NoUserNamespaces {
                uid,
                reason: with_sysctls(e),
            })?;
        }
        if let Isolation::Sandbox { uid_base, .. } = &mut config.isolation
            && uid_base.is_none()
        {
            let (base, guard) = claim_uid_block(config.workers)?;
            *uid_base = Some(base);
            uid_block = Some(guard);
        }
        check_python(&config.python)?;
        let seccomp = match config.isolation {
            Isolation::Sandbox { .. } | Isolation::Rootless { .. } => seccomp::filters()?,
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
            slots: Arc::new(Slots::new(config, uid_block, seccomp, workers)),
            pool,
            python_version,
        })
    }

    /// The interpreter's version (`3.11.2`), as the zygote reports it.
    pub fn python_version(&self) -> &str {
        &self.python_version
    }

    pub fn workers(&self) -> usize {
        self.slots.config.workers
    }

    /// The host folders hidden from programs (none without isolation).
    pub fn hidden(&self) -> &[PathBuf] {
        match &self.slots.config.isolation {
            Isolation::Sandbox { hide, .. } | Isolation::Rootless { hide, .. } => hide,
            Isolation::Unsafe => &[],
        }
    }

    pub fn isolation(&self) -> &Isolation {
        &self.slots.config.isolation
    }

    /// Runs one program on the next free worker. Never fails: problems of
    /// the sandbox come back as `Status::SandboxFailure`.
    pub fn run(&self, req: &Request) -> Outcome {
        let mut worker = self.slots.take();
        let outcome = match worker.run(req) {
            Ok(o) if !worker.retired => o,
            Ok(o) => {
                // The zygote could not clean up after the program: start a
                // fresh one rather than let anything reach the next program.
                let slot = worker.slot;
                drop(worker);
                worker = Worker::spawn(slot, &self.slots.config, &self.slots.seccomp)
                    .unwrap_or_else(|_| Worker::dead(slot));
                o
            }
            Err(detail) => {
                // The worker is in an unknown state: replace it.
                let slot = worker.slot;
                drop(worker);
                let out = Outcome::sandbox_failure(detail);
                worker = match Worker::spawn(slot, &self.slots.config, &self.slots.seccomp) {
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
        self.slots.give_back(worker);
        outcome
    }

    /// Starts `program` as a long-lived [`Session`] on the next free
    /// worker slot (waiting for one), under `limits` (`stdout_bytes` is
    /// the longest line it may write; `cpu_seconds` its CPU time in all).
    /// The slot serves nothing else until the session ends; then it gets
    /// a fresh zygote.
    pub fn session(&self, program: &[u8], limits: Limits) -> Result<Session, SessionError> {
        Session::start(Arc::clone(&self.slots), program, limits)
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

/// `reason`, and the kernel settings that refuse user namespaces to
/// unprivileged users, where one does.
fn with_sysctls(reason: String) -> String {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|v| v.trim().to_owned());
    let mut why = Vec::new();
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        why.push("user.max_user_namespaces is 0");
    }
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        why.push("kernel.unprivileged_userns_clone is 0");
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        why.push("kernel.apparmor_restrict_unprivileged_userns is 1");
    }
    if why.is_empty() {
        reason
    } else {
        format!("{reason}; {}", why.join(", "))
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
