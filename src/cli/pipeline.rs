//! `pipeline`: Stage 0 (generate), 1 (warmup), 2 (sft), 3 (ppo) and eval
//! (the Stage 2 test set, then the held-out short set) in order,
//! from `config/pipeline_config.json`, each stage's output the next one's
//! input. The pipeline records the stages it finished in
//! `<checkpoints>/pipeline_state.json`; `--resume` skips those and resumes
//! the interrupted one from its checkpoint. After each training stage the
//! gate (`cli::gate`, the `gate` section) compares the stage's model with
//! the one it started from on held-out sets: `<checkpoints>/gate.json`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use trace_train::config::{self, PipelineConfig, Source, Sources};
use trace_train::generate::{self, RunOptions};
use trace_train::model::BasePrecision;

use super::RunFlags;
use super::eval::{EvalArgs, run_eval};
use super::gate::{Gate, Gated};
use super::launch::{Role, role, run_resolved_children};
use super::ppo::PpoArgs;
use super::progress::clock;
use super::train::{self, Resolved, Settings};

#[derive(Args)]
#[command(rename_all = "snake_case")]
pub struct PipelineArgs {
    /// The pipeline config (the Python pipeline's file loads as it is).
    #[arg(long, default_value = "config/pipeline_config.json")]
    pub config: PathBuf,
    /// First stage to run (0 generate, 1 warmup, 2 sft, 3 ppo, 4 eval).
    #[arg(long, default_value_t = 0)]
    pub start_stage: u8,
    /// Last stage to run (default 4: through eval).
    #[arg(long, default_value_t = 4)]
    pub last_stage: u8,
    /// Stop each training stage (warmup, sft, ppo) after this many
    /// optimizer steps, whatever its epochs or `num_train_steps` say: for
    /// measuring a few steps of every stage at the real settings
    /// (`scripts/user-scale-check.sh`).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Minutes on a laptop CPU: the built-in corpus, a tiny model the
    /// pipeline makes itself, a few steps a stage.
    #[arg(long)]
    pub quick_test: bool,
    /// Preset for one large GPU (B200, H200, H100 80 GB): bf16 base weights
    /// (no 4-bit), no gradient checkpointing, micro-batches of 8 with 4
    /// accumulation steps, Stage 3's training micro-batches of 12288 tokens
    /// (as `hardware.b200_mode: true`).
    #[arg(long)]
    pub b200: bool,
    /// How the frozen base weights are held in every training stage:
    /// `bf16`, `nf4` (QLoRA) or `fp8` (as `model.base_precision`, over the
    /// file and the `--b200` preset).
    #[arg(long, value_name = "bf16|nf4|fp8", value_parser = super::parse_base_precision)]
    pub base_precision: Option<BasePrecision>,
    /// The same as `--base_precision bf16`: keep the base weights in 16
    /// bits instead of 4.
    #[arg(long)]
    pub no_4bit: bool,
    /// Continue an interrupted pipeline: skip finished stages, resume the
    /// interrupted one from its checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Where stage outputs go (default `checkpoints`, `checkpoints/quick` for
    /// the quick test).
    #[arg(long)]
    pub checkpoints: Option<PathBuf>,
    /// With a hub id as the base model: the branch, tag or commit (default:
    /// `model.revision`, else `main`); the commit is recorded.
    #[arg(long)]
    pub revision: Option<String>,
    /// `cpu`, `cuda`, `cuda:N` or `auto` (default: `hardware.device`).
    #[arg(long)]
    pub device: Option<String>,
    /// Override one setting of the config file by its dotted key, as if
    /// the file said it: `--set stage1.learning_rate=1e-4 --set
    /// stage3.ppo.algorithm=grpo` (presets and the other flags still go
    /// over it).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    #[command(flatten)]
    pub unsafe_flag: crate::UnsafeFlag,
}

/// `pipeline_state.json`: the stages a run finished, and for each what it
/// ran with and what it left, which `--resume` checks before it skips one.
#[derive(Debug, Default, Serialize, Deserialize)]
struct PipelineState {
    finished: Vec<u8>,
    /// A finished stage's record (absent in files of earlier versions).
    #[serde(default)]
    stages: std::collections::BTreeMap<u8, StageRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct StageRecord {
    /// The hash of the stage's settings and of every earlier stage's.
    settings: String,
    /// What it wrote that later stages read.
    outputs: Vec<PathBuf>,
}

impl PipelineState {
    /// Drops from `finished` the first stage whose settings changed since
    /// it finished or whose outputs are gone, and every stage after it
    /// (they were made from it); says why. A stage an earlier version
    /// recorded without settings is checked for its outputs alone.
    fn recheck(&mut self, expected: &dyn Fn(u8) -> StageRecord, names: [&str; 5]) -> Vec<String> {
        let mut said = Vec::new();
        let mut finished = self.finished.clone();
        finished.sort_unstable();
        let stale = finished.iter().copied().find_map(|stage| {
            let now = expected(stage);
            let outputs = match self.stages.get(&stage) {
                Some(r) if r.settings != now.settings => {
                    return Some((stage, "its settings changed since it finished".to_owned()));
                }
                Some(r) => &r.outputs,
                None => &now.outputs,
            };
            let gone = outputs.iter().find(|p| !p.exists())?;
            Some((stage, format!("its output `{}` is gone", gone.display())))
        });
        if let Some((from, why)) = stale {
            said.push(format!(
                "stage {from} ({}) runs again: {why}",
                names[from as usize]
            ));
            let later: Vec<u8> = self
                .finished
                .iter()
                .copied()
                .filter(|&s| s > from)
                .collect();
            if !later.is_empty() {
                said.push(format!("so do the finished stages after it: {later:?}"));
            }
            self.finished.retain(|&s| s < from);
            self.stages.retain(|&s, _| s < from);
        }
        said
    }
}

/// The folders of the stages under the checkpoints root: the Python
/// pipeline's layout (messages name the stages short: warmup, sft).
pub const STAGE1_DIR: &str = "stage1_warmup";
pub const STAGE2_DIR: &str = "stage2_sft";
pub const STAGE3_DIR: &str = "stage3_ppo";
/// Stage 3's folder when it is DPO: `round_N/` a round inside.
pub const STAGE3_DPO_DIR: &str = "stage3_dpo";

/// What a pipeline run will do: the settings from the config file and the
/// flags, with where each came from, and the folders.
pub struct Plan {
    pub cfg: PipelineConfig,
    pub sources: Sources,
    /// Where stage outputs go.
    pub root: PathBuf,
    /// Stage 0's output, the training stages' input.
    pub data_dir: PathBuf,
    max_steps: Option<u64>,
    eval_limit: Option<usize>,
    max_new_tokens: usize,
}

impl Plan {
    /// The settings as JSON, each with its value and source.
    pub fn resolved(&self) -> anyhow::Result<serde_json::Value> {
        Ok(self.sources.to_json(&serde_json::to_value(&self.cfg)?))
    }

    /// A hash of what `stage` trains or writes from: its own settings and,
    /// through the chain, every earlier stage's (the hardware section is
    /// left out: a run may move to another device and still resume).
    fn stage_settings(&self, stage: u8) -> String {
        use sha2::Digest;
        let c = &self.cfg;
        let before = match stage {
            0 => String::new(),
            s => self.stage_settings(s - 1),
        };
        let own = match stage {
            0 => serde_json::json!({ "stage0": c.stage0 }),
            // The model section as earlier versions recorded it, so that
            // their pipelines resume without running every stage again.
            1 => {
                serde_json::json!({ "model": c.model.as_recorded(), "stage1": c.stage1, "max_steps": self.max_steps })
            }
            2 => serde_json::json!({ "stage2": c.stage2, "max_steps": self.max_steps }),
            3 => serde_json::json!({ "stage3": c.stage3, "max_steps": self.max_steps }),
            _ => serde_json::json!({
                "gate": c.gate, "eval_limit": self.eval_limit, "max_new_tokens": self.max_new_tokens
            }),
        };
        let mut h = sha2::Sha256::new();
        h.update(before.as_bytes());
        h.update(own.to_string().as_bytes());
        trace_train::hex(&h.finalize())
    }

    /// What `stage` leaves that later stages read.
    fn stage_outputs(&self, stage: u8) -> Vec<PathBuf> {
        match stage {
            0 => [
                "stage1_original_train.jsonl",
                "stage2_transformed_train.jsonl",
            ]
            .map(|f| self.data_dir.join(f))
            .to_vec(),
            1 => vec![self.root.join(STAGE1_DIR).join("merged")],
            2 => vec![self.root.join(STAGE2_DIR).join("merged")],
            // Every round writes its pairs, also one that has none to train.
            3 if self.cfg.stage3.is_dpo() => vec![
                self.root
                    .join(STAGE3_DPO_DIR)
                    .join(format!("round_{}", self.cfg.stage3.dpo.rounds.max(1) - 1))
                    .join("pairs.jsonl"),
            ],
            3 => vec![self.root.join(STAGE3_DIR).join("merged")],
            _ => vec![self.root.join("eval/report.json")],
        }
    }
}

/// File values, then flags; nothing is written.
pub fn resolve(args: &PipelineArgs) -> anyhow::Result<Plan> {
    let (mut cfg, mut sources): (PipelineConfig, Sources) = if args.config.is_file() {
        config::load_with_sources(&args.config, "")?
    } else if args.quick_test {
        Default::default()
    } else {
        anyhow::bail!(
            "pipeline config `{}` not found\nhint: run from the repository root, or pass --config",
            args.config.display()
        );
    };
    config::apply_sets(&mut cfg, &mut sources, &args.set)
        .with_context(|| format!("`{}`", args.config.display()))?;
    let root = args.checkpoints.clone().unwrap_or_else(|| {
        PathBuf::from(if args.quick_test {
            "checkpoints/quick"
        } else {
            "checkpoints"
        })
    });
    let precision = super::precision_flags(args.base_precision, args.no_4bit)?;
    if args.b200 {
        cfg.apply_b200(&mut sources, "--b200");
        sources.flag("hardware.b200_mode", "--b200");
    } else if cfg.hardware.b200_mode {
        cfg.apply_b200(&mut sources, "hardware.b200_mode");
    }
    // A flag goes over the preset.
    if let Some((p, flag)) = precision {
        cfg.model.base_precision = p;
        sources.flag("model.base_precision", flag);
    }
    if let Some(r) = &args.revision {
        cfg.model.revision = Some(r.clone());
        sources.flag("model.revision", "--revision");
    }
    if let Some(d) = &args.device {
        cfg.hardware.device = d.clone();
        sources.flag("hardware.device", "--device");
    }
    let data_dir = if args.quick_test {
        root.join("data")
    } else {
        cfg.stage0.output_dir.clone()
    };
    let mut max_steps = None;
    let mut eval_limit = None;
    let mut max_new_tokens = 2048;
    if args.quick_test {
        let quick = |sources: &mut Sources, keys: &[&str]| {
            for k in keys {
                sources.flag(k, "--quick_test");
            }
        };
        cfg.stage0.dataset = "builtin".into();
        cfg.stage0.max_samples = Some(32);
        cfg.stage0.variants = 1;
        // Enough held-out programs for eval to have something to score.
        cfg.stage0.test_ratio = 0.25;
        quick(
            &mut sources,
            &[
                "stage0.dataset",
                "stage0.max_samples",
                "stage0.variants",
                "stage0.test_ratio",
                "stage0.output_dir",
            ],
        );
        // `run` writes this tiny model before Stage 1.
        cfg.model.name = root.join("base-model").display().to_string();
        // Byte-level tokens: a corpus prompt is one to three thousand.
        cfg.model.max_length = 4096;
        cfg.model.base_precision = BasePrecision::Bf16;
        quick(
            &mut sources,
            &["model.name", "model.max_length", "model.base_precision"],
        );
        for (name, s) in [("stage1", &mut cfg.stage1), ("stage2", &mut cfg.stage2)] {
            s.batch_size = 2;
            s.gradient_accumulation_steps = 1;
            s.epochs = 1;
            s.save.save_steps = 4;
            s.eval_steps = 0;
            s.optim.learning_rate = 1e-3;
            s.schedule.warmup_ratio = 0.0;
            for k in [
                "batch_size",
                "gradient_accumulation_steps",
                "epochs",
                "save_steps",
                "eval_steps",
                "learning_rate",
                "warmup_ratio",
            ] {
                sources.flag(&format!("{name}.{k}"), "--quick_test");
            }
        }
        // Stage 3 as DPO: a few prompts, short answers.
        let d = &mut cfg.stage3.dpo;
        d.num_prompts = d.num_prompts.min(4);
        d.num_samples = d.num_samples.min(4);
        d.max_new_tokens = d.max_new_tokens.min(16);
        d.train.optim.learning_rate = 1e-3;
        for k in [
            "num_prompts",
            "num_samples",
            "max_new_tokens",
            "train.learning_rate",
        ] {
            sources.flag(&format!("stage3.dpo.{k}"), "--quick_test");
        }
        max_steps = Some(6);
        eval_limit = Some(4);
        max_new_tokens = 24;
        cfg.gate.limit = Some(4);
        cfg.gate.max_new_tokens = 24;
        cfg.gate.batch_size = 8;
        quick(
            &mut sources,
            &["gate.limit", "gate.max_new_tokens", "gate.batch_size"],
        );
    }
    cfg.stage0.output_dir = data_dir.clone();
    // The stages' files follow the pipeline's layout under `root`.
    for (name, s, dir, train, test) in [
        (
            "stage1",
            &mut cfg.stage1,
            STAGE1_DIR,
            "stage1_original_train.jsonl",
            "stage1_original_test.jsonl",
        ),
        (
            "stage2",
            &mut cfg.stage2,
            STAGE2_DIR,
            "stage2_transformed_train.jsonl",
            "stage2_transformed_test.jsonl",
        ),
    ] {
        s.train_file = Some(data_dir.join(train));
        s.eval_file = Some(data_dir.join(test));
        s.save.output_dir = Some(root.join(dir));
        for k in ["train_file", "eval_file", "output_dir"] {
            sources.set(
                &format!("{name}.{k}"),
                Source::Preset {
                    by: format!("the pipeline's layout under `{}`", root.display()),
                },
            );
        }
    }
    if let Some(m) = args.max_steps {
        anyhow::ensure!(
            m >= 1,
            "--max_steps: must be at least 1\nhint: leave it out to run every stage in full"
        );
        max_steps = Some(max_steps.map_or(m, |q: u64| q.min(m)));
    }
    anyhow::ensure!(
        args.start_stage <= args.last_stage && args.last_stage <= 4,
        "--last_stage {}: must be between --start_stage ({}) and 4\nhint: stages are 0 generate, 1 warmup, 2 sft, 3 ppo, 4 eval",
        args.last_stage,
        args.start_stage
    );
    let problems = config::Validate::problems(&cfg);
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}",
        problems.join("\n  - ")
    );
    Ok(Plan {
        cfg,
        sources,
        root,
        data_dir,
        max_steps,
        eval_limit,
        max_new_tokens,
    })
}

pub fn run(args: &PipelineArgs) -> anyhow::Result<()> {
    // Every process a launcher starts would run Stage 0 and the evals too,
    // each writing the same files.
    if let Some(r) = super::launch::launcher_rank(&|k| std::env::var(k).ok())?
        && r.world > 1
    {
        anyhow::bail!(
            "pipeline under a launcher of {} ranks: it runs Stage 0, the gate and eval on one process\nhint: run `trace-train pipeline --last_stage 0` once, then `warmup`, `sft` and `ppo` under the launcher, then `eval`; or run the pipeline on one host with --num_gpus",
            r.world
        );
    }
    let plan = resolve(args)?;
    let mut clock = Clock::new();
    let Plan {
        cfg,
        root,
        data_dir,
        max_steps,
        eval_limit,
        max_new_tokens,
        ..
    } = &plan;
    let (max_steps, eval_limit, max_new_tokens) = (*max_steps, *eval_limit, *max_new_tokens);
    if args.quick_test {
        eprintln!(
            "quick test: every stage on a tiny random model the pipeline makes, a few steps each, \
             to show that the tool works on this machine; its accuracy is 0% by design"
        );
    }
    // The quick test's folder is its own scratch space, held for the run.
    let _quick = match args.quick_test {
        true => Some(claim_quick_folder(root, args.resume)?),
        false => None,
    };
    std::fs::create_dir_all(root).with_context(|| format!("cannot create `{}`", root.display()))?;
    if args.quick_test {
        trace_train::model::arch::tiny::write_tiny_chat_model(Path::new(&cfg.model.name), 7)?;
    }
    // The run's settings, each with where it came from.
    trace_train::atomic::write(
        &root.join("resolved_config.json"),
        &serde_json::to_vec_pretty(&plan.resolved()?)?,
    )?;

    let state_path = root.join("pipeline_state.json");
    let expected = |stage: u8| StageRecord {
        settings: plan.stage_settings(stage),
        outputs: plan.stage_outputs(stage),
    };
    let mut state: PipelineState = match std::fs::read(&state_path) {
        Ok(bytes) if args.resume => serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "`{}` is not a pipeline state\nhint: remove it to run every stage again",
                state_path.display()
            )
        })?,
        _ => PipelineState::default(),
    };
    let stage3 = if cfg.stage3.is_dpo() { "dpo" } else { "ppo" };
    let names = ["generate", "warmup", "sft", stage3, "eval"];
    for line in state.recheck(&expected, names) {
        eprintln!("resume: {line}");
    }
    let finish = |stage: u8, state: &mut PipelineState| -> anyhow::Result<()> {
        state.finished.retain(|&s| s != stage);
        state.finished.push(stage);
        state.stages.insert(stage, expected(stage));
        trace_train::atomic::write(&state_path, &serde_json::to_vec_pretty(state)?)
    };
    let in_range = |stage: u8| (args.start_stage..=args.last_stage).contains(&stage);
    let todo =
        |stage: u8, state: &PipelineState| in_range(stage) && !state.finished.contains(&stage);
    let mut gate = Gate::new(
        &cfg.gate,
        root,
        data_dir,
        &cfg.hardware.device,
        args.unsafe_flag.unsafe_no_sandbox,
        args.resume,
    )?;
    if gate.is_some() && (1..=3).any(in_range) {
        // What the gate reads must be there before a stage trains (Stage
        // 0's test splits once Stage 0 ran).
        for f in &cfg.gate.files {
            anyhow::ensure!(
                f.is_file(),
                "gate.files: `{}` is not a file\nhint: name JSONL files of `generate`'s records (relative to the working folder), or remove the entry",
                f.display()
            );
        }
        if !in_range(0) {
            for (set, file) in [
                ("original_test", "stage1_original_test.jsonl"),
                ("transformed_test", "stage2_transformed_test.jsonl"),
            ] {
                let path = data_dir.join(file);
                anyhow::ensure!(
                    !cfg.gate.sets.iter().any(|s| s == set) || path.is_file(),
                    "gate.sets: `{set}` reads Stage 0's `{}`, which is not there\nhint: run Stage 0 first, or leave `{set}` out of gate.sets (or set gate.mode to `off`)",
                    path.display()
                );
            }
        }
    }
    if todo(3, &state) {
        // Stage 3 (or DPO's rollouts) reads its dataset only after Stages
        // 0-2 have run: a path that is not there stops the pipeline now.
        trace_train::env::registry::parse(&cfg.stage3.ppo.environment).map_err(|e| {
            e.context(format!(
                "stage3.ppo.environment in `{}` (checked before the first stage)",
                args.config.display()
            ))
        })?;
        super::ppo::check_local_datasets(&cfg.stage3.ppo).map_err(|e| {
            e.context(format!(
                "stage3.ppo.dataset in `{}` (checked before the first stage)",
                args.config.display()
            ))
        })?;
    }
    let stage2_merged = root.join(STAGE2_DIR).join("merged");
    // The model each stage leaves (0: the base model the pipeline starts
    // from), as the gate names it; Stage 3's once it ran.
    let gated = |stage: u8| -> Gated {
        let (name, model) = match stage {
            0 => ("base", PathBuf::from(&cfg.model.name)),
            1 => ("warmup", root.join(STAGE1_DIR).join("merged")),
            2 => ("sft", stage2_merged.clone()),
            _ if cfg.stage3.is_dpo() => (
                "dpo",
                last_round_model(
                    &root.join(STAGE3_DPO_DIR),
                    cfg.stage3.dpo.rounds,
                    &stage2_merged,
                ),
            ),
            _ => ("ppo", root.join(STAGE3_DIR).join("merged")),
        };
        Gated {
            stage,
            name,
            round: None,
            model,
            revision: if stage == 0 {
                cfg.model.revision.clone()
            } else {
                None
            },
        }
    };

    if todo(0, &state) {
        eprintln!("== stage 0: generate");
        let t = Instant::now();
        let s = generate::run(
            &cfg.stage0,
            &RunOptions {
                unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
            },
            &generate::NoProgress,
        )?;
        eprintln!(
            "stage 0: {} original and {} transformed training records",
            s.stage1.records_train, s.stage2.records_train
        );
        clock.done("stage 0 (generate)", t);
        finish(0, &mut state)?;
    }
    // Stages 1-2 run with the settings resolved here (what `config
    // pipeline` shows): the stage's section, the model and hardware
    // sections, the model it starts from.
    let stage_settings = |stage: u8| -> Resolved {
        let sft = if stage == 1 { &cfg.stage1 } else { &cfg.stage2 };
        let out = sft
            .save
            .output_dir
            .clone()
            .expect("resolve sets the stage folders");
        Resolved {
            settings: Settings {
                config: sft.clone(),
                model: cfg.model.clone(),
                hardware: cfg.hardware.clone(),
                base_model: if stage == 1 {
                    cfg.model.name.clone()
                } else {
                    root.join(STAGE1_DIR).join("merged").display().to_string()
                },
                revision: if stage == 1 {
                    cfg.model.revision.clone()
                } else {
                    None
                },
                sources: Sources::default(),
            },
            run: RunFlags {
                resume: args.resume && out.exists(),
                max_steps,
                ..RunFlags::default()
            },
            unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
        }
    };
    for (stage, name) in [(1u8, "warmup"), (2u8, "sft")] {
        if todo(stage, &state) {
            if let Some(g) = &mut gate {
                // The model the stage starts from, before hours of
                // training: a set the gate cannot read fails here.
                stop_before("the gate")?;
                let t = Instant::now();
                g.before(&gated(stage - 1))?;
                g.forget(stage)?;
                clock.add("gate", t);
            }
            stop_before(name)?;
            eprintln!("== stage {stage}: {name}");
            let t = Instant::now();
            let r = stage_settings(stage);
            let out = r
                .settings
                .config
                .save
                .output_dir
                .clone()
                .unwrap_or_default();
            let interrupted = match role(cfg.hardware.num_gpus, &cfg.hardware.device)? {
                Role::Parent { world } => {
                    // One process a GPU, each reading the resolved stage
                    // from a file beside its outputs.
                    std::fs::create_dir_all(&out)
                        .with_context(|| format!("cannot create `{}`", out.display()))?;
                    let file = out.join(format!("pipeline_{name}_settings.json"));
                    let started = std::time::SystemTime::now();
                    run_resolved_children(world, name, &r, &file)?;
                    !finished_since(&out, started)
                }
                _ => {
                    let job = train::job(name, r.settings, &r.run, r.unsafe_no_sandbox)?;
                    train::run_resolved(name, job)?.interrupted
                }
            };
            if interrupted {
                anyhow::bail!("pipeline stopped during {name}; continue with --resume");
            }
            clock.done(&format!("stage {stage} ({name})"), t);
            finish(stage, &mut state)?;
        }
        if let Some(g) = gate.as_mut().filter(|_| in_range(stage)) {
            stop_before("the gate")?;
            let t = Instant::now();
            g.after(&gated(stage - 1), &gated(stage))?;
            clock.add("gate", t);
        }
    }
    if let Some(g) = gate.as_mut().filter(|_| todo(3, &state)) {
        stop_before("the gate")?;
        let t = Instant::now();
        g.before(&gated(2))?;
        g.forget(3)?;
        clock.add("gate", t);
    }
    // A DPO round's model as the gate names it: each round is gated
    // against the model it started from, so keep_best can keep a round.
    let round_gated = |round: usize| Gated {
        stage: 3,
        name: "dpo",
        round: Some(round),
        model: root
            .join(STAGE3_DPO_DIR)
            .join(format!("round_{round}"))
            .join("merged"),
        revision: None,
    };
    // Gates a round against the model before it (Stage 2's, then the last
    // gated round's), as dpo_rounds finishes it or, for rounds an earlier
    // run trained, after the stage from their reports.
    let mut before = gated(2);
    let mut gate_time = 0.0;
    let mut gate_round = |round: usize| -> anyhow::Result<()> {
        if let Some(g) = gate.as_mut() {
            stop_before("the gate")?;
            let t = Instant::now();
            let after = round_gated(round);
            g.after(&before, &after)?;
            before = after;
            gate_time += t.elapsed().as_secs_f64();
        }
        Ok(())
    };
    let mut rounds_gated = false;
    if todo(3, &state) && cfg.stage3.is_dpo() {
        stop_before("dpo")?;
        eprintln!("== stage 3: dpo from the model's own rollouts");
        let t = Instant::now();
        let r = DpoRoundsRun {
            cfg: &cfg.stage3,
            model: &cfg.model,
            root: root.join(STAGE3_DPO_DIR),
            start: stage2_merged.clone(),
            device: args.device.clone(),
            resume: args.resume,
            max_steps,
            unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
        };
        if dpo_rounds(&r, &mut gate_round)? {
            anyhow::bail!("pipeline stopped during dpo; continue with --resume");
        }
        rounds_gated = true;
        clock.done("stage 3 (dpo, its rounds' gates included)", t);
        finish(3, &mut state)?;
    }
    if todo(3, &state) {
        stop_before("ppo")?;
        eprintln!("== stage 3: ppo");
        let t = Instant::now();
        let out = root.join(STAGE3_DIR);
        let a = PpoArgs {
            model: Some(root.join(STAGE2_DIR).join("merged").display().to_string()),
            output_dir: Some(out.clone()),
            settings: Some(Box::new(cfg.stage3.clone())),
            quick_test: args.quick_test,
            unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
            pipeline_config: Some(args.config.clone()).filter(|p| p.is_file()),
            run: RunFlags {
                device: args.device.clone(),
                resume: args.resume && out.exists(),
                // The pipeline's resolved base (its flags and preset over
                // the file `ppo` reads again).
                base_precision: Some(cfg.model.base_precision),
                // On (the default) means "on a GPU"; the stage decides.
                gradient_checkpointing: (!cfg.hardware.gradient_checkpointing).then_some(false),
                max_steps,
                ..RunFlags::default()
            },
            ..PpoArgs::default()
        };
        let device = a.run.device.clone().unwrap_or_else(|| "auto".into());
        let interrupted = match role(cfg.hardware.num_gpus, &device)? {
            Role::Parent { world } => {
                // The ranks read these arguments, the stage's settings
                // among them, from a file beside its outputs.
                std::fs::create_dir_all(&out)
                    .with_context(|| format!("cannot create `{}`", out.display()))?;
                let file = out.join("pipeline_ppo_settings.json");
                let mut ranks = a.clone();
                ranks.run.num_gpus = Some(world);
                let started = std::time::SystemTime::now();
                run_resolved_children(world, "ppo", &ranks, &file)?;
                !finished_since(&out, started)
            }
            _ => super::ppo::run(&a)?.interrupted,
        };
        if interrupted {
            anyhow::bail!("pipeline stopped during ppo; continue with --resume");
        }
        clock.done("stage 3 (ppo)", t);
        finish(3, &mut state)?;
    }
    if in_range(3) && cfg.stage3.is_dpo() && !rounds_gated {
        for round in 0..cfg.stage3.dpo.rounds {
            if round_gated(round).model.join("config.json").is_file() {
                gate_round(round)?;
            }
        }
    }
    if !rounds_gated {
        clock.seconds("gate", gate_time);
    }
    if let Some(g) = gate
        .as_mut()
        .filter(|_| in_range(3) && !cfg.stage3.is_dpo())
    {
        stop_before("the gate")?;
        let t = Instant::now();
        g.after(&gated(2), &gated(3))?;
        clock.add("gate", t);
    }
    // Stage 3's model, or with gate.mode keep_best the best gated one.
    let last = match &mut gate {
        Some(g) if (1..=4).any(in_range) => g.final_model(gated(3))?,
        _ => gated(3),
    };
    let (final_model, final_revision) = (last.model, last.revision);
    if todo(4, &state) {
        stop_before("eval")?;
        let t = Instant::now();
        // Stage 3's episodes, when it trains them (PPO/GRPO with
        // `max_turns` above 1), are how both evals score the final model:
        // the report adds the accuracy after each turn.
        let rl = &cfg.stage3.ppo;
        let (max_turns, feedback) = if !cfg.stage3.is_dpo() && rl.max_turns > 1 {
            (rl.max_turns, Some(rl.feedback.clone()))
        } else {
            (1, None)
        };
        match &feedback {
            Some(kind) => eprintln!(
                "== eval: up to {max_turns} answers an item, feedback {kind} (stage3.ppo.max_turns)"
            ),
            None => eprintln!("== eval"),
        }
        run_eval(&EvalArgs {
            model: Some(final_model.clone()),
            adapter: None,
            compare: None,
            heldout: None,
            prompt: "original".into(),
            variants: 1,
            data: Some(data_dir.join("stage2_transformed_test.jsonl")),
            output: Some(root.join("eval/report.json")),
            limit: eval_limit,
            max_new_tokens,
            batch_size: 8,
            max_turns,
            feedback: feedback.clone(),
            max_steps_per_episode: rl.max_steps_per_episode,
            device: Some(cfg.hardware.device.clone()),
            // Measured as loaded, as the gate measures.
            base_precision: BasePrecision::Bf16,
            revision: final_revision.clone(),
            unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
            envs: Default::default(),
        })?;
        // The held-out short set: programs no training split holds, one
        // to three output lines each; a model that learned to run on after
        // its answer shows here first.
        eprintln!("== eval: held-out short set");
        run_eval(&EvalArgs {
            model: Some(final_model.clone()),
            adapter: None,
            compare: None,
            heldout: Some("short".into()),
            prompt: "original".into(),
            variants: 1,
            data: None,
            output: Some(root.join("eval/heldout_short.json")),
            limit: eval_limit,
            max_new_tokens,
            batch_size: 8,
            max_turns,
            feedback: feedback.clone(),
            max_steps_per_episode: rl.max_steps_per_episode,
            device: Some(cfg.hardware.device.clone()),
            // Measured as loaded, as the gate measures.
            base_precision: BasePrecision::Bf16,
            revision: final_revision.clone(),
            unsafe_no_sandbox: args.unsafe_flag.unsafe_no_sandbox,
            envs: Default::default(),
        })?;
        clock.done("eval", t);
        finish(4, &mut state)?;
    }
    // The model the run ends with: Stage 3's (or keep_best's), else that
    // of the last stage in range that has one (`--last_stage 1`).
    let ends_with = (1..=args.last_stage.min(3))
        .rev()
        .map(|stage| match stage {
            3 => final_model.clone(),
            s => gated(s).model,
        })
        .find(|m| m.join("config.json").is_file());
    summary(args, &clock, gate.as_ref(), ends_with.as_deref(), root);
    Ok(())
}

/// Where a pipeline run's time went, part by part, for its summary.
struct Clock {
    started: Instant,
    parts: Vec<(String, f64)>,
}

impl Clock {
    fn new() -> Self {
        Clock {
            started: Instant::now(),
            parts: Vec::new(),
        }
    }

    /// A part that ended now, begun at `t`: said, and kept for the summary.
    fn done(&mut self, part: &str, t: Instant) {
        let secs = t.elapsed().as_secs_f64();
        eprintln!("{part} done in {}", clock(secs));
        self.seconds(part, secs);
    }

    /// Adds the time since `t` to `part` (the gate runs between stages).
    fn add(&mut self, part: &str, t: Instant) {
        self.seconds(part, t.elapsed().as_secs_f64());
    }

    fn seconds(&mut self, part: &str, secs: f64) {
        match self.parts.iter_mut().find(|(p, _)| p == part) {
            Some((_, s)) => *s += secs,
            None if secs > 0.0 => self.parts.push((part.to_owned(), secs)),
            None => {}
        }
    }
}

/// The run's closing lines, on stdout: the gate's whole table, the time
/// of each part, where the final model is and what to run next.
fn summary(
    args: &PipelineArgs,
    times: &Clock,
    gate: Option<&Gate>,
    final_model: Option<&Path>,
    root: &Path,
) {
    let mut out = String::new();
    if let Some(g) = gate.filter(|g| g.path().is_file()) {
        out += &g.table();
    }
    let parts: Vec<String> = times
        .parts
        .iter()
        .map(|(p, s)| format!("{p} {}", clock(*s)))
        .collect();
    out += &format!(
        "pipeline done in {}{}\n",
        clock(times.started.elapsed().as_secs_f64()),
        match parts.is_empty() {
            true => String::new(),
            false => format!(": {}", parts.join(", ")),
        }
    );
    if let Some(m) = final_model {
        out += &format!("final model: {}\n", m.display());
    }
    for (what, file) in [
        ("gate", root.join("gate.json")),
        ("eval", root.join("eval/report.json")),
    ] {
        if file.is_file() {
            out += &format!("{what} report: {}\n", file.display());
        }
    }
    out += &match (args.quick_test, final_model) {
        (true, _) => "next: `trace-train init my-run` writes starter configs for your own pipeline (docs/guide/pipeline.md)\n".to_owned(),
        (false, Some(m)) => format!(
            "next: `trace-train serve --model {}` answers OpenAI-style requests with it (docs/guide/serve.md)\n",
            m.display()
        ),
        (false, None) => String::new(),
    };
    print!("{out}");
}

/// The file that marks a folder as the quick test's own: the quick test
/// writes only into a folder that holds it (or that it creates), and holds
/// a lock on it while it runs.
pub const QUICK_MARK: &str = ".trace-train-quick-test";

/// Takes `root` for a quick test: a missing or empty folder is marked as
/// the quick test's; a marked one is locked and, unless `resume`, emptied
/// of the last quick test's files; any other folder is refused untouched,
/// as is one another quick test is using.
pub fn claim_quick_folder(
    root: &Path,
    resume: bool,
) -> anyhow::Result<trace_train::kit::checkpoint::RunLock> {
    let mark = root.join(QUICK_MARK);
    if root.exists() && !mark.is_file() {
        let empty = std::fs::read_dir(root)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        anyhow::ensure!(
            root.is_dir() && empty,
            "`{}` is not a quick-test folder: it has no `{QUICK_MARK}`, and the quick test writes only into a folder it made\nhint: pass --checkpoints with a new or empty folder, or remove `{}` yourself if it is scratch",
            root.display(),
            root.display()
        );
    }
    std::fs::create_dir_all(root).with_context(|| format!("cannot create `{}`", root.display()))?;
    if !mark.is_file() {
        trace_train::atomic::write(
            &mark,
            b"This folder is the scratch space of `trace-train pipeline --quick_test`,\nwhich empties it at its next run.\n",
        )?;
    }
    let lock = trace_train::kit::checkpoint::RunLock::on_file(&mark, false).map_err(|e| {
        e.context(format!(
            "another quick test is using `{}`\nhint: wait for it to finish, or pass --checkpoints with another folder",
            root.display()
        ))
    })?;
    if !resume {
        let entries: Vec<_> = std::fs::read_dir(root)
            .with_context(|| format!("cannot list `{}`", root.display()))?
            .collect::<Result<_, _>>()?;
        if entries.len() > 1 {
            eprintln!("emptying the last quick test's folder `{}`", root.display());
        }
        for e in entries.into_iter().filter(|e| e.file_name() != QUICK_MARK) {
            let path = e.path();
            let gone = match e.file_type()?.is_dir() {
                true => std::fs::remove_dir_all(&path),
                false => std::fs::remove_file(&path),
            };
            gone.with_context(|| format!("cannot remove `{}`", path.display()))?;
        }
    }
    Ok(lock)
}

/// Fails if a stop signal came since the process's flag was installed (by
/// an earlier stage, also one the signal reached in its last step, which
/// finished and was marked done): the pipeline starts nothing more.
fn stop_before(next: &str) -> anyhow::Result<()> {
    if trace_train::stop::requested() {
        trace_train::stop::cut_short();
        anyhow::bail!("pipeline stopped before {next} by a signal; continue with --resume");
    }
    Ok(())
}

/// Whether the stage writing to `out` wrote its final adapter at or after
/// `since` (a stage stopped by a signal writes none).
fn finished_since(out: &std::path::Path, since: std::time::SystemTime) -> bool {
    std::fs::metadata(out.join("final/adapter_config.json"))
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since)
}

/// Stage 3 as rounds of DPO from the model's own rollouts.
struct DpoRoundsRun<'a> {
    cfg: &'a config::Stage3Config,
    model: &'a config::ModelConfig,
    /// `stage3_dpo/`.
    root: PathBuf,
    /// The first round's base (Stage 2's merged model).
    start: PathBuf,
    device: Option<String>,
    resume: bool,
    max_steps: Option<u64>,
    unsafe_no_sandbox: bool,
}

/// The model a finished Stage 3 of `rounds` DPO rounds leaves: the last
/// round that trained (a round without pairs trains nothing and passes its
/// base on).
fn last_round_model(root: &Path, rounds: usize, start: &Path) -> PathBuf {
    (0..rounds)
        .rev()
        .map(|r| root.join(format!("round_{r}/merged")))
        .find(|m| m.join("config.json").exists())
        .unwrap_or_else(|| start.to_owned())
}

/// Runs the rounds (rollouts -> prefs -> dpo), each from the last one's
/// merged model; a round whose model is written is skipped on resume.
/// `on_round` is told of each round that has a model (trained now or
/// earlier), in order: the gate's hook. Returns whether a signal
/// interrupted a round's training.
fn dpo_rounds(
    r: &DpoRoundsRun,
    on_round: &mut dyn FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    use super::pref::{DpoArgs, PrefsArgs, RolloutsArgs, prefs, rollouts, run_dpo};
    let d = &r.cfg.dpo;
    let ppo = &r.cfg.ppo;
    for round in 0..d.rounds {
        let dir = r.root.join(format!("round_{round}"));
        if r.resume && dir.join("merged/config.json").exists() {
            eprintln!("== stage 3: dpo round {round}: done");
            on_round(round)?;
            continue;
        }
        let base = last_round_model(&r.root, round, &r.start);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create `{}`", dir.display()))?;
        eprintln!(
            "== stage 3: dpo round {round}: rollouts from `{}`",
            base.display()
        );
        let rollouts_file = dir.join("rollouts.jsonl");
        let seed = d.train.seed.wrapping_add(round as u64);
        rollouts(&RolloutsArgs {
            model: base.display().to_string(),
            adapter: None,
            num_samples: d.num_samples,
            greedy: d.greedy,
            prompt_variants: None,
            num_prompts: d.num_prompts,
            // Each round asks fresh prompts of the stream.
            first_draw: (round * d.num_prompts * 2) as u64,
            environment: ppo.environment.clone(),
            dataset: ppo.dataset.clone(),
            output: rollouts_file.clone(),
            temperature: d.temperature,
            top_p: ppo.top_p,
            top_k: ppo.top_k,
            max_new_tokens: d.max_new_tokens,
            max_prompt_tokens: ppo.max_prompt_tokens,
            last_bucket: d.last_bucket.clone(),
            bucket_feature: d.bucket_feature.clone(),
            max_rows: ppo.sample_max_rows,
            seed,
            revision: None,
            device: r.device.clone(),
            // As the gate samples: bf16, so rounds compare with earlier runs.
            base_precision: trace_train::model::BasePrecision::Bf16,
            num_workers: ppo.num_workers,
            unsafe_no_sandbox: r.unsafe_no_sandbox,
        })?;
        let pairs_file = dir.join("pairs.jsonl");
        let stats = prefs(&PrefsArgs {
            rollouts: rollouts_file,
            output: pairs_file.clone(),
            among_correct: d.among_correct.clone(),
            min_edit_distance: d.min_edit_distance,
            max_pairs_per_prompt: d.max_pairs_per_prompt,
            seed,
            demonstrations: d.demonstrations,
            same_lines: d.same_lines,
            first_error: d.first_error,
        })?;
        if stats.pairs.values().sum::<usize>() == 0 {
            eprintln!(
                "== stage 3: dpo round {round}: no pairs (every prompt's answers were all right or all wrong); the round trains nothing\nhint: raise stage3.dpo.num_samples or temperature"
            );
            continue;
        }
        let s = run_dpo(&DpoArgs {
            model: Some(base.display().to_string()),
            pairs: Some(pairs_file),
            output_dir: Some(dir.clone()),
            settings: Some(Box::new(d.train.clone())),
            model_settings: Some(Box::new(r.model.clone())),
            run: RunFlags {
                device: r.device.clone(),
                resume: r.resume,
                max_steps: r.max_steps,
                ..RunFlags::default()
            },
            ..DpoArgs::default()
        })?;
        if s.ending.interrupted {
            return Ok(true);
        }
        on_round(round)?;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 5] = ["generate", "warmup", "sft", "ppo", "eval"];

    fn record(settings: &str, outputs: &[&Path]) -> StageRecord {
        StageRecord {
            settings: settings.into(),
            outputs: outputs.iter().map(|p| p.to_path_buf()).collect(),
        }
    }

    #[test]
    fn resume_runs_again_a_stage_whose_settings_or_outputs_changed_and_all_after_it() {
        let d = tempfile::tempdir().unwrap();
        let out = |s: u8| d.path().join(format!("out{s}"));
        for s in 0..5 {
            std::fs::write(out(s), b"").unwrap();
        }
        let now = |s: u8| record(if s == 3 { "dpo" } else { "same" }, &[&out(s)]);
        let was = |s: u8| record(if s == 3 { "ppo" } else { "same" }, &[&out(s)]);
        let full = || PipelineState {
            finished: vec![0, 1, 2, 3, 4],
            stages: (0..5).map(|s| (s, was(s))).collect(),
        };

        // Stage 3's settings changed: 3 and 4 run again.
        let mut st = full();
        let said = st.recheck(&now, NAMES);
        assert_eq!(st.finished, vec![0, 1, 2]);
        assert!(
            said[0].contains("stage 3") && said[0].contains("settings changed"),
            "{said:?}"
        );
        assert!(said[1].contains("[4]"), "{said:?}");
        assert_eq!(st.stages.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);

        // Unchanged: nothing runs again.
        let mut st = full();
        assert!(st.recheck(&was, NAMES).is_empty());
        assert_eq!(st.finished, vec![0, 1, 2, 3, 4]);

        // Stage 1's output gone: 1 onwards run again.
        std::fs::remove_file(out(1)).unwrap();
        let mut st = full();
        let said = st.recheck(&was, NAMES);
        assert_eq!(st.finished, vec![0]);
        assert!(
            said[0].contains("stage 1 (warmup)") && said[0].contains("is gone"),
            "{said:?}"
        );

        // A state file of an earlier version (no records): outputs only.
        let mut st = PipelineState {
            finished: vec![0, 1, 2],
            stages: Default::default(),
        };
        st.recheck(&now, NAMES);
        assert_eq!(st.finished, vec![0]);
    }

    /// A pipeline finished before `model.base_precision` existed recorded
    /// Stage 1's settings with the model section's `load_in_4bit`; its
    /// `--resume` now finds them unchanged, whichever name the file or the
    /// flags use, and keeps the stages it finished.
    #[test]
    fn a_pipeline_recorded_before_base_precision_resumes() {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            args: PipelineArgs,
        }
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("p.json");
        let plan = |text: &str, flags: &[&str]| {
            std::fs::write(&file, text).unwrap();
            let mut argv = vec![
                "trace-train",
                "--config",
                file.to_str().unwrap(),
                "--checkpoints",
                d.path().to_str().unwrap(),
            ];
            argv.extend(flags);
            resolve(&Wrap::try_parse_from(argv).unwrap().args).unwrap()
        };
        // Stage 1's hash as the version before computed it.
        let before = |p: &Plan, load_in_4bit: bool| {
            use sha2::Digest;
            let model = serde_json::json!({
                "name": "Qwen/Qwen3-4B", "revision": null, "load_in_4bit": load_in_4bit,
                "dtype": "bf16", "max_length": 2048
            });
            let own = serde_json::json!({"model": model, "stage1": p.cfg.stage1, "max_steps": p.max_steps});
            let mut h = sha2::Sha256::new();
            h.update(p.stage_settings(0).as_bytes());
            h.update(own.to_string().as_bytes());
            trace_train::hex(&h.finalize())
        };
        for (text, flags, four_bit) in [
            ("{}", &[][..], true),
            (r#"{"model": {"load_in_4bit": false}}"#, &[], false),
            (r#"{"hardware": {"no_4bit": true}}"#, &[], false),
            (r#"{"model": {"base_precision": "nf4"}}"#, &[], true),
            ("{}", &["--no_4bit"], false),
            ("{}", &["--base_precision", "bf16"], false),
        ] {
            let p = plan(text, flags);
            assert_eq!(
                p.stage_settings(1),
                before(&p, four_bit),
                "{text} {flags:?}"
            );
            // Stages 0 and 1 finished then, their outputs in place.
            let recorded = |s: u8| match s {
                1 => before(&p, four_bit),
                s => p.stage_settings(s),
            };
            let mut st = PipelineState {
                finished: vec![0, 1],
                stages: [0, 1].map(|s| (s, record(&recorded(s), &[]))).into(),
            };
            assert!(
                st.recheck(&|s| record(&p.stage_settings(s), &[]), NAMES)
                    .is_empty()
            );
            assert_eq!(st.finished, [0, 1]);
        }
        // FP8, which no earlier run could ask for, is another Stage 1.
        let p = plan(r#"{"model": {"base_precision": "fp8"}}"#, &[]);
        assert_ne!(p.stage_settings(1), before(&p, true));
        assert_ne!(p.stage_settings(1), before(&p, false));
    }

    #[test]
    fn a_state_file_of_an_earlier_version_still_loads() {
        let st: PipelineState = serde_json::from_str(r#"{"finished": [0, 1]}"#).unwrap();
        assert_eq!(st.finished, vec![0, 1]);
        assert!(st.stages.is_empty());
    }
}
