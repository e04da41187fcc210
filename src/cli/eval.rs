//! `eval`: batched greedy generation over a test JSONL (or the held-out
//! short set), the environment's extraction and scoring, accuracy with its
//! Jeffreys interval, a breakdown by output lines and difficulty with the
//! diagnostics of the misses, and a JSON report with every prediction.
//! With `--max_turns K` an item answered wrongly gets the environment's
//! feedback turn and answers again, up to K answers
//! ([`trace_train::eval::turns`]), with --environment too (each
//! environment's own feedback). `eval --compare A.json B.json` prints
//! two reports side by side.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use trace_train::data::ChatTokenizer;
use trace_train::env::{Environment, Task};
use trace_train::eval::envs::{EnvPrediction, EnvsReport};
use trace_train::eval::heldout::{self, PromptKind};
use trace_train::eval::{DEFAULT_LEVEL, EvalItem, Report, turns};
use trace_train::kit::load;
use trace_train::model::decode::generate::Generation;
use trace_train::model::{self, BasePrecision};
use trace_train::reward;
use trace_train::sandbox::{Executor, ExecutorConfig};

#[derive(Args, Clone)]
#[command(rename_all = "snake_case")]
pub struct EvalArgs {
    /// Model folder (a merged model, or the base model with --adapter), or
    /// a hub id in the Hugging Face cache.
    #[arg(long, required_unless_present = "compare")]
    pub model: Option<PathBuf>,
    /// With a hub id: the branch, tag or commit to load (default `main`).
    #[arg(long)]
    pub revision: Option<String>,
    /// Print two eval reports side by side (overall and every bucket, with
    /// intervals and the change), and nothing else.
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"], conflicts_with_all = ["model", "adapter", "data", "heldout", "max_turns", "feedback"])]
    pub compare: Option<Vec<PathBuf>>,
    /// Evaluate on a built-in held-out set instead of --data: `short` (small
    /// stdin programs printing one to three lines, never in a training set).
    #[arg(long, conflicts_with = "data")]
    pub heldout: Option<String>,
    /// With --heldout: `original` (the programs as written, the Stage 1
    /// prompt) or `transformed` (the environment's __DBG_ variants and
    /// prompt, run in the sandbox).
    #[arg(long, default_value = "original", requires = "heldout")]
    pub prompt: String,
    /// With --heldout and --prompt transformed: variants a program.
    #[arg(long, default_value_t = 1, requires = "heldout")]
    pub variants: usize,
    /// A LoRA adapter folder (PEFT layout) to apply to --model.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Test records (default: the Stage 2 test set).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Report file (default: eval_report.json beside the model folder, or
    /// eval_report_heldout_NAME.json with --heldout NAME).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Evaluate only the first N records.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Longest answer in tokens; longer ones are cut and scored as they are.
    #[arg(long, default_value_t = 2048)]
    pub max_new_tokens: usize,
    /// Prompts decoded together.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Answers an item may get: after a wrong one the environment's
    /// feedback (--feedback) comes as a user turn and the model answers
    /// again, as in Stage 3's episodes (`max_turns`). The report adds the
    /// accuracy after each turn and the retries that changed nothing; its
    /// other numbers are each item's last answer's. With --environment,
    /// each environment's own feedback and its accuracy after each turn.
    /// 1: one answer.
    #[arg(long, default_value_t = 1, value_name = "K", value_parser = parse_max_turns)]
    pub max_turns: usize,
    /// With --max_turns 2 or more, what a feedback turn says: `verdict`
    /// (wrong, try again), `first_diff` (also the first output line that
    /// differs; the default) or `line` (also what that line should be).
    #[arg(long, value_name = "KIND", value_parser = parse_feedback)]
    pub feedback: Option<String>,
    /// With --environment naming a multi-step environment (`word_steps`,
    /// `python:` with an `Episode`, `http://`): the most actions an
    /// episode takes (Stage 3's `max_steps_per_episode`); it ends sooner
    /// when the environment says done.
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = parse_max_turns)]
    pub max_steps_per_episode: usize,
    /// `cpu`, `cuda`, `cuda:N` or `auto`.
    #[arg(long)]
    pub device: Option<String>,
    /// How the frozen weights are held while decoding: `bf16` (as
    /// loaded), `nf4` (4 bits; on a GPU only) or `fp8` (8 bits, FP8
    /// products), as `model.base_precision` says for training.
    #[arg(long, value_name = "bf16|nf4|fp8", value_parser = super::parse_base_precision, default_value = "bf16")]
    pub base_precision: BasePrecision,
    /// With --heldout or --environment: run programs WITHOUT isolation
    /// (only on machines you trust).
    #[arg(long = "unsafe-no-sandbox")]
    pub unsafe_no_sandbox: bool,
    #[command(flatten)]
    pub envs: EnvEvalArgs,
}

/// `eval --environment`: tasks of several environments, each scored by its
/// own rule, with per-environment metrics and the aggregates.
#[derive(Args, Clone, Debug, Default)]
#[command(rename_all = "snake_case")]
pub struct EnvEvalArgs {
    /// Evaluate on environments instead of --data: the registry's (`sat`,
    /// `abd`, `answers:FILE.jsonl`, `python:FILE.py`, `http://HOST:PORT`,
    /// ...) joined by `+`, each optionally weighted for the aggregates
    /// (`sat+abd:2+ded`; default weight: the environment's task count).
    /// Each is reported under its own name (the URL without its `?`
    /// settings for a server).
    #[arg(long, conflicts_with_all = ["data", "heldout", "compare"])]
    pub environment: Option<String>,
    /// With --environment: tasks an environment, whatever its weight (ids
    /// from --task_offset on; one with a task count, as ABD, DED, a
    /// question file, a server or a `python:` file's `TASK_COUNT`, stops
    /// at its last).
    #[arg(long, default_value_t = 100)]
    pub tasks: u64,
    /// With --environment: the first task id.
    #[arg(long, default_value_t = 0)]
    pub task_offset: u64,
    /// With --environment: SAT's, ABD's and DED's tasks to take, `heldout`
    /// (every tenth of the environment's own ids, which `generate
    /// --environment` and `ppo` never see), `train` or `all` (the
    /// environment's own ids, as `trace-train task` numbers them).
    /// Default: heldout.
    #[arg(long, value_parser = ["heldout", "train", "all"])]
    pub split: Option<String>,
    #[command(flatten)]
    pub data: trace_train::env::registry::EnvData,
}

/// `eval --compare A B`: the side-by-side table on stdout.
pub fn run_compare(a: &std::path::Path, b: &std::path::Path) -> anyhow::Result<()> {
    let (ra, rb) = (Report::read(a)?, Report::read(b)?);
    print!(
        "{}",
        trace_train::eval::compare(&ra, &rb, &a.display().to_string(), &b.display().to_string())
    );
    Ok(())
}

/// The items of `--heldout NAME`.
fn heldout_items(args: &EvalArgs, name: &str) -> anyhow::Result<Vec<EvalItem>> {
    anyhow::ensure!(
        name == "short",
        "unknown held-out set `{name}`\nhint: the built-in held-out set is `short`"
    );
    let prompt = PromptKind::parse(&args.prompt).with_context(|| {
        format!(
            "--prompt `{}` is not `original` or `transformed`",
            args.prompt
        )
    })?;
    anyhow::ensure!(args.variants >= 1, "--variants must be at least 1");
    let workers = trace_train::sandbox::default_workers();
    let exec = Executor::new(ExecutorConfig::new(
        "/usr/bin/python3",
        workers,
        args.unsafe_no_sandbox,
    ))
    .context("cannot start the sandbox for the held-out programs")?;
    let (mut items, dropped) = heldout::short_items(
        &exec,
        &heldout::Options {
            prompt,
            variants: args.variants,
            // One item a program: the first --limit programs are enough.
            programs: args.limit.filter(|_| prompt == PromptKind::Original),
            ..heldout::Options::default()
        },
    )?;
    if !dropped.is_empty() {
        eprintln!("held-out set: left out {dropped:?}");
    }
    if let Some(l) = args.limit {
        items.truncate(l);
    }
    Ok(items)
}

pub fn run_eval(args: &EvalArgs) -> anyhow::Result<Report> {
    // Before the held-out set's sandbox starts.
    feedback_kind(args)?;
    let items = eval_items(args)?;
    run_eval_on(args, &items)
}

/// `--max_turns`: a count of answers, at least 1.
fn parse_max_turns(s: &str) -> Result<usize, String> {
    const HINT: &str = "hint: 1 (the default) scores one answer an item; 2 or more give a wrong answer a feedback turn and another try";
    match s.parse::<usize>() {
        Ok(0) => Err(format!("an item needs at least one answer\n{HINT}")),
        Ok(k) => Ok(k),
        Err(_) => Err(format!("`{s}` is not a number of answers\n{HINT}")),
    }
}

/// `--feedback`: one of [`reward::FEEDBACK_KINDS`].
fn parse_feedback(s: &str) -> Result<String, String> {
    if reward::FEEDBACK_KINDS.contains(&s) {
        return Ok(s.to_owned());
    }
    Err(format!(
        "`{s}` is not one of {}\nhint: `verdict` says only that the answer is wrong, `first_diff` also names the first output line that differs, `line` also what that line should be",
        reward::FEEDBACK_KINDS.join(", ")
    ))
}

/// The feedback kind of `--max_turns` and `--feedback` (Stage 3's default
/// when not given), or what is wrong with them (also for settings made
/// without the command line: the pipeline's).
pub fn feedback_kind(args: &EvalArgs) -> anyhow::Result<&str> {
    parse_max_turns(&args.max_turns.to_string())
        .map_err(|e| anyhow::anyhow!("--max_turns {}: {e}", args.max_turns))?;
    let Some(kind) = args.feedback.as_deref() else {
        return Ok("first_diff");
    };
    parse_feedback(kind).map_err(|e| anyhow::anyhow!("--feedback {kind}: {e}"))?;
    anyhow::ensure!(
        args.max_turns > 1,
        "--feedback {kind} needs --max_turns 2 or more\nhint: with one answer an item there is no feedback turn; pass --max_turns 2 (or 3) with it"
    );
    Ok(kind)
}

/// The items `args` asks for: the held-out set of `--heldout`, else the
/// records of `--data`, the first `--limit` of them.
pub fn eval_items(args: &EvalArgs) -> anyhow::Result<Vec<EvalItem>> {
    Ok(match &args.heldout {
        Some(name) => heldout_items(args, name)?,
        None => {
            let data = args.data.clone().unwrap_or_else(|| {
                PathBuf::from("datasets/trace_training/stage2_transformed_test.jsonl")
            });
            let items = read_items(&data, args.limit)?;
            anyhow::ensure!(
                !items.is_empty(),
                "no records in `{}`\nhint: run `trace-train generate` first, or pass --data",
                data.display()
            );
            items
        }
    })
}

/// `--model` (with `--revision`) resolved to a folder; a hub model's
/// commit is printed.
fn resolve_model(args: &EvalArgs) -> anyhow::Result<model::io::resolve::Resolved> {
    let spec = args
        .model
        .clone()
        .context("--model is required\nhint: pass the model folder to evaluate")?;
    let resolved =
        model::io::resolve::resolve_revision(&spec.to_string_lossy(), args.revision.as_deref())?;
    if let Some(commit) = &resolved.commit {
        eprintln!("model `{}` at commit {commit}", resolved.spec);
    }
    Ok(resolved)
}

/// Evaluates `args`'s model on `items` (made by [`eval_items`], once for
/// several models: the pipeline's gate) and writes the report.
pub fn run_eval_on(args: &EvalArgs, items: &[EvalItem]) -> anyhow::Result<Report> {
    let (report, out) = evaluate(args, items)?;
    eprintln!("{}", report.summary());
    if let Some(t) = &report.turns {
        eprint!("{}", t.table(report.n));
    }
    eprintln!("report: {}", out.display());
    Ok(report)
}

/// [`run_eval_on`] without a word: the report and where it was written.
pub fn evaluate(args: &EvalArgs, items: &[EvalItem]) -> anyhow::Result<(Report, PathBuf)> {
    let model_dir = resolve_model(args)?.dir;
    let feedback = feedback_kind(args)?;
    let sampler = Sampler::load(args, &model_dir)?;
    // Each turn's prompts of every item still going, decoded together.
    let predictions = turns::run_episodes(items, &sampler.tok, args.max_turns, feedback, |p| {
        sampler.greedy(p)
    })?;
    let report = Report::multi_turn(predictions, DEFAULT_LEVEL, args.max_turns, feedback);
    let file = match &args.heldout {
        Some(name) => format!("eval_report_heldout_{name}.json"),
        None => "eval_report.json".to_owned(),
    };
    let out = args.output.clone().unwrap_or_else(|| {
        args.adapter
            .as_ref()
            .unwrap_or(&model_dir)
            .parent()
            .map_or_else(|| PathBuf::from(&file), |p| p.join(&file))
    });
    report.write(&out)?;
    Ok((report, out))
}

/// The model and tokenizer eval decodes with, and its batch settings.
struct Sampler {
    tok: ChatTokenizer,
    loaded: model::LoadedModel,
    device: candle_core::Device,
    batch_size: usize,
    max_new_tokens: usize,
}

impl Sampler {
    fn load(args: &EvalArgs, model_dir: &std::path::Path) -> anyhow::Result<Self> {
        let device = super::pick_device(args.device.as_deref().unwrap_or("auto"))?;
        let tok = ChatTokenizer::from_dir(model_dir)?;
        let adapters: Vec<PathBuf> = args.adapter.iter().cloned().collect();
        let loaded = load::for_inference(model_dir, &adapters, args.base_precision, &device)?;
        tok.check_against_vocab(loaded.model.vocab_size())?;
        Ok(Self {
            tok,
            loaded,
            device,
            batch_size: args.batch_size.max(1),
            max_new_tokens: args.max_new_tokens,
        })
    }

    /// Greedy generations of `prompts`, in order: `--batch_size` at a
    /// time, prompts of similar length together.
    fn greedy(&self, prompts: &[Vec<u32>]) -> anyhow::Result<Vec<Generation>> {
        // A signal caught for an earlier stage of this process (a
        // pipeline's) ends the eval between batches; nothing is written.
        trace_train::eval::exact::greedy_batches(
            &self.loaded.model,
            &self.tok,
            prompts,
            self.batch_size,
            self.max_new_tokens,
            &self.device,
            true,
        )
        .map_err(|e| super::out_of_memory_hint(e, "lower --batch_size or --max_new_tokens"))
    }
}

/// `eval --environment SPEC`: each environment's tasks, the model's
/// greedy completions, each scored by its environment; the report of
/// [`EnvsReport`] (default `eval_report_envs.json` beside the model).
pub fn run_envs_eval(args: &EvalArgs, spec: &str) -> anyhow::Result<EnvsReport> {
    let feedback = feedback_kind(args)?;
    let named = trace_train::env::registry::parse(spec)?;
    let weights: Option<Vec<f64>> = named
        .iter()
        .any(|n| n.weight != 1.0)
        .then(|| named.iter().map(|n| n.weight).collect());
    let resolved = resolve_model(args)?;
    let part = trace_train::env::affine::split::Part::parse(
        args.envs.split.as_deref().unwrap_or("heldout"),
    )?;
    let envs =
        trace_train::env::registry::build(&named, &args.envs.data, args.unsafe_no_sandbox, part)?;
    let mut tasks = Vec::new();
    for env in &envs {
        let end = args.envs.task_offset.saturating_add(args.envs.tasks);
        let end = env.task_count().map_or(end, |n| end.min(n));
        let ids: Vec<u64> = (args.envs.task_offset..end).collect();
        let mut skipped = std::collections::BTreeMap::<String, u64>::new();
        let made: Vec<_> = env
            .tasks(&ids)
            .into_iter()
            .filter_map(|t| t.map_err(|why| *skipped.entry(why).or_default() += 1).ok())
            .collect();
        eprintln!(
            "{}: {} tasks{}",
            env.name(),
            made.len(),
            if skipped.is_empty() {
                String::new()
            } else {
                format!(" (no task made: {})", super::counts(&skipped))
            }
        );
        tasks.push(made);
    }
    let flat: Vec<(&dyn Environment, &Task)> = envs
        .iter()
        .zip(&tasks)
        .flat_map(|(env, ts)| ts.iter().map(move |t| (&**env, t)))
        .collect();
    anyhow::ensure!(!flat.is_empty(), "no task was made in {spec}");
    let sampler = Sampler::load(args, &resolved.dir)?;
    let started = std::time::Instant::now();
    // Each turn's prompts of every task still going, decoded together.
    let mut predictions = turns::run_env_episodes(
        &flat,
        &sampler.tok,
        args.max_turns,
        args.max_steps_per_episode,
        feedback,
        |p| sampler.greedy(p),
    )?
    .into_iter();
    let seconds = started.elapsed().as_secs_f64();
    let sections: Vec<(String, Vec<EnvPrediction>)> = envs
        .iter()
        .zip(&tasks)
        .map(|(env, ts)| {
            (
                env.name().to_owned(),
                predictions.by_ref().take(ts.len()).collect(),
            )
        })
        .collect();
    let mut report = EnvsReport::new(&resolved.spec, sections, weights.as_deref(), DEFAULT_LEVEL)?;
    report.split = Some(part.name().to_owned());
    report.seconds = Some(seconds);
    report.adapter = args.adapter.as_ref().map(|a| a.display().to_string());
    if args.max_turns > 1 {
        report.count_turns(args.max_turns, feedback, DEFAULT_LEVEL);
    }
    let out = args.output.clone().unwrap_or_else(|| {
        let file = "eval_report_envs.json";
        args.adapter
            .as_ref()
            .unwrap_or(&resolved.dir)
            .parent()
            .map_or_else(|| PathBuf::from(file), |p| p.join(file))
    });
    report.write(&out)?;
    eprintln!("{}", report.summary());
    eprintln!("report: {}", out.display());
    Ok(report)
}

fn read_items(path: &std::path::Path, limit: Option<usize>) -> anyhow::Result<Vec<EvalItem>> {
    let f =
        std::fs::File::open(path).with_context(|| format!("cannot open `{}`", path.display()))?;
    let mut items = Vec::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        if limit.is_some_and(|l| items.len() >= l) {
            break;
        }
        let line =
            line.with_context(|| format!("`{}`: line {}: unreadable", path.display(), n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("`{}`: line {}: invalid JSON", path.display(), n + 1))?;
        items.push(EvalItem::from_record(&v).with_context(|| {
            format!(
                "`{}`: line {}: not a trace record\nhint: eval reads the JSONL that `generate` writes",
                path.display(),
                n + 1
            )
        })?);
    }
    Ok(items)
}
