//! Running ABD and DED programs in our sandbox with the semantics of
//! Affine's shared executor (`executor.py`), which the scores depend on:
//!
//! - limits: 30 s wall, 10 s CPU (hard 11), 512 MiB address space, 1,000,000
//!   bytes a stream;
//! - the code is fence-stripped first ([`strip_fences`]: the
//!   executor applies it to whatever it runs);
//! - the exit status is never looked at: a run "fails" only through
//!   stderr. A CPU-limit kill or `os._exit(3)` leaves stderr empty, so the
//!   partial stdout is judged as if the run had succeeded;
//! - a stream over its cap is cut and ends in `"\n…<truncated>"`; a wall
//!   timeout appends `"\n[TIMEOUT]"` to stderr (so it is an error);
//! - auto-run: when stdout and stderr are both blank, the code defines
//!   `solve` and has no `if __name__ == "__main__"` guard, it runs again
//!   with a main block that calls `solve()` and prints the result (`*res`
//!   for a list or tuple), unless it is `None`.
//!
//! Output is decoded as UTF-8 with replacement characters (a program that
//! prints invalid UTF-8 cannot match a text answer either way).

use std::sync::LazyLock;

use regex::Regex;

use super::py;
use crate::sandbox::{Executor, Limits, Outcome, Request, Status};

/// Bytes kept of a stream before the run is cut.
pub const STREAM_CAP: u64 = 1_000_000;

/// The executor's limits.
pub fn limits() -> Limits {
    Limits {
        cpu_seconds: 10,
        wall_ms: 30_000,
        memory_bytes: 512 << 20,
        stdout_bytes: STREAM_CAP,
        stderr_bytes: STREAM_CAP,
        ..Limits::default()
    }
}

/// What a run left, as the scorers read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyRun {
    pub stdout: String,
    pub stderr: String,
}

static MAIN_GUARD: LazyLock<Regex> = LazyLock::new(|| {
    let s = py::re_space();
    Regex::new(&format!(r#"if{s}+__name__{s}*=={s}*['"]__main__['"]"#)).expect("a valid pattern")
});

/// The block the auto-runner appends.
pub const SOLVE_MAIN: &str = "\n\nif __name__ == \"__main__\":\n    _res = solve()\n    if _res is not None:\n        if isinstance(_res, (list, tuple)):\n            print(*_res)\n        else:\n            print(_res)\n";

/// Whether a run with this code and these streams is run again with
/// [`SOLVE_MAIN`].
pub fn needs_auto_run(code: &str, run: &PyRun) -> bool {
    py::strip(&run.stdout).is_empty()
        && py::strip(&run.stderr).is_empty()
        && code.contains("def solve")
        && !MAIN_GUARD.is_match(code)
}

fn text(bytes: &[u8], truncated: bool) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    if truncated {
        s.push_str("\n\u{2026}<truncated>");
    }
    s
}

/// The streams of one outcome, or `Err` when the sandbox itself failed
/// (which says nothing about the program).
pub fn streams(out: &Outcome) -> Result<PyRun, String> {
    if out.status == Status::SandboxFailure {
        return Err(Status::SandboxFailure.as_str().to_owned());
    }
    let mut stderr = text(&out.stderr, out.stderr_truncated);
    if out.status == Status::WallTimeout {
        stderr.push_str("\n[TIMEOUT]");
    }
    Ok(PyRun {
        stdout: text(&out.stdout, out.stdout_truncated),
        stderr,
    })
}

/// Runs `code` on `stdin` as the executor would (fence-stripped, its
/// limits, the auto-run). `Err` only for a sandbox failure.
pub fn run(exec: &Executor, code: &str, stdin: &str) -> Result<PyRun, String> {
    let code = strip_fences(code);
    let once = |program: &str| {
        streams(&exec.run(&Request {
            program: program.as_bytes().to_vec(),
            stdin: stdin.as_bytes().to_vec(),
            limits: limits(),
        }))
    };
    let first = once(&code)?;
    if needs_auto_run(&code, &first) {
        return once(&format!("{code}{SOLVE_MAIN}"));
    }
    Ok(first)
}

static PYTHON_BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"(?s)```python{}*\n(.*?)```", py::re_space())).expect("valid")
});
static ANY_BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    let s = py::re_space();
    Regex::new(&format!(r"(?s)```(?:{}*){s}*\n(.*?)```", py::re_word())).expect("valid")
});
static LOOSE_BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    let s = py::re_space();
    // `[\s\S]` is any character; `(?i)` only on the tag, as in Python the
    // flag touches nothing else of the pattern.
    Regex::new(&format!(r"(?s)```(?i:python)?{s}*(.*?)```")).expect("valid")
});

/// The code the original reads out of a reply (`_strip_fences`).
pub fn strip_fences(reply: &str) -> String {
    fenced_code(reply).unwrap_or_else(|| py::strip(reply).to_owned())
}

/// The code of the first of [`strip_fences`]'s fence rules that finds a
/// block; `None` when none does (the whole reply is then the code).
pub fn fenced_code(reply: &str) -> Option<String> {
    let last = |re: &Regex| {
        re.captures_iter(reply)
            .last()
            .map(|c| py::strip(c.get(1).map_or("", |m| m.as_str())).to_owned())
    };
    last(&PYTHON_BLOCK)
        .or_else(|| last(&ANY_BLOCK))
        .or_else(|| {
            LOOSE_BLOCK
                .captures(reply)
                .map(|c| py::strip(c.get(1).map_or("", |m| m.as_str())).to_owned())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(stdout: &str, stderr: &str) -> PyRun {
        PyRun {
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn auto_run_only_for_silent_solve_without_a_guard() {
        let silent = run_of(" \n", "");
        assert!(needs_auto_run("def solve():\n    return 3\n", &silent));
        assert!(!needs_auto_run(
            "def solve():\n    return 3\n",
            &run_of("3\n", "")
        ));
        assert!(!needs_auto_run(
            "def solve():\n    pass\n",
            &run_of("", "warn")
        ));
        assert!(!needs_auto_run("def main():\n    pass\n", &silent));
        let guarded = "def solve():\n    return 3\nif  __name__=='__main__':\n    solve()\n";
        assert!(!needs_auto_run(guarded, &silent));
        let guarded = "def solve(): pass\nif __name__ == \"__main__\": solve()";
        assert!(!needs_auto_run(guarded, &silent));
    }

    fn outcome(status: Status, stdout: &[u8], stderr: &[u8], cut: bool) -> Outcome {
        let mut o = Outcome::sandbox_failure("x");
        o.status = status;
        o.detail = None;
        o.stdout = stdout.to_vec();
        o.stderr = stderr.to_vec();
        o.stdout_truncated = cut;
        o
    }

    #[test]
    fn outcomes_read_as_the_executor_reports_them() {
        // Exit status ignored: a CPU kill with partial stdout and no stderr
        // is a clean run.
        let r = streams(&outcome(Status::CpuTimeout, b"1\n2\n", b"", false)).unwrap();
        assert_eq!(r, run_of("1\n2\n", ""));
        let r = streams(&outcome(Status::ErrorExit, b"7\n", b"", false)).unwrap();
        assert_eq!(r, run_of("7\n", ""));
        // A wall timeout is an error through stderr.
        let r = streams(&outcome(Status::WallTimeout, b"", b"", false)).unwrap();
        assert_eq!(r.stderr, "\n[TIMEOUT]");
        // Overflow: the marker.
        let r = streams(&outcome(Status::OutputLimit, b"yyyy", b"", true)).unwrap();
        assert_eq!(r.stdout, "yyyy\n\u{2026}<truncated>");
        assert!(streams(&Outcome::sandbox_failure("boom")).is_err());
    }
}
