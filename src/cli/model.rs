//! `model import_gguf` (a llama.cpp GGUF into a Hugging Face folder),
//! `model export` (a model folder into a llama.cpp GGUF), `model merge` (an
//! adapter merged into its base, as a model folder) and `model tiny` (a
//! tiny random chat model for quick runs).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use candle_core::{DType, Device};
use clap::{Subcommand, ValueEnum};
use trace_train::model::io::adapter;
use trace_train::model::io::gguf::export::{OutType, export_gguf};

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Turn a llama.cpp GGUF (Llama, e.g. SmolLM2, or Qwen3) into a
    /// Hugging Face model folder: f32 safetensors, config, tokenizer, chat
    /// template. Prints the import report as JSON.
    #[command(name = "import_gguf", alias = "import-gguf")]
    ImportGguf {
        /// The `.gguf` file.
        file: PathBuf,
        /// The folder to write (created if needed).
        out: PathBuf,
    },
    /// Write a model folder (Llama or Qwen3, byte-level BPE tokenizer) as a
    /// llama.cpp GGUF (version 3) for llama.cpp and Ollama, optionally with
    /// an adapter merged in. Prints the export report as JSON.
    Export {
        /// The model folder, or a Hugging Face id (from the local cache;
        /// downloaded when missing, unless `HF_HUB_OFFLINE=1`).
        #[arg(long = "gguf", value_name = "MODEL_DIR")]
        model: String,
        /// The `.gguf` file to write; it must not exist, unless `--force`.
        #[arg(long)]
        output: PathBuf,
        /// A PEFT adapter folder to merge into the model first.
        #[arg(long)]
        adapter: Option<PathBuf>,
        /// How the weights are stored (norms stay f32); f16 as llama.cpp's
        /// converter does by default.
        #[arg(long, value_enum, default_value_t = GgufOutType::F16)]
        outtype: GgufOutType,
        /// Replace an existing `--output` file.
        #[arg(long)]
        force: bool,
    },
    /// Merge a PEFT LoRA adapter (ours or PEFT's) into its base model and
    /// write the result as a complete Hugging Face model folder: weights,
    /// config, tokenizer files and chat template.
    Merge {
        /// The base model: a folder, or a Hugging Face id (from the local
        /// cache; downloaded when missing, unless `HF_HUB_OFFLINE=1`).
        #[arg(long)]
        base: String,
        /// The adapter folder (`adapter_config.json` and
        /// `adapter_model.safetensors`).
        #[arg(long)]
        adapter: PathBuf,
        /// The folder to write; it must not exist or be empty, unless
        /// `--force`.
        #[arg(long = "output_dir", alias = "output")]
        output: PathBuf,
        /// The dtype of the merged weights; the base's own when not given.
        #[arg(long, value_enum)]
        dtype: Option<MergeDtype>,
        /// Write into a folder that holds files already: the files the
        /// merge writes are replaced, every other file is kept.
        #[arg(long)]
        force: bool,
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

/// The tensor types `model export --outtype` writes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum GgufOutType {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
}

impl GgufOutType {
    fn out_type(self) -> OutType {
        match self {
            Self::F32 => OutType::F32,
            Self::F16 => OutType::F16,
            Self::Bf16 => OutType::BF16,
            Self::Q8_0 => OutType::Q8_0,
        }
    }
}

/// The dtypes `model merge --dtype` writes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MergeDtype {
    Bf16,
    F16,
    F32,
}

impl MergeDtype {
    fn dtype(self) -> DType {
        match self {
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
            Self::F32 => DType::F32,
        }
    }
}

/// Refuses an output folder that holds files, unless `force`; with `force`,
/// refuses one whose sharded index would take precedence over the single
/// weight file the merge writes. `command` names the command in messages.
fn check_output_dir(out: &Path, force: bool, command: &str) -> anyhow::Result<()> {
    if out.is_file() {
        bail!(
            "`{}` is a file, not a folder\nhint: pass a new folder to `{command}` as --output",
            out.display()
        );
    }
    let Ok(mut entries) = std::fs::read_dir(out) else {
        return Ok(());
    };
    if entries.next().is_some() && !force {
        bail!(
            "output folder `{}` exists and is not empty\nhint: choose a new folder, or pass --force to replace the files `{command}` writes there (other files are kept)",
            out.display()
        );
    }
    let index = out.join(trace_train::model::WEIGHTS_INDEX_FILE);
    if index.exists() {
        bail!(
            "`{}` would take precedence over the `model.safetensors` that `{command}` writes\nhint: write into a new folder, or move the sharded checkpoint out of `{}`",
            index.display(),
            out.display()
        );
    }
    Ok(())
}

/// `model merge`: loads the base with the adapter (which checks every
/// tensor's name and shape), then writes the merged folder.
fn merge(
    base: &str,
    adapter_dir: &Path,
    out: &Path,
    dtype: Option<MergeDtype>,
    force: bool,
) -> anyhow::Result<()> {
    check_output_dir(out, force, "model merge")?;
    let base_dir = trace_train::model::io::resolve::resolve(base)?;
    let device = Device::Cpu;
    let loaded = adapter::load(&base_dir, adapter_dir, DType::F32, &device)?;
    adapter::merge_as(&loaded, out, dtype.map(MergeDtype::dtype))?;
    eprintln!(
        "merged `{}` into `{}`: `{}`",
        adapter_dir.display(),
        base_dir.display(),
        out.display()
    );
    Ok(())
}

/// Runs a `model` subcommand.
pub fn run(cmd: ModelCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCommand::Tiny { out, seed } => {
            trace_train::model::arch::tiny::write_tiny_chat_model(&out, seed)?;
            println!("{}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::Merge {
            base,
            adapter,
            output,
            dtype,
            force,
        } => {
            merge(&base, &adapter, &output, dtype, force)?;
            println!("{}", output.display());
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::Export {
            model,
            output,
            adapter,
            outtype,
            force,
        } => {
            let dir = trace_train::model::io::resolve::resolve(&model)?;
            let report = export_gguf(&dir, adapter.as_deref(), &output, outtype.out_type(), force)?;
            for note in &report.notes {
                eprintln!("note: {note}");
            }
            eprintln!(
                "exported {} tensors ({} parameters) of `{}` into `{}`",
                report.tensors,
                report.parameters,
                dir.display(),
                output.display()
            );
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::ImportGguf { file, out } => {
            let report = trace_train::model::io::gguf::import_gguf(&file, &out)?;
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
    }
}
