//! One worker slot: a zygote process in its own namespaces, and the wire
//! protocol to it (see `zygote.py`).

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, clone};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2};

use crate::request::{ExecutorConfig, Isolation, Limits, Outcome, Request, SandboxError, Status};

const ZYGOTE: &str = include_str!("zygote.py");

/// Time the zygote gets beyond a program's wall deadline before the worker is
/// declared hung and replaced.
const GRACE: Duration = Duration::from_secs(5);

pub(super) struct Worker {
    pub slot: usize,
    pub python_version: String,
    /// The zygote asked to be replaced after its last program.
    pub retired: bool,
    proc: Option<Proc>,
}

/// A running zygote: its pid and the two pipes to it.
struct Proc {
    pid: Pid,
    stdin: File,
    stdout: File,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            // In sandbox mode the zygote is its namespace's init: killing it
            // kills every process of the slot.
            let _ = kill(p.pid, Signal::SIGKILL);
            let _ = waitpid(p.pid, None);
        }
    }
}

impl Worker {
    /// A slot whose zygote could not be restarted; its runs report failure.
    pub fn dead(slot: usize) -> Self {
        Worker {
            slot,
            python_version: String::new(),
            retired: false,
            proc: None,
        }
    }

    pub fn spawn(
        slot: usize,
        config: &ExecutorConfig,
        seccomp: &[Vec<u8>],
    ) -> Result<Self, SandboxError> {
        let (init, setup, flags) = match &config.isolation {
            Isolation::Sandbox { uid_base, hide } => {
                let base = uid_base.ok_or_else(|| {
                    SandboxError::Setup("no uid block claimed for the sandbox".into())
                })?;
                let uid = base + slot as u32;
                let init = serde_json::json!({
                    "mode": "sandbox",
                    "uid": uid,
                    "gid": uid,
                    "seccomp": seccomp.iter().map(|p| trace_train_base::hex(p)).collect::<Vec<_>>(),
                    "tmp_bytes": config.tmp_bytes,
                    "tmp_inodes": config.tmp_inodes,
                });
                (init, Some(NamespaceSetup::new(hide, None)?), NAMESPACES)
            }
            Isolation::Rootless { uid_base, hide } => {
                let uid = uid_base + slot as u32;
                let init = serde_json::json!({
                    "mode": "sandbox",
                    "rootless": true,
                    "uid": uid,
                    "gid": uid,
                    "seccomp": seccomp.iter().map(|p| trace_train_base::hex(p)).collect::<Vec<_>>(),
                    "tmp_bytes": config.tmp_bytes,
                    "tmp_inodes": config.tmp_inodes,
                });
                let setup = NamespaceSetup::new(hide, Some(UserNs::new(uid, config)?))?;
                (init, Some(setup), NAMESPACES | CloneFlags::CLONE_NEWUSER)
            }
            Isolation::Unsafe => (
                serde_json::json!({ "mode": "unsafe" }),
                None,
                CloneFlags::empty(),
            ),
        };
        let exec = Exec::new(&config.python)?;
        let spawn_err = |e: String| SandboxError::Spawn(format!("slot {slot}: {e}"));
        let (in_r, in_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_err(e.to_string()))?;
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_err(e.to_string()))?;
        let (in_raw, out_raw) = (in_r.as_raw_fd(), out_w.as_raw_fd());
        let (pid, err_r) =
            clone_with(flags, setup, move || exec.run(in_raw, out_raw)).map_err(|e| {
                let hint = match (e, flags.contains(CloneFlags::CLONE_NEWUSER)) {
                    (nix::errno::Errno::EPERM, false) => " (creating namespaces needs root)",
                    (_, true) => " (the kernel refused an unprivileged user namespace)",
                    _ => "",
                };
                spawn_err(format!("clone: {e}{hint}"))
            })?;
        drop((in_r, out_w));
        let mut w = Worker {
            slot,
            python_version: String::new(),
            retired: false,
            proc: Some(Proc {
                pid,
                stdin: File::from(in_w),
                stdout: File::from(out_r),
            }),
        };
        let hello = match w.handshake(&init) {
            Ok(hello) => hello,
            Err(e) => {
                // The pipe closes as the child exits: give it a moment to
                // become reapable, so its exit code can say why.
                let mut status = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                for _ in 0..50 {
                    if !matches!(status, Ok(WaitStatus::StillAlive)) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    status = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                }
                if matches!(
                    status,
                    Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
                ) {
                    // Reaped: there is nothing left for `drop` to kill.
                    w.proc = None;
                }
                let why = match status {
                    Ok(WaitStatus::Exited(_, 126)) => {
                        format!("; namespace or mount setup failed: {}", setup_error(&err_r))
                    }
                    Ok(WaitStatus::Exited(_, 127)) => "; could not exec the interpreter".to_owned(),
                    Ok(WaitStatus::Exited(_, c)) => format!("; zygote exited with {c}"),
                    _ => String::new(),
                };
                return Err(spawn_err(format!("{e}{why}")));
            }
        };
        w.python_version = hello["python"].as_str().unwrap_or("").to_owned();
        Ok(w)
    }

    fn handshake(&mut self, init: &serde_json::Value) -> Result<serde_json::Value, String> {
        let p = self.proc.as_mut().ok_or("no process")?;
        write_frame(&mut p.stdin, init.to_string().as_bytes()).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let hello = read_frame(&mut p.stdout, deadline)?;
        serde_json::from_slice(&hello).map_err(|e| format!("bad hello from zygote: {e}"))
    }

    /// Runs one program. `Err` means the worker broke and must be replaced.
    pub fn run(&mut self, req: &Request) -> Result<Outcome, String> {
        let p = self
            .proc
            .as_mut()
            .ok_or_else(|| "worker is down and could not be restarted".to_owned())?;
        let limits = serde_json::to_vec(&req.limits).map_err(|e| e.to_string())?;
        let mut msg = Vec::with_capacity(12 + limits.len() + req.program.len() + req.stdin.len());
        for part in [&limits[..], &req.program[..], &req.stdin[..]] {
            msg.extend_from_slice(&(part.len() as u32).to_be_bytes());
            msg.extend_from_slice(part);
        }
        p.stdin
            .write_all(&msg)
            .and_then(|_| p.stdin.flush())
            .map_err(|e| format!("writing request to zygote: {e}"))?;
        let deadline = Instant::now() + Duration::from_millis(req.limits.wall_ms) + GRACE;
        let report = read_frame(&mut p.stdout, deadline)?;
        let stdout = read_frame(&mut p.stdout, deadline)?;
        let stderr = read_frame(&mut p.stdout, deadline)?;
        let report: Report =
            serde_json::from_slice(&report).map_err(|e| format!("bad report from zygote: {e}"))?;
        self.retired = report.retire;
        Ok(report.into_outcome(req, stdout, stderr))
    }
}

impl Worker {
    /// Turns this worker into a session running `program` (see the
    /// session wire format in `zygote.py`): after this the worker serves
    /// only [`Self::session_send`] and [`Self::session_recv`], and is
    /// dropped (killed) at the session's end.
    pub fn start_session(&mut self, program: &[u8], limits: &Limits) -> Result<(), String> {
        let p = self
            .proc
            .as_mut()
            .ok_or_else(|| "worker is down and could not be restarted".to_owned())?;
        let mut header = serde_json::to_value(limits).map_err(|e| e.to_string())?;
        header["session"] = serde_json::Value::Bool(true);
        let header = header.to_string();
        let mut msg = Vec::with_capacity(12 + header.len() + program.len());
        for part in [header.as_bytes(), program, &[]] {
            msg.extend_from_slice(&(part.len() as u32).to_be_bytes());
            msg.extend_from_slice(part);
        }
        p.stdin
            .write_all(&msg)
            .and_then(|_| p.stdin.flush())
            .map_err(|e| format!("writing the session request to the zygote: {e}"))
    }

    /// Sends one line to a session's program.
    pub fn session_send(&mut self, line: &[u8]) -> Result<(), String> {
        let p = self.proc.as_mut().ok_or("the session is over")?;
        write_frame(&mut p.stdin, line).map_err(|e| format!("writing to the session: {e}"))
    }

    /// The next frame from a session's zygote (`L` + a line, or `E` + the
    /// end report), by `deadline`.
    pub fn session_recv(&mut self, deadline: Instant) -> Result<Vec<u8>, ReadError> {
        let p = self
            .proc
            .as_mut()
            .ok_or_else(|| ReadError::Io("the session is over".into()))?;
        read_frame_by(&mut p.stdout, deadline)
    }

    /// Whether a zygote runs in this slot.
    pub fn is_up(&self) -> bool {
        self.proc.is_some()
    }
}

/// The namespaces of every sandboxed slot; rootless adds a user namespace.
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWPID
    .union(CloneFlags::CLONE_NEWNS)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS);

/// Clones a child into `flags`' namespaces, applies `setup` there, then runs
/// `then` (which execs, or returns the child's exit code). A failed setup
/// exits 126 and leaves its step and errno on the returned pipe, which an
/// exec closes.
fn clone_with(
    flags: CloneFlags,
    setup: Option<NamespaceSetup>,
    then: impl Fn() -> isize,
) -> Result<(Pid, std::os::fd::OwnedFd), nix::errno::Errno> {
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    let err_raw = err_w.as_raw_fd();
    let mut stack = vec![0u8; 256 * 1024];
    let child = Box::new(move || -> isize {
        // Runs in the new process, a copy of a multithreaded parent:
        // raw syscalls on prepared data only, no allocation, no locks.
        if let Some(setup) = &setup
            && let Err(failed) = setup.apply()
        {
            failed.report(err_raw);
            return 126;
        }
        then()
    });
    // SAFETY: the child only runs the async-signal-safe closure above on
    // its own copy of memory (no CLONE_VM), then execs or exits.
    let pid = unsafe { clone(child, &mut stack, flags, Some(libc::SIGCHLD)) }?;
    drop(err_w);
    Ok((pid, err_r))
}

/// What a child that exited 126 left on its error pipe: the failed step
/// and its errno.
fn setup_error(err_r: &std::os::fd::OwnedFd) -> String {
    let mut buf = [0u8; 256];
    let n = nix::unistd::read(err_r, &mut buf).unwrap_or(0);
    if n < 4 {
        return "no reason given".into();
    }
    let errno = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    format!(
        "{}: {}",
        String::from_utf8_lossy(&buf[4..n]),
        std::io::Error::from_raw_os_error(errno)
    )
}

/// Whether this process can isolate a slot without root: a child is cloned
/// into a new user namespace with every other namespace and goes through
/// the whole set-up of a rootless worker, then exits. `Err` names the step
/// the kernel refused.
pub(super) fn probe_rootless(config: &ExecutorConfig) -> Result<(), String> {
    let Isolation::Rootless { uid_base, hide } = &config.isolation else {
        return Ok(());
    };
    let setup = NamespaceSetup::new(
        hide,
        Some(UserNs::new(*uid_base, config).map_err(|e| e.to_string())?),
    )
    .map_err(|e| e.to_string())?;
    let (pid, err_r) = clone_with(NAMESPACES | CloneFlags::CLONE_NEWUSER, Some(setup), || 0)
        .map_err(|e| format!("the kernel refused to create a user namespace (clone: {e})"))?;
    match waitpid(pid, None) {
        Ok(WaitStatus::Exited(_, 0)) => Ok(()),
        Ok(WaitStatus::Exited(_, 126)) => Err(format!(
            "a user namespace could not be set up ({})",
            setup_error(&err_r)
        )),
        other => Err(format!("the user namespace probe ended with {other:?}")),
    }
}

#[derive(serde::Deserialize)]
pub(crate) struct Report {
    #[serde(default)]
    wall_ms: f64,
    #[serde(default)]
    stdout_truncated: bool,
    #[serde(default)]
    stderr_truncated: bool,
    killed_for: Option<String>,
    #[serde(default)]
    retire: bool,
    child: Option<ChildReport>,
    zygote_error: Option<String>,
}

#[derive(serde::Deserialize)]
pub(crate) struct ChildReport {
    wait: Option<i32>,
    #[serde(default)]
    cpu: f64,
    #[serde(default)]
    maxrss_kb: u64,
    /// Why P could not be set up, from a pipe the program never holds: a
    /// program cannot make its own failure look like the sandbox's.
    error: Option<String>,
}

impl Report {
    pub(crate) fn into_outcome(self, req: &Request, stdout: Vec<u8>, stderr: Vec<u8>) -> Outcome {
        let mut out = Outcome {
            status: Status::SandboxFailure,
            exit_code: None,
            signal: None,
            stdout,
            stderr,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            cpu_ms: 0.0,
            wall_ms: self.wall_ms,
            max_rss_kb: 0,
            detail: None,
        };
        if let Some(e) = self.zygote_error {
            out.detail = Some(format!("zygote: {e}"));
            return out;
        }
        if let Some(c) = &self.child {
            out.cpu_ms = c.cpu * 1000.0;
            out.max_rss_kb = c.maxrss_kb;
            if let Some(w) = c.wait {
                if libc::WIFEXITED(w) {
                    out.exit_code = Some(libc::WEXITSTATUS(w));
                } else if libc::WIFSIGNALED(w) {
                    out.signal = Some(libc::WTERMSIG(w));
                }
            }
        }
        match self.killed_for.as_deref() {
            Some("wall_timeout") => {
                out.status = Status::WallTimeout;
                return out;
            }
            Some("output_limit") => {
                out.status = Status::OutputLimit;
                return out;
            }
            _ => {}
        }
        let Some(child) = self.child else {
            out.detail = Some("no status from the sandbox init".into());
            return out;
        };
        if let Some(e) = child.error {
            out.detail = Some(e);
            return out;
        }
        out.status = match (out.exit_code, out.signal) {
            (Some(0), _) => Status::Ok,
            // Read from the program's own stderr, so a program can claim it;
            // either way it is the program's failure, never the sandbox's.
            (Some(_), _) if last_line_starts_with(&out.stderr, b"MemoryError") => {
                Status::MemoryLimit
            }
            (Some(_), _) => Status::ErrorExit,
            (None, Some(sig)) => {
                // SIGXCPU comes at the soft CPU limit, SIGKILL one second
                // later at the hard one. CPU time is sampled by the kernel and
                // reads low on a loaded machine, so a SIGKILL counts as the
                // CPU limit once either clock has reached most of it (the
                // zygote's own kills are `killed_for` above).
                let cpu_limit_ms = (req.limits.cpu_seconds * 1000) as f64;
                let near = |ms: f64| ms >= 0.9 * cpu_limit_ms;
                if sig == libc::SIGXCPU
                    || (sig == libc::SIGKILL && (near(out.cpu_ms) || near(out.wall_ms)))
                {
                    Status::CpuTimeout
                } else {
                    Status::Signal
                }
            }
            (None, None) => {
                out.detail = Some("program status unknown".into());
                Status::SandboxFailure
            }
        };
        out
    }
}

fn last_line_starts_with(bytes: &[u8], prefix: &[u8]) -> bool {
    bytes
        .split(|&b| b == b'\n')
        .rev()
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.starts_with(prefix))
}

fn write_frame(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&(data.len() as u32).to_be_bytes())?;
    w.write_all(data)?;
    w.flush()
}

fn read_frame(r: &mut File, deadline: Instant) -> Result<Vec<u8>, String> {
    read_frame_by(r, deadline).map_err(|e| e.to_string())
}

/// Why a frame could not be read from a zygote.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Nothing came before the deadline.
    Timeout,
    /// The zygote closed its end (it exited).
    Closed,
    Io(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Timeout => f.write_str("sandbox worker did not answer in time"),
            ReadError::Closed => f.write_str("sandbox worker exited unexpectedly"),
            ReadError::Io(e) => f.write_str(e),
        }
    }
}

/// One length-prefixed frame, read by `deadline`.
pub(crate) fn read_frame_by(r: &mut File, deadline: Instant) -> Result<Vec<u8>, ReadError> {
    let mut len = [0u8; 4];
    read_exact_by(r, &mut len, deadline)?;
    let n = u32::from_be_bytes(len) as usize;
    let mut buf = vec![0u8; n];
    read_exact_by(r, &mut buf, deadline)?;
    Ok(buf)
}

/// `read_exact` that gives up at `deadline` (the zygote may hang or die).
fn read_exact_by(r: &mut File, mut buf: &mut [u8], deadline: Instant) -> Result<(), ReadError> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Timeout);
        }
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        let ready = {
            let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
            poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            )
            .map_err(|e| ReadError::Io(format!("poll: {e}")))?
        };
        if ready == 0 {
            continue;
        }
        let n = r
            .read(buf)
            .map_err(|e| ReadError::Io(format!("reading from sandbox worker: {e}")))?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        buf = &mut buf[n..];
    }
    Ok(())
}

/// The user namespace of a rootless slot: the caller's uid and gid mapped
/// to `inside`, and the slot's `/tmp`, mounted before the exec because the
/// zygote has no capabilities left to mount it.
struct UserNs {
    setgroups: CString,
    deny: CString,
    uid_map: CString,
    gid_map: CString,
    uid_line: CString,
    gid_line: CString,
    tmp: CString,
    tmp_opts: CString,
}

impl UserNs {
    fn new(inside: u32, config: &ExecutorConfig) -> Result<Self, SandboxError> {
        let c = |s: String| CString::new(s).map_err(|e| SandboxError::Setup(e.to_string()));
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        Ok(UserNs {
            setgroups: c("/proc/self/setgroups".into())?,
            deny: c("deny".into())?,
            uid_map: c("/proc/self/uid_map".into())?,
            gid_map: c("/proc/self/gid_map".into())?,
            uid_line: c(format!("{inside} {uid} 1"))?,
            gid_line: c(format!("{inside} {gid} 1"))?,
            tmp: c("/tmp".into())?,
            tmp_opts: c(format!(
                "size={},nr_inodes={},mode=1777",
                config.tmp_bytes, config.tmp_inodes
            ))?,
        })
    }
}

/// A set-up step that failed, with its errno.
struct Failed {
    step: &'static str,
    errno: i32,
}

impl Failed {
    /// Writes errno and step to `fd`: raw writes only, no allocation.
    fn report(&self, fd: RawFd) {
        let mut buf = [0u8; 128];
        buf[..4].copy_from_slice(&self.errno.to_ne_bytes());
        let n = self.step.len().min(buf.len() - 4);
        buf[4..4 + n].copy_from_slice(&self.step.as_bytes()[..n]);
        // SAFETY: write(2) of a local buffer.
        unsafe { libc::write(fd, buf.as_ptr().cast(), 4 + n) };
    }
}

/// Namespace and mount setup run between fork and exec of a zygote. All
/// strings are prepared beforehand: `apply` must not allocate.
struct NamespaceSetup {
    user: Option<UserNs>,
    root: CString,
    hide: Vec<CString>,
    tmpfs: CString,
    hide_opts: CString,
    shm: CString,
    hostname: CString,
    proc_: CString,
    proc_dir: CString,
}

impl NamespaceSetup {
    fn new(hide: &[std::path::PathBuf], user: Option<UserNs>) -> Result<Self, SandboxError> {
        let c = |s: &str| CString::new(s).map_err(|e| SandboxError::Setup(e.to_string()));
        let hide = hide
            .iter()
            .filter(|p| p.is_dir())
            .map(|p| c(&p.to_string_lossy()))
            .collect::<Result<_, _>>()?;
        Ok(NamespaceSetup {
            user,
            root: c("/")?,
            hide,
            tmpfs: c("tmpfs")?,
            hide_opts: c("size=4k,nr_inodes=16,mode=0755")?,
            shm: c("/dev/shm")?,
            hostname: c("sandbox")?,
            proc_: c("proc")?,
            proc_dir: c("/proc")?,
        })
    }

    fn apply(&self) -> Result<(), Failed> {
        use std::ptr::null;
        fn ok(rc: libc::c_long, step: &'static str) -> Result<(), Failed> {
            if rc < 0 {
                Err(Failed {
                    step,
                    errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                })
            } else {
                Ok(())
            }
        }
        /// Writes `data` to the file at `path`, as the kernel's id maps want
        /// it: one write.
        unsafe fn write_file(
            path: &CString,
            data: &CString,
            step: &'static str,
        ) -> Result<(), Failed> {
            // SAFETY: open/write/close on NUL-terminated prepared strings.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                ok(fd as _, step)?;
                let n = data.as_bytes().len();
                let rc = libc::write(fd, data.as_ptr().cast(), n);
                let done = if rc == n as isize { 0 } else { -1 };
                let res = ok(done, step);
                libc::close(fd);
                res
            }
        }
        // SAFETY: raw syscalls with valid NUL-terminated strings.
        unsafe {
            if let Some(u) = &self.user {
                // The caller's ids become the slot's ids inside; the kernel
                // lets an unprivileged process map only these, and only once
                // setgroups is denied.
                write_file(&u.setgroups, &u.deny, "writing /proc/self/setgroups")?;
                write_file(&u.uid_map, &u.uid_line, "writing /proc/self/uid_map")?;
                write_file(&u.gid_map, &u.gid_line, "writing /proc/self/gid_map")?;
            }
            ok(
                libc::mount(
                    null(),
                    self.root.as_ptr(),
                    null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    null(),
                ) as _,
                "making the mounts private",
            )?;
            let ro = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
            for p in &self.hide {
                ok(
                    libc::mount(
                        self.tmpfs.as_ptr(),
                        p.as_ptr(),
                        self.tmpfs.as_ptr(),
                        ro,
                        self.hide_opts.as_ptr().cast(),
                    ) as _,
                    "hiding a host folder",
                )?;
            }
            // /dev/shm would be a shared writable place: blank it (it may not exist).
            let _ = libc::mount(
                self.tmpfs.as_ptr(),
                self.shm.as_ptr(),
                self.tmpfs.as_ptr(),
                ro,
                self.hide_opts.as_ptr().cast(),
            );
            // A /proc of this pid namespace: the program sees only its own.
            ok(
                libc::mount(
                    self.proc_.as_ptr(),
                    self.proc_dir.as_ptr(),
                    self.proc_.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    null(),
                ) as _,
                "mounting /proc",
            )?;
            // The whole tree read-only, submounts included (Linux 5.12+).
            let attr = MountAttr {
                attr_set: MOUNT_ATTR_RDONLY,
                attr_clr: 0,
                propagation: 0,
                userns_fd: 0,
            };
            ok(
                libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    self.root.as_ptr(),
                    AT_RECURSIVE,
                    &attr as *const MountAttr,
                    std::mem::size_of::<MountAttr>(),
                ),
                "making the mounts read-only",
            )?;
            ok(
                libc::sethostname(self.hostname.as_ptr(), self.hostname.as_bytes().len()) as _,
                "setting the hostname",
            )?;
            if let Some(u) = &self.user {
                // The slot's /tmp, on top of the read-only tree.
                ok(
                    libc::mount(
                        self.tmpfs.as_ptr(),
                        u.tmp.as_ptr(),
                        self.tmpfs.as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        u.tmp_opts.as_ptr().cast(),
                    ) as _,
                    "mounting /tmp",
                )?;
                // No capability can come back, not even through an exec:
                // empty the bounding set (the exec of the zygote as a
                // non-zero uid then clears the rest).
                for cap in 0..64 {
                    let rc = libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                    if rc < 0 && *libc::__errno_location() != libc::EINVAL {
                        return Err(Failed {
                            step: "dropping the capability bounding set",
                            errno: *libc::__errno_location(),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

const AT_RECURSIVE: libc::c_int = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// The interpreter command line, prepared for `execve` after the clone.
struct Exec {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
}

// SAFETY: the raw pointers point into the CStrings owned alongside them.
unsafe impl Send for Exec {}

impl Exec {
    fn new(python: &Path) -> Result<Self, SandboxError> {
        let c = |b: &[u8]| CString::new(b).map_err(|e| SandboxError::Setup(e.to_string()));
        let path = c(python.as_os_str().as_bytes())?;
        // No -I/-E: they would ignore PYTHONHASHSEED. The environment is
        // built from scratch instead.
        let argv = vec![
            path.clone(),
            c(b"-s")?,
            c(b"-B")?,
            c(b"-c")?,
            c(ZYGOTE.as_bytes())?,
        ];
        let envp = vec![
            c(b"PATH=/usr/local/bin:/usr/bin:/bin")?,
            c(b"PYTHONHASHSEED=0")?,
        ];
        let mut e = Exec {
            path,
            argv,
            envp,
            argv_ptrs: Vec::new(),
            envp_ptrs: Vec::new(),
        };
        e.argv_ptrs = e
            .argv
            .iter()
            .map(|s| s.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        e.envp_ptrs = e
            .envp
            .iter()
            .map(|s| s.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        Ok(e)
    }

    /// In the child: wire the pipes to fd 0/1 and exec. Returns only on failure.
    fn run(&self, stdin: RawFd, stdout: RawFd) -> isize {
        // SAFETY: async-signal-safe calls on prepared, NUL-terminated data.
        unsafe {
            if libc::dup2(stdin, 0) < 0 || libc::dup2(stdout, 1) < 0 {
                return 127;
            }
            libc::execve(
                self.path.as_ptr(),
                self.argv_ptrs.as_ptr(),
                self.envp_ptrs.as_ptr(),
            );
        }
        127
    }
}
