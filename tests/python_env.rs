//! Sandbox sessions and the `python:FILE.py` environments built on them:
//! the line protocol against hostile programs and hostile environment
//! files (an endless loop, a fork bomb, a huge answer, a crash mid-episode,
//! writes outside the session's folder, garbage on the protocol's fd),
//! each masked under its reason while the caller goes on and nothing of it
//! survives; a multi-step episode through `env::begin`; and the Trace
//! example, whose rewards must equal the built-in trace environment's.
//!
//! Run as root (as CI does), the sessions get the full sandbox and every
//! process of this file's slot uids is counted afterwards; without root
//! they get user namespaces, as in tests/sandbox_hostile.rs. Tests run one
//! at a time (`serial`), so "nothing left" is a sharp assertion.

mod common;

use std::ops::Range;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use trace_train::env::python::PythonEnv;
use trace_train::env::{self, Environment, Score, Task, TraceEnv};
use trace_train::sandbox::{Executor, Limits, SessionError, Status};

/// Slot uids of this file's executors.
const UIDS: Range<u32> = 61_080..61_084;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn executor(workers: usize) -> Executor {
    Executor::new(sandbox_config(workers, UIDS.start)).expect("sandbox executor (needs root)")
}

fn session_limits() -> Limits {
    Limits {
        stdout_bytes: 1 << 16,
        ..small_limits()
    }
}

/// A session program that answers each JSON line as told by its `do`.
const ECHO: &str = r#"
import json, os, sys, time
for line in sys.stdin:
    req = json.loads(line)
    do = req.get("do")
    if do == "hang":
        time.sleep(3600)
    elif do == "exit":
        sys.stderr.write("leaving now\n"); sys.stderr.flush()
        os._exit(3)
    elif do == "garbage":
        print("this is not json", flush=True)
    elif do == "huge":
        print("[" + "1," * (1 << 17) + "1]", flush=True)
    elif do == "daemon":
        if os.fork() == 0:
            os.setsid()
            time.sleep(3600)
        print(json.dumps({"forked": True}), flush=True)
    else:
        print(json.dumps({"echo": req}), flush=True)
"#;

#[test]
fn a_session_answers_lines_and_every_fault_ends_it_with_nothing_left() {
    let _g = serial();
    let exec = executor(1);
    let t = Duration::from_secs(5);
    let mut s = exec.session(ECHO.as_bytes(), session_limits()).unwrap();
    for i in 0..50 {
        let a = s.call(&format!(r#"{{"n": {i}}}"#), t).unwrap();
        assert_eq!(a, format!(r#"{{"echo": {{"n": {i}}}}}"#));
    }
    assert!(matches!(
        s.call("{\"a\":\n1}", t),
        Err(SessionError::Request(_))
    ));
    assert!(s.is_alive(), "a bad request leaves the session alone");
    // A process the program leaves behind lives until the session ends.
    assert_eq!(
        s.call(r#"{"do": "daemon"}"#, t).unwrap(),
        r#"{"forked": true}"#
    );

    // A hang: the timeout, and the session is killed.
    let start = Instant::now();
    let e = s
        .call(r#"{"do": "hang"}"#, Duration::from_millis(500))
        .unwrap_err();
    assert_eq!(e, SessionError::Timeout(Duration::from_millis(500)));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(!s.is_alive());
    assert_eq!(s.call("{}", t).unwrap_err(), SessionError::Closed);
    drop(s);
    assert_nothing_left("after a timeout", &UIDS);

    // An exit: its status and stderr's tail.
    let mut s = exec.session(ECHO.as_bytes(), session_limits()).unwrap();
    match s.call(r#"{"do": "exit"}"#, t).unwrap_err() {
        SessionError::Ended {
            status,
            exit_code,
            stderr,
            ..
        } => {
            assert_eq!((status, exit_code), (Status::ErrorExit, Some(3)));
            assert!(stderr.contains("leaving now"), "{stderr}");
        }
        other => panic!("{other:?}"),
    }
    drop(s);

    // Garbage and a line over the cap.
    let mut s = exec.session(ECHO.as_bytes(), session_limits()).unwrap();
    assert!(matches!(
        s.call(r#"{"do": "garbage"}"#, t),
        Err(SessionError::Garbage(_))
    ));
    assert!(!s.is_alive());
    drop(s);
    let mut s = exec.session(ECHO.as_bytes(), session_limits()).unwrap();
    match s.call(r#"{"do": "huge"}"#, t).unwrap_err() {
        SessionError::Ended { status, .. } => assert_eq!(status, Status::OutputLimit),
        other => panic!("{other:?}"),
    }
    drop(s);
    assert_nothing_left("after garbage and a huge line", &UIDS);

    // The slot runs plain programs again afterwards.
    let out = exec.run(&trace_train::sandbox::Request::new("print(6 * 7)", ""));
    assert_eq!((out.status, out.stdout), (Status::Ok, b"42\n".to_vec()));
    drop(exec);
    assert_nothing_left("after the executor", &UIDS);
}

/// A hostile environment: `score` and `feedback` do what the completion
/// says; an episode crashes when told.
const HOSTILE: &str = r#"
import os, sys, time
TIMEOUT = 1.0

def task(task_id):
    return {"prompt": "do something", "expected": "ok"}

def score(task, completion):
    if completion == "loop":
        while True:
            pass
    if completion == "sleep":
        time.sleep(3600)
    if completion == "forkbomb":
        while True:
            try:
                os.fork()
            except OSError:
                pass
    if completion == "crash":
        os._exit(1)
    if completion == "kill":
        os.kill(os.getpid(), 9)
    if completion == "raise":
        raise ValueError("bad completion")
    if completion == "nan":
        return float("nan")
    if completion == "text":
        return "one"
    if completion == "print":
        print("noise on stdout")
        os.write(1, b"noise on fd 1\n")
        return 0.5
    if completion == "garbage":
        for fd in range(3, 64):
            try:
                os.write(fd, b"garbage\n")
            except OSError:
                pass
        return 0.25
    if completion.startswith("escape "):
        written = 0
        for path in ["/etc/python-env-test", "/usr/python-env-test", completion[7:]]:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
                written += path.startswith("/tmp/")  # its own /tmp: allowed
            except OSError:
                pass
        return float(written)
    if completion == "memory":
        hog = bytearray(4 << 30)
        return 0.0
    return 1.0 if completion == task["expected"] else 0.0

def feedback(task, completion):
    if completion == "huge":
        return "x" * (64 << 20)
    return "fine"

class Episode:
    def __init__(self, task):
        self.turns = 0

    def step(self, action):
        self.turns += 1
        if action == "crash":
            os.abort()
        return {"observation": "again", "reward": 0.1, "done": self.turns >= 3}
"#;

fn masked(s: Score) -> String {
    match s {
        Score::Masked(why) => why,
        Score::Reward(r) => panic!("expected a mask, got reward {r}"),
    }
}

#[test]
fn a_hostile_environment_is_masked_by_reason_and_the_caller_goes_on() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hostile.py");
    std::fs::write(&file, HOSTILE).unwrap();
    let env = PythonEnv::new(&file, "python:hostile.py", executor(2)).unwrap();
    assert_eq!(env.timeout(), Duration::from_secs(1));
    assert_eq!(env.name(), "python:hostile.py");
    let task = env.task(7).unwrap();
    assert_eq!(
        (task.prompt.as_str(), task.expected.as_str()),
        ("do something", "ok")
    );
    let fine = |env: &PythonEnv| assert_eq!(env.score(&task, "ok"), Score::Reward(1.0));

    let cases = [
        ("loop", "python_timeout"),
        ("sleep", "python_timeout"),
        ("forkbomb", "python_timeout"),
        ("crash", "python_crashed"),
        ("kill", "python_crashed"),
        ("raise", "python_exception"),
        ("nan", "python_bad_value"),
        ("text", "python_bad_value"),
        ("garbage", "python_garbage"),
        ("memory", "python_exception"),
    ];
    for (completion, reason) in cases {
        let start = Instant::now();
        assert_eq!(masked(env.score(&task, completion)), reason, "{completion}");
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{completion} took {:?}",
            start.elapsed()
        );
        fine(&env);
        fine(&env);
    }
    // A print goes to stderr, never into the protocol.
    assert_eq!(env.score(&task, "print"), Score::Reward(0.5));
    // Writes outside the session's own /tmp fail; its /tmp is its own.
    let host = std::env::temp_dir().join(format!("python-env-escape-{}", std::process::id()));
    let escape = format!("escape {}", host.display());
    assert_eq!(env.score(&task, &escape), Score::Reward(1.0));
    assert!(
        !host.exists(),
        "a write reached the host's {}",
        host.display()
    );
    assert!(!Path::new("/etc/python-env-test").exists());
    assert!(!Path::new("/usr/python-env-test").exists());
    // A huge answer is an output limit.
    assert_eq!(
        env.feedback(&task, "huge", "verdict"),
        Err("python_output_limit".into())
    );
    assert_eq!(env.feedback(&task, "x", "verdict"), Ok("fine".into()));

    // Many calls at once, across the sessions, some of them hostile.
    let completions: Vec<&str> = (0..40)
        .map(|i| if i % 10 == 3 { "crash" } else { "ok" })
        .collect();
    let scores: Vec<Score> = std::thread::scope(|s| {
        let handles: Vec<_> = completions
            .iter()
            .map(|c| {
                let (env, task) = (&env, &task);
                s.spawn(move || env.score(task, c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (c, s) in completions.iter().zip(scores) {
        match *c {
            "ok" => assert_eq!(s, Score::Reward(1.0)),
            _ => assert_eq!(s, Score::Masked("python_crashed".into())),
        }
    }

    // A crash mid-episode masks that episode; the next one runs.
    assert!(env.multi_step());
    let mut e = env::begin(&env, &task).unwrap();
    let first = e.act("hello");
    assert_eq!(
        (first.score.clone(), first.done),
        (Score::Reward(0.1), false)
    );
    let crashed = e.act("crash");
    assert_eq!(crashed.score, Score::Masked("python_crashed".into()));
    assert!(crashed.done);
    drop(e);
    let mut e = env::begin(&env, &task).unwrap();
    let steps: Vec<_> = (0..3).map(|_| e.act("fine")).collect();
    assert!(steps[2].done && !steps[1].done, "{steps:?}");
    drop(e);
    fine(&env);

    drop(env);
    assert_nothing_left("after the hostile environment", &UIDS);
}

#[test]
fn an_environment_that_fails_to_load_names_the_file_and_line() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.py");
    std::fs::write(
        &file,
        "def task(i):\n    return 'x'\n\nimport json\nVALUE = json.loads('{')\n",
    )
    .unwrap();
    let err = format!(
        "{:#}",
        PythonEnv::new(&file, "python:broken.py", executor(1))
            .err()
            .unwrap()
    );
    assert!(err.contains("broken.py\", line 5"), "{err}");
    assert!(err.contains("JSONDecodeError"), "{err}");
    assert!(err.contains("hint:"), "{err}");
    let file = dir.path().join("no_score.py");
    std::fs::write(&file, "def task(i):\n    return 'x'\n").unwrap();
    let err = format!(
        "{:#}",
        PythonEnv::new(&file, "python:no_score.py", executor(1))
            .err()
            .unwrap()
    );
    assert!(err.contains("neither `score(task, completion)`"), "{err}");
    let file = dir.path().join("bad_task.py");
    std::fs::write(&file, "def task(i):\n    return {'prompt': 'x', 'answer': 1}\n\ndef score(t, c):\n    return 0.0\n").unwrap();
    let err = format!(
        "{:#}",
        PythonEnv::new(&file, "python:bad_task.py", executor(1))
            .err()
            .unwrap()
    );
    assert!(err.contains("a key `answer` that is not kept"), "{err}");
    assert_nothing_left("after failed loads", &UIDS);
}

#[test]
fn guess_the_number_is_a_multi_step_episode() {
    let _g = serial();
    let file = repo().join("examples/python_envs/guess.py");
    let env = PythonEnv::new(&file, "python:guess.py", executor(2)).unwrap();
    assert!(env.multi_step());
    assert_eq!(env.task_count(), Some(1000));
    for id in [0, 5, 999] {
        let task = env.task(id).unwrap();
        let secret: i64 = task.expected.parse().unwrap();
        let mut e = env::begin(&env, &task).unwrap();
        // Binary search, as a model that reads the hints would play.
        let (mut lo, mut hi) = (1, 100);
        let mut rewards = Vec::new();
        let last = loop {
            let guess = (lo + hi) / 2;
            let step = e.act(&format!("My guess: {guess}"));
            let Score::Reward(r) = step.score else {
                panic!("{step:?}")
            };
            rewards.push(r);
            if step.done {
                break step;
            }
            if step.observation.contains("higher") {
                lo = guess + 1;
            } else {
                assert!(step.observation.contains("lower"), "{}", step.observation);
                hi = guess - 1;
            }
        };
        assert!(last.success, "task {id} (secret {secret}): {rewards:?}");
        assert_eq!(*rewards.last().unwrap(), 1.0);
        assert!(rewards.len() <= 7, "{rewards:?}");
        // Every guess but the last was wrong: step rewards only for getting closer.
        assert!(
            rewards[..rewards.len() - 1]
                .iter()
                .all(|&r| r == 0.0 || r == 0.1)
        );
        // Without `score`, a completion is scored as a one-step episode.
        assert_eq!(env.score(&task, &task.expected), Score::Reward(1.0));
        assert_eq!(env.demonstration(&task), Some(task.expected.clone()));
    }
    // A model that never answers a number runs out of turns, unsuccessful.
    let task = env.task(1).unwrap();
    let mut e = env::begin(&env, &task).unwrap();
    let steps: Vec<_> = (0..7).map(|_| e.act("I do not know")).collect();
    assert!(
        steps[6].done && !steps[6].success && !steps[5].done,
        "{steps:?}"
    );
    assert_eq!(steps[0].observation, "Answer with one number.");
    assert_eq!(env.task(1000), Err("task_id_out_of_range".into()));
    drop(e);
    // The episode's `expert()` bisects: a demonstration reaches the number
    // within 7 guesses, each observation the hint after the last guess.
    for id in [0, 5, 999] {
        let task = env.task(id).unwrap();
        let shown = env::demonstrate(&env, &task, 10).unwrap();
        assert!((1..=7).contains(&shown.len()), "{shown:?}");
        assert_eq!(shown[0].observation, task.prompt);
        assert_eq!(shown[0].completion, "50");
        assert_eq!(shown.last().unwrap().completion, task.expected);
        for (a, b) in shown.iter().zip(&shown[1..]) {
            let hint = format!("{} is wrong: the number is ", a.completion);
            assert!(b.observation.starts_with(&hint), "{shown:?}");
        }
    }
    // Allowed fewer actions than it needs, it demonstrates nothing (task
    // 5's number is not 50).
    let task = env.task(5).unwrap();
    assert_eq!(
        env::demonstrate(&env, &task, 1),
        Err("demonstration_too_long".into())
    );
    drop(env);
    assert_nothing_left("after the episodes", &UIDS);
}

/// Completions of a task that the Trace rule must score alike in Rust and
/// in the example's Python: the answer itself and ways of getting it
/// nearly or not at all right.
fn completions_of(expected: &str) -> Vec<String> {
    let mut out = vec![
        expected.to_owned(),
        format!("  {expected}\n\n"),
        expected.replace('\n', "\n\n  "),
        expected.to_uppercase(),
        format!("```\n{expected}\n```"),
        format!("```text\n{expected}\n```\nThat is all."),
        format!("<think>\nRun it line by line.\n</think>\n{expected}"),
        format!("<think>unfinished</think> wrong </think>{expected}"),
        format!("{expected}\nextra line"),
        format!("{expected}x"),
        String::new(),
        "   \n\t".to_owned(),
        "```\n```".to_owned(),
    ];
    let chars: Vec<char> = expected.chars().collect();
    if chars.len() > 1 {
        out.push(chars[..chars.len() - 1].iter().collect());
        out.push(chars[1..].iter().collect());
    }
    out
}

#[test]
fn the_trace_example_scores_as_the_trace_environment_on_200_tasks() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // The tasks, exported by the binary as the example's header says.
    let o = trace_train(
        dir.path(),
        &[
            "task",
            "--environment",
            "trace",
            "--task_id",
            "0",
            "--tasks",
            "230",
            "--num_workers",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let exported: Vec<serde_json::Value> = String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        exported.len() >= 200,
        "only {} tasks exported: {}",
        exported.len(),
        stderr(&o)
    );
    let lines: Vec<String> = exported[..200].iter().map(|v| v.to_string()).collect();
    std::fs::write(
        dir.path().join("trace_tasks.jsonl"),
        lines.join("\n") + "\n",
    )
    .unwrap();
    std::fs::copy(
        repo().join("examples/python_envs/trace.py"),
        dir.path().join("trace.py"),
    )
    .unwrap();
    let py = PythonEnv::new(&dir.path().join("trace.py"), "python:trace.py", executor(2)).unwrap();
    assert_eq!(py.task_count(), Some(200));

    let rows = trace_train::dataset::Source::resolve("builtin", "python_dataset.jsonl")
        .unwrap()
        .rows()
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let trace = TraceEnv::new(
        rows,
        Executor::new(sandbox_config(2, UIDS.start + 2)).unwrap(),
        6,
    )
    .unwrap();
    let ids: Vec<u64> = exported[..200]
        .iter()
        .map(|v| v["task_id"].as_u64().unwrap())
        .collect();
    let made = trace.tasks(&ids);
    let (mut right, mut wrong, mut compared) = (0, 0, 0);
    for (k, (id, t)) in ids.iter().zip(made).enumerate() {
        let t: Task = t.unwrap();
        let p = py.task(k as u64).unwrap();
        assert_eq!(
            (&p.prompt, &p.expected),
            (&t.prompt, &t.expected),
            "task {id}"
        );
        for c in completions_of(&t.expected) {
            let want = trace.score(&t, &c);
            assert_eq!(py.score(&p, &c), want, "task {id}, completion {c:?}");
            match want {
                Score::Reward(1.0) => right += 1,
                Score::Reward(_) => wrong += 1,
                Score::Masked(why) => panic!("trace masked {why}"),
            }
            compared += 1;
        }
    }
    assert!(compared >= 200 * 13, "{compared}");
    assert!(
        right >= 200 * 6 && wrong >= 200 * 4,
        "right {right}, wrong {wrong}"
    );
    drop((py, trace));
    assert_nothing_left("after the parity run", &UIDS);
}

/// A training run's description of a `python:` environment holds the
/// file's content hash, so a resume after the file was edited is refused
/// by the fingerprint check (the same task ids would be scored otherwise).
#[test]
fn a_python_environments_description_changes_with_its_file() {
    use trace_train::env::registry::{EnvData, for_training};
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("e.py");
    let version = |expected: &str| {
        format!(
            "def task(task_id):\n    return {{'prompt': 'say {expected}', 'expected': '{expected}'}}\n\ndef score(task, completion):\n    return float(completion.strip() == task['expected'])\n"
        )
    };
    let data = EnvData {
        num_workers: Some(1),
        ..EnvData::default()
    };
    let spec = format!("python:{}", f.display());
    let described = |text: &str| {
        std::fs::write(&f, text).unwrap();
        // Unsandboxed: this test reads the description, not the scores.
        for_training(&spec, &data, true, 1).unwrap().1
    };
    let a = described(&version("x"));
    assert!(a.contains(&format!("{spec}:sha256:")), "{a}");
    assert_eq!(a, described(&version("x")));
    assert_ne!(a, described(&version("y")));
}
