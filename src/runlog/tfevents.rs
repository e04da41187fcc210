//! TensorBoard event files: `Event` protobufs in TFRecord framing, the
//! format TensorBoard, W&B's TensorBoard sync and trackio's importer read.
//!
//! A record is `u64 length (LE) | u32 masked CRC32C of the length bytes |
//! data | u32 masked CRC32C of the data`, the mask being TensorFlow's
//! `((crc >> 15) | (crc << 17)) + 0xa282ead8`. A file starts with an event
//! holding only `file_version = "brain.Event:2"`; every later event carries
//! `wall_time`, `step` and a `summary` of `{tag, simple_value}` pairs.
//!
//! The messages are the few fields of TensorFlow's `event.proto` and
//! `summary.proto` that scalars use, declared here with prost's derive
//! (field numbers as in those files) rather than generated from the .proto
//! files, which would need protoc at build time. `simple_value` sits in its
//! oneof, as upstream: a plain proto3 float would not be written when it is
//! 0.0, and readers skip a value whose oneof is unset.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use prost::Message;

/// The version string every event file starts with.
pub const FILE_VERSION: &str = "brain.Event:2";

/// The part of an event file's name readers look for.
pub const NAME_MARK: &str = "tfevents";

/// `tensorflow.Event`, scalar-summary subset.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    pub what: Option<What>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`, scalar case.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(oneof = "Kind", tags = "2")]
    pub kind: Option<Kind>,
}

/// `Summary.Value.value`, scalar case.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
}

impl Event {
    /// The first event of a file.
    pub fn file_version(wall_time: f64) -> Self {
        Event {
            wall_time,
            step: 0,
            what: Some(What::FileVersion(FILE_VERSION.to_owned())),
        }
    }

    /// Scalars at one step.
    pub fn scalars<'a>(
        wall_time: f64,
        step: u64,
        values: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> Self {
        Event {
            wall_time,
            step: step as i64,
            what: Some(What::Summary(Summary {
                value: values
                    .into_iter()
                    .map(|(tag, v)| SummaryValue {
                        tag: tag.to_owned(),
                        kind: Some(Kind::SimpleValue(v as f32)),
                    })
                    .collect(),
            })),
        }
    }

    /// The `(tag, value)` pairs of a scalar summary (none for other events).
    pub fn values(&self) -> Vec<(&str, f32)> {
        match &self.what {
            Some(What::Summary(s)) => s
                .value
                .iter()
                .filter_map(|v| {
                    v.kind
                        .as_ref()
                        .map(|&Kind::SimpleValue(x)| (v.tag.as_str(), x))
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// TensorFlow's masked CRC32C: a CRC stored beside the data it covers is
/// rotated and offset so that CRCs of CRCs do not degenerate.
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// An event file being appended to; each event is flushed as written, so
/// a live TensorBoard sees every step.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir/events.out.tfevents.<seconds>.<host>.<pid>.0` (the
    /// name TensorFlow gives its files) and writes the version event.
    pub fn create(dir: &Path, wall_time: f64) -> anyhow::Result<Self> {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| !h.is_empty() && !h.contains('/'))
            .unwrap_or_else(|| "localhost".to_owned());
        let path = dir.join(format!(
            "events.out.{NAME_MARK}.{:010}.{host}.{}.0",
            wall_time as u64,
            std::process::id()
        ));
        let file =
            File::create(&path).with_context(|| format!("cannot create `{}`", path.display()))?;
        let mut w = EventWriter {
            out: BufWriter::new(file),
            path,
        };
        w.write(&Event::file_version(wall_time))?;
        Ok(w)
    }

    pub fn write(&mut self, event: &Event) -> anyhow::Result<()> {
        self.out
            .write_all(&frame(&event.encode_to_vec()))
            .and_then(|()| self.out.flush())
            .with_context(|| format!("cannot write `{}`", self.path.display()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether `path` names an event file.
pub fn is_event_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("events.out.") && n.contains(NAME_MARK))
}

/// The event files directly in `dir`, by name.
pub fn event_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(e).with_context(|| format!("cannot list `{}`", dir.display())),
    };
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot list `{}`", dir.display()))?
            .path();
        if is_event_file(&path) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Every event of a file, checking both CRCs of every record. A record cut
/// short at the end (a writer killed mid-record) ends the file, as in
/// TensorBoard's reader; a bad CRC is an error naming the record.
pub fn read_events(path: &Path) -> anyhow::Result<Vec<Event>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let mut events = Vec::new();
    let mut at = 0usize;
    while bytes.len() - at >= 12 {
        let len_bytes = &bytes[at..at + 8];
        let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
        if masked_crc(len_bytes) != len_crc {
            bail!(
                "`{}`: record {} at byte {at}: the length's CRC does not match\nhint: the file is damaged; `metrics.jsonl` beside it holds the same steps",
                path.display(),
                events.len()
            );
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let start = at + 12;
        let Some(end) = start.checked_add(len).filter(|&e| e + 4 <= bytes.len()) else {
            break; // cut short
        };
        let data = &bytes[start..end];
        let crc = u32::from_le_bytes(bytes[end..end + 4].try_into().expect("4 bytes"));
        if masked_crc(data) != crc {
            bail!(
                "`{}`: record {} at byte {at}: the data's CRC does not match\nhint: the file is damaged",
                path.display(),
                events.len()
            );
        }
        events.push(Event::decode(data).with_context(|| {
            format!(
                "`{}`: record {} is not an Event",
                path.display(),
                events.len()
            )
        })?);
        at = end + 4;
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_its_mask_match_known_values() {
        // The CRC-32C check value (RFC 3720, appendix B.4 lists the
        // polynomial; "123456789" is the catalogue's check input).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            masked_crc(b"123456789"),
            0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }

    /// Bytes written by TensorBoard's own Python writer (tensorboard 2.21)
    /// for the two events below, made with:
    ///
    /// ```python
    /// import io
    /// from tensorboard.compat.proto import event_pb2, summary_pb2
    /// from tensorboard.summary.writer.record_writer import RecordWriter
    /// def rec(ev):
    ///     b = io.BytesIO(); RecordWriter(b).write(ev.SerializeToString()); return b.getvalue().hex()
    /// print(rec(event_pb2.Event(wall_time=1.5, step=0, file_version="brain.Event:2")))
    /// V = summary_pb2.Summary.Value
    /// print(rec(event_pb2.Event(wall_time=2.25, step=7, summary=summary_pb2.Summary(
    ///     value=[V(tag="train/loss", simple_value=0.5), V(tag="eval/loss", simple_value=0.0)]))))
    /// ```
    #[test]
    fn records_match_tensorboards_writer_byte_for_byte() {
        let version = Event::file_version(1.5);
        let scalars = Event::scalars(2.25, 7, [("train/loss", 0.5), ("eval/loss", 0.0)]);
        let want_version =
            "1800000000000000a37f4b2209000000000000f83f1a0d627261696e2e4576656e743a322a28646c";
        let want_scalars = "3200000000000000241956ec09000000000000024010072a250a110a0a747261696e2f6c6f7373150000003f0a100a096576616c2f6c6f737315000000003cc66536";
        assert_eq!(crate::hex(&frame(&version.encode_to_vec())), want_version);
        assert_eq!(crate::hex(&frame(&scalars.encode_to_vec())), want_scalars);
    }

    #[test]
    fn written_events_read_back_and_damage_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path(), 1000.0).unwrap();
        w.write(&Event::scalars(1001.0, 1, [("a", 1.0), ("b", 0.0)]))
            .unwrap();
        w.write(&Event::scalars(1002.0, 2, [("a", 0.5)])).unwrap();
        let path = w.path().to_owned();
        drop(w);
        assert_eq!(event_files(dir.path()).unwrap(), vec![path.clone()]);
        let ev = read_events(&path).unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].what, Some(What::FileVersion(FILE_VERSION.into())));
        assert_eq!(ev[1].values(), vec![("a", 1.0), ("b", 0.0)]);
        assert_eq!((ev[2].step, ev[2].wall_time), (2, 1002.0));

        let mut bytes = std::fs::read(&path).unwrap();
        // A record cut short ends the file.
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert_eq!(read_events(&path).unwrap().len(), 2);
        // A flipped data byte is an error.
        let n = bytes.len() - 6;
        bytes[n] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = read_events(&path).unwrap_err().to_string();
        assert!(e.contains("record 2") && e.contains("CRC"), "{e}");
    }
}
