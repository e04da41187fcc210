//! Training records: the JSONL files `generate` writes, and the chat
//! formats users bring from other tools.
//!
//! Owns reading and validating one record a line: `messages` (optional
//! system message, then alternating user and assistant turns, ending with
//! the assistant's answer) plus `expected_output` and `metadata`, kept for
//! eval and reports. Other fields (`program`, `input`) are in the prompt
//! already and are skipped. Each line may instead be in one of the formats
//! SFT data comes in elsewhere ([`Format`]): ShareGPT's `conversations`,
//! Alpaca's `instruction`/`input`/`output`, or TRL's `prompt`/`completion`;
//! every one becomes the same messages. Errors name the file and line,
//! with a hint.

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

/// The chat formats a line may be in, told apart by their keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"messages": [{"role", "content"}, ...]}`: ours, OpenAI's and
    /// TRL's conversational format.
    Messages,
    /// `{"conversations": [{"from": "human"|"gpt"|"system", "value"}, ...]}`.
    ShareGpt,
    /// `{"instruction", "input" (optional), "output", "system" (optional)}`.
    Alpaca,
    /// `{"prompt", "completion"}`, each a string or a list of messages.
    PromptCompletion,
}

impl Format {
    /// The format of a line's object, by its keys.
    fn of(row: &serde_json::Map<String, serde_json::Value>) -> Option<Self> {
        if row.contains_key("messages") {
            Some(Format::Messages)
        } else if row.contains_key("conversations") {
            Some(Format::ShareGpt)
        } else if row.contains_key("instruction") && row.contains_key("output") {
            Some(Format::Alpaca)
        } else if row.contains_key("prompt") && row.contains_key("completion") {
            Some(Format::PromptCompletion)
        } else {
            None
        }
    }
}

/// A line in another tool's format as our `messages`.
fn to_messages(
    format: Format,
    row: &serde_json::Map<String, serde_json::Value>,
) -> std::result::Result<Vec<RawMessage>, String> {
    let text = |key: &str| -> std::result::Result<String, String> {
        match row.get(key) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            None | Some(serde_json::Value::Null) => Ok(String::new()),
            Some(other) => Err(format!("`{key}` must be text, not {other}")),
        }
    };
    let listed = |v: &serde_json::Value,
                  what: &str|
     -> std::result::Result<Vec<RawMessage>, String> {
        let list: Vec<RawMessage> = serde_json::from_value(v.clone()).map_err(|e| {
            format!("`{what}` must be text or a list of {{\"role\", \"content\"}} messages: {e}")
        })?;
        Ok(list)
    };
    let m = |role: &str, content: String| RawMessage {
        role: role.to_owned(),
        content,
    };
    match format {
        Format::Messages => unreachable!("read as a Row"),
        Format::ShareGpt => {
            let turns = row["conversations"]
                .as_array()
                .ok_or("`conversations` must be a list of {\"from\", \"value\"} turns")?;
            turns
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let from = t["from"]
                        .as_str()
                        .ok_or(format!("turn {i} has no `from`"))?;
                    let value = t["value"]
                        .as_str()
                        .ok_or(format!("turn {i} has no text `value`"))?;
                    let role = match from {
                        "human" | "user" => "user",
                        "gpt" | "assistant" | "model" => "assistant",
                        "system" => "system",
                        other => {
                            return Err(format!(
                                "turn {i} is from `{other}`; expected `human`, `gpt` or `system`"
                            ));
                        }
                    };
                    Ok(m(role, value.to_owned()))
                })
                .collect()
        }
        Format::Alpaca => {
            let (instruction, input) = (text("instruction")?, text("input")?);
            let mut out = Vec::new();
            let system = text("system")?;
            if !system.is_empty() {
                out.push(m("system", system));
            }
            let user = match input.is_empty() {
                true => instruction,
                false => format!("{instruction}\n\n{input}"),
            };
            out.push(m("user", user));
            out.push(m("assistant", text("output")?));
            Ok(out)
        }
        Format::PromptCompletion => {
            let mut out = match &row["prompt"] {
                serde_json::Value::String(s) => vec![m("user", s.clone())],
                v => listed(v, "prompt")?,
            };
            match &row["completion"] {
                serde_json::Value::String(s) => out.push(m("assistant", s.clone())),
                v => out.extend(listed(v, "completion")?),
            }
            Ok(out)
        }
    }
}

const HINT: &str = "each line must be a chat: {\"messages\": [{\"role\": \"user\", \"content\": ...}, {\"role\": \"assistant\", \"content\": ...}], ...} as `trace-train generate` writes, or ShareGPT's {\"conversations\": [{\"from\": \"human\", \"value\": ...}, ...]}, Alpaca's {\"instruction\", \"input\", \"output\"} or {\"prompt\", \"completion\"}; fix or remove the line";

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
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&buf).map_err(|e| err(format!("invalid record: {e}")))?;
        let row: Row = match Format::of(&object) {
            Some(Format::Messages) | None => serde_json::from_value(object.into())
                .map_err(|e| err(format!("invalid record: {e}")))?,
            Some(format) => Row {
                messages: to_messages(format, &object).map_err(err)?,
                expected_output: object
                    .get("expected_output")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned),
                metadata: object.get("metadata").cloned().unwrap_or_default(),
            },
        };
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

    /// ShareGPT, Alpaca and prompt-completion lines read as the same chat
    /// our `messages` give.
    #[test]
    fn other_tools_formats_become_messages() {
        let f = file(concat!(
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q\n\nI"},{"role":"assistant","content":"A"}]}"#,
            "\n",
            r#"{"conversations":[{"from":"system","value":"S"},{"from":"human","value":"Q\n\nI"},{"from":"gpt","value":"A"}]}"#,
            "\n",
            r#"{"system":"S","instruction":"Q","input":"I","output":"A"}"#,
            "\n",
            r#"{"prompt":[{"role":"system","content":"S"},{"role":"user","content":"Q\n\nI"}],"completion":[{"role":"assistant","content":"A"}]}"#,
            "\n",
            r#"{"prompt":"Q","completion":"A"}"#,
            "\n",
            r#"{"instruction":"Q","input":"","output":"A"}"#,
            "\n",
        ));
        let r = read_records(f.path()).unwrap();
        assert_eq!(r.len(), 6);
        for other in &r[1..4] {
            assert_eq!(other.messages, r[0].messages, "line {}", other.line);
        }
        for short in &r[4..] {
            assert_eq!(
                short.messages,
                vec![
                    Message::new(Role::User, "Q"),
                    Message::new(Role::Assistant, "A")
                ],
                "line {}",
                short.line
            );
        }
        // A ShareGPT turn from someone unknown is named with its line.
        let f = file(r#"{"conversations":[{"from":"bot","value":"Q"}]}"#);
        let e = read_records(f.path()).unwrap_err().to_string();
        assert!(
            e.contains("line 1") && e.contains("`bot`") && e.contains("ShareGPT"),
            "{e}"
        );
    }

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
