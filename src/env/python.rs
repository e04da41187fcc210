//! `python:FILE.py`: an environment written as a small Python file. The
//! file defines `task(task_id)` and `score(task, completion)`, and may
//! define `demonstration(task)`, `feedback(task, completion)`, a class
//! `Episode` (multi-step episodes: `Episode(task).step(action)`), `FILES`
//! (data files beside it), `TASK_COUNT` and `TIMEOUT` (docs/guide/
//! environments.md has the whole contract, with examples).
//!
//! The file runs inside the sandbox, never in this process: a few
//! long-lived sandbox sessions ([`crate::sandbox::Session`]), each running
//! the trusted runner `python_runner.py`, which loads the file (sent from
//! here: the sandbox sees none of the host's folders) and answers one JSON
//! line a call. Calls run in parallel, one at a time a session. A call that
//! does not answer within the timeout, a session that crashes or meets a
//! limit, an answer that is not the protocol's: the session is killed with
//! every process of it and started again at its next call, and the sample
//! is masked under a counted `python_*` reason ([`Score::Masked`], `Err`
//! from `task`, [`Step::masked`]); the run goes on. An exception in the
//! user's code masks the sample (`python_exception`) and keeps the session.
//! The first fault of each reason is logged with its detail (the
//! traceback's end, the session's stderr).
//!
//! What must never happen here: a fault of the user's code stopping the
//! caller, or a process of it outliving the environment.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use rayon::prelude::*;
use serde_json::{Value, json};

use super::{Environment, Episode, Score, Step, Task};
use crate::data::buckets::Difficulty;
use crate::sandbox::{Executor, Limits, Session, SessionError, Status};

/// The trusted runner every session runs (its protocol is in its header).
const RUNNER: &str = include_str!("python_runner.py");

/// A call's timeout when the file sets no `TIMEOUT`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a session gets to start and load the file (and its `FILES`).
const LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Most bytes of `FILES` sent into a session (its `/tmp` holds 64 MiB).
const MAX_FILE_BYTES: u64 = 48 << 20;

/// Why a call has no usable answer: its `python_*` reason and the detail.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub reason: &'static str,
    pub detail: String,
}

impl Fault {
    fn new(reason: &'static str, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }

    fn of(e: SessionError) -> Self {
        let reason = match &e {
            SessionError::Timeout(_) => "python_timeout",
            SessionError::Ended { status, .. } => match status {
                Status::OutputLimit => "python_output_limit",
                Status::MemoryLimit => "python_memory_limit",
                Status::CpuTimeout => "python_cpu_limit",
                _ => "python_crashed",
            },
            SessionError::Garbage(_) => "python_garbage",
            SessionError::Sandbox(_) | SessionError::Closed | SessionError::Request(_) => {
                "python_sandbox_failure"
            }
        };
        Self::new(reason, e.to_string())
    }
}

/// The limits of a session: a session is one Python process that lives for
/// many calls, so `cpu_seconds` is its CPU time in all (a session that
/// spends it is started again) and `stdout_bytes` the longest answer line.
pub fn session_limits() -> Limits {
    Limits {
        cpu_seconds: 3_600,
        wall_ms: 0,
        memory_bytes: 1 << 30,
        stdout_bytes: 8 << 20,
        stderr_bytes: 64 << 10,
        file_size_bytes: 16 << 20,
        open_files: 256,
        processes: 32,
    }
}

/// What the file defines, as its first load found.
#[derive(Debug, Clone)]
struct Defines {
    functions: Vec<String>,
    multi_step: bool,
    task_count: Option<u64>,
}

impl Defines {
    fn has(&self, f: &str) -> bool {
        self.functions.iter().any(|g| g == f)
    }
}

/// One session slot: the session while it lives (`None` once a fault
/// ended it; the next call starts another) and how many it has had, so an
/// episode knows when its state is gone.
struct Lane {
    session: Option<Session>,
    generation: u64,
    next_id: u64,
}

/// An environment defined by a Python file (see the module's header).
pub struct PythonEnv {
    name: &'static str,
    path: PathBuf,
    /// The `load` request every new session gets (the source and `FILES`).
    load: Value,
    exec: Executor,
    limits: Limits,
    timeout: Duration,
    defines: Defines,
    lanes: Vec<Mutex<Lane>>,
    next: AtomicUsize,
    /// Reasons already logged (the first fault of each is).
    logged: Mutex<BTreeSet<&'static str>>,
}

impl PythonEnv {
    /// The environment of the file at `path`, named `label` in logs
    /// (`python:FILE`), with one session a worker slot of `exec`. Every
    /// session loads the file now, so a file that fails to load, or whose
    /// `task(0)` fails, is an error here, with the Python traceback's end.
    pub fn new(path: &Path, label: &str, exec: Executor) -> anyhow::Result<Self> {
        let source = std::fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read the Python environment `{}`\nhint: `python:FILE.py` names a Python file, relative to the folder trace-train runs in",
                path.display()
            )
        })?;
        let limits = session_limits();
        let fault = |what: &str, f: Fault| {
            anyhow::anyhow!(
                "the Python environment `{}` {what} in the sandbox ({}):\n{}\nhint: run `python3 {}` to see the error outside the sandbox; the sandbox sees none of the host's folders (list data files in `FILES`) and has no network",
                path.display(),
                f.reason,
                last_lines(&f.detail, 15),
                path.display()
            )
        };
        // The data files it names, read beside it.
        let mut first =
            open_session(&exec, limits).map_err(|f| fault("could not start a session", f))?;
        let names = exchange(
            &mut first,
            0,
            json!({"op": "files", "source": source}),
            LOAD_TIMEOUT,
        )
        .map_err(|f| fault("has an unreadable `FILES` list", f))?;
        let folder = path.parent().unwrap_or(Path::new("."));
        let mut files = serde_json::Map::new();
        let mut total = 0u64;
        for name in names.as_array().into_iter().flatten() {
            let name = name.as_str().unwrap_or_default();
            anyhow::ensure!(
                !name.is_empty() && !name.starts_with('/') && !name.split('/').any(|p| p == ".."),
                "the Python environment `{}`: `FILES` names `{name}`\nhint: name files by their path relative to the environment's folder, without `..`",
                path.display()
            );
            let file = folder.join(name);
            let bytes = std::fs::read(&file).with_context(|| {
                format!(
                    "the Python environment `{}` lists `{name}` in `FILES`, but `{}` cannot be read\nhint: `FILES` names files beside the environment file",
                    path.display(),
                    file.display()
                )
            })?;
            total += bytes.len() as u64;
            anyhow::ensure!(
                total <= MAX_FILE_BYTES,
                "the Python environment `{}`: its `FILES` hold more than {} MiB\nhint: a session's folder holds 64 MiB; make the data smaller or generate it in the file",
                path.display(),
                MAX_FILE_BYTES >> 20
            );
            files.insert(name.to_owned(), Value::String(crate::hex(&bytes)));
        }
        let load = json!({
            "op": "load",
            "source": source,
            "path": path.display().to_string(),
            "files": files,
        });
        let loaded = exchange(&mut first, 1, load.clone(), LOAD_TIMEOUT)
            .map_err(|f| fault("failed to load", f))?;
        let defines = Defines {
            functions: loaded["functions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect(),
            multi_step: loaded["multi_step"].as_bool().unwrap_or(false),
            task_count: loaded["task_count"].as_u64(),
        };
        anyhow::ensure!(
            defines.has("task"),
            "the Python environment `{}` defines no `task(task_id)` function\nhint: define `task(task_id)` returning the task's prompt, or a dict with `prompt` and `expected`",
            path.display()
        );
        anyhow::ensure!(
            defines.has("score") || defines.multi_step,
            "the Python environment `{}` defines neither `score(task, completion)` nor a class `Episode` with a `step(self, action)` method\nhint: a one-answer environment defines `score`, a multi-step one `Episode`",
            path.display()
        );
        let timeout = loaded["timeout"]
            .as_f64()
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64);
        let mut sessions = vec![first];
        // The other sessions start in parallel, each loading the file.
        let more: Vec<Result<Session, Fault>> = (1..exec.workers())
            .into_par_iter()
            .map(|_| {
                let mut s = open_session(&exec, limits)?;
                exchange(&mut s, 1, load.clone(), LOAD_TIMEOUT)?;
                Ok(s)
            })
            .collect();
        for s in more {
            sessions.push(s.map_err(|f| fault("failed to load", f))?);
        }
        let env = PythonEnv {
            name: Box::leak(label.to_owned().into_boxed_str()),
            path: path.to_owned(),
            load,
            exec,
            limits,
            timeout,
            defines,
            lanes: sessions
                .into_iter()
                .map(|s| {
                    Mutex::new(Lane {
                        session: Some(s),
                        generation: 0,
                        next_id: 2,
                    })
                })
                .collect(),
            next: AtomicUsize::new(0),
            logged: Mutex::new(BTreeSet::new()),
        };
        // A task it cannot make is a mistake best shown now, not masked.
        if env.defines.task_count != Some(0) {
            env.call(None, json!({"op": "task", "task_id": 0}))
                .and_then(|(_, _, v)| task_of(0, v))
                .map_err(|f| fault("fails to make task 0", f))?;
        }
        Ok(env)
    }

    /// The file it was made from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The per-call timeout (the file's `TIMEOUT`, else [`DEFAULT_TIMEOUT`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A lane to call on: a free one, else the next in turn.
    fn any_lane(&self) -> (usize, MutexGuard<'_, Lane>) {
        let n = self.lanes.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n {
            let i = (start + k) % n;
            if let Ok(guard) = self.lanes[i].try_lock() {
                return (i, guard);
            }
        }
        let guard = self.lanes[start].lock().unwrap_or_else(|e| e.into_inner());
        (start, guard)
    }

    /// Sends `req` on lane `lane` (any free one when `None`), starting its
    /// session again first when a fault ended it. Answers the lane, the
    /// session's generation and the answer's value.
    fn call(&self, lane: Option<usize>, req: Value) -> Result<(usize, u64, Value), Fault> {
        let (i, mut guard) = match lane {
            Some(i) => (i, self.lanes[i].lock().unwrap_or_else(|e| e.into_inner())),
            None => self.any_lane(),
        };
        let result = self
            .call_on(&mut guard, req)
            .map(|v| (i, guard.generation, v));
        if let Err(f) = &result {
            self.log(f);
        }
        result
    }

    fn call_on(&self, lane: &mut Lane, req: Value) -> Result<Value, Fault> {
        if lane.session.as_ref().is_none_or(|s| !s.is_alive()) {
            // Dropping the dead session gives its slot a fresh zygote,
            // which the new session takes.
            lane.session = None;
            let mut s = open_session(&self.exec, self.limits)
                .map_err(|f| Fault::new("python_restart_failed", f.detail))?;
            exchange(&mut s, 1, self.load.clone(), LOAD_TIMEOUT)
                .map_err(|f| Fault::new("python_restart_failed", f.detail))?;
            lane.session = Some(s);
            lane.generation += 1;
            lane.next_id = 2;
        }
        let session = lane.session.as_mut().expect("started above");
        lane.next_id += 1;
        let out = exchange(session, lane.next_id, req, self.timeout);
        if !session.is_alive() {
            lane.session = None;
        }
        out
    }

    /// Logs the first fault of each reason with its detail; the callers
    /// count every one.
    fn log(&self, f: &Fault) {
        let first = self
            .logged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(f.reason);
        if first {
            tracing::warn!(
                "environment `{}`: {} (the first; later ones are counted, not logged): {}",
                self.name,
                f.reason,
                last_lines(&f.detail, 15)
            );
        }
    }

    /// A score from a one-step episode, for a file with `Episode` and no
    /// `score`.
    fn score_by_episode(&self, task: &Task, completion: &str) -> Score {
        match self.start(task) {
            Ok(mut e) => e.act(completion).score,
            Err(why) => Score::Masked(why),
        }
    }
}

/// Starts a session of the runner.
fn open_session(exec: &Executor, limits: Limits) -> Result<Session, Fault> {
    exec.session(RUNNER.as_bytes(), limits).map_err(Fault::of)
}

/// One call on `session`: the answer's value, or the fault. An answer to
/// another call (the user's code wrote to the protocol's fd) or not in the
/// protocol's shape is garbage, and ends the session.
fn exchange(
    session: &mut Session,
    id: u64,
    mut req: Value,
    timeout: Duration,
) -> Result<Value, Fault> {
    req["id"] = json!(id);
    let line = session.call(&req.to_string(), timeout).map_err(Fault::of)?;
    let mut answer: Value =
        serde_json::from_str(&line).map_err(|e| Fault::new("python_garbage", e.to_string()))?;
    let garbage = |session: &mut Session, what: &str| {
        session.kill();
        Fault::new(
            "python_garbage",
            format!("{what}: `{}`", line.chars().take(200).collect::<String>()),
        )
    };
    if answer["id"] != json!(id) {
        return Err(garbage(session, "an answer that is not this call's"));
    }
    if let Some(v) = answer.get_mut("ok") {
        return Ok(v.take());
    }
    let detail = answer["detail"].as_str().unwrap_or_default().to_owned();
    match answer["error"].as_str() {
        Some("exception") => Err(Fault::new("python_exception", detail)),
        Some("value") => Err(Fault::new("python_bad_value", detail)),
        _ => Err(garbage(session, "an answer without `ok` or `error`")),
    }
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The task `task()` answered for `task_id`: a prompt, or a dict with
/// `prompt` and optionally `expected` and `difficulty`.
fn task_of(task_id: u64, v: Value) -> Result<Task, Fault> {
    let bad = |d: String| Fault::new("python_bad_value", format!("task({task_id}) {d}"));
    let (prompt, expected, difficulty) = match v {
        Value::String(p) => (p, String::new(), Difficulty::default()),
        Value::Object(mut m) => {
            let prompt = match m.remove("prompt") {
                Some(Value::String(p)) => p,
                other => {
                    return Err(bad(format!(
                        "returned a dict whose `prompt` is {other:?}, not a string"
                    )));
                }
            };
            let expected = match m.remove("expected") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(e)) => e,
                Some(other) => {
                    return Err(bad(format!(
                        "returned `expected` {other}, not a string (json.dumps a structure into it)"
                    )));
                }
            };
            let difficulty = match m.remove("difficulty") {
                None | Some(Value::Null) => Difficulty::default(),
                Some(d) => serde_json::from_value(d.clone()).map_err(|e| {
                    bad(format!(
                        "returned `difficulty` {d}: {e} (keys: loop_depth, lines, injections, output_lines, whole numbers)"
                    ))
                })?,
            };
            if let Some(k) = m.keys().next() {
                return Err(bad(format!(
                    "returned a key `{k}` that is not kept (only `prompt`, `expected`, `difficulty`); put what scoring needs in `expected`"
                )));
            }
            (prompt, expected, difficulty)
        }
        other => return Err(bad(format!("returned {other}, not a prompt or a dict"))),
    };
    Ok(Task {
        task_id,
        prompt,
        expected,
        difficulty,
    })
}

/// What the user's functions receive as `task`.
fn task_json(task: &Task) -> Value {
    json!({"task_id": task.task_id, "prompt": task.prompt, "expected": task.expected})
}

/// A step dict: `reward` and `done`, optionally `observation` and `success`.
fn step_of(v: Value) -> Result<Step, Fault> {
    let bad = |d: String| Fault::new("python_bad_value", format!("Episode.step {d}"));
    let Value::Object(m) = v else {
        return Err(bad(format!("returned {v}, not a dict")));
    };
    let reward = m.get("reward").and_then(Value::as_f64).ok_or_else(|| {
        bad(format!(
            "returned `reward` {:?}, not a number",
            m.get("reward")
        ))
    })?;
    let done = m.get("done").and_then(Value::as_bool).ok_or_else(|| {
        bad(format!(
            "returned `done` {:?}, not True or False",
            m.get("done")
        ))
    })?;
    let observation = match m.get("observation") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(o) => return Err(bad(format!("returned `observation` {o}, not a string"))),
    };
    let success = match m.get("success") {
        None | Some(Value::Null) => done && reward >= 1.0,
        Some(Value::Bool(b)) => *b,
        Some(o) => return Err(bad(format!("returned `success` {o}, not True or False"))),
    };
    Ok(Step {
        score: Score::Reward(reward),
        observation,
        done,
        success,
    })
}

impl Environment for PythonEnv {
    fn name(&self) -> &'static str {
        self.name
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        if let Some(n) = self.defines.task_count
            && task_id >= n
        {
            return Err("task_id_out_of_range".into());
        }
        self.call(None, json!({"op": "task", "task_id": task_id}))
            .and_then(|(_, _, v)| task_of(task_id, v))
            .map_err(|f| {
                self.log(&f);
                f.reason.to_owned()
            })
    }

    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        self.exec
            .install(|| ids.par_iter().map(|&id| self.task(id)).collect())
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        if !self.defines.has("score") {
            return self.score_by_episode(task, completion);
        }
        let req = json!({"op": "score", "task": task_json(task), "completion": completion});
        match self.call(None, req) {
            Ok((_, _, v)) => match v.as_f64() {
                Some(r) => Score::Reward(r),
                None => {
                    let f = Fault::new(
                        "python_bad_value",
                        format!("score() returned {v}, not a number"),
                    );
                    self.log(&f);
                    Score::Masked(f.reason.into())
                }
            },
            Err(f) => Score::Masked(f.reason.into()),
        }
    }

    fn demonstration(&self, task: &Task) -> Option<String> {
        if !self.defines.has("demonstration") {
            return None;
        }
        let req = json!({"op": "demonstration", "task": task_json(task)});
        match self.call(None, req) {
            Ok((_, _, Value::String(s))) => Some(s),
            Ok((_, _, Value::Null)) => None,
            Ok((_, _, other)) => {
                self.log(&Fault::new(
                    "python_bad_value",
                    format!("demonstration() returned {other}, not a string or None"),
                ));
                None
            }
            Err(_) => None,
        }
    }

    fn feedback(&self, task: &Task, completion: &str, kind: &str) -> Result<String, String> {
        if !self.defines.has("feedback") {
            return Ok(crate::reward::feedback(completion, &task.expected, kind));
        }
        let req = json!({"op": "feedback", "task": task_json(task), "completion": completion});
        match self.call(None, req) {
            Ok((_, _, Value::String(s))) => Ok(s),
            Ok((_, _, other)) => {
                let f = Fault::new(
                    "python_bad_value",
                    format!("feedback() returned {other}, not a string"),
                );
                self.log(&f);
                Err(f.reason.into())
            }
            Err(f) => Err(f.reason.into()),
        }
    }

    fn task_count(&self) -> Option<u64> {
        self.defines.task_count
    }

    fn multi_step(&self) -> bool {
        self.defines.multi_step
    }

    fn start(&self, task: &Task) -> Result<Box<dyn Episode + '_>, String> {
        if !self.defines.multi_step {
            return Err(format!("{} has one-answer tasks, no episodes", self.name));
        }
        let (lane, generation, id) = self
            .call(None, json!({"op": "start", "task": task_json(task)}))
            .map_err(|f| f.reason.to_owned())?;
        Ok(Box::new(PyEpisode {
            env: self,
            lane,
            generation,
            id,
            done: false,
        }))
    }
}

/// An episode in progress: its state lives in one session, as the
/// runner's `Episode` object `id`.
struct PyEpisode<'a> {
    env: &'a PythonEnv,
    lane: usize,
    /// The session it was started in; another one holds none of its state.
    generation: u64,
    id: Value,
    done: bool,
}

impl PyEpisode<'_> {
    /// `req` sent to the runner holding this episode, under its lane's
    /// lock; a fault of another call that started the session again has
    /// lost the episode's state.
    fn call(&self, req: Value) -> Result<Value, Fault> {
        let mut lane = self.env.lanes[self.lane]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if lane.generation != self.generation || lane.session.is_none() {
            return Err(Fault::new(
                "python_episode_lost",
                "the session holding the episode was started again",
            ));
        }
        self.env.call_on(&mut lane, req)
    }
}

impl Episode for PyEpisode<'_> {
    fn act(&mut self, action: &str) -> Step {
        if self.done {
            return Step::masked("python_episode_over");
        }
        let req = json!({"op": "step", "episode": self.id, "action": action});
        let step = self.call(req).and_then(step_of).unwrap_or_else(|f| {
            self.env.log(&f);
            Step::masked(f.reason)
        });
        self.done = step.done;
        step
    }

    /// The episode object's `expert()`, where its class defines one: the
    /// completion a scripted expert gives now, or None.
    fn expert(&mut self) -> Result<Option<String>, String> {
        if self.done {
            return Ok(None);
        }
        let got = self
            .call(json!({"op": "expert", "episode": self.id}))
            .and_then(|v| match v {
                Value::String(s) => Ok(Some(s)),
                Value::Null => Ok(None),
                other => Err(Fault::new(
                    "python_bad_value",
                    format!("expert() returned {other}, not a string or None"),
                )),
            });
        got.map_err(|f| {
            self.env.log(&f);
            f.reason.into()
        })
    }
}

impl Drop for PyEpisode<'_> {
    fn drop(&mut self) {
        if self.done {
            return; // the runner forgot it at its last step
        }
        // Best effort: an episode already lost has nothing to end, and a
        // fault here is a fault of the session, which the next call finds
        // and counts.
        let _ = self.call(json!({"op": "end", "episode": self.id}));
    }
}
