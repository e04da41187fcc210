//! `push`: a model or adapter folder uploaded to the Hugging Face Hub as one
//! commit (the protocol lives in `model::io::push`).

use std::path::PathBuf;

use clap::Args;
use trace_train::model::io::push::{self, PushOptions};

#[derive(Args)]
pub struct PushArgs {
    /// The folder to upload: a model folder (`config.json`) or an adapter
    /// folder (`adapter_config.json`). Hidden files are left out.
    pub dir: PathBuf,
    /// The repository, `OWNER/NAME`; created if missing.
    #[arg(long)]
    pub repo: String,
    /// Create the repository private (an existing one keeps its setting).
    #[arg(long)]
    pub private: bool,
    /// The branch to commit to; created if missing.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// The Hub's address; else `HF_ENDPOINT`, else https://huggingface.co.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// The access token (write access); else `HF_TOKEN`, else the file
    /// `hf auth login` writes.
    #[arg(long)]
    pub token: Option<String>,
    /// The commit's summary.
    #[arg(long, default_value = "Upload with trace-train")]
    pub message: String,
}

/// Checks the folder, finds the token and endpoint, pushes, prints the
/// report as JSON.
pub fn run(args: &PushArgs) -> anyhow::Result<()> {
    let var = |k: &str| std::env::var(k).ok();
    for warning in push::check_folder(&args.dir)? {
        eprintln!("warning: {warning}");
    }
    let options = PushOptions {
        repo: args.repo.clone(),
        private: args.private,
        revision: args.revision.clone(),
        endpoint: push::endpoint(args.endpoint.as_deref(), var),
        token: push::token(args.token.as_deref(), var)?,
        message: args.message.clone(),
    };
    let report = push::push(&args.dir, &options)?;
    eprintln!(
        "pushed `{}` to `{}` at `{}`: {} files, {} through LFS",
        args.dir.display(),
        report.repo,
        report.revision,
        report.regular.len() + report.lfs.len(),
        report.lfs.len()
    );
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
