//! A training run as other tools see it: its TensorBoard event files read
//! with the `tensorboard` package's own reader (SKIPPED without it), its
//! curve images, and `trace-train report`.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::train::{Base, setup, warmup_args};
use common::{stderr, trace_train};
use trace_train::runlog;

const READER: &str = r#"
import json, sys
from tensorboard.backend.event_processing import event_accumulator
ea = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
"#;

#[test]
fn tensorboard_reads_what_a_training_run_logged_and_report_summarises_it() {
    let dir = setup(Base::Tiny, "").unwrap();
    std::fs::write(dir.path().join("cfg.json"), "{\"eval_steps\": 2}").unwrap();
    let o = trace_train(
        dir.path(),
        &warmup_args(
            "out",
            "5",
            &["--config", "cfg.json", "--eval_file", "train.jsonl"],
        ),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("out");
    let records = runlog::read_metrics(&out.join(runlog::METRICS_FILE)).unwrap();
    assert_eq!(
        records.iter().map(|r| r.step).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    // Each step's share of padded positions, a fraction.
    for r in &records {
        let p = r.values["padding"];
        assert!((0.0..1.0).contains(&p), "padding {p} at step {}", r.step);
    }
    let files = runlog::tfevents::event_files(&out).unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    for f in [
        "loss.png",
        "loss.svg",
        "lr.png",
        "grad_norm.svg",
        "tokens_per_s.png",
    ] {
        assert!(out.join("curves").join(f).is_file(), "no curves/{f}");
    }

    // `report` redraws and summarises.
    std::fs::remove_dir_all(out.join("curves")).unwrap();
    let o = trace_train(dir.path(), &["report", "out"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("steps       1..5 (5 logged)"), "{text}");
    assert!(text.contains("eval loss   last"), "{text}");
    assert!(out.join("curves/loss.png").is_file());

    // TensorBoard's reader.
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let o = Command::new(&python)
        .args(["-c", READER, out.to_str().unwrap()])
        .output()
        .unwrap();
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("No module named") {
        eprintln!(
            "*** SKIPPED tensorboard_reads_what_a_training_run_logged: `{python}` has no `tensorboard` package (pip install tensorboard) ***"
        );
        return;
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seen: BTreeMap<String, Vec<(u64, f64)>> = serde_json::from_slice(&o.stdout).unwrap();
    for tag in [
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "eval/loss",
    ] {
        assert!(seen.contains_key(tag), "no {tag} in {:?}", seen.keys());
    }
    // Every logged value, at its step, once; TensorBoard holds f32.
    for r in &records {
        for (name, &v) in &r.values {
            let tag = runlog::tag(name);
            let at: Vec<f64> = seen[&tag]
                .iter()
                .filter(|(s, _)| *s == r.step)
                .map(|x| x.1)
                .collect();
            assert_eq!(at.len(), 1, "{tag} at step {}: {at:?}", r.step);
            assert!(
                (at[0] - v).abs() <= 1e-6 * v.abs().max(1e-30),
                "{tag} at step {}: {} vs {v}",
                r.step,
                at[0]
            );
        }
    }
    let eval_steps: Vec<u64> = seen["eval/loss"].iter().map(|x| x.0).collect();
    assert_eq!(eval_steps, [2, 4]);
}
