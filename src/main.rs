//! The `trace-train` command: parse flags → resolve settings → run a stage →
//! print the error chain and exit non-zero on failure.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod cli;

/// Training allocates and frees large tensors every step; glibc's malloc
/// hands each back to the kernel and faults it in again, which costs more
/// system time than the arithmetic on CPU. mimalloc keeps them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Log and progress lines as text, or one JSON object a line.
    #[arg(long = "log_format", value_enum, default_value_t = cli::progress::LogFormat::Text, global = true)]
    log_format: cli::progress::LogFormat,
    /// Seconds between progress lines when stderr is not a terminal (a
    /// log file, a scheduler, a pipe); a terminal gets a bar.
    #[arg(long = "log_every", default_value_t = cli::progress::LOG_EVERY_S, global = true)]
    log_every: f64,
    /// Colour in log lines: on a terminal unless NO_COLOR is set (auto),
    /// always, or never.
    #[arg(long, value_enum, default_value_t = cli::progress::Color::Auto, global = true)]
    color: cli::progress::Color,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Stage 0: run every program in the sandbox and write the original and
    /// transformed training sets.
    Generate(cli::generate::GenerateArgs),
    /// Run untrusted Python in the sandbox, or report its protections.
    #[command(subcommand)]
    Sandbox(cli::sandbox::SandboxCommand),
    /// Measure against the peer approach, in one run.
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
    /// Check config files (parse and validate each, naming what is wrong),
    /// then show the settings of the pipeline and each stage with where
    /// each value came from; `config pipeline|warmup|sft FLAGS` shows them
    /// with those flags.
    Config(cli::config::ConfigArgs),
    /// Write starter config files (the shipped ones) into DIR/config/, for
    /// a project of one's own.
    Init(cli::init::InitArgs),
    /// What to paste into a bug report: versions, GPU stack, sandbox, HF
    /// settings.
    Env(cli::env::EnvArgs),
    /// Stage 1: LoRA SFT on the original programs.
    Warmup(cli::train::TrainArgs),
    /// Stage 2: LoRA SFT on the transformed programs, from Stage 1's merged
    /// model.
    Sft(cli::train::TrainArgs),
    /// Stage 3: online RL (PPO, GRPO, Dr. GRPO or GSPO) against the trace
    /// environment, from Stage 2's merged model.
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
    /// Prepare model folders: import or export a GGUF, merge an adapter,
    /// a tiny test model.
    #[command(subcommand)]
    Model(cli::model::ModelCommand),
    /// Upload a model or adapter folder to the Hugging Face Hub as one
    /// commit (the repository is created if missing).
    Push(cli::push::PushArgs),
    /// Print a completion script for a shell (bash, zsh, fish, elvish,
    /// powershell), e.g. into ~/.local/share/bash-completion/completions/trace-train.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
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

#[derive(Args)]
pub struct UnsafeFlag {
    /// Run programs WITHOUT isolation (rlimits only). Only for machines and
    /// programs you trust; never settable from a config file.
    #[arg(long = "unsafe-no-sandbox")]
    pub unsafe_no_sandbox: bool,
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let matches = cli::conventions::apply(<Cli as clap::CommandFactory>::command())
        .get_matches_from(cli::conventions::negative_values(std::env::args_os()));
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if !(cli.log_every.is_finite() && cli.log_every > 0.0) {
        eprintln!("error: --log_every must be a number of seconds above 0");
        return ExitCode::from(2);
    }
    cli::progress::configure(cli::progress::Output {
        format: cli.log_format,
        every: std::time::Duration::from_secs_f64(cli.log_every),
    });
    init_logging(cli.verbose, cli.color.on(), cli.log_format);
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

fn init_logging(verbose: u8, color: bool, format: cli::progress::LogFormat) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(color);
    match format {
        cli::progress::LogFormat::Text => logs.init(),
        cli::progress::LogFormat::Json => logs.event_format(cli::progress::JsonEvents).init(),
    }
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
        Command::Push(args) => {
            cli::push::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut cmd = cli::conventions::apply(<Cli as clap::CommandFactory>::command());
            clap_complete::generate(shell, &mut cmd, "trace-train", &mut std::io::stdout());
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
        Command::Generate(args) => cli::generate::run(args),
        Command::Sandbox(cmd) => cli::sandbox::run(cmd),
        Command::Bench(cmd) => cli::bench::run(cmd),
        Command::Model(cmd) => cli::model::run(cmd),
        Command::Env(args) => {
            cli::env::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(args) => cli::config::run(args),
        Command::Init(args) => {
            cli::init::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A reader that stopped reading our stdout (`trace-train task ... | head`)
/// ends the command quietly and with success: what it read is all it
/// wanted. `print!` panics on the broken pipe; this catches that panic,
/// and only that one (a closed stderr, where progress and errors go, is
/// still a failure).
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}
