//! The Trace environment's answer extraction and scoring, as one function
//! that eval and RL share.
//!
//! 1. Drop `<think>…</think>` and `<thinking>…</thinking>` blocks; if a stray
//!    closing tag remains, keep only what follows the last one.
//! 2. If a fenced code block remains, keep the content of the first one.
//! 3. Strip, then compare with the ground truth after removing every
//!    whitespace character from both and lowercasing both.
//!
//! Whitespace and lowercasing follow Python's `str.split()` and `str.lower()`,
//! which the environment uses, so the reward is the environment's bit for bit.

use std::sync::LazyLock;

use regex::Regex;

static THINK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?s)<think>.*?</think>").unwrap());
static THINKING: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<thinking>.*?</thinking>").unwrap());
static FENCE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)```(?:[a-zA-Z]*)\n?(.*?)\n?```").unwrap());

/// Python's `str.isspace` for one character: Unicode White_Space plus the
/// four ASCII information separators (U+001C..U+001F).
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
pub fn python_strip(s: &str) -> &str {
    s.trim_matches(is_python_space)
}

/// The model's answer as the environment reads it out of a completion.
pub fn extract_answer(completion: &str) -> String {
    let mut text = THINK.replace_all(completion, "").into_owned();
    text = THINKING.replace_all(&text, "").into_owned();
    for tag in ["</think>", "</thinking>"] {
        if let Some(pos) = text.rfind(tag) {
            text = python_strip(&text[pos + tag.len()..]).to_owned();
        }
    }
    if let Some(m) = FENCE.captures(&text).and_then(|c| c.get(1)) {
        text = m.as_str().to_owned();
    }
    python_strip(&text).to_owned()
}

/// Both sides with all whitespace removed and lowercased.
pub fn normalize(s: &str) -> String {
    let joined: String = s.chars().filter(|&c| !is_python_space(c)).collect();
    joined.to_lowercase()
}

/// 1.0 when the completion's answer matches the ground truth, else 0.0.
pub fn score(completion: &str, ground_truth: &str) -> f64 {
    if normalize(&extract_answer(completion)) == normalize(ground_truth) {
        1.0
    } else {
        0.0
    }
}

/// Partial credit, for diagnostics only (the reward is [`score`]): how many
/// lines of the ground truth the answer reproduces at the same position,
/// each line compared as [`score`] compares whole answers, and how many
/// lines the ground truth has. Lines are those of the stripped texts.
pub fn lines_matched(answer: &str, ground_truth: &str) -> (usize, usize) {
    let expected: Vec<String> = python_strip(ground_truth).lines().map(normalize).collect();
    let matched = python_strip(answer)
        .lines()
        .zip(&expected)
        .filter(|(a, e)| normalize(a) == **e)
        .count();
    (matched, expected.len())
}

/// The first line at which `got` leaves `expected`, each line compared as
/// [`lines_matched`] compares them; a line that only one side has differs.
/// `None` where every line agrees.
pub fn first_different_line(got: &[&str], expected: &[&str]) -> Option<usize> {
    (0..expected.len().max(got.len()))
        .find(|&i| expected.get(i).map(|e| normalize(e)) != got.get(i).map(|a| normalize(a)))
}

/// Whether two completions give the same answer as the environment reads
/// and compares answers ([`extract_answer`], then [`normalize`]): a retry
/// that changed nothing (multi-turn episodes' `unchanged_retries`).
pub fn same_answer(a: &str, b: &str) -> bool {
    normalize(&extract_answer(a)) == normalize(&extract_answer(b))
}

/// The kinds of [`feedback`], as Stage 3's `feedback` and `eval
/// --feedback` name them.
pub const FEEDBACK_KINDS: [&str; 3] = ["verdict", "first_diff", "line"];

/// The verdict alone, in every environment: the answer is wrong, then
/// `again`, the environment's request for what a right answer looks like.
pub fn verdict(again: &str) -> String {
    format!("Your answer is incorrect. {again}")
}

/// What the environment tells a model whose answer was wrong, before it
/// tries again (a multi-turn episode's feedback turn), by `kind`:
/// - `verdict`: only that it was wrong;
/// - `first_diff`: also which output line is the first to differ, compared
///   as [`lines_matched`] compares them, and how many lines each side has;
/// - `line`: also what that line should have been, unless that line would
///   complete the answer (every other line already right: on a one-line
///   output the line is the whole answer), where it says what
///   `first_diff` says. A model trained on feedback that hands over the
///   answer learns to copy it instead of correcting itself.
pub fn feedback(completion: &str, ground_truth: &str, kind: &str) -> String {
    const AGAIN: &str = "Try again: reply with the program's exact output only.";
    if kind == "verdict" {
        return verdict(AGAIN);
    }
    let answer = extract_answer(completion);
    let expected: Vec<&str> = python_strip(ground_truth).lines().collect();
    let got: Vec<&str> = python_strip(&answer).lines().collect();
    let Some(i) = first_different_line(&got, &expected) else {
        // Equal line by line but not as a whole: no line to point at.
        return verdict(AGAIN);
    };
    let mut text = format!(
        "Your answer is incorrect: line {} is the first that differs (the output has {} line{}, your answer {}).",
        i + 1,
        expected.len(),
        if expected.len() == 1 { "" } else { "s" },
        got.len()
    );
    // Past the expected output's end there is no line to give (the counts
    // above already say where it ends).
    if let Some(line) = expected.get(i).filter(|_| kind == "line")
        && !completes(&expected, &got, i)
    {
        text.push_str(&format!(" Line {} should be:\n{line}\n", i + 1));
    }
    format!("{text} {AGAIN}")
}

/// Whether the expected line `i`, with the line count the feedback states,
/// would complete the answer: every other line of the expected output is
/// already right in `got`, compared as [`feedback`] compares lines. Lines
/// `got` has past the output's end do not count: the feedback says how many
/// lines the output has, so a model can drop them.
fn completes(expected: &[&str], got: &[&str], i: usize) -> bool {
    expected
        .iter()
        .enumerate()
        .all(|(j, e)| j == i || got.get(j).is_some_and(|g| normalize(g) == normalize(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_names_the_first_line_that_differs() {
        let truth = "1\n2\n3";
        assert_eq!(
            feedback("1\n2\n4", truth, "verdict"),
            "Your answer is incorrect. Try again: reply with the program's exact output only."
        );
        let d = feedback("```\n1\n 2\n4\n```", truth, "first_diff");
        assert!(d.starts_with("Your answer is incorrect: line 3 is the first that differs (the output has 3 lines, your answer 3)."), "{d}");
        assert!(!d.contains("should be"), "{d}");
        // `line` names the expected line where the answer has another
        // wrong line too.
        let l = feedback("0\n2\n4", truth, "line");
        assert!(
            l.contains("line 1 is the first") && l.contains("Line 1 should be:\n1\n"),
            "{l}"
        );
        // Two missing lines: the first of them is given, the second not.
        let short = feedback("1", truth, "line");
        assert!(
            short.contains("line 2 is the first") && short.contains("Line 2 should be:\n2\n"),
            "{short}"
        );
        // It never hands over the answer: where the line would complete
        // it (the only wrong line, the one missing line, a one-line
        // output) or there is none (lines past the output's end), it says
        // what `first_diff` says. An answer's extra lines count for
        // nothing, since the feedback states the output's line count (a
        // one-line output answered with two lines; the right lines
        // followed by extra ones).
        for (answer, truth) in [
            ("1\n2\n4", truth),
            ("1\n 2", truth),
            ("1\n2\n3\n4\n5", truth),
            ("x", "7"),
            ("", "7"),
            ("175\n50", "42"),
            ("1\n9\n3\n4", truth),
        ] {
            assert_eq!(
                feedback(answer, truth, "line"),
                feedback(answer, truth, "first_diff"),
                "{answer:?} for {truth:?}"
            );
        }
        assert!(
            feedback("x", "7", "first_diff").contains("(the output has 1 line, your answer 1)")
        );
    }

    #[test]
    fn lines_are_matched_by_position() {
        assert_eq!(lines_matched("a\nb\nc", "a\nb\nc"), (3, 3));
        assert_eq!(lines_matched("A \nx\nc\nextra", "a\nb\nc"), (2, 3));
        assert_eq!(
            lines_matched("b\nc", "a\nb\nc"),
            (0, 3),
            "a shifted line is wrong"
        );
        assert_eq!(lines_matched("", "a\nb"), (0, 2));
    }

    #[test]
    fn exact_answer_scores_one() {
        assert_eq!(score("__DBG_0__ 1\n3", "__DBG_0__ 1\n3"), 1.0);
        assert_eq!(score("__DBG_0__ 1\n4", "__DBG_0__ 1\n3"), 0.0);
    }

    #[test]
    fn think_blocks_are_removed() {
        let c = "<think>the answer is 7</think>\n5\n6";
        assert_eq!(extract_answer(c), "5\n6");
        assert_eq!(score(c, "5\n6"), 1.0);
        let c = "<thinking>\nmaybe 1\n</thinking>5";
        assert_eq!(extract_answer(c), "5");
        // Several blocks, lazily matched.
        let c = "<think>a</think>1<think>b</think>2";
        assert_eq!(extract_answer(c), "12");
    }

    #[test]
    fn stray_closing_tag_keeps_what_follows_the_last() {
        // A model whose opening tag sat in the prompt emits only the close.
        let c = "reasoning here\n</think>\n\n10\n20";
        assert_eq!(extract_answer(c), "10\n20");
        let c = "a</think>b</think>  c  ";
        assert_eq!(extract_answer(c), "c");
        assert_eq!(score("x </thinking> 42", "42"), 1.0);
    }

    #[test]
    fn first_fence_wins() {
        let c = "Here:\n```\n1\n2\n```\nand also\n```text\n3\n```";
        assert_eq!(extract_answer(c), "1\n2");
        let c = "```python\nprint(1)\n```";
        assert_eq!(extract_answer(c), "print(1)");
        // The tag is letters only: Python's regex leaves "3" in the answer.
        let c = "```py3\nx\n```";
        assert_eq!(extract_answer(c), "3\nx");
        // An unclosed fence is not a block.
        assert_eq!(extract_answer("```\n1"), "```\n1");
    }

    #[test]
    fn whitespace_and_case_are_ignored() {
        assert_eq!(score("  A B\n\tc \r\n", "abc"), 1.0);
        assert_eq!(score("TRUE", "True"), 1.0);
        assert_eq!(score("a\u{a0}b\u{3000}c", "abc"), 1.0);
        // Python counts U+001C..U+001F as whitespace; Rust alone does not.
        assert_eq!(score("a\u{1f}b", "ab"), 1.0);
        // Whitespace removal is total, so line structure does not matter...
        assert_eq!(score("1 2\n3", "12\n3"), 1.0);
        // ...but every other character does.
        assert_eq!(score("1,2", "12"), 0.0);
    }

    #[test]
    fn unicode_lowercasing_matches_python() {
        // Python: 'ÀÉÎ'.lower() == 'àéî'; 'İ'.lower() == 'i̇' (two code points).
        assert_eq!(normalize("ÀÉÎ"), "àéî");
        assert_eq!(normalize("İ"), "i\u{307}");
    }

    #[test]
    fn empty_answers() {
        assert_eq!(score("", ""), 1.0);
        assert_eq!(score("<think>all thought</think>", ""), 1.0);
        assert_eq!(score("", "0"), 0.0);
    }
}
