//! The model's thread: takes the requests waiting in its queue (up to
//! `max_batch`), decodes them together with [`model::generate::decode_with`],
//! and sends each request's text back as it is produced.
//!
//! Requests that arrive while a batch decodes wait for the next one. Each
//! row keeps its own sampling (temperature, top_p, seeded stream), token
//! limit and stop strings: the batch's pick draws every live row's token
//! with that row's rules, and ends a row early (stop string, its own
//! limit, a client that went away) by answering a stop id for it.
//!
//! The seam for continuous batching is [`Engine::start`]'s loop: it owns
//! the queue and hands [`Row`]s to `run_batch`; a scheduler that admits
//! new rows into a running batch replaces `run_batch` and keeps the rows
//! and the events as they are.
//!
//! Text leaves in pieces that are final: tokens are detokenized
//! incrementally (a piece is released once it does not end in the middle of
//! a UTF-8 character), and text that could be the start of a stop string is
//! held back until it is known not to be one, so a streamed answer never
//! shows text the complete answer does not have.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use candle_core::{DType, Device, Tensor};
use tokio::sync::mpsc::UnboundedSender;

use crate::data::ChatTokenizer;
use crate::model::generate::{Sampling, decode_with, draw};
use crate::model::init::Rng;
use crate::model::{self, LoadedModel};

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
    pub prompt: Vec<u32>,
    pub params: Params,
    pub updates: UnboundedSender<Update>,
}

/// The handle the HTTP side holds.
pub struct Engine {
    queue: Sender<Job>,
}

impl Engine {
    /// Moves the model onto its own thread and starts taking jobs.
    pub fn start(
        model: LoadedModel,
        tok: Arc<ChatTokenizer>,
        device: Device,
        max_batch: usize,
    ) -> std::io::Result<Engine> {
        let (queue, rx) = channel::<Job>();
        std::thread::Builder::new()
            .name("model".into())
            .spawn(move || run(&model, &tok, &device, max_batch.max(1), &rx))?;
        Ok(Engine { queue })
    }

    /// Queues `job`; gives it back when the model thread has stopped.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        self.queue.send(job).map_err(|e| e.0)
    }
}

fn run(
    model: &LoadedModel,
    tok: &ChatTokenizer,
    device: &Device,
    max_batch: usize,
    rx: &Receiver<Job>,
) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < max_batch {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        // A client that left while waiting costs nothing.
        jobs.retain(|j| !j.updates.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let mut rows: Vec<Row> = jobs.into_iter().map(Row::new).collect();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_batch(model, tok, device, &mut rows)
        }));
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("decoding failed: {e}")),
            Err(_) => Some("decoding failed: the model thread panicked".to_owned()),
        };
        for row in &mut rows {
            match &failure {
                Some(msg) if !row.done => {
                    row.done = true;
                    let _ = row.job.updates.send(Update::Failed(msg.clone()));
                }
                _ => {}
            }
        }
        if let Some(msg) = failure {
            tracing::error!("{msg}");
        }
    }
}

/// Decodes `rows` together until each has finished.
fn run_batch(
    model: &LoadedModel,
    tok: &ChatTokenizer,
    device: &Device,
    rows: &mut [Row],
) -> anyhow::Result<()> {
    let prompts: Vec<Vec<u32>> = rows.iter().map(|r| r.job.prompt.clone()).collect();
    let max_new = rows
        .iter()
        .map(|r| r.job.params.max_tokens)
        .max()
        .unwrap_or(1);
    let stop_ids = tok.stop_ids();
    let end = stop_ids[0];
    let mut pick =
        |logits: &Tensor, live: &[(usize, usize)]| -> candle_core::Result<Vec<(u32, f32)>> {
            let host = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
            let mut next = vec![(end, 0.0); host.len()];
            for &(b, i) in live {
                let row = &mut rows[i];
                if row.done {
                    continue; // answered `end`: the batch drops the row
                }
                let p = &row.job.params;
                let sampling = Sampling {
                    temperature: p.temperature,
                    top_p: p.top_p,
                    top_k: 0,
                    seed: p.seed,
                    first_stream: 0,
                };
                next[b] = draw(&host[b], &sampling, &mut row.rng);
                row.accept(next[b].0, tok, &stop_ids);
            }
            Ok(next)
        };
    // Every row at once (max_rows 0): the batch is what was waiting.
    decode_with(
        &model.model,
        &prompts,
        max_new,
        &stop_ids,
        tok.pad().id,
        0,
        device,
        &mut pick,
    )?;
    // A row the batch ended without its pick knowing (none today) still
    // gets its end.
    for row in rows.iter_mut().filter(|r| !r.done) {
        row.finish(FinishReason::Length, tok);
    }
    Ok(())
}

/// A request being decoded: its sampler, detokenizer and stop-string state.
struct Row {
    job: Job,
    rng: Rng,
    ids: Vec<u32>,
    /// Tokens drawn, the stop token included.
    drawn: usize,
    /// `ids[prefix..read]` was decoded last time; `ids[read..]` is new.
    prefix: usize,
    read: usize,
    /// The answer's text so far, and how much of it has been sent.
    text: String,
    sent: usize,
    done: bool,
}

impl Row {
    fn new(job: Job) -> Self {
        let rng = Rng::for_tensor(job.params.seed, "serve");
        Row {
            job,
            rng,
            ids: Vec::new(),
            drawn: 0,
            prefix: 0,
            read: 0,
            text: String::new(),
            sent: 0,
            done: false,
        }
    }

    /// Takes the drawn token `t`.
    fn accept(&mut self, t: u32, tok: &ChatTokenizer, stop_ids: &[u32]) {
        self.drawn += 1;
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
        self.done = true;
    }

    fn send(&mut self, u: Update) {
        if self.job.updates.send(u).is_err() {
            // The client went away: stop spending the batch's time on it.
            self.done = true;
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

/// Loads what the engine runs: the model (with the adapter applied when
/// given) in f32 on the CPU, bf16 on a GPU.
pub fn load_model(
    model_dir: &std::path::Path,
    adapter: Option<&std::path::Path>,
    device: &Device,
) -> anyhow::Result<LoadedModel> {
    let dtype = if device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    };
    Ok(match adapter {
        Some(a) => model::adapter::load(model_dir, a, dtype, device)?,
        None => model::load(model_dir, None, dtype, device)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> &'static ChatTokenizer {
        static TOK: std::sync::OnceLock<(tempfile::TempDir, ChatTokenizer)> =
            std::sync::OnceLock::new();
        &TOK.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            crate::model::tiny::write_tiny_chat_model(dir.path(), 1).unwrap();
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
        let mut row = Row::new(Job {
            prompt: vec![1, 2],
            params: Params {
                max_tokens,
                temperature: 0.0,
                top_p: 1.0,
                seed: 0,
                stop: stop.iter().map(|s| s.to_string()).collect(),
            },
            updates: tx,
        });
        let stop_ids = tok.stop_ids();
        for id in tok.encode(text).unwrap().into_iter().chain([stop_ids[0]]) {
            if row.done {
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
