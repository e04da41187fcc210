//! `serve`: flags → the server's options → load the model → listen until
//! Ctrl-C or SIGTERM.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use trace_train::serve::{self, AppState, ServeOptions};

/// The environment variable read when `--api_key` is not given.
pub const API_KEY_ENV: &str = "TRACE_TRAIN_API_KEY";

#[derive(Args, Clone)]
#[command(rename_all = "snake_case")]
pub struct ServeArgs {
    /// Model folder (a merged model, or the base model with --adapter), or
    /// a hub id in the Hugging Face cache.
    #[arg(long)]
    pub model: String,
    /// A LoRA adapter folder (PEFT layout) of --model, as `DIR` or
    /// `NAME=DIR` (the id clients name; default: the folder's name). One
    /// adapter is merged and served alone; repeated, every adapter is
    /// served beside the base and each request's `model` picks one.
    #[arg(long, value_name = "[NAME=]DIR")]
    pub adapter: Vec<String>,
    /// Address to listen on (`0.0.0.0` for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed on stdout).
    #[arg(long, default_value_t = 8001)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 (default: the
    /// TRACE_TRAIN_API_KEY environment variable; unset: no key).
    #[arg(long)]
    pub api_key: Option<String>,
    /// The model id clients name (default: the model or adapter folder's
    /// name); with several adapters, the base's id.
    #[arg(long)]
    pub name: Option<String>,
    /// Most requests decoded together.
    #[arg(long, default_value_t = 16)]
    pub max_batch: usize,
    /// Most new tokens a request may ask for, and what it gets when it
    /// does not say.
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: usize,
    /// Tokens a request's prompt and answer may take together; every row of
    /// the batch holds this many (default: 4096, or the model's context when
    /// smaller).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Print a line on stderr for every request that ends (id, outcome,
    /// tokens, seconds).
    #[arg(long)]
    pub log_requests: bool,
    /// `cpu`, `cuda`, `cuda:N` or `auto`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// How the frozen weights are held while serving: `bf16` (as loaded),
    /// `nf4` (4 bits; on a GPU only) or `fp8` (8 bits, FP8 products), as
    /// `model.base_precision` says for training.
    #[arg(long, value_name = "bf16|nf4|fp8", value_parser = super::parse_base_precision, default_value = "bf16")]
    pub base_precision: trace_train::model::BasePrecision,
    /// Seconds a client has to send a request's headers, and again its
    /// body; a slower one is cut off (408 for a body).
    #[arg(long, default_value_t = serve::Deadlines::default().body.as_secs_f64())]
    pub request_timeout: f64,
    /// Seconds open requests get to finish after SIGTERM or Ctrl-C before
    /// they are closed (a second signal closes them at once).
    #[arg(long, default_value_t = serve::Deadlines::default().shutdown.as_secs_f64())]
    pub shutdown_timeout: f64,
    /// Connections served at once; more wait until one closes.
    #[arg(long, default_value_t = serve::Deadlines::default().max_connections)]
    pub max_connections: usize,
    /// Let special-token strings in request messages (`<|im_end|>`, ...)
    /// act as control tokens. Off, they are text, and a message cannot
    /// close its turn or open another role's.
    #[arg(long)]
    pub special_tokens_in_messages: bool,
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let device = super::pick_device(&args.device)?;
    let model_dir = trace_train::model::resolve(&args.model)?;
    let api_key = args
        .api_key
        .clone()
        .or_else(|| std::env::var(API_KEY_ENV).ok())
        .filter(|k| !k.is_empty());
    let state = AppState::load(&ServeOptions {
        model_dir,
        adapters: args.adapter.iter().map(|a| named_adapter(a)).collect(),
        name: args.name.clone(),
        api_key: api_key.clone(),
        max_batch: args.max_batch,
        max_tokens: args.max_tokens,
        max_model_len: args.max_model_len,
        log_requests: args.log_requests,
        device,
        base_precision: args.base_precision,
        deadlines: serve::Deadlines {
            headers: seconds(args.request_timeout, "--request_timeout")?,
            body: seconds(args.request_timeout, "--request_timeout")?,
            shutdown: seconds(args.shutdown_timeout, "--shutdown_timeout")?,
            max_connections: args.max_connections,
        },
        special_tokens_in_messages: args.special_tokens_in_messages,
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {}:{}\nhint: another process may hold the port; choose another with --port",
                    args.host, args.port
                )
            })?;
        let addr = listener.local_addr()?;
        // The address on stdout (a script reads it), the rest on stderr.
        println!("http://{addr}/v1");
        std::io::stdout().flush()?;
        let cap = state.capacity();
        let names: Vec<String> = state.names().iter().map(|n| format!("`{n}`")).collect();
        eprintln!(
            "serving {} at http://{addr}/v1 ({} rows of {} tokens, {}, {}); Ctrl-C stops",
            names.join(", "),
            cap.rows,
            cap.context,
            if cap.fused {
                "the fused decode step"
            } else {
                "op by op"
            },
            if api_key.is_some() {
                "bearer key required"
            } else {
                "no key"
            }
        );
        // The first stop signal begins the shutdown, a second ends it.
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
        let (again_tx, again_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            stop_signal().await;
            eprintln!("stopping: no new requests; open ones get their time");
            let _ = first_tx.send(());
            stop_signal().await;
            let _ = again_tx.send(());
        });
        serve::serve(
            listener,
            state,
            async {
                let _ = first_rx.await;
            },
            async {
                let _ = again_rx.await;
            },
        )
        .await?;
        anyhow::Ok(())
    })
}

/// `--adapter`'s `NAME=DIR` or `DIR`. A folder whose own name holds `=`
/// is taken whole when it exists.
fn named_adapter(arg: &str) -> (Option<String>, PathBuf) {
    match arg.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !std::path::Path::new(arg).exists() => {
            (Some(name.to_owned()), PathBuf::from(dir))
        }
        _ => (None, PathBuf::from(arg)),
    }
}

/// A duration of `s` seconds given by `flag`.
fn seconds(s: f64, flag: &str) -> anyhow::Result<std::time::Duration> {
    anyhow::ensure!(
        s.is_finite() && s > 0.0,
        "{flag}: {s} is not a number of seconds above 0"
    );
    Ok(std::time::Duration::from_secs_f64(s))
}

/// Completes on Ctrl-C or SIGTERM.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot watch SIGTERM ({e}); Ctrl-C still stops the server");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapter_is_named_by_name_equals_dir_or_by_its_folder() {
        assert_eq!(
            named_adapter("terse=runs/a/final"),
            (Some("terse".into()), PathBuf::from("runs/a/final"))
        );
        assert_eq!(
            named_adapter("runs/a/final"),
            (None, PathBuf::from("runs/a/final"))
        );
        assert_eq!(named_adapter("=x"), (None, PathBuf::from("=x")));
        // A folder whose own name holds `=` is taken whole.
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("lr=1e-4");
        std::fs::create_dir(&odd).unwrap();
        let arg = odd.display().to_string();
        assert_eq!(named_adapter(&arg), (None, odd));
    }
}
