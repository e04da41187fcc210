//! The model's thread: the requests share a fixed number of decoding rows
//! ([`crate::model::decode::slots`]) with continuous batching. A request
//! takes a free row at the next step (newcomers are prefilled together), a
//! row whose answer ended or whose client went away is freed at once, and
//! one step draws a token for every live row. On CUDA the rows are the fused decode step's
//! (one CUDA graph a step, draws on the device); elsewhere the model's own
//! forward with the same sampling rule on the host.
//!
//! Each row keeps its own sampling (temperature, top_p, its seeded stream:
//! one seed a token from `(seed, "serve")`), token limit and stop strings;
//! its answer depends on nothing but its prompt, settings and seed.
//!
//! Text leaves in pieces that are final: tokens are detokenized
//! incrementally (a piece is released once it does not end in the middle of
//! a UTF-8 character), and text that could be the start of a stop string is
//! held back until it is known not to be one, so a streamed answer never
//! shows text the complete answer does not have.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::{Metrics, Outcome};
use crate::data::ChatTokenizer;
use crate::model::LoadedModel;
use crate::model::decode::draw::Draw;
use crate::model::decode::slots::{Feed, HostSlots, Join, Slots};
use crate::model::layers::init::Rng;

/// Why an answer ended, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn, or a stop string was met.
    Stop,
    /// The token limit.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// How one request decodes.
#[derive(Debug, Clone)]
pub struct Params {
    pub max_tokens: usize,
    /// 0 picks the most likely token.
    pub temperature: f64,
    pub top_p: f64,
    pub seed: u64,
    /// The answer ends before the first of these (not included).
    pub stop: Vec<String>,
}

/// What the engine sends about one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// More of the answer.
    Text(String),
    /// The end, with the token counts.
    Done {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// Decoding failed; nothing more follows.
    Failed(String),
}

/// One request in the queue.
pub struct Job {
    /// The id its answer carries (for the request log).
    pub id: String,
    pub prompt: Vec<u32>,
    /// Its adapter among those served side by side (0: the base alone).
    pub adapter: usize,
    pub params: Params,
    pub updates: UnboundedSender<Update>,
    /// When it was queued.
    pub queued: Instant,
}

/// How the engine decodes.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Rows decoding at once (fewer where the memory does not hold them).
    pub max_batch: usize,
    /// Tokens a row holds, prompt and answer.
    pub max_model_len: usize,
    /// A line on stderr for every request that ends.
    pub log_requests: bool,
}

/// What the model thread set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Rows decoding at once.
    pub rows: usize,
    /// Tokens a row holds.
    pub context: usize,
    /// Whether the rows are the fused decode step's.
    pub fused: bool,
}

/// The model thread has stopped: nothing more is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

/// The handle the HTTP side holds. Dropping it closes the queue and waits
/// for the model thread to finish its rows and free the model, so that the
/// process never exits while that thread still tears down CUDA state.
pub struct Engine {
    queue: Option<Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    capacity: Capacity,
    metrics: Arc<Metrics>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the model thread panicked while stopping");
        }
    }
}

impl Engine {
    /// Moves the model onto its own thread, sets up its rows and starts
    /// taking jobs.
    pub fn start(
        model: LoadedModel,
        tok: Arc<ChatTokenizer>,
        device: Device,
        opts: EngineOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Engine> {
        let (queue, rx) = channel::<Job>();
        let (ready, set_up) = channel::<Result<Capacity, String>>();
        let m = Arc::clone(&metrics);
        let thread = std::thread::Builder::new()
            .name("model".into())
            .spawn(move || serve_rows(&model, &tok, &device, &opts, &rx, &ready, &m))
            .context("cannot start the model thread")?;
        let capacity = set_up
            .recv()
            .context("the model thread stopped while setting up")?
            .map_err(|e| anyhow::anyhow!("cannot set up decoding: {e}"))?;
        metrics.set_rows(capacity.rows);
        Ok(Engine {
            queue: Some(queue),
            thread: Some(thread),
            capacity,
            metrics,
        })
    }

    /// The rows and their length.
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// Queues `job`; an error when the model thread has stopped.
    pub fn submit(&self, job: Job) -> Result<(), Stopped> {
        let Some(queue) = &self.queue else {
            return Err(Stopped);
        };
        queue.send(job).map_err(|_| Stopped)?;
        self.metrics.queued();
        Ok(())
    }
}

/// Sets up the rows (the fused step's on CUDA where it applies), says what
/// it set up on `ready`, then serves the queue until it closes.
fn serve_rows(
    model: &LoadedModel,
    tok: &ChatTokenizer,
    device: &Device,
    opts: &EngineOptions,
    rx: &Receiver<Job>,
    ready: &Sender<Result<Capacity, String>>,
    metrics: &Metrics,
) {
    let rows = opts.max_batch.max(1);
    let cap = opts.max_model_len.max(1);
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        use crate::model::decode::fast_decode::Mode;
        use crate::model::decode::slots::{FusedSlots, plan, read_in_place};
        // Newcomers are prefilled in groups of this many tokens at most.
        let prefill = cap.max(crate::model::decode::slots::PREFILL_TOKENS);
        let fused = (|| -> candle_core::Result<Result<_, String>> {
            let in_place = |free, bytes| read_in_place(&model.model, None, free, bytes);
            let p = match plan(&model.model, device, rows, cap, prefill, &in_place)? {
                Ok(p) => p,
                Err(why) => return Ok(Err(why)),
            };
            Ok(match model.model.decoder().decode_weights(p.in_place)? {
                Some(w) => Ok((p, w)),
                None => Err("the fused step does not cover this architecture".to_owned()),
            })
        })();
        match fused {
            Ok(Ok((p, w))) => {
                let pad = tok.pad().id;
                let chunk = crate::model::decode::prefill::PREFILL_CHUNK;
                match FusedSlots::new(
                    &model.model,
                    &w,
                    device,
                    p.rows,
                    cap,
                    pad,
                    prefill,
                    chunk,
                    Mode::Graph,
                ) {
                    Ok(mut slots) => {
                        if p.rows < rows {
                            tracing::warn!(
                                "decoding {} rows at once (the memory holds no more), not {rows}",
                                p.rows
                            );
                        }
                        let _ = ready.send(Ok(Capacity {
                            rows: p.rows,
                            context: cap,
                            fused: true,
                        }));
                        run(&mut slots, tok, rx, opts, metrics);
                        return;
                    }
                    Err(e) => {
                        let _ = ready.send(Err(format!("{e}")));
                        return;
                    }
                }
            }
            Ok(Err(why)) => tracing::warn!("serving op by op (slow): {why}"),
            Err(e) => {
                let _ = ready.send(Err(format!("{e}")));
                return;
            }
        }
    }
    let mut slots = HostSlots::new(&model.model, device, rows, cap, tok.pad().id);
    let _ = ready.send(Ok(Capacity {
        rows,
        context: cap,
        fused: false,
    }));
    run(&mut slots, tok, rx, opts, metrics);
}

/// Runs `f`, turning an error or a panic into the message each row gets.
fn guarded<T>(f: impl FnOnce() -> candle_core::Result<T>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!("decoding failed: {e}")),
        Err(_) => Err("decoding failed: the model thread panicked".to_owned()),
    }
}

/// The scheduler: admit waiting requests into free rows, step the live
/// rows, free rows that ended; block on the queue only when no row is live.
fn run(
    slots: &mut dyn Slots,
    tok: &ChatTokenizer,
    rx: &Receiver<Job>,
    opts: &EngineOptions,
    metrics: &Metrics,
) {
    let stop_ids = tok.stop_ids();
    let mut rows: Vec<Option<Row>> = (0..slots.rows()).map(|_| None).collect();
    loop {
        let live = rows.iter().flatten().count();
        let mut joining: Vec<Job> = Vec::new();
        if live == 0 {
            match rx.recv() {
                Ok(j) => joining.push(j),
                Err(_) => return, // the server is gone
            }
        }
        while live + joining.len() < rows.len() {
            match rx.try_recv() {
                Ok(j) => joining.push(j),
                Err(_) => break,
            }
        }
        metrics.started(joining.len());
        let mut newcomers: Vec<(usize, Row)> = Vec::new();
        let mut free = (0..rows.len()).filter(|&r| rows[r].is_none());
        for job in joining {
            let mut row = Row::new(job, opts.log_requests);
            if row.job.updates.is_closed() {
                // A client that left while waiting costs nothing.
                row.outcome = Some(Outcome::Cancelled);
                row.report(metrics);
                continue;
            }
            let r = free.next().expect("no more joining than free rows");
            newcomers.push((r, row));
        }
        if !newcomers.is_empty() {
            let seeds: Vec<u64> = newcomers
                .iter_mut()
                .map(|(_, r)| r.rng.next_u64())
                .collect();
            let joins: Vec<Join> = newcomers
                .iter()
                .zip(&seeds)
                .map(|((r, row), &seed)| Join {
                    row: *r,
                    prompt: &row.job.prompt,
                    budget: row.job.params.max_tokens,
                    draw: row.draw,
                    seed,
                    adapter: row.job.adapter,
                })
                .collect();
            let t = Instant::now();
            let picked = guarded(|| slots.admit(&joins));
            metrics.prefill(t.elapsed().as_secs_f64());
            for (i, (r, mut row)) in newcomers.into_iter().enumerate() {
                match &picked {
                    Ok(picks) => {
                        metrics.first_token(row.job.queued.elapsed().as_secs_f64());
                        row.accept(picks[i].0, tok, &stop_ids);
                        if row.done() {
                            row.report(metrics);
                            slots.free(r);
                        } else {
                            rows[r] = Some(row);
                        }
                    }
                    Err(msg) => {
                        row.fail(msg);
                        row.report(metrics);
                        slots.free(r);
                    }
                }
            }
        }
        // Rows whose client went away leave now.
        for (r, slot) in rows.iter_mut().enumerate() {
            if let Some(row) = slot
                && row.job.updates.is_closed()
            {
                row.outcome = Some(Outcome::Cancelled);
                row.report(metrics);
                *slot = None;
                slots.free(r);
            }
        }
        let feeds: Vec<Feed> = rows
            .iter_mut()
            .enumerate()
            .filter_map(|(r, row)| {
                let row = row.as_mut()?;
                Some(Feed {
                    row: r,
                    token: row.last,
                    draw: row.draw,
                    seed: row.rng.next_u64(),
                })
            })
            .collect();
        if feeds.is_empty() {
            metrics.set_live(0);
            continue;
        }
        let t = Instant::now();
        let picked = guarded(|| slots.step(&feeds));
        let step_seconds = t.elapsed().as_secs_f64();
        for (i, f) in feeds.iter().enumerate() {
            let Some(row) = &mut rows[f.row] else {
                continue;
            };
            match &picked {
                Ok(picks) => row.accept(picks[i].0, tok, &stop_ids),
                Err(msg) => row.fail(msg),
            }
            if row.done() {
                row.report(metrics);
                rows[f.row] = None;
                slots.free(f.row);
            }
        }
        if let Err(msg) = &picked {
            tracing::error!("{msg}");
        }
        metrics.step(step_seconds, feeds.len(), rows.iter().flatten().count());
    }
}

/// A request being decoded: its sampler, detokenizer and stop-string state.
struct Row {
    job: Job,
    rng: Rng,
    draw: Draw,
    /// The last token drawn (fed at the next step).
    last: u32,
    /// Say on stderr how it ended.
    log: bool,
    ids: Vec<u32>,
    /// Tokens drawn, the stop token included.
    drawn: usize,
    /// `ids[prefix..read]` was decoded last time; `ids[read..]` is new.
    prefix: usize,
    read: usize,
    /// The answer's text so far, and how much of it has been sent.
    text: String,
    sent: usize,
    /// How it ended, once it has.
    outcome: Option<Outcome>,
}

impl Row {
    fn new(job: Job, log: bool) -> Self {
        let rng = Rng::for_tensor(job.params.seed, "serve");
        let p = &job.params;
        let draw = Draw::new(p.temperature, 0, p.top_p);
        Row {
            job,
            rng,
            draw,
            last: 0,
            log,
            ids: Vec::new(),
            drawn: 0,
            prefix: 0,
            read: 0,
            text: String::new(),
            sent: 0,
            outcome: None,
        }
    }

    fn done(&self) -> bool {
        self.outcome.is_some()
    }

    /// Counts the ended request (and logs it when asked).
    fn report(&self, metrics: &Metrics) {
        let how = self.outcome.unwrap_or(Outcome::Failed);
        let seconds = self.job.queued.elapsed().as_secs_f64();
        metrics.ended(how, self.job.prompt.len(), self.drawn, seconds);
        if self.log {
            eprintln!(
                "request {}: {:?}, {} prompt + {} completion tokens, {seconds:.3} s",
                self.job.id,
                how,
                self.job.prompt.len(),
                self.drawn
            );
        }
    }

    /// Decoding failed: the client hears why; nothing more follows.
    fn fail(&mut self, msg: &str) {
        if !self.done() {
            let _ = self.job.updates.send(Update::Failed(msg.to_owned()));
            self.outcome = Some(Outcome::Failed);
        }
    }

    /// Takes the drawn token `t`.
    fn accept(&mut self, t: u32, tok: &ChatTokenizer, stop_ids: &[u32]) {
        self.drawn += 1;
        self.last = t;
        if stop_ids.contains(&t) {
            self.finish(FinishReason::Stop, tok);
            return;
        }
        self.ids.push(t);
        let piece = self.next_piece(tok);
        if self.add_text(&piece) {
            self.finish_now(FinishReason::Stop);
        } else if self.ids.len() >= self.job.params.max_tokens {
            self.finish(FinishReason::Length, tok);
        } else {
            self.send_ready();
        }
    }

    /// The new text of `ids[read..]`, once it ends on a whole character.
    fn next_piece(&mut self, tok: &ChatTokenizer) -> String {
        let before = decode(tok, &self.ids[self.prefix..self.read]);
        let now = decode(tok, &self.ids[self.prefix..]);
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') {
            let piece = now
                .get(before.len()..)
                .map_or_else(String::new, str::to_owned);
            self.prefix = self.read;
            self.read = self.ids.len();
            piece
        } else {
            String::new()
        }
    }

    /// Appends `piece`; true when a stop string now ends the answer (the
    /// text is cut before it).
    fn add_text(&mut self, piece: &str) -> bool {
        if piece.is_empty() {
            return false;
        }
        self.text.push_str(piece);
        // Text before `sent` was released because no stop string could
        // start in it, so a match starts at `sent` or later.
        let first = self
            .job
            .params
            .stop
            .iter()
            .filter_map(|s| self.text[self.sent..].find(s.as_str()))
            .min();
        match first {
            Some(at) => {
                self.text.truncate(self.sent + at);
                true
            }
            None => false,
        }
    }

    /// Sends the text that cannot be the start of a stop string.
    fn send_ready(&mut self) {
        let hold = held_back(&self.text[self.sent..], &self.job.params.stop);
        let ready = self.text.len() - hold;
        if ready > self.sent {
            let piece = self.text[self.sent..ready].to_owned();
            self.sent = ready;
            self.send(Update::Text(piece));
        }
    }

    /// Ends the answer: the rest of the text (stop strings still apply),
    /// then `Done`.
    fn finish(&mut self, reason: FinishReason, tok: &ChatTokenizer) {
        let rest = decode(tok, &self.ids[self.prefix..]);
        let before = decode(tok, &self.ids[self.prefix..self.read]);
        let tail = rest.get(before.len()..).unwrap_or("").to_owned();
        self.read = self.ids.len();
        let reason = if self.add_text(&tail) {
            FinishReason::Stop
        } else {
            reason
        };
        self.finish_now(reason);
    }

    fn finish_now(&mut self, reason: FinishReason) {
        if self.text.len() > self.sent {
            let piece = self.text[self.sent..].to_owned();
            self.sent = self.text.len();
            self.send(Update::Text(piece));
        }
        self.send(Update::Done {
            reason,
            prompt_tokens: self.job.prompt.len(),
            completion_tokens: self.drawn,
        });
        if !self.done() {
            self.outcome = Some(match reason {
                FinishReason::Stop => Outcome::Stop,
                FinishReason::Length => Outcome::Length,
            });
        }
    }

    fn send(&mut self, u: Update) {
        if self.job.updates.send(u).is_err() {
            // The client went away: stop spending the batch's time on it.
            self.outcome = Some(Outcome::Cancelled);
        }
    }
}

fn decode(tok: &ChatTokenizer, ids: &[u32]) -> String {
    // Decoding ids the model produced only fails on ids outside the
    // vocabulary, which `check_against_vocab` ruled out at load.
    tok.decode(ids, true).unwrap_or_default()
}

/// Bytes at the end of `text` that begin some stop string (and so may
/// still become one).
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .filter_map(|s| {
            // The longest proper prefix of `s` that `text` ends with.
            (1..s.len())
                .rev()
                .filter(|&n| s.is_char_boundary(n))
                .find(|&n| text.ends_with(&s[..n]))
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> &'static ChatTokenizer {
        static TOK: std::sync::OnceLock<(tempfile::TempDir, ChatTokenizer)> =
            std::sync::OnceLock::new();
        &TOK.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            crate::model::arch::tiny::write_tiny_chat_model(dir.path(), 1).unwrap();
            let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
            (dir, tok)
        })
        .1
    }

    /// Feeds `text`'s tokens to a row as if the model drew them, then the
    /// end of turn; returns what the client received.
    fn feed(text: &str, stop: &[&str], max_tokens: usize) -> Vec<Update> {
        let tok = tokenizer();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut row = Row::new(
            Job {
                id: "t".into(),
                queued: Instant::now(),
                prompt: vec![1, 2],
                adapter: 0,
                params: Params {
                    max_tokens,
                    temperature: 0.0,
                    top_p: 1.0,
                    seed: 0,
                    stop: stop.iter().map(|s| s.to_string()).collect(),
                },
                updates: tx,
            },
            false,
        );
        let stop_ids = tok.stop_ids();
        for id in tok.encode(text).unwrap().into_iter().chain([stop_ids[0]]) {
            if row.done() {
                break;
            }
            row.accept(id, tok, &stop_ids);
        }
        let mut out = Vec::new();
        while let Ok(u) = rx.try_recv() {
            out.push(u);
        }
        out
    }

    fn texts(u: &[Update]) -> Vec<&str> {
        u.iter()
            .filter_map(|u| match u {
                Update::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    fn done(reason: FinishReason, completion_tokens: usize) -> Update {
        Update::Done {
            reason,
            prompt_tokens: 2,
            completion_tokens,
        }
    }

    #[test]
    fn a_stop_string_cuts_the_answer_before_it() {
        let u = feed("hello END world", &["END"], 100);
        assert_eq!(texts(&u).concat(), "hello ");
        // Nine tokens drawn ("hello " and "END"), the rest never decoded.
        assert_eq!(u.last(), Some(&done(FinishReason::Stop, 9)));
        // "E" and "EN" were held back while they could start "END".
        assert!(texts(&u).iter().all(|t| !t.contains('E')), "{u:?}");
    }

    #[test]
    fn text_held_back_for_a_stop_string_is_released_at_the_end() {
        let u = feed("abE", &["END"], 100);
        assert_eq!(texts(&u), ["a", "b", "E"]);
        assert_eq!(u.last(), Some(&done(FinishReason::Stop, 4)));
    }

    #[test]
    fn the_token_limit_ends_with_length() {
        let u = feed("abcdef", &[], 3);
        assert_eq!(texts(&u).concat(), "abc");
        assert_eq!(u.last(), Some(&done(FinishReason::Length, 3)));
    }

    #[test]
    fn pieces_end_on_whole_characters() {
        // "é" and "→" are two and three byte tokens of the tiny tokenizer.
        let u = feed("aé→b", &[], 100);
        assert_eq!(texts(&u), ["a", "é", "→", "b"]);
        assert!(texts(&u).iter().all(|t| !t.contains('\u{FFFD}')));
    }

    #[test]
    fn held_back_is_the_longest_stop_prefix_at_the_end() {
        let stops = vec!["END".to_owned(), "\n\n".to_owned()];
        assert_eq!(held_back("abc", &stops), 0);
        assert_eq!(held_back("abcE", &stops), 1);
        assert_eq!(held_back("abcEN", &stops), 2);
        assert_eq!(held_back("x\n", &stops), 1);
        assert_eq!(held_back("EN", &[]), 0);
        // Multi-byte stop strings are cut on character boundaries.
        assert_eq!(held_back("aé", &["éclair".to_owned()]), 2);
    }
}
