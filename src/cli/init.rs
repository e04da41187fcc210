//! `init [DIR]`: starter config files for a project of one's own, the
//! shipped ones, in `DIR/config/`; from `DIR`, `trace-train config` and
//! `trace-train pipeline` read them.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

/// The starter files: the shipped configs, by name.
const FILES: [(&str, &str); 5] = [
    (
        "pipeline_config.json",
        include_str!("../../config/pipeline_config.json"),
    ),
    ("generate.json", include_str!("../../config/generate.json")),
    ("warmup.json", include_str!("../../config/warmup.json")),
    ("sft.json", include_str!("../../config/sft.json")),
    (
        "stage3_ppo_config.json",
        include_str!("../../config/stage3_ppo_config.json"),
    ),
];

#[derive(Args)]
#[command(after_help = "Example:\n  trace-train init my-run && cd my-run && trace-train config")]
pub struct InitArgs {
    /// The project folder; its `config/` gets the files (made when absent).
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// Replace config files that are already there.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &InitArgs) -> anyhow::Result<()> {
    let config = args.dir.join("config");
    let there: Vec<String> = FILES
        .iter()
        .map(|(name, _)| config.join(name))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    anyhow::ensure!(
        args.force || there.is_empty(),
        "{} already there; nothing written\nhint: pass --force to replace them, or choose another folder",
        there.join(", ")
    );
    std::fs::create_dir_all(&config)
        .with_context(|| format!("cannot create `{}`", config.display()))?;
    for (name, text) in FILES {
        let path = config.join(name);
        trace_train::atomic::write(&path, text.as_bytes())?;
        println!("wrote {}", path.display());
    }
    let dir = display_dir(&args.dir);
    println!(
        "\nnext: set `model.base_model` in {}/config/pipeline_config.json (a hub id or a local folder), then{}\n  trace-train config                  # check the files, see every setting and its meaning\n  trace-train pipeline --quick_test   # the whole pipeline on a tiny model, a minute on the CPU\n  trace-train pipeline                # stages 0-3 and eval\nEvery key: docs/reference/config.md, or `trace-train config --reference`.",
        dir,
        if dir == "." {
            String::new()
        } else {
            format!(" from {dir}:")
        },
    );
    Ok(())
}

fn display_dir(dir: &Path) -> String {
    dir.display().to_string().trim_end_matches('/').to_owned()
}
