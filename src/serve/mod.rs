//! `trace-train serve`: an OpenAI-compatible HTTP server for a trained model.
//!
//! Owns the HTTP side: the routes (`GET /health`, `GET /v1/models`,
//! `POST /v1/chat/completions`, `POST /v1/completions`), the optional
//! bearer key, turning messages into prompt tokens with the model's own
//! chat template (a completion's prompt is taken as it is), and answers as
//! JSON or as server-sent events, and `GET /metrics` ([`metrics`]).
//!
//! Several LoRA adapters of one base are served side by side: the base is
//! loaded once, each request names the base or an adapter in its `model`,
//! and rows of different adapters decode in the same batch, each through
//! its own adapter (`model::io::adapter::load_bank`). One adapter alone is
//! merged into the weights and served under its name. The
//! model runs on one thread of its own ([`engine`]), which decodes the
//! requests with continuous batching; the wire format and its checks are
//! in [`api`]. axum on tokio serves the connections.

pub mod api;
pub mod engine;
pub mod metrics;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use candle_core::Device;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::data::ChatTokenizer;
use crate::model::BasePrecision;
use api::{ApiError, ChatRequest, Input, Kind};
use engine::{Engine, EngineOptions, Job, Params, Update};
use metrics::Metrics;

/// Tokens a row holds when `--max_model_len` is not given (or the model's
/// `max_position_embeddings`, when smaller).
pub const DEFAULT_MAX_MODEL_LEN: usize = 4096;

/// What to serve and how.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// A model folder (a merged model, or the base of `adapters`).
    pub model_dir: PathBuf,
    /// PEFT adapter folders of `model_dir`, each with the id clients name
    /// it by (default: the folder's name). One is merged into the weights
    /// and served alone; several are served beside the base.
    pub adapters: Vec<(Option<String>, PathBuf)>,
    /// The id clients name in `model` for the model folder, or for the one
    /// adapter when there is one (default: the folder's name).
    pub name: Option<String>,
    /// Requests must carry `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Most requests decoded together.
    pub max_batch: usize,
    /// The most new tokens a request may ask for, and what it gets when it
    /// does not say (less where the context would overflow).
    pub max_tokens: usize,
    /// Tokens a request's prompt and answer may take together (every row
    /// of the batch holds this many); `None`: [`DEFAULT_MAX_MODEL_LEN`] or
    /// the model's context, whichever is smaller.
    pub max_model_len: Option<usize>,
    /// A line on stderr for every request that ends.
    pub log_requests: bool,
    pub device: Device,
    /// How the frozen weights are held ([`crate::kit::load::held`]).
    pub base_precision: BasePrecision,
    /// How long a client may take, and open connections after a stop.
    pub deadlines: Deadlines,
    /// Special-token strings in request messages become control tokens
    /// (off: they are text; see `ChatTokenizer::encode_chat`).
    pub special_tokens_in_messages: bool,
}

/// The server's shared state.
pub struct AppState {
    /// The ids served: the model (or the one adapter merged into it), then
    /// the adapters served beside it; a request's index into them is its
    /// row's adapter.
    names: Vec<String>,
    api_key: Option<String>,
    tok: Arc<ChatTokenizer>,
    engine: Engine,
    metrics: Arc<Metrics>,
    /// Tokens a prompt and its answer may take together.
    context: usize,
    max_tokens: usize,
    created: u64,
    ids: AtomicU64,
    deadlines: Deadlines,
}

impl AppState {
    /// Loads the tokenizer and model and starts the model's thread.
    pub fn load(opts: &ServeOptions) -> anyhow::Result<Arc<Self>> {
        anyhow::ensure!(
            opts.max_batch >= 1 && opts.max_tokens >= 1,
            "--max_batch and --max_tokens must be at least 1"
        );
        let mut tok = ChatTokenizer::from_dir(&opts.model_dir)?;
        tok.set_specials_in_messages(opts.special_tokens_in_messages);
        let tok = Arc::new(tok);
        let names = served_names(opts)?;
        let adapter_dirs: Vec<PathBuf> = opts.adapters.iter().map(|(_, d)| d.clone()).collect();
        let model = crate::kit::load::for_inference(
            &opts.model_dir,
            &adapter_dirs,
            opts.base_precision,
            &opts.device,
        )?;
        tok.check_against_vocab(model.model.vocab_size())?;
        let config_path = opts.model_dir.join(crate::model::CONFIG_FILE);
        let config: Value = serde_json::from_slice(
            &std::fs::read(&config_path)
                .with_context(|| format!("cannot read `{}`", config_path.display()))?,
        )
        .with_context(|| format!("`{}` is not valid JSON", config_path.display()))?;
        let trained = config["max_position_embeddings"]
            .as_u64()
            .map(|n| n as usize);
        let max_model_len = match (opts.max_model_len, trained) {
            (Some(n), Some(t)) if n > t => anyhow::bail!(
                "--max_model_len {n} is more than the model's context ({t} tokens, `max_position_embeddings` in `{}`)",
                config_path.display()
            ),
            (Some(n), _) => n,
            (None, t) => t.map_or(DEFAULT_MAX_MODEL_LEN, |t| t.min(DEFAULT_MAX_MODEL_LEN)),
        };
        anyhow::ensure!(max_model_len >= 2, "--max_model_len must be at least 2");
        let metrics = Arc::new(Metrics::default());
        let engine = Engine::start(
            model,
            Arc::clone(&tok),
            opts.device.clone(),
            EngineOptions {
                max_batch: opts.max_batch,
                max_model_len,
                log_requests: opts.log_requests,
            },
            Arc::clone(&metrics),
        )?;
        let context = engine.capacity().context;
        Ok(Arc::new(AppState {
            names,
            api_key: opts.api_key.clone().filter(|k| !k.is_empty()),
            tok,
            engine,
            metrics,
            context,
            max_tokens: opts.max_tokens,
            created: unix_now(),
            ids: AtomicU64::new(0),
            deadlines: opts.deadlines,
        }))
    }

    /// The ids served: the model's, then any adapters' beside it.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The server's counters of ended requests by outcome (JSON), and
    /// whether every request received has ended.
    pub fn metrics_snapshot(&self) -> (Value, bool) {
        use metrics::Outcome;
        let by: Vec<(&str, u64)> = [
            ("stop", Outcome::Stop),
            ("length", Outcome::Length),
            ("cancelled", Outcome::Cancelled),
            ("failed", Outcome::Failed),
        ]
        .into_iter()
        .map(|(n, o)| (n, self.metrics.ended_count(o)))
        .collect();
        let ended: u64 = by.iter().map(|x| x.1).sum();
        let received = self.metrics.received();
        let mut v = json!({"received": received});
        for (n, c) in by {
            v[n] = json!(c);
        }
        (v, ended == received)
    }

    /// `(decode steps, seconds in steps, seconds in prefills)` so far.
    pub fn model_time(&self) -> (u64, f64, f64) {
        self.metrics.model_time()
    }

    /// The rows decoding at once and the tokens each holds.
    pub fn capacity(&self) -> engine::Capacity {
        self.engine.capacity()
    }

    fn next_id(&self, kind: Kind) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        format!("{prefix}-{:x}{n:08x}", self.created)
    }
}

/// The ids `opts` serves (see [`AppState::names`]), each distinct.
fn served_names(opts: &ServeOptions) -> anyhow::Result<Vec<String>> {
    let folder = |dir: &std::path::Path| {
        let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
        canonical
            .file_name()
            .map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned())
    };
    let names: Vec<String> = match &opts.adapters[..] {
        [] => vec![opts.name.clone().unwrap_or_else(|| folder(&opts.model_dir))],
        [(name, dir)] => vec![
            opts.name
                .clone()
                .or_else(|| name.clone())
                .unwrap_or_else(|| folder(dir)),
        ],
        many => std::iter::once(opts.name.clone().unwrap_or_else(|| folder(&opts.model_dir)))
            .chain(
                many.iter()
                    .map(|(name, dir)| name.clone().unwrap_or_else(|| folder(dir))),
            )
            .collect(),
    };
    for (i, n) in names.iter().enumerate() {
        anyhow::ensure!(!n.is_empty(), "a served model's id is empty");
        anyhow::ensure!(
            !names[..i].contains(n),
            "two served models are both called `{n}`\nhint: name them: --adapter NAME=DIR, and --name for the base"
        );
    }
    Ok(names)
}

/// The routes.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(text))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route(
            "/health",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/metrics", get(metrics_text))
        .merge(v1)
        .fallback(|| async {
            ApiError::not_found(
                "no such route (this server has /health, /metrics, /v1/models, /v1/chat/completions and /v1/completions)",
                None,
            )
        })
        .with_state(state)
}

/// How long `serve` waits on a client, and on open connections at the end.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// A request's headers must arrive whole within this (HTTP/1).
    pub headers: std::time::Duration,
    /// A request's body must arrive whole within this.
    pub body: std::time::Duration,
    /// After the stop signal, open connections get this long to finish
    /// before they are closed.
    pub shutdown: std::time::Duration,
    /// Connections open at once; more wait in the listen queue.
    pub max_connections: usize,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            headers: std::time::Duration::from_secs(30),
            body: std::time::Duration::from_secs(30),
            shutdown: std::time::Duration::from_secs(10),
            max_connections: 512,
        }
    }
}

/// Serves `router(state)` on `listener` until `shutdown` completes: then no
/// new connection is taken, and those open get `deadlines.shutdown` to
/// finish (or until `again`, a second stop signal) before they are closed.
/// A client that sends its headers or its body too slowly is cut off.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    again: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let deadlines = state.deadlines;
    let app = router(state);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(deadlines.headers);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    let slots = Arc::new(tokio::sync::Semaphore::new(
        deadlines.max_connections.max(1),
    ));
    loop {
        // A free slot first: at the cap, new clients wait in the queue.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, go on.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn = builder
            .serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(app.clone()),
            )
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(deadlines.shutdown) => {
            tracing::warn!(
                "connections still open {:.0} s after the stop signal; closing them",
                deadlines.shutdown.as_secs_f64()
            );
        }
        () = again => tracing::warn!("a second stop signal; closing the open connections"),
    }
    Ok(())
}

/// The most bytes a request body may hold.
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// A request body, read whole within `deadline` and at most
/// [`MAX_BODY_BYTES`]; the refusals are OpenAI-style JSON errors.
async fn read_body(
    body: axum::body::Body,
    deadline: std::time::Duration,
) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Err(_) => Err(ApiError {
            status: axum::http::StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the request body did not arrive within {:.0} s",
                deadline.as_secs_f64()
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
        }),
        Ok(Err(e)) if is_too_large(&e) => Err(ApiError {
            status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            message: format!(
                "the request body is over {MAX_BODY_BYTES} bytes (2 MiB), the most this server reads"
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }),
        Ok(Err(e)) => Err(ApiError::invalid(
            format!("cannot read the request body: {e}"),
            None,
            None,
        )),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

/// Whether reading a body failed on its length limit.
fn is_too_large(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same(given.trim().as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares in time that does not depend on where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn model_json(state: &AppState, name: &str) -> Value {
    json!({"id": name, "object": "model", "created": state.created, "owned_by": "trace-train"})
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> = state.names.iter().map(|n| model_json(&state, n)).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if state.names.contains(&id) {
        axum::Json(model_json(&state, &id)).into_response()
    } else {
        ApiError::not_found(
            format!(
                "The model `{id}` does not exist; this server serves {}",
                state.names.join(", ")
            ),
            Some("model_not_found"),
        )
        .into_response()
    }
}

async fn chat(State(state): State<Arc<AppState>>, body: axum::body::Body) -> Response {
    answer(state, body, Kind::Chat).await
}

async fn text(State(state): State<Arc<AppState>>, body: axum::body::Body) -> Response {
    answer(state, body, Kind::Completion).await
}

async fn answer(state: Arc<AppState>, body: axum::body::Body, kind: Kind) -> Response {
    let body = match read_body(body, state.deadlines.body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match start(&state, &body, kind) {
        Ok((req, id, updates)) if req.stream => stream(state, req, kind, id, updates),
        Ok((req, id, updates)) => whole(&state, &req, kind, id, updates).await,
        Err(e) => e.into_response(),
    }
}

/// New tokens a completion gets when it does not say (OpenAI's default
/// for `/v1/completions`).
pub const COMPLETION_MAX_TOKENS: usize = 16;

/// Checks the request, renders and tokenizes the prompt, queues the job.
fn start(
    state: &AppState,
    body: &[u8],
    kind: Kind,
) -> Result<(ChatRequest, String, UnboundedReceiver<Update>), ApiError> {
    let req = match kind {
        Kind::Chat => api::parse_chat(body, &state.names)?,
        Kind::Completion => api::parse_completion(body, &state.names)?,
    };
    let (prompt, what, param) = match &req.input {
        Input::Messages(messages) => (
            state.tok.encode_prompt(messages).map_err(|e| {
                ApiError::invalid(
                    format!("the chat template refused the messages: {e}"),
                    Some("messages"),
                    None,
                )
            })?,
            "the messages take",
            "messages",
        ),
        Input::Prompt(text) => {
            let mut ids: Vec<u32> = state.tok.bos().map(|b| b.id).into_iter().collect();
            ids.extend(state.tok.encode(text).map_err(|e| {
                ApiError::invalid(
                    format!("cannot tokenize the prompt: {e}"),
                    Some("prompt"),
                    None,
                )
            })?);
            if ids.is_empty() {
                return Err(ApiError::invalid(
                    "`prompt` is empty",
                    Some("prompt"),
                    Some("invalid_value"),
                ));
            }
            (ids, "the prompt takes", "prompt")
        }
    };
    let room = state.context.saturating_sub(prompt.len());
    if room == 0 {
        return Err(ApiError::invalid(
            format!(
                "This model's maximum context length is {} tokens; {what} {} (the server's --max_model_len sets it)",
                state.context,
                prompt.len()
            ),
            Some(param),
            Some("context_length_exceeded"),
        ));
    }
    let max_tokens = match req.max_tokens {
        Some(n) if n > state.max_tokens => {
            return Err(ApiError::invalid(
                format!(
                    "`max_tokens` is {n}; this server allows at most {} (its --max_tokens)",
                    state.max_tokens
                ),
                Some("max_tokens"),
                Some("invalid_value"),
            ));
        }
        Some(n) if n > room => {
            return Err(ApiError::invalid(
                format!(
                    "This model's maximum context length is {} tokens; {what} {} and `max_tokens` asks {n} more (the server's --max_model_len sets it)",
                    state.context,
                    prompt.len()
                ),
                Some("max_tokens"),
                Some("context_length_exceeded"),
            ));
        }
        Some(n) => n,
        None => match kind {
            Kind::Chat => room.min(state.max_tokens),
            Kind::Completion => room.min(state.max_tokens).min(COMPLETION_MAX_TOKENS),
        },
    };
    let seed = req.seed.unwrap_or_else(|| {
        // Unseeded requests differ from each other.
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ state
            .ids
            .load(Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    let (tx, rx) = unbounded_channel();
    let id = state.next_id(kind);
    let job = Job {
        id: id.clone(),
        queued: std::time::Instant::now(),
        prompt,
        // With adapters beside the base, the model named is the row's adapter.
        adapter: if state.names.len() > 1 { req.model } else { 0 },
        params: Params {
            max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            seed,
            stop: req.stop.clone(),
        },
        updates: tx,
    };
    if state.engine.submit(job).is_err() {
        return Err(ApiError::server(
            "the model thread has stopped; restart the server",
        ));
    }
    Ok((req, id, rx))
}

/// A non-streamed answer: collects the text, then one JSON object.
async fn whole(
    state: &AppState,
    req: &ChatRequest,
    kind: Kind,
    id: String,
    mut updates: UnboundedReceiver<Update>,
) -> Response {
    let model = &state.names[req.model];
    let answer = match kind {
        Kind::Chat => api::completion,
        Kind::Completion => api::text_completion,
    };
    let mut text = String::new();
    while let Some(u) = updates.recv().await {
        match u {
            Update::Text(t) => text.push_str(&t),
            Update::Done {
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                return axum::Json(answer(
                    &id,
                    unix_now(),
                    model,
                    &text,
                    reason.as_str(),
                    api::usage(prompt_tokens, completion_tokens),
                ))
                .into_response();
            }
            Update::Failed(msg) => return ApiError::server(msg).into_response(),
        }
    }
    ApiError::server("the model thread stopped before answering").into_response()
}

/// A streamed answer: a role chunk, a chunk a piece of text, a chunk with
/// the finish reason, the usage chunk when asked, then `[DONE]`.
fn stream(
    state: Arc<AppState>,
    req: ChatRequest,
    kind: Kind,
    id: String,
    mut updates: UnboundedReceiver<Update>,
) -> Response {
    let (tx, rx) = unbounded_channel::<Result<Event, std::convert::Infallible>>();
    let created = unix_now();
    let usage_too = req.include_usage;
    let model = state.names[req.model].clone();
    // The relay ends when the client leaves (its stream, and so `tx`, is
    // dropped); dropping `updates` then tells the engine to stop the row.
    tokio::spawn(async move {
        let data = |v: Value| Ok(Event::default().data(v.to_string()));
        // A piece of text (None: the opening role chunk) and how it ended.
        let chunk = |text: Option<&str>, finish: Option<&str>| {
            data(match kind {
                Kind::Chat => {
                    let delta = match (text, finish) {
                        (None, _) => json!({"role": "assistant", "content": ""}),
                        (Some(_), Some(_)) => json!({}),
                        (Some(t), None) => json!({"content": t}),
                    };
                    api::chunk(&id, created, &model, Some((delta, finish)), None, usage_too)
                }
                Kind::Completion => api::text_chunk(
                    &id,
                    created,
                    &model,
                    Some((text.unwrap_or(""), finish)),
                    None,
                    usage_too,
                ),
            })
        };
        if kind == Kind::Chat && tx.send(chunk(None, None)).is_err() {
            return;
        }
        while let Some(u) = updates.recv().await {
            let sent = match u {
                Update::Text(t) => tx.send(chunk(Some(&t), None)),
                Update::Done {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    let _ = tx.send(chunk(Some(""), Some(reason.as_str())));
                    if usage_too {
                        let usage = api::usage(prompt_tokens, completion_tokens);
                        let last = match kind {
                            Kind::Chat => api::chunk(&id, created, &model, None, Some(usage), true),
                            Kind::Completion => {
                                api::text_chunk(&id, created, &model, None, Some(usage), true)
                            }
                        };
                        let _ = tx.send(data(last));
                    }
                    let _ = tx.send(Ok(Event::default().data("[DONE]")));
                    return;
                }
                Update::Failed(msg) => {
                    // Headers are gone: the error travels as an event.
                    let _ = tx.send(data(ApiError::server(msg).body()));
                    let _ = tx.send(Ok(Event::default().data("[DONE]")));
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
    Sse::new(UnboundedReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(name: Option<&str>, adapters: &[(Option<&str>, &str)]) -> ServeOptions {
        ServeOptions {
            model_dir: PathBuf::from("/m/base"),
            adapters: adapters
                .iter()
                .map(|(n, d)| (n.map(str::to_owned), PathBuf::from(d)))
                .collect(),
            name: name.map(str::to_owned),
            api_key: None,
            max_batch: 1,
            max_tokens: 1,
            max_model_len: None,
            log_requests: false,
            device: Device::Cpu,
            base_precision: BasePrecision::Bf16,
            deadlines: Deadlines::default(),
            special_tokens_in_messages: false,
        }
    }

    #[test]
    fn served_names_come_from_flags_or_folders_and_are_distinct() {
        let names = |o| served_names(&o).map_err(|e| e.to_string());
        assert_eq!(names(opts(None, &[])), Ok(vec!["base".into()]));
        // One adapter is merged and served under its own name.
        assert_eq!(names(opts(None, &[(None, "/r/a1")])), Ok(vec!["a1".into()]));
        assert_eq!(
            names(opts(Some("x"), &[(Some("y"), "/r/a1")])),
            Ok(vec!["x".into()])
        );
        // Several are served beside the base.
        assert_eq!(
            names(opts(None, &[(None, "/r/a1"), (Some("b"), "/r/a2")])),
            Ok(vec!["base".into(), "a1".into(), "b".into()])
        );
        let e = names(opts(None, &[(None, "/r/final"), (None, "/s/final")])).unwrap_err();
        assert!(
            e.contains("both called `final`") && e.contains("NAME=DIR"),
            "{e}"
        );
    }
}
