//! What SAT, ABD and DED say to a wrong answer before the model tries
//! again (a multi-turn episode's feedback turn): the pieces they share.
//! Each environment's own text is next to its scoring
//! ([`super::sat::feedback`], [`super::abd::feedback`],
//! [`super::ded::feedback`]).
//!
//! `verdict` is the verdict alone: that the answer is wrong, then the
//! environment's own request for a retry ([`crate::reward::verdict`]). Program text (an
//! output, an input, a stderr) is quoted in a fenced block, cut to
//! [`MAX_LINES`] lines and [`MAX_CHARS`] characters, with a line saying so
//! when cut ([`quote`]).

/// Lines a quoted text keeps.
pub const MAX_LINES: usize = 20;
/// Characters a quoted text keeps.
pub const MAX_CHARS: usize = 2_000;

/// Which end of a long text [`quote`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The first lines (an output, an input).
    Head,
    /// The last lines (a stderr: a traceback ends in its exception).
    Tail,
}

/// `text` cut to [`MAX_LINES`] lines, then to [`MAX_CHARS`] characters,
/// from the end `keep` names, with a last line saying what was cut. One
/// trailing newline is not a line.
pub fn cut(text: &str, keep: Keep) -> String {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let lines: Vec<&str> = body.split('\n').collect();
    let total_chars = body.chars().count();
    let kept = match keep {
        Keep::Head => &lines[..lines.len().min(MAX_LINES)],
        Keep::Tail => &lines[lines.len().saturating_sub(MAX_LINES)..],
    };
    let mut out = kept.join("\n");
    let chars = out.chars().count();
    let end = match keep {
        Keep::Head => "first",
        Keep::Tail => "last",
    };
    if chars > MAX_CHARS {
        out = match keep {
            Keep::Head => out.chars().take(MAX_CHARS).collect(),
            Keep::Tail => out.chars().skip(chars - MAX_CHARS).collect(),
        };
        out.push_str(&format!(
            "\n[cut: the {end} {MAX_CHARS} of {total_chars} characters]"
        ));
    } else if kept.len() < lines.len() {
        out.push_str(&format!(
            "\n[cut: the {end} {} of {} lines]",
            kept.len(),
            lines.len()
        ));
    }
    out
}

/// `text` [`cut`] and fenced, on lines of its own.
pub fn quote(text: &str, keep: Keep) -> String {
    format!("```\n{}\n```\n", cut(text, keep))
}

/// `1 line`, `3 lines`.
pub fn lines(n: usize) -> String {
    format!("{n} line{}", if n == 1 { "" } else { "s" })
}

/// The first index where two line lists differ (one list ending counts),
/// `None` when they are equal.
pub fn first_diff<A: PartialEq<B>, B>(expected: &[A], got: &[B]) -> Option<usize> {
    (0..expected.len().max(got.len())).find(|&i| match (expected.get(i), got.get(i)) {
        (Some(e), Some(g)) => e != g,
        _ => true,
    })
}

/// The last line of `text` that is not blank (`""` when none).
pub fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_whole() {
        assert_eq!(cut("a\nb\n", Keep::Head), "a\nb");
        assert_eq!(cut("", Keep::Tail), "");
        assert_eq!(quote("x", Keep::Head), "```\nx\n```\n");
    }

    #[test]
    fn long_text_is_cut_and_says_so() {
        let many: String = (1..=25).map(|i| format!("{i}\n")).collect();
        let head = cut(&many, Keep::Head);
        assert!(head.starts_with("1\n2\n"), "{head}");
        assert!(
            head.ends_with("\n20\n[cut: the first 20 of 25 lines]"),
            "{head}"
        );
        let tail = cut(&many, Keep::Tail);
        assert!(tail.starts_with("6\n7\n"), "{tail}");
        assert!(
            tail.ends_with("\n25\n[cut: the last 20 of 25 lines]"),
            "{tail}"
        );
        // Characters: one long line.
        let wide = "é".repeat(2_500);
        let head = cut(&wide, Keep::Head);
        assert_eq!(
            head,
            format!(
                "{}\n[cut: the first 2000 of 2500 characters]",
                "é".repeat(2_000)
            )
        );
        let tail = cut(&format!("start{wide}"), Keep::Tail);
        assert_eq!(
            tail,
            format!(
                "{}\n[cut: the last 2000 of 2505 characters]",
                "é".repeat(2_000)
            )
        );
        // 20 lines of 200 characters: the line cap keeps all, the
        // character cap cuts.
        let rows = vec!["x".repeat(200); 20].join("\n");
        assert!(cut(&rows, Keep::Head).ends_with("[cut: the first 2000 of 4019 characters]"));
    }

    #[test]
    fn first_diff_counts_an_ending_as_a_difference() {
        assert_eq!(first_diff(&["a", "b"], &["a", "b"]), None);
        assert_eq!(first_diff(&["a", "b"], &["a", "c"]), Some(1));
        assert_eq!(first_diff(&["a", "b"], &["a"]), Some(1));
        assert_eq!(first_diff(&["a"], &["a", "b"]), Some(1));
        assert_eq!(first_diff::<&str, &str>(&[], &[]), None);
    }

    #[test]
    fn last_line_skips_blanks() {
        assert_eq!(
            last_line("Traceback\n  x\nValueError: no\n\n"),
            "ValueError: no"
        );
        assert_eq!(last_line(" \n"), "");
    }
}
