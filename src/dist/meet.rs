//! How the ranks of a run agree on one NCCL id before NCCL can join them.
//! Rank 0 makes the id; the others get it either through a fresh folder
//! (the ranks of one host that this binary started itself) or over TCP
//! from rank 0 (ranks on several hosts, started by torchrun, Slurm or by
//! hand, which find rank 0 at `MASTER_ADDR`).
//!
//! The TCP exchange is one line each way: a rank says `trace-train rank R
//! of W`, rank 0 answers the id, or `error: ...` when the rank does not
//! belong (another world size, a rank out of range, a rank already
//! served), and the rank stops with that message.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Where the ranks meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meeting {
    /// Rank 0 writes `nccl-id` in this folder; the others read it.
    Folder(PathBuf),
    /// Rank 0 listens on `port` (every interface); the others connect to
    /// `host:port`.
    Tcp { host: String, port: u16 },
}

/// The id every rank of the run shares: `make`'s on rank 0, rank 0's on
/// the others, who wait for it up to `wait`. Rank 0 returns once every
/// other rank has it.
pub fn share_id(
    meeting: &Meeting,
    rank: usize,
    world: usize,
    make: impl FnOnce() -> anyhow::Result<String>,
    wait: Duration,
) -> anyhow::Result<String> {
    anyhow::ensure!(
        rank < world,
        "rank {rank} is not below the world size {world}"
    );
    match meeting {
        Meeting::Folder(dir) => by_folder(dir, rank, make, wait),
        Meeting::Tcp { host, port } => {
            if rank == 0 {
                let id = make()?;
                serve(*port, world, &id, wait)?;
                Ok(id)
            } else {
                ask(host, *port, rank, world, wait)
            }
        }
    }
}

fn by_folder(
    dir: &std::path::Path,
    rank: usize,
    make: impl FnOnce() -> anyhow::Result<String>,
    wait: Duration,
) -> anyhow::Result<String> {
    let path = dir.join("nccl-id");
    if rank == 0 {
        let id = make()?;
        crate::atomic::write(&path, id.as_bytes())?;
        return Ok(id);
    }
    let started = Instant::now();
    loop {
        if let Ok(id) = std::fs::read_to_string(&path) {
            return Ok(id.trim().to_owned());
        }
        if started.elapsed() > wait {
            bail!(
                "rank {rank}: no NCCL id from rank 0 at `{}` after {} s\nhint: rank 0 failed to start; see its messages",
                path.display(),
                wait.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Rank 0: answers each of the other `world - 1` ranks once.
fn serve(port: u16, world: usize, id: &str, wait: Duration) -> anyhow::Result<()> {
    let listener = TcpListener::bind(("0.0.0.0", port)).with_context(|| {
        format!("rank 0: cannot listen on port {port} for the other ranks\nhint: choose a free port with TRACE_TRAIN_MASTER_PORT (default MASTER_PORT + 1)")
    })?;
    listener.set_nonblocking(true)?;
    let started = Instant::now();
    let mut served = vec![false; world];
    served[0] = true;
    while served.iter().any(|s| !s) {
        match listener.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(false)?;
                // Whatever else connects (a port scan, a health check, a
                // rank that died mid-greeting) is turned away or dropped;
                // rank 0 keeps waiting for its ranks.
                match answer(stream, world, id, &mut served) {
                    Ok(Some(r)) => tracing::debug!("rank {r} of {world} joined from {peer}"),
                    Ok(None) => tracing::warn!("rank 0: turned away a connection from {peer}"),
                    Err(e) => tracing::warn!(
                        "rank 0: a connection from {peer} ended before it joined ({e:#}); still waiting for the ranks"
                    ),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if started.elapsed() > wait {
                    let missing: Vec<String> = (0..world)
                        .filter(|&r| !served[r])
                        .map(|r| r.to_string())
                        .collect();
                    bail!(
                        "rank 0: ranks {} of {world} did not connect on port {port} within {} s\nhint: start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE; see their messages",
                        missing.join(", "),
                        wait.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).context("rank 0: accepting a rank"),
        }
    }
    Ok(())
}

/// Reads one rank's greeting and answers it; the rank served, or `None`
/// for a connection that was turned away (told why).
fn answer(
    stream: TcpStream,
    world: usize,
    id: &str,
    served: &mut [bool],
) -> anyhow::Result<Option<usize>> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let mut out = &stream;
    let said: Vec<&str> = line.split_whitespace().collect();
    let parsed = match said.as_slice() {
        ["trace-train", "rank", r, "of", w] => r.parse::<usize>().ok().zip(w.parse::<usize>().ok()),
        _ => None,
    };
    let refuse = |mut out: &TcpStream, why: String| -> anyhow::Result<Option<usize>> {
        writeln!(out, "error: {why}")?;
        Ok(None)
    };
    let Some((r, w)) = parsed else {
        return refuse(
            out,
            format!("not a trace-train rank's greeting: `{}`", line.trim()),
        );
    };
    if w != world {
        return refuse(
            out,
            format!("rank 0 runs a world of {world}, this rank says {w}"),
        );
    }
    if r == 0 || r >= world {
        return refuse(out, format!("rank {r} is not one of 1..{world}"));
    }
    if served[r] {
        return refuse(out, format!("rank {r} has already joined"));
    }
    writeln!(out, "{id}")?;
    out.flush()?;
    served[r] = true;
    Ok(Some(r))
}

/// Another rank: connects to rank 0 (retrying until it listens) and reads
/// the id.
fn ask(host: &str, port: u16, rank: usize, world: usize, wait: Duration) -> anyhow::Result<String> {
    let started = Instant::now();
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("rank {rank}: cannot resolve MASTER_ADDR `{host}`"))?
        .collect();
    loop {
        let tried = addrs
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).ok());
        if let Some(stream) = tried {
            stream.set_read_timeout(Some(wait))?;
            writeln!(&stream, "trace-train rank {rank} of {world}")?;
            let mut line = String::new();
            BufReader::new(&stream)
                .read_line(&mut line)
                .with_context(|| {
                    format!("rank {rank}: reading the NCCL id from rank 0 at {host}:{port}")
                })?;
            let line = line.trim();
            if let Some(why) = line.strip_prefix("error: ") {
                bail!("rank {rank}: rank 0 at {host}:{port} refused it: {why}");
            }
            anyhow::ensure!(
                !line.is_empty(),
                "rank {rank}: rank 0 at {host}:{port} closed without an id"
            );
            return Ok(line.to_owned());
        }
        if started.elapsed() > wait {
            bail!(
                "rank {rank}: rank 0 did not answer at {host}:{port} within {} s\nhint: check MASTER_ADDR and that rank 0 started (its messages say why not)",
                wait.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A meeting on the loopback address, at a port free a moment ago.
    fn loopback() -> Meeting {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Meeting::Tcp {
            host: "127.0.0.1".into(),
            port,
        }
    }

    #[test]
    fn ranks_on_loopback_get_rank_zeros_id_whoever_starts_first() {
        let meeting = loopback();
        let wait = Duration::from_secs(20);
        // The other ranks start before rank 0 listens: they retry.
        let others: Vec<_> = (1..3)
            .map(|r| {
                let m = meeting.clone();
                std::thread::spawn(move || {
                    share_id(&m, r, 3, || bail!("only rank 0 makes the id"), wait)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let id = share_id(&meeting, 0, 3, || Ok("abc123".into()), wait).unwrap();
        assert_eq!(id, "abc123");
        for t in others {
            assert_eq!(t.join().unwrap().unwrap(), "abc123");
        }
    }

    #[test]
    fn a_rank_of_another_world_is_refused_and_told_why() {
        let meeting = loopback();
        let short = Duration::from_secs(3);
        let zero = {
            let m = meeting.clone();
            std::thread::spawn(move || share_id(&m, 0, 2, || Ok("id".into()), short))
        };
        std::thread::sleep(Duration::from_millis(200));
        let e = format!(
            "{:#}",
            share_id(&meeting, 1, 4, || bail!("unused"), short).unwrap_err()
        );
        assert!(e.contains("refused") && e.contains("world of 2"), "{e}");
        // Rank 0 waits for its rank 1, which never came, and says so.
        let e = format!("{:#}", zero.join().unwrap().unwrap_err());
        assert!(e.contains("ranks 1 of 2 did not connect"), "{e}");
    }

    /// Connections that are not ranks (one closes at once, one says
    /// something else, one stays open and silent until rank 0's read
    /// times out, which used to end rank 0 with an error) leave rank 0
    /// waiting for its rank, which then gets the id.
    #[test]
    fn stray_connections_do_not_stop_rank_zero() {
        let meeting = loopback();
        let Meeting::Tcp { port, .. } = meeting.clone() else {
            unreachable!()
        };
        let wait = Duration::from_secs(20);
        let zero = {
            let m = meeting.clone();
            std::thread::spawn(move || share_id(&m, 0, 2, || Ok("cafe".into()), wait))
        };
        let connect = || loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(connect());
        let s = connect();
        writeln!(&s, "GET / HTTP/1.0").unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        assert!(line.starts_with("error: not a trace-train rank"), "{line}");
        drop(s);
        // Silent and open: rank 0's read of it times out (10 s).
        let silent = connect();
        let id = share_id(&meeting, 1, 2, || bail!("unused"), wait).unwrap();
        assert_eq!(id, "cafe");
        drop(silent);
        assert_eq!(zero.join().unwrap().unwrap(), "cafe");
    }

    #[test]
    fn a_rank_with_no_rank_zero_gives_up_with_a_hint() {
        let meeting = loopback();
        let e = format!(
            "{:#}",
            share_id(
                &meeting,
                1,
                2,
                || bail!("unused"),
                Duration::from_millis(400)
            )
            .unwrap_err()
        );
        assert!(e.contains("did not answer") && e.contains("hint:"), "{e}");
        assert!(share_id(&meeting, 2, 2, || bail!("unused"), Duration::ZERO).is_err());
    }

    #[test]
    fn ranks_of_one_host_meet_in_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let meeting = Meeting::Folder(dir.path().to_owned());
        let wait = Duration::from_secs(10);
        let other = {
            let m = meeting.clone();
            std::thread::spawn(move || share_id(&m, 1, 2, || bail!("unused"), wait))
        };
        assert_eq!(
            share_id(&meeting, 0, 2, || Ok("f00d".into()), wait).unwrap(),
            "f00d"
        );
        assert_eq!(other.join().unwrap().unwrap(), "f00d");
    }
}
