//! `pipeline --quick_test` end to end on a fresh folder, offline: Stage 0 on
//! the built-in corpus, Stages 1-3 on the tiny chat model, eval; then a
//! `--resume` that finds everything done.

mod common;

use std::time::Instant;

use common::{stderr, trace_train};

#[test]
fn quick_test_runs_every_stage_and_resume_skips_finished_ones() {
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(dir.path(), &["pipeline", "--quick_test", "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let root = dir.path().join("checkpoints/quick");
    for f in [
        "data/stage1_original_train.jsonl",
        "data/stage2_transformed_train.jsonl",
        "warmup/final/adapter_model.safetensors",
        "warmup/merged/model.safetensors",
        "sft/final/adapter_config.json",
        "sft/merged/tokenizer.json",
        "stage3_ppo/final/adapter_model.safetensors",
        "stage3_ppo/merged/model.safetensors",
        "stage3_ppo/metrics.jsonl",
        "eval/report.json",
        "eval/heldout_short.json",
    ] {
        assert!(root.join(f).exists(), "missing {f}\n{}", stderr(&o));
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("eval/report.json")).unwrap()).unwrap();
    assert!(report["n"].as_u64().unwrap() >= 2, "{report}");
    assert!(
        report["interval"]["lo"].as_f64().unwrap() <= report["interval"]["hi"].as_f64().unwrap()
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("pipeline_state.json")).unwrap()).unwrap();
    assert_eq!(state["finished"], serde_json::json!([0, 1, 2, 3, 4]));

    let t = Instant::now();
    let before = std::fs::read(root.join("sft/final/adapter_model.safetensors")).unwrap();
    let o = trace_train(
        dir.path(),
        &["pipeline", "--quick_test", "--resume", "--device", "cpu"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("== stage"),
        "a finished stage ran again: {}",
        stderr(&o)
    );
    assert!(t.elapsed().as_secs() < 20);
    assert_eq!(
        before,
        std::fs::read(root.join("sft/final/adapter_model.safetensors")).unwrap()
    );
}
