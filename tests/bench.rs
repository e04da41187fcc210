//! `bench rl` through the binary on the CPU: one JSON line on stdout with
//! the step's time split, on random weights of the tiny shape and on a
//! model folder; a bad size is refused naming its flag.

mod common;

use common::{stderr, trace_train};

fn json_line(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line on stdout: {out}");
    serde_json::from_str(lines[0]).unwrap()
}

fn assert_a_step(v: &serde_json::Value, algorithm: &str, group: u64) {
    assert_eq!(v["job"], "rl_step");
    // Minibatches of 16 hold the step's 2 x group completions whole.
    assert_eq!(v["mini_batch"], 2 * group);
    assert_eq!(v["minibatches"], 1);
    assert_eq!(v["algorithm"], algorithm);
    assert_eq!(
        (&v["batch"], &v["group"], &v["prompt"], &v["new"]),
        (
            &serde_json::json!(2),
            &serde_json::json!(group),
            &serde_json::json!(8),
            &serde_json::json!(4)
        )
    );
    for k in [
        "sample_s",
        "score_s",
        "old_ref_s",
        "update_s",
        "step_s",
        "warmup_step_s",
        "new_tokens_per_s",
        "tokens_per_s",
    ] {
        let x = v[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {v}"));
        assert!(x.is_finite() && x >= 0.0, "{k}: {x}");
    }
    let parts: f64 = ["sample_s", "score_s", "old_ref_s", "update_s"]
        .iter()
        .map(|k| v[k].as_f64().unwrap())
        .sum();
    assert!((v["step_s"].as_f64().unwrap() - parts).abs() < 1e-6, "{v}");
    // tokens/s counts every sequence's prompt and answer over the step.
    let want = (2 * group * (8 + 4)) as f64 / v["step_s"].as_f64().unwrap();
    assert!((v["tokens_per_s"].as_f64().unwrap() - want).abs() < 1e-6 * want);
    // No device pool on the CPU: no peak memory.
    assert!(v.get("peak_mem_gib").is_none(), "{v}");
}

#[test]
fn bench_rl_prints_one_json_line_with_the_time_split() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench", "rl", "--model", "tiny", "--batch", "2", "--group", "2", "--prompt", "8", "--new",
        "4", "--device", "cpu",
    ];
    let v = json_line(&trace_train(dir.path(), &args));
    assert_a_step(&v, "ppo", 2);
    assert_eq!(v["model"], "tiny");

    // GRPO on a model folder, its own tokenizer.
    let folder = dir.path().join("tiny model");
    let o = trace_train(dir.path(), &["model", "tiny", folder.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut grpo = args.to_vec();
    grpo[3] = folder.to_str().unwrap();
    grpo.extend(["--algorithm", "grpo"]);
    assert_a_step(&json_line(&trace_train(dir.path(), &grpo)), "grpo", 2);
}

#[test]
fn bench_rl_refuses_a_bad_size_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(
        dir.path(),
        &[
            "bench",
            "rl",
            "--model",
            "tiny",
            "--algorithm",
            "grpo",
            "--group",
            "1",
            "--device",
            "cpu",
        ],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("--group 1") && e.contains("hint:"), "{e}");
    assert!(o.stdout.is_empty());
    let o = trace_train(
        dir.path(),
        &["bench", "rl", "--model", "gpt2", "--device", "cpu"],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown model shape `gpt2`"),
        "{}",
        stderr(&o)
    );
}
