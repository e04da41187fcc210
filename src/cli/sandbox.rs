//! `sandbox check` (which protections hold here) and `sandbox run` (one
//! program's outcome as JSON).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use trace_train::sandbox::{self, Executor, ExecutorConfig, Request};

use crate::UnsafeFlag;

#[derive(Subcommand)]
pub enum SandboxCommand {
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
pub struct SandboxCommon {
    /// The interpreter, runnable by every uid.
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: PathBuf,
    #[command(flatten)]
    pub unsafe_flag: UnsafeFlag,
}

/// Runs a `sandbox` subcommand; `check` exits 3 when a protection of its
/// mode is not in force (rootless, those that need root are listed apart).
pub fn run(cmd: SandboxCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SandboxCommand::Check(c) => {
            let exec = executor(&c, 1)?;
            let report = sandbox::check_protections(&exec);
            println!("{}", serde_json::to_string_pretty(&report)?);
            eprintln!("mode: {}", mode_line(report.mode));
            for p in &report.protections {
                let held = match (p.in_force, p.needs_root && report.mode == "rootless") {
                    (true, _) => "yes",
                    (false, true) => "no (needs root)",
                    (false, false) => "NO",
                };
                eprintln!("{:<22} {:<15} {}", p.name, held, p.evidence);
            }
            Ok(if report.missing().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            })
        }
        SandboxCommand::Run {
            file,
            stdin,
            cpu_seconds,
            wall_ms,
            common,
        } => {
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
    }
}

/// What each mode of `sandbox check` means, in one line.
pub fn mode_line(mode: &str) -> &'static str {
    match mode {
        "root" => "root: full isolation, each slot a host uid of its own",
        "rootless" => {
            "rootless: user namespaces; every protection but a host uid per slot (needs root)"
        }
        _ => "unsafe: no isolation, rlimits only",
    }
}

pub fn executor(c: &SandboxCommon, workers: usize) -> anyhow::Result<Executor> {
    Ok(Executor::new(ExecutorConfig::new(
        &c.python,
        workers,
        c.unsafe_flag.unsafe_no_sandbox,
    ))?)
}
