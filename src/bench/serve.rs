//! `bench serve`: the server under concurrent OpenAI-style clients, in one
//! process (the server on a local port, the clients on the same runtime).
//!
//! Two parts:
//! - throughput: `clients` streamed requests at once, each a prompt of
//!   about `prompt` tokens and `max_tokens` new ones at temperature 0.7 with
//!   a seed of its own: completion tokens/s of all clients together, time to
//!   first token (the first chunk with text) and latency;
//! - soak (`soak_seconds`): `soak_clients` clients asking in a loop with
//!   random lengths and sampling settings, streamed and plain, a share of
//!   them hanging up mid-answer; every answer must be whole (a finish
//!   reason, usage within its limit, `[DONE]` when streamed) or cleanly
//!   cut by its client, the server's counters must add up, and the host's
//!   and the GPU pool's memory are sampled to show they stay flat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use candle_core::Device;
use serde::Serialize;
use serde_json::{Value, json};

use crate::data::ChatTokenizer;
use crate::rng::SplitMix64;
use crate::serve::{self, AppState, ServeOptions};

/// What `bench serve` runs.
#[derive(Debug, Clone)]
pub struct ServeBench {
    pub model_dir: std::path::PathBuf,
    pub clients: usize,
    pub prompt: usize,
    pub max_tokens: usize,
    pub max_batch: usize,
    pub max_model_len: Option<usize>,
    pub soak_seconds: u64,
    pub soak_clients: usize,
    /// Share of soak requests whose client hangs up mid-answer.
    pub cancel_share: f64,
    /// How the server holds the frozen weights, as `serve --base_precision`.
    pub base_precision: crate::model::BasePrecision,
}

#[derive(Debug, Serialize)]
pub struct Throughput {
    pub clients: usize,
    /// Decode steps, and the model thread's seconds in steps and prefills
    /// (the rest of `seconds` is the host's work and waiting).
    pub steps: u64,
    pub step_s: f64,
    pub prefill_s: f64,
    pub answered: usize,
    pub completion_tokens: u64,
    pub seconds: f64,
    pub completion_tokens_per_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_max_s: f64,
    pub latency_p50_s: f64,
    pub latency_max_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Soak {
    pub seconds: f64,
    pub clients: usize,
    pub answered: u64,
    pub cancelled_by_client: u64,
    pub completion_tokens: u64,
    /// Answers that were not whole, with why (the first 20).
    pub bad: Vec<String>,
    pub bad_count: u64,
    /// The server's counters at the end, by outcome.
    pub server_outcomes: Value,
    /// Whether requests received = requests ended (nothing lost).
    pub counters_add_up: bool,
    /// `(seconds, host RSS MiB, GPU pool MiB in use)` every 10 s.
    pub memory: Vec<(f64, u64, Option<u64>)>,
}

#[derive(Debug, Serialize)]
pub struct ServeResult {
    pub ours: &'static str,
    pub job: &'static str,
    pub model: String,
    pub base_precision: crate::model::BasePrecision,
    pub rows: usize,
    pub context: usize,
    pub fused: bool,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub throughput: Throughput,
    pub soak: Option<Soak>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A user message whose chat prompt takes about `tokens` tokens.
fn message(tok: &ChatTokenizer, tokens: usize, i: usize) -> anyhow::Result<String> {
    let mut text = format!("Predict the exact output of program {i}:\n");
    let mut k = 0;
    loop {
        let msgs = [crate::data::Message::new(
            crate::data::Role::User,
            text.as_str(),
        )];
        if tok.encode_prompt(&msgs)?.len() >= tokens {
            return Ok(text);
        }
        k += 1;
        text.push_str(&format!("x{k} = {} * {k} + {}\n", i + 3, k % 7));
    }
}

/// What one request came back with.
struct Answer {
    ttft: Option<f64>,
    latency: f64,
    completion_tokens: u64,
}

/// Sends one request; checks the answer is whole. `hang_up_after`: drop the
/// streamed answer after that many chunks (a client going away).
async fn ask(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
    hang_up_after: Option<usize>,
) -> anyhow::Result<Option<Answer>> {
    let t = Instant::now();
    let stream = body["stream"].as_bool().unwrap_or(false);
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(u64::MAX);
    let mut resp = http
        .post(format!("{url}/chat/completions"))
        .json(body)
        .timeout(Duration::from_secs(600))
        .send()
        .await
        .context("sending")?;
    let status = resp.status();
    anyhow::ensure!(
        status.is_success(),
        "HTTP {status}: {}",
        resp.text().await.unwrap_or_default()
    );
    if !stream {
        let v: Value = resp.json().await.context("reading the JSON answer")?;
        let finish = v["choices"][0]["finish_reason"].as_str().unwrap_or("");
        let used = v["usage"]["completion_tokens"].as_u64().unwrap_or(u64::MAX);
        anyhow::ensure!(
            matches!(finish, "stop" | "length"),
            "finish_reason {finish:?}"
        );
        anyhow::ensure!(
            used <= max_tokens,
            "{used} tokens for max_tokens {max_tokens}"
        );
        anyhow::ensure!(
            finish != "length" || used == max_tokens,
            "length after {used} of {max_tokens} tokens"
        );
        return Ok(Some(Answer {
            ttft: None,
            latency: t.elapsed().as_secs_f64(),
            completion_tokens: used,
        }));
    }
    let mut buf = String::new();
    let mut chunks = 0usize;
    let mut ttft = None;
    let mut finish: Option<String> = None;
    let mut usage = None;
    let mut done = false;
    while let Some(bytes) = resp.chunk().await.context("reading the stream")? {
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data).context("a chunk that is not JSON")?;
                anyhow::ensure!(v.get("error").is_none(), "an error event: {data}");
                chunks += 1;
                if let Some(c) = v["choices"][0]["delta"]["content"].as_str()
                    && !c.is_empty()
                    && ttft.is_none()
                {
                    ttft = Some(t.elapsed().as_secs_f64());
                }
                if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                    finish = Some(f.to_owned());
                }
                if let Some(u) = v["usage"]["completion_tokens"].as_u64() {
                    usage = Some(u);
                }
            }
        }
        if hang_up_after.is_some_and(|n| chunks >= n) && !done {
            return Ok(None); // dropping `resp` closes the connection
        }
    }
    anyhow::ensure!(done, "the stream ended without [DONE]");
    let finish = finish.context("no finish_reason")?;
    anyhow::ensure!(
        matches!(finish.as_str(), "stop" | "length"),
        "finish_reason {finish:?}"
    );
    let used = usage.context("no usage chunk")?;
    anyhow::ensure!(
        used <= max_tokens,
        "{used} tokens for max_tokens {max_tokens}"
    );
    Ok(Some(Answer {
        ttft,
        latency: t.elapsed().as_secs_f64(),
        completion_tokens: used,
    }))
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

pub fn run(b: &ServeBench, device: &Device) -> anyhow::Result<ServeResult> {
    crate::gpu::keep_freed_memory(device)?;
    let state = AppState::load(&ServeOptions {
        model_dir: b.model_dir.clone(),
        adapters: Vec::new(),
        name: Some("bench".into()),
        api_key: None,
        max_batch: b.max_batch,
        max_tokens: b.max_tokens,
        max_model_len: b.max_model_len,
        log_requests: false,
        device: device.clone(),
        base_precision: b.base_precision,
        deadlines: Default::default(),
        special_tokens_in_messages: false,
    })?;
    let cap = state.capacity();
    let tok = ChatTokenizer::from_dir(&b.model_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1", listener.local_addr()?);
        let server = Arc::clone(&state);
        tokio::spawn(async move {
            let _ = serve::serve(
                listener,
                server,
                std::future::pending(),
                std::future::pending(),
            )
            .await;
        });
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()?;
        let body = |i: usize, text: &str, max_tokens: usize| {
            json!({
                "model": "bench",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0.7,
                "seed": i,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        };
        // Warm-up: kernels loaded, the graph captured.
        let warm = message(&tok, b.prompt, 0)?;
        ask(&http, &url, &body(0, &warm, 8), None)
            .await?
            .context("warm-up")?;
        let texts: Vec<String> = (0..b.clients)
            .map(|i| message(&tok, b.prompt, i + 1))
            .collect::<anyhow::Result<_>>()?;
        let before = state.model_time();
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let (http, url, body) = (http.clone(), url.clone(), body(i + 1, text, b.max_tokens));
            tasks.push(tokio::spawn(
                async move { ask(&http, &url, &body, None).await },
            ));
        }
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await??.context("an answer")?);
        }
        let seconds = t0.elapsed().as_secs_f64();
        let after = state.model_time();
        let tokens: u64 = answers.iter().map(|a| a.completion_tokens).sum();
        let mut ttft: Vec<f64> = answers.iter().filter_map(|a| a.ttft).collect();
        let mut lat: Vec<f64> = answers.iter().map(|a| a.latency).collect();
        ttft.sort_by(f64::total_cmp);
        lat.sort_by(f64::total_cmp);
        let throughput = Throughput {
            clients: b.clients,
            steps: after.0 - before.0,
            step_s: after.1 - before.1,
            prefill_s: after.2 - before.2,
            answered: answers.len(),
            completion_tokens: tokens,
            seconds,
            completion_tokens_per_s: tokens as f64 / seconds,
            ttft_p50_s: pct(&ttft, 0.5),
            ttft_max_s: ttft.last().copied().unwrap_or(0.0),
            latency_p50_s: pct(&lat, 0.5),
            latency_max_s: lat.last().copied().unwrap_or(0.0),
        };
        eprintln!("throughput: {}", serde_json::to_string(&throughput)?);
        let soak = if b.soak_seconds > 0 {
            Some(soak(b, device, &http, &url, &tok, &state).await?)
        } else {
            None
        };
        anyhow::Ok(ServeResult {
            ours: "trace-train",
            job: "serve",
            model: b.model_dir.display().to_string(),
            base_precision: b.base_precision,
            rows: cap.rows,
            context: cap.context,
            fused: cap.fused,
            prompt_tokens: tok
                .encode_prompt(&[crate::data::Message::new(
                    crate::data::Role::User,
                    texts[0].as_str(),
                )])?
                .len(),
            max_tokens: b.max_tokens,
            throughput,
            soak,
        })
    })
}

async fn soak(
    b: &ServeBench,
    device: &Device,
    http: &reqwest::Client,
    url: &str,
    tok: &ChatTokenizer,
    state: &AppState,
) -> anyhow::Result<Soak> {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(b.soak_seconds);
    let answered = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(Mutex::new((0u64, Vec::<String>::new())));
    let texts: Arc<Vec<String>> = Arc::new(
        [16, 64, b.prompt / 2, b.prompt]
            .iter()
            .enumerate()
            .map(|(i, &n)| message(tok, n.max(1), 1000 + i))
            .collect::<anyhow::Result<_>>()?,
    );
    let mut tasks = Vec::new();
    for c in 0..b.soak_clients {
        let (http, url) = (http.clone(), url.to_owned());
        let (answered, cancelled, tokens, bad, texts) = (
            answered.clone(),
            cancelled.clone(),
            tokens.clone(),
            bad.clone(),
            texts.clone(),
        );
        let (max_tokens, cancel_share) = (b.max_tokens, b.cancel_share);
        tasks.push(tokio::spawn(async move {
            let mut rng = SplitMix64::new(0x50a6 + c as u64);
            let mut k = 0u64;
            while Instant::now() < deadline {
                k += 1;
                let stream = rng.chance(0.5);
                let hang_up = rng.chance(cancel_share);
                let mut body = json!({
                    "model": "bench",
                    "messages": [{"role": "user", "content": rng.pick(&texts)}],
                    "max_tokens": 1 + rng.below(max_tokens as u64),
                    "temperature": *rng.pick(&[0.0, 0.7, 1.0]),
                    "top_p": *rng.pick(&[1.0, 0.9]),
                    "seed": rng.next_u64() >> 12,
                    "stream": stream,
                });
                if stream {
                    body["stream_options"] = json!({"include_usage": true});
                }
                let r = if hang_up && !stream {
                    // A plain request abandoned after a while.
                    let wait = Duration::from_millis(50 + rng.below(2000));
                    match tokio::time::timeout(wait, ask(&http, &url, &body, None)).await {
                        Ok(r) => r,
                        Err(_) => Ok(None),
                    }
                } else {
                    let after = hang_up.then(|| 2 + rng.below(6) as usize);
                    ask(&http, &url, &body, after).await
                };
                match r {
                    Ok(Some(a)) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                        tokens.fetch_add(a.completion_tokens, Ordering::Relaxed);
                    }
                    Ok(None) => {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        let mut b = bad.lock().unwrap_or_else(|p| p.into_inner());
                        b.0 += 1;
                        if b.1.len() < 20 {
                            b.1.push(format!("client {c} request {k}: {e:#}"));
                        }
                    }
                }
            }
        }));
    }
    let mut memory = Vec::new();
    let used = |d: &Device| crate::gpu::used_memory(d).ok().flatten().map(|b| b >> 20);
    while Instant::now() < deadline {
        memory.push((t0.elapsed().as_secs_f64(), rss_mib(), used(device)));
        tokio::time::sleep(Duration::from_secs(10).min(deadline - Instant::now())).await;
    }
    for t in tasks {
        t.await?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    // The server notices the last hang-ups at its next step.
    let mut adds_up = false;
    let mut outcomes = Value::Null;
    for _ in 0..60 {
        let m = state.metrics_snapshot();
        outcomes = m.0;
        adds_up = m.1;
        if adds_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    memory.push((seconds, rss_mib(), used(device)));
    let (bad_count, bad) = std::mem::take(&mut *bad.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(Soak {
        seconds,
        clients: b.soak_clients,
        answered: answered.load(Ordering::Relaxed),
        cancelled_by_client: cancelled.load(Ordering::Relaxed),
        completion_tokens: tokens.load(Ordering::Relaxed),
        bad,
        bad_count,
        server_outcomes: outcomes,
        counters_add_up: adds_up,
        memory,
    })
}
