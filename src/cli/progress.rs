//! How every subcommand shows [`Progress`] and its log on stderr. On a
//! terminal: a bar, and log lines in colour. Anywhere else (a log file,
//! Slurm, `nohup`, `tee`, a pipe): a plain line when the work starts, then
//! one at least every `--log_every` seconds while it runs (a clock of its
//! own prints it, so a long step still shows that the run is alive), and
//! one when it ends; no colour. With `--log_format json` every progress
//! line and log event is one JSON object.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use trace_train::progress::Progress;

/// How log and progress lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Lines for people (a bar on a terminal).
    #[default]
    Text,
    /// One JSON object a line, for log collectors.
    Json,
}

/// When log lines are coloured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Color {
    /// On a terminal, unless `NO_COLOR` is set.
    #[default]
    Auto,
    Always,
    Never,
}

impl Color {
    /// Whether stderr gets colour.
    pub fn on(self) -> bool {
        match self {
            Color::Always => true,
            Color::Never => false,
            Color::Auto => {
                std::io::stderr().is_terminal()
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            }
        }
    }
}

/// The process's output settings (set once by `main`).
#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub format: LogFormat,
    /// Seconds between progress lines when stderr is not a terminal.
    pub every: Duration,
}

/// Seconds between progress lines by default (`--log_every`).
pub const LOG_EVERY_S: f64 = 30.0;

static OUTPUT: OnceLock<Output> = OnceLock::new();

/// Sets the output settings for the process (the first call wins).
pub fn configure(output: Output) {
    let _ = OUTPUT.set(output);
}

fn output() -> Output {
    OUTPUT.get().copied().unwrap_or(Output {
        format: LogFormat::Text,
        every: Duration::from_secs_f64(LOG_EVERY_S),
    })
}

/// A stage's progress: a bar on a terminal, lines elsewhere.
pub enum Bar {
    Term(ProgressBar),
    Lines(Arc<Lines>),
}

impl Bar {
    /// Progress counted in `unit`s (`rows`, `step`).
    pub fn new(unit: &str) -> Self {
        let out = output();
        if out.format == LogFormat::Text && std::io::stderr().is_terminal() {
            let pb = ProgressBar::new(0);
            pb.set_style(
                ProgressStyle::with_template(&format!(
                    "{{spinner}} {unit} {{pos}}/{{len}} [{{elapsed_precise}}] {{bar:30}} ETA {{eta}} {{msg}}"
                ))
                .expect("valid template"),
            );
            Bar::Term(pb)
        } else {
            Bar::Lines(Lines::new(unit, out))
        }
    }
}

impl Progress for Bar {
    fn start(&self, total: Option<u64>, done: u64) {
        match self {
            Bar::Term(pb) => {
                if let Some(t) = total {
                    pb.set_length(t);
                }
                pb.set_position(done);
            }
            Bar::Lines(l) => l.start(total, done),
        }
    }
    fn set(&self, done: u64) {
        match self {
            Bar::Term(pb) => pb.set_position(done),
            Bar::Lines(l) => l.update(|s| s.done = done),
        }
    }
    fn advance(&self, n: u64) {
        match self {
            Bar::Term(pb) => pb.inc(n),
            Bar::Lines(l) => l.update(|s| s.done += n),
        }
    }
    fn status(&self, text: &str) {
        match self {
            Bar::Term(pb) => pb.set_message(text.to_owned()),
            Bar::Lines(l) => l.update(|s| s.status = text.to_owned()),
        }
    }
    fn finish(&self) {
        match self {
            Bar::Term(pb) => pb.finish_and_clear(),
            Bar::Lines(l) => l.finish(),
        }
    }
}

/// Progress as lines: what the last line said and when.
pub struct Lines {
    unit: String,
    out: Output,
    state: Mutex<State>,
}

#[derive(Clone, Debug)]
struct State {
    total: Option<u64>,
    done: u64,
    /// Units already done when the work started (a resumed run).
    first: u64,
    status: String,
    started: Instant,
    last_line: Option<Instant>,
    running: bool,
}

impl Lines {
    fn new(unit: &str, out: Output) -> Arc<Self> {
        Arc::new(Self {
            unit: unit.to_owned(),
            out,
            state: Mutex::new(State {
                total: None,
                done: 0,
                first: 0,
                status: String::new(),
                started: Instant::now(),
                last_line: None,
                running: false,
            }),
        })
    }

    fn start(self: &Arc<Self>, total: Option<u64>, done: u64) {
        {
            let mut s = self.state.lock().expect("progress state");
            s.total = total;
            s.done = done;
            s.first = done;
            s.started = Instant::now();
            s.running = true;
        }
        self.line("start");
        // The clock: a line every `every` even when no unit ends meanwhile.
        let weak: Weak<Self> = Arc::downgrade(self);
        let tick = self.out.every.min(Duration::from_secs(1));
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(tick);
                let Some(lines) = weak.upgrade() else { return };
                if !lines.state.lock().expect("progress state").running {
                    return;
                }
                if lines.due() {
                    lines.line("progress");
                }
            }
        });
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().expect("progress state"));
        if self.due() {
            self.line("progress");
        }
    }

    fn due(&self) -> bool {
        let s = self.state.lock().expect("progress state");
        s.running && s.last_line.is_none_or(|t| t.elapsed() >= self.out.every)
    }

    fn finish(&self) {
        let was_running = {
            let mut s = self.state.lock().expect("progress state");
            std::mem::replace(&mut s.running, false)
        };
        if was_running {
            self.line("end");
        }
    }

    /// Writes one line about now (`event`: start, progress or end).
    fn line(&self, event: &str) {
        let text = {
            let mut s = self.state.lock().expect("progress state");
            s.last_line = Some(Instant::now());
            render(&self.unit, event, &s, self.out.format)
        };
        // A line at once, whole: a log reader never sees half of one.
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{text}");
    }
}

/// The ETA in seconds: the rate so far over the units still to do.
fn eta(s: &State, elapsed: f64) -> Option<f64> {
    let total = s.total?;
    let did = s.done.saturating_sub(s.first);
    (did > 0).then(|| elapsed / did as f64 * total.saturating_sub(s.done) as f64)
}

pub(crate) fn clock(seconds: f64) -> String {
    let t = seconds.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
}

fn render(unit: &str, event: &str, s: &State, format: LogFormat) -> String {
    let elapsed = s.started.elapsed().as_secs_f64();
    let eta = eta(s, elapsed);
    match format {
        LogFormat::Json => serde_json::json!({
            "progress": unit,
            "event": event,
            "done": s.done,
            "total": s.total,
            "elapsed_s": (elapsed * 10.0).round() / 10.0,
            "eta_s": eta.map(|e| e.round()),
            "status": s.status,
        })
        .to_string(),
        LogFormat::Text => {
            let of = s.total.map(|t| format!("/{t}")).unwrap_or_default();
            let share = s
                .total
                .filter(|t| *t > 0)
                .map(|t| format!(" ({:.0}%)", 100.0 * s.done as f64 / t as f64))
                .unwrap_or_default();
            let eta = match (event, eta) {
                ("end", _) => String::new(),
                (_, Some(e)) => format!(", ETA {}", clock(e)),
                _ => String::new(),
            };
            let status = if s.status.is_empty() {
                String::new()
            } else {
                format!(" | {}", s.status)
            };
            format!(
                "[{unit} {}{of}{share}] {} {}{eta}{status}",
                s.done,
                if event == "end" { "done in" } else { "elapsed" },
                clock(elapsed)
            )
        }
    }
}

/// Log events as JSON lines (`--log_format json`): time (Unix seconds),
/// level, target and the event's fields, `message` among them.
pub struct JsonEvents;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonEvents
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let mut fields = serde_json::Map::new();
        fields.insert("time".into(), ((time * 1000.0).round() / 1000.0).into());
        fields.insert("level".into(), meta.level().as_str().into());
        fields.insert("target".into(), meta.target().into());
        event.record(&mut JsonFields(&mut fields));
        writeln!(writer, "{}", serde_json::Value::Object(fields))
    }
}

struct JsonFields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonFields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(total: Option<u64>, first: u64, done: u64) -> State {
        State {
            total,
            done,
            first,
            status: "loss 0.41".into(),
            started: Instant::now() - Duration::from_secs(100),
            last_line: None,
            running: true,
        }
    }

    #[test]
    fn a_line_says_where_the_run_is_and_when_it_ends() {
        let s = state(Some(50), 10, 20);
        let t = render("step", "progress", &s, LogFormat::Text);
        // 10 steps in 100 s, 30 to go: 300 s.
        assert!(
            t.starts_with("[step 20/50 (40%)] elapsed 0:01:40, ETA 0:05:00 | loss 0.41"),
            "{t}"
        );
        let j: serde_json::Value =
            serde_json::from_str(&render("step", "progress", &s, LogFormat::Json)).unwrap();
        assert_eq!(
            (j["done"].as_u64(), j["total"].as_u64()),
            (Some(20), Some(50))
        );
        assert_eq!(j["eta_s"].as_f64(), Some(300.0));
        let unknown = render("rows", "progress", &state(None, 0, 0), LogFormat::Text);
        assert!(
            !unknown.contains("ETA") && unknown.starts_with("[rows 0]"),
            "{unknown}"
        );
        let end = render("step", "end", &state(Some(50), 0, 50), LogFormat::Text);
        assert!(
            end.contains("done in 0:01:40") && !end.contains("ETA"),
            "{end}"
        );
    }

    #[test]
    fn lines_are_due_once_a_period() {
        let l = Lines::new(
            "step",
            Output {
                format: LogFormat::Text,
                every: Duration::from_secs(3600),
            },
        );
        l.state.lock().unwrap().running = true;
        assert!(l.due(), "the first line is due at once");
        l.state.lock().unwrap().last_line = Some(Instant::now());
        assert!(!l.due());
        l.state.lock().unwrap().last_line = Some(Instant::now() - Duration::from_secs(3601));
        assert!(l.due());
        l.state.lock().unwrap().running = false;
        assert!(!l.due(), "nothing after the end");
    }
}
