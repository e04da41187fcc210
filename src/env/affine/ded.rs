//! DED (deduction): write a stdin/stdout Python program from a problem
//! statement (Affine's `ded.py`), judged on the row's test cases in the
//! sandbox.
//!
//! Prompt: the row's `prompt`, right-stripped, then [`HINT`].
//! Extraction ([`strip_fences`], no think stripping): the last
//! ```` ```python ```` block; else the last fenced block with any word
//! tag (so ```` ```Python ```` lands here); else the first
//! ```` ``` ```` … ```` ``` ```` span (tag `python` in any case optional);
//! else the whole reply; always stripped. Unfenced code is accepted.
//!
//! Tests: `verification_info`, or `test_cases` when that is falsy; a string
//! is read as JSON, else as a Python literal; `test_cases` inside it, in
//! order. A `stdin_stdout` case feeds its input (newline added when
//! missing) and expects its output; a `function_call` case appends a main
//! block calling `fn_name(*input)` and printing the result, and expects
//! `output[0]`; any other type is skipped and not counted. Inputs and
//! outputs become text as the original's `to_str` makes them (lists joined
//! by newlines, other non-strings through `json.dumps`). The tests are
//! parsed by CPython itself (in the sandbox, [`PARSE_TESTS`]), so
//! `json.loads`, `ast.literal_eval`, `repr` and `json.dumps` are Python's.
//!
//! A case passes iff stderr is blank and the outputs are equal after
//! [`norm`]; scoring stops at the first failing case; the score is 1.0 iff
//! every counted case passed. Quirks kept: all cases of unknown types →
//! nothing counted → any non-empty reply scores 1.0; unparsable tests, no
//! cases, or tests that are not a dict → 0.
//!
//! Feedback ([`feedback`]): the reply's code runs again on the cases up to
//! the first failing one; `first_diff` names that case (`k of n`) and its
//! first differing output line (what it should be, what was printed), or
//! stderr's last line; `line` quotes the whole case: input, expected
//! output, what was printed and any stderr.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::feedback::{Keep, cut, first_diff, last_line, lines, quote};
use crate::reward::verdict;

/// What this environment asks a retry for, closing every feedback.
const AGAIN: &str = "Try again: give the whole program in a single ```python block.";
use super::rows::TaskRow;
use super::run::{fenced_code, strip_fences};
use super::{py, run};
use crate::data::buckets::Difficulty;
use crate::env::{Environment, Score, Task};
use crate::sandbox::{Executor, Limits, Request};

/// Appended to every problem statement (316 characters).
pub const HINT: &str = "\n\n---\n\u{26a0}\u{fe0f} **Instructions** \u{26a0}\u{fe0f}\nWrite a complete **Python 3** program that\n\u{2022} reads *all* input from **STDIN** (using `input()` / `sys.stdin`),\n\u{2022} writes *only* the required answer(s) to **STDOUT** using `print`,\n\u{2022} contains no additional prompts or debug text, and\n\u{2022} is returned as a single ```python \u{2026} ``` fenced block.\n";

/// The user message of a row's statement.
pub fn prompt(statement: &str) -> String {
    format!("{}{HINT}", statement.trim_end_matches(py::is_space))
}

/// `"\n".join(line.rstrip() for line in t.rstrip().splitlines())`.
pub fn norm(t: &str) -> String {
    py::splitlines(py::rstrip(t))
        .into_iter()
        .map(py::rstrip)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether one case's run passes: blank stderr, equal normalised stdout.
pub fn case_passes(expected: &str, stdout: &str, stderr: &str) -> bool {
    py::strip(stderr).is_empty() && norm(stdout) == norm(expected)
}

/// One test case, ready to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// What follows the code (`""`, or the `function_call` main block).
    pub suffix: String,
    pub stdin: String,
    pub expected: String,
}

/// A row's parsed tests: the cases in order (`None` for a skipped type),
/// or why the row scores 0 whatever the reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tests {
    Cases(Vec<Option<Case>>),
    Fail(String),
}

/// Parses a row's tests (stdin: `{"ver": <the field as the row holds it>}`)
/// the original's way and prints [`Tests`] as JSON. CPython does the
/// parsing, so every corner of `json.loads`, `ast.literal_eval`, `repr` and
/// `json.dumps` is the original's.
pub const PARSE_TESTS: &str = r#"import ast, json, sys

def to_str(x):
    if isinstance(x, str):
        return x
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, list):
        return "\n".join(to_str(e) for e in x)
    return json.dumps(x, ensure_ascii=False)

def parse():
    ver = json.loads(sys.stdin.read())["ver"]
    if isinstance(ver, str):
        try:
            ver = json.loads(ver)
        except json.JSONDecodeError:
            try:
                ver = ast.literal_eval(ver)
            except Exception:
                return {"fail": "tests_unparsable"}
    if not isinstance(ver, dict):
        return {"fail": "tests_not_a_dict"}
    cases = ver.get("test_cases")
    if not cases:
        return {"fail": "no_test_cases"}
    out = []
    for c in cases:
        kind = c.get("type")
        if kind == "stdin_stdout":
            stdin = to_str(c.get("input"))
            if not stdin.endswith("\n"):
                stdin += "\n"
            out.append({"suffix": "", "stdin": stdin, "expected": to_str(c.get("output"))})
        elif kind == "function_call":
            o = c.get("output")
            expected = to_str(o[0]) if isinstance(o, list) and o else to_str(o)
            suffix = "\n" + "if __name__ == '__main__':\n    result = %s(*%r)\n    print(result)" % (c["fn_name"], c.get("input"))
            out.append({"suffix": suffix, "stdin": "", "expected": expected})
        else:
            out.append(None)
    return {"cases": out}

try:
    result = parse()
except Exception as e:
    result = {"fail": "tests_crash_" + type(e).__name__}
sys.stdout.write(json.dumps(result))
"#;

/// The tests field of a row as the original picks it:
/// `verification_info`, or `test_cases` when that is falsy.
pub fn tests_field(row: &TaskRow) -> serde_json::Value {
    let truthy = |v: &serde_json::Value| match v {
        serde_json::Value::Null => false,
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::Number(n) => n.as_f64() != Some(0.0),
        serde_json::Value::String(s) => !s.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::Object(o) => !o.is_empty(),
    };
    match &row.verification_info {
        Some(v) if truthy(v) => v.clone(),
        _ => row.test_cases.clone().unwrap_or(serde_json::Value::Null),
    }
}

/// Parses a row's tests in the sandbox; `Err` for a sandbox failure.
pub fn parse_tests(exec: &Executor, row: &TaskRow) -> Result<Tests, String> {
    let stdin = serde_json::json!({ "ver": tests_field(row) }).to_string();
    let out = exec.run(&Request {
        program: PARSE_TESTS.as_bytes().to_vec(),
        stdin: stdin.into_bytes(),
        limits: Limits {
            wall_ms: 60_000,
            cpu_seconds: 30,
            memory_bytes: 4 << 30,
            stdout_bytes: 1 << 30,
            stderr_bytes: 1 << 20,
            ..Limits::default()
        },
    });
    let streams = run::streams(&out)?;
    if !streams.stderr.is_empty() {
        return Err(format!("tests_parser_{}", out.status.as_str()));
    }
    serde_json::from_str(&streams.stdout).map_err(|e| format!("tests_parser_output: {e}"))
}

/// How a reply fared on parsed tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Trial {
    /// The tests could not be read (the [`Tests::Fail`] reason): nothing ran.
    NoTests(String),
    /// Blank after stripping: nothing ran.
    Empty,
    /// Every counted case passed.
    Passed,
    /// The first failing case: `index` of `counted` (from 0), with its run.
    Failed {
        index: usize,
        counted: usize,
        case: Case,
        run: run::PyRun,
    },
}

/// Runs a reply on parsed tests: stripped (empty runs nothing), its code
/// run by `run_case` (code, stdin) on each counted case until one fails.
/// `Err` only when `run_case` fails (the sandbox, not the program).
pub fn try_cases(
    tests: &Tests,
    reply: &str,
    mut run_case: impl FnMut(&str, &str) -> Result<run::PyRun, String>,
) -> Result<Trial, String> {
    let reply = py::strip(reply);
    let cases = match tests {
        Tests::Cases(cases) => cases,
        Tests::Fail(why) => return Ok(Trial::NoTests(why.clone())),
    };
    if reply.is_empty() {
        return Ok(Trial::Empty);
    }
    let code = strip_fences(reply);
    let counted = cases.iter().flatten().count();
    for (index, case) in cases.iter().flatten().enumerate() {
        let r = run_case(&format!("{code}{}", case.suffix), &case.stdin)?;
        if !case_passes(&case.expected, &r.stdout, &r.stderr) {
            return Ok(Trial::Failed {
                index,
                counted,
                case: case.clone(),
                run: r,
            });
        }
    }
    Ok(Trial::Passed)
}

/// Scores a reply on parsed tests: 1.0 iff [`try_cases`] passes every
/// counted case. `Err` only when `run_case` fails (the sandbox, not the
/// program).
pub fn score_cases(
    tests: &Tests,
    reply: &str,
    run_case: impl FnMut(&str, &str) -> Result<run::PyRun, String>,
) -> Result<f64, String> {
    Ok(match try_cases(tests, reply, run_case)? {
        Trial::Passed => 1.0,
        Trial::NoTests(_) | Trial::Empty | Trial::Failed { .. } => 0.0,
    })
}

/// The lines [`norm`] leaves (none for an empty text).
fn norm_lines(t: &str) -> Vec<String> {
    let n = norm(t);
    if n.is_empty() {
        Vec::new()
    } else {
        n.split('\n').map(str::to_owned).collect()
    }
}

/// What DED says to a wrong reply, by `kind`, from its [`try_cases`]
/// trial (the reply's code run again on the cases, as scoring runs it):
/// - `verdict`: the verdict alone;
/// - `first_diff`: which counted case failed first (`k of n`), and either
///   the first line of its output that differs from the expected output
///   (compared as [`case_passes`] compares, after [`norm`]) with what that
///   line should be and what the program printed there, or that it wrote
///   to stderr, with stderr's last line;
/// - `line`: the whole failing case: its input (for a `function_call`
///   case, the call appended to the program), the expected output, and
///   what the program printed and wrote to stderr, each quoted and cut as
///   [`super::feedback::cut`] cuts.
///
/// Either says when no code block was found (the whole reply ran), an
/// empty reply, or tests that could not be read; a trial that passed gets
/// the verdict.
pub fn feedback(reply: &str, trial: &Trial, kind: &str) -> String {
    if kind == "verdict" {
        return verdict(AGAIN);
    }
    let full = kind == "line";
    let (index, counted, case, run) = match trial {
        Trial::NoTests(why) => {
            return format!(
                "Your answer is incorrect: this task's tests cannot be read ({why}), so no program passes them. {AGAIN}"
            );
        }
        Trial::Empty => return format!("Your answer is incorrect: your reply is empty. {AGAIN}"),
        Trial::Passed => return verdict(AGAIN),
        Trial::Failed {
            index,
            counted,
            case,
            run,
        } => (index, counted, case, run),
    };
    let unfenced = if fenced_code(py::strip(reply)).is_none() {
        "No code block was found in your reply, so all of it ran as the program. "
    } else {
        ""
    };
    let mut text = format!(
        "Your answer is incorrect: your program fails test case {} of {counted}",
        index + 1
    );
    let wrote = !py::strip(&run.stderr).is_empty();
    let want = norm_lines(&case.expected);
    let got = norm_lines(&run.stdout);
    if wrote {
        text.push_str(": it wrote to stderr");
        if !full {
            text.push_str(&format!(
                "; its last line:\n{}\n",
                cut(last_line(&run.stderr), Keep::Head)
            ));
        } else {
            text.push_str(".\n");
        }
    } else {
        let Some(i) = first_diff(&want, &got) else {
            return verdict(AGAIN);
        };
        if got.is_empty() {
            text.push_str(&format!(
                ": it printed nothing (the expected output has {}).",
                lines(want.len())
            ));
        } else {
            text.push_str(&format!(
                ": line {} of its output is the first that differs (it printed {}, the expected output has {}).",
                i + 1,
                lines(got.len()),
                lines(want.len())
            ));
        }
        if full {
            text.push('\n');
        } else {
            match (want.get(i), got.get(i)) {
                (Some(e), Some(g)) => text.push_str(&format!(
                    " Line {} should be:\n{}\nYour program printed:\n{}\n",
                    i + 1,
                    cut(e, Keep::Head),
                    cut(g, Keep::Head)
                )),
                (Some(e), None) => text.push_str(&format!(
                    " Line {} should be:\n{}\n",
                    i + 1,
                    cut(e, Keep::Head)
                )),
                (None, Some(g)) => text.push_str(&format!(
                    " The expected output ends after line {i}; your program printed:\n{}\n",
                    cut(g, Keep::Head)
                )),
                (None, None) => unreachable!("first_diff points inside one of the two"),
            }
        }
    }
    if full {
        if case.suffix.is_empty() {
            text.push_str(&format!("Input:\n{}", quote(&case.stdin, Keep::Head)));
        } else {
            text.push_str(&format!(
                "The test appends to your program:\n{}",
                quote(py::strip(&case.suffix), Keep::Head)
            ));
        }
        text.push_str(&format!(
            "Expected output:\n{}",
            quote(&case.expected, Keep::Head)
        ));
        if py::strip(&run.stdout).is_empty() {
            text.push_str("Your program printed nothing.\n");
        } else {
            text.push_str(&format!(
                "Your program printed:\n{}",
                quote(&run.stdout, Keep::Head)
            ));
        }
        if wrote {
            text.push_str(&format!(
                "Your program wrote to stderr:\n{}",
                quote(&run.stderr, Keep::Tail)
            ));
        }
    }
    format!("{text}{unfenced}{AGAIN}")
}

/// The DED environment on a set of rows: task `id` is row `id` (no
/// wrapping: ids past the end make no task, as in the original).
pub struct DedEnv {
    rows: Arc<Vec<TaskRow>>,
    exec: Arc<Executor>,
}

impl DedEnv {
    pub fn new(rows: Arc<Vec<TaskRow>>, exec: Arc<Executor>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !rows.is_empty(),
            "the ded environment has no rows\nhint: pass rows with `prompt` and `test_cases` or `verification_info`, e.g. `--ded_dataset ded-builtin`"
        );
        Ok(Self { rows, exec })
    }
}

impl Environment for DedEnv {
    fn name(&self) -> &'static str {
        "ded"
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let row = self
            .rows
            .get(task_id as usize)
            .ok_or_else(|| super::OUT_OF_RANGE.to_owned())?;
        let statement = row.prompt.as_deref().ok_or("no_prompt")?;
        let tests = parse_tests(&self.exec, row)?;
        Ok(Task {
            task_id,
            prompt: prompt(statement),
            expected: serde_json::to_string(&tests).expect("tests serialise"),
            difficulty: Difficulty::default(),
        })
    }

    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        use rayon::prelude::*;
        self.exec
            .install(|| ids.par_iter().map(|&id| self.task(id)).collect())
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        let tests: Tests = match serde_json::from_str(&task.expected) {
            Ok(t) => t,
            Err(e) => return Score::Masked(format!("unreadable_task: {e}")),
        };
        match score_cases(&tests, completion, |code, stdin| {
            run::run(&self.exec, code, stdin)
        }) {
            Ok(s) => Score::Reward(s),
            Err(why) => Score::Masked(why),
        }
    }

    /// The reply's code run again on the cases as [`Self::score`] runs it
    /// ([`feedback`]).
    fn feedback(&self, task: &Task, completion: &str, kind: &str) -> Result<String, String> {
        if kind == "verdict" {
            return Ok(verdict(AGAIN));
        }
        let tests: Tests =
            serde_json::from_str(&task.expected).map_err(|e| format!("unreadable_task: {e}"))?;
        let trial = try_cases(&tests, completion, |code, stdin| {
            run::run(&self.exec, code, stdin)
        })?;
        Ok(feedback(completion, &trial, kind))
    }

    /// The row's reference program (`program`), fenced as the hint asks.
    fn demonstration(&self, task: &Task) -> Option<String> {
        let program = self.rows.get(task.task_id as usize)?.program.as_deref()?;
        Some(format!("```python\n{}\n```", program.trim_end()))
    }

    fn key(&self, task: &Task) -> serde_json::Value {
        serde_json::from_str(&task.expected).unwrap_or(serde_json::Value::Null)
    }

    fn task_count(&self) -> Option<u64> {
        Some(self.rows.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    #[test]
    fn the_hint_is_the_original_byte_for_byte() {
        assert_eq!(HINT.chars().count(), 316);
        assert_eq!(
            crate::hex(&Sha256::digest(HINT.as_bytes())),
            "4ae61102e5f8cd6bbae7d5b81a6edabb373db955f2e3cc05be7cc6d315163b07"
        );
        assert_eq!(prompt("Sum two ints. \n\n"), format!("Sum two ints.{HINT}"));
    }

    #[test]
    fn fences_are_stripped_in_the_originals_order() {
        // The last python block wins over earlier ones and over other tags.
        let r = "```python\nA\n```\n```text\nT\n```\n```python\nB\n```";
        assert_eq!(strip_fences(r), "B");
        // `Python` misses step 1 and is caught by step 2 (last any-tag block).
        let r = "```Python\nP\n```\n```\nQ\n```";
        assert_eq!(strip_fences(r), "Q");
        assert_eq!(strip_fences("```Python\nP\n```"), "P");
        // Step 3: no newline after the tag; the first span; tag in any case.
        assert_eq!(strip_fences("```PYTHON print(1)``` ```x```"), "print(1)");
        // Step 4: unfenced code is the whole reply, stripped.
        assert_eq!(strip_fences("\n  print(2)\n "), "print(2)");
        // Trailing spaces after the tag are allowed before the newline.
        assert_eq!(strip_fences("```python  \t\nprint(3)\n```"), "print(3)");
        // An unclosed python fence falls to step 4 whole.
        assert_eq!(strip_fences("```python\nprint(4)"), "```python\nprint(4)");
        // Think blocks are not stripped: a block inside one counts.
        assert_eq!(strip_fences("<think>```python\nX\n```</think>"), "X");
        // A combining mark is no \w for Python: the tag cannot hold one.
        assert_eq!(strip_fences("```a\u{345}\nZ\n```"), "a\u{345}\nZ");
    }

    #[test]
    fn norm_and_case_passes() {
        assert_eq!(norm("1 \n2\t\n\n"), "1\n2");
        assert!(case_passes("1\n2\n", "1  \n2", ""));
        assert!(case_passes("1\r\n2", "1\n2\n\n", " \n"));
        // Leading whitespace and inner blank lines matter.
        assert!(!case_passes("1\n2", " 1\n2", ""));
        assert!(!case_passes("1\n2", "1\n\n2", ""));
        // Any non-blank stderr fails, even with the right stdout.
        assert!(!case_passes("1", "1", "DeprecationWarning: x"));
        // splitlines breaks on \x1e too.
        assert!(case_passes("1\n2", "1\u{1e}2", ""));
    }

    fn case(expected: &str) -> Option<Case> {
        Some(Case {
            suffix: String::new(),
            stdin: "\n".into(),
            expected: expected.into(),
        })
    }

    fn stdin_case(stdin: &str, expected: &str) -> Option<Case> {
        Some(Case {
            suffix: String::new(),
            stdin: stdin.into(),
            expected: expected.into(),
        })
    }

    /// The trial of `reply` on `tests`, every run faked: the streams of
    /// `runs` in turn.
    fn trial(tests: &Tests, reply: &str, runs: &[(&str, &str)]) -> Trial {
        let mut runs = runs.iter();
        try_cases(tests, reply, |_, _| {
            let (stdout, stderr) = runs.next().expect("no more runs than cases");
            Ok(run::PyRun {
                stdout: (*stdout).into(),
                stderr: (*stderr).into(),
            })
        })
        .unwrap()
    }

    const FENCED: &str =
        "```python\na, b = map(int, input().split())\nprint(a + b)\nprint(a - b)\n```";

    #[test]
    fn feedback_names_the_first_failing_case() {
        let tests = Tests::Cases(vec![
            stdin_case("1 1\n", "2\n0"),
            None,
            stdin_case("3 1\n", "4\n2"),
            stdin_case("5 5\n", "10\n0"),
        ]);
        let t = trial(&tests, FENCED, &[("2\n0\n", ""), ("4\n3 \n", "")]);
        assert!(
            matches!(
                t,
                Trial::Failed {
                    index: 1,
                    counted: 3,
                    ..
                }
            ),
            "{t:?}"
        );
        assert_eq!(
            feedback(FENCED, &t, "first_diff"),
            format!(
                "Your answer is incorrect: your program fails test case 2 of 3: line 2 of its output is the first that differs (it printed 2 lines, the expected output has 2 lines). Line 2 should be:\n2\nYour program printed:\n3\n{AGAIN}"
            )
        );
        assert_eq!(
            feedback(FENCED, &t, "line"),
            format!(
                "Your answer is incorrect: your program fails test case 2 of 3: line 2 of its output is the first that differs (it printed 2 lines, the expected output has 2 lines).\nInput:\n```\n3 1\n```\nExpected output:\n```\n4\n2\n```\nYour program printed:\n```\n4\n3 \n```\n{AGAIN}"
            )
        );
        // Output that ends early, output that runs on, no output.
        let t = trial(&tests, FENCED, &[("2\n", "")]);
        assert!(feedback(FENCED, &t, "first_diff").contains(
            "line 2 of its output is the first that differs (it printed 1 line, the expected output has 2 lines). Line 2 should be:\n0\nTry"
        ));
        let t = trial(&tests, FENCED, &[("2\n0\n7\n", "")]);
        assert!(feedback(FENCED, &t, "first_diff").contains(
            "(it printed 3 lines, the expected output has 2 lines). The expected output ends after line 2; your program printed:\n7\nTry"
        ));
        let t = trial(&tests, FENCED, &[(" \n", "")]);
        assert_eq!(
            feedback(FENCED, &t, "line"),
            format!(
                "Your answer is incorrect: your program fails test case 1 of 3: it printed nothing (the expected output has 2 lines).\nInput:\n```\n1 1\n```\nExpected output:\n```\n2\n0\n```\nYour program printed nothing.\n{AGAIN}"
            )
        );
    }

    #[test]
    fn feedback_on_stderr_a_missing_block_and_nothing_run() {
        let tests = Tests::Cases(vec![stdin_case("1 1\n", "2\n0")]);
        let trace = "Traceback (most recent call last):\n  File \"main.py\", line 1, in <module>\nZeroDivisionError: division by zero\n";
        let t = trial(&tests, FENCED, &[("", trace)]);
        assert_eq!(
            feedback(FENCED, &t, "first_diff"),
            format!(
                "Your answer is incorrect: your program fails test case 1 of 1: it wrote to stderr; its last line:\nZeroDivisionError: division by zero\n{AGAIN}"
            )
        );
        assert_eq!(
            feedback(FENCED, &t, "line"),
            format!(
                "Your answer is incorrect: your program fails test case 1 of 1: it wrote to stderr.\nInput:\n```\n1 1\n```\nExpected output:\n```\n2\n0\n```\nYour program printed nothing.\nYour program wrote to stderr:\n```\n{trace}```\n{AGAIN}"
            )
        );
        // Unfenced: the whole reply ran, and the feedback says so.
        let prose = "I would add the two numbers.";
        let t = trial(
            &tests,
            prose,
            &[(
                "",
                "  File \"main.py\", line 1\nSyntaxError: invalid syntax\n",
            )],
        );
        assert_eq!(
            feedback(prose, &t, "first_diff"),
            format!(
                "Your answer is incorrect: your program fails test case 1 of 1: it wrote to stderr; its last line:\nSyntaxError: invalid syntax\nNo code block was found in your reply, so all of it ran as the program. {AGAIN}"
            )
        );
        for kind in ["first_diff", "line"] {
            let t = trial(&tests, " \n", &[]);
            assert_eq!(
                feedback(" \n", &t, kind),
                format!("Your answer is incorrect: your reply is empty. {AGAIN}")
            );
            let t = trial(&Tests::Fail("no_test_cases".into()), FENCED, &[]);
            assert_eq!(
                feedback(FENCED, &t, kind),
                format!(
                    "Your answer is incorrect: this task's tests cannot be read (no_test_cases), so no program passes them. {AGAIN}"
                )
            );
        }
        // A function_call case shows the call instead of an input.
        let call = Tests::Cases(vec![Some(Case {
            suffix: "\nif __name__ == '__main__':\n    result = f(*[2])\n    print(result)".into(),
            stdin: String::new(),
            expected: "4".into(),
        })]);
        let t = trial(&call, "def f(x): return x", &[("2\n", "")]);
        assert!(feedback("def f(x): return x", &t, "line").contains(
            "\nThe test appends to your program:\n```\nif __name__ == '__main__':\n    result = f(*[2])\n    print(result)\n```\nExpected output:\n```\n4\n```\n"
        ));
    }

    #[test]
    fn feedback_cuts_quotes_and_verdict_names_what_to_give() {
        let big: String = (1..=40).map(|i| format!("{i} {i}\n")).collect();
        let tests = Tests::Cases(vec![stdin_case(&big, "ok")]);
        let t = trial(&tests, FENCED, &[("no\n", "")]);
        let said = feedback(FENCED, &t, "line");
        let shown: String = (1..=20).map(|i| format!("{i} {i}\n")).collect();
        assert!(
            said.contains(&format!(
                "Input:\n```\n{shown}[cut: the first 20 of 40 lines]\n```\n"
            )),
            "{said}"
        );
        let said = "Your answer is incorrect. Try again: give the whole program in a single ```python block.";
        assert_eq!(feedback(FENCED, &t, "verdict"), said);
        assert_eq!(feedback(" ", &Trial::Empty, "verdict"), said);
        // Every case passed: nothing to point at.
        assert_eq!(feedback(FENCED, &Trial::Passed, "line"), said);
    }

    #[test]
    fn scoring_stops_at_the_first_failure_and_skips_unknown_types() {
        let tests = Tests::Cases(vec![case("a"), None, case("b"), case("c")]);
        let mut seen = Vec::new();
        let s = score_cases(&tests, "x", |_, _| {
            seen.push(());
            Ok(run::PyRun {
                stdout: if seen.len() == 2 { "wrong" } else { "a" }.into(),
                stderr: String::new(),
            })
        })
        .unwrap();
        assert_eq!(
            (s, seen.len()),
            (0.0, 2),
            "stops at the second counted case"
        );
        // Only skipped types: nothing counted, any reply passes.
        let tests = Tests::Cases(vec![None, None]);
        assert_eq!(
            score_cases(&tests, "nonsense", |_, _| unreachable!()),
            Ok(1.0)
        );
        let tests = Tests::Fail("no_test_cases".into());
        assert_eq!(score_cases(&tests, "x", |_, _| unreachable!()), Ok(0.0));
        // A sandbox failure is not a score.
        let tests = Tests::Cases(vec![case("a")]);
        assert!(score_cases(&tests, "x", |_, _| Err("sandbox_failure".into())).is_err());
    }
}
