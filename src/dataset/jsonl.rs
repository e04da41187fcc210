//! Streaming JSONL rows with `program`, `inputs` and `output`.
//!
//! Real rows carry large fields the task does not use (3.29 GB for 23,303
//! rows): each line is read into one reused buffer and only the three fields
//! are deserialized; everything else is skipped without being stored. A
//! file whose name ends in `.gz` is read through gzip as it streams.

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
    /// A string `id`, when the rows are named by it; any other `id` is
    /// skipped.
    #[serde(default, deserialize_with = "string_or_skip")]
    id: Option<String>,
}

fn string_or_skip<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Text(String),
        Other(serde::de::IgnoredAny),
    }
    Ok(match Id::deserialize(d)? {
        Id::Text(s) => Some(s),
        Id::Other(_) => None,
    })
}

/// A dataset file's bytes: plain, or gunzipped when its name ends in `.gz`.
fn reader(path: &Path) -> anyhow::Result<Box<dyn BufRead + Send>> {
    let f =
        File::open(path).with_context(|| format!("cannot open dataset `{}`", path.display()))?;
    Ok(if path.extension().is_some_and(|e| e == "gz") {
        Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::read::MultiGzDecoder::new(BufReader::new(f)),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, f))
    })
}

pub struct JsonlRows {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    buf: Vec<u8>,
    line: u64,
    index: u64,
    /// Name rows by their string `id` field (else `line N`).
    names_from_id: bool,
}

impl JsonlRows {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        Ok(JsonlRows {
            path: path.to_owned(),
            reader: reader(path)?,
            buf: Vec::new(),
            line: 0,
            index: 0,
            names_from_id: false,
        })
    }

    /// Rows named by their string `id` field where they have one.
    pub fn named_by_id(mut self) -> Self {
        self.names_from_id = true;
        self
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
            let name = match row.id {
                Some(id) if self.names_from_id => id,
                _ => format!("line {}", self.line),
            };
            return Some(Ok(SourceRow {
                index,
                name,
                program: row.program,
                inputs: row.inputs,
                output: row.output,
            }));
        }
    }
}

/// Non-blank lines, counted without parsing.
pub fn count_rows(path: &Path) -> anyhow::Result<u64> {
    let mut r = reader(path)?;
    let mut n = 0;
    let mut blank = true;
    loop {
        let buf = r
            .fill_buf()
            .with_context(|| format!("cannot read dataset `{}`", path.display()))?;
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
    fn gzip_files_stream_and_rows_may_be_named_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl.gz");
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::default(),
        );
        gz.write_all(b"{\"id\":\"a/1\",\"program\":\"print(1)\",\"inputs\":\"\",\"output\":\"1\"}\n\n{\"id\":7,\"program\":\"p\",\"inputs\":\"i\"}\n")
            .unwrap();
        gz.finish().unwrap();
        assert_eq!(count_rows(&path).unwrap(), 2);
        let rows: Vec<_> = JsonlRows::open(&path)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            (rows[0].name.as_str(), rows[1].name.as_str()),
            ("line 1", "line 3")
        );
        let rows: Vec<_> = JsonlRows::open(&path)
            .unwrap()
            .named_by_id()
            .collect::<Result<_, _>>()
            .unwrap();
        // A string id names the row; any other id is skipped.
        assert_eq!(
            (rows[0].name.as_str(), rows[1].name.as_str()),
            ("a/1", "line 3")
        );
        assert_eq!(rows[0].output.as_deref(), Some("1"));
        assert_eq!(rows[1].index, 1);
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
