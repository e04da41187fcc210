//! `rollouts`, `prefs` and `dpo`: DPO from the model's own rollouts, each
//! step a command whose output file is the next one's input.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use trace_train::config::{self, DpoConfig, ModelConfig, PipelineConfig, RlConfig};
use trace_train::data::ChatTokenizer;
use trace_train::data::buckets::UpToBucket;
use trace_train::dist::Single;
use trace_train::kit::RunOptions;
use trace_train::kit::load;
use trace_train::model;
use trace_train::pref::pairs::{Criterion, PairRules, make_pairs};
use trace_train::pref::rollout::{
    PromptVariant, Rollout, RolloutPlan, RolloutStats, SamplingSettings, read_jsonl, roll_out,
    write_jsonl,
};
use trace_train::recipes::dpo::{self, DpoJob, DpoSummary};

#[derive(Args, Clone, Debug)]
#[command(rename_all = "snake_case")]
pub struct RolloutsArgs {
    /// The model folder (or hub id) to sample from.
    #[arg(long)]
    pub model: String,
    /// A LoRA adapter folder (PEFT layout) to apply to --model.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Samples a prompt.
    #[arg(long, default_value_t = 4)]
    pub num_samples: usize,
    /// Also decode each prompt's answer greedily, as `eval` does: one more
    /// answer a prompt (sample --num_samples, temperature 0 in its
    /// `sampling`), whose pairs `prefs` keeps first under its cap.
    #[arg(long)]
    pub greedy: bool,
    /// Ask each sample in one of several ways, drawn a sample: `builtin`
    /// (the reasoning styles `direct`, `reflective`, `deliberative`) or a
    /// JSON file `[{"name": ..., "template": "... {prompt} ..."}]`. Each
    /// line names its variant; the pairs keep the task's own prompt.
    #[arg(long, value_name = "builtin|FILE")]
    pub prompt_variants: Option<String>,
    /// Prompts (draws that give no prompt are passed over and counted).
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// The first draw of the environment's task stream (a later round
    /// continues where an earlier one stopped).
    #[arg(long, default_value_t = 0)]
    pub first_draw: u64,
    /// `trace` (programs run in the sandbox), or any environment of `eval
    /// --environment` (`answers`, `answers:FILE`, `sat`, `python:FILE`,
    /// ...), or a mixture of them joined by `+`.
    #[arg(long, default_value = "trace")]
    pub environment: String,
    /// Rows of the trace environment: `builtin`, a JSONL path,
    /// `humaneval:PATH`, `synthetic:N[:SEED]`, a hub id, or several joined
    /// by `+`.
    #[arg(long, default_value = "builtin")]
    pub dataset: String,
    /// Where the JSON lines go.
    #[arg(long, default_value = "rollouts.jsonl")]
    pub output: PathBuf,
    /// Sampling temperature.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Nucleus sampling mass (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Top-k sampling (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Longest answer in tokens.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    /// Longest prompt in tokens (longer ones are passed over).
    #[arg(long, default_value_t = 1536)]
    pub max_prompt_tokens: usize,
    /// Only tasks up to this bucket of --bucket_feature (e.g. `1`: programs
    /// that print one line), where the model is right often enough for a
    /// prompt to give pairs; the others are passed over and counted.
    #[arg(long)]
    pub last_bucket: Option<String>,
    /// The feature --last_bucket counts by: output_lines, loop_depth,
    /// lines or injections.
    #[arg(long, default_value = "output_lines")]
    pub bucket_feature: String,
    /// Answers decoding at once (0: all).
    #[arg(long, default_value_t = 0)]
    pub max_rows: usize,
    /// Seed of the task draws and the sampling.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// With a hub id: the branch, tag or commit.
    #[arg(long)]
    pub revision: Option<String>,
    /// `cpu`, `cuda`, `cuda:N` or `auto`.
    #[arg(long)]
    pub device: Option<String>,
    /// How the frozen base weights are held while sampling: bf16 (the
    /// default), nf4 or fp8 (as `eval`; nf4 applies on a GPU only).
    #[arg(long, value_name = "bf16|nf4|fp8", value_parser = super::parse_base_precision, default_value = "bf16")]
    pub base_precision: model::BasePrecision,
    /// Sandbox worker slots (0: two a core).
    #[arg(long, default_value_t = 0)]
    pub num_workers: usize,
    /// Run programs WITHOUT isolation (rlimits only). Only for machines and
    /// programs you trust.
    #[arg(long = "unsafe-no-sandbox")]
    pub unsafe_no_sandbox: bool,
}

/// `rollouts`: samples, scores and writes; the stats on stdout.
pub fn rollouts(args: &RolloutsArgs) -> anyhow::Result<RolloutStats> {
    anyhow::ensure!(args.num_samples > 0, "--num_samples: must be at least 1");
    anyhow::ensure!(args.num_prompts > 0, "--num_prompts: must be at least 1");
    let up_to = UpToBucket::from_settings(&args.bucket_feature, args.last_bucket.as_deref())
        .map_err(|e| anyhow::anyhow!(e.named("--bucket_feature", "--last_bucket")))?;
    let device = super::pick_device(args.device.as_deref().unwrap_or("auto"))?;
    let resolved = model::io::resolve::resolve_revision(&args.model, args.revision.as_deref())?;
    let tok = ChatTokenizer::from_dir(&resolved.dir)?;
    let adapters: Vec<PathBuf> = args.adapter.iter().cloned().collect();
    let loaded = load::for_inference(&resolved.dir, &adapters, args.base_precision, &device)?;
    tok.check_against_vocab(loaded.model.vocab_size())?;
    let env_cfg = RlConfig {
        environment: args.environment.clone(),
        dataset: args.dataset.clone(),
        num_workers: args.num_workers,
        ..RlConfig::default()
    };
    let problems = config::Validate::problems(&env_cfg);
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}",
        problems.join("\n  - ")
    );
    let (env, _) = super::ppo::environment(&env_cfg, args.unsafe_no_sandbox)?;
    let plan = RolloutPlan {
        env: &*env,
        num_prompts: args.num_prompts,
        num_samples: args.num_samples,
        greedy: args.greedy,
        task_seed: args.seed,
        first_draw: args.first_draw,
        max_prompt_tokens: args.max_prompt_tokens,
        up_to,
        sampling: SamplingSettings {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            max_new_tokens: args.max_new_tokens,
            seed: args.seed,
        },
        max_rows: args.max_rows,
        model: resolved
            .repo
            .clone()
            .unwrap_or_else(|| resolved.dir.display().to_string()),
        model_commit: resolved.commit.clone(),
        adapter: args.adapter.as_ref().map(|a| a.display().to_string()),
        variants: match &args.prompt_variants {
            Some(spec) => PromptVariant::load(spec).context("--prompt_variants")?,
            None => Vec::new(),
        },
    };
    let (rows, stats) = roll_out(&loaded, &tok, &plan)?;
    write_jsonl(&args.output, &rows)?;
    let greedy = if args.greedy {
        let scored = rows.iter().filter(|r| r.is_greedy()).count();
        format!(" ({} of the {scored} greedy ones)", stats.greedy_correct)
    } else {
        String::new()
    };
    let unmade = if stats.unmade > 0 {
        format!(" ({} of them before they were made)", stats.unmade)
    } else {
        String::new()
    };
    eprintln!(
        "rollouts: {} answers to {} prompts, {} correct{greedy}, into `{}`; prompts passed over: {}{unmade}; answers not scored: {}",
        stats.rollouts,
        stats.prompts,
        stats.correct,
        args.output.display(),
        super::counts(&stats.skipped_tasks),
        super::counts(&stats.masked),
    );
    Ok(stats)
}

#[derive(Args, Clone, Debug)]
#[command(rename_all = "snake_case")]
pub struct PrefsArgs {
    /// The rollouts file (`trace-train rollouts` output).
    #[arg(long)]
    pub rollouts: PathBuf,
    /// Where the pairs go (JSON lines); the stats go beside it
    /// (`<output>.stats.json`) and to stdout.
    #[arg(long, default_value = "pairs.jsonl")]
    pub output: PathBuf,
    /// Also pair correct answers, the better over the worse: `shorter`
    /// (fewer tokens), `fewer_lines` (trailing blank lines not counted) or
    /// `score:NAME` (the higher of a score the lines hold in `scores`,
    /// added by your own script; `score:reward` for the reward).
    #[arg(long)]
    pub among_correct: Option<String>,
    /// Drop pairs whose texts are fewer than this many character edits
    /// apart (identical texts are always dropped).
    #[arg(long, default_value_t = 0)]
    pub min_edit_distance: usize,
    /// Most pairs a prompt (0: all).
    #[arg(long, default_value_t = 4)]
    pub max_pairs_per_prompt: usize,
    /// Seeds which pairs a capped prompt keeps.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where none of a prompt's answers is right, pair the environment's
    /// own right answer (the rollouts' `demonstration`) over each wrong one.
    #[arg(long)]
    pub demonstrations: bool,
    /// Keep a right-over-wrong pair only where both answers have the same
    /// number of lines, so the pair does not teach a length (pairs from
    /// --among_correct are kept as they are).
    #[arg(long)]
    pub same_lines: bool,
    /// Also pair, for each wrong answer, the expected line over its first
    /// wrong one after the lines it got right (Step-DPO's pairs): the sides
    /// that go on are trained without the end-of-turn token. Needs bare
    /// answers (no fence or reasoning block around the output).
    #[arg(long)]
    pub first_error: bool,
}

/// `prefs`: pairs from rollouts.
pub fn prefs(args: &PrefsArgs) -> anyhow::Result<trace_train::pref::pairs::PairStats> {
    let among_correct = args
        .among_correct
        .as_deref()
        .map(Criterion::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--among_correct: {e}"))?;
    let rollouts: Vec<Rollout> = read_jsonl(&args.rollouts, "rollout")?;
    if args.demonstrations && rollouts.iter().all(|r| r.demonstration.is_none()) {
        eprintln!(
            "prefs: warning: --demonstrations, but no line of `{}` has a `demonstration`: no prompt gets a demonstration pair\nhint: write the rollouts again with this version of `trace-train rollouts` (older files have none), on an environment that knows its right answers",
            args.rollouts.display()
        );
    }
    let rules = PairRules {
        among_correct,
        min_edit_distance: args.min_edit_distance,
        max_pairs_per_prompt: args.max_pairs_per_prompt,
        seed: args.seed,
        demonstrations: args.demonstrations,
        same_lines: args.same_lines,
        first_error: args.first_error,
    };
    let (pairs, stats) = make_pairs(&rollouts, &rules);
    if let Some(&n) = stats.dropped.get("not_bare") {
        eprintln!(
            "prefs: warning: --first_error, but {n} wrong answers of `{}` are not the bare output (a fence or a reasoning block around it) and gave no first_error pair\nhint: first_error pairs line the answer's lines up with the output's; train the model to answer with the output alone, or leave --first_error off",
            args.rollouts.display()
        );
    }
    write_jsonl(&args.output, &pairs)?;
    let stats_path = PathBuf::from(format!("{}.stats.json", args.output.display()));
    trace_train::atomic::write(
        &stats_path,
        serde_json::to_string_pretty(&stats)?.as_bytes(),
    )?;
    let greedy = if stats.with_greedy > 0 {
        format!(" ({} with the greedy answer)", stats.with_greedy)
    } else {
        String::new()
    };
    eprintln!(
        "prefs: {} pairs{greedy} from {} of {} prompts into `{}`; prompts without a pair: {}",
        pairs.len(),
        stats.prompts_with_pairs,
        stats.prompts,
        args.output.display(),
        counts_usize(&stats.prompts_without_pairs),
    );
    Ok(stats)
}

fn counts_usize(m: &std::collections::BTreeMap<String, usize>) -> String {
    super::counts(&m.iter().map(|(k, v)| (k.clone(), *v as u64)).collect())
}

#[derive(Args, Clone, Debug, Default)]
#[command(rename_all = "snake_case")]
pub struct DpoArgs {
    /// DPO settings, a JSON object of `DpoConfig`'s keys (default:
    /// config/dpo.json when present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Pipeline config whose `model` section applies (default:
    /// config/pipeline_config.json when present).
    #[arg(long)]
    pub pipeline_config: Option<PathBuf>,
    /// The policy's base model folder (default: Stage 2's merged model).
    #[arg(long)]
    pub model: Option<String>,
    /// A trained adapter to go on from (with `reference: initial` the
    /// reference is its frozen copy).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// The pairs file (`trace-train prefs` output).
    #[arg(long)]
    pub pairs: Option<PathBuf>,
    /// Where checkpoints, `final/`, `merged/` and `metrics.jsonl` go
    /// (default checkpoints/stage3_dpo).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// `sigmoid`, `ipo`, `robust` or `hinge`.
    #[arg(long)]
    pub loss: Option<String>,
    /// DPO's beta.
    #[arg(long)]
    pub beta: Option<f64>,
    /// Weight of the chosen answer's NLL (RPO).
    #[arg(long)]
    pub nll_coef: Option<f64>,
    /// `adapter_off`, `initial` or `precomputed`.
    #[arg(long)]
    pub reference: Option<String>,
    /// Peak learning rate.
    #[arg(long)]
    pub learning_rate: Option<f64>,
    /// Passes over the pairs.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Pairs a micro-batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Checkpoint every N steps.
    #[arg(long)]
    pub save_steps: Option<usize>,
    /// Seed of the pair order.
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub run: super::RunFlags,
    /// Settings given in place of a file (the pipeline's
    /// `stage3.dpo.train`).
    #[arg(skip)]
    pub settings: Option<Box<DpoConfig>>,
    /// The model section given in place of the pipeline config's.
    #[arg(skip)]
    pub model_settings: Option<Box<ModelConfig>>,
}

/// The pipeline config whose `model` and `hardware` sections apply, when
/// one is named or `config/pipeline_config.json` exists.
fn pipeline_config(args: &DpoArgs) -> anyhow::Result<Option<PipelineConfig>> {
    let default_file = Path::new("config/pipeline_config.json");
    Ok(match &args.pipeline_config {
        Some(p) => Some(config::load(p)?),
        None if default_file.is_file() => Some(config::load(default_file)?),
        None => None,
    })
}

/// `dpo` from the command line: on one device, or on several GPUs (this
/// process starts one child a GPU, each child runs one rank).
pub fn dpo_command(args: &DpoArgs) -> anyhow::Result<()> {
    let hardware = pipeline_config(args)?
        .map(|p| p.hardware)
        .unwrap_or_default();
    super::launch::dispatch(
        args.run.num_gpus.or(hardware.num_gpus),
        args.run.device.as_deref().unwrap_or("auto"),
        || run_dpo(args).map(|_| ()),
        |child, progress| {
            let mut args = args.clone();
            args.run.device = Some(child.device());
            let job = resolve_dpo(&args)?;
            let comm = child.communicator(&job.run.device)?;
            run_job(&job, &*comm, progress).map(|_| ())
        },
    )
}

/// File values, then flags.
pub fn resolve_dpo(args: &DpoArgs) -> anyhow::Result<DpoJob> {
    let default_file = Path::new("config/dpo.json");
    let mut c: DpoConfig = match (&args.settings, &args.config) {
        (Some(s), _) => (**s).clone(),
        (None, Some(p)) => config::load(p)?,
        (None, None) if default_file.is_file() => config::load(default_file)?,
        (None, None) => DpoConfig::default(),
    };
    let mut model: ModelConfig = match &args.model_settings {
        Some(m) => (**m).clone(),
        None => pipeline_config(args)?.map(|p| p.model).unwrap_or_default(),
    };
    macro_rules! set {
        ($flag:expr, $field:expr) => {
            if let Some(v) = $flag.clone() {
                $field = v;
            }
        };
    }
    set!(args.loss, c.loss);
    set!(args.beta, c.beta);
    set!(args.nll_coef, c.nll_coef);
    set!(args.reference, c.reference);
    set!(args.learning_rate, c.optim.learning_rate);
    set!(args.epochs, c.epochs);
    set!(args.batch_size, c.batch_size);
    set!(args.save_steps, c.save.save_steps);
    set!(args.seed, c.seed);
    if let Some(p) = &args.pairs {
        c.pairs_file = Some(p.clone());
    }
    if let Some(o) = &args.output_dir {
        c.save.output_dir = Some(o.clone());
    }
    if let Some((precision, _)) = args.run.base_precision()? {
        model.base_precision = precision;
    }
    if let Some(on) = args.run.gradient_checkpointing {
        c.gradient_checkpointing = Some(on);
    }
    let problems = config::Validate::problems(&c);
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}",
        problems.join("\n  - ")
    );
    let pairs_file = c
        .pairs_file
        .clone()
        .context("no pairs file\nhint: pass --pairs (the output of `trace-train prefs`)")?;
    let model_spec = args
        .model
        .clone()
        .unwrap_or_else(|| "checkpoints/stage2_sft/merged".into());
    let resolved = model::io::resolve::resolve_revision(&model_spec, None).with_context(|| {
        format!("no policy model at `{model_spec}`\nhint: run Stage 2 (`trace-train sft`) first, or pass --model")
    })?;
    let device = super::pick_device(args.run.device.as_deref().unwrap_or("auto"))?;
    Ok(DpoJob {
        run: RunOptions {
            output_dir: c
                .save
                .output_dir
                .clone()
                .unwrap_or_else(|| "checkpoints/stage3_dpo".into()),
            device,
            resume: args.run.resume,
            force: args.run.force,
            max_steps: args.run.max_steps,
        },
        config: c,
        model,
        base_dir: resolved.dir,
        base_commit: resolved.commit,
        adapter: args.adapter.clone(),
        pairs_file,
    })
}

/// `dpo` on one device, reported.
pub fn run_dpo(args: &DpoArgs) -> anyhow::Result<DpoSummary> {
    let job = resolve_dpo(args)?;
    run_job(&job, &Single, &super::progress::Bar::new("step"))
}

/// Runs `job` as `comm`'s rank and, on rank 0, reports it.
fn run_job(
    job: &DpoJob,
    comm: &dyn trace_train::dist::Communicator,
    progress: &dyn trace_train::progress::Progress,
) -> anyhow::Result<DpoSummary> {
    let lead = comm.rank() == 0;
    if lead {
        eprintln!(
            "dpo: {} loss, beta {}, reference {}, on `{}` from `{}`{}",
            job.config.loss,
            job.config.beta,
            job.config.reference,
            job.pairs_file.display(),
            job.base_dir.display(),
            super::on_gpus(comm.world())
        );
    }
    let s = dpo::run_with(job, comm, progress).map_err(|e| {
        super::out_of_memory_hint(
            e,
            "lower dpo.batch_size (raise gradient_accumulation_steps to keep the batch), or turn gradient checkpointing on; checkpoints written so far are intact, continue with --resume",
        )
    })?;
    if !lead {
        return Ok(s);
    }
    let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.4}"));
    eprintln!(
        "dpo: {} steps{} on {} pairs ({} too long, left out), loss {} -> {}, accuracy {}",
        s.steps,
        s.resumed_from
            .map(|r| format!(" (resumed at {r})"))
            .unwrap_or_default(),
        s.pairs,
        s.dropped_too_long,
        fmt(s.first_loss),
        fmt(s.last_loss),
        fmt(s.last_accuracy),
    );
    let e = &s.ending;
    super::report_ending(
        "dpo",
        e.interrupted,
        e.stop_requested,
        &e.final_dir,
        &e.merged_dir,
    );
    Ok(s)
}
