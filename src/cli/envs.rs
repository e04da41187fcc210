//! The environments a command names (`--environment sat+abd+ded`, each
//! optionally weighted, `trace:2+abd`), built from their data settings,
//! and `trace-train task`, which prints one task of one environment as
//! JSON.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use trace_train::dataset::Source;
use trace_train::env::affine::split::{Part, Split};
use trace_train::env::affine::{abd::AbdEnv, ded::DedEnv, rows, sat::SatEnv};
use trace_train::env::{Environment, TraceEnv};
use trace_train::sandbox::{self, Executor, ExecutorConfig};

/// The environments there are.
pub const NAMES: [&str; 4] = ["trace", "sat", "abd", "ded"];

/// Where the environments' data comes from, and how their programs run.
#[derive(Args, Clone, Debug)]
#[command(rename_all = "snake_case")]
pub struct EnvData {
    /// Rows of the trace environment: `builtin`, a JSONL path, a hub id
    /// (as `generate`'s --dataset).
    #[arg(long, default_value = "builtin")]
    pub trace_dataset: String,
    /// Rows of ABD (`program`, `inputs`, `output`): `builtin`, a JSONL path
    /// or a hub id; several joined by `+`.
    #[arg(long, default_value = "builtin")]
    pub abd_dataset: String,
    /// Rows of DED (`prompt`, `test_cases` or `verification_info`):
    /// `ded-builtin`, `humaneval:PATH`, a JSONL path or a hub id; several
    /// joined by `+`.
    #[arg(long, default_value = "ded-builtin")]
    pub ded_dataset: String,
    /// The file to read inside a hub dataset.
    #[arg(long, default_value = "python_dataset.jsonl")]
    pub hub_file: String,
    /// Interpreter every uid can run.
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: PathBuf,
    /// Sandbox worker slots (default: two a core).
    #[arg(long)]
    pub num_workers: Option<usize>,
    /// Trace: most `__DBG_` prints injected into a program.
    #[arg(long, default_value_t = 6)]
    pub max_injections: usize,
}

impl Default for EnvData {
    fn default() -> Self {
        Self {
            trace_dataset: "builtin".into(),
            abd_dataset: "builtin".into(),
            ded_dataset: "ded-builtin".into(),
            hub_file: "python_dataset.jsonl".into(),
            python: PathBuf::from("/usr/bin/python3"),
            num_workers: None,
            max_injections: 6,
        }
    }
}

/// `sat+abd:2+ded` (or commas) → names and weights (1 when not given).
pub fn parse(spec: &str) -> anyhow::Result<Vec<(String, f64)>> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for part in spec.split(['+', ',']) {
        let (name, weight) = match part.split_once(':') {
            Some((n, w)) => {
                let w: f64 = w
                    .parse()
                    .ok()
                    .filter(|w: &f64| w.is_finite() && *w > 0.0)
                    .with_context(|| {
                        format!(
                            "--environment `{spec}`: weight `{w}` of `{n}` is not a number above 0"
                        )
                    })?;
                (n, w)
            }
            None => (part, 1.0),
        };
        anyhow::ensure!(
            NAMES.contains(&name),
            "--environment `{spec}`: unknown environment `{name}`\nhint: choose from {}, joined by `+`, each optionally weighted as `abd:2`",
            NAMES.join(", ")
        );
        anyhow::ensure!(
            !out.iter().any(|(n, _)| n == name),
            "--environment `{spec}`: `{name}` is named twice"
        );
        out.push((name.to_owned(), weight));
    }
    Ok(out)
}

/// Builds the environments `names` (one executor for ABD and DED; none
/// when only SAT is named); SAT, ABD and DED seen through `part` (their
/// training or held-out tasks, `affine::split`; Trace has its own held-out
/// sets).
pub fn build(
    names: &[String],
    data: &EnvData,
    unsafe_no_sandbox: bool,
    part: Part,
) -> anyhow::Result<Vec<Arc<dyn Environment>>> {
    let workers = data.num_workers.unwrap_or_else(sandbox::default_workers);
    let executor = || {
        Executor::new(ExecutorConfig::new(&data.python, workers, unsafe_no_sandbox))
            .context("ABD, DED and trace run programs in the sandbox\nhint: run as root, or pass --unsafe-no-sandbox on a machine you trust")
    };
    let mut shared: Option<Arc<Executor>> = None;
    let mut exec = || -> anyhow::Result<Arc<Executor>> {
        if let Some(e) = &shared {
            return Ok(Arc::clone(e));
        }
        let e = Arc::new(executor()?);
        shared = Some(Arc::clone(&e));
        Ok(e)
    };
    let mut envs: Vec<Arc<dyn Environment>> = Vec::new();
    for name in names {
        let env: Arc<dyn Environment> = match name.as_str() {
            "sat" => Arc::new(SatEnv),
            "abd" => {
                let rows = rows::load(&data.abd_dataset, &data.hub_file)
                    .with_context(|| format!("reading ABD's rows from `{}`", data.abd_dataset))?;
                Arc::new(AbdEnv::new(Arc::new(rows), exec()?)?)
            }
            "ded" => {
                let rows = rows::load(&data.ded_dataset, &data.hub_file)
                    .with_context(|| format!("reading DED's rows from `{}`", data.ded_dataset))?;
                Arc::new(DedEnv::new(Arc::new(rows), exec()?)?)
            }
            "trace" => {
                let source = Source::resolve(&data.trace_dataset, &data.hub_file)?;
                let rows = source
                    .rows()?
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("reading the rows of `{}`", source.describe()))?;
                Arc::new(
                    TraceEnv::new(rows, executor()?, data.max_injections)?
                        .with_dataset(source.describe()),
                )
            }
            other => anyhow::bail!("unknown environment `{other}`"),
        };
        let env: Arc<dyn Environment> = if name == "trace" || part == Part::All {
            env
        } else {
            Arc::new(Split::new(env, part))
        };
        envs.push(env);
    }
    Ok(envs)
}

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
    let siblings: Vec<String> = named
        .iter()
        .filter(|(n, _)| n != "trace")
        .map(|(n, _)| n.clone())
        .collect();
    // Training tasks only: the held-out ones are `eval --environment`'s.
    let envs = build(&siblings, &g.data, g.unsafe_no_sandbox, Part::Train)?;
    let mut files: Vec<(PathBuf, f64)> = Vec::new();
    let mut stats = Vec::new();
    for (name, weight) in &named {
        let path = if name == "trace" {
            let p = g.output_dir.join("stage2_transformed_train.jsonl");
            anyhow::ensure!(
                p.is_file(),
                "`trace` in --environment mixes in `{}`, which is not there\nhint: run `trace-train generate --output_dir {}` first",
                p.display(),
                g.output_dir.display()
            );
            p
        } else {
            let env = envs.iter().find(|e| e.name() == name).expect("built above");
            let end = env.task_count().map_or(g.tasks, |n| g.tasks.min(n));
            let ids: Vec<u64> = (0..end).collect();
            let p = g.output_dir.join(format!("{name}_sft.jsonl"));
            let counts = trace_train::env::affine::sft::write_records(&**env, &ids, &p)?;
            eprintln!(
                "{name}: {} records of {} tasks (dropped: {}) -> {}",
                counts.written,
                counts.tasks,
                super::counts(&counts.dropped),
                p.display()
            );
            stats.push(counts);
            p
        };
        files.push((path, *weight));
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

#[derive(Args, Clone, Debug)]
#[command(rename_all = "snake_case")]
pub struct TaskArgs {
    /// One of trace, sat, abd, ded.
    #[arg(long)]
    pub environment: String,
    /// The task id (SAT: any integer seed; ABD, DED: a row index; trace:
    /// row `id mod N`, transform seed `id`).
    #[arg(long)]
    pub task_id: u64,
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
    let env = build(
        &[names[0].0.clone()],
        &args.data,
        args.unsafe_no_sandbox,
        Part::All,
    )?
    .remove(0);
    let task = env.task(args.task_id).map_err(|why| {
        let range = env
            .task_count()
            .map(|n| format!(" (its ids are 0..{n})"))
            .unwrap_or_default();
        anyhow::anyhow!(
            "{} task {} cannot be made: {why}{range}",
            env.name(),
            args.task_id
        )
    })?;
    let out = serde_json::json!({
        "environment": env.name(),
        "task_id": task.task_id,
        "prompt": task.prompt,
        "key": env.key(&task),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_lists_parse_with_weights() {
        assert_eq!(
            parse("trace+abd:2,ded").unwrap(),
            [
                ("trace".into(), 1.0),
                ("abd".into(), 2.0),
                ("ded".into(), 1.0)
            ]
        );
        for bad in ["sat+", "foo", "abd:0", "abd:x", "sat+sat"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(format!("{:#}", parse("foo").unwrap_err()).contains("hint:"));
    }
}
