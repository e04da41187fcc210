//! `answers`: question-and-answer tasks scored by their final answer, as
//! GSM8K, MATH and free-text or multiple-choice QA sets are.
//!
//! The rows come from `answers_dataset`:
//! - `builtin`: arithmetic word problems made from the task id (any id
//!   makes a task; its worked solution is the demonstration);
//! - a JSONL file whose lines are one of: GSM8K's `{"question", "answer"}`
//!   (the final answer after `####`, the whole answer a demonstration),
//!   MATH's `{"problem", "solution"}` (the last `\boxed{...}`), a plain
//!   `{"question", "answer"}` or `{"prompt", "answer"}`, or multiple
//!   choice `{"question", "choices": [...], "answer"}` (the answer a letter,
//!   an index or the right choice's text).
//!
//! A completion's final answer is, in order: what follows the last `####`,
//! the last `\boxed{...}`, what follows the last "answer is", the last
//! number when the expected answer is a number, else the last line. It is
//! right when both parse as numbers within a relative 1e-6 (commas, `$`,
//! `%`, `a/b` and `\frac{a}{b}` understood), or when they are the same
//! text once lowercased, with whitespace, a trailing period, `$` and
//! `\text{}` removed. Reward 1 or 0 (`answers_reward: exact`), or in tiers
//! (`tiered`): 1 for a right answer after `####` or in `\boxed{}`, 0.7
//! for a right answer without the mark or a marked number within 1%, 0.4
//! when the right answer appears but another is final, 0.2 for a marked
//! wrong answer (an attempt in the asked form), 0 otherwise.

use anyhow::Context;

use super::{Environment, Score, Task};
use crate::data::buckets::Difficulty;
use crate::model::layers::init::Rng;

/// One question and its final answer.
#[derive(Debug, Clone, PartialEq)]
pub struct QaRow {
    pub question: String,
    /// The final answer, as the row gives it.
    pub answer: String,
    /// A worked solution ending in the answer, for supervised data.
    pub solution: Option<String>,
}

/// How a completion's answer is rewarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grading {
    /// 1 right, 0 wrong.
    Exact,
    /// 1, 0.7, 0.4, 0.2 or 0 (see the module header).
    Tiered,
}

impl Grading {
    /// The names `answers_reward` takes.
    pub const NAMES: [&str; 2] = crate::config::ANSWERS_REWARDS;

    pub fn parse(name: &str) -> anyhow::Result<Self> {
        match name {
            "exact" => Ok(Grading::Exact),
            "tiered" => Ok(Grading::Tiered),
            other => anyhow::bail!(
                "answers_reward `{other}` is not one of {}",
                Self::NAMES.join(", ")
            ),
        }
    }
}

/// The question-and-answer environment; see the module header.
pub struct AnswersEnv {
    /// As logs, metrics and reports name it: `answers`, or `answers:FILE`
    /// for the file a spec names (leaked once an environment built: `name`
    /// is `&'static`).
    name: &'static str,
    /// Empty for the built-in word problems.
    rows: Vec<QaRow>,
    grading: Grading,
}

/// What the prompt asks for after the question.
const INSTRUCTION: &str = "Solve the problem step by step. End with a line `#### ANSWER`, where ANSWER is the final answer alone.";

impl AnswersEnv {
    /// The environment on `dataset`: `builtin`, or a JSONL path.
    pub fn load(dataset: &str) -> anyhow::Result<Self> {
        if dataset == "builtin" {
            return Ok(Self {
                name: "answers",
                rows: Vec::new(),
                grading: Grading::Exact,
            });
        }
        let text = std::fs::read_to_string(dataset)
            .with_context(|| format!("cannot read the answers dataset `{dataset}`"))?;
        let rows = parse_rows(&text).with_context(|| format!("`{dataset}`"))?;
        anyhow::ensure!(
            !rows.is_empty(),
            "`{dataset}` holds no question\nhint: one JSON object a line, as {{\"question\": ..., \"answer\": ...}}"
        );
        Ok(Self {
            name: "answers",
            rows,
            grading: Grading::Exact,
        })
    }

    /// The environment on `rows` (tests).
    pub fn from_rows(rows: Vec<QaRow>) -> Self {
        Self {
            name: "answers",
            rows,
            grading: Grading::Exact,
        }
    }

    /// Named `name` from now on (the registry's `answers:FILE`, so that
    /// two question files in one mixture keep their own metrics).
    pub fn named(mut self, name: &str) -> Self {
        self.name = Box::leak(name.to_owned().into_boxed_str());
        self
    }

    /// Rewards answers by `grading` from now on.
    pub fn with_grading(mut self, grading: Grading) -> Self {
        self.grading = grading;
        self
    }

    fn row(&self, task_id: u64) -> QaRow {
        if self.rows.is_empty() {
            word_problem(task_id)
        } else {
            self.rows[(task_id % self.rows.len() as u64) as usize].clone()
        }
    }
}

impl Environment for AnswersEnv {
    fn name(&self) -> &'static str {
        self.name
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let row = self.row(task_id);
        Ok(Task {
            task_id,
            prompt: format!("{}\n\n{INSTRUCTION}", row.question),
            expected: row.answer,
            difficulty: Difficulty::default(),
        })
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        Score::Reward(grade(completion, &task.expected, self.grading))
    }

    fn demonstration(&self, task: &Task) -> Option<String> {
        let row = self.row(task.task_id);
        Some(match row.solution {
            Some(s) if s.contains("####") => s,
            Some(s) => format!("{s}\n#### {}", row.answer),
            None => format!("#### {}", row.answer),
        })
    }

    fn task_count(&self) -> Option<u64> {
        (!self.rows.is_empty()).then_some(self.rows.len() as u64)
    }
}

/// The rows of a JSONL text (see the module header); errors name the line.
pub fn parse_rows(text: &str) -> anyhow::Result<Vec<QaRow>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {}: not JSON", i + 1))?;
        rows.push(row_of(&v).with_context(|| format!("line {}", i + 1))?);
    }
    Ok(rows)
}

fn row_of(v: &serde_json::Value) -> anyhow::Result<QaRow> {
    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let answer_value = v.get("answer").or_else(|| v.get("final_answer"));
    let answer_text = answer_value.map(|a| match a {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    if let Some(problem) = text("problem") {
        let solution = text("solution").context("a MATH row needs `solution`")?;
        let answer = answer_text
            .or_else(|| last_boxed(&solution))
            .context("no `\\boxed{...}` answer in `solution`")?;
        return Ok(QaRow {
            question: problem,
            answer,
            solution: Some(solution),
        });
    }
    let question = text("question")
        .or_else(|| text("prompt"))
        .context("a row needs `question` (or `prompt`, or MATH's `problem`)")?;
    let answer = answer_text.context("a row needs `answer`")?;
    if let Some(choices) = v.get("choices").and_then(|c| c.as_array()) {
        let choices: Vec<String> = choices
            .iter()
            .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_owned))
            .collect();
        anyhow::ensure!(
            (2..=26).contains(&choices.len()),
            "`choices` must hold 2 to 26 choices"
        );
        let letter = |i: usize| char::from(b'A' + i as u8).to_string();
        let right = match answer_value {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|i| i as usize),
            _ => {
                let a = answer.trim();
                choices
                    .iter()
                    .position(|c| c.trim() == a)
                    .or_else(|| (0..choices.len()).find(|&i| letter(i).eq_ignore_ascii_case(a)))
            }
        }
        .filter(|&i| i < choices.len())
        .with_context(|| format!("`answer` {answer:?} names none of the choices"))?;
        let listed: Vec<String> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{}. {c}", letter(i)))
            .collect();
        return Ok(QaRow {
            question: format!(
                "{question}\n\n{}\n\nThe answer is the letter of the right choice.",
                listed.join("\n")
            ),
            answer: letter(right),
            solution: None,
        });
    }
    // GSM8K: a worked answer ending in `#### N`.
    if let Some(at) = answer.rfind("####") {
        return Ok(QaRow {
            question,
            answer: answer[at + 4..].trim().to_owned(),
            solution: Some(answer),
        });
    }
    Ok(QaRow {
        question,
        answer,
        solution: None,
    })
}

/// The reward of `completion` against `expected` by `grading`.
pub fn grade(completion: &str, expected: &str, grading: Grading) -> f64 {
    let numeric = number(expected).is_some();
    let found = find_answer(completion, numeric);
    let right = found
        .as_ref()
        .is_some_and(|(given, _)| same_answer(given, expected));
    if grading == Grading::Exact {
        return if right { 1.0 } else { 0.0 };
    }
    let near = |given: &str| match (number(given), number(expected)) {
        (Some(a), Some(b)) => (a - b).abs() <= 0.01 * b.abs().max(1.0),
        _ => false,
    };
    match &found {
        Some((_, true)) if right => 1.0,
        Some(_) if right => 0.7,
        Some((given, true)) if near(given) => 0.7,
        _ if mentions(completion, expected, numeric) => 0.4,
        Some((_, true)) => 0.2,
        _ => 0.0,
    }
}

/// Whether the right answer appears anywhere in `completion`: one of its
/// numbers, or its normalised text.
fn mentions(completion: &str, expected: &str, numeric: bool) -> bool {
    if numeric {
        let mut rest = completion;
        while let Some(n) = first_number(rest) {
            if same_answer(&n, expected) {
                return true;
            }
            let at = rest.find(n.as_str()).map_or(rest.len(), |i| i + n.len());
            rest = &rest[at.clamp(1, rest.len())..];
        }
        return false;
    }
    let norm = |s: &str| {
        s.to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric())
            .collect::<String>()
    };
    let e = norm(expected);
    !e.is_empty() && norm(completion).contains(&e)
}

/// The final answer of `completion` (see the module header); `numeric`:
/// the expected answer is a number, so a last number counts.
pub fn final_answer(completion: &str, numeric: bool) -> Option<String> {
    find_answer(completion, numeric).map(|(a, _)| a)
}

/// [`final_answer`], and whether it was marked as asked (after `####` or
/// in `\boxed{}`).
fn find_answer(completion: &str, numeric: bool) -> Option<(String, bool)> {
    if let Some(at) = completion.rfind("####") {
        let line = completion[at + 4..]
            .trim()
            .lines()
            .next()
            .unwrap_or("")
            .trim();
        // `#### 42 apples`: the number, when a number is wanted.
        if numeric && let Some(n) = first_number(line) {
            return Some((n, true));
        }
        return Some((line.to_owned(), true));
    }
    if let Some(b) = last_boxed(completion) {
        return Some((b, true));
    }
    unmarked(completion, numeric).map(|a| (a, false))
}

/// The final answer of a completion with no `####` or `\boxed{}`.
fn unmarked(completion: &str, numeric: bool) -> Option<String> {
    let lower = completion.to_lowercase();
    if let Some(at) = lower.rfind("answer is") {
        let rest = completion[at + "answer is".len()..].trim_start_matches([':', ' ']);
        let line = rest.lines().next().unwrap_or("").trim();
        if !line.is_empty() {
            return Some(line.trim_end_matches('.').to_owned());
        }
    }
    if numeric {
        return last_number(completion);
    }
    completion
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
}

/// The contents of the last `\boxed{...}` (braces balanced).
pub fn last_boxed(text: &str) -> Option<String> {
    let at = text.rfind("\\boxed{")?;
    let body = &text[at + "\\boxed{".len()..];
    let mut depth = 1;
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(body[..i].trim().to_owned());
                }
            }
            _ => {}
        }
    }
    None
}

/// The last number written in `text` (a sign, digits with commas, a
/// decimal part, or a fraction `a/b`).
fn last_number(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut end = bytes.len();
    while end > 0 && !bytes[end - 1].is_ascii_digit() {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    let mut start = end;
    while start > 0 && (bytes[start - 1].is_ascii_digit() || b",./".contains(&bytes[start - 1])) {
        start -= 1;
    }
    while start < end && !bytes[start].is_ascii_digit() {
        start += 1;
    }
    if start > 0 && bytes[start - 1] == b'-' {
        start -= 1;
    }
    Some(text[start..end].to_owned())
}

/// The first number written in `text` (as [`last_number`] reads one).
fn first_number(text: &str) -> Option<String> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let start = if text[..start].ends_with('-') {
        start - 1
    } else {
        start
    };
    let len = text[start..]
        .char_indices()
        .skip(1)
        .find(|&(_, c)| !(c.is_ascii_digit() || ",./".contains(c)))
        .map_or(text.len() - start, |(i, _)| i);
    Some(
        text[start..start + len]
            .trim_end_matches([',', '.', '/'])
            .to_owned(),
    )
}

/// `text` as a number: commas, `$`, `%`, spaces and a trailing period
/// removed; `a/b` and `\frac{a}{b}` divided.
pub fn number(text: &str) -> Option<f64> {
    let t = text
        .trim()
        .trim_end_matches('.')
        .replace(['$', ',', '%', ' '], "")
        .replace("\\!", "");
    if let Some(rest) = t
        .strip_prefix("\\frac{")
        .or_else(|| t.strip_prefix("\\dfrac{"))
    {
        let (a, b) = rest.trim_end_matches('}').split_once("}{")?;
        return Some(number(a)? / number(b)?);
    }
    if let Some((a, b)) = t.split_once('/') {
        let (a, b) = (a.parse::<f64>().ok()?, b.parse::<f64>().ok()?);
        return (b != 0.0).then(|| a / b);
    }
    t.parse::<f64>().ok().filter(|x| x.is_finite())
}

/// Whether `given` is `expected` (see the module header).
pub fn same_answer(given: &str, expected: &str) -> bool {
    if let (Some(a), Some(b)) = (number(given), number(expected)) {
        return (a - b).abs() <= 1e-6 * b.abs().max(1.0);
    }
    let norm = |s: &str| {
        let mut s = s.trim().trim_end_matches('.').to_lowercase();
        for (from, to) in [("\\text{", ""), ("\\mathrm{", ""), ("$", "")] {
            s = s.replace(from, to);
        }
        s.chars()
            .filter(|c| !c.is_whitespace() && *c != '{' && *c != '}')
            .collect::<String>()
    };
    !given.trim().is_empty() && norm(given) == norm(expected)
}

/// The built-in word problem of `task_id`, with its worked solution.
pub fn word_problem(task_id: u64) -> QaRow {
    let mut rng = Rng::for_tensor(task_id, "answers");
    let mut pick = |n: u64| rng.next_u64() % n;
    let names = [
        "Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana",
    ];
    let items = ["apples", "pencils", "stamps", "marbles", "books", "shells"];
    let name = names[pick(names.len() as u64) as usize];
    let item = items[pick(items.len() as u64) as usize];
    let (a, b, c) = (2 + pick(48), 2 + pick(20), 1 + pick(9));
    let (question, steps, answer) = match pick(4) {
        0 => {
            let c = c.min(a + b);
            (
                format!(
                    "{name} has {a} {item}, buys {b} more and then gives {c} away. How many {item} does {name} have now?"
                ),
                format!("{a} + {b} = {}\n{} - {c} = {}", a + b, a + b, a + b - c),
                a + b - c,
            )
        }
        1 => (
            format!("A box holds {a} {item}. How many {item} are in {b} boxes?"),
            format!("{a} * {b} = {}", a * b),
            a * b,
        ),
        2 => (
            format!(
                "{name} shares {} {item} equally among {b} friends. How many {item} does each friend get?",
                a * b
            ),
            format!("{} / {b} = {a}", a * b),
            a,
        ),
        _ => {
            let spent = c.min(a * b);
            (
                format!(
                    "{name} earns {a} dollars a day for {b} days and spends {spent} dollars. How many dollars does {name} have left?"
                ),
                format!(
                    "{a} * {b} = {}\n{} - {spent} = {}",
                    a * b,
                    a * b,
                    a * b - spent
                ),
                a * b - spent,
            )
        }
    };
    QaRow {
        question,
        answer: answer.to_string(),
        solution: Some(format!("{steps}\n#### {answer}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_answers_are_found_by_their_marks_in_order() {
        let cases = [
            ("work\n#### 1,234\n", true, "1,234"),
            ("#### $1,234.50 in total.", true, "1,234.50"),
            ("so \\boxed{\\frac{3}{4}} is it", true, "\\frac{3}{4}"),
            ("\\boxed{x^{2}+1}", false, "x^{2}+1"),
            ("The answer is: Paris.", false, "Paris"),
            ("2 + 3 = 5, then 5 * 2 = 10 apples", true, "10"),
            ("it drops to -7 degrees", true, "-7"),
            ("half: 1/2", true, "1/2"),
            ("line one\nB\n", false, "B"),
        ];
        for (completion, numeric, want) in cases {
            assert_eq!(
                final_answer(completion, numeric).as_deref(),
                Some(want),
                "{completion:?}"
            );
        }
        assert_eq!(final_answer("no digits here", true), None);
    }

    #[test]
    fn answers_match_as_numbers_or_as_normalised_text() {
        for (given, expected) in [
            ("1,234", "1234"),
            ("$18.00", "18"),
            ("\\frac{3}{4}", "0.75"),
            ("3/4", "0.75"),
            ("50%", "50"),
            ("Paris.", "paris"),
            ("\\text{B}", "B"),
            ("x^{2} + 1", "x^2+1"),
        ] {
            assert!(same_answer(given, expected), "{given} vs {expected}");
        }
        for (given, expected) in [("18.5", "18"), ("", ""), ("Lyon", "Paris"), ("7", "-7")] {
            assert!(!same_answer(given, expected), "{given} vs {expected}");
        }
    }

    #[test]
    fn tiers_reward_form_closeness_and_attempts() {
        let t = |c: &str, e: &str| grade(c, e, Grading::Tiered);
        assert_eq!(t("3 + 4 = 7\n#### 7", "7"), 1.0);
        assert_eq!(t("so \\boxed{7}", "7"), 1.0);
        assert_eq!(t("The answer is 7.", "7"), 0.7);
        assert_eq!(t("#### 1000", "1005"), 0.7);
        assert_eq!(t("3 + 4 = 7, plus 1 is 8\n#### 8", "7"), 0.4);
        assert_eq!(t("#### 12", "7"), 0.2);
        assert_eq!(t("no idea", "7"), 0.0);
        assert_eq!(t("I think Paris, not Lyon\n#### Lyon", "Paris"), 0.4);
        // Exact grading gives 1 or 0 for the same completions.
        assert_eq!(grade("The answer is 7.", "7", Grading::Exact), 1.0);
        assert_eq!(grade("#### 1000", "1005", Grading::Exact), 0.0);
        assert!(
            Grading::parse("tiers")
                .unwrap_err()
                .to_string()
                .contains("exact, tiered")
        );
    }

    #[test]
    fn rows_read_gsm8k_math_plain_and_multiple_choice() {
        let text = r#"{"question": "2+2?", "answer": "Add them.\n#### 4"}
{"problem": "Half of 1?", "solution": "It is \\boxed{\\frac{1}{2}}."}
{"prompt": "Capital of France?", "answer": "Paris"}
{"question": "Which is red?", "choices": ["sky", "blood"], "answer": 1}
{"question": "Pick", "choices": ["x", "y", "z"], "answer": "z"}
"#;
        let rows = parse_rows(text).unwrap();
        let answers: Vec<&str> = rows.iter().map(|r| r.answer.as_str()).collect();
        assert_eq!(answers, ["4", "\\frac{1}{2}", "Paris", "B", "C"]);
        assert!(rows[3].question.contains("A. sky\nB. blood"));
        assert_eq!(rows[0].solution.as_deref(), Some("Add them.\n#### 4"));
        let e = parse_rows("{\"question\": \"q\"}\n").unwrap_err();
        assert!(format!("{e:#}").contains("line 1") && format!("{e:#}").contains("`answer`"));
        let e = parse_rows("{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": \"c\"}")
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("names none of the choices"),
            "{e:#}"
        );
    }

    #[test]
    fn a_task_is_scored_by_its_final_answer_and_demonstrated_by_its_solution() {
        let env = AnswersEnv::from_rows(
            parse_rows(r#"{"question": "2+2?", "answer": "Add.\n#### 4"}"#).unwrap(),
        );
        let task = env.task(7).unwrap();
        assert!(task.prompt.starts_with("2+2?") && task.prompt.contains("####"));
        let score = |c: &str| env.score(&task, c);
        assert_eq!(score("2 + 2 = 4\n#### 4"), Score::Reward(1.0));
        assert_eq!(score("I think it is 4."), Score::Reward(1.0));
        assert_eq!(score("#### 5"), Score::Reward(0.0));
        assert_eq!(score("#### 4 apples"), Score::Reward(1.0));
        assert_eq!(score("no answer at all"), Score::Reward(0.0));
        let demo = env.demonstration(&task).unwrap();
        assert_eq!(score(&demo), Score::Reward(1.0));
        assert_eq!(env.task_count(), Some(1));
    }

    #[test]
    fn built_in_word_problems_are_fixed_by_their_id_and_solved_by_their_solution() {
        let env = AnswersEnv::load("builtin").unwrap();
        assert_eq!(env.task_count(), None);
        let mut kinds = std::collections::BTreeSet::new();
        for id in 0..200 {
            let t = env.task(id).unwrap();
            assert_eq!(
                t,
                env.task(id).unwrap(),
                "task {id} is a function of its id"
            );
            let demo = env.demonstration(&t).unwrap();
            assert_eq!(
                env.score(&t, &demo),
                Score::Reward(1.0),
                "{}\n{demo}",
                t.prompt
            );
            let n: i64 = t.expected.parse().unwrap();
            assert!(n >= 0, "{}", t.prompt);
            kinds.insert(t.prompt.split_whitespace().nth(1).unwrap_or("").to_owned());
        }
        assert!(kinds.len() > 3, "{kinds:?}");
        assert_ne!(env.task(1).unwrap().prompt, env.task(2).unwrap().prompt);
    }
}
