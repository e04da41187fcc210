//! Streaming JSONL rows with `program`, `inputs` and `output`.
//!
//! Real rows carry large fields the task does not use (3.29 GB for 23,303
//! rows): each line is read into one reused buffer and only the three fields
//! are deserialized; everything else is skipped without being stored.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use super::{RowError, SourceRow};

#[derive(Deserialize)]
struct Row {
    program: String,
    inputs: String,
    #[serde(default)]
    output: Option<String>,
}

pub struct JsonlRows {
    path: PathBuf,
    reader: BufReader<File>,
    buf: Vec<u8>,
    line: u64,
    index: u64,
}

impl JsonlRows {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let f = File::open(path)
            .with_context(|| format!("cannot open dataset `{}`", path.display()))?;
        Ok(JsonlRows {
            path: path.to_owned(),
            reader: BufReader::with_capacity(1 << 20, f),
            buf: Vec::new(),
            line: 0,
            index: 0,
        })
    }

    fn error(&self, message: String, hint: &str) -> RowError {
        RowError {
            file: self.path.clone(),
            line: self.line,
            message,
            hint: hint.into(),
        }
    }
}

const SKIP_HINT: &str = "fix or remove the line, or pass --skip_bad to count and skip bad lines";

impl Iterator for JsonlRows {
    type Item = Result<SourceRow, RowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => {
                    self.line += 1;
                    return Some(Err(self.error(format!("read error: {e}"), "check the file")));
                }
            }
            self.line += 1;
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let index = self.index;
            self.index += 1;
            if let Err(e) = std::str::from_utf8(&self.buf) {
                return Some(Err(self.error(
                    format!("not valid UTF-8 (byte {} of the line)", e.valid_up_to()),
                    SKIP_HINT,
                )));
            }
            let row: Row = match serde_json::from_slice(&self.buf) {
                Ok(r) => r,
                Err(e) => {
                    let msg = e.to_string();
                    let hint = if msg.contains("missing field") {
                        "every row needs `program` and `inputs` (strings) and may have `output`; or pass --skip_bad"
                    } else {
                        SKIP_HINT
                    };
                    return Some(Err(self.error(format!("invalid row: {msg}"), hint)));
                }
            };
            // Large buffers are not kept between rows.
            if self.buf.capacity() > 4 << 20 {
                self.buf = Vec::new();
            }
            return Some(Ok(SourceRow {
                index,
                name: format!("line {}", self.line),
                program: row.program,
                inputs: row.inputs,
                output: row.output,
            }));
        }
    }
}

/// Non-blank lines, counted without parsing.
pub fn count_rows(path: &Path) -> anyhow::Result<u64> {
    let f =
        File::open(path).with_context(|| format!("cannot open dataset `{}`", path.display()))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut n = 0;
    let mut blank = true;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        for &b in buf {
            if b == b'\n' {
                if !blank {
                    n += 1;
                }
                blank = true;
            } else if !b.is_ascii_whitespace() {
                blank = false;
            }
        }
        let len = buf.len();
        r.consume(len);
    }
    if !blank {
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text).unwrap();
        f
    }

    #[test]
    fn reads_rows_and_ignores_extra_fields() {
        let f = file(b"{\"program\":\"print(1)\",\"inputs\":\"\",\"output\":\"1\",\"big\":[1,2,{\"x\":\"y\"}]}\n\n{\"program\":\"p\",\"inputs\":\"i\"}");
        let rows: Vec<_> = JsonlRows::open(f.path())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].output.as_deref(), Some("1"));
        assert_eq!(rows[1].index, 1);
        assert_eq!(rows[1].name, "line 3");
        assert_eq!(count_rows(f.path()).unwrap(), 2);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let f = file(b"{\"program\":\"p\",\"inputs\":\"\"}\n{\"program\": \"p\"}\n{broken\n");
        let rows: Vec<_> = JsonlRows::open(f.path()).unwrap().collect();
        let e = rows[1].as_ref().unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("inputs") && e.contains("hint:"),
            "{e}"
        );
        assert!(e.contains(&f.path().display().to_string()), "{e}");
        let e = rows[2].as_ref().unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("--skip_bad"), "{e}");
    }

    #[test]
    fn non_utf8_is_named() {
        let f = file(b"{\"program\":\"\xff\",\"inputs\":\"\"}\n");
        let e = JsonlRows::open(f.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid UTF-8") && e.contains("line 1"), "{e}");
    }
}
