//! Subcommands whose settings need more than a few lines of glue, one
//! module each (the binary's own; the library knows nothing of them).

pub mod bench;
pub mod compare;
pub mod config;
pub mod conventions;
#[cfg(test)]
mod documented_commands;
pub mod env;
pub mod envs;
pub mod eval;
pub mod gate;
pub mod generate;
pub mod init;
pub mod launch;
pub mod model;
pub mod pipeline;
pub mod ppo;
pub mod pref;
pub mod progress;
pub mod push;
pub mod report;
pub mod sandbox;
pub mod serve;
pub mod train;

use trace_train::model::BasePrecision;

/// The flags every training command (`warmup`, `sft`, `ppo`, `dpo`)
/// takes: where the run goes, for how long, and whether it goes on from a
/// checkpoint. They are not the method's settings (no config file holds
/// them), and each is declared here once.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[command(rename_all = "snake_case")]
pub struct RunFlags {
    /// `cpu`, `cuda`, `cuda:N` or `auto`.
    #[arg(long)]
    pub device: Option<String>,
    /// GPUs to train on, one process each, data parallel over NCCL
    /// (default: the pipeline config's `hardware.num_gpus`, else every
    /// visible GPU when the device is CUDA, 1 on the CPU). The ranks share
    /// each step's work, so the global batch is the same for any number.
    #[arg(long)]
    pub num_gpus: Option<usize>,
    /// Continue from the newest valid checkpoint in the output folder.
    #[arg(long)]
    pub resume: bool,
    /// Resume even though the settings, the model or the data changed.
    #[arg(long)]
    pub force: bool,
    /// Stop after this many optimizer steps (with a checkpoint; `--resume`
    /// goes on from it), whatever the run's planned length (epochs, Stage
    /// 3's `num_train_steps`); the schedule stays the planned run's.
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// How the frozen base weights are held: `bf16` (as loaded), `nf4`
    /// (4 bits, QLoRA) or `fp8` (8 bits, FP8 products) (default: the
    /// pipeline config's `model.base_precision`, else nf4; nf4 applies on a
    /// GPU only).
    #[arg(long, value_name = "bf16|nf4|fp8", value_parser = parse_base_precision)]
    pub base_precision: Option<BasePrecision>,
    /// The same as `--base_precision bf16`: keep the frozen base weights
    /// in 16 bits instead of 4.
    #[arg(long)]
    pub no_4bit: bool,
    /// Recompute each layer in the backward pass to save memory (default:
    /// the stage's config, else the pipeline config's
    /// `hardware.gradient_checkpointing`, applied on a GPU; `true` forces
    /// it on the CPU too).
    #[arg(long)]
    pub gradient_checkpointing: Option<bool>,
}

impl RunFlags {
    /// The base precision these flags ask for ([`precision_flags`]).
    pub fn base_precision(&self) -> anyhow::Result<Option<(BasePrecision, &'static str)>> {
        precision_flags(self.base_precision, self.no_4bit)
    }
}

/// `--base_precision`'s value: bf16, nf4 or fp8.
pub fn parse_base_precision(s: &str) -> Result<BasePrecision, String> {
    s.parse()
}

/// The base precision `--base_precision` and `--no_4bit` (its other name
/// for bf16) ask for, with the flag that asked, for `sources`; none when
/// neither is given. The two given and disagreeing is an error.
pub fn precision_flags(
    base_precision: Option<BasePrecision>,
    no_4bit: bool,
) -> anyhow::Result<Option<(BasePrecision, &'static str)>> {
    match (base_precision, no_4bit) {
        (Some(p), true) if p != BasePrecision::Bf16 => anyhow::bail!(
            "--no_4bit and --base_precision {}: --no_4bit is --base_precision bf16, so the two disagree\nhint: keep one of them",
            p.as_str()
        ),
        (Some(p), _) => Ok(Some((p, "--base_precision"))),
        (None, true) => Ok(Some((BasePrecision::Bf16, "--no_4bit"))),
        (None, false) => Ok(None),
    }
}

/// The device a command runs on: `cpu`, `cuda`, `cuda:N` or `auto`.
pub fn pick_device(name: &str) -> anyhow::Result<candle_core::Device> {
    use anyhow::Context;
    trace_train::config::DeviceSpec::parse(name)
        .with_context(|| format!("device `{name}` is not cpu, cuda, cuda:N or auto"))?
        .open()
}

/// Named counts for a summary line (`error_exit 6, timeout 1`), or `none`.
pub fn counts(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        "none".to_owned()
    } else {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `, on N GPUs` for a run on several ranks, nothing for one.
pub fn on_gpus(world: usize) -> String {
    if world > 1 {
        format!(", on {world} GPUs")
    } else {
        String::new()
    }
}

/// The last lines of a training stage's report: stopped by a signal
/// (continue with --resume), or where its outputs are, saying so when a
/// stop came too late to cut the run.
pub fn report_ending(
    stage: &str,
    interrupted: bool,
    stop_requested: bool,
    final_dir: &std::path::Path,
    merged_dir: &std::path::Path,
) {
    if interrupted {
        eprintln!("{stage}: stopped by a signal after saving a checkpoint; continue with --resume");
        return;
    }
    if stop_requested {
        eprintln!(
            "{stage}: a stop signal came during the last step; the run finished and saved its outputs"
        );
    }
    eprintln!(
        "adapter: {}\nmerged model: {}",
        final_dir.display(),
        merged_dir.display()
    );
}

/// Adds what to do to a device out-of-memory error; other errors pass.
pub fn out_of_memory_hint(e: anyhow::Error, what_to_do: &str) -> anyhow::Error {
    let text = format!("{e:#}");
    if text.contains("OUT_OF_MEMORY") || text.contains("out of memory") {
        e.context(format!("the device ran out of memory\nhint: {what_to_do}"))
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument of every subcommand, with the path that reaches it,
    /// that `--help` would list without a line of help.
    fn without_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if arg.is_hide_set() {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                out.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            without_help(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_argument_of_every_subcommand_has_help() {
        let cmd = crate::Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        without_help(&cmd, "trace-train", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help:\n{}",
            missing.join("\n")
        );
        // The walk sees the subcommands' flags (it would pass vacuously on
        // an empty tree).
        let pipeline = cmd.find_subcommand("pipeline").expect("pipeline");
        assert!(pipeline.get_arguments().any(|a| a.get_id() == "b200"));
    }
}
