//! `warmup` (Stage 1) and `sft` (Stage 2): settings from the stage's config
//! file, the pipeline config's model section and flags, then the SFT recipe.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::launch::Role;

use trace_train::config::{self, HardwareConfig, ModelConfig, PipelineConfig, SftConfig};
use trace_train::dist::{Communicator, Single};
use trace_train::train::sft::{self, SftJob, SftSummary};

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
    /// Base model: a local HF folder or a hub id (Stage 2 default: Stage 1's
    /// merged model).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub train_file: Option<PathBuf>,
    #[arg(long)]
    pub eval_file: Option<PathBuf>,
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    #[arg(long)]
    pub epochs: Option<usize>,
    #[arg(long)]
    pub batch_size: Option<usize>,
    #[arg(long)]
    pub gradient_accumulation_steps: Option<usize>,
    #[arg(long)]
    pub learning_rate: Option<f64>,
    #[arg(long)]
    pub lora_r: Option<usize>,
    #[arg(long)]
    pub max_length: Option<usize>,
    #[arg(long)]
    pub save_steps: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop after this many optimizer steps.
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// `cpu`, `cuda`, `cuda:N` or `auto`.
    #[arg(long)]
    pub device: Option<String>,
    /// Continue from the newest valid checkpoint in the output folder.
    #[arg(long)]
    pub resume: bool,
    /// Resume even though config, data or tokenizer changed.
    #[arg(long)]
    pub force: bool,
    /// Recompute each layer in the backward pass to save memory (default:
    /// the pipeline config's `hardware.gradient_checkpointing`, applied on
    /// a GPU; `true` forces it on the CPU too).
    #[arg(long)]
    pub gradient_checkpointing: Option<bool>,
    /// Keep the frozen base weights in 16 bits (default on a GPU: 4-bit NF4
    /// as the pipeline config's `model.load_in_4bit` says, i.e. QLoRA).
    #[arg(long)]
    pub no_4bit: bool,
    /// GPUs to train on, one process each, data parallel over NCCL
    /// (default: the pipeline config's `hardware.num_gpus`, else every
    /// visible GPU when the device is CUDA, 1 on the CPU). The global batch
    /// (batch_size x gradient_accumulation_steps) is the same for any
    /// number: the ranks share each step's micro-batches.
    #[arg(long)]
    pub num_gpus: Option<usize>,
}

impl TrainArgs {
    /// Flags that parse back into these arguments: the command line of the
    /// ranks the pipeline starts for a stage.
    pub fn to_argv(&self) -> Vec<std::ffi::OsString> {
        let TrainArgs {
            config,
            pipeline_config,
            model,
            train_file,
            eval_file,
            output_dir,
            epochs,
            batch_size,
            gradient_accumulation_steps,
            learning_rate,
            lora_r,
            max_length,
            save_steps,
            seed,
            max_steps,
            device,
            resume,
            force,
            gradient_checkpointing,
            no_4bit,
            num_gpus,
        } = self;
        let mut out: Vec<std::ffi::OsString> = Vec::new();
        let mut opt = |name: &str, v: Option<std::ffi::OsString>| {
            if let Some(v) = v {
                out.push(format!("--{name}").into());
                out.push(v);
            }
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.as_os_str().to_owned());
        let text = |v: Option<String>| v.map(Into::into);
        opt("config", path(config));
        opt("pipeline_config", path(pipeline_config));
        opt("model", text(model.clone()));
        opt("train_file", path(train_file));
        opt("eval_file", path(eval_file));
        opt("output_dir", path(output_dir));
        opt("epochs", text(epochs.map(|v| v.to_string())));
        opt("batch_size", text(batch_size.map(|v| v.to_string())));
        opt(
            "gradient_accumulation_steps",
            text(gradient_accumulation_steps.map(|v| v.to_string())),
        );
        // `{:?}` of an f64 parses back to the same value.
        opt(
            "learning_rate",
            text(learning_rate.map(|v| format!("{v:?}"))),
        );
        opt("lora_r", text(lora_r.map(|v| v.to_string())));
        opt("max_length", text(max_length.map(|v| v.to_string())));
        opt("save_steps", text(save_steps.map(|v| v.to_string())));
        opt("seed", text(seed.map(|v| v.to_string())));
        opt("max_steps", text(max_steps.map(|v| v.to_string())));
        opt("device", text(device.clone()));
        opt(
            "gradient_checkpointing",
            text(gradient_checkpointing.map(|v| v.to_string())),
        );
        opt("num_gpus", text(num_gpus.map(|v| v.to_string())));
        for (flag, on) in [
            ("--resume", resume),
            ("--force", force),
            ("--no_4bit", no_4bit),
        ] {
            if *on {
                out.push(flag.into());
            }
        }
        out
    }
}

/// The stage's defaults: (config file, training file, eval file, output).
fn defaults(stage: &str) -> (&'static str, &'static str, &'static str, &'static str) {
    match stage {
        "warmup" => (
            "config/warmup.json",
            "datasets/trace_training/stage1_original_train.jsonl",
            "datasets/trace_training/stage1_original_test.jsonl",
            "checkpoints/warmup",
        ),
        _ => (
            "config/sft.json",
            "datasets/trace_training/stage2_transformed_train.jsonl",
            "datasets/trace_training/stage2_transformed_test.jsonl",
            "checkpoints/sft",
        ),
    }
}

/// File values, then flags. Every flag is handled here.
pub fn resolve(stage: &str, args: &TrainArgs) -> anyhow::Result<SftJob> {
    let (cfg_file, train_default, eval_default, out_default) = defaults(stage);
    let mut cfg: SftConfig = match &args.config {
        Some(p) => config::load(p)?,
        None if Path::new(cfg_file).is_file() => config::load(Path::new(cfg_file))?,
        None => SftConfig::default(),
    };
    let (mut model, hardware): (ModelConfig, HardwareConfig) = match &args.pipeline_config {
        Some(p) => {
            let c = config::load::<PipelineConfig>(p)?;
            (c.model, c.hardware)
        }
        None if Path::new("config/pipeline_config.json").is_file() => {
            let c = config::load::<PipelineConfig>(Path::new("config/pipeline_config.json"))?;
            (c.model, c.hardware)
        }
        None => Default::default(),
    };
    let TrainArgs {
        config: _,
        pipeline_config: _,
        model: model_flag,
        train_file,
        eval_file,
        output_dir,
        epochs,
        batch_size,
        gradient_accumulation_steps,
        learning_rate,
        lora_r,
        max_length,
        save_steps,
        seed,
        max_steps,
        device,
        resume,
        force,
        gradient_checkpointing,
        no_4bit,
        num_gpus: _,
    } = args.clone();
    if no_4bit {
        model.load_in_4bit = false;
    }
    macro_rules! set {
        ($flag:expr, $field:expr) => {
            if let Some(v) = $flag {
                $field = v;
            }
        };
    }
    set!(epochs, cfg.epochs);
    set!(batch_size, cfg.batch_size);
    set!(gradient_accumulation_steps, cfg.gradient_accumulation_steps);
    set!(learning_rate, cfg.learning_rate);
    set!(lora_r, cfg.lora_r);
    set!(save_steps, cfg.save_steps);
    set!(seed, cfg.seed);
    set!(max_length, model.max_length);
    if let Some(p) = train_file {
        cfg.train_file = Some(p);
    }
    if let Some(p) = eval_file {
        cfg.eval_file = Some(p);
    }
    if let Some(p) = output_dir {
        cfg.output_dir = Some(p);
    }
    let problems = config::Validate::problems(&cfg);
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}",
        problems.join("\n  - ")
    );

    let base_spec = match (model_flag, stage) {
        (Some(m), _) => m,
        (None, "warmup") => model.name.clone(),
        (None, _) => "checkpoints/warmup/merged".into(),
    };
    let base_dir = trace_train::model::resolve::resolve(&base_spec).with_context(|| {
        if stage == "sft" {
            format!("no base model for Stage 2 at `{base_spec}`\nhint: run `trace-train warmup` first, or pass --model")
        } else {
            format!("base model `{base_spec}` not found")
        }
    })?;
    let device = pick_device(device.as_deref().unwrap_or("auto"))?;
    let gradient_checkpointing =
        gradient_checkpointing.unwrap_or(hardware.gradient_checkpointing && !device.is_cpu());
    Ok(SftJob {
        stage: stage.into(),
        train_file: cfg
            .train_file
            .clone()
            .unwrap_or_else(|| train_default.into()),
        eval_file: Some(cfg.eval_file.clone().unwrap_or_else(|| eval_default.into())),
        output_dir: cfg.output_dir.clone().unwrap_or_else(|| out_default.into()),
        config: cfg,
        model,
        base_dir,
        device,
        resume,
        force,
        max_steps,
        gradient_checkpointing,
    })
}

pub fn pick_device(name: &str) -> anyhow::Result<candle_core::Device> {
    trace_train::config::DeviceSpec::parse(name)
        .with_context(|| format!("device `{name}` is not cpu, cuda, cuda:N or auto"))?
        .open()
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
    let requested = args.num_gpus.or(hardware(args)?.num_gpus);
    match super::launch::role(requested, args.device.as_deref().unwrap_or("auto"))? {
        Role::Alone => run_stage(stage, args).map(|_| ()),
        Role::Parent { world } => super::launch::run_children(world),
        Role::Child(child) => {
            let args = TrainArgs {
                device: Some(child.device()),
                ..args.clone()
            };
            let job = resolve(stage, &args)?;
            let comm = child.communicator(&job.device)?;
            if child.rank == 0 {
                run_job(stage, &job, &*comm, &Bar::new()).map(|_| ())
            } else {
                run_job(stage, &job, &*comm, &sft::NoProgress).map(|_| ())
            }
        }
    }
}

/// One stage on one device.
pub fn run_stage(stage: &str, args: &TrainArgs) -> anyhow::Result<SftSummary> {
    let job = resolve(stage, args)?;
    run_job(stage, &job, &Single, &Bar::new())
}

/// Runs `job` as `comm`'s rank and, on rank 0, reports it.
fn run_job(
    stage: &str,
    job: &SftJob,
    comm: &dyn Communicator,
    progress: &dyn sft::Progress,
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
    if s.interrupted {
        eprintln!("{stage}: stopped by a signal after saving a checkpoint; continue with --resume");
    } else {
        eprintln!(
            "adapter: {}\nmerged model: {}",
            s.final_dir.display(),
            s.merged_dir.display()
        );
    }
    Ok(s)
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.4}"))
}

struct Bar(ProgressBar);

impl Bar {
    fn new() -> Self {
        let pb = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            ProgressBar::new(0)
        } else {
            ProgressBar::hidden()
        };
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} step {pos}/{len} [{elapsed_precise}] {bar:30} ETA {eta} {msg}",
            )
            .expect("valid template"),
        );
        Bar(pb)
    }
}

impl sft::Progress for Bar {
    fn start(&self, total: u64, done: u64) {
        self.0.set_length(total);
        self.0.set_position(done);
    }
    fn step(&self, step: u64, loss: f64, tokens_per_s: f64) {
        self.0.set_position(step);
        self.0
            .set_message(format!("loss {loss:.4} {tokens_per_s:.0} tok/s"));
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: TrainArgs,
    }

    #[test]
    fn arguments_survive_the_command_line() {
        let args = TrainArgs {
            config: Some("c .json".into()),
            model: Some("base".into()),
            output_dir: Some("out dir".into()),
            batch_size: Some(4),
            learning_rate: Some(1.0e-4 / 3.0),
            max_steps: Some(7),
            device: Some("cuda".into()),
            resume: true,
            gradient_checkpointing: Some(false),
            no_4bit: true,
            num_gpus: Some(2),
            ..TrainArgs::default()
        };
        let mut argv = vec![std::ffi::OsString::from("trace-train")];
        argv.extend(args.to_argv());
        let back = Wrap::try_parse_from(argv).unwrap().args;
        assert_eq!(format!("{back:?}"), format!("{args:?}"));
        let none = Wrap::try_parse_from(["trace-train"]).unwrap().args;
        assert!(none.to_argv().is_empty());
    }
}
