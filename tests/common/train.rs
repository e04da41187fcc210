//! Training-test fixtures: a base model in a fresh folder, a few records,
//! and the `warmup` command line the tests share.

use std::path::Path;

use super::{repo, stderr, trace_train};

/// The base model a training test runs on.
#[derive(Clone, Copy, Debug)]
pub enum Base {
    /// The tiny random Qwen3 chat model `trace-train model tiny` writes.
    Tiny,
    /// SmolLM2-135M-Instruct imported from the GGUF `.ci/run` fetches.
    SmolLM2,
}

/// The SmolLM2 GGUF, or `None` after saying the test is skipped.
pub fn smollm2_gguf(test: &str) -> Option<std::path::PathBuf> {
    let gguf = repo().join("target/fixtures/SmolLM2-135M-Instruct.Q4_1.gguf");
    if gguf.exists() {
        Some(gguf)
    } else {
        eprintln!(
            "*** SKIPPED {test}: {} not present (run .ci/fetch-smollm2.sh) ***",
            gguf.display()
        );
        None
    }
}

/// A temporary folder holding SmolLM2-135M-Instruct imported from its GGUF
/// as `smol/`; `None` (and SKIPPED) where the GGUF is not fetched.
pub fn smollm2_folder(test: &str) -> Option<tempfile::TempDir> {
    let gguf = smollm2_gguf(test)?;
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(
        dir.path(),
        &["model", "import_gguf", gguf.to_str().unwrap(), "smol"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    Some(dir)
}

/// A few short chat records, like `generate` writes them.
pub fn write_records(path: &Path, n: usize) {
    let mut text = String::new();
    for i in 0..n {
        let prompt = format!("print({i} * 3)");
        let rec = serde_json::json!({
            "messages": [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": format!("{}", i * 3)},
            ],
            "program": prompt,
            "input": "",
            "expected_output": format!("{}", i * 3),
            "metadata": {"row_index": i},
        });
        text.push_str(&format!("{rec}\n"));
    }
    std::fs::write(path, text).unwrap();
}

/// A fresh folder holding the base model at `base/` and eight records at
/// `train.jsonl`; `None` when the model's fixture is missing (skipped).
pub fn setup(base: Base, test: &str) -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().unwrap();
    let o = match base {
        Base::Tiny => trace_train(dir.path(), &["model", "tiny", "base"]),
        Base::SmolLM2 => {
            let gguf = smollm2_gguf(test)?;
            trace_train(
                dir.path(),
                &["model", "import_gguf", gguf.to_str().unwrap(), "base"],
            )
        }
    };
    assert!(o.status.success(), "{}", stderr(&o));
    write_records(&dir.path().join("train.jsonl"), 8);
    Some(dir)
}

/// `warmup` with the tests' defaults; `extra` flags replace a default of
/// the same name or are added.
pub fn warmup_args<'a>(out: &'a str, steps: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let defaults = [
        ("--model", "base"),
        ("--train_file", "train.jsonl"),
        ("--eval_file", "none.jsonl"),
        ("--output_dir", out),
        ("--batch_size", "4"),
        ("--gradient_accumulation_steps", "1"),
        ("--learning_rate", "0.003"),
        ("--max_steps", steps),
        ("--save_steps", "3"),
        ("--device", "cpu"),
        ("--epochs", "100"),
    ];
    let mut v = vec!["warmup"];
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            v.extend([flag, value]);
        }
    }
    v.extend_from_slice(extra);
    v
}

/// `(step, loss, grad_norm)` of every line of a metrics file.
pub fn losses(path: &Path) -> Vec<(u64, f64, f64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap(),
                v["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}
