//! `generate` (Stage 0): its flags, resolved over `config/generate.json`
//! (each value with its source), then the run and its report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use trace_train::config::{self, GenerateConfig, SeedScheme};
use trace_train::generate::{self, RunOptions};

use crate::UnsafeFlag;

#[derive(Args)]
#[command(rename_all = "snake_case")]
pub struct GenerateArgs {
    /// Stage config (default: config/generate.json when present, else the
    /// built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// `builtin`, a JSONL path, `humaneval:PATH`, `synthetic:N[:SEED]` (N
    /// programs made from a seed), or a hub dataset id; several joined by
    /// `+` (`builtin+humaneval:PATH`) are read as one.
    #[arg(long)]
    pub dataset: Option<String>,
    /// Where the datasets and stats go (default datasets/trace_training).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Use at most this many rows.
    #[arg(long)]
    pub max_samples: Option<usize>,
    /// Transformed variants a program (the Python pipeline's
    /// `--variants_per_sample`).
    #[arg(long, alias = "variants_per_sample")]
    pub variants: Option<usize>,
    /// Sandbox worker slots (default: two a core).
    #[arg(long)]
    pub num_workers: Option<usize>,
    /// Seed of the train/test split.
    #[arg(long)]
    pub seed: Option<u64>,
    /// `env` (task_id → row and seed) or `peer` (row*1000 + variant).
    #[arg(long, value_parser = parse_scheme)]
    pub seed_scheme: Option<SeedScheme>,
    /// Interpreter every uid can run.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Count and skip malformed dataset lines instead of stopping.
    #[arg(long)]
    pub skip_bad: bool,
    /// Balance each training split by output-line bucket (1, 2-3, 4-10,
    /// 11+): over-full buckets are cut to --balance_ratio times the smallest.
    #[arg(long)]
    pub balance_lines: bool,
    /// With --balance_lines: most records a bucket keeps, as a multiple of
    /// the smallest non-empty bucket (>= 1).
    #[arg(long)]
    pub balance_ratio: Option<f64>,
    /// With --balance_lines: the features to balance by, jointly, comma
    /// separated (output_lines, loop_depth, lines, injections).
    #[arg(long, value_delimiter = ',')]
    pub balance_by: Option<Vec<String>>,
    /// Small built-in run that finishes in seconds.
    #[arg(long)]
    pub quick_test: bool,
    /// Instead of the trace datasets: SFT records of other environments
    /// (sat, abd, ded, answers, joined by `+`, each optionally weighted),
    /// one file each and their weighted mixture; `trace` in the
    /// list adds this folder's Stage 2 training set to the mixture.
    #[arg(long)]
    pub environment: Option<String>,
    /// With --environment: tasks an environment, its first N training
    /// tasks (every tenth task id is held out for `eval --environment`;
    /// ABD and DED stop at their last row).
    #[arg(long, default_value_t = 200)]
    pub tasks: u64,
    /// With --environment: ABD's rows (as `eval --abd_dataset`).
    #[arg(long, default_value = "builtin")]
    pub abd_dataset: String,
    /// With --environment: DED's rows (as `eval --ded_dataset`).
    #[arg(long, default_value = "ded-builtin")]
    pub ded_dataset: String,
    #[command(flatten)]
    pub unsafe_flag: UnsafeFlag,
}

fn parse_scheme(s: &str) -> Result<SeedScheme, String> {
    match s {
        "env" => Ok(SeedScheme::Env),
        "peer" => Ok(SeedScheme::Peer),
        _ => Err(format!("`{s}` is not `env` or `peer`")),
    }
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

/// `generate`: Stage 0, or with `--environment` the sibling environments'
/// SFT records.
pub fn run(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let cfg = resolve_generate(&args)?;
    if let Some(spec) = &args.environment {
        super::envs::run_generate(&super::envs::SiblingData {
            spec: spec.clone(),
            tasks: args.tasks,
            output_dir: cfg.output_dir.clone(),
            seed: cfg.seed,
            data: trace_train::env::registry::EnvData {
                abd_dataset: args.abd_dataset.clone(),
                ded_dataset: args.ded_dataset.clone(),
                hub_file: cfg.hub_file.clone(),
                python: cfg.python.clone(),
                num_workers: (cfg.num_workers > 0).then_some(cfg.num_workers),
                ..Default::default()
            },
            unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = RunOptions {
        unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
    };
    let bar = super::progress::Bar::new("rows");
    let s = generate::run(&cfg, &opts, &bar)?;
    let dropped = super::counts;
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
