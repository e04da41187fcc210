//! SAT: find an assignment that satisfies a random planted k-SAT formula
//! (Affine's `sat.py`). The formula is a pure function of the task id,
//! drawn with CPython's `random.Random(task_id)` in the original's order,
//! so it is the original's bit for bit; no data, no sandbox.
//!
//! Generation: `n = 15` variables, `k = 10` literals a clause,
//! `m = int(4.26 n) = 63` clauses. The planted value of x1..xn is
//! `choice([True, False])` each; a clause samples k distinct variables
//! (in sampled order), picks one of them (`choice`) to agree with the
//! planted value, and gives every other a `choice([True, False])` polarity,
//! so the planted assignment satisfies every clause.
//!
//! Scoring: every `x(\d+)=(True|False|1|0)` in the whole reply (no think
//! stripping, case-sensitive, no boundary on the left, `\d` any Unicode
//! decimal digit, the last occurrence of a variable wins); 1.0 iff every
//! clause has a literal the assignment makes true (an unassigned variable
//! makes none true), else 0.0.
//!
//! Feedback ([`feedback`]): `first_diff` says how many clauses the reply's
//! assignment leaves unsatisfied, `line` also which is the first of them.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::LazyLock;

use regex::Regex;

use crate::reward::verdict;

/// What this environment asks a retry for, closing every feedback.
const AGAIN: &str = "Try again: give an assignment like `x1=True, x2=False, ...`.";
use super::py;
use super::pyrandom::PyRandom;
use crate::data::buckets::Difficulty;
use crate::env::{Environment, Score, Task};

/// Variables.
pub const N: usize = 15;
/// Literals a clause.
pub const K: usize = 10;
/// Clauses: `int(4.26 * n)`.
pub const M: usize = 63;

/// A clause's literals: `v` is x_v, `-v` is not x_v.
pub type Clause = Vec<i32>;

/// The formula of a task and the assignment it was planted on.
#[derive(Debug, Clone, PartialEq)]
pub struct Formula {
    /// `planted[i]` is x_{i+1}.
    pub planted: Vec<bool>,
    pub clauses: Vec<Clause>,
}

impl Formula {
    /// The formula of `task_id`, drawn as `random.Random(task_id)` draws it.
    pub fn new(task_id: u64) -> Self {
        let mut rng = PyRandom::new(task_id);
        let planted: Vec<bool> = (0..N).map(|_| rng.choice(&[true, false])).collect();
        let vars: Vec<i32> = (1..=N as i32).collect();
        let clauses = (0..M)
            .map(|_| {
                let vs = rng.sample(&vars, K);
                let sv = rng.choice(&vs);
                vs.iter()
                    .map(|&v| {
                        let positive = if v == sv {
                            planted[(v - 1) as usize]
                        } else {
                            rng.choice(&[true, false])
                        };
                        if positive { v } else { -v }
                    })
                    .collect()
            })
            .collect();
        Self { planted, clauses }
    }

    /// The formula line of the prompt: `(x1 ∨ ¬x2 ∨ ...) ∧ (...)`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (i, clause) in self.clauses.iter().enumerate() {
            if i > 0 {
                out.push_str(" \u{2227} ");
            }
            out.push_str(&clause_text(clause));
        }
        out
    }

    /// The user message.
    pub fn prompt(&self) -> String {
        format!(
            "Find a satisfying assignment for the following {K}-SAT formula over variables x1..x{N}:\n{}\nProvide your answer as comma-separated assignments like `x1=True, x2=False, ...`, or respond `UNSAT` if it has no solution.",
            self.text()
        )
    }

    /// The planted assignment in the answer format: `x1=True, x2=False, ...`.
    pub fn planted_answer(&self) -> String {
        self.planted
            .iter()
            .enumerate()
            .map(|(i, &v)| format!("x{}={}", i + 1, if v { "True" } else { "False" }))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One clause as the prompt writes it: `(x1 ∨ ¬x2 ∨ ...)`.
pub fn clause_text(clause: &[i32]) -> String {
    let mut out = String::from("(");
    for (j, &l) in clause.iter().enumerate() {
        if j > 0 {
            out.push_str(" \u{2228} ");
        }
        let _ = write!(
            out,
            "{}x{}",
            if l < 0 { "\u{ac}" } else { "" },
            l.unsigned_abs()
        );
    }
    out.push(')');
    out
}

static ASSIGNMENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"x({}+)=(True|False|1|0)", py::re_digit())).expect("a valid pattern")
});

/// The assignment a reply gives, as the original reads it: variable (as
/// `int` of its digits; saturating, so no huge id aliases a real one) →
/// value, the last occurrence winning.
pub fn assignment(reply: &str) -> HashMap<u128, bool> {
    let mut got = HashMap::new();
    for c in ASSIGNMENT.captures_iter(py::strip(reply)) {
        let var = py::int_of_digits(&c[1]).expect("\\d matches decimals only");
        got.insert(var, matches!(&c[2], "True" | "1"));
    }
    got
}

/// Whether `got` makes a literal of `clause` true (an unassigned variable
/// makes none true).
fn satisfied(clause: &[i32], got: &HashMap<u128, bool>) -> bool {
    clause.iter().any(|&l| {
        got.get(&u128::from(l.unsigned_abs()))
            .is_some_and(|&v| v == (l > 0))
    })
}

/// 1.0 iff the reply's assignment satisfies every clause, else 0.0 (an
/// empty reply scores 0 before anything is read).
pub fn score(reply: &str, clauses: &[Clause]) -> f64 {
    if py::strip(reply).is_empty() {
        return 0.0;
    }
    let got = assignment(reply);
    let sat = clauses.iter().all(|clause| satisfied(clause, &got));
    if sat { 1.0 } else { 0.0 }
}

/// What SAT says to a wrong reply, by `kind`: `verdict` the verdict alone;
/// `first_diff` how many clauses the reply's assignment (read as
/// [`score`] reads it) leaves unsatisfied; `line` also the first of them,
/// numbered from 1 in the prompt's order. An assignment that satisfies
/// every clause (a reply scored 0 only for being blank) gets the verdict.
pub fn feedback(reply: &str, clauses: &[Clause], kind: &str) -> String {
    if kind == "verdict" {
        return verdict(AGAIN);
    }
    let got = if py::strip(reply).is_empty() {
        HashMap::new()
    } else {
        assignment(reply)
    };
    let unsat: Vec<usize> = (0..clauses.len())
        .filter(|&i| !satisfied(&clauses[i], &got))
        .collect();
    let Some(&first) = unsat.first() else {
        return verdict(AGAIN);
    };
    let mut text = format!(
        "Your answer is incorrect: your assignment leaves {} of the {} clauses unsatisfied.",
        unsat.len(),
        clauses.len()
    );
    if kind == "line" {
        let _ = write!(
            text,
            " The first is clause {}: {}.",
            first + 1,
            clause_text(&clauses[first])
        );
    }
    format!("{text} {AGAIN}")
}

/// The SAT environment: any u64 is a task id; no data, no sandbox.
pub struct SatEnv;

impl Environment for SatEnv {
    fn name(&self) -> &'static str {
        "sat"
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let f = Formula::new(task_id);
        Ok(Task {
            task_id,
            prompt: f.prompt(),
            expected: f.planted_answer(),
            difficulty: Difficulty::default(),
        })
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        Score::Reward(score(completion, &Formula::new(task.task_id).clauses))
    }

    fn demonstration(&self, task: &Task) -> Option<String> {
        Some(task.expected.clone())
    }

    fn feedback(&self, task: &Task, completion: &str, kind: &str) -> Result<String, String> {
        let clauses = Formula::new(task.task_id).clauses;
        Ok(feedback(completion, &clauses, kind))
    }

    fn key(&self, task: &Task) -> serde_json::Value {
        let f = Formula::new(task.task_id);
        serde_json::json!({
            "planted": task.expected,
            "clauses": f.clauses,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sha2::{Digest, Sha256};

    use super::*;

    fn bits(planted: &[bool]) -> String {
        planted.iter().map(|&b| if b { 'T' } else { 'F' }).collect()
    }

    /// The doc's vectors, from the original `sat.py` under CPython 3.11.
    #[test]
    fn formulas_match_the_original_bit_for_bit() {
        let f = Formula::new(0);
        assert_eq!(bits(&f.planted), "FFTFFFFFFTTFTTF");
        assert_eq!(f.clauses[0], [-15, 9, -12, -10, -3, -5, 2, -14, -7, -6]);
        assert_eq!(f.clauses[62], [-4, 3, -8, 2, -7, 11, -5, 9, -15, 14]);
        let line = f.text();
        assert_eq!(line.chars().count(), 3842);
        assert_eq!(
            crate::hex(&Sha256::digest(line.as_bytes())),
            "06a8119afa50d0637e973419f14f22a5b4495924eb265908de4938cd6ec28c4c"
        );
        let f = Formula::new(1);
        assert_eq!(bits(&f.planted), "TTFTFFFFTTFTFFT");
        assert_eq!(f.clauses[0], [12, 8, -5, 15, -4, 10, 2, -6, -1, 7]);
        let f = Formula::new(42);
        assert_eq!(bits(&f.planted), "TTFTTTTTFTTTTTT");
        assert_eq!(f.clauses[0], [-9, 4, -12, -11, -15, 7, 14, -8, 5, 3]);
    }

    #[test]
    fn the_prompt_is_three_lines() {
        let f = Formula::new(0);
        let p = f.prompt();
        let lines: Vec<&str> = p.split('\n').collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            "Find a satisfying assignment for the following 10-SAT formula over variables x1..x15:"
        );
        assert!(lines[1].starts_with("(\u{ac}x15 \u{2228} x9 \u{2228} \u{ac}x12"));
        assert!(lines[2].ends_with("if it has no solution."));
    }

    #[test]
    fn the_planted_answer_scores_one_and_every_clause_holds_it() {
        for id in [0, 1, 42, 12345, u64::MAX] {
            let f = Formula::new(id);
            assert_eq!(score(&f.planted_answer(), &f.clauses), 1.0, "task {id}");
            // Flipping one variable's value breaks some task's formula; an
            // empty or UNSAT reply never satisfies.
            assert_eq!(score("UNSAT", &f.clauses), 0.0);
        }
    }

    #[test]
    fn feedback_counts_unsatisfied_clauses_and_names_the_first() {
        let clauses = vec![vec![1, 2], vec![-1, 3], vec![-2, -3]];
        let verdict = "Your answer is incorrect. Try again: give an assignment like `x1=True, x2=False, ...`.";
        assert_eq!(feedback("x1=True", &clauses, "verdict"), verdict);
        // x1 true, x2 and x3 unassigned: clause 2 fails (x3 has no value),
        // clause 3 too (no value makes a literal true).
        assert_eq!(
            feedback("x1=True", &clauses, "first_diff"),
            "Your answer is incorrect: your assignment leaves 2 of the 3 clauses unsatisfied. Try again: give an assignment like `x1=True, x2=False, ...`."
        );
        assert_eq!(
            feedback("x1=True", &clauses, "line"),
            "Your answer is incorrect: your assignment leaves 2 of the 3 clauses unsatisfied. The first is clause 2: (\u{ac}x1 \u{2228} x3). Try again: give an assignment like `x1=True, x2=False, ...`."
        );
        // A blank reply assigns nothing.
        assert!(feedback(" ", &clauses, "line").contains("leaves 3 of the 3"));
        // A satisfying assignment: nothing to point at.
        assert_eq!(
            feedback("x1=False, x2=True, x3=False", &clauses, "line"),
            verdict
        );
        // The environment reads the task's formula.
        let t = SatEnv.task(0).unwrap();
        let f = Formula::new(0);
        let said = SatEnv.feedback(&t, "UNSAT", "line").unwrap();
        assert!(
            said.contains(&format!(
                "leaves 63 of the 63 clauses unsatisfied. The first is clause 1: {}.",
                clause_text(&f.clauses[0])
            )),
            "{said}"
        );
        assert_eq!(SatEnv.feedback(&t, "UNSAT", "verdict").unwrap(), verdict);
    }

    /// Each quirk the doc lists. `x1` alone must be true: `[[1]]`.
    #[test]
    fn extraction_quirks() {
        let x1 = |r: &str| score(r, &[vec![1]]);
        let got = |r: &str| assignment(r).into_iter().collect::<BTreeMap<_, _>>();
        assert_eq!(x1("x1=True"), 1.0);
        // Case-sensitive values: `true` is not matched; unassigned never satisfies.
        assert_eq!(x1("x1=true"), 0.0);
        assert!(got("x1=true, x2=TRUE").is_empty());
        // No spaces around `=`.
        assert_eq!(x1("x1 = True"), 0.0);
        assert_eq!(x1("x1 =True"), 0.0);
        // 1/0 are values; `x1=10` reads as x1=1, `x1=01` as x1=0.
        assert_eq!(x1("x1=1"), 1.0);
        assert_eq!(x1("x1=10"), 1.0);
        assert_eq!(x1("x1=01"), 0.0);
        // No left boundary: `xx1=` and `¬x1=` match.
        assert_eq!(x1("xx1=True"), 1.0);
        assert_eq!(x1("\u{ac}x1=True"), 1.0);
        // Leading zeros: x01 is x1; Unicode decimals count (x١ is x1), a
        // superscript is no digit.
        assert_eq!(x1("x01=True"), 1.0);
        assert_eq!(x1("x\u{661}=True"), 1.0);
        assert_eq!(x1("x\u{b9}=True"), 0.0);
        // Ids above n are ignored and never alias x1 (2^32 + 1 saturates
        // nothing away).
        assert_eq!(got("x16=True, x4294967297=True").get(&1), None);
        // The last occurrence wins, inside a think block or not.
        assert_eq!(x1("<think>x1=False</think>x1=True"), 1.0);
        assert_eq!(x1("x1=True<think>x1=False</think>"), 0.0);
        // An empty (blank) reply scores 0 before anything is read.
        assert_eq!(score(" \n", &[]), 0.0);
        assert_eq!(score("anything", &[]), 1.0, "no clause: nothing to violate");
        // The planted answer with 1/0 values still satisfies task 0.
        let f = Formula::new(0);
        let good = f.planted_answer();
        assert_eq!(
            score(
                &good.replace("=True", "=1").replace("=False", "=0"),
                &f.clauses
            ),
            1.0
        );
    }
}
