//! The corpus built by `scripts/build_corpus.py` (`datasets/corpus/`): its
//! rows, their licences, and that no program duplicates the built-in corpus,
//! the held-out short set, the DED built-in set or HumanEval. The files are
//! built, not committed; without them these tests say SKIPPED.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::repo;
use trace_train::dataset::{Source, builtin, corpus};

/// The corpus files, or None (with a SKIPPED line) when they are not built.
fn parts() -> Option<Vec<(&'static str, PathBuf)>> {
    let dir = corpus::dir();
    let files: Vec<_> = corpus::PARTS
        .iter()
        .map(|p| (*p, dir.join(format!("{p}.jsonl.gz"))))
        .collect();
    if let Some((_, missing)) = files.iter().find(|(_, f)| !f.is_file()) {
        eprintln!(
            "SKIPPED: {} not built (python3 scripts/build_corpus.py; see datasets/corpus/README.md)",
            missing.display()
        );
        return None;
    }
    Some(files)
}

fn raw_rows(path: &PathBuf) -> Vec<serde_json::Value> {
    let f = std::fs::File::open(path).unwrap();
    BufReader::new(flate2::read::GzDecoder::new(f))
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect()
}

#[test]
fn rows_are_complete_unique_and_licensed() {
    let Some(parts) = parts() else { return };
    let mut ids = BTreeSet::new();
    let mut counts = BTreeMap::new();
    let mut short = 0;
    let mut with_stdin = 0;
    for (part, path) in &parts {
        let rows = raw_rows(path);
        counts.insert(*part, rows.len());
        for r in &rows {
            let id = r["id"].as_str().expect("a string id");
            assert!(ids.insert(id.to_owned()), "{id} twice");
            assert!(id.starts_with(&format!("{part}/")), "{id} in {part}");
            assert_eq!(r["source"], *part, "{id}");
            let license = if *part == "mbpp" { "CC-BY-4.0" } else { "MIT" };
            assert_eq!(r["license"], license, "{id}");
            let program = r["program"].as_str().expect("program");
            let output = r["output"].as_str().expect("output");
            assert!(r["inputs"].is_string(), "{id}");
            assert!(
                !program.trim().is_empty() && program.len() <= 10_000,
                "{id}"
            );
            let out = trace_train::reward::python_strip(output);
            assert!(!out.is_empty() && output.len() <= 5_000, "{id}");
            if out.lines().count() <= 3 {
                short += 1;
            }
            if !r["inputs"].as_str().unwrap().is_empty() {
                with_stdin += 1;
            }
        }
    }
    assert!(counts["algorithms"] >= 1500, "{counts:?}");
    assert!(counts["mbpp"] >= 800, "{counts:?}");
    assert!(counts["keon"] >= 120, "{counts:?}");
    assert!(counts["exercism"] >= 50, "{counts:?}");
    let total = ids.len();
    // Outputs of every length, and mostly stdin-driven programs.
    assert!(
        short * 4 >= total,
        "only {short} of {total} print 1-3 lines"
    );
    assert!(
        with_stdin * 2 >= total,
        "only {with_stdin} of {total} read stdin"
    );

    // The `--dataset` source reads the same rows, numbered as one and named
    // by their ids.
    let source = Source::resolve("corpus", "").unwrap();
    assert_eq!(source.count().unwrap() as usize, total);
    let rows: Vec<_> = source.rows().unwrap().map(Result::unwrap).collect();
    assert_eq!(rows.len(), total);
    assert!(rows.iter().enumerate().all(|(i, r)| r.index == i as u64));
    assert!(rows.iter().all(|r| ids.contains(&r.name)));
    let mbpp = Source::resolve("corpus:mbpp", "").unwrap();
    assert_eq!(mbpp.count().unwrap() as usize, counts["mbpp"]);
    assert_eq!(mbpp.describe(), "corpus:mbpp");
}

#[test]
fn the_build_report_and_licences_name_the_same_upstream_commits() {
    let Some(_) = parts() else { return };
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(corpus::dir().join("build_report.json")).unwrap())
            .unwrap();
    let licences = std::fs::read_to_string(repo().join("datasets/corpus/LICENSES.md")).unwrap();
    for part in corpus::PARTS {
        let commit = report["sources"][part]["commit"].as_str().unwrap();
        assert!(
            licences.contains(commit),
            "LICENSES.md does not name {part}'s commit {commit}"
        );
        assert!(report["kept"][part].as_u64().unwrap() > 0);
    }
}

/// Normalises programs as the build script does (docstrings dropped, then
/// `ast.unparse`) and reports, as JSON, the corpus programs that equal a
/// reference program or define a function a reference defines, and the
/// corpus programs that equal each other.
const CHECK: &str = r#"
import ast, hashlib, json, sys
def strip(tree):
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            b = n.body
            if b and isinstance(b[0], ast.Expr) and isinstance(b[0].value, ast.Constant) and isinstance(b[0].value.value, str):
                n.body = b[1:] or [ast.Pass()]
    return tree
def keys(src):
    try:
        t = strip(ast.parse(src))
    except (SyntaxError, ValueError):
        return None, set()
    h = lambda s: hashlib.sha256(s.encode()).hexdigest()
    return h(ast.unparse(t)), {h(ast.unparse(n)) for n in ast.walk(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
data = json.load(sys.stdin)
ref_programs, ref_functions = {}, {}
for name, src in data["refs"]:
    p, fs = keys(src)
    ref_programs.setdefault(p, name)
    for f in fs:
        ref_functions.setdefault(f, name)
seen, same_as_ref, same_function, twice, unparsable = {}, [], [], [], []
for name, src in data["corpus"]:
    p, fs = keys(src)
    if p is None:
        unparsable.append(name)
        continue
    if p in ref_programs:
        same_as_ref.append([name, ref_programs[p]])
    hit = [ref_functions[f] for f in fs if f in ref_functions]
    if hit:
        same_function.append([name, hit[0]])
    if p in seen:
        twice.append([name, seen[p]])
    seen.setdefault(p, name)
print(json.dumps({"same_as_ref": same_as_ref, "same_function": same_function, "twice": twice, "unparsable": unparsable, "refs": len(data["refs"])}))
"#;

#[test]
fn no_program_duplicates_the_builtin_heldout_ded_or_humaneval_sets() {
    let Some(parts) = parts() else { return };
    let mut refs: Vec<(String, String)> = builtin::programs()
        .into_iter()
        .chain(builtin::heldout_short())
        .map(|r| (r.name, r.program))
        .collect();
    let ded = std::fs::read_to_string(repo().join("datasets/ded_builtin/tasks.jsonl")).unwrap();
    for (i, line) in ded
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if let Some(p) = v["program"].as_str() {
            refs.push((format!("ded_builtin line {}", i + 1), p.to_owned()));
        }
    }
    let humaneval = repo().join("target/fixtures/HumanEval.jsonl.gz");
    if humaneval.exists() {
        // The tasks' own functions (prompt and solution), as the build
        // script compares them.
        let f = std::fs::File::open(&humaneval).unwrap();
        for line in BufReader::new(flate2::read::GzDecoder::new(f)).lines() {
            let t: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
            let program = format!(
                "{}{}",
                t["prompt"].as_str().unwrap(),
                t["canonical_solution"].as_str().unwrap()
            );
            refs.push((t["task_id"].as_str().unwrap().to_owned(), program));
        }
    } else {
        eprintln!(
            "SKIPPED (HumanEval part): {} not present (run .ci/run to fetch it)",
            humaneval.display()
        );
    }
    let corpus: Vec<(String, String)> = parts
        .iter()
        .flat_map(|(_, p)| raw_rows(p))
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                r["program"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let input = serde_json::to_vec(&serde_json::json!({"refs": refs, "corpus": corpus})).unwrap();
    let mut child = Command::new("/usr/bin/python3")
        .args(["-I", "-c", CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["refs"].as_u64().unwrap() >= 541, "{v}");
    for key in ["same_as_ref", "same_function", "twice", "unparsable"] {
        assert_eq!(v[key], serde_json::json!([]), "{key}: {}", v[key]);
    }
}
