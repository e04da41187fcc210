//! A [`Session`]: one program kept running in a worker slot, with the
//! slot's isolation (namespaces, uid, rlimits, seccomp, its own `/tmp`),
//! that answers newline-delimited JSON on its stdin and stdout: one line
//! in, one line out, each call bounded by a timeout.
//!
//! A session ends, killing every process of it (the slot's zygote is its
//! pid namespace's init), when it is dropped, when a call times out, when
//! the program answers with anything but one line of JSON, or writes a
//! line over its cap; then the slot gets a fresh zygote. What the program
//! writes to stderr is kept as a tail for the error that ends it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::request::{Limits, Outcome, Request, Status};
use crate::slots::Slots;
use crate::worker::{ReadError, Report, Worker};

/// Why a session call has no answer. Every variant but
/// [`SessionError::Request`] ends the session.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    /// No answer within the call's timeout: the session was killed.
    #[error("no answer within {0:?}; the session was killed")]
    Timeout(Duration),
    /// The program ended (it exited, crashed, met a limit or wrote a line
    /// over the cap); `stderr` is the tail of what it wrote there.
    #[error("the program ended ({}){}", describe(.status, *.exit_code, *.signal), tail(.stderr))]
    Ended {
        status: Status,
        exit_code: Option<i32>,
        signal: Option<i32>,
        stderr: String,
    },
    /// The answer was not one line of JSON: the session was killed.
    #[error("the answer is not a line of JSON ({0}); the session was killed")]
    Garbage(String),
    /// The sandbox itself failed (the slot could not start, the pipe broke).
    #[error("sandbox failure: {0}")]
    Sandbox(String),
    /// A call after the session ended.
    #[error("the session has ended")]
    Closed,
    /// The request line itself is unusable (it holds a newline); the
    /// session goes on.
    #[error("bad request: {0}")]
    Request(String),
}

fn describe(status: &Status, exit: Option<i32>, signal: Option<i32>) -> String {
    match (status, exit, signal) {
        (Status::ErrorExit | Status::Ok, Some(c), _) => format!("exit {c}"),
        (Status::Signal, _, Some(s)) => format!("signal {s}"),
        (s, _, _) => s.as_str().to_owned(),
    }
}

fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let from = lines.len().saturating_sub(12);
    format!("; its stderr ends:\n{}", lines[from..].join("\n"))
}

/// A long-lived program in a worker slot (see the module's header).
pub struct Session {
    slots: Arc<Slots>,
    slot: usize,
    /// The slot's zygote while the session lives.
    worker: Option<Worker>,
    limits: Limits,
}

impl Session {
    pub(crate) fn start(
        slots: Arc<Slots>,
        program: &[u8],
        limits: Limits,
    ) -> Result<Self, SessionError> {
        let mut worker = slots.take();
        let slot = worker.slot;
        if !worker.is_up() {
            worker = slots.respawn(slot);
        }
        let mut session = Session {
            slots,
            slot,
            worker: None,
            limits,
        };
        if let Err(e) = worker.start_session(program, &limits) {
            // The zygote is in an unknown state: `session`'s drop gives
            // the slot a fresh one.
            drop(worker);
            return Err(SessionError::Sandbox(e));
        }
        session.worker = Some(worker);
        Ok(session)
    }

    /// Whether the session still runs (no call has ended it).
    pub fn is_alive(&self) -> bool {
        self.worker.is_some()
    }

    /// Ends the session now, killing every process of it.
    pub fn kill(&mut self) {
        self.worker = None;
    }

    /// Sends `line` (one line of JSON, without its newline) and returns the
    /// program's answer line, which is checked to be one JSON value. An
    /// error ends the session (but [`SessionError::Request`]).
    pub fn call(&mut self, line: &str, timeout: Duration) -> Result<String, SessionError> {
        if line.contains('\n') {
            return Err(SessionError::Request(
                "a request line holds a newline".into(),
            ));
        }
        let Some(worker) = self.worker.as_mut() else {
            return Err(SessionError::Closed);
        };
        let deadline = Instant::now() + timeout;
        let answer = worker
            .session_send(line.as_bytes())
            .map_err(SessionError::Sandbox)
            .and_then(|()| match worker.session_recv(deadline) {
                Ok(frame) => self::answer(frame, &self.limits),
                Err(ReadError::Timeout) => Err(SessionError::Timeout(timeout)),
                Err(e) => Err(SessionError::Sandbox(e.to_string())),
            });
        if answer.is_err() {
            self.kill();
        }
        answer
    }
}

/// What one frame from a session's zygote says.
fn answer(frame: Vec<u8>, limits: &Limits) -> Result<String, SessionError> {
    match frame.split_first() {
        Some((b'L', line)) => {
            let text = std::str::from_utf8(line)
                .map_err(|_| SessionError::Garbage(format!("not UTF-8: {}", preview(line))))?;
            match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Ok(_) => Ok(text.to_owned()),
                Err(e) => Err(SessionError::Garbage(format!("{e}: {}", preview(line)))),
            }
        }
        Some((b'E', report)) => {
            let stderr = serde_json::from_slice::<serde_json::Value>(report)
                .ok()
                .and_then(|v| v["stderr"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let report: Report = serde_json::from_slice(report)
                .map_err(|e| SessionError::Sandbox(format!("bad end report from zygote: {e}")))?;
            let req = Request {
                limits: *limits,
                ..Request::default()
            };
            let out: Outcome = report.into_outcome(&req, Vec::new(), stderr.into_bytes());
            if out.status == Status::SandboxFailure {
                return Err(SessionError::Sandbox(
                    out.detail.unwrap_or_else(|| "the session failed".into()),
                ));
            }
            Err(SessionError::Ended {
                status: out.status,
                exit_code: out.exit_code,
                signal: out.signal,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
        _ => Err(SessionError::Sandbox("bad frame from zygote".into())),
    }
}

/// The start of `bytes`, for a message.
fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]);
    format!(
        "`{}`{}",
        text.escape_debug(),
        if bytes.len() > 80 { "…" } else { "" }
    )
}

impl Drop for Session {
    fn drop(&mut self) {
        // Kill the session's zygote (and with it every process of the
        // slot), then give the slot a fresh one.
        self.worker = None;
        if Arc::strong_count(&self.slots) > 1 {
            let fresh = self.slots.respawn(self.slot);
            self.slots.give_back(fresh);
        } // else the executor and its other sessions are gone: nobody needs the slot
    }
}
