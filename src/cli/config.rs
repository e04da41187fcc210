//! `config`: what the settings of a run would be, each with where it came
//! from (default, a file and its key as written, a preset, a flag), for the
//! pipeline and for each stage (Stage 3's from its file and the pipeline's
//! preset), and the check of the files themselves.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::Value;

use trace_train::config::{self, GenerateConfig, PipelineConfig, Source, Sources, Stage3Config};

use super::pipeline::{self, PipelineArgs};
use super::train::{self, TrainArgs};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub show: Option<Show>,
    /// Config files to check (default: every file in config/, then the
    /// resolved settings are shown).
    pub files: Vec<PathBuf>,
    /// Show the resolved settings as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Print the configuration reference (every key of every config file:
    /// type, default, meaning) as Markdown: docs/reference/config.md.
    #[arg(long, conflicts_with = "json")]
    pub reference: bool,
}

/// `config`: checks the files named (or every file in `config/`), then
/// shows the resolved settings; `config pipeline|warmup|sft` shows one.
pub fn run(args: ConfigArgs) -> anyhow::Result<ExitCode> {
    if args.reference {
        out(&config::reference::markdown())?;
        return Ok(ExitCode::SUCCESS);
    }
    match args {
        ConfigArgs {
            show: Some(show),
            json,
            ..
        } => {
            let (title, settings) = resolved(&show)?;
            if json {
                out(&format!("{}\n", serde_json::to_string_pretty(&settings)?))?;
            } else {
                out(&table(&title, &settings))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ConfigArgs {
            show: None,
            files,
            json,
            ..
        } => {
            let show_all = files.is_empty();
            let files = if files.is_empty() {
                let mut v: Vec<PathBuf> = std::fs::read_dir("config")
                    .context("cannot list `config/`")?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect();
                v.sort();
                v
            } else {
                files
            };
            for f in files {
                let kind = check_config_file(&f)?;
                if !json {
                    out(&format!("ok  {} ({kind})\n", f.display()))?;
                }
            }
            if show_all {
                let all = resolved_all()?;
                if json {
                    let map: serde_json::Map<_, _> = all.into_iter().collect();
                    out(&format!("{}\n", serde_json::to_string_pretty(&map)?))?;
                } else {
                    for (title, settings) in &all {
                        out(&table(title, settings))?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Writes `text` to stdout. A reader that stopped reading (`config | head`)
/// ends the command quietly, with success: what it read is all it wanted.
fn out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

/// Parses a config file with the type it holds: by its name for the
/// shipped names, else by its keys (any file name works).
fn check_config_file(path: &Path) -> anyhow::Result<String> {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let kind = match name {
        "pipeline_config" | "generate" | "warmup" | "sft" | "stage3_ppo_config" | "dpo" => {
            name.to_owned()
        }
        _ => kind_by_keys(path)?,
    };
    match kind.as_str() {
        "pipeline_config" => {
            let c = config::load::<PipelineConfig>(path)?;
            check_environment(path, "stage3.ppo", &c.stage3.ppo.environment)?;
        }
        "generate" => config::load::<GenerateConfig>(path).map(|_| ())?,
        "warmup" | "sft" => config::load::<config::SftConfig>(path).map(|_| ())?,
        "stage3_ppo_config" => {
            let c = config::load::<config::Stage3Config>(path)?;
            check_environment(path, "ppo", &c.ppo.environment)?;
        }
        _ => config::load::<config::DpoConfig>(path).map(|_| ())?,
    }
    Ok(kind)
}

/// The environments `spec` names, checked against the registry (the
/// configs sit below it and check the key's form only).
fn check_environment(path: &Path, section: &str, spec: &str) -> anyhow::Result<()> {
    trace_train::env::registry::parse(spec)
        .map(|_| ())
        .with_context(|| format!("{section}.environment in `{}`", path.display()))
}

/// Which config a file of another name is, from its top-level keys: a
/// pipeline file's sections, Stage 3's `ppo`/`curriculum`, or the stage
/// whose keys it shares most (generate, SFT, DPO).
fn kind_by_keys(path: &Path) -> anyhow::Result<String> {
    let (text, _) = config::read_text(path)?;
    let Ok(Value::Object(top)) = serde_json::from_str::<Value>(&text) else {
        // Not an object: the pipeline's reader says where and why.
        config::parse::<PipelineConfig>(&text, path)?;
        return Ok("pipeline_config".into());
    };
    let has = |k: &str| top.contains_key(k);
    if [
        "model", "hardware", "gate", "stage0", "stage1", "stage2", "stage3",
    ]
    .iter()
    .any(|k| has(k))
    {
        return Ok("pipeline_config".into());
    }
    if has("ppo") || has("curriculum") {
        return Ok("stage3_ppo_config".into());
    }
    fn keys<T: serde::Serialize + Default>() -> Vec<String> {
        serde_json::to_value(T::default())
            .ok()
            .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()))
            .unwrap_or_default()
    }
    let shared = |known: Vec<String>| top.keys().filter(|k| known.contains(k)).count();
    let scores = [
        ("generate", shared(keys::<GenerateConfig>())),
        ("sft", shared(keys::<config::SftConfig>())),
        ("dpo", shared(keys::<config::DpoConfig>())),
    ];
    let best = scores.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let kinds: Vec<&str> = scores
        .iter()
        .filter(|(_, n)| *n == best)
        .map(|(k, _)| *k)
        .collect();
    match kinds.as_slice() {
        [one] => Ok((*one).into()),
        _ if top.is_empty() => Ok("pipeline_config".into()),
        _ => anyhow::bail!(
            "`{}`: cannot tell which config it is (its keys fit {} alike)\nhint: add a key only one of them has, or name the file pipeline_config, generate, warmup, sft, stage3_ppo_config or dpo .json",
            path.display(),
            kinds.join(", ")
        ),
    }
}

/// `config pipeline|warmup|sft [FLAGS]`: the settings with these flags.
#[derive(Subcommand)]
pub enum Show {
    /// The settings `pipeline` would run with, given these flags.
    Pipeline(PipelineArgs),
    /// The settings `warmup` would run with, given these flags.
    Warmup(TrainArgs),
    /// The settings `sft` would run with, given these flags.
    Sft(TrainArgs),
}

/// Resolves `show` and returns its settings as JSON
/// (`{key: {"value", "from", ...}}`).
pub fn resolved(show: &Show) -> anyhow::Result<(String, Value)> {
    let (title, mut settings) = match show {
        Show::Pipeline(a) => (
            format!("pipeline ({})", a.config.display()),
            pipeline::resolve(a)?.resolved()?,
        ),
        Show::Warmup(a) => ("warmup".into(), train::settings("warmup", a)?.resolved()?),
        Show::Sft(a) => ("sft".into(), train::settings("sft", a)?.resolved()?),
    };
    explain(&title, &mut settings);
    Ok((title, settings))
}

/// Adds each setting's meaning (from the configuration reference) to its
/// entry of `settings`, the table of the settings `title` names.
fn explain(title: &str, settings: &mut Value) {
    use trace_train::config::reference::meanings;
    let pipeline = meanings::<PipelineConfig>();
    let own = match title.split(' ').next().unwrap_or(title) {
        "generate" => meanings::<GenerateConfig>(),
        "warmup" | "sft" => meanings::<config::SftConfig>(),
        "ppo" => meanings::<Stage3Config>(),
        _ => Default::default(),
    };
    let Some(map) = settings.as_object_mut() else {
        return;
    };
    for (key, entry) in map.iter_mut() {
        if let Some(m) = own.get(key).or_else(|| pipeline.get(key))
            && let Some(e) = entry.as_object_mut()
        {
            e.insert("meaning".into(), Value::String(m.clone()));
        }
    }
}

/// The settings of the pipeline and of each stage with no flags, from the
/// files in `config/` (or the defaults where a file is absent).
pub fn resolved_all() -> anyhow::Result<Vec<(String, Value)>> {
    let pipeline_file = Path::new("config/pipeline_config.json");
    let mut out = Vec::new();
    if pipeline_file.is_file() {
        let args = PipelineArgs {
            config: pipeline_file.to_owned(),
            start_stage: 0,
            last_stage: 4,
            max_steps: None,
            quick_test: false,
            b200: false,
            base_precision: None,
            no_4bit: false,
            resume: false,
            checkpoints: None,
            revision: None,
            device: None,
            set: Vec::new(),
            unsafe_flag: crate::UnsafeFlag {
                unsafe_no_sandbox: false,
            },
        };
        out.push(resolved(&Show::Pipeline(args))?);
    }
    let generate_file = Path::new("config/generate.json");
    let (g, sources): (GenerateConfig, Sources) = if generate_file.is_file() {
        config::load_with_sources(generate_file, "stage0")?
    } else {
        Default::default()
    };
    out.push((
        "generate".into(),
        sources.to_json(&serde_json::to_value(&g)?),
    ));
    explain("generate", &mut out.last_mut().expect("pushed above").1);
    out.push(resolved(&Show::Warmup(TrainArgs::default()))?);
    out.push(resolved(&Show::Sft(TrainArgs::default()))?);
    let mut ppo = stage3(pipeline_file)?;
    explain("ppo", &mut ppo);
    out.push(("ppo".into(), ppo));
    Ok(out)
}

/// Stage 3's settings as `ppo` reads them without flags:
/// `config/stage3_ppo_config.json` (or the defaults), under the pipeline
/// file's `--b200` preset when it asks for it. `ppo.micro_batch_tokens`
/// null is the auto budget and `ppo.gradient_checkpointing` null the
/// pipeline's `hardware.gradient_checkpointing` on a GPU; `ppo` decides
/// both when the device is known.
fn stage3(pipeline_file: &Path) -> anyhow::Result<Value> {
    let file = Path::new("config/stage3_ppo_config.json");
    let (mut s3, mut sources): (Stage3Config, Sources) = if file.is_file() {
        config::load_with_sources(file, "")?
    } else {
        Default::default()
    };
    if pipeline_file.is_file() {
        let mut p: PipelineConfig = config::load(pipeline_file)?;
        if p.hardware.b200_mode {
            p.apply_b200(&mut Sources::default(), "hardware.b200_mode");
            s3.ppo.micro_batch_tokens = p.stage3.ppo.micro_batch_tokens;
            sources.set(
                "ppo.micro_batch_tokens",
                Source::Preset {
                    by: "hardware.b200_mode".into(),
                },
            );
        }
    }
    Ok(sources.to_json(&serde_json::to_value(&s3)?))
}

/// One table: `key  value  source  meaning`, columns aligned; the meaning
/// is its first sentence (the whole one is in the reference).
pub fn table(title: &str, settings: &Value) -> String {
    let Some(map) = settings.as_object() else {
        return String::new();
    };
    let width = map.keys().map(String::len).max().unwrap_or(0);
    let vwidth = map
        .values()
        .map(|e| e["value"].to_string().len())
        .filter(|&w| w <= 48)
        .max()
        .unwrap_or(0);
    let rows: Vec<(&String, String, String)> = map
        .iter()
        .map(|(k, e)| {
            (
                k,
                source(e),
                first_sentence(e["meaning"].as_str().unwrap_or("")),
            )
        })
        .collect();
    let fwidth = rows
        .iter()
        .map(|(_, f, _)| f.len())
        .filter(|&w| w <= 48)
        .max()
        .unwrap_or(0);
    let mut out = format!("== {title}\n");
    for ((k, from, meaning), e) in rows.iter().zip(map.values()) {
        let line = format!(
            "{k:<width$}  {:<vwidth$}  {from:<fwidth$}  {meaning}",
            e["value"].to_string()
        );
        out += line.trim_end();
        out += "\n";
    }
    out
}

/// A meaning's first sentence, at most 72 characters.
fn first_sentence(meaning: &str) -> String {
    let first = meaning
        .split(". ")
        .next()
        .unwrap_or(meaning)
        .trim_end_matches('.');
    if first.chars().count() <= 72 {
        first.to_owned()
    } else {
        let cut: String = first.chars().take(71).collect();
        format!("{}…", cut.trim_end())
    }
}

/// Where a table entry's value came from, in words.
fn source(e: &Value) -> String {
    match e["from"].as_str() {
        Some("file") => format!(
            "file {} ({})",
            e["path"].as_str().unwrap_or("?"),
            e["key"].as_str().unwrap_or("?")
        ),
        Some("preset") => format!("preset {}", e["by"].as_str().unwrap_or("?")),
        Some("flag") => format!("flag {}", e["flag"].as_str().unwrap_or("?")),
        Some(other) => other.to_owned(),
        None => "?".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_names_each_source() {
        let v = serde_json::json!({
            "model.name": {"from": "file", "path": "p.json", "key": "model.base_model", "value": "Org/M"},
            "stage1.epochs": {"from": "flag", "flag": "--epochs", "value": 2},
            "stage1.seed": {"from": "default", "value": 42},
        });
        let t = table("pipeline", &v);
        assert!(t.contains("file p.json (model.base_model)"), "{t}");
        assert!(t.contains("flag --epochs"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("stage1.seed") && l.ends_with("default")),
            "{t}"
        );
    }
}
