//! The SFT recipe on a real pretrained model: SmolLM2-135M-Instruct, imported
//! from its GGUF (fetched by `.ci/run`; without it this test says SKIPPED).

mod common;

use common::{repo, stderr, trace_train};

#[test]
fn smollm2_learns_a_small_set_to_full_exact_match() {
    let gguf = repo().join("target/fixtures/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !gguf.exists() {
        eprintln!(
            "*** SKIPPED: {} not present (run .ci/fetch-smollm2.sh) ***",
            gguf.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(
        dir.path(),
        &["model", "import-gguf", gguf.to_str().unwrap(), "smol"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut text = String::new();
    for (i, (q, a)) in [
        ("what is 2+5?", "7"),
        ("forty-two in digits", "42"),
        ("reply ok", "ok"),
        ("opposite of yes", "no"),
    ]
    .iter()
    .enumerate()
    {
        let rec = serde_json::json!({
            "messages": [{"role": "user", "content": format!("q{i}: {q}")}, {"role": "assistant", "content": a}],
            "program": q, "input": "", "expected_output": a,
            "metadata": {"row_index": i, "seed": null, "output_lines": 1, "features": {"lines": 1, "loop_depth": 0}},
        });
        text.push_str(&format!("{rec}\n"));
    }
    std::fs::write(dir.path().join("small.jsonl"), text).unwrap();
    let eval = |model: &str, out: &str| -> serde_json::Value {
        let o = trace_train(
            dir.path(),
            &[
                "eval",
                "--model",
                model,
                "--data",
                "small.jsonl",
                "--output",
                out,
                "--max_new_tokens",
                "8",
                "--device",
                "cpu",
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&std::fs::read(dir.path().join(out)).unwrap()).unwrap()
    };
    let before = eval("smol", "before.json");
    let o = trace_train(
        dir.path(),
        &[
            "warmup",
            "--model",
            "smol",
            "--train_file",
            "small.jsonl",
            "--eval_file",
            "none.jsonl",
            "--output_dir",
            "out",
            "--batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
            "--learning_rate",
            "0.003",
            "--max_steps",
            "8",
            "--save_steps",
            "100",
            "--epochs",
            "100",
            "--device",
            "cpu",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let losses: Vec<f64> = std::fs::read_to_string(dir.path().join("out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert!(losses[losses.len() - 1] < 0.2 * losses[0], "{losses:?}");
    let after = eval("out/merged", "after.json");
    assert!(before["correct"].as_u64().unwrap() < 4, "{before}");
    assert_eq!(after["correct"], 4, "{after}");
}
