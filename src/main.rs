//! The `trace-train` command: parse flags → resolve settings → run a stage →
//! print the error chain and exit non-zero on failure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

mod cli;

/// Training allocates and frees large tensors every step; glibc's malloc
/// hands each back to the kernel and faults it in again, which costs more
/// system time than the arithmetic on CPU. mimalloc keeps them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use trace_train::config::{self, GenerateConfig, PipelineConfig, SeedScheme};
use trace_train::generate::{self, RunOptions};
use trace_train::sandbox::{self, Executor, ExecutorConfig, Request};

#[derive(Parser)]
#[command(
    name = "trace-train",
    version,
    about = "Post-train language models on the Trace task (predict a program's exact stdout)"
)]
struct Cli {
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Stage 0: run every program in the sandbox and write the original and
    /// transformed training sets.
    Generate(GenerateArgs),
    /// Run untrusted Python in the sandbox, or report its protections.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Measure against the peer approach, in one run.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Check config files (parse and validate each, naming what is wrong),
    /// then show the settings of the pipeline and each stage with where
    /// each value came from; `config pipeline|warmup|sft FLAGS` shows them
    /// with those flags.
    Config(ConfigArgs),
    /// What to paste into a bug report: versions, GPU stack, sandbox, HF
    /// settings.
    Env(cli::env::EnvArgs),
    /// Stage 1: LoRA SFT on the original programs.
    Warmup(cli::train::TrainArgs),
    /// Stage 2: LoRA SFT on the transformed programs, from Stage 1's merged
    /// model.
    Sft(cli::train::TrainArgs),
    /// Stage 3: online RL (PPO or GRPO) against the trace environment,
    /// from Stage 2's merged model.
    Ppo(cli::ppo::PpoArgs),
    /// Sample K answers to each prompt of an environment and score them:
    /// JSON lines for `prefs`.
    Rollouts(cli::pref::RolloutsArgs),
    /// Preference pairs from rollouts: correct over incorrect answers of a
    /// prompt (and optionally better over worse correct ones).
    Prefs(cli::pref::PrefsArgs),
    /// DPO (sigmoid, ipo, robust or hinge loss, optional NLL term) on
    /// preference pairs, from Stage 2's merged model.
    Dpo(cli::pref::DpoArgs),
    /// Accuracy on a test set: batched greedy generation, the environment's
    /// scoring, a Jeffreys interval, a JSON report.
    Eval(cli::eval::EvalArgs),
    /// Stages 0, 1, 2, 3 and eval in order, from config/pipeline_config.json.
    Pipeline(cli::pipeline::PipelineArgs),
    /// Prepare model folders.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Serve a model over an OpenAI-compatible HTTP API
    /// (/v1/chat/completions, /v1/models, /health).
    Serve(cli::serve::ServeArgs),
    /// Redraw a training run's curves and print its summary.
    Report(cli::report::ReportArgs),
    /// Print one task of an environment (trace, sat, abd, ded) as JSON: its
    /// prompt and what scoring it needs.
    Task(cli::envs::TaskArgs),
    /// Compare models' `eval --environment` reports: per-environment table
    /// with intervals, dominance by the Pareto, Beta and threshold rules,
    /// the frontier; JSON and a picture on request.
    Compare(cli::compare::CompareArgs),
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Turn a llama.cpp GGUF (Llama architecture, e.g. SmolLM2) into a
    /// Hugging Face model folder: f32 safetensors, config, tokenizer, chat
    /// template. Prints the import report as JSON.
    ImportGguf {
        /// The `.gguf` file.
        file: PathBuf,
        /// The folder to write (created if needed).
        out: PathBuf,
    },
    /// Write a tiny random Qwen3 chat model (byte-level tokenizer, ChatML
    /// template) that trains in seconds: for quick runs and tests.
    Tiny {
        /// The folder to write (created if needed).
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

#[derive(Args)]
#[command(rename_all = "snake_case")]
struct GenerateArgs {
    /// Stage config (default: config/generate.json when present, else the
    /// built-in defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// `builtin`, a JSONL path, `humaneval:PATH`, `synthetic:N[:SEED]` (N
    /// programs made from a seed), or a hub dataset id; several joined by
    /// `+` (`builtin+humaneval:PATH`) are read as one.
    #[arg(long)]
    dataset: Option<String>,
    /// Where the datasets and stats go (default datasets/trace_training).
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Use at most this many rows.
    #[arg(long)]
    max_samples: Option<usize>,
    /// Transformed variants a program (the Python pipeline's
    /// `--variants_per_sample`).
    #[arg(long, alias = "variants_per_sample")]
    variants: Option<usize>,
    /// Sandbox worker slots (default: two a core).
    #[arg(long)]
    num_workers: Option<usize>,
    /// Seed of the train/test split.
    #[arg(long)]
    seed: Option<u64>,
    /// `env` (task_id → row and seed) or `peer` (row*1000 + variant).
    #[arg(long, value_parser = parse_scheme)]
    seed_scheme: Option<SeedScheme>,
    /// Interpreter every uid can run.
    #[arg(long)]
    python: Option<PathBuf>,
    /// Count and skip malformed dataset lines instead of stopping.
    #[arg(long)]
    skip_bad: bool,
    /// Balance each training split by output-line bucket (1, 2-3, 4-10,
    /// 11+): over-full buckets are cut to --balance_ratio times the smallest.
    #[arg(long)]
    balance_lines: bool,
    /// With --balance_lines: most records a bucket keeps, as a multiple of
    /// the smallest non-empty bucket (>= 1).
    #[arg(long)]
    balance_ratio: Option<f64>,
    /// With --balance_lines: the features to balance by, jointly, comma
    /// separated (output_lines, loop_depth, lines, injections).
    #[arg(long, value_delimiter = ',')]
    balance_by: Option<Vec<String>>,
    /// Small built-in run that finishes in seconds.
    #[arg(long)]
    quick_test: bool,
    /// Instead of the trace datasets: SFT records of the sibling
    /// environments (sat, abd, ded, joined by `+`, each optionally
    /// weighted), one file each and their weighted mixture; `trace` in the
    /// list adds this folder's Stage 2 training set to the mixture.
    #[arg(long)]
    environment: Option<String>,
    /// With --environment: tasks an environment, its first N training
    /// tasks (every tenth task id is held out for `eval --environment`;
    /// ABD and DED stop at their last row).
    #[arg(long, default_value_t = 200)]
    tasks: u64,
    /// With --environment: ABD's rows (as `eval --abd_dataset`).
    #[arg(long, default_value = "builtin")]
    abd_dataset: String,
    /// With --environment: DED's rows (as `eval --ded_dataset`).
    #[arg(long, default_value = "ded-builtin")]
    ded_dataset: String,
    #[command(flatten)]
    unsafe_flag: UnsafeFlag,
}

#[derive(Args)]
pub struct UnsafeFlag {
    /// Run programs WITHOUT isolation (rlimits only). Only for machines and
    /// programs you trust; never settable from a config file.
    #[arg(long = "unsafe-no-sandbox")]
    pub unsafe_no_sandbox: bool,
}

fn parse_scheme(s: &str) -> Result<SeedScheme, String> {
    match s {
        "env" => Ok(SeedScheme::Env),
        "peer" => Ok(SeedScheme::Peer),
        _ => Err(format!("`{s}` is not `env` or `peer`")),
    }
}

#[derive(Subcommand)]
enum SandboxCommand {
    /// Report which protections are in force on this machine.
    Check(SandboxCommon),
    /// Run one program and print its outcome as JSON.
    #[command(rename_all = "snake_case")]
    Run {
        /// The Python program.
        file: PathBuf,
        /// File whose bytes are the program's stdin.
        #[arg(long)]
        stdin: Option<PathBuf>,
        /// CPU time limit in seconds.
        #[arg(long, default_value_t = 10)]
        cpu_seconds: u64,
        /// Wall-clock deadline in milliseconds.
        #[arg(long, default_value_t = 30_000)]
        wall_ms: u64,
        #[command(flatten)]
        common: SandboxCommon,
    },
}

#[derive(Args)]
#[command(rename_all = "snake_case")]
struct SandboxCommon {
    /// The interpreter, runnable by every uid.
    #[arg(long, default_value = "/usr/bin/python3")]
    python: PathBuf,
    #[command(flatten)]
    unsafe_flag: UnsafeFlag,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Programs/s and per-program overhead: our sandbox vs unsandboxed
    /// subprocess.run in a thread pool, same cores, same programs.
    #[command(rename_all = "snake_case")]
    Sandbox {
        /// The interpreter both sides run.
        #[arg(long, default_value = "/usr/bin/python3")]
        python: PathBuf,
        /// Our worker slots (default: two a core). The peer runs with one
        /// and with two threads a core; its better run is the baseline.
        #[arg(long)]
        num_workers: Option<usize>,
        /// Passes over the built-in corpus.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Runs of the empty program for the per-program overhead.
        #[arg(long, default_value_t = 200)]
        overhead_runs: usize,
        /// Interleaved rounds of each side; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Also write the result as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// LoRA SFT tokens/s on random weights of a model's shape (run the
    /// peer's `hf_peer.py sft` with the same flags in the same call).
    #[command(rename_all = "snake_case")]
    Train {
        /// smollm2-135m, qwen3-0.6b, qwen3-1.7b or qwen3-4b (random
        /// weights), or a model folder (its own weights).
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// Sequences a step.
        #[arg(long, default_value_t = 4)]
        batch: usize,
        /// Tokens a sequence.
        #[arg(long, default_value_t = 1024)]
        seq: usize,
        /// LoRA rank.
        #[arg(long, default_value_t = 16)]
        rank: usize,
        /// Timed steps, after two untimed ones.
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// Micro-batches of `--batch` rows a step (the global batch is
        /// batch x accum on any number of GPUs).
        #[arg(long, default_value_t = 1)]
        accum: usize,
        /// GPUs, one process each, sharing each step's rows (data parallel
        /// over NCCL); tokens/s is the whole job's.
        #[arg(long, default_value_t = 1)]
        num_gpus: usize,
        /// Recompute each layer in the backward pass (the peer's `--gc`).
        #[arg(long)]
        gc: bool,
        /// Frozen projections in NF4 with double quantisation (QLoRA; the
        /// peer's `--4bit`).
        #[arg(long = "4bit")]
        four_bit: bool,
        /// `cpu`, `cuda`, `cuda:N` or `auto`.
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// `serve` under concurrent clients in one process: completion
    /// tokens/s and time to first token of `--clients` streamed requests at
    /// once, then (with `--soak_seconds`) a soak of random requests, some
    /// hung up mid-answer, checking every answer and the server's memory.
    #[command(rename_all = "snake_case")]
    Serve {
        /// A model folder (weights, tokenizer with a chat template).
        #[arg(long)]
        model: String,
        /// Requests sent at once for the throughput part.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// About this many prompt tokens a request.
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// New tokens a request (the soak's requests ask 1 to this many).
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        /// The server's --max_batch (default: --clients).
        #[arg(long)]
        max_batch: Option<usize>,
        /// The server's --max_model_len.
        #[arg(long)]
        max_model_len: Option<usize>,
        /// Seconds of soak after the throughput part (0: none).
        #[arg(long, default_value_t = 0)]
        soak_seconds: u64,
        /// Clients of the soak.
        #[arg(long, default_value_t = 200)]
        soak_clients: usize,
        /// Share of soak requests whose client hangs up mid-answer.
        #[arg(long, default_value_t = 0.1)]
        cancel_share: f64,
        /// `cpu`, `cuda`, `cuda:N` or `auto`.
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Batched sampling (temperature 0.7, KV cache) new tokens/s on random
    /// weights (run the peer's `hf_peer.py gen` with the same flags).
    #[command(rename_all = "snake_case")]
    Gen {
        /// smollm2-135m, qwen3-0.6b, qwen3-1.7b or qwen3-4b (random
        /// weights), or a model folder (its own weights).
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// Sequences decoded together.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Prompt tokens a sequence.
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// New tokens a sequence.
        #[arg(long, default_value_t = 256)]
        new: usize,
        /// A LoRA adapter of this rank on all seven projections, with
        /// non-zero factors, as an RL policy samples (the peer has none).
        #[arg(long)]
        rank: Option<usize>,
        /// The projections' base weights in NF4, as QLoRA holds them.
        #[arg(long = "4bit")]
        four_bit: bool,
        /// The decoding path on CUDA: `graph` (the fused step replayed as a
        /// CUDA graph, the default), `eager` (the fused step launched
        /// kernel by kernel) or `ops` (the model's op-by-op forward).
        #[arg(long, default_value = "graph", value_parser = ["graph", "eager", "ops"])]
        path: String,
        /// `cpu`, `cuda`, `cuda:N` or `auto`.
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// One real Stage 3 step (sample with every answer exactly --new
    /// tokens, score, old-log-prob and reference passes, update) with its
    /// time split, tokens/s and peak GPU memory as one JSON line (run the
    /// peer's `trl_rl_peer.py` with the same flags).
    #[command(rename_all = "snake_case")]
    Rl {
        /// smollm2-135m, qwen3-0.6b, qwen3-1.7b, qwen3-4b or tiny (random
        /// weights), or a model folder with its tokenizer.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// `ppo` (value head, GAE) or `grpo` (group-relative advantages).
        #[arg(long, default_value = "ppo", value_parser = ["ppo", "grpo"])]
        algorithm: String,
        /// Prompts a step.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Completions a prompt (default: 1 for PPO, 8 for GRPO).
        #[arg(long)]
        group: Option<usize>,
        /// Tokens a prompt (random token ids).
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// Tokens every completion has (no stop token ends one early).
        #[arg(long, default_value_t = 512)]
        new: usize,
        /// Completions a minibatch, one optimizer step each (Stage 3's
        /// `mini_batch_size`).
        #[arg(long, default_value_t = 16)]
        mini_batch_size: usize,
        /// Timed steps, after one untimed warm-up step; the mean is shown.
        #[arg(long, default_value_t = 1)]
        steps: usize,
        /// Recompute each layer in the backward pass (Stage 3's default on a
        /// GPU; off here unless given).
        #[arg(long)]
        gc: bool,
        /// Frozen projections in NF4 with double quantisation (QLoRA).
        #[arg(long = "4bit")]
        four_bit: bool,
        /// `cpu`, `cuda`, `cuda:N` or `auto`.
        #[arg(long, default_value = "auto")]
        device: String,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ConfigArgs {
    #[command(subcommand)]
    show: Option<cli::config::Show>,
    /// Config files to check (default: every file in config/, then the
    /// resolved settings are shown).
    files: Vec<PathBuf>,
    /// Show the resolved settings as JSON.
    #[arg(long, global = true)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = run(cli.command);
    if let Err(e) = &result {
        eprintln!("error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
    }
    // A run a stop signal cut short (it checkpointed and returned) is
    // neither finished nor failed: 128 + the signal, as the shell reports.
    if trace_train::stop::was_cut_short() {
        let sig = trace_train::stop::received().unwrap_or(signal_hook::consts::SIGTERM);
        if result.is_ok() {
            eprintln!(
                "stopped by {}: the last checkpoint is kept; continue with --resume",
                trace_train::stop::name(sig)
            );
        }
        return ExitCode::from(trace_train::stop::exit_status(sig));
    }
    match result {
        Ok(code) => code,
        Err(_) => ExitCode::FAILURE,
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Eval(args) => {
            match (&args.compare, &args.envs.environment) {
                (Some(files), _) => cli::eval::run_compare(&files[0], &files[1])?,
                (None, Some(spec)) => {
                    cli::eval::run_envs_eval(&args, spec)?;
                }
                (None, None) => {
                    cli::eval::run_eval(&args)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Pipeline(args) => {
            cli::pipeline::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Warmup(args) => {
            cli::train::run_command("warmup", &args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sft(args) => {
            cli::train::run_command("sft", &args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => {
            cli::serve::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Report(args) => {
            cli::report::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Task(args) => {
            cli::envs::run_task(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Compare(args) => {
            cli::compare::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ppo(args) => {
            cli::ppo::run_command(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Rollouts(args) => {
            let stats = cli::pref::rollouts(&args)?;
            println!("{}", serde_json::to_string(&stats)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Prefs(args) => {
            let stats = cli::pref::prefs(&args)?;
            println!("{}", serde_json::to_string(&stats)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Dpo(args) => {
            cli::pref::dpo_command(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate(args) => generate_cmd(args),
        Command::Sandbox(SandboxCommand::Check(c)) => {
            let exec = executor(&c, 1)?;
            let report = sandbox::check_protections(&exec);
            println!("{}", serde_json::to_string_pretty(&report)?);
            for p in &report.protections {
                eprintln!(
                    "{:<22} {:<3} {}",
                    p.name,
                    if p.in_force { "yes" } else { "NO" },
                    p.evidence
                );
            }
            Ok(if report.all_in_force() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            })
        }
        Command::Sandbox(SandboxCommand::Run {
            file,
            stdin,
            cpu_seconds,
            wall_ms,
            common,
        }) => {
            let program = std::fs::read(&file)
                .with_context(|| format!("cannot read `{}`", file.display()))?;
            let input = match &stdin {
                Some(p) => {
                    std::fs::read(p).with_context(|| format!("cannot read `{}`", p.display()))?
                }
                None => Vec::new(),
            };
            let exec = executor(&common, 1)?;
            let mut req = Request::new(program, input);
            req.limits.cpu_seconds = cpu_seconds;
            req.limits.wall_ms = wall_ms;
            let out = exec.run(&req);
            println!("{}", serde_json::to_string_pretty(&out.to_json())?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Train {
            model,
            batch,
            seq,
            rank,
            steps,
            accum,
            num_gpus,
            gc,
            four_bit,
            device,
        }) => {
            let bench = trace_train::bench::train::TrainBench {
                model,
                batch,
                seq,
                rank,
                steps,
                accum,
                gradient_checkpointing: gc,
                four_bit,
            };
            let r = match cli::launch::role(Some(num_gpus), &device)? {
                cli::launch::Role::Parent { world } => {
                    cli::launch::run_children(world)?;
                    return Ok(ExitCode::SUCCESS);
                }
                cli::launch::Role::Alone => {
                    let device = cli::pick_device(&device)?;
                    trace_train::bench::train::train(&bench, &device)?
                }
                cli::launch::Role::Child(child) => {
                    let device = cli::pick_device(&child.device())?;
                    let comm = child.communicator(&device)?;
                    let r = trace_train::bench::train::train_with(&bench, &device, &*comm)?;
                    if child.rank != 0 {
                        return Ok(ExitCode::SUCCESS);
                    }
                    r
                }
            };
            println!("{}", serde_json::to_string(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Serve {
            model,
            clients,
            prompt,
            max_tokens,
            max_batch,
            max_model_len,
            soak_seconds,
            soak_clients,
            cancel_share,
            device,
        }) => {
            let device = cli::pick_device(&device)?;
            let bench = trace_train::bench::serve::ServeBench {
                model_dir: trace_train::model::resolve(&model)?,
                clients,
                prompt,
                max_tokens,
                max_batch: max_batch.unwrap_or(clients),
                max_model_len,
                soak_seconds,
                soak_clients,
                cancel_share,
            };
            let r = trace_train::bench::serve::run(&bench, &device)?;
            println!("{}", serde_json::to_string(&r)?);
            let whole = r
                .soak
                .as_ref()
                .is_none_or(|s| s.bad_count == 0 && s.counters_add_up);
            Ok(if whole {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Bench(BenchCommand::Gen {
            model,
            batch,
            prompt,
            new,
            rank,
            four_bit,
            path,
            device,
        }) => {
            let device = cli::pick_device(&device)?;
            let bench = trace_train::bench::train::GenBench {
                model,
                batch,
                prompt,
                new,
                rank,
                four_bit,
                path,
            };
            let r = trace_train::bench::train::sample(&bench, &device)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Rl {
            model,
            algorithm,
            batch,
            group,
            prompt,
            new,
            mini_batch_size,
            steps,
            gc,
            four_bit,
            device,
        }) => {
            let device = cli::pick_device(&device)?;
            let bench = trace_train::bench::rl::RlBench {
                model,
                algorithm,
                batch,
                group,
                prompt,
                new,
                mini_batch: mini_batch_size,
                steps,
                gradient_checkpointing: gc,
                four_bit,
            };
            let r = trace_train::bench::rl::rl_step(&bench, &device)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Sandbox {
            python,
            num_workers,
            repeat,
            overhead_runs,
            rounds,
            json,
        }) => {
            let workers = num_workers.unwrap_or_else(sandbox::default_workers);
            let r = trace_train::bench::bench_sandbox(&trace_train::bench::SandboxBenchOptions {
                python,
                workers,
                repeat,
                overhead_runs,
                rounds,
            })?;
            println!(
                "sandbox bench: {} cores, Python {}, {} corpus programs x {}, median of {} rounds",
                r.cores, r.python, r.corpus_programs, repeat, rounds
            );
            println!(
                "  {:<44} {:>9} {:>8} {:>12}",
                "", "programs", "ok", "programs/s"
            );
            for (name, side) in [
                (
                    format!("trace-train, sandboxed, {} slots", r.workers),
                    &r.ours,
                ),
                (
                    format!("peer, unsandboxed, {} threads", r.cores),
                    &r.peer_one_per_core,
                ),
                (
                    format!("peer, unsandboxed, {} threads", 2 * r.cores),
                    &r.peer_two_per_core,
                ),
            ] {
                println!(
                    "  {:<44} {:>9} {:>8} {:>12.1}",
                    name, side.programs, side.ok, side.programs_per_s
                );
            }
            println!(
                "  throughput ratio vs the peer's better run: {:.2}x",
                r.throughput_ratio
            );
            println!(
                "  per-program overhead (empty program, 1 worker): ours {:.2} ms, peer {:.2} ms ({:.1}x less)",
                r.ours_overhead_ms,
                r.peer_overhead_ms,
                r.peer_overhead_ms / r.ours_overhead_ms
            );
            if let Some(path) = json {
                trace_train::atomic::write(&path, serde_json::to_string_pretty(&r)?.as_bytes())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Model(ModelCommand::Tiny { out, seed }) => {
            trace_train::model::tiny::write_tiny_chat_model(&out, seed)?;
            println!("{}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Model(ModelCommand::ImportGguf { file, out }) => {
            let report = trace_train::model::gguf::import_gguf(&file, &out)?;
            for note in &report.notes {
                eprintln!("note: {note}");
            }
            eprintln!(
                "imported {} tensors ({} parameters, {}) from `{}` into `{}`",
                report.tensors,
                report.parameters,
                report.dtype,
                file.display(),
                out.display()
            );
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Env(args) => {
            cli::env::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(ConfigArgs {
            show: Some(show),
            json,
            ..
        }) => {
            let (title, settings) = cli::config::resolved(&show)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&settings)?);
            } else {
                print!("{}", cli::config::table(&title, &settings));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(ConfigArgs {
            show: None,
            files,
            json,
        }) => {
            let show_all = files.is_empty();
            let files = if files.is_empty() {
                let mut v: Vec<PathBuf> = std::fs::read_dir("config")
                    .context("cannot list `config/`")?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect();
                v.sort();
                v
            } else {
                files
            };
            for f in files {
                check_config_file(&f)?;
                if !json {
                    println!("ok  {}", f.display());
                }
            }
            if show_all {
                let all = cli::config::resolved_all()?;
                if json {
                    let map: serde_json::Map<_, _> = all.into_iter().collect();
                    println!("{}", serde_json::to_string_pretty(&map)?);
                } else {
                    for (title, settings) in &all {
                        print!("{}", cli::config::table(title, settings));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Parses a config file with the type its name says it holds.
fn check_config_file(path: &Path) -> anyhow::Result<()> {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    match name {
        "pipeline_config" => config::load::<PipelineConfig>(path).map(|_| ())?,
        "generate" => config::load::<GenerateConfig>(path).map(|_| ())?,
        "warmup" | "sft" => config::load::<config::SftConfig>(path).map(|_| ())?,
        "stage3_ppo_config" => config::load::<config::Stage3Config>(path).map(|_| ())?,
        _ => anyhow::bail!(
            "`{}`: unknown config file name\nhint: expected pipeline_config, generate, warmup, sft or stage3_ppo_config",
            path.display()
        ),
    }
    Ok(())
}

fn executor(c: &SandboxCommon, workers: usize) -> anyhow::Result<Executor> {
    Ok(Executor::new(ExecutorConfig::new(
        &c.python,
        workers,
        c.unsafe_flag.unsafe_no_sandbox,
    ))?)
}

/// File values, then flags on top. Every flag is listed here.
fn resolve_generate(args: &GenerateArgs) -> anyhow::Result<GenerateConfig> {
    let default_file = Path::new("config/generate.json");
    let mut cfg = match &args.config {
        Some(p) => config::load::<GenerateConfig>(p)?,
        None if default_file.is_file() => config::load::<GenerateConfig>(default_file)?,
        None => GenerateConfig::default(),
    };
    let GenerateArgs {
        config: _,
        dataset,
        output_dir,
        max_samples,
        variants,
        num_workers,
        seed,
        seed_scheme,
        python,
        skip_bad,
        balance_lines,
        balance_ratio,
        balance_by,
        quick_test,
        environment: _,
        tasks: _,
        abd_dataset: _,
        ded_dataset: _,
        unsafe_flag: _,
    } = args;
    if *quick_test {
        cfg.dataset = "builtin".into();
    }
    if let Some(v) = dataset {
        cfg.dataset = v.clone();
    }
    if let Some(v) = output_dir {
        cfg.output_dir = v.clone();
    }
    if let Some(v) = max_samples {
        cfg.max_samples = Some(*v);
    }
    if let Some(v) = variants {
        cfg.variants = *v;
    }
    if let Some(v) = num_workers {
        cfg.num_workers = *v;
    }
    if let Some(v) = seed {
        cfg.seed = *v;
    }
    if let Some(v) = seed_scheme {
        cfg.seed_scheme = *v;
    }
    if let Some(v) = python {
        cfg.python = v.clone();
    }
    if *skip_bad {
        cfg.skip_bad = true;
    }
    if *balance_lines {
        cfg.balance_lines = true;
    }
    if let Some(v) = balance_ratio {
        cfg.balance_ratio = *v;
    }
    if let Some(v) = balance_by {
        cfg.balance_by = v.clone();
    }
    let problems = config::Validate::problems(&cfg);
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}",
        problems.join("\n  - ")
    );
    Ok(cfg)
}

fn generate_cmd(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let cfg = resolve_generate(&args)?;
    if let Some(spec) = &args.environment {
        cli::envs::run_generate(&cli::envs::SiblingData {
            spec: spec.clone(),
            tasks: args.tasks,
            output_dir: cfg.output_dir.clone(),
            seed: cfg.seed,
            data: cli::envs::EnvData {
                abd_dataset: args.abd_dataset.clone(),
                ded_dataset: args.ded_dataset.clone(),
                hub_file: cfg.hub_file.clone(),
                python: cfg.python.clone(),
                num_workers: (cfg.num_workers > 0).then_some(cfg.num_workers),
                ..cli::envs::EnvData::default()
            },
            unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = RunOptions {
        unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
    };
    let bar = cli::progress::Bar::new("rows");
    let s = generate::run(&cfg, &opts, &bar)?;
    let dropped = cli::counts;
    eprintln!(
        "read {} rows from {} in {:.1}s ({} sandbox runs, {:.0} runs/s, Python {})",
        s.rows_read,
        s.dataset,
        s.timings.seconds_total,
        s.timings.sandbox_runs,
        s.timings.runs_per_second,
        s.python
    );
    for (name, st) in [
        ("stage 1 (original):   ", &s.stage1),
        ("stage 2 (transformed):", &s.stage2),
    ] {
        eprintln!(
            "{name} {} train, {} test; dropped: {}",
            st.records_train,
            st.records_test,
            dropped(&st.dropped)
        );
        for (split, by) in &st.buckets {
            let lines = by.get("output_lines").map_or_else(String::new, |b| {
                b.iter()
                    .map(|b| format!("{} {}", b.bucket, b.n))
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            eprintln!("    {split:<5} by output lines: {lines}");
        }
        if let Some(b) = &st.balance {
            eprintln!(
                "    balanced by {}: each bucket at most {} train records ({} dropped)",
                b.by.join("+"),
                b.cap,
                b.dropped
            );
        }
    }
    if s.malformed_lines > 0 {
        eprintln!("skipped {} malformed lines", s.malformed_lines);
    }
    if !s.failed_rows.is_empty() {
        let shown: Vec<&str> = s.failed_rows.iter().take(5).map(String::as_str).collect();
        eprintln!(
            "rows whose own program fails (none of their variants ran): {}{}",
            shown.join("; "),
            if s.failed_rows.len() > shown.len() {
                format!("; ... ({} in the stats' failed_rows)", s.failed_rows.len())
            } else {
                String::new()
            }
        );
    }
    println!("{}", cfg.output_dir.display());
    Ok(ExitCode::SUCCESS)
}
