//! The corpus: stdin programs made from public, permissively licensed
//! sources by `scripts/build_corpus.py`, one gzip'd JSONL file a part in
//! `datasets/corpus/` (rl-python rows: `program`, `inputs`, `output`, plus
//! `id`, `source` and `license`).
//!
//! - `algorithms` (TheAlgorithms/Python, MIT): functions with their
//!   doctests' calls read from stdin, doctest sessions replayed as scripts,
//!   and modules' `__main__` blocks that print.
//! - `mbpp` (MBPP, CC BY 4.0): each task's code with its test asserts'
//!   calls read from stdin.
//! - `keon` (keon/algorithms, MIT) and `exercism` (exercism/python's
//!   example solutions, MIT): functions with their unit tests' calls read
//!   from stdin.
//!
//! `corpus` names every part, `corpus:PART` one. The files are built, not
//! committed (they hold the upstream programs); they are looked for in
//! `$TRACE_TRAIN_CORPUS`, then `datasets/corpus` under the current folder,
//! then in the checkout the binary was built from. Rows are named by their
//! `id` (`mbpp/11`, `algorithms/maths/gcd.py:gcd`), so failures and stats
//! name the program.

use std::path::{Path, PathBuf};

use super::Rows;
use super::jsonl::{self, JsonlRows};

/// The `--dataset` name of the whole corpus; `corpus:PART` names one part.
pub const NAME: &str = "corpus";

/// The parts, in the order `corpus` reads them.
pub const PARTS: [&str; 4] = ["algorithms", "mbpp", "keon", "exercism"];

/// The environment variable naming the folder of the corpus files.
pub const DIR_VAR: &str = "TRACE_TRAIN_CORPUS";

const BUILD_HINT: &str = "build it with `python3 scripts/build_corpus.py` (datasets/corpus/README.md says how), or set TRACE_TRAIN_CORPUS to a folder that has the files";

/// One or more parts of the corpus, read one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct Corpus {
    /// The setting as written (`corpus`, `corpus:mbpp`).
    pub name: String,
    pub files: Vec<PathBuf>,
}

/// Whether a `dataset` setting names the corpus or one of its parts.
pub fn is_corpus(dataset: &str) -> bool {
    dataset == NAME
        || dataset
            .strip_prefix(NAME)
            .is_some_and(|rest| rest.starts_with(':'))
}

/// The folder the corpus files are read from: `$TRACE_TRAIN_CORPUS`, else
/// `datasets/corpus` under the current folder when it exists, else the one
/// of the checkout this binary was built from.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os(DIR_VAR).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let here = Path::new("datasets/corpus");
    if here.is_dir() {
        return here.to_owned();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/corpus")
}

impl Corpus {
    /// Resolves `corpus` or `corpus:PART` in [`dir`].
    pub fn resolve(dataset: &str) -> anyhow::Result<Corpus> {
        Corpus::resolve_in(&dir(), dataset)
    }

    /// Resolves `corpus` or `corpus:PART` in `dir`.
    pub fn resolve_in(dir: &Path, dataset: &str) -> anyhow::Result<Corpus> {
        let parts: Vec<&str> = match dataset.strip_prefix(NAME) {
            Some("") => PARTS.to_vec(),
            Some(rest) if rest.starts_with(':') => {
                let part = &rest[1..];
                anyhow::ensure!(
                    PARTS.contains(&part),
                    "dataset `{dataset}`: the corpus has no part `{part}`\nhint: its parts are {}; `corpus` reads them all",
                    PARTS.join(", ")
                );
                vec![part]
            }
            _ => anyhow::bail!("dataset `{dataset}` does not name the corpus"),
        };
        let files: Vec<PathBuf> = parts
            .iter()
            .map(|p| dir.join(format!("{p}.jsonl.gz")))
            .collect();
        for f in &files {
            anyhow::ensure!(
                f.is_file(),
                "dataset `{dataset}`: `{}` not found\nhint: {BUILD_HINT}",
                f.display()
            );
        }
        Ok(Corpus {
            name: dataset.to_owned(),
            files,
        })
    }

    pub fn count(&self) -> anyhow::Result<u64> {
        self.files.iter().map(|f| jsonl::count_rows(f)).sum()
    }

    /// The rows of every file, numbered as one source and named by id.
    pub fn rows(&self) -> anyhow::Result<Rows> {
        let mut all: Rows = Box::new(std::iter::empty());
        for f in &self.files {
            all = Box::new(all.chain(JsonlRows::open(f)?.named_by_id()));
        }
        Ok(Box::new(all.enumerate().map(|(i, row)| {
            row.map(|mut r| {
                r.index = i as u64;
                r
            })
        })))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn part(dir: &Path, name: &str, ids: &[&str]) {
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(dir.join(format!("{name}.jsonl.gz"))).unwrap(),
            flate2::Compression::default(),
        );
        for id in ids {
            let row = serde_json::json!({
                "id": id, "source": name, "license": "MIT",
                "program": format!("print({:?})", id), "inputs": "", "output": id,
            });
            writeln!(gz, "{row}").unwrap();
        }
        gz.finish().unwrap();
    }

    #[test]
    fn names_resolve_to_parts_and_rows_are_numbered_as_one() {
        let dir = tempfile::tempdir().unwrap();
        part(
            dir.path(),
            "algorithms",
            &["algorithms/a.py:f", "algorithms/b.py:g"],
        );
        part(dir.path(), "mbpp", &["mbpp/1"]);
        assert!(is_corpus("corpus") && is_corpus("corpus:mbpp"));
        assert!(!is_corpus("corpus.jsonl") && !is_corpus("corpusx"));

        part(dir.path(), "keon", &[]);
        part(dir.path(), "exercism", &["exercism/bob:response"]);
        let all = Corpus::resolve_in(dir.path(), "corpus").unwrap();
        assert_eq!(all.files.len(), 4);
        assert_eq!(all.count().unwrap(), 4);
        let rows: Vec<_> = all.rows().unwrap().map(Result::unwrap).collect();
        let names: Vec<_> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "algorithms/a.py:f",
                "algorithms/b.py:g",
                "mbpp/1",
                "exercism/bob:response"
            ]
        );
        assert!(rows.iter().enumerate().all(|(i, r)| r.index == i as u64));
        assert_eq!(rows[2].output.as_deref(), Some("mbpp/1"));

        let one = Corpus::resolve_in(dir.path(), "corpus:mbpp").unwrap();
        assert_eq!(one.count().unwrap(), 1);
        assert_eq!(one.name, "corpus:mbpp");
    }

    #[test]
    fn an_unknown_part_or_a_missing_file_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let e = Corpus::resolve_in(dir.path(), "corpus:nope")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nope") && e.contains("algorithms, mbpp, keon, exercism"),
            "{e}"
        );
        let e = Corpus::resolve_in(dir.path(), "corpus")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithms.jsonl.gz") && e.contains("build_corpus.py"),
            "{e}"
        );
    }
}
