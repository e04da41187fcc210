//! The one list of environments: every name a command line or a config
//! may give (`eval --environment`, `generate --environment`, `task`,
//! `ppo.environment`, mixtures such as `trace:2+abd+ded`), what each reads
//! and how it is built. A new environment is a file beside the others
//! implementing [`Environment`] and one line in [`ENVIRONMENTS`].

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::affine::split::{Part, Split};
use super::affine::{abd::AbdEnv, ded::DedEnv, rows, sat::SatEnv};
use super::answers::{AnswersEnv, Grading};
use super::mixture::Mixture;
use super::{Environment, TraceEnv, WordEnv};
use crate::config::RlConfig;
use crate::dataset::Source;
use crate::sandbox::{self, Executor, ExecutorConfig};

/// The words the `word` environment asks for.
pub const WORDS: [&str; 4] = ["apple", "river", "stone", "cloud"];

/// One environment in the registry.
pub struct Registered {
    /// Its name in `--environment` and `ppo.environment`.
    pub name: &'static str,
    /// Its tasks split into training and held-out parts by
    /// [`super::affine::split`] (Trace keeps held-out programs of its own;
    /// `word` has nothing to hold out).
    pub split: bool,
    build: fn(&mut Builder) -> anyhow::Result<Arc<dyn Environment>>,
}

/// Every environment there is.
pub const ENVIRONMENTS: &[Registered] = &[
    Registered {
        name: "trace",
        split: false,
        build: |b| b.trace(None),
    },
    Registered {
        name: "sat",
        split: true,
        build: |_| Ok(Arc::new(SatEnv)),
    },
    Registered {
        name: "abd",
        split: true,
        build: |b| {
            let data = b.data;
            let rows = rows::load(&data.abd_dataset, &data.hub_file)
                .with_context(|| format!("reading ABD's rows from `{}`", data.abd_dataset))?;
            Ok(Arc::new(AbdEnv::new(Arc::new(rows), b.shared_executor()?)?))
        },
    },
    Registered {
        name: "ded",
        split: true,
        build: |b| {
            let data = b.data;
            let rows = rows::load(&data.ded_dataset, &data.hub_file)
                .with_context(|| format!("reading DED's rows from `{}`", data.ded_dataset))?;
            Ok(Arc::new(DedEnv::new(Arc::new(rows), b.shared_executor()?)?))
        },
    },
    Registered {
        name: "word",
        split: false,
        build: |_| Ok(Arc::new(WordEnv::new(&WORDS))),
    },
    Registered {
        name: "answers",
        split: true,
        build: |b| {
            let grading = Grading::parse(&b.data.answers_reward)?;
            Ok(Arc::new(
                AnswersEnv::load(&b.data.answers_dataset)?.with_grading(grading),
            ))
        },
    },
];

/// The names in [`ENVIRONMENTS`].
pub fn names() -> Vec<&'static str> {
    ENVIRONMENTS.iter().map(|e| e.name).collect()
}

/// Where the environments' data comes from, and how their programs run.
/// Its fields are also the flags of the commands that build environments
/// (`eval`, `generate`, `task`).
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(rename_all = "snake_case")]
pub struct EnvData {
    /// Rows of the trace environment: `builtin`, a JSONL path, a hub id
    /// (as `generate`'s --dataset).
    #[arg(long, default_value_t = EnvData::default().trace_dataset)]
    pub trace_dataset: String,
    /// Rows of ABD (`program`, `inputs`, `output`): `builtin`, a JSONL path
    /// or a hub id; several joined by `+`.
    #[arg(long, default_value_t = EnvData::default().abd_dataset)]
    pub abd_dataset: String,
    /// Rows of DED (`prompt`, `test_cases` or `verification_info`):
    /// `ded-builtin`, `humaneval:PATH`, a JSONL path or a hub id; several
    /// joined by `+`.
    #[arg(long, default_value_t = EnvData::default().ded_dataset)]
    pub ded_dataset: String,
    /// Questions of `answers`: `builtin` (arithmetic word problems made
    /// from the task id) or a JSONL path (GSM8K, MATH, plain or
    /// multiple-choice rows).
    #[arg(long, default_value_t = EnvData::default().answers_dataset)]
    pub answers_dataset: String,
    /// How `answers` rewards a completion: `exact` (1 or 0) or `tiered`
    /// (1 right in the asked form, 0.7 right without it or a number within
    /// 1%, 0.4 the right answer shown but another final, 0.2 a wrong answer
    /// in the asked form, 0 otherwise).
    #[arg(long, default_value_t = EnvData::default().answers_reward)]
    pub answers_reward: String,
    /// The file to read inside a hub dataset.
    #[arg(long, default_value_t = EnvData::default().hub_file)]
    pub hub_file: String,
    /// Interpreter every uid can run.
    #[arg(long, default_value_os_t = EnvData::default().python)]
    pub python: PathBuf,
    /// Sandbox worker slots (default: two a core).
    #[arg(long)]
    pub num_workers: Option<usize>,
    /// Trace: most `__DBG_` prints injected into a program.
    #[arg(long, default_value_t = EnvData::default().max_injections)]
    pub max_injections: usize,
}

impl Default for EnvData {
    fn default() -> Self {
        Self {
            trace_dataset: "builtin".into(),
            abd_dataset: "builtin".into(),
            ded_dataset: "ded-builtin".into(),
            answers_dataset: "builtin".into(),
            answers_reward: "exact".into(),
            hub_file: "python_dataset.jsonl".into(),
            python: PathBuf::from("/usr/bin/python3"),
            num_workers: None,
            max_injections: 6,
        }
    }
}

impl From<&RlConfig> for EnvData {
    /// Stage 3's data keys: the trace part reads `dataset`, ABD
    /// `abd_dataset`, DED `ded_dataset`.
    fn from(c: &RlConfig) -> Self {
        Self {
            trace_dataset: c.dataset.clone(),
            abd_dataset: c.abd_dataset.clone(),
            ded_dataset: c.ded_dataset.clone(),
            answers_dataset: c.answers_dataset.clone(),
            answers_reward: c.answers_reward.clone(),
            hub_file: c.hub_file.clone(),
            python: c.python.clone(),
            num_workers: (c.num_workers > 0).then_some(c.num_workers),
            max_injections: c.max_injections,
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
            ENVIRONMENTS.iter().any(|e| e.name == name),
            "--environment `{spec}`: unknown environment `{name}`\nhint: choose from {}, joined by `+`, each optionally weighted as `abd:2`",
            names().join(", ")
        );
        anyhow::ensure!(
            !out.iter().any(|(n, _)| n == name),
            "--environment `{spec}`: `{name}` is named twice"
        );
        out.push((name.to_owned(), weight));
    }
    Ok(out)
}

/// Whether `spec` reads the trace environment's rows.
pub fn reads_trace(spec: &str) -> anyhow::Result<bool> {
    Ok(parse(spec)?.iter().any(|(n, _)| n == "trace"))
}

/// Builds environments from their data, with the sandbox executors they
/// need: one shared by ABD and DED (made when the first asks), one of its
/// own for Trace.
struct Builder<'a> {
    data: &'a EnvData,
    unsafe_no_sandbox: bool,
    shared: Option<Arc<Executor>>,
}

impl<'a> Builder<'a> {
    fn new(data: &'a EnvData, unsafe_no_sandbox: bool) -> Self {
        Self {
            data,
            unsafe_no_sandbox,
            shared: None,
        }
    }

    fn executor(&self, workers: usize) -> anyhow::Result<Executor> {
        Executor::new(ExecutorConfig::new(
            &self.data.python,
            workers,
            self.unsafe_no_sandbox,
        ))
        .context("ABD, DED and trace run programs in the sandbox")
    }

    fn workers(&self) -> usize {
        self.data
            .num_workers
            .unwrap_or_else(sandbox::default_workers)
    }

    fn shared_executor(&mut self) -> anyhow::Result<Arc<Executor>> {
        if let Some(e) = &self.shared {
            return Ok(Arc::clone(e));
        }
        let e = Arc::new(self.executor(self.workers())?);
        self.shared = Some(Arc::clone(&e));
        Ok(e)
    }

    /// The trace environment on its dataset, with `workers` slots (None:
    /// the data's).
    fn trace(&mut self, workers: Option<usize>) -> anyhow::Result<Arc<dyn Environment>> {
        Ok(Arc::new(self.trace_env(workers)?.0))
    }

    fn trace_env(&mut self, workers: Option<usize>) -> anyhow::Result<(TraceEnv, String)> {
        let data = self.data;
        let source = Source::resolve(&data.trace_dataset, &data.hub_file)?;
        let rows = source
            .rows()?
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("reading the rows of `{}`", source.describe()))?;
        let n = rows.len();
        let exec = self.executor(workers.unwrap_or_else(|| self.workers()))?;
        let env = TraceEnv::new(rows, exec, data.max_injections)?.with_dataset(source.describe());
        Ok((
            env,
            format!(
                "trace:{} rows:{n} max_injections:{}",
                source.describe(),
                data.max_injections
            ),
        ))
    }
}

/// Builds the environments `names` from `data`; those that split (SAT,
/// ABD, DED) seen through `part`, their training or held-out tasks.
pub fn build(
    names: &[String],
    data: &EnvData,
    unsafe_no_sandbox: bool,
    part: Part,
) -> anyhow::Result<Vec<Arc<dyn Environment>>> {
    let mut b = Builder::new(data, unsafe_no_sandbox);
    let mut envs: Vec<Arc<dyn Environment>> = Vec::new();
    for name in names {
        let Some(entry) = ENVIRONMENTS.iter().find(|e| e.name == name) else {
            anyhow::bail!(
                "unknown environment `{name}`\nhint: choose from {}",
                self::names().join(", ")
            );
        };
        let env = (entry.build)(&mut b)?;
        envs.push(if entry.split && part != Part::All {
            Arc::new(Split::new(env, part))
        } else {
            env
        });
    }
    Ok(envs)
}

/// The environment a training run draws its tasks from, as `spec` names it
/// (`ppo.environment`), and its description for the resume check: one
/// environment, or a weighted mixture of their training tasks.
/// `trace_workers` is the trace environment's slots when it runs alone
/// (the ranks of a several-GPU run share the host's cores).
pub fn for_training(
    spec: &str,
    data: &EnvData,
    unsafe_no_sandbox: bool,
    trace_workers: usize,
) -> anyhow::Result<(Arc<dyn Environment>, String)> {
    match spec {
        "word" => Ok((
            Arc::new(WordEnv::new(&WORDS)),
            format!("word:{}", WORDS.join(",")),
        )),
        "trace" => {
            let (env, description) =
                Builder::new(data, unsafe_no_sandbox).trace_env(Some(trace_workers))?;
            Ok((Arc::new(env), description))
        }
        spec => {
            let named = parse(spec)?;
            let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
            // Training tasks only: the held-out ones are `eval --environment`'s.
            let envs = build(&names, data, unsafe_no_sandbox, Part::Train)?;
            let mixture = Mixture::new(
                envs.into_iter()
                    .zip(named.iter().map(|(_, w)| *w))
                    .collect(),
            )?;
            // Rows other than the defaults named, so a checkpoint of a
            // default mixture keeps its description.
            let d = EnvData::default();
            let mut text = format!("mixture:{spec} trace_rows:{}", data.trace_dataset);
            if data.abd_dataset != d.abd_dataset {
                text += &format!(" abd_rows:{}", data.abd_dataset);
            }
            if data.ded_dataset != d.ded_dataset {
                text += &format!(" ded_rows:{}", data.ded_dataset);
            }
            if data.answers_dataset != d.answers_dataset {
                text += &format!(" answers_rows:{}", data.answers_dataset);
            }
            if data.answers_reward != d.answers_reward {
                text += &format!(" answers_reward:{}", data.answers_reward);
            }
            Ok((Arc::new(mixture), text))
        }
    }
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

    #[test]
    fn every_registered_environment_builds_and_names_itself() {
        // Those that need no sandbox or data here: the others are built by
        // the sandbox tests (tests/affine_envs.rs, tests/rl.rs).
        for name in ["sat", "word"] {
            let envs = build(&[name.into()], &EnvData::default(), false, Part::All).unwrap();
            assert_eq!(envs[0].name(), name);
        }
        let mut seen = std::collections::BTreeSet::new();
        assert!(ENVIRONMENTS.iter().all(|e| seen.insert(e.name)));
    }
}
