//! Every `trace-train` command line the README, the guide, the reference
//! and the examples show parses as the binary would parse it: a flag the
//! docs name that no subcommand has, or a value its parser refuses, fails
//! here rather than in a user's shell.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches};

use crate::Cli;

/// The Markdown files whose shell blocks are checked.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for dir in ["docs/guide", "docs/reference", "examples"] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()) {
                if e.is_dir() {
                    stack.push(e);
                } else if e.extension().is_some_and(|x| x == "md") {
                    out.push(e);
                }
            }
        }
    }
    out.sort();
    out
}

/// A line of a shell block as words and operators: quotes and backslashes
/// as the shell reads them, an unquoted `#` starting a word ends the line.
/// Operators (`&&`, `||`, `;`, `|`, `&`, `>`, `>>`, `2>`, `<`) come back as
/// `None` boundaries (a redirection also drops its target).
fn words(line: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut started = false;
    let mut chars = line.chars().peekable();
    let mut redirect = false;
    let push = |out: &mut Vec<Option<String>>,
                cur: &mut String,
                started: &mut bool,
                redirect: &mut bool| {
        if *started {
            if *redirect {
                *redirect = false;
            } else {
                out.push(Some(std::mem::take(cur)));
            }
            cur.clear();
            *started = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                started = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            '"' => {
                started = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => cur.extend(chars.next()),
                        _ => cur.push(q),
                    }
                }
            }
            '\\' => {
                started = true;
                cur.extend(chars.next());
            }
            '#' if !started => break,
            c if c.is_whitespace() => push(&mut out, &mut cur, &mut started, &mut redirect),
            '&' | '|' | ';' => {
                push(&mut out, &mut cur, &mut started, &mut redirect);
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                out.push(None);
            }
            '>' | '<' => {
                // `2>`: the digit belongs to the operator.
                if started && cur.chars().all(|d| d.is_ascii_digit()) {
                    cur.clear();
                    started = false;
                }
                push(&mut out, &mut cur, &mut started, &mut redirect);
                if chars.peek() == Some(&'>') || chars.peek() == Some(&'&') {
                    chars.next();
                }
                redirect = true;
            }
            c => {
                started = true;
                cur.push(c);
            }
        }
    }
    push(&mut out, &mut cur, &mut started, &mut redirect);
    out
}

/// The `trace-train` commands of a Markdown text: (line number, argv
/// without the program's name), from its fenced shell blocks, a
/// backslash-continued line joined to the next.
fn commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut fence: Option<bool> = None; // Some(true) in a shell block
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let number = i + 1;
        let trimmed = lines[i].trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(matches!(info.trim(), "sh" | "bash" | "shell" | "console")),
            };
            i += 1;
            continue;
        }
        let mut line = trimmed.trim_start_matches("$ ").to_owned();
        while line.ends_with('\\') && i + 1 < lines.len() {
            line.pop();
            i += 1;
            line.push(' ');
            line.push_str(lines[i].trim());
        }
        i += 1;
        if fence != Some(true) {
            continue;
        }
        for variant in synopsis(&line) {
            commands_of(number, &variant, &mut out);
        }
    }
    out
}

/// A synopsis line's forms: with its `[optional]` parts left out, and with
/// each put in (its first `a|b` choice); any other line as it is.
fn synopsis(line: &str) -> Vec<String> {
    if !line.contains("[-") {
        return vec![line.to_owned()];
    }
    let re = regex::Regex::new(r"\[([^\]]*)\]").expect("valid regex");
    let without = re.replace_all(line, "").into_owned();
    let with = re
        .replace_all(line, |c: &regex::Captures| {
            c[1].split_whitespace()
                .map(|w| w.split('|').next().unwrap_or(w))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .into_owned();
    vec![without, with]
}

/// The `trace-train` commands among `line`'s simple commands.
fn commands_of(number: usize, line: &str, out: &mut Vec<(usize, Vec<String>)>) {
    for simple in words(line).split(|w| w.is_none()) {
        let mut ws: Vec<String> = simple.iter().flatten().cloned().collect();
        // Leading `NAME=value` assignments.
        while ws.first().is_some_and(|w| {
            w.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        }) {
            ws.remove(0);
        }
        let start = match ws.first().map(String::as_str) {
            Some(w) if w == "trace-train" || w.ends_with("/trace-train") => 1,
            Some("cargo") if ws.get(1).is_some_and(|w| w == "run") => {
                match ws.iter().position(|w| w == "--") {
                    Some(p) => p + 1,
                    None => continue,
                }
            }
            _ => continue,
        };
        out.push((number, ws[start..].to_vec()));
    }
}

fn parses(argv: &[String]) -> Result<(), String> {
    let args =
        std::iter::once(OsString::from("trace-train")).chain(argv.iter().map(OsString::from));
    let matches = super::conventions::apply(Cli::command())
        .try_get_matches_from(super::conventions::negative_values(args))
        .map_err(|e| e.to_string())?;
    Cli::from_arg_matches(&matches)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn words_read_quotes_comments_and_operators() {
    let w = words(r#"A=1 trace-train eval --x 'a b' "c\"d" e\ f # note"#);
    let got: Vec<_> = w.iter().map(|w| w.as_deref().unwrap_or("|")).collect();
    assert_eq!(
        got,
        ["A=1", "trace-train", "eval", "--x", "a b", "c\"d", "e f"]
    );
    let w = words("a 2>x.log && b > out.txt | c '#### 42'");
    let got: Vec<_> = w.iter().map(|w| w.as_deref().unwrap_or("|")).collect();
    assert_eq!(got, ["a", "|", "b", "|", "c", "#### 42"]);
}

#[test]
fn every_documented_command_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut checked, mut bad) = (0, Vec::new());
    for doc in documents(root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (line, argv) in commands(&text) {
            checked += 1;
            if let Err(e) = parses(&argv) {
                let first = e.lines().next().unwrap_or_default().to_owned();
                bad.push(format!(
                    "{}:{line}: `trace-train {}`: {first}",
                    doc.strip_prefix(root).unwrap().display(),
                    argv.join(" ")
                ));
            }
        }
    }
    // The docs show over a hundred; a parser that found none is broken.
    assert!(checked >= 50, "only {checked} documented commands found");
    assert!(
        bad.is_empty(),
        "{} of {checked} documented commands do not parse:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
