//! `report RUN_DIR`: redraw a run's curves from its `metrics.jsonl` and
//! print its summary; a folder of runs (a pipeline's output) reports each.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use trace_train::runlog::{self, Summary};

#[derive(Args, Clone)]
#[command(rename_all = "snake_case")]
pub struct ReportArgs {
    /// A stage's output folder (it holds `metrics.jsonl`), or a folder of
    /// them, such as a pipeline's output.
    pub run_dir: PathBuf,
    /// Print the summaries as JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let runs = runs_in(&args.run_dir)?;
    anyhow::ensure!(
        !runs.is_empty(),
        "`{}` holds no `{}`, nor do the folders in it\nhint: pass a stage's output folder, such as checkpoints/quick/warmup",
        args.run_dir.display(),
        runlog::METRICS_FILE
    );
    for dir in runs {
        let records = runlog::read_metrics(&dir.join(runlog::METRICS_FILE))?;
        let Some(summary) = Summary::new(&dir, &records) else {
            eprintln!("{}: no steps logged yet", dir.display());
            continue;
        };
        let images = runlog::curves::draw(&dir, &records)?;
        if args.json {
            let mut v = serde_json::to_value(&summary)?;
            v["curves"] = serde_json::to_value(&images)?;
            println!("{v}");
        } else {
            println!("{summary}");
            let curves = dir.join(runlog::curves::CURVES_DIR);
            let names: Vec<String> = images
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "png"))
                .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .filter(|n| n != runlog::curves::OVERVIEW)
                .collect();
            if !names.is_empty() {
                println!(
                    "  overview    {}",
                    curves
                        .join(format!("{}.png", runlog::curves::OVERVIEW))
                        .display()
                );
                println!(
                    "  curves      {}/{{{}}}.{{png,svg}}",
                    curves.display(),
                    names.join(",")
                );
            }
        }
    }
    Ok(())
}

/// `dir` when it holds a metrics file, else the folders in it that do.
fn runs_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if dir.join(runlog::METRICS_FILE).is_file() {
        return Ok(vec![dir.to_owned()]);
    }
    let mut runs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list `{}`", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join(runlog::METRICS_FILE).is_file())
        .collect();
    runs.sort();
    Ok(runs)
}
