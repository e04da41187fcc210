//! Several GPUs of one host without an external launcher: the parent
//! re-executes this binary once a GPU with the same arguments, telling each
//! child its rank through the environment; each child pins itself to
//! `cuda:<rank>` and joins the NCCL group (rank 0 makes the id and hands it
//! to the others through a fresh folder the parent made). The parent
//! forwards the children's messages prefixed with their rank, and when one
//! fails it stops the others and names the rank, its exit status and its
//! last messages.
//!
//! Several hosts: a launcher (torchrun, Slurm's srun, or a script) starts
//! one process a GPU on every host with `MASTER_ADDR` and `MASTER_PORT`
//! and either torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK` or Slurm's
//! `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`; each is one rank on
//! `cuda:<local rank>`, and rank 0 hands the NCCL id to the others over
//! TCP at `MASTER_ADDR`, port `MASTER_PORT + 1` (torchrun's own store
//! holds `MASTER_PORT`) or `TRACE_TRAIN_MASTER_PORT`.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const ENV_RANK: &str = "TRACE_TRAIN_RANK";
const ENV_WORLD: &str = "TRACE_TRAIN_WORLD";
const ENV_DIR: &str = "TRACE_TRAIN_DIST_DIR";
const ENV_PARENT: &str = "TRACE_TRAIN_PARENT_PID";
/// Lines of a child's messages kept for the error when it fails.
const TAIL_LINES: usize = 20;

/// This process's part in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// One device, no other process.
    Alone,
    /// Start `world` children and wait for them.
    Parent { world: usize },
    /// One rank of a multi-GPU run.
    Child(ChildRank),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRank {
    pub rank: usize,
    pub world: usize,
    /// This rank's GPU among its host's.
    pub local_rank: usize,
    /// Where rank 0 hands out the NCCL id.
    pub meeting: trace_train::dist::meet::Meeting,
}

impl ChildRank {
    /// The device a rank is pinned to: its local rank's GPU, or the only
    /// one it sees where the launcher gave each rank its own GPU (`srun
    /// --gpus-per-task 1` sets CUDA_VISIBLE_DEVICES a rank).
    pub fn device(&self) -> String {
        let index = if trace_train::dist::visible_gpus() == 1 {
            0
        } else {
            self.local_rank
        };
        format!("cuda:{index}")
    }

    /// This rank's communicator on `device` (NCCL; needs the `cuda` build).
    pub fn communicator(
        &self,
        device: &candle_core::Device,
    ) -> anyhow::Result<Box<dyn trace_train::dist::Communicator>> {
        #[cfg(feature = "cuda")]
        {
            let c = trace_train::dist::nccl::Nccl::join(
                device,
                self.rank,
                self.world,
                &self.meeting,
                Duration::from_secs(600),
            )?;
            Ok(Box::new(c))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = device;
            bail!("this build has no CUDA support, so no NCCL\nhint: build with --features cuda")
        }
    }
}

/// Ranks of the run this process belongs to: the world size a parent gave
/// it, else 1. The ranks of one run share the host's cores.
pub fn ranks_on_this_host() -> usize {
    [ENV_WORLD, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"]
        .iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.parse().ok()))
        .unwrap_or(1usize)
        .max(1)
}

/// The rank an external launcher gave this process, read through `get`
/// (the environment): torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, else
/// Slurm's `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, with
/// `MASTER_ADDR` and `MASTER_PORT` set. `None` without them: a Slurm job
/// step that runs one process sets Slurm's variables but no `MASTER_ADDR`,
/// and stays one rank.
pub fn launcher_rank(get: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Option<ChildRank>> {
    let Some(host) = get("MASTER_ADDR") else {
        return Ok(None);
    };
    let names = if get("RANK").is_some() && get("WORLD_SIZE").is_some() {
        ["RANK", "WORLD_SIZE", "LOCAL_RANK"]
    } else if get("SLURM_PROCID").is_some() && get("SLURM_NTASKS").is_some() {
        ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"]
    } else {
        return Ok(None);
    };
    let num = |name: &str| -> anyhow::Result<Option<usize>> {
        get(name)
            .map(|v| {
                v.trim()
                    .parse::<usize>()
                    .with_context(|| format!("{name}=`{v}` is not a number"))
            })
            .transpose()
    };
    let rank = num(names[0])?.expect("checked above");
    let world = num(names[1])?.expect("checked above");
    anyhow::ensure!(
        rank < world,
        "{} {rank} is not below {} {world}",
        names[0],
        names[1]
    );
    let local_rank = num(names[2])?.unwrap_or(0);
    let port = match num("TRACE_TRAIN_MASTER_PORT")? {
        Some(p) => p,
        None => num("MASTER_PORT")?
            .context("MASTER_ADDR is set but MASTER_PORT is not\nhint: export MASTER_PORT (rank 0 listens on it plus one)")?
            + 1,
    };
    let port = u16::try_from(port)
        .ok()
        .filter(|&p| p > 0)
        .with_context(|| {
            format!("port {port} (MASTER_PORT + 1, or TRACE_TRAIN_MASTER_PORT) is not a TCP port")
        })?;
    Ok(Some(ChildRank {
        rank,
        world,
        local_rank,
        meeting: trace_train::dist::meet::Meeting::Tcp { host, port },
    }))
}

/// The role of this process: a child when the parent's variables are set,
/// or one rank of an external launcher's run (see [`launcher_rank`]);
/// otherwise a parent when more than one GPU is asked for (or, with
/// `requested` unset, when the device is CUDA and several are visible).
pub fn role(requested: Option<usize>, device: &str) -> anyhow::Result<Role> {
    if let Some(rank) = std::env::var_os(ENV_RANK) {
        let num = |v: Option<OsString>, name: &str| -> anyhow::Result<usize> {
            v.and_then(|v| v.to_str().and_then(|s| s.parse().ok()))
                .with_context(|| format!("{name} is not a number"))
        };
        let rank = num(Some(rank), ENV_RANK)?;
        let world = num(std::env::var_os(ENV_WORLD), ENV_WORLD)?;
        let dir = std::env::var_os(ENV_DIR)
            .map(PathBuf::from)
            .with_context(|| format!("{ENV_DIR} is not set"))?;
        anyhow::ensure!(
            rank < world,
            "{ENV_RANK} {rank} is not below {ENV_WORLD} {world}"
        );
        // A parent that dies (kill -9) sends its ranks SIGTERM: together they
        // checkpoint and exit instead of training on unwatched.
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
            .context("cannot ask for a signal on the parent's death")?;
        let parent = num(std::env::var_os(ENV_PARENT), ENV_PARENT)?;
        anyhow::ensure!(
            nix::unistd::getppid().as_raw() as usize == parent,
            "rank {rank}: the process that started it has already exited"
        );
        return Ok(Role::Child(ChildRank {
            rank,
            world,
            local_rank: rank,
            meeting: trace_train::dist::meet::Meeting::Folder(dir),
        }));
    }
    if let Some(child) = launcher_rank(&|k| std::env::var(k).ok())? {
        if child.world == 1 {
            return Ok(Role::Alone);
        }
        anyhow::ensure!(
            requested.is_none_or(|n| n == child.world),
            "--num_gpus {} under a launcher that started {} ranks (one a GPU)\nhint: drop --num_gpus; the launcher's WORLD_SIZE or SLURM_NTASKS decides",
            requested.unwrap_or(0),
            child.world
        );
        return Ok(Role::Child(child));
    }
    let spec = trace_train::config::DeviceSpec::parse(device)
        .with_context(|| format!("device `{device}` is not cpu, cuda, cuda:N or auto"))?;
    let visible = trace_train::dist::visible_gpus();
    let world = match (requested, &spec) {
        (Some(n), _) => n,
        // The CPU, or one GPU named by its index: one rank.
        (None, trace_train::config::DeviceSpec::Cpu) => 1,
        (None, _) if device.contains(':') => 1,
        (None, _) => visible.max(1),
    };
    if world <= 1 {
        anyhow::ensure!(world == 1, "--num_gpus must be at least 1");
        return Ok(Role::Alone);
    }
    match spec {
        trace_train::config::DeviceSpec::Cpu => bail!(
            "--num_gpus {world} with --device cpu: several ranks run on GPUs only\nhint: drop --num_gpus, or use --device cuda"
        ),
        trace_train::config::DeviceSpec::Cuda(n) if device.contains(':') && n != 0 => bail!(
            "--num_gpus {world} with --device {device}: rank r runs on cuda:r\nhint: choose the GPUs with CUDA_VISIBLE_DEVICES and pass --device cuda"
        ),
        _ => {}
    }
    anyhow::ensure!(
        visible >= world,
        "--num_gpus {world}, but {visible} GPU(s) are visible{}\nhint: lower --num_gpus (or hardware.num_gpus), or check CUDA_VISIBLE_DEVICES",
        if cfg!(feature = "cuda") {
            ""
        } else {
            " (this build has no CUDA support: build with --features cuda)"
        }
    );
    Ok(Role::Parent { world })
}

/// Runs a training command where `role` puts this process: `alone()` on
/// one device; as a parent, the ranks; as rank r, `rank(child, progress)`
/// with the progress bar on rank 0 and none on the others.
pub fn dispatch(
    requested: Option<usize>,
    device: &str,
    alone: impl FnOnce() -> anyhow::Result<()>,
    rank: impl FnOnce(&ChildRank, &dyn trace_train::progress::Progress) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match role(requested, device)? {
        Role::Alone => alone(),
        Role::Parent { world } => run_children(world),
        Role::Child(child) if child.rank == 0 => rank(&child, &super::progress::Bar::new("step")),
        Role::Child(child) => rank(&child, &trace_train::progress::NoProgress),
    }
}

/// The command line of a rank that reads what the pipeline resolved for
/// `command` from `file` (`--resolved`): the settings travel as a file,
/// not as flags, so a rank runs with exactly what was resolved.
pub fn resolved_argv(command: &str, file: &Path) -> Vec<OsString> {
    vec![command.into(), "--resolved".into(), file.into()]
}

/// Writes `value` to `file` and runs `command` on `world` ranks, each
/// reading it back ([`read_resolved`]).
pub fn run_resolved_children<T: serde::Serialize>(
    world: usize,
    command: &str,
    value: &T,
    file: &Path,
) -> anyhow::Result<()> {
    trace_train::atomic::write(file, serde_json::to_string_pretty(value)?.as_bytes())?;
    run_children_with(world, resolved_argv(command, file))
}

/// What [`run_resolved_children`] wrote to `file`.
pub fn read_resolved<T: serde::de::DeserializeOwned>(file: &Path) -> anyhow::Result<T> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read `{}`", file.display()))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("`{}` is not a stage's resolved settings", file.display()))
}

/// A running child and what it last said.
struct Rank {
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
    forwarder: Option<std::thread::JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// Runs this binary's command line on `world` ranks and waits for them.
/// Rank 0's standard output is this process's; every rank's messages are
/// forwarded with a `[rank r]` prefix.
pub fn run_children(world: usize) -> anyhow::Result<()> {
    run_children_with(world, std::env::args_os().skip(1).collect())
}

/// [`run_children`] with the ranks' arguments given (`args`, without the
/// program name). A signal to this process is passed on to the ranks once
/// and stays in the process's stop flag ([`trace_train::stop`]).
pub fn run_children_with(world: usize, args: Vec<OsString>) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    let dir = tempfile::Builder::new()
        .prefix("trace-train-dist-")
        .tempdir()
        .context("cannot create the folder that hands over the NCCL id")?;
    let interrupted = trace_train::stop::flag()?;
    tracing::info!("starting {world} ranks, one a GPU");
    let mut commands = Vec::with_capacity(world);
    for rank in 0..world {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env(ENV_RANK, rank.to_string())
            .env(ENV_WORLD, world.to_string())
            .env(ENV_DIR, dir.path())
            .env(ENV_PARENT, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped());
        // NVLink SHARP (NVLS) reserves GPU memory for multicast buffers
        // and gains nothing on a LoRA's few hundred MB of gradients; it
        // stays off unless asked for.
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            cmd.env("NCCL_NVLS_ENABLE", "0");
        }
        commands.push(cmd);
    }
    let result = supervise(commands, &interrupted);
    drop(dir);
    result
}

/// Starts `commands` (rank r is the r-th; standard error must be piped)
/// and waits for all of them; when one fails, stops the others and fails
/// with its rank, exit status and last messages. A signal to this process
/// (`interrupted`) is passed on once.
fn supervise(commands: Vec<Command>, interrupted: &AtomicBool) -> anyhow::Result<()> {
    let world = commands.len();
    let mut ranks: Vec<Rank> = Vec::with_capacity(world);
    for (rank, mut cmd) in commands.into_iter().enumerate() {
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut ranks);
                return Err(e).with_context(|| {
                    format!(
                        "cannot start rank {rank} (`{}`)",
                        cmd.get_program().to_string_lossy()
                    )
                });
            }
        };
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        let stderr = child.stderr.take().expect("stderr is piped");
        let t = Arc::clone(&tail);
        let forwarder = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rank {rank}] {line}");
                if let Ok(mut t) = t.lock() {
                    if t.len() == TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }
        });
        ranks.push(Rank {
            child,
            tail,
            forwarder: Some(forwarder),
            status: None,
        });
    }
    let mut forwarded_signal = false;
    loop {
        let mut failed = None;
        for (rank, r) in ranks.iter_mut().enumerate() {
            if r.status.is_none()
                && let Some(s) = r.child.try_wait().context("cannot wait for a rank")?
            {
                r.status = Some(s);
                // A rank a stop signal cut short checkpointed with the
                // others: the run was interrupted, not failed.
                let stopped = s.code().is_some_and(trace_train::stop::is_stop_status);
                if stopped {
                    trace_train::stop::cut_short();
                }
                if !s.success() && !stopped && failed.is_none() {
                    failed = Some(rank);
                }
            }
        }
        if let Some(rank) = failed {
            stop_all(&mut ranks);
            let r = &mut ranks[rank];
            if let Some(f) = r.forwarder.take() {
                let _ = f.join();
            }
            let tail: Vec<String> = r
                .tail
                .lock()
                .map(|t| t.iter().cloned().collect())
                .unwrap_or_default();
            bail!(
                "rank {rank} of {world} failed ({}); the other ranks were stopped. Its last messages:\n  {}\nhint: fix the cause and continue from the last checkpoint with --resume (any number of GPUs)",
                describe(r.status.expect("set when failed")),
                if tail.is_empty() {
                    "(none)".into()
                } else {
                    tail.join("\n  ")
                }
            );
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        // A signal to this process alone (a terminal's Ctrl-C reaches the
        // children too): pass it on once, so the ranks checkpoint together.
        if interrupted.load(Ordering::Relaxed) && !forwarded_signal {
            forwarded_signal = true;
            for r in ranks.iter().filter(|r| r.status.is_none()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(r.child.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for r in &mut ranks {
        if let Some(f) = r.forwarder.take() {
            let _ = f.join();
        }
    }
    Ok(())
}

/// SIGTERM to every running rank; SIGKILL to those still running 10 s
/// later (a rank waiting in a collective for a dead peer never returns).
fn stop_all(ranks: &mut [Rank]) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for r in ranks.iter().filter(|r| r.status.is_none()) {
        let _ = kill(Pid::from_raw(r.child.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        loop {
            match r.child.try_wait() {
                Ok(Some(s)) => {
                    r.status = Some(s);
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = r.child.kill();
                    r.status = r.child.wait().ok();
                    break;
                }
            }
        }
    }
}

fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => format!("{s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_device_unless_asked_and_clear_refusals() {
        // These run without the parent's variables.
        assert_eq!(role(None, "cpu").unwrap(), Role::Alone);
        assert_eq!(role(Some(1), "auto").unwrap(), Role::Alone);
        assert_eq!(role(None, "cuda:1").unwrap(), Role::Alone);
        let e = format!("{:#}", role(Some(2), "cpu").unwrap_err());
        assert!(e.contains("GPUs only") && e.contains("hint:"), "{e}");
        let e = format!("{:#}", role(Some(2), "cuda:1").unwrap_err());
        assert!(e.contains("CUDA_VISIBLE_DEVICES"), "{e}");
        assert!(role(Some(0), "auto").is_err());
        if trace_train::dist::visible_gpus() < 64 {
            let e = format!("{:#}", role(Some(64), "cuda").unwrap_err());
            assert!(e.contains("visible"), "{e}");
        }
    }

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_launchers_variables_make_a_rank_that_meets_rank_zero_over_tcp() {
        use trace_train::dist::meet::Meeting;
        // torchrun: rank 5 of 8, the second GPU of its host.
        let torchrun = [
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
        ];
        let c = launcher_rank(&vars(&torchrun)).unwrap().unwrap();
        assert_eq!((c.rank, c.world, c.local_rank), (5, 8, 1));
        assert_eq!(c.device(), "cuda:1");
        assert_eq!(
            c.meeting,
            Meeting::Tcp {
                host: "node0".into(),
                port: 29501
            }
        );
        // Slurm, with the port given outright.
        let slurm = [
            ("MASTER_ADDR", "10.0.0.7"),
            ("TRACE_TRAIN_MASTER_PORT", "40000"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "3"),
        ];
        let c = launcher_rank(&vars(&slurm)).unwrap().unwrap();
        assert_eq!((c.rank, c.world, c.local_rank), (3, 4, 3));
        assert_eq!(
            c.meeting,
            Meeting::Tcp {
                host: "10.0.0.7".into(),
                port: 40000
            }
        );
        // Slurm's variables without MASTER_ADDR: a single process.
        assert!(launcher_rank(&vars(&slurm[2..])).unwrap().is_none());
        assert!(launcher_rank(&vars(&[])).unwrap().is_none());
        // Bad values are named.
        let torchrun_with = |rank: &'static str, port: Option<&'static str>| {
            let mut v = vec![("MASTER_ADDR", "h"), ("RANK", rank), ("WORLD_SIZE", "2")];
            v.extend(port.map(|p| ("MASTER_PORT", p)));
            v
        };
        for (bad, says) in [
            (torchrun_with("x", Some("1")), vec!["RANK=`x`"]),
            (
                torchrun_with("2", Some("1")),
                vec!["not below WORLD_SIZE 2"],
            ),
            (torchrun_with("0", None), vec!["MASTER_PORT", "hint:"]),
            (torchrun_with("0", Some("65535")), vec!["not a TCP port"]),
        ] {
            let e = format!("{:#}", launcher_rank(&vars(&bad)).unwrap_err());
            assert!(says.iter().all(|s| e.contains(s)), "{e}");
        }
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    #[test]
    fn a_failed_rank_stops_the_others_and_is_named() {
        let started = Instant::now();
        let e = supervise(
            vec![
                sh("sleep 30"),
                sh("echo loading >&2; echo 'out of memory' >&2; exit 3"),
                sh("trap 'exit 0' TERM; sleep 30 & wait"),
            ],
            &AtomicBool::new(false),
        )
        .unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("rank 1 of 3 failed (exit status 3)"),
            "{text}"
        );
        assert!(text.contains("loading\n  out of memory"), "{text}");
        assert!(text.contains("--resume"), "{text}");
        // SIGTERM stopped both sleepers at once.
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "{:?}",
            started.elapsed()
        );
        supervise(
            vec![sh("exit 0"), sh("echo fine >&2")],
            &AtomicBool::new(false),
        )
        .unwrap();
        let killed = supervise(vec![sh("kill -9 $$")], &AtomicBool::new(false)).unwrap_err();
        assert!(
            format!("{killed:#}").contains("killed by signal 9"),
            "{killed:#}"
        );
    }
}
