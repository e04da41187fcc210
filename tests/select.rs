//! Checkpoint selection in Stages 1-2 (`select`) through the real binary
//! on the tiny chat model: the adapter scored every few steps by exact
//! match, the best kept in `best/` and put in `final/`; a run killed with
//! SIGKILL and resumed chooses as the uninterrupted one; bad settings are
//! refused naming the key.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use candle_core::{Device, Tensor};
use common::train::{Base, setup, warmup_args};
use common::{start, stderr, trace_train, wait_for_steps};

/// Four short records in `generate`'s layout that the tiny model learns
/// within a few dozen steps.
fn write_small(dir: &Path) {
    let mut text = String::new();
    for (i, answer) in ["7", "42", "ok", "no"].iter().enumerate() {
        let rec = serde_json::json!({
            "messages": [
                {"role": "user", "content": format!("q{i}")},
                {"role": "assistant", "content": answer},
            ],
            "program": format!("q{i}"), "input": "", "expected_output": answer,
            "metadata": {"row_index": i, "seed": null, "output_lines": 1,
                         "features": {"lines": 1, "loop_depth": 0}},
        });
        text.push_str(&format!("{rec}\n"));
    }
    std::fs::write(dir.join("small.jsonl"), text).unwrap();
    std::fs::write(
        dir.join("select.json"),
        serde_json::json!({"select": {
            "metric": "heldout_exact_match", "every_steps": 4, "set": "small.jsonl",
            "max_new_tokens": 8, "batch_size": 4,
        }})
        .to_string(),
    )
    .unwrap();
}

fn args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    args_for(out, "30", extra)
}

fn args_for<'a>(out: &'a str, steps: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut e = vec![
        "--train_file",
        "small.jsonl",
        "--learning_rate",
        "0.01",
        "--config",
        "select.json",
    ];
    e.extend_from_slice(extra);
    warmup_args(out, steps, &e)
}

/// `(step, exact match)` of every scored step in a run's metrics.
fn scored(out: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let em = v["select/exact_match"].as_f64()?;
            let (lo, hi) = (
                v["select/exact_match_lo"].as_f64().unwrap(),
                v["select/exact_match_hi"].as_f64().unwrap(),
            );
            // The Jeffreys interval's ends; at 0/n or n/n it excludes the
            // point estimate.
            assert!(0.0 <= lo && lo < hi && hi <= 1.0, "{v}");
            Some((v["step"].as_u64().unwrap(), em))
        })
        .collect()
}

fn tensors(p: &Path) -> BTreeMap<String, Tensor> {
    candle_core::safetensors::load(p, &Device::Cpu)
        .unwrap()
        .into_iter()
        .collect()
}

fn same(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> bool {
    a.len() == b.len()
        && a.iter().all(|(k, x)| {
            let y = &b[k];
            x.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                == y.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        })
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn the_best_scored_step_is_kept_in_best_and_becomes_final() {
    let dir = setup(Base::Tiny, "").unwrap();
    write_small(dir.path());
    let o = trace_train(dir.path(), &args("out", &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("out");
    let s = scored(&out);
    // Every 4 steps and after the last.
    let steps: Vec<u64> = s.iter().map(|x| x.0).collect();
    assert_eq!(steps, vec![4, 8, 12, 16, 20, 24, 28, 30]);
    // The highest exact match, ties to the earlier step.
    let best = s
        .iter()
        .fold(None::<(u64, f64)>, |b, &(st, em)| match b {
            Some((_, bem)) if em <= bem => b,
            _ => Some((st, em)),
        })
        .unwrap();
    assert!(best.1 > 0.0, "the run learned something: {s:?}");
    let record = json(&out.join("best/select.json"));
    assert_eq!(record["step"], best.0, "{record} {s:?}");
    assert_eq!(record["score"], best.1);
    let train_config = json(&out.join("train_config.json"));
    assert_eq!(train_config["selected"]["step"], best.0, "{train_config}");
    assert_eq!(train_config["selected"]["score"], best.1);
    assert!(stderr(&o).contains(&format!("final/ holds step {}", best.0)));
    // final/ holds best/'s weights; they differ from the last step's
    // (in the last checkpoint) unless the best is the last.
    let fin = tensors(&out.join("final/adapter_model.safetensors"));
    assert!(same(
        &fin,
        &tensors(&out.join("best/adapter_model.safetensors"))
    ));
    let last = tensors(&out.join("checkpoint-30/trainable.safetensors"));
    assert_eq!(
        same(&tensors(&out.join("best/trainable.safetensors")), &last),
        best.0 == 30
    );
    // eval scores final/ as the selection did.
    let e = trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "out/merged",
            "--data",
            "small.jsonl",
            "--output",
            "merged.json",
            "--max_new_tokens",
            "8",
            "--device",
            "cpu",
        ],
    );
    assert!(e.status.success(), "{}", stderr(&e));
    assert_eq!(json(&dir.path().join("merged.json"))["accuracy"], best.1);

    // `last`: the same scores, the same best/, but final/ is the last step.
    let o = trace_train(dir.path(), &args("last", &["--select_metric", "last"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let last_out = dir.path().join("last");
    assert_eq!(scored(&last_out), s);
    assert_eq!(json(&last_out.join("best/select.json"))["step"], best.0);
    assert_eq!(
        json(&last_out.join("train_config.json"))["selected"]["step"],
        30
    );
    assert!(same(
        &tensors(&last_out.join("checkpoint-30/trainable.safetensors")),
        &last
    ));
}

#[test]
fn kill_9_then_resume_chooses_the_step_the_uninterrupted_run_chose() {
    let dir = setup(Base::Tiny, "").unwrap();
    write_small(dir.path());
    // Long enough (steps of milliseconds) for the kill to land mid-run.
    let o = trace_train(dir.path(), &args_for("full", "300", &[]));
    assert!(o.status.success(), "{}", stderr(&o));

    let mut child = start(dir.path(), &args_for("cut", "300", &[]), Stdio::null());
    let metrics = dir.path().join("cut/metrics.jsonl");
    // Past the step-15 checkpoint and the step-16 scoring, before the end.
    wait_for_steps(&metrics, 17, Duration::from_secs(600));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !dir.path().join("cut/final").exists(),
        "killed before the end"
    );

    let o = trace_train(dir.path(), &args_for("cut", "300", &["--resume"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed at"), "{}", stderr(&o));
    let (full, cut) = (dir.path().join("full"), dir.path().join("cut"));
    assert_eq!(scored(&full), scored(&cut));
    assert_eq!(
        json(&full.join("best/select.json")),
        json(&cut.join("best/select.json"))
    );
    assert_eq!(
        json(&full.join("train_config.json"))["selected"],
        json(&cut.join("train_config.json"))["selected"]
    );
    assert_eq!(
        std::fs::read(full.join("final/adapter_model.safetensors")).unwrap(),
        std::fs::read(cut.join("final/adapter_model.safetensors")).unwrap(),
        "final adapters differ"
    );
}

#[test]
fn bad_select_settings_name_the_key_with_a_hint() {
    use trace_train::config::{SftConfig, parse};
    let dir = tempfile::tempdir().unwrap();
    let problems = |select: serde_json::Value| -> String {
        let text = serde_json::json!({ "select": select }).to_string();
        parse::<SftConfig>(&text, &dir.path().join("c.json"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let e = problems(serde_json::json!({"metric": "loss"}));
    assert!(
        e.contains("select.metric: `loss` is not one of") && e.contains("hint:"),
        "{e}"
    );
    let e = problems(serde_json::json!({"every_steps": 0}));
    assert!(
        e.contains("select.every_steps: must be at least 1") && e.contains("hint:"),
        "{e}"
    );
    let e = problems(serde_json::json!({"set": "/nowhere/items.jsonl"}));
    assert!(
        e.contains("select.set: the file `/nowhere/items.jsonl` does not exist")
            && e.contains("hint:"),
        "{e}"
    );
    let e = problems(serde_json::json!({"set": "heldout_long"}));
    assert!(
        e.contains("select.set: `heldout_long` is not one of") && e.contains("hint:"),
        "{e}"
    );
    let e = problems(serde_json::json!({"every_step": 5}));
    assert!(e.contains("unknown field `every_step`"), "{e}");
    // Off by default, and every default is valid.
    assert_eq!(SftConfig::default().select, None);
    assert_eq!(problems(serde_json::json!({})), "");

    // The flags are checked alike, before anything loads.
    let o = trace_train(
        dir.path(),
        &[
            "warmup",
            "--model",
            "base",
            "--select_every_steps",
            "0",
            "--device",
            "cpu",
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("select.every_steps: must be at least 1"),
        "{}",
        stderr(&o)
    );
    let o = trace_train(
        dir.path(),
        &[
            "warmup",
            "--model",
            "base",
            "--select_metric",
            "best",
            "--device",
            "cpu",
        ],
    );
    assert!(
        stderr(&o).contains("select.metric: `best`"),
        "{}",
        stderr(&o)
    );
}
