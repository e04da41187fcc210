//! The server's counters, read at `GET /metrics` in Prometheus' text
//! format (version 0.0.4): requests by outcome, tokens, the queue, the
//! batch's occupancy, decode steps, and the time to first token and to the
//! whole answer as histograms.
//!
//! The HTTP side counts what it queues; the model thread counts the rest.
//! Counters are atomics; the two histograms sit behind one mutex each,
//! taken once a request.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (seconds) of the histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (c, &le) in self.counts.iter_mut().zip(&BUCKETS) {
            if seconds <= le {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (c, le) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// End of turn or a stop string.
    Stop,
    /// Its token limit.
    Length,
    /// The client went away first.
    Cancelled,
    /// Decoding failed.
    Failed,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Stop,
        Outcome::Length,
        Outcome::Cancelled,
        Outcome::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Stop => "stop",
            Outcome::Length => "length",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "failed",
        }
    }
}

/// The counters; see the module header.
#[derive(Default)]
pub struct Metrics {
    queued: AtomicU64,
    started: AtomicU64,
    ended: [AtomicU64; 4],
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    steps: AtomicU64,
    /// Rows fed over all steps (occupancy = this / steps / rows).
    rows_stepped: AtomicU64,
    live: AtomicU64,
    rows: AtomicU64,
    /// Microseconds in decode steps and in prefills (the model's time; the
    /// rest of the thread's time is the host's: text, stop strings, sends).
    step_us: AtomicU64,
    prefill_us: AtomicU64,
    ttft: Mutex<Histogram>,
    latency: Mutex<Histogram>,
}

impl Metrics {
    /// The batch holds `rows` rows.
    pub fn set_rows(&self, rows: usize) {
        self.rows.store(rows as u64, Ordering::Relaxed);
    }

    /// A request went into the queue.
    pub fn queued(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` requests left the queue for the batch (or were dropped).
    pub fn started(&self, n: usize) {
        self.started.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A request's first token, `seconds` after it was queued.
    pub fn first_token(&self, seconds: f64) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(seconds);
        }
    }

    /// A request ended.
    pub fn ended(&self, how: Outcome, prompt: usize, completion: usize, seconds: f64) {
        self.ended[how as usize].fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion as u64, Ordering::Relaxed);
        if let Ok(mut h) = self.latency.lock() {
            h.observe(seconds);
        }
    }

    /// A prefill of joining requests took `seconds`.
    pub fn prefill(&self, seconds: f64) {
        self.prefill_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    /// One decode step of `seconds` fed `fed` rows; `live` rows are
    /// decoding after it.
    pub fn step(&self, seconds: f64, fed: usize, live: usize) {
        self.step_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.rows_stepped.fetch_add(fed as u64, Ordering::Relaxed);
        self.live.store(live as u64, Ordering::Relaxed);
    }

    /// Rows decoding now.
    pub fn set_live(&self, live: usize) {
        self.live.store(live as u64, Ordering::Relaxed);
    }

    /// Requests waiting for a row.
    pub fn queue_length(&self) -> u64 {
        let q = self.queued.load(Ordering::Relaxed);
        q.saturating_sub(self.started.load(Ordering::Relaxed))
    }

    /// Requests queued so far.
    pub fn received(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// `(decode steps, seconds in steps, seconds in prefills)` so far.
    pub fn model_time(&self) -> (u64, f64, f64) {
        (
            self.steps.load(Ordering::Relaxed),
            self.step_us.load(Ordering::Relaxed) as f64 / 1e6,
            self.prefill_us.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }

    /// Requests ended so far, by outcome.
    pub fn ended_count(&self, how: Outcome) -> u64 {
        self.ended[how as usize].load(Ordering::Relaxed)
    }

    /// The Prometheus text.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            &mut o,
            "trace_train_requests_received_total",
            "Chat completion requests queued.",
            get(&self.queued),
        );
        let _ = writeln!(
            o,
            "# HELP trace_train_requests_total Requests ended, by outcome.\n# TYPE trace_train_requests_total counter"
        );
        for how in Outcome::ALL {
            let _ = writeln!(
                o,
                "trace_train_requests_total{{outcome=\"{}\"}} {}",
                how.label(),
                self.ended_count(how)
            );
        }
        counter(
            &mut o,
            "trace_train_prompt_tokens_total",
            "Prompt tokens of ended requests.",
            get(&self.prompt_tokens),
        );
        counter(
            &mut o,
            "trace_train_completion_tokens_total",
            "Tokens drawn for ended requests.",
            get(&self.completion_tokens),
        );
        counter(
            &mut o,
            "trace_train_decode_steps_total",
            "Decode steps (one token for every live row).",
            get(&self.steps),
        );
        counter(
            &mut o,
            "trace_train_rows_stepped_total",
            "Rows fed over all decode steps.",
            get(&self.rows_stepped),
        );
        let seconds = |a: &AtomicU64| get(a) as f64 / 1e6;
        let _ = writeln!(
            o,
            "# HELP trace_train_model_seconds_total Seconds the model thread spent in decode steps and prefills.\n# TYPE trace_train_model_seconds_total counter\ntrace_train_model_seconds_total{{phase=\"step\"}} {}\ntrace_train_model_seconds_total{{phase=\"prefill\"}} {}",
            seconds(&self.step_us),
            seconds(&self.prefill_us)
        );
        let gauge = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut o,
            "trace_train_queue_length",
            "Requests waiting for a row of the batch.",
            self.queue_length(),
        );
        gauge(
            &mut o,
            "trace_train_batch_live_rows",
            "Rows of the batch decoding now.",
            get(&self.live),
        );
        gauge(
            &mut o,
            "trace_train_batch_rows",
            "Rows the batch holds.",
            get(&self.rows),
        );
        if let Ok(h) = self.ttft.lock() {
            h.render(
                &mut o,
                "trace_train_time_to_first_token_seconds",
                "From queued to the first token drawn.",
            );
        }
        if let Ok(h) = self.latency.lock() {
            h.render(
                &mut o,
                "trace_train_request_seconds",
                "From queued to the end of the answer.",
            );
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_holds_every_series_with_its_value() {
        let m = Metrics::default();
        m.set_rows(8);
        for _ in 0..3 {
            m.queued();
        }
        m.started(2);
        m.first_token(0.2);
        m.first_token(3.0);
        m.ended(Outcome::Stop, 10, 5, 0.7);
        m.ended(Outcome::Cancelled, 4, 1, 40.0);
        m.step(0.5, 2, 1);
        m.prefill(0.25);
        let t = m.render();
        for line in [
            "trace_train_requests_received_total 3",
            "trace_train_queue_length 1",
            "trace_train_requests_total{outcome=\"stop\"} 1",
            "trace_train_requests_total{outcome=\"cancelled\"} 1",
            "trace_train_requests_total{outcome=\"failed\"} 0",
            "trace_train_prompt_tokens_total 14",
            "trace_train_completion_tokens_total 6",
            "trace_train_decode_steps_total 1",
            "trace_train_rows_stepped_total 2",
            "trace_train_model_seconds_total{phase=\"step\"} 0.5",
            "trace_train_model_seconds_total{phase=\"prefill\"} 0.25",
            "trace_train_batch_live_rows 1",
            "trace_train_batch_rows 8",
            "trace_train_time_to_first_token_seconds_bucket{le=\"0.25\"} 1",
            "trace_train_time_to_first_token_seconds_bucket{le=\"5\"} 2",
            "trace_train_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2",
            "trace_train_time_to_first_token_seconds_count 2",
            "trace_train_request_seconds_bucket{le=\"30\"} 1",
            "trace_train_request_seconds_sum 40.7",
        ] {
            assert!(t.lines().any(|l| l == line), "no `{line}` in\n{t}");
        }
        // Every series has its TYPE line before it.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            let base = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(t.contains(&format!("# TYPE {base} ")), "{name} has no TYPE");
        }
    }
}
