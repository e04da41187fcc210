//! The one list of environments: every name a command line or a config
//! may give (`eval --environment`, `generate --environment`, `task`,
//! `ppo.environment`, mixtures such as `trace:2+abd+ded`), what each reads
//! and how it is built. A new environment is a file beside the others
//! implementing [`Environment`] and one line in [`ENVIRONMENTS`].

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use sha2::Digest;

use super::affine::split::{Part, Split};
use super::affine::{abd::AbdEnv, ded::DedEnv, rows, sat::SatEnv};
use super::answers::{AnswersEnv, Grading};
use super::http::HttpEnv;
use super::mixture::Mixture;
use super::python::PythonEnv;
use super::{Environment, TraceEnv, WordEnv, WordStepsEnv};
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
    /// What may follow its name after a `:`.
    pub arg: Arg,
    build: BuildFn,
}

/// How an entry is built: from the shared builder and what followed its
/// name in the spec.
type BuildFn = fn(&mut Builder, Option<&str>) -> anyhow::Result<Arc<dyn Environment>>;

/// What follows an environment's name in a spec (`name:ARG`).
pub enum Arg {
    /// Nothing (a number there is the weight).
    None,
    /// Optionally this (what it stands for).
    Optional(&'static str),
    /// Always this.
    Required(&'static str),
}

/// Every environment there is.
pub const ENVIRONMENTS: &[Registered] = &[
    Registered {
        name: "trace",
        split: false,
        arg: Arg::None,
        build: |b, _| b.trace(None),
    },
    Registered {
        name: "sat",
        split: true,
        arg: Arg::None,
        build: |_, _| Ok(Arc::new(SatEnv)),
    },
    Registered {
        name: "abd",
        split: true,
        arg: Arg::None,
        build: |b, _| {
            let data = b.data;
            let rows = rows::load(&data.abd_dataset, &data.hub_file)
                .with_context(|| format!("reading ABD's rows from `{}`", data.abd_dataset))?;
            Ok(Arc::new(AbdEnv::new(Arc::new(rows), b.shared_executor()?)?))
        },
    },
    Registered {
        name: "ded",
        split: true,
        arg: Arg::None,
        build: |b, _| {
            let data = b.data;
            let rows = rows::load(&data.ded_dataset, &data.hub_file)
                .with_context(|| format!("reading DED's rows from `{}`", data.ded_dataset))?;
            Ok(Arc::new(DedEnv::new(Arc::new(rows), b.shared_executor()?)?))
        },
    },
    Registered {
        name: "word",
        split: false,
        arg: Arg::None,
        build: |_, _| Ok(Arc::new(WordEnv::new(&WORDS))),
    },
    Registered {
        name: "word_steps",
        split: true,
        arg: Arg::None,
        build: |_, _| Ok(Arc::new(WordStepsEnv::new(&WORDS, 3))),
    },
    Registered {
        name: "answers",
        split: true,
        arg: Arg::Optional("its questions' JSONL file, in place of `answers_dataset`"),
        build: |b, file| {
            let grading = Grading::parse(&b.data.answers_reward)?;
            let rows = file.unwrap_or(&b.data.answers_dataset);
            let env = AnswersEnv::load(rows)?.with_grading(grading);
            // `answers:FILE` keeps its file in its name, as `python:FILE`
            // does: two question sets in a mixture are two environments.
            Ok(Arc::new(match file {
                Some(f) => env.named(&format!("answers:{f}")),
                None => env,
            }))
        },
    },
    Registered {
        name: "python",
        split: true,
        arg: Arg::Required("a Python file, as `python:my_env.py`"),
        build: |b, file| b.python(file.unwrap_or_default()),
    },
    Registered {
        name: "http",
        split: true,
        arg: Arg::Required("the server's URL"),
        build: |_, url| Ok(Arc::new(HttpEnv::connect(url.unwrap_or_default())?)),
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

/// One environment a spec names: `abd`, `abd:2` (weighted),
/// `answers:gsm.jsonl` (with its argument), `answers:gsm.jsonl:2`, or a URL
/// (`http://localhost:36001`, weighted `http://localhost:36001:2`).
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    /// Its name in [`ENVIRONMENTS`] (`http` for a URL).
    pub name: String,
    /// What follows the name (the whole URL for `http`).
    pub arg: Option<String>,
    pub weight: f64,
}

impl Named {
    /// How logs, metrics and reports name it: `abd`, `python:my.py`, the URL.
    pub fn label(&self) -> String {
        match (&self.arg, self.name.as_str()) {
            (Some(url), "http") => url.clone(),
            (Some(arg), name) => format!("{name}:{arg}"),
            (None, name) => name.to_owned(),
        }
    }
}

/// A weight written after a last `:`, when it is a number.
fn trailing_weight(part: &str) -> Option<(&str, &str)> {
    let (body, w) = part.rsplit_once(':')?;
    w.parse::<f64>().is_ok().then_some((body, w))
}

/// `sat+abd:2+ded` (or commas) → each environment with its argument and
/// weight (1 when not given).
pub fn parse(spec: &str) -> anyhow::Result<Vec<Named>> {
    let mut out: Vec<Named> = Vec::new();
    for part in spec.split(['+', ',']) {
        let url = part.starts_with("http://") || part.starts_with("https://");
        // A URL's port is not a weight: a weight follows the port.
        let (body, weight) = match trailing_weight(part) {
            Some((body, w))
                if !url || body.split_once("://").is_some_and(|(_, r)| r.contains(':')) =>
            {
                (body, Some(w))
            }
            _ => (part, None),
        };
        let (name, arg) = if url {
            ("http", Some(body.to_owned()))
        } else {
            match body.split_once(':') {
                Some((n, a)) => (n, Some(a.to_owned())),
                None => (body, None),
            }
        };
        let weight = match weight {
            None => 1.0,
            Some(w) => w
                .parse()
                .ok()
                .filter(|w: &f64| w.is_finite() && *w > 0.0)
                .with_context(|| {
                    format!(
                        "--environment `{spec}`: weight `{w}` of `{body}` is not a number above 0"
                    )
                })?,
        };
        let Some(entry) = ENVIRONMENTS.iter().find(|e| e.name == name) else {
            anyhow::bail!(
                "--environment `{spec}`: unknown environment `{name}`\nhint: choose from {}, joined by `+`, each optionally weighted as `abd:2`",
                names().join(", ")
            );
        };
        match (&entry.arg, &arg) {
            (Arg::None, Some(a)) => anyhow::bail!(
                "--environment `{spec}`: `{name}` takes no argument, but `{a}` follows it\nhint: a weight is a number above 0, as `{name}:2`"
            ),
            (Arg::Required(what), None) => {
                anyhow::bail!("--environment `{spec}`: `{name}` needs {what}, as `{name}:ARG`")
            }
            (_, Some(a)) if a.is_empty() => {
                anyhow::bail!("--environment `{spec}`: `{name}:` is followed by nothing")
            }
            _ => {}
        }
        let named = Named {
            name: name.to_owned(),
            arg,
            weight,
        };
        anyhow::ensure!(
            !out.iter().any(|n| n.label() == named.label()),
            "--environment `{spec}`: `{}` is named twice",
            named.label()
        );
        out.push(named);
    }
    Ok(out)
}

/// Whether `spec` reads the trace environment's rows.
pub fn reads_trace(spec: &str) -> anyhow::Result<bool> {
    Ok(parse(spec)?.iter().any(|n| n.name == "trace"))
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

    /// The environment of the Python file `file`, with its own sandbox
    /// slots (one session each): the data's workers, at most 8 unless set.
    fn python(&self, file: &str) -> anyhow::Result<Arc<dyn Environment>> {
        let workers = self
            .data
            .num_workers
            .unwrap_or_else(|| sandbox::default_workers().min(8));
        let exec = Executor::new(ExecutorConfig::new(
            &self.data.python,
            workers,
            self.unsafe_no_sandbox,
        ))
        .with_context(|| format!("the Python environment `{file}` runs in the sandbox"))?;
        Ok(Arc::new(PythonEnv::new(
            std::path::Path::new(file),
            &format!("python:{file}"),
            exec,
        )?))
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
    named: &[Named],
    data: &EnvData,
    unsafe_no_sandbox: bool,
    part: Part,
) -> anyhow::Result<Vec<Arc<dyn Environment>>> {
    let mut b = Builder::new(data, unsafe_no_sandbox);
    let mut envs: Vec<Arc<dyn Environment>> = Vec::new();
    for n in named {
        let Some(entry) = ENVIRONMENTS.iter().find(|e| e.name == n.name) else {
            anyhow::bail!(
                "unknown environment `{}`\nhint: choose from {}",
                n.name,
                self::names().join(", ")
            );
        };
        let env = (entry.build)(&mut b, n.arg.as_deref())?;
        // Reports, metrics and `compare` tell environments apart by name.
        if let Some(k) = envs.iter().position(|e| e.name() == env.name()) {
            anyhow::bail!(
                "--environment: `{}` and `{}` are both named `{}` in reports and metrics\nhint: an `http://` environment is named by its server's address without the `?` settings; give each its own server or port",
                named[k].label(),
                n.label(),
                env.name()
            );
        }
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
            // Training tasks only: the held-out ones are `eval --environment`'s.
            let envs = build(&named, data, unsafe_no_sandbox, Part::Train)?;
            let mixture = Mixture::new(
                envs.into_iter()
                    .zip(named.iter().map(|n| n.weight))
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
            // A `python:` file's content: a resume with an edited file
            // would score the same task ids otherwise.
            for n in named.iter().filter(|n| n.name == "python") {
                let file = n.arg.as_deref().unwrap_or_default();
                let bytes = std::fs::read(file)
                    .with_context(|| format!("cannot read the Python environment `{file}`"))?;
                let digest = sha2::Sha256::digest(&bytes);
                text += &format!(" {}:sha256:{}", n.label(), crate::hex(&digest[..8]));
            }
            Ok((Arc::new(mixture), text))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_lists_parse_with_weights() -> anyhow::Result<()> {
        let pairs = |spec: &str| -> Vec<(String, f64)> {
            parse(spec)
                .unwrap()
                .iter()
                .map(|n| (n.label(), n.weight))
                .collect()
        };
        assert_eq!(
            pairs("trace+abd:2,ded"),
            [
                ("trace".into(), 1.0),
                ("abd".into(), 2.0),
                ("ded".into(), 1.0)
            ]
        );
        // Arguments, with and without a weight.
        assert_eq!(
            pairs("answers:gsm.jsonl:2+sat:0.5"),
            [("answers:gsm.jsonl".into(), 2.0), ("sat".into(), 0.5)]
        );
        let a = &parse("answers")?[0];
        assert_eq!((a.name.as_str(), a.arg.as_deref()), ("answers", None));
        let a = &parse("answers:data/q.jsonl")?[0];
        assert_eq!(a.arg.as_deref(), Some("data/q.jsonl"));
        for bad in [
            "sat+", "foo", "abd:0", "abd:x", "sat+sat", "answers:", "sat:x:2",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(format!("{:#}", parse("foo").unwrap_err()).contains("hint:"));
        Ok(())
    }

    #[test]
    fn every_registered_environment_builds_and_names_itself() {
        // Those that need no sandbox or data here: the others are built by
        // the sandbox tests (tests/affine_envs.rs, tests/rl.rs).
        for name in ["sat", "word", "word_steps"] {
            let envs = build(&parse(name).unwrap(), &EnvData::default(), false, Part::All).unwrap();
            assert_eq!(envs[0].name(), name);
        }
        let mut seen = std::collections::BTreeSet::new();
        assert!(ENVIRONMENTS.iter().all(|e| seen.insert(e.name)));
    }

    #[test]
    fn a_question_file_names_its_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("q.jsonl");
        std::fs::write(&file, "{\"question\": \"1 + 1?\", \"answer\": \"2\"}\n").unwrap();
        let spec = format!("answers+answers:{}:2", file.display());
        let envs = build(
            &parse(&spec).unwrap(),
            &EnvData::default(),
            false,
            Part::All,
        )
        .unwrap();
        let names: Vec<&str> = envs.iter().map(|e| e.name()).collect();
        assert_eq!(
            names,
            ["answers".to_owned(), format!("answers:{}", file.display())]
        );
        // Through the held-out split too (its name is the inner one's).
        let held = build(
            &parse(&spec).unwrap(),
            &EnvData::default(),
            false,
            Part::HeldOut,
        )
        .unwrap();
        assert_eq!(held[1].name(), names[1]);
    }
}
