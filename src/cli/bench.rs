//! `bench`: each side measured in the same run against its peer (our
//! sandbox, a LoRA step, batched sampling, a Stage 3 step, `serve`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use trace_train::model::BasePrecision;
use trace_train::sandbox;

#[derive(Subcommand)]
pub enum BenchCommand {
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
        #[arg(long = "batch_size", alias = "batch", default_value_t = 4)]
        batch: usize,
        /// Tokens a sequence.
        #[arg(long, default_value_t = 1024)]
        seq: usize,
        /// LoRA rank.
        #[arg(long = "lora_r", alias = "rank", default_value_t = 16)]
        rank: usize,
        /// Timed steps, after two untimed ones.
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// Micro-batches of `--batch_size` rows a step (the global batch is
        /// batch x accum on any number of GPUs).
        #[arg(
            long = "gradient_accumulation_steps",
            alias = "accum",
            default_value_t = 1
        )]
        accum: usize,
        /// GPUs, one process each, sharing each step's rows (data parallel
        /// over NCCL); tokens/s is the whole job's.
        #[arg(long, default_value_t = 1)]
        num_gpus: usize,
        /// Recompute each layer in the backward pass (the peer's `--gc`).
        #[arg(long = "gradient_checkpointing", alias = "gc", num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
        gc: bool,
        /// How the frozen projections are held: bf16, nf4 (QLoRA's NF4
        /// with double quantisation; the peer's `--4bit`) or fp8 (E4M3, a
        /// scale an output channel, FP8 products forward).
        #[arg(long, value_parser = <BasePrecision as std::str::FromStr>::from_str, default_value = "bf16")]
        base_precision: BasePrecision,
        /// The same as `--base_precision nf4`.
        #[arg(
            long = "load_in_4bit",
            alias = "4bit",
            conflicts_with = "base_precision"
        )]
        four_bit: bool,
        /// Each step trims its rows to a length of its own (seq, seq - 8,
        /// ..., 32 lengths in turn), as batches padded to their longest row
        /// are: every step meets a row count it has not seen; tokens/s
        /// counts the tokens each step had.
        #[arg(long)]
        vary_seq: bool,
        /// `cpu`, `cuda`, `cuda:N` or `auto`.
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// FP8 base projections against bf16 at a model's projection shapes
    /// (random inputs): each scaling's error against the f32 product, the
    /// forward and input-gradient products' times (timings on CUDA only).
    #[command(rename_all = "snake_case")]
    Fp8 {
        /// smollm2-135m, qwen3-0.6b, qwen3-1.7b or qwen3-4b.
        #[arg(long, default_value = "qwen3-4b")]
        model: String,
        /// Rows of x: the tokens of a step (bench train's 4 x 1024).
        #[arg(long, default_value_t = 4096)]
        tokens: usize,
        /// Timed repetitions of each product (the median is reported).
        #[arg(long, default_value_t = 20)]
        reps: usize,
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
        /// How the server holds the frozen weights: `bf16` (the default),
        /// `nf4` or `fp8`, as `serve --base_precision`.
        #[arg(long, value_name = "bf16|nf4|fp8", value_parser = super::parse_base_precision, default_value = "bf16")]
        base_precision: BasePrecision,
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
        #[arg(long = "batch_size", alias = "batch", default_value_t = 64)]
        batch: usize,
        /// Prompt tokens a sequence.
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// New tokens a sequence.
        #[arg(long = "max_new_tokens", alias = "new", default_value_t = 256)]
        new: usize,
        /// A LoRA adapter of this rank on all seven projections, with
        /// non-zero factors, as an RL policy samples (the peer has none).
        #[arg(long = "lora_r", alias = "rank")]
        rank: Option<usize>,
        /// How the projections' base weights are held: bf16, nf4 (as QLoRA
        /// holds them) or fp8 (E4M3 codes). The decode step reads NF4 and
        /// FP8 codes in place where their bf16 copy does not fit
        /// (`TRACE_TRAIN_DECODE_WEIGHTS=base` always).
        #[arg(long, value_parser = <BasePrecision as std::str::FromStr>::from_str, default_value = "bf16")]
        base_precision: BasePrecision,
        /// The same as `--base_precision nf4`.
        #[arg(
            long = "load_in_4bit",
            alias = "4bit",
            conflicts_with = "base_precision"
        )]
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
    /// One real Stage 3 step (sample with every answer exactly
    /// --max_new_tokens tokens, score, old-log-prob and reference passes, update) with its
    /// time split, tokens/s and peak GPU memory as one JSON line (run the
    /// peer's `trl_rl_peer.py` with the same flags).
    #[command(rename_all = "snake_case")]
    Rl {
        /// smollm2-135m, qwen3-0.6b, qwen3-1.7b, qwen3-4b or tiny (random
        /// weights), or a model folder with its tokenizer.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// `ppo` (value head, GAE) or `grpo` (group-relative advantages).
        #[arg(long, default_value = "ppo", value_parser = trace_train::config::Algorithm::NAMES)]
        algorithm: String,
        /// Prompts a step.
        #[arg(long = "batch_size", alias = "batch", default_value_t = 16)]
        batch: usize,
        /// Completions a prompt (default: 1 for PPO, 8 for GRPO).
        #[arg(long = "group_size", alias = "group")]
        group: Option<usize>,
        /// Tokens a prompt (random token ids).
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// Tokens every completion has (no stop token ends one early).
        #[arg(long = "max_new_tokens", alias = "new", default_value_t = 512)]
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
        #[arg(long = "gradient_checkpointing", alias = "gc", num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
        gc: bool,
        /// Frozen projections in NF4 with double quantisation (QLoRA).
        #[arg(long = "load_in_4bit", alias = "4bit")]
        four_bit: bool,
        /// `cpu`, `cuda`, `cuda:N` or `auto`.
        #[arg(long, default_value = "auto")]
        device: String,
    },
}

/// `--base_precision`, or NF4 where `--load_in_4bit` is given.
fn with_4bit(base: BasePrecision, four_bit: bool) -> BasePrecision {
    if four_bit { BasePrecision::Nf4 } else { base }
}

/// Runs a `bench` subcommand and prints its report.
pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Train {
            model,
            batch,
            seq,
            rank,
            steps,
            accum,
            num_gpus,
            gc,
            base_precision,
            four_bit,
            vary_seq,
            device,
        } => {
            let bench = trace_train::bench::train::TrainBench {
                model,
                batch,
                seq,
                rank,
                steps,
                accum,
                gradient_checkpointing: gc,
                base: with_4bit(base_precision, four_bit),
                vary_seq,
            };
            let r = match super::launch::role(Some(num_gpus), &device)? {
                super::launch::Role::Parent { world } => {
                    super::launch::run_children(world)?;
                    return Ok(ExitCode::SUCCESS);
                }
                super::launch::Role::Alone => {
                    let device = super::pick_device(&device)?;
                    trace_train::bench::train::train(&bench, &device)?
                }
                super::launch::Role::Child(child) => {
                    let device = super::pick_device(&child.device())?;
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
        BenchCommand::Fp8 {
            model,
            tokens,
            reps,
            device,
        } => {
            let device = super::pick_device(&device)?;
            let bench = trace_train::bench::fp8::Fp8Bench {
                model,
                tokens,
                reps,
            };
            let r = trace_train::bench::fp8::run(&bench, &device)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Serve {
            model,
            clients,
            prompt,
            max_tokens,
            max_batch,
            max_model_len,
            soak_seconds,
            soak_clients,
            cancel_share,
            base_precision,
            device,
        } => {
            let device = super::pick_device(&device)?;
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
                base_precision,
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
        BenchCommand::Gen {
            model,
            batch,
            prompt,
            new,
            rank,
            base_precision,
            four_bit,
            path,
            device,
        } => {
            let device = super::pick_device(&device)?;
            let bench = trace_train::bench::train::GenBench {
                model,
                batch,
                prompt,
                new,
                rank,
                base: with_4bit(base_precision, four_bit),
                path,
            };
            let r = trace_train::bench::train::sample(&bench, &device)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Rl {
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
        } => {
            let device = super::pick_device(&device)?;
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
        BenchCommand::Sandbox {
            python,
            num_workers,
            repeat,
            overhead_runs,
            rounds,
            json,
        } => {
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
    }
}
