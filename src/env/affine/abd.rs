//! ABD (abduction): given a program and the stdout it printed, find a
//! stdin that makes it print that (Affine's `abd.py`), judged by running
//! the program on the reply's input in the sandbox.
//!
//! Task `id` is row `id` (no wrapping). The expected output is the row's
//! program run on the row's `inputs` (a newline added when missing), unless
//! that run writes any stderr or a blank stdout: then the row's `output`.
//!
//! Extraction ([`extract`]): drop `<think>…</think>` and
//! `<thinking>…</thinking>` blocks (case-sensitive; unclosed tags stay);
//! take the last `<INPUT>…</INPUT>` (tags in any case, as Python's
//! IGNORECASE folds them: `<ınput>` counts); strip it, right-strip every
//! line, drop trailing blank lines. Gates: no input and no tags anywhere in
//! the original reply (think blocks included) → 0; an empty block is
//! empty stdin. Line heuristic: with `for _ in range(int(input()))` in the
//! program and a first line of digits, more lines than that number;
//! otherwise at least as many lines as the program has `input()` calls.
//! Scoring ([`judge`]): any stderr → 0; else 1.0 iff the outputs are
//! equal, or equal stripped with `\r\n` as `\n`, or equal as lists of
//! right-stripped lines.
//!
//! Feedback ([`feedback`]): the program runs again on the reply's input;
//! `first_diff` names the first line of its output that differs from the
//! expected output and what it printed there, `line` quotes its whole
//! output; either says instead that it wrote to stderr, or that no input
//! was run (no `<INPUT>` block, too few lines, an empty reply).

use std::sync::{Arc, LazyLock};

use regex::Regex;

use super::feedback::{Keep, cut, first_diff, last_line, lines, quote};
use crate::reward::verdict;

/// What this environment asks a retry for, closing every feedback.
const AGAIN: &str = "Try again: give the program's input between <INPUT> and </INPUT> tags.";
use super::rows::TaskRow;
use super::{py, run};
use crate::data::buckets::Difficulty;
use crate::env::{Environment, Score, Task};
use crate::sandbox::Executor;

/// The prompt template (1021 characters; the requirement line `2.` ends in
/// two spaces).
pub const TEMPLATE: &str = concat!(
    "You are a programming expert. Given a Python program and its expected output, you need to determine the exact input that would produce this output.\n",
    "\n",
    "Program:\n",
    "```python\n",
    "{program}\n",
    "```\n",
    "\n",
    "Expected Output:\n",
    "```\n",
    "{output}\n",
    "```\n",
    "\n",
    "Task: Analyze the program to understand what input format it expects from stdin, then provide the input data that would produce the expected output.\n",
    "\n",
    "You can provide any explanations, analysis, or reasoning you want. However, you MUST include the input data within <INPUT> </INPUT> tags.\n",
    "\n",
    "Format the input data like this:\n",
    "<INPUT>\n",
    "[input data here - each line on a separate line as the program expects]\n",
    "</INPUT>\n",
    "\n",
    "I will extract only the content between these tags.\n",
    "\n",
    "Requirements for the input data within the tags:\n",
    "1. Each line of input should be on a separate line\n",
    "2. Use the exact format the program expects  \n",
    "3. Provide the raw input values that should be fed to stdin\n",
    "4. Do not include any prefixes or extra formatting within the INPUT tags\n",
    "\n",
    "Please analyze the program and provide the required input:",
);

/// `TEMPLATE.format(program=..., output=...)`: each placeholder replaced
/// once, the inserted text never scanned again.
pub fn prompt(program: &str, output: &str) -> String {
    let (head, rest) = TEMPLATE.split_once("{program}").expect("placeholder");
    let (mid, tail) = rest.split_once("{output}").expect("placeholder");
    format!("{head}{program}{mid}{output}{tail}")
}

static THINK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?s)<think>.*?</think>").unwrap());
static THINKING: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<thinking>.*?</thinking>").unwrap());
/// `<INPUT>(.*?)</INPUT>` with IGNORECASE: CPython folds `i` with `I`,
/// `ı` (U+0131) and `İ` (U+0130); the other letters with their ASCII pair
/// only. Rust's `(?i)` folds `i` with `I` alone, so the classes are spelled out.
static INPUT: LazyLock<Regex> = LazyLock::new(|| {
    let tag = "[iIıİ][nN][pP][uU][tT]";
    Regex::new(&format!(r"(?s)<{tag}>(.*?)</{tag}>")).unwrap()
});

/// The literal the line heuristic looks for.
pub const LOOP_HEAD: &str = "for _ in range(int(input()))";

/// Why a reply is not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// No `<INPUT>` block anywhere.
    NoInput,
    /// Fewer lines than the program reads.
    TooFewLines,
}

/// The stdin a reply gives the program (newline-terminated when not
/// empty), or why it is not run.
pub fn extract(reply: &str, program: &str) -> Result<String, Reject> {
    let cleaned = THINK.replace_all(reply, "");
    let cleaned = THINKING.replace_all(&cleaned, "");
    let raw = INPUT
        .captures_iter(&cleaned)
        .last()
        .map(|c| c.get(1).map_or("", |m| m.as_str()).to_owned());
    let mut lines: Vec<&str> = match &raw {
        Some(r) => py::splitlines(py::strip(r))
            .into_iter()
            .map(py::rstrip)
            .collect(),
        None => Vec::new(),
    };
    while lines.last() == Some(&"") {
        lines.pop();
    }
    let input = lines.join("\n");
    if input.is_empty() && !INPUT.is_match(reply) {
        return Err(Reject::NoInput);
    }
    let calls = program.matches("input()").count();
    let enough = match lines.first() {
        Some(first) if program.contains(LOOP_HEAD) && py::isdigit(first) => {
            // `int()` raises on digits that are not decimals (`²`): the
            // original crashes there, which scores 0.
            py::int_of_digits(first).is_some_and(|n| lines.len() as u128 > n)
        }
        _ => lines.len() >= calls,
    };
    if !enough {
        return Err(Reject::TooFewLines);
    }
    Ok(if input.is_empty() {
        input
    } else {
        format!("{input}\n")
    })
}

/// 1.0 iff a run with this stdout and stderr reproduces `expected`.
pub fn judge(expected: &str, stdout: &str, stderr: &str) -> f64 {
    if !stderr.is_empty() {
        return 0.0;
    }
    let loose = |s: &str| py::strip(s).replace("\r\n", "\n");
    let lines = |s: &str| -> Vec<String> {
        py::splitlines(s)
            .into_iter()
            .map(|l| py::rstrip(l).to_owned())
            .collect()
    };
    let same =
        expected == stdout || loose(expected) == loose(stdout) || lines(expected) == lines(stdout);
    if same { 1.0 } else { 0.0 }
}

/// What became of a reply before judging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Blank after stripping.
    Empty,
    /// Not run, and why.
    Rejected(Reject),
    /// Run on this stdin.
    Ran { stdin: String, run: run::PyRun },
}

/// A reply stripped (empty is [`Attempt::Empty`]), extracted, gated and
/// run on `program` by `run` (given the stdin). `Err` only when `run`
/// fails (the sandbox, not the program).
pub fn attempt(
    reply: &str,
    program: &str,
    run: impl FnOnce(&str) -> Result<run::PyRun, String>,
) -> Result<Attempt, String> {
    let reply = py::strip(reply);
    if reply.is_empty() {
        return Ok(Attempt::Empty);
    }
    let stdin = match extract(reply, program) {
        Ok(stdin) => stdin,
        Err(why) => return Ok(Attempt::Rejected(why)),
    };
    let run = run(&stdin)?;
    Ok(Attempt::Ran { stdin, run })
}

/// A whole reply's score: [`attempt`] judged (0 when not run). `Err` only
/// when `run` fails (the sandbox, not the program).
pub fn score_reply(
    reply: &str,
    program: &str,
    expected: &str,
    run: impl FnOnce(&str) -> Result<run::PyRun, String>,
) -> Result<f64, String> {
    Ok(match attempt(reply, program, run)? {
        Attempt::Ran { run: r, .. } => judge(expected, &r.stdout, &r.stderr),
        Attempt::Empty | Attempt::Rejected(_) => 0.0,
    })
}

/// The lines [`judge`] compares last: `splitlines`, each right-stripped.
fn judged_lines(s: &str) -> Vec<&str> {
    py::splitlines(s).into_iter().map(py::rstrip).collect()
}

/// What ABD says to a wrong reply, by `kind`, from the reply's
/// [`attempt`] (the program run again on the reply's input, as scoring
/// runs it):
/// - `verdict`: the verdict alone;
/// - `first_diff`: what the program did on the reply's input: which line
///   of its output first differs from the expected output (compared as
///   [`judge`]'s last rule compares them: right-stripped lines) and what it
///   printed there, or that it wrote to stderr (with the last line of
///   stderr), or that no input could be read from the reply;
/// - `line`: the same, with the program's whole output (or stderr) quoted
///   instead of one line, cut as [`super::feedback::cut`] cuts.
///
/// Output that matches line by line leaves nothing to point at: the
/// verdict.
pub fn feedback(attempt: &Attempt, expected: &str, kind: &str) -> String {
    if kind == "verdict" {
        return verdict(AGAIN);
    }
    let full = kind == "line";
    let (stdin, run) = match attempt {
        Attempt::Empty => return format!("Your answer is incorrect: your reply is empty. {AGAIN}"),
        Attempt::Rejected(Reject::NoInput) => {
            return format!(
                "Your answer is incorrect: no <INPUT> block was found in your reply, so the program was not run. {AGAIN}"
            );
        }
        Attempt::Rejected(Reject::TooFewLines) => {
            return format!(
                "Your answer is incorrect: your input has fewer lines than the program reads, so the program was not run. {AGAIN}"
            );
        }
        Attempt::Ran { stdin, run } => (stdin, run),
    };
    let on = if stdin.is_empty() {
        "on an empty input"
    } else {
        "on your input"
    };
    if !run.stderr.is_empty() {
        let said = if full {
            format!(":\n{}", quote(&run.stderr, Keep::Tail))
        } else {
            format!(
                "; its last line:\n{}\n",
                cut(last_line(&run.stderr), Keep::Head)
            )
        };
        return format!(
            "Your answer is incorrect: {on} the program wrote to stderr, which fails the task{said}{AGAIN}"
        );
    }
    let want = judged_lines(expected);
    let got = judged_lines(&run.stdout);
    let Some(i) = first_diff(&want, &got) else {
        return verdict(AGAIN);
    };
    if got.is_empty() {
        return format!(
            "Your answer is incorrect: {on} the program printed nothing (the expected output has {}). {AGAIN}",
            lines(want.len())
        );
    }
    let mut text = format!(
        "Your answer is incorrect: {on} the program printed {} (the expected output has {}); line {} is the first that differs",
        lines(got.len()),
        lines(want.len()),
        i + 1
    );
    if full {
        text.push_str(&format!(
            ". The program printed:\n{}",
            quote(&run.stdout, Keep::Head)
        ));
    } else if let Some(line) = got.get(i) {
        text.push_str(&format!(", where it printed:\n{}\n", cut(line, Keep::Head)));
    } else {
        text.push_str(&format!(": the program's output ends after line {i}. "));
    }
    format!("{text}{AGAIN}")
}

/// The expected output of a row: its program's stdout on its input, or
/// the row's `output` when that run writes stderr or a blank stdout.
pub fn expected_output(run: &run::PyRun, row_output: Option<&str>) -> String {
    if !run.stderr.is_empty() || py::strip(&run.stdout).is_empty() {
        row_output.unwrap_or_default().to_owned()
    } else {
        run.stdout.clone()
    }
}

/// The ABD environment on a set of rows (`program`, `inputs`, `output`).
pub struct AbdEnv {
    rows: Arc<Vec<TaskRow>>,
    exec: Arc<Executor>,
}

impl AbdEnv {
    pub fn new(rows: Arc<Vec<TaskRow>>, exec: Arc<Executor>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !rows.is_empty(),
            "the abd environment has no rows\nhint: pass rows with `program` and `inputs`, e.g. `--abd_dataset builtin`"
        );
        Ok(Self { rows, exec })
    }

    fn row(&self, task_id: u64) -> Result<&TaskRow, String> {
        self.rows
            .get(task_id as usize)
            .ok_or_else(|| super::OUT_OF_RANGE.to_owned())
    }
}

impl Environment for AbdEnv {
    fn name(&self) -> &'static str {
        "abd"
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let row = self.row(task_id)?;
        let program = row.program.as_deref().ok_or("no_program")?;
        let mut stdin = row.inputs.clone().unwrap_or_default();
        if !stdin.is_empty() && !stdin.ends_with('\n') {
            stdin.push('\n');
        }
        let ran = run::run(&self.exec, program, &stdin)?;
        let expected = expected_output(&ran, row.output.as_deref());
        Ok(Task {
            task_id,
            prompt: prompt(program, &expected),
            expected,
            difficulty: Difficulty::default(),
        })
    }

    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        use rayon::prelude::*;
        self.exec
            .install(|| ids.par_iter().map(|&id| self.task(id)).collect())
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        let Ok(row) = self.row(task.task_id) else {
            return Score::Masked(super::OUT_OF_RANGE.to_owned());
        };
        let program = row.program.as_deref().unwrap_or_default();
        match score_reply(completion, program, &task.expected, |stdin| {
            run::run(&self.exec, program, stdin)
        }) {
            Ok(s) => Score::Reward(s),
            Err(why) => Score::Masked(why),
        }
    }

    /// The reply run again as [`Self::score`] runs it ([`feedback`]).
    fn feedback(&self, task: &Task, completion: &str, kind: &str) -> Result<String, String> {
        if kind == "verdict" {
            return Ok(verdict(AGAIN));
        }
        let row = self.row(task.task_id)?;
        let program = row.program.as_deref().unwrap_or_default();
        let tried = attempt(completion, program, |stdin| {
            run::run(&self.exec, program, stdin)
        })?;
        Ok(feedback(&tried, &task.expected, kind))
    }

    /// The row's own input in the answer format.
    fn demonstration(&self, task: &Task) -> Option<String> {
        let inputs = self.row(task.task_id).ok()?.inputs.as_deref()?;
        Some(format!(
            "<INPUT>\n{}\n</INPUT>",
            inputs.trim_end_matches('\n')
        ))
    }

    fn key(&self, task: &Task) -> serde_json::Value {
        let row = self.row(task.task_id).ok();
        serde_json::json!({
            "expected_output": task.expected,
            "program": row.and_then(|r| r.program.as_deref()),
            "inputs": row.and_then(|r| r.inputs.as_deref()),
        })
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
    fn the_template_is_the_original_byte_for_byte() {
        assert_eq!(TEMPLATE.chars().count(), 1021);
        assert_eq!(
            crate::hex(&Sha256::digest(TEMPLATE.as_bytes())),
            "79953881d5e81358c7ac876dee0bea2fbabbc1bcd87015b7bf0945384396d056"
        );
        // Placeholders in the inserted text stay as they are.
        let p = prompt("print('{output}')", "3\n");
        assert!(p.contains("```python\nprint('{output}')\n```"));
        assert!(
            p.contains("Expected Output:\n```\n3\n\n```"),
            "blank line before the fence"
        );
    }

    const READS_TWO: &str = "a = input()\nb = input()\nprint(a + b)";

    #[test]
    fn the_last_block_wins_and_think_blocks_are_dropped() {
        let r = "<INPUT>2\n3</INPUT> no, rather <input>1\n1</input>";
        assert_eq!(extract(r, READS_TWO), Ok("1\n1\n".into()));
        let r = "<INPUT>1\n1</INPUT><think><INPUT>9\n9</INPUT></think>";
        assert_eq!(extract(r, READS_TWO), Ok("1\n1\n".into()));
        let r = "<thinking><INPUT>9\n9</INPUT></thinking><INPUT>5\n6</INPUT>";
        assert_eq!(extract(r, READS_TWO), Ok("5\n6\n".into()));
        // An unclosed think tag stays, so its block still counts.
        let r = "<think><INPUT>7\n8</INPUT>";
        assert_eq!(extract(r, READS_TWO), Ok("7\n8\n".into()));
        // Tag case folds as CPython's does: ı (dotless i) is an i.
        assert_eq!(
            extract("<ınput>1\n2</INPUT>", READS_TWO),
            Ok("1\n2\n".into())
        );
    }

    #[test]
    fn blocks_are_stripped_and_right_stripped_by_line() {
        // strip() drops the first line's leading blanks; trailing blank
        // lines go; inner blank lines stay.
        let r = "<INPUT>\n   a  \n\nb \t\n\n  \n</INPUT>";
        assert_eq!(extract(r, "print(1)"), Ok("a\n\nb\n".into()));
        // splitlines breaks on \r and \x1e too.
        assert_eq!(
            extract("<INPUT>a\rb\u{1e}c</INPUT>", ""),
            Ok("a\nb\nc\n".into())
        );
    }

    #[test]
    fn gates() {
        // No tags at all.
        assert_eq!(extract("1\n2", READS_TWO), Err(Reject::NoInput));
        // An empty block is empty stdin, when the program reads nothing.
        assert_eq!(extract("<INPUT></INPUT>", "print(1)"), Ok(String::new()));
        // Tags only inside think: tags_present holds, the input is empty,
        // and the line count decides.
        let r = "<think><INPUT>4</INPUT></think>";
        assert_eq!(extract(r, "print(1)"), Ok(String::new()));
        assert_eq!(extract(r, READS_TWO), Err(Reject::TooFewLines));
        // At least one line per input() call.
        assert_eq!(
            extract("<INPUT>1</INPUT>", READS_TWO),
            Err(Reject::TooFewLines)
        );
        // The loop head: more lines than the first line's number.
        let p = "for _ in range(int(input())):\n    print(input())";
        assert_eq!(extract("<INPUT>2\na\nb</INPUT>", p), Ok("2\na\nb\n".into()));
        assert_eq!(
            extract("<INPUT>3\na\nb</INPUT>", p),
            Err(Reject::TooFewLines)
        );
        // A first line that is not digits falls back to the call count (2).
        assert_eq!(extract("<INPUT>x\ny</INPUT>", p), Ok("x\ny\n".into()));
        // Digits that int() rejects make the original crash: 0.
        assert_eq!(
            extract("<INPUT>²\na\nb\nc</INPUT>", p),
            Err(Reject::TooFewLines)
        );
        // Unicode decimals are read as int() reads them.
        assert_eq!(extract("<INPUT>٢\na\nb</INPUT>", p), Ok("٢\na\nb\n".into()));
    }

    #[test]
    fn judging() {
        assert_eq!(judge("3\n", "3\n", ""), 1.0);
        // Any stderr, even whitespace, fails a matching stdout.
        assert_eq!(judge("3\n", "3\n", " "), 0.0);
        // Stripped, \r\n as \n.
        assert_eq!(judge("3\n4", "\n3\r\n4\n\n", ""), 1.0);
        // Right-stripped lines.
        assert_eq!(judge("a \nb", "a\nb  ", ""), 1.0);
        // Leading spaces (past the first line, which strip() forgives) and
        // case matter.
        assert_eq!(judge("a\nb", " a\nb", ""), 1.0);
        assert_eq!(judge("a\nb", "a\n b", ""), 0.0);
        assert_eq!(judge("a", "A", ""), 0.0);
        // The truncation marker never matches.
        assert_eq!(judge("y", "y\n\u{2026}<truncated>", ""), 0.0);
    }

    const DOUBLES: &str = "a = int(input())\nprint(a * 2)\nprint(a)";

    /// The attempt of `reply` on [`DOUBLES`], its run faked: these streams
    /// whatever the stdin, which must be `stdin`.
    fn tried(reply: &str, stdin: &str, stdout: &str, stderr: &str) -> Attempt {
        attempt(reply, DOUBLES, |got| {
            assert_eq!(got, stdin);
            Ok(run::PyRun {
                stdout: stdout.into(),
                stderr: stderr.into(),
            })
        })
        .unwrap()
    }

    #[test]
    fn feedback_shows_what_the_program_printed_on_the_input() {
        let a = tried("It is <INPUT>2</INPUT>", "2\n", "4\n2\n", "");
        assert_eq!(
            feedback(&a, "6\n3\n", "first_diff"),
            format!(
                "Your answer is incorrect: on your input the program printed 2 lines (the expected output has 2 lines); line 1 is the first that differs, where it printed:\n4\n{AGAIN}"
            )
        );
        assert_eq!(
            feedback(&a, "6\n3\n", "line"),
            format!(
                "Your answer is incorrect: on your input the program printed 2 lines (the expected output has 2 lines); line 1 is the first that differs. The program printed:\n```\n4\n2\n```\n{AGAIN}"
            )
        );
        // Lines compare right-stripped, as judging does; a shorter output
        // ends before the expected one.
        let a = tried("<INPUT>3</INPUT>", "3\n", "6  \n", "");
        assert_eq!(
            feedback(&a, "6\n3\n", "first_diff"),
            format!(
                "Your answer is incorrect: on your input the program printed 1 line (the expected output has 2 lines); line 2 is the first that differs: the program's output ends after line 1. {AGAIN}"
            )
        );
        let a = tried("<INPUT>3</INPUT>", "3\n", "", "");
        assert_eq!(
            feedback(&a, "6\n3\n", "line"),
            format!(
                "Your answer is incorrect: on your input the program printed nothing (the expected output has 2 lines). {AGAIN}"
            )
        );
        // An output that matches line by line leaves only the verdict.
        let a = tried("<INPUT>3</INPUT>", "3\n", "6\n3\n", "");
        assert_eq!(feedback(&a, "6\n3\n", "line"), verdict(AGAIN));
    }

    #[test]
    fn feedback_says_when_nothing_ran_or_stderr_was_written() {
        let not_run = |reply: &str| attempt(reply, DOUBLES, |_| unreachable!()).unwrap();
        for kind in ["first_diff", "line"] {
            assert_eq!(
                feedback(&not_run("the input is 3"), "6\n3\n", kind),
                format!(
                    "Your answer is incorrect: no <INPUT> block was found in your reply, so the program was not run. {AGAIN}"
                )
            );
            assert_eq!(
                feedback(&not_run("<INPUT></INPUT>"), "6\n3\n", kind),
                format!(
                    "Your answer is incorrect: your input has fewer lines than the program reads, so the program was not run. {AGAIN}"
                )
            );
            assert_eq!(
                feedback(&not_run(" \n"), "6\n3\n", kind),
                format!("Your answer is incorrect: your reply is empty. {AGAIN}")
            );
        }
        let trace = "Traceback (most recent call last):\n  File \"main.py\", line 1, in <module>\nValueError: invalid literal for int() with base 10: 'x'\n";
        let a = tried("<INPUT>x</INPUT>", "x\n", "", trace);
        assert_eq!(
            feedback(&a, "6\n3\n", "first_diff"),
            format!(
                "Your answer is incorrect: on your input the program wrote to stderr, which fails the task; its last line:\nValueError: invalid literal for int() with base 10: 'x'\n{AGAIN}"
            )
        );
        assert_eq!(
            feedback(&a, "6\n3\n", "line"),
            format!(
                "Your answer is incorrect: on your input the program wrote to stderr, which fails the task:\n```\n{}```\n{AGAIN}",
                trace
            )
        );
        // Stderr fails even beside the right output.
        let a = tried("<INPUT>3</INPUT>", "3\n", "6\n3\n", "warning\n");
        assert!(feedback(&a, "6\n3\n", "first_diff").contains("wrote to stderr"));
    }

    #[test]
    fn feedback_cuts_long_output_and_verdict_names_what_to_give() {
        let long: String = (1..=30).map(|i| format!("{i}\n")).collect();
        let a = tried("<INPUT>1</INPUT>", "1\n", &long, "");
        let shown: String = (1..=20).map(|i| format!("{i}\n")).collect();
        assert_eq!(
            feedback(&a, "2\n1\n", "line"),
            format!(
                "Your answer is incorrect: on your input the program printed 30 lines (the expected output has 2 lines); line 1 is the first that differs. The program printed:\n```\n{shown}[cut: the first 20 of 30 lines]\n```\n{AGAIN}"
            )
        );
        let wide = "7".repeat(3_000);
        let a = tried("<INPUT>1</INPUT>", "1\n", &wide, "");
        let said = feedback(&a, "2\n1\n", "first_diff");
        assert!(
            said.ends_with(&format!(
                "where it printed:\n{}\n[cut: the first 2000 of 3000 characters]\n{AGAIN}",
                "7".repeat(2_000)
            )),
            "{said}"
        );
        let said = "Your answer is incorrect. Try again: give the program's input between <INPUT> and </INPUT> tags.";
        assert_eq!(feedback(&a, "2\n1\n", "verdict"), said);
        let none = attempt("no tags", DOUBLES, |_| unreachable!()).unwrap();
        assert_eq!(feedback(&none, "2\n1\n", "verdict"), said);
    }

    #[test]
    fn expected_output_falls_back_to_the_row() {
        let ran = |o: &str, e: &str| run::PyRun {
            stdout: o.into(),
            stderr: e.into(),
        };
        assert_eq!(expected_output(&ran("5\n", ""), Some("6")), "5\n");
        assert_eq!(expected_output(&ran("5\n", "warning"), Some("6")), "6");
        assert_eq!(expected_output(&ran(" \n", ""), Some("6")), "6");
        assert_eq!(expected_output(&ran("", ""), None), "");
    }
}
