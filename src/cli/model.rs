//! `model import_gguf` (a llama.cpp GGUF into a Hugging Face folder) and
//! `model tiny` (a tiny random chat model for quick runs).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Turn a llama.cpp GGUF (Llama architecture, e.g. SmolLM2) into a
    /// Hugging Face model folder: f32 safetensors, config, tokenizer, chat
    /// template. Prints the import report as JSON.
    #[command(name = "import_gguf", alias = "import-gguf")]
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

/// Runs a `model` subcommand.
pub fn run(cmd: ModelCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCommand::Tiny { out, seed } => {
            trace_train::model::arch::tiny::write_tiny_chat_model(&out, seed)?;
            println!("{}", out.display());
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
