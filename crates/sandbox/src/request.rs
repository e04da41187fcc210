//! What goes into the sandbox and what comes out: a [`Request`] under its
//! [`Limits`], the [`Outcome`] with its [`Status`], how an executor is set
//! up ([`ExecutorConfig`], [`Isolation`]) and the [`SandboxError`] of a
//! sandbox that could not be set up.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a program may use. Defaults follow the trace environment's executor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// counted per uid, machine-wide). Without root, [`Executor::new`]
    /// turns this into [`Isolation::Rootless`] where the kernel allows it.
    ///
    /// [`Executor::new`]: crate::Executor::new
    Sandbox {
        uid_base: Option<u32>,
        /// Paths hidden behind an empty read-only tmpfs.
        hide: Vec<PathBuf>,
    },
    /// Isolation without root, through unprivileged user namespaces. Each
    /// slot gets its own user namespace with the other namespaces, the
    /// mount view, `/tmp`, rlimits, no_new_privs and seccomp of
    /// [`Isolation::Sandbox`]. Slot `i` is uid/gid `uid_base + i` inside
    /// its namespace, with no capabilities; on the host every slot is the
    /// caller's own uid, so slots do not each have a uid of their own.
    Rootless {
        uid_base: u32,
        /// Paths hidden behind an empty read-only tmpfs.
        hide: Vec<PathBuf>,
    },
    /// `--unsafe_no_sandbox`: rlimits, a session and a temp dir only.
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
                hide: Vec::new(),
            }
        };
        let python = python.into();
        let isolation = match isolation {
            Isolation::Sandbox { uid_base, .. } => Isolation::Sandbox {
                uid_base,
                hide: host_folders(&python, std::env::current_dir().ok().as_deref()),
            },
            other => other,
        };
        ExecutorConfig {
            python,
            workers: workers.max(1),
            isolation,
            tmp_bytes: 64 << 20,
            tmp_inodes: 4096,
        }
    }
}

/// Folders of the host that may hold what a program has no business
/// seeing: home folders, run-time state (`/run`, with the sockets of
/// services), mounts, `/var`, `/opt`, `/srv`, `/boot`.
pub const HOST_FOLDERS: [&str; 10] = [
    "/root", "/home", "/run", "/var", "/mnt", "/media", "/srv", "/opt", "/boot", "/snap",
];

/// Folders a program must see: the system it runs on.
const SYSTEM_FOLDERS: [&str; 10] = [
    "/usr", "/etc", "/lib", "/lib64", "/bin", "/sbin", "/proc", "/dev", "/tmp", "/sys",
];

/// What the sandbox hides behind empty read-only folders: the
/// [`HOST_FOLDERS`] that exist and, when it is one of its own, the folder
/// the host process works in (the project tree, the run's outputs). A
/// folder is kept visible when the interpreter lives in it, when it holds
/// a system folder, or when it lies in a folder hidden already.
pub fn host_folders(python: &std::path::Path, cwd: Option<&std::path::Path>) -> Vec<PathBuf> {
    let python = std::fs::canonicalize(python).unwrap_or_else(|_| python.to_owned());
    let mut hide: Vec<PathBuf> = Vec::new();
    let candidates = HOST_FOLDERS
        .iter()
        .map(PathBuf::from)
        .chain(cwd.and_then(|c| std::fs::canonicalize(c).ok()));
    for p in candidates {
        let Ok(real) = std::fs::canonicalize(&p) else {
            continue; // absent
        };
        let holds_system = SYSTEM_FOLDERS
            .iter()
            .any(|s| std::path::Path::new(s).starts_with(&real));
        // `/` holds every system folder, so it is never hidden.
        if !real.is_dir()
            || holds_system
            || SYSTEM_FOLDERS.iter().any(|s| real.starts_with(s))
            || python.starts_with(&real)
            || hide.iter().any(|h| real.starts_with(h))
        {
            continue;
        }
        hide.push(real);
    }
    hide
}

/// Worker slots when the user names none: two a core. A slot's zygote is
/// idle for part of every program (while the kernel forks, tears down and
/// the executor answers), so one slot a core leaves the cores partly idle.
pub fn default_workers() -> usize {
    2 * std::thread::available_parallelism().map_or(1, |n| n.get())
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
        "the sandbox cannot isolate programs: not running as root (uid {uid}) and {reason}\nhint: run as root; or let unprivileged users create user namespaces (`sysctl -w user.max_user_namespaces=15000`, `sysctl -w kernel.unprivileged_userns_clone=1` on Debian kernels, `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` on Ubuntu); or pass `--unsafe_no_sandbox` to run programs without isolation on a machine you trust"
    )]
    NoUserNamespaces { uid: u32, reason: String },
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("sandbox worker failed to start: {0}")]
    Spawn(String),
}
