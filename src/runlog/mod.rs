//! A training run's record: what every stage logs per step, where, and how
//! it is read back.
//!
//! One entry point, [`RunLog::log`] (a step and its named scalars), writes
//! the step twice in the run folder: a line of `metrics.jsonl` (the record
//! the project reads back) and an event in a TensorBoard event file
//! ([`tfevents`]) that TensorBoard, W&B's TensorBoard sync and trackio's
//! importer read. A scalar named `eval_X` gets the tag `eval/X`, any other
//! `NAME` the tag `train/NAME`, so a stage logs with the same names it
//! writes to JSONL.
//!
//! Resume: [`RunLog::open`] with the step a run resumes at keeps the JSONL
//! lines up to it, deletes the event files and writes one new event file
//! from the kept lines; the redone steps then follow in order. No reader
//! sees a step twice or a step lost, whatever its rules for out-of-order
//! steps, and `metrics.jsonl` stays the one source both are made from.
//!
//! [`curves`] draws a run's curves as PNG and SVG; [`Summary`] is what
//! `trace-train report` prints.

pub mod curves;
pub mod tfevents;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use tfevents::{Event, EventWriter};

/// The metrics file of a run folder.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// Keys of a metrics line that are not scalars of the run.
const STEP: &str = "step";
const WALL_TIME: &str = "wall_time";

/// The TensorBoard tag of a scalar logged as `name`.
pub fn tag(name: &str) -> String {
    match name.strip_prefix("eval_") {
        Some(rest) => format!("eval/{rest}"),
        None => format!("train/{name}"),
    }
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub step: u64,
    /// Seconds since the Unix epoch when the step was logged (absent in
    /// files written before it was recorded).
    pub wall_time: Option<f64>,
    /// Every other numeric field; `null` (a non-finite value) reads as NaN.
    pub values: BTreeMap<String, f64>,
}

impl Record {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }
}

/// The open log of one run folder.
pub struct RunLog {
    jsonl: File,
    jsonl_path: PathBuf,
    events: EventWriter,
}

impl RunLog {
    /// Opens the log of `dir`. `resume_at: None` starts it over (earlier
    /// metrics and event files are removed); `Some(step)` keeps what was
    /// logged up to `step` and drops the rest (see the module header).
    pub fn open(dir: &Path, resume_at: Option<u64>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create folder `{}`", dir.display()))?;
        let jsonl_path = dir.join(METRICS_FILE);
        let kept = match resume_at {
            None => {
                remove_if_present(&jsonl_path)?;
                Vec::new()
            }
            Some(step) => {
                let kept = kept_on_resume(&jsonl_path, step)?;
                let text: String = kept.iter().map(|r| format!("{}\n", line(r))).collect();
                crate::atomic::write(&jsonl_path, text.as_bytes())?;
                kept
            }
        };
        // The event files are rebuilt from the JSONL: removed first, so a
        // crash in between leaves them missing (the next open rebuilds
        // them), never doubled.
        for f in tfevents::event_files(dir)? {
            remove_if_present(&f)?;
        }
        let mut events = EventWriter::create(dir, now())?;
        for r in &kept {
            events.write(&event(r, r.wall_time.unwrap_or_else(now)))?;
        }
        let jsonl = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&jsonl_path)
            .with_context(|| format!("cannot write `{}`", jsonl_path.display()))?;
        Ok(RunLog {
            jsonl,
            jsonl_path,
            events,
        })
    }

    /// Logs `scalars` at `step`: a JSONL line and a TensorBoard event.
    pub fn log(&mut self, step: u64, scalars: &[(&str, f64)]) -> anyhow::Result<()> {
        let r = Record {
            step,
            wall_time: Some(now()),
            values: scalars.iter().map(|&(k, v)| (k.to_owned(), v)).collect(),
        };
        writeln!(self.jsonl, "{}", line(&r))
            .and_then(|()| self.jsonl.flush())
            .with_context(|| format!("cannot write `{}`", self.jsonl_path.display()))?;
        self.events
            .write(&event(&r, r.wall_time.unwrap_or_default()))
    }

    /// The event file this log writes.
    pub fn event_file(&self) -> &Path {
        self.events.path()
    }
}

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove `{}`", path.display()))
        }
        _ => Ok(()),
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn event(r: &Record, wall_time: f64) -> Event {
    let tags: Vec<(String, f64)> = r.values.iter().map(|(k, &v)| (tag(k), v)).collect();
    Event::scalars(
        wall_time,
        r.step,
        tags.iter().map(|(t, v)| (t.as_str(), *v)),
    )
}

/// A record as a JSON line: integral values as integers (step counts,
/// token counts stay `12`, not `12.0`), non-finite ones as `null`.
fn line(r: &Record) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert(STEP.into(), r.step.into());
    if let Some(t) = r.wall_time {
        m.insert(WALL_TIME.into(), t.into());
    }
    for (k, &v) in &r.values {
        let value = if v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e15 {
            serde_json::Value::from(v as i64)
        } else {
            serde_json::Value::from(v) // NaN and infinities become null
        };
        m.insert(k.clone(), value);
    }
    serde_json::Value::Object(m)
}

/// Every line of a metrics file. A line that is not a JSON object with a
/// `step` is an error naming the file and line.
pub fn read_metrics(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            parse_line(l).map_err(|what| {
                anyhow::anyhow!(
                    "`{}`: line {}: {what}\nhint: each line must be a JSON object with a numeric `step`, as the training stages write them",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

/// The lines of a metrics file a resume keeps: those up to `step`. A line
/// that does not parse is dropped with the steps being redone: a run killed
/// while writing leaves half a line at the end.
fn kept_on_resume(path: &Path, step: u64) -> anyhow::Result<Vec<Record>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read `{}`", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| parse_line(l).ok())
        .filter(|r| r.step <= step)
        .collect())
}

fn parse_line(l: &str) -> Result<Record, String> {
    let v: serde_json::Value = serde_json::from_str(l).map_err(|e| format!("not JSON ({e})"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let step = obj
        .get(STEP)
        .and_then(serde_json::Value::as_u64)
        .ok_or("no numeric `step`")?;
    let mut values = BTreeMap::new();
    let mut wall_time = None;
    for (k, v) in obj {
        let x = match v {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::Null => Some(f64::NAN),
            _ => None, // text fields are not curves
        };
        match (k.as_str(), x) {
            (STEP, _) | (_, None) => {}
            (WALL_TIME, Some(t)) => wall_time = Some(t),
            (_, Some(x)) => {
                values.insert(k.clone(), x);
            }
        }
    }
    Ok(Record {
        step,
        wall_time,
        values,
    })
}

/// What `trace-train report` prints about one run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    pub dir: PathBuf,
    /// Lines logged, and the first and last step.
    pub lines: usize,
    pub first_step: u64,
    pub last_step: u64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    /// The lowest loss and its step.
    pub best_loss: Option<(u64, f64)>,
    pub last_eval_loss: Option<f64>,
    pub best_eval_loss: Option<(u64, f64)>,
    /// An RL run's mean reward a step: first, last, and the highest with
    /// its step.
    pub first_reward: Option<f64>,
    pub last_reward: Option<f64>,
    pub best_reward: Option<(u64, f64)>,
    /// An RL run's share of exactly right answers, first and last step.
    pub first_accuracy: Option<f64>,
    pub last_accuracy: Option<f64>,
    /// Mean of the steps' `tokens_per_s`.
    pub mean_tokens_per_s: Option<f64>,
    /// Seconds from the first logged step to the last (across resumes).
    pub seconds: Option<f64>,
    /// Every scalar name logged.
    pub scalars: Vec<String>,
}

impl Summary {
    /// Summarises `records` (the lines of `dir`'s metrics file); `None`
    /// when there are none.
    pub fn new(dir: &Path, records: &[Record]) -> Option<Self> {
        let (first, last) = (records.first()?, records.last()?);
        let series = |name: &str| -> Vec<(u64, f64)> {
            records
                .iter()
                .filter_map(|r| r.get(name).filter(|v| v.is_finite()).map(|v| (r.step, v)))
                .collect()
        };
        let best = |s: &[(u64, f64)]| s.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1));
        let highest = |s: &[(u64, f64)]| s.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1));
        let loss = series("loss");
        let reward = series("reward");
        let accuracy = series("accuracy");
        let eval = series("eval_loss");
        let tps = series("tokens_per_s");
        let times: Vec<f64> = records.iter().filter_map(|r| r.wall_time).collect();
        let mut scalars: Vec<String> = records
            .iter()
            .flat_map(|r| r.values.keys().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        scalars.sort();
        Some(Summary {
            dir: dir.to_owned(),
            lines: records.len(),
            first_step: first.step,
            last_step: last.step,
            first_loss: loss.first().map(|x| x.1),
            last_loss: loss.last().map(|x| x.1),
            best_loss: best(&loss),
            last_eval_loss: eval.last().map(|x| x.1),
            best_eval_loss: best(&eval),
            first_reward: reward.first().map(|x| x.1),
            last_reward: reward.last().map(|x| x.1),
            best_reward: highest(&reward),
            first_accuracy: accuracy.first().map(|x| x.1),
            last_accuracy: accuracy.last().map(|x| x.1),
            mean_tokens_per_s: (!tps.is_empty())
                .then(|| tps.iter().map(|x| x.1).sum::<f64>() / tps.len() as f64),
            seconds: match (times.first(), times.last()) {
                (Some(a), Some(b)) => Some(b - a),
                _ => None,
            },
            scalars,
        })
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let num = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.4}"));
        let at = |x: Option<(u64, f64)>| {
            x.map_or_else(|| "-".to_owned(), |(s, v)| format!("{v:.4} (step {s})"))
        };
        writeln!(f, "{}", self.dir.display())?;
        writeln!(
            f,
            "  steps       {}..{} ({} logged)",
            self.first_step, self.last_step, self.lines
        )?;
        // What the run is judged by: a training loss, an RL run's reward
        // and accuracy; a line only for what was logged.
        let rl = self.last_reward.is_some();
        if !rl || self.last_loss.is_some() {
            writeln!(
                f,
                "  loss        first {}  last {}  best {}",
                num(self.first_loss),
                num(self.last_loss),
                at(self.best_loss)
            )?;
        }
        if rl {
            writeln!(
                f,
                "  reward      first {}  last {}  best {}",
                num(self.first_reward),
                num(self.last_reward),
                at(self.best_reward)
            )?;
        }
        if self.last_accuracy.is_some() {
            writeln!(
                f,
                "  accuracy    first {}  last {}",
                num(self.first_accuracy),
                num(self.last_accuracy)
            )?;
        }
        if !rl || self.last_eval_loss.is_some() {
            writeln!(
                f,
                "  eval loss   last {}  best {}",
                num(self.last_eval_loss),
                at(self.best_eval_loss)
            )?;
        }
        writeln!(
            f,
            "  tokens/s    {}",
            self.mean_tokens_per_s
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1} (mean of the steps)"))
        )?;
        writeln!(
            f,
            "  time        {}",
            self.seconds.map_or_else(
                || "-".to_owned(),
                |s| format!("{s:.1} s from the first logged step to the last")
            )
        )?;
        write!(f, "  scalars     {}", self.scalars.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_in_events(dir: &Path) -> Vec<i64> {
        tfevents::event_files(dir)
            .unwrap()
            .iter()
            .flat_map(|f| tfevents::read_events(f).unwrap())
            .filter(|e| !e.values().is_empty())
            .map(|e| e.step)
            .collect()
    }

    #[test]
    fn log_writes_jsonl_and_events_with_the_same_steps() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RunLog::open(dir.path(), None).unwrap();
        for step in 1..=4u64 {
            let mut scalars = vec![("loss", 1.0 / step as f64), ("answer_tokens", 12.0)];
            if step % 2 == 0 {
                scalars.push(("eval_loss", 0.5));
            }
            log.log(step, &scalars).unwrap();
        }
        let records = read_metrics(&dir.path().join(METRICS_FILE)).unwrap();
        assert_eq!(records.len(), 4);
        assert_eq!(records[1].get("eval_loss"), Some(0.5));
        let text = std::fs::read_to_string(dir.path().join(METRICS_FILE)).unwrap();
        assert!(text.contains("\"answer_tokens\":12,"), "{text}");
        let events = tfevents::read_events(log.event_file()).unwrap();
        assert_eq!(
            events[2].values(),
            vec![
                ("train/answer_tokens", 12.0),
                ("eval/loss", 0.5),
                ("train/loss", 0.5)
            ]
        );
        assert_eq!(steps_in_events(dir.path()), vec![1, 2, 3, 4]);
    }

    #[test]
    fn resume_keeps_steps_up_to_the_checkpoint_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RunLog::open(dir.path(), None).unwrap();
        for step in 1..=5 {
            log.log(step, &[("loss", step as f64)]).unwrap();
        }
        drop(log);
        // Killed while writing a line.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(METRICS_FILE))
            .unwrap();
        f.write_all(b"{\"step\": 6, \"lo").unwrap();
        // Resumed from a checkpoint at step 3: steps 4 and 5 are redone.
        let mut log = RunLog::open(dir.path(), Some(3)).unwrap();
        for step in 4..=6 {
            log.log(step, &[("loss", 10.0 * step as f64)]).unwrap();
        }
        let records = read_metrics(&dir.path().join(METRICS_FILE)).unwrap();
        let steps: Vec<u64> = records.iter().map(|r| r.step).collect();
        assert_eq!(steps, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(records[4].get("loss"), Some(50.0));
        assert_eq!(tfevents::event_files(dir.path()).unwrap().len(), 1);
        assert_eq!(steps_in_events(dir.path()), vec![1, 2, 3, 4, 5, 6]);
        // A fresh start forgets all of it.
        drop(log);
        RunLog::open(dir.path(), None).unwrap();
        assert!(
            read_metrics(&dir.path().join(METRICS_FILE))
                .unwrap()
                .is_empty()
        );
        assert!(steps_in_events(dir.path()).is_empty());
    }

    #[test]
    fn non_finite_values_are_null_in_jsonl_and_nan_in_events() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RunLog::open(dir.path(), None).unwrap();
        log.log(1, &[("loss", f64::NAN)]).unwrap();
        let text = std::fs::read_to_string(dir.path().join(METRICS_FILE)).unwrap();
        assert!(text.contains("\"loss\":null"), "{text}");
        let r = read_metrics(&dir.path().join(METRICS_FILE)).unwrap();
        assert!(r[0].get("loss").unwrap().is_nan());
        let ev = tfevents::read_events(log.event_file()).unwrap();
        assert!(ev[1].values()[0].1.is_nan());
    }

    #[test]
    fn a_bad_metrics_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(METRICS_FILE);
        std::fs::write(&p, "{\"step\": 1}\n{\"loss\": 2}\n").unwrap();
        let e = read_metrics(&p).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("step") && e.contains("hint:"),
            "{e}"
        );
    }

    #[test]
    fn summary_reports_first_last_best() {
        let rec = |step, loss: f64, eval: Option<f64>, t| Record {
            step,
            wall_time: Some(t),
            values: [
                ("loss".to_owned(), loss),
                ("tokens_per_s".to_owned(), 100.0),
            ]
            .into_iter()
            .chain(eval.map(|e| ("eval_loss".to_owned(), e)))
            .collect(),
        };
        let rs = vec![
            rec(1, 3.0, None, 10.0),
            rec(2, 1.0, Some(2.0), 11.0),
            rec(3, 2.0, Some(1.5), 14.0),
        ];
        let s = Summary::new(Path::new("run"), &rs).unwrap();
        assert_eq!(
            (s.first_loss, s.last_loss, s.best_loss),
            (Some(3.0), Some(2.0), Some((2, 1.0)))
        );
        assert_eq!(
            (s.last_eval_loss, s.best_eval_loss),
            (Some(1.5), Some((3, 1.5)))
        );
        assert_eq!((s.mean_tokens_per_s, s.seconds), (Some(100.0), Some(4.0)));
        assert!(s.to_string().contains("best 1.0000 (step 2)"), "{s}");
    }
}
