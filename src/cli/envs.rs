//! The flags of the environments' data (`env::registry::EnvData`),
//! `generate --environment` (the sibling environments' SFT records) and
//! `trace-train task`, which prints one task of one environment as JSON.
//! Which environments there are is `env::registry`'s.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use trace_train::env::affine::split::Part;
use trace_train::env::registry::{EnvData, build, parse};

/// `generate --environment`: what to write where.
pub struct SiblingData {
    pub spec: String,
    pub tasks: u64,
    pub output_dir: PathBuf,
    pub seed: u64,
    pub data: EnvData,
    pub unsafe_no_sandbox: bool,
}

/// Writes `{env}_sft.jsonl` for each sibling environment named, their
/// weighted mixture `mixture_sft.jsonl` (with this folder's Stage 2
/// training set when `trace` is named) and `sibling_stats.json`.
pub fn run_generate(g: &SiblingData) -> anyhow::Result<()> {
    let named = parse(&g.spec)?;
    std::fs::create_dir_all(&g.output_dir)
        .with_context(|| format!("cannot create `{}`", g.output_dir.display()))?;
    let siblings: Vec<_> = named
        .iter()
        .filter(|n| n.name != "trace")
        .cloned()
        .collect();
    // Training tasks only: the held-out ones are `eval --environment`'s.
    let mut envs = build(&siblings, &g.data, g.unsafe_no_sandbox, Part::Train)?.into_iter();
    let mut files: Vec<(PathBuf, f64)> = Vec::new();
    let mut stats = Vec::new();
    for n in &named {
        let path = if n.name == "trace" {
            let p = g.output_dir.join("stage2_transformed_train.jsonl");
            anyhow::ensure!(
                p.is_file(),
                "`trace` in --environment mixes in `{}`, which is not there\nhint: run `trace-train generate --output_dir {}` first",
                p.display(),
                g.output_dir.display()
            );
            p
        } else {
            let env = envs.next().expect("built above, in order");
            let name = file_stem(&n.label());
            let end = env.task_count().map_or(g.tasks, |n| g.tasks.min(n));
            let ids: Vec<u64> = (0..end).collect();
            let p = g.output_dir.join(format!("{name}_sft.jsonl"));
            let counts = trace_train::env::affine::sft::write_records(&*env, &ids, &p)?;
            let episodes = counts
                .episodes
                .map_or_else(String::new, |n| format!(" ({n} episodes demonstrated)"));
            eprintln!(
                "{name}: {} records of {} tasks{episodes} (dropped: {}) -> {}",
                counts.written,
                counts.tasks,
                super::counts(&counts.dropped),
                p.display()
            );
            stats.push(counts);
            p
        };
        files.push((path, n.weight));
    }
    let mixture = g.output_dir.join("mixture_sft.jsonl");
    let refs: Vec<(&std::path::Path, f64)> = files.iter().map(|(p, w)| (p.as_path(), *w)).collect();
    let n = trace_train::env::affine::sft::write_mixture(&refs, &mixture, g.seed)?;
    eprintln!("mixture: {n} records -> {}", mixture.display());
    trace_train::atomic::write(
        &g.output_dir.join("sibling_stats.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "environment": g.spec,
            "files": stats,
            "mixture_records": n,
        }))?
        .as_bytes(),
    )?;
    println!("{}", g.output_dir.display());
    Ok(())
}

/// An environment's label as a file name's start: `python:envs/my.py` →
/// `python-envs-my.py`, a URL → its host and port.
fn file_stem(label: &str) -> String {
    let label = label.split_once("://").map_or(label, |(_, rest)| rest);
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .to_owned()
}

#[derive(Args, Clone, Debug)]
#[command(rename_all = "snake_case")]
pub struct TaskArgs {
    /// One of the environments (`trace`, `sat`, `abd`, `ded`, `word`).
    #[arg(long)]
    pub environment: String,
    /// The task id (SAT: any integer seed; ABD, DED: a row index; trace:
    /// row `id mod N`, transform seed `id`).
    #[arg(long)]
    pub task_id: u64,
    /// Prints this many tasks, from `task_id` on, one JSON object a line
    /// (a file a `python:` environment can list in `FILES`); an id whose
    /// task cannot be made is skipped, named on stderr with its reason.
    #[arg(long, default_value_t = 1)]
    pub tasks: u64,
    #[command(flatten)]
    pub data: EnvData,
    /// Run programs WITHOUT isolation (only on machines you trust).
    #[arg(long = "unsafe-no-sandbox")]
    pub unsafe_no_sandbox: bool,
}

/// `trace-train task`: the task as JSON on stdout.
pub fn run_task(args: &TaskArgs) -> anyhow::Result<()> {
    let names = parse(&args.environment)?;
    anyhow::ensure!(
        names.len() == 1,
        "`task` shows one environment's task; got `{}`",
        args.environment
    );
    anyhow::ensure!(args.tasks >= 1, "--tasks must be at least 1");
    let env = build(&names, &args.data, args.unsafe_no_sandbox, Part::All)?.remove(0);
    let ids: Vec<u64> = (args.task_id..args.task_id.saturating_add(args.tasks)).collect();
    let made = env.tasks(&ids);
    let mut lines = Vec::with_capacity(made.len());
    let mut skipped = std::collections::BTreeMap::<String, u64>::new();
    for (id, task) in ids.iter().zip(made) {
        let task = match task {
            Ok(t) => t,
            Err(why) if args.tasks > 1 => {
                eprintln!("{} task {id} skipped: {why}", env.name());
                *skipped.entry(why).or_default() += 1;
                continue;
            }
            Err(why) => {
                let range = env
                    .task_count()
                    .map(|n| format!(" (its ids are 0..{n})"))
                    .unwrap_or_default();
                anyhow::bail!(
                    "{} task {id} cannot be made: {why}{range}\nhint: choose another task id; `trace-train generate` counts which rows fail and why",
                    env.name(),
                )
            }
        };
        let out = serde_json::json!({
            "environment": env.name(),
            "task_id": task.task_id,
            "prompt": task.prompt,
            "key": env.key(&task),
        });
        lines.push(if args.tasks == 1 {
            serde_json::to_string_pretty(&out)?
        } else {
            out.to_string()
        });
    }
    anyhow::ensure!(
        !lines.is_empty(),
        "{}: none of tasks {}..{} can be made ({})",
        env.name(),
        args.task_id,
        args.task_id.saturating_add(args.tasks),
        super::counts(&skipped)
    );
    if !skipped.is_empty() {
        eprintln!(
            "{} of {} tasks written; skipped: {}",
            lines.len(),
            ids.len(),
            super::counts(&skipped)
        );
    }
    println!("{}", lines.join("\n"));
    Ok(())
}
