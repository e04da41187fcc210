//! `warmup` (Stage 1) and `sft` (Stage 2): settings from the stage's config
//! file, the pipeline config's model section and flags, then the SFT recipe.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use trace_train::config::{
    self, HardwareConfig, ModelConfig, PipelineConfig, SftConfig, Source, Sources,
};
use trace_train::dist::{Communicator, Single};
use trace_train::progress::Progress;
use trace_train::recipes::sft::{self, SftJob, SftSummary};

#[derive(Args, Clone, Debug, Default)]
#[command(rename_all = "snake_case")]
pub struct TrainArgs {
    /// Stage config (default: config/<stage>.json when present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Pipeline config whose `model` section applies (default:
    /// config/pipeline_config.json when present).
    #[arg(long)]
    pub pipeline_config: Option<PathBuf>,
    /// Base model: a local HF folder or a hub id (Stage 1 default: the
    /// pipeline config's `model.base_model`; Stage 2: Stage 1's merged model
    /// in checkpoints/stage1_warmup/merged).
    #[arg(long)]
    pub model: Option<String>,
    /// With a hub id: the branch, tag or commit to load (default: the
    /// pipeline config's `model.revision` for its model, else `main`);
    /// the commit it resolves to is recorded with the outputs.
    #[arg(long)]
    pub revision: Option<String>,
    /// Training records (JSONL from `generate`; default: the stage's file in
    /// datasets/trace_training/).
    #[arg(long)]
    pub train_file: Option<PathBuf>,
    /// Records for the eval loss (default: the stage's test file).
    #[arg(long)]
    pub eval_file: Option<PathBuf>,
    /// Where checkpoints, `final/` and `merged/` go (default:
    /// checkpoints/stage1_warmup or checkpoints/stage2_sft).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Passes over the training set.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Sequences a micro-batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Micro-batches an optimizer step.
    #[arg(long)]
    pub gradient_accumulation_steps: Option<usize>,
    /// Positions a forward/backward pass holds: a step's records are
    /// regrouped, longest first, into passes of at most this many (rows x
    /// row length). 0 (the default): micro-batches of `batch_size` rows.
    #[arg(long)]
    pub micro_batch_tokens: Option<usize>,
    /// Pack each pass's examples into one row (`packing`): true or false;
    /// default on a GPU.
    #[arg(long)]
    pub packing: Option<bool>,
    /// Peak learning rate (cosine schedule with warmup).
    #[arg(long)]
    pub learning_rate: Option<f64>,
    /// LoRA rank.
    #[arg(long)]
    pub lora_r: Option<usize>,
    /// Longest example in tokens; longer ones are dropped and counted.
    #[arg(long)]
    pub max_length: Option<usize>,
    /// Write a checkpoint every N optimizer steps.
    #[arg(long)]
    pub save_steps: Option<usize>,
    /// Seed of the data order, LoRA init and dropout.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Choose `final/` by `heldout_exact_match`, `eval_loss` or `last`
    /// (the config's `select.metric`; any --select_* flag turns selection
    /// on with the other keys' defaults).
    #[arg(long)]
    pub select_metric: Option<String>,
    /// Score the adapter every N optimizer steps (`select.every_steps`).
    #[arg(long)]
    pub select_every_steps: Option<usize>,
    /// The items exact match is scored on: `heldout_short`,
    /// `original_test`, `transformed_test` or a `.jsonl` file
    /// (`select.set`).
    #[arg(long)]
    pub select_set: Option<String>,
    /// Items scored (`select.limit`).
    #[arg(long)]
    pub select_limit: Option<usize>,
    /// Longest scored answer in tokens (`select.max_new_tokens`).
    #[arg(long)]
    pub select_max_new_tokens: Option<usize>,
    /// Prompts decoded together when scoring (`select.batch_size`).
    #[arg(long)]
    pub select_batch_size: Option<usize>,
    /// Override one setting of the stage's config by its key, as if the
    /// file said it: `--set lora_dropout=0.1 --set select.metric=last`
    /// (presets and the other flags still go over it).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    #[command(flatten)]
    pub run: super::RunFlags,
    /// With select.set `heldout_short`: run its programs WITHOUT isolation
    /// (only on machines you trust).
    #[arg(long = "unsafe-no-sandbox")]
    pub unsafe_no_sandbox: bool,
    /// A stage the pipeline resolved ([`Resolved`]): its ranks on several
    /// GPUs read their settings from this file instead of the flags.
    #[arg(long, hide = true)]
    pub resolved: Option<PathBuf>,
}

/// The stage's defaults: (config file, training file, eval file, output).
fn defaults(stage: &str) -> (&'static str, &'static str, &'static str, &'static str) {
    match stage {
        "warmup" => (
            "config/warmup.json",
            "datasets/trace_training/stage1_original_train.jsonl",
            "datasets/trace_training/stage1_original_test.jsonl",
            "checkpoints/stage1_warmup",
        ),
        _ => (
            "config/sft.json",
            "datasets/trace_training/stage2_transformed_train.jsonl",
            "datasets/trace_training/stage2_transformed_test.jsonl",
            "checkpoints/stage2_sft",
        ),
    }
}

/// A stage's settings before anything is opened: the stage config with its
/// files filled in, the pipeline config's model and hardware sections, the
/// base model as named, and where each value came from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub config: SftConfig,
    pub model: ModelConfig,
    pub hardware: HardwareConfig,
    /// The base model as given (a folder or a hub id).
    pub base_model: String,
    pub revision: Option<String>,
    #[serde(skip)]
    pub sources: Sources,
}

impl Settings {
    /// The settings as JSON, each with its value and source.
    pub fn resolved(&self) -> anyhow::Result<serde_json::Value> {
        let mut v = serde_json::to_value(&self.config)?;
        v["model"] = serde_json::to_value(&self.model)?;
        v["hardware"] = serde_json::to_value(&self.hardware)?;
        v["base_model"] = self.base_model.clone().into();
        v["revision"] = self.revision.clone().into();
        Ok(self.sources.to_json(&v))
    }
}

/// File values, then flags; nothing is opened. Every flag is handled here.
pub fn settings(stage: &str, args: &TrainArgs) -> anyhow::Result<Settings> {
    let (cfg_file, train_default, eval_default, out_default) = defaults(stage);
    let (mut cfg, mut sources): (SftConfig, Sources) = match &args.config {
        Some(p) => config::load_with_sources(p, "")?,
        None if Path::new(cfg_file).is_file() => {
            config::load_with_sources(Path::new(cfg_file), "")?
        }
        None => Default::default(),
    };
    let pipeline_file = args
        .pipeline_config
        .clone()
        .or_else(|| Some(PathBuf::from("config/pipeline_config.json")).filter(|p| p.is_file()));
    let (mut pipeline, mut pipeline_sources): (PipelineConfig, Sources) = match &pipeline_file {
        Some(p) => config::load_with_sources(p, "")?,
        None => Default::default(),
    };
    config::apply_sets(&mut cfg, &mut sources, &args.set)?;
    if pipeline.hardware.b200_mode {
        // The one-large-GPU preset of the pipeline applies to its stages
        // run alone too; flags still win.
        pipeline.apply_b200(&mut pipeline_sources, "hardware.b200_mode");
        let s = if stage == "warmup" {
            &pipeline.stage1
        } else {
            &pipeline.stage2
        };
        cfg.batch_size = s.batch_size;
        cfg.gradient_accumulation_steps = s.gradient_accumulation_steps;
        for k in ["batch_size", "gradient_accumulation_steps"] {
            sources.set(
                k,
                Source::Preset {
                    by: "hardware.b200_mode".into(),
                },
            );
        }
    }
    // The pipeline file's model and hardware keys keep their sources.
    let model_hardware =
        serde_json::json!({"model": &pipeline.model, "hardware": &pipeline.hardware});
    for (k, _, src) in pipeline_sources.table(&model_hardware) {
        if src != Source::Default {
            sources.set(&k, src);
        }
    }
    let (mut model, mut hardware) = (pipeline.model, pipeline.hardware);
    let TrainArgs {
        config: _,
        pipeline_config: _,
        model: model_flag,
        revision,
        train_file,
        eval_file,
        output_dir,
        epochs,
        batch_size,
        gradient_accumulation_steps,
        micro_batch_tokens,
        packing,
        learning_rate,
        lora_r,
        max_length,
        save_steps,
        seed,
        run,
        select_metric,
        select_every_steps,
        select_set,
        select_limit,
        select_max_new_tokens,
        select_batch_size,
        unsafe_no_sandbox: _,
        resolved: _,
        set: _,
    } = args.clone();
    if let Some((precision, flag)) = run.base_precision()? {
        model.base_precision = precision;
        sources.flag("model.base_precision", flag);
    }
    let super::RunFlags {
        device,
        gradient_checkpointing,
        ..
    } = run;
    macro_rules! set {
        ($flag:ident, $field:expr, $key:expr) => {
            if let Some(v) = $flag {
                $field = v;
                sources.flag($key, concat!("--", stringify!($flag)));
            }
        };
    }
    set!(epochs, cfg.epochs, "epochs");
    set!(batch_size, cfg.batch_size, "batch_size");
    set!(
        gradient_accumulation_steps,
        cfg.gradient_accumulation_steps,
        "gradient_accumulation_steps"
    );
    if let Some(v) = micro_batch_tokens {
        cfg.micro_batch_tokens = Some(v);
        sources.flag("micro_batch_tokens", "--micro_batch_tokens");
    }
    if let Some(v) = packing {
        cfg.packing = Some(v);
        sources.flag("packing", "--packing");
    }
    set!(learning_rate, cfg.optim.learning_rate, "learning_rate");
    set!(lora_r, cfg.lora.r, "lora_r");
    set!(save_steps, cfg.save.save_steps, "save_steps");
    set!(seed, cfg.seed, "seed");
    set!(max_length, model.max_length, "model.max_length");
    set!(device, hardware.device, "hardware.device");
    set!(
        gradient_checkpointing,
        hardware.gradient_checkpointing,
        "hardware.gradient_checkpointing"
    );
    macro_rules! select {
        ($flag:ident, $field:ident, $value:expr) => {
            if let Some(v) = $flag {
                cfg.select.get_or_insert_with(Default::default).$field = $value(v);
                sources.flag(
                    concat!("select.", stringify!($field)),
                    concat!("--", stringify!($flag)),
                );
            }
        };
    }
    select!(select_metric, metric, |v| v);
    select!(select_every_steps, every_steps, |v| v);
    select!(select_set, set, |v| v);
    select!(select_limit, limit, Some);
    select!(select_max_new_tokens, max_new_tokens, |v| v);
    select!(select_batch_size, batch_size, |v| v);
    let train_file = train_file.map(Some);
    let eval_file = eval_file.map(Some);
    let output_dir = output_dir.map(Some);
    set!(train_file, cfg.train_file, "train_file");
    set!(eval_file, cfg.eval_file, "eval_file");
    set!(output_dir, cfg.save.output_dir, "output_dir");
    cfg.train_file.get_or_insert_with(|| train_default.into());
    cfg.eval_file.get_or_insert_with(|| eval_default.into());
    cfg.save
        .output_dir
        .get_or_insert_with(|| out_default.into());
    let problems = config::Validate::problems(&cfg);
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}",
        problems.join("\n  - ")
    );
    let base_model = match (model_flag, stage) {
        (Some(m), _) => {
            sources.flag("base_model", "--model");
            m
        }
        (None, "warmup") => {
            sources.set("base_model", sources.get("model.name"));
            model.name.clone()
        }
        (None, _) => {
            sources.set(
                "base_model",
                Source::Preset {
                    by: "Stage 2 starts from Stage 1's merged model".into(),
                },
            );
            "checkpoints/stage1_warmup/merged".into()
        }
    };
    // The pipeline file's `model.revision` names the revision of its
    // `model.name`; a model given by flag has only the flag's.
    let revision = match (revision, &base_model) {
        (Some(r), _) => {
            sources.flag("revision", "--revision");
            Some(r)
        }
        (None, m) if *m == model.name => {
            sources.set("revision", sources.get("model.revision"));
            model.revision.clone()
        }
        (None, _) => None,
    };
    Ok(Settings {
        config: cfg,
        model,
        hardware,
        base_model,
        revision,
        sources,
    })
}

/// A stage resolved, as the pipeline hands it over: its settings and the
/// run's flags. The ranks of a stage on several GPUs read it from a file
/// (`--resolved`), so they run with exactly the settings the pipeline
/// resolved.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Resolved {
    pub settings: Settings,
    pub run: super::RunFlags,
    pub unsafe_no_sandbox: bool,
}

/// The settings (from `--resolved`, or from files and flags), then the
/// base model found and the device opened.
pub fn resolve(stage: &str, args: &TrainArgs) -> anyhow::Result<SftJob> {
    match &args.resolved {
        Some(file) => {
            let mut r: Resolved = super::launch::read_resolved(file)?;
            // A rank's own GPU.
            if let Some(d) = &args.run.device {
                r.settings.hardware.device = d.clone();
            }
            job(stage, r.settings, &r.run, r.unsafe_no_sandbox)
        }
        None => job(
            stage,
            settings(stage, args)?,
            &args.run,
            args.unsafe_no_sandbox,
        ),
    }
}

/// The job of resolved settings: the base model found, the device opened,
/// the selection's items made.
pub fn job(
    stage: &str,
    s: Settings,
    run: &super::RunFlags,
    unsafe_no_sandbox: bool,
) -> anyhow::Result<SftJob> {
    let base = trace_train::model::io::resolve::resolve_revision(&s.base_model, s.revision.as_deref())
        .with_context(|| {
            if stage == "sft" {
                format!("no base model for Stage 2 at `{}`\nhint: run `trace-train warmup` first, or pass --model", s.base_model)
            } else {
                format!("base model `{}` not found", s.base_model)
            }
        })?;
    let device = super::pick_device(&s.hardware.device)?;
    // On (the default) means "on a GPU"; an explicit flag applies anywhere.
    let gradient_checkpointing = run
        .gradient_checkpointing
        .unwrap_or(s.hardware.gradient_checkpointing && !device.is_cpu());
    let select_items = select_items(&s.config, &s.hardware.device, unsafe_no_sandbox)?;
    Ok(SftJob {
        stage: stage.into(),
        train_file: s.config.train_file.clone().expect("settings fill it"),
        eval_file: s.config.eval_file.clone(),
        output_dir: s.config.save.output_dir.clone().expect("settings fill it"),
        config: s.config,
        model: s.model,
        base: base.clone(),
        base_dir: base.dir,
        device,
        resume: run.resume,
        force: run.force,
        max_steps: run.max_steps,
        gradient_checkpointing,
        select_items,
    })
}

/// The items `select` scores exact match on, made as `eval` and the
/// pipeline's gate make them ([`super::eval::eval_items`]): the held-out
/// short set, a test file beside the training file, or the named file.
/// None without selection or with `eval_loss`.
fn select_items(
    cfg: &SftConfig,
    device: &str,
    unsafe_no_sandbox: bool,
) -> anyhow::Result<Vec<trace_train::eval::EvalItem>> {
    let Some(sc) = &cfg.select else {
        return Ok(Vec::new());
    };
    if sc.metric == "eval_loss" {
        return Ok(Vec::new());
    }
    let beside_train = |name: &str| {
        cfg.train_file
            .as_deref()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."))
            .join(name)
    };
    let (heldout, data) = match sc.set.as_str() {
        "heldout_short" => (Some("short".to_owned()), None),
        "original_test" => (None, Some(beside_train("stage1_original_test.jsonl"))),
        "transformed_test" => (None, Some(beside_train("stage2_transformed_test.jsonl"))),
        file => (None, Some(PathBuf::from(file))),
    };
    let args = super::eval::EvalArgs {
        model: None,
        adapter: None,
        compare: None,
        heldout,
        prompt: "original".into(),
        variants: 1,
        data,
        output: None,
        limit: sc.limit,
        max_new_tokens: sc.max_new_tokens,
        batch_size: sc.batch_size,
        max_turns: 1,
        feedback: None,
        max_steps_per_episode: trace_train::config::RlConfig::default().max_steps_per_episode,
        device: Some(device.to_owned()),
        // Only the items are made here; the recipe scores its own model.
        base_precision: trace_train::model::BasePrecision::Bf16,
        revision: None,
        unsafe_no_sandbox,
        envs: Default::default(),
    };
    super::eval::eval_items(&args)
        .with_context(|| format!("select.set: cannot read the set `{}`", sc.set))
}

/// The `hardware` section of the pipeline config the stage reads.
fn hardware(args: &TrainArgs) -> anyhow::Result<HardwareConfig> {
    Ok(match &args.pipeline_config {
        Some(p) => config::load::<PipelineConfig>(p)?.hardware,
        None if Path::new("config/pipeline_config.json").is_file() => {
            config::load::<PipelineConfig>(Path::new("config/pipeline_config.json"))?.hardware
        }
        None => HardwareConfig::default(),
    })
}

/// `warmup` or `sft` from the command line: on one device, or on several
/// GPUs (this process starts one child a GPU, each child runs one rank).
pub fn run_command(stage: &str, args: &TrainArgs) -> anyhow::Result<()> {
    let requested = match &args.resolved {
        Some(_) => args.run.num_gpus,
        None => args.run.num_gpus.or(hardware(args)?.num_gpus),
    };
    super::launch::dispatch(
        requested,
        args.run.device.as_deref().unwrap_or("auto"),
        || run_stage(stage, args).map(|_| ()),
        |child, progress| {
            let mut args = args.clone();
            args.run.device = Some(child.device());
            let job = resolve(stage, &args)?;
            let comm = child.communicator(&job.device)?;
            run_job(stage, &job, &*comm, progress).map(|_| ())
        },
    )
}

/// One stage on one device.
pub fn run_stage(stage: &str, args: &TrainArgs) -> anyhow::Result<SftSummary> {
    run_resolved(stage, resolve(stage, args)?)
}

/// A resolved job on one device.
pub fn run_resolved(stage: &str, job: SftJob) -> anyhow::Result<SftSummary> {
    run_job(stage, &job, &Single, &super::progress::Bar::new("step"))
}

/// Runs `job` as `comm`'s rank and, on rank 0, reports it.
fn run_job(
    stage: &str,
    job: &SftJob,
    comm: &dyn Communicator,
    progress: &dyn Progress,
) -> anyhow::Result<SftSummary> {
    let s = sft::run_with(job, comm, progress).map_err(|e| {
        super::out_of_memory_hint(
            e,
            "lower batch_size (raise gradient_accumulation_steps to keep the effective batch) or max_length; checkpoints written so far are intact, continue with --resume",
        )
    })?;
    if comm.rank() != 0 {
        return Ok(s);
    }
    eprintln!(
        "{stage}: {} steps{}, loss {} -> {}, eval loss {}, {:.0} tokens/s{}; {} examples ({} records, {} longer than max_length dropped)",
        s.steps,
        s.resumed_from
            .map(|r| format!(" (resumed at {r})"))
            .unwrap_or_default(),
        fmt_opt(s.first_loss),
        fmt_opt(s.last_loss),
        fmt_opt(s.eval_loss),
        s.tokens_per_s,
        if comm.world() > 1 {
            format!(" on {} GPUs", comm.world())
        } else {
            String::new()
        },
        s.examples.examples,
        s.examples.records,
        s.examples.dropped_too_long,
    );
    super::report_ending(
        stage,
        s.interrupted,
        s.stop_requested,
        &s.final_dir,
        &s.merged_dir,
    );
    Ok(s)
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.4}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolved_stage_survives_its_file() {
        let mut s = settings("warmup", &TrainArgs::default()).unwrap();
        s.config.optim.learning_rate = 1.0e-4 / 3.0;
        s.config.select = Some(Default::default());
        let r = Resolved {
            settings: s,
            run: super::super::RunFlags {
                device: Some("cpu".into()),
                resume: true,
                max_steps: Some(7),
                gradient_checkpointing: Some(false),
                ..Default::default()
            },
            unsafe_no_sandbox: true,
        };
        let back: Resolved = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&r).unwrap()
        );
        assert_eq!(
            back.settings.config.optim.learning_rate,
            r.settings.config.optim.learning_rate
        );
    }
}
