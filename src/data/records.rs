//! Training records: the JSONL files `generate` writes.
//!
//! Owns reading and validating one record a line: `messages` (optional
//! system message, then alternating user and assistant turns, ending with
//! the assistant's answer) plus `expected_output` and `metadata`, kept for
//! eval and reports. Other fields (`program`, `input`) are in the prompt
//! already and are skipped. Errors name the file and line, with a hint.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;

use super::template::{Message, Role};
use super::{DataError, Result};

/// One training chat.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// 1-based line in the file, for messages about this record.
    pub line: u64,
    pub messages: Vec<Message>,
    pub expected_output: Option<String>,
    pub metadata: serde_json::Value,
}

impl Record {
    /// Everything before the answer: the context the model answers.
    pub fn prompt(&self) -> &[Message] {
        &self.messages[..self.messages.len() - 1]
    }

    /// The assistant's answer (the last message).
    pub fn answer(&self) -> &str {
        &self.messages[self.messages.len() - 1].content
    }
}

#[derive(Deserialize)]
struct Row {
    messages: Vec<RawMessage>,
    #[serde(default)]
    expected_output: Option<String>,
    #[serde(default)]
    metadata: serde_json::Value,
}

#[derive(Deserialize)]
struct RawMessage {
    role: String,
    content: String,
}

const HINT: &str = "each line must be {\"messages\": [{\"role\": \"user\", \"content\": ...}, {\"role\": \"assistant\", \"content\": ...}], ...} as `trace-train generate` writes; fix or remove the line";

/// Reads every record of a JSONL file; blank lines are skipped.
pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    let file = File::open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::Missing {
                path: path.to_owned(),
                hint: "run `trace-train generate` first, or pass the path of its train JSONL"
                    .into(),
            }
        } else {
            DataError::Read {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    let mut out = Vec::new();
    let mut reader = BufReader::new(file);
    let mut buf = String::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        let n = reader.read_line(&mut buf).map_err(|e| DataError::Line {
            path: path.to_owned(),
            line: line + 1,
            message: format!("cannot read: {e}"),
            hint: "the file must be UTF-8 JSONL".into(),
        })?;
        if n == 0 {
            break;
        }
        line += 1;
        if buf.trim().is_empty() {
            continue;
        }
        let err = |message: String| DataError::Line {
            path: path.to_owned(),
            line,
            message,
            hint: HINT.into(),
        };
        let row: Row =
            serde_json::from_str(&buf).map_err(|e| err(format!("invalid record: {e}")))?;
        let messages = parse_messages(row.messages).map_err(err)?;
        out.push(Record {
            line,
            messages,
            expected_output: row.expected_output,
            metadata: row.metadata,
        });
    }
    Ok(out)
}

/// Roles must be known, a system message may only come first, then user
/// and assistant alternate, starting with user and ending with assistant.
fn parse_messages(raw: Vec<RawMessage>) -> std::result::Result<Vec<Message>, String> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => {
                return Err(format!(
                    "message {i} has role `{other}`; expected `system`, `user` or `assistant`"
                ));
            }
        };
        out.push(Message::new(role, m.content));
    }
    let turns = match out.first() {
        Some(m) if m.role == Role::System => &out[1..],
        _ => &out[..],
    };
    let offset = out.len() - turns.len();
    for (i, m) in turns.iter().enumerate() {
        let want = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        if m.role != want {
            return Err(format!(
                "message {} has role `{}` where `{}` was expected (optional system message, then user and assistant alternating)",
                i + offset,
                m.role.as_str(),
                want.as_str()
            ));
        }
    }
    if turns.last().map(|m| m.role) != Some(Role::Assistant) {
        return Err("no assistant answer: the last message must have role `assistant`".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    const GOOD: &str = r#"{"messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A"}],"program":"p","input":"","expected_output":"A","metadata":{"seed":3}}"#;

    #[test]
    fn reads_generate_records() {
        let f = file(&format!("{GOOD}\n\n{GOOD}\n"));
        let r = read_records(f.path()).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].line, 3);
        assert_eq!(r[0].prompt(), &[Message::new(Role::User, "Q")]);
        assert_eq!(r[0].answer(), "A");
        assert_eq!(r[0].expected_output.as_deref(), Some("A"));
        assert_eq!(r[0].metadata["seed"], 3);
    }

    fn error(text: &str) -> String {
        let f = file(text);
        let e = read_records(f.path()).unwrap_err().to_string();
        assert!(e.contains(&f.path().display().to_string()), "{e}");
        assert!(e.contains("hint:"), "{e}");
        e
    }

    #[test]
    fn bad_json_names_the_line() {
        let e = error(&format!("{GOOD}\n{{not json\n"));
        assert!(e.contains("line 2") && e.contains("invalid record"), "{e}");
    }

    #[test]
    fn missing_answer() {
        let e = error(r#"{"messages":[{"role":"user","content":"Q"}]}"#);
        assert!(
            e.contains("line 1") && e.contains("no assistant answer"),
            "{e}"
        );
        let e = error(r#"{"messages":[]}"#);
        assert!(e.contains("no assistant answer"), "{e}");
    }

    #[test]
    fn wrong_roles() {
        let e = error(
            r#"{"messages":[{"role":"bot","content":"Q"},{"role":"assistant","content":"A"}]}"#,
        );
        assert!(e.contains("role `bot`"), "{e}");
        let e = error(
            r#"{"messages":[{"role":"assistant","content":"Q"},{"role":"user","content":"A"}]}"#,
        );
        assert!(e.contains("message 0 has role `assistant`"), "{e}");
        let f = file(
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q"},{"role":"assistant","content":"A"}]}"#,
        );
        assert_eq!(read_records(f.path()).unwrap()[0].prompt().len(), 2);
    }

    #[test]
    fn missing_messages_field() {
        let e = error(r#"{"program":"p"}"#);
        assert!(e.contains("missing field `messages`"), "{e}");
    }

    #[test]
    fn missing_file() {
        let e = read_records(Path::new("/no/such/train.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/no/such/train.jsonl") && e.contains("hint:"),
            "{e}"
        );
    }
}
