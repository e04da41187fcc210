//! `pipeline --quick_test` end to end on a fresh folder, offline, with the
//! Python pipeline's own `config/pipeline_config.json`: Stage 0 on the
//! built-in corpus, Stages 1-3 on the tiny chat model, eval; then a
//! `--resume` that finds everything done.

mod common;

use std::time::Instant;

use common::{signal, start, stderr, trace_train, wait_for_steps};

#[test]
fn quick_test_runs_every_stage_and_resume_skips_finished_ones() {
    let dir = tempfile::tempdir().unwrap();
    // The Python pipeline's file, exactly as its users have it.
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/pipeline_config.json"),
        include_str!("fixtures/user_pipeline_config.json"),
    )
    .unwrap();
    let o = trace_train(dir.path(), &["pipeline", "--quick_test", "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first = o.clone();
    let root = dir.path().join("checkpoints/quick");
    for f in [
        "data/stage1_original_train.jsonl",
        "data/stage2_transformed_train.jsonl",
        "stage1_warmup/final/adapter_model.safetensors",
        "stage1_warmup/final/README.md",
        "stage1_warmup/merged/model.safetensors",
        "stage1_warmup/merged/generation_config.json",
        "stage2_sft/final/adapter_config.json",
        "stage2_sft/merged/tokenizer.json",
        "stage2_sft/merged/README.md",
        "stage3_ppo/final/adapter_model.safetensors",
        "stage3_ppo/final/README.md",
        "stage3_ppo/merged/model.safetensors",
        "stage3_ppo/metrics.jsonl",
        "eval/report.json",
        "eval/heldout_short.json",
    ] {
        assert!(root.join(f).exists(), "missing {f}\n{}", stderr(&o));
    }
    // Stage names in messages stay short.
    assert!(stderr(&o).contains("== stage 1: warmup"), "{}", stderr(&o));
    // The run records its settings and where each came from.
    let resolved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("resolved_config.json")).unwrap()).unwrap();
    assert_eq!(resolved["stage0.num_workers"]["value"], 32);
    assert_eq!(resolved["stage0.num_workers"]["from"], "file");
    assert_eq!(resolved["stage3.ppo.num_train_steps"]["value"], 5000);
    assert_eq!(resolved["hardware.b200_mode"]["value"], true);
    assert_eq!(resolved["stage1.batch_size"]["flag"], "--quick_test");
    // Stage 2 trained from Stage 1's merged model in the user's layout.
    // Lineage: each adapter names its base by an absolute path that PEFT
    // follows from any folder; each merged model's card names the model the
    // pipeline began from.
    let adapter_base = |stage: &str| -> String {
        let a: serde_json::Value = serde_json::from_slice(
            &std::fs::read(root.join(stage).join("final/adapter_config.json")).unwrap(),
        )
        .unwrap();
        a["base_model_name_or_path"].as_str().unwrap().to_owned()
    };
    for (stage, base) in [
        ("stage2_sft", "stage1_warmup/merged"),
        ("stage3_ppo", "stage2_sft/merged"),
    ] {
        let named = adapter_base(stage);
        assert!(
            std::path::Path::new(&named).is_absolute()
                && std::path::Path::new(&named).join("config.json").is_file()
                && named.ends_with(base),
            "{stage}: {named}"
        );
    }
    let origin = adapter_base("stage1_warmup");
    assert!(std::path::Path::new(&origin).is_absolute(), "{origin}");
    for stage in ["stage1_warmup", "stage2_sft", "stage3_ppo"] {
        let card = std::fs::read_to_string(root.join(stage).join("merged/README.md")).unwrap();
        let want = format!("base_model: {}", serde_json::to_string(&origin).unwrap());
        assert!(card.lines().any(|l| l == want), "{stage}: {card}");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("eval/report.json")).unwrap()).unwrap();
    assert!(report["n"].as_u64().unwrap() >= 2, "{report}");
    assert!(
        report["interval"]["lo"].as_f64().unwrap() <= report["interval"]["hi"].as_f64().unwrap()
    );
    // Every training stage leaves TensorBoard events and its curves.
    assert!(!stderr(&o).contains("curves not drawn"), "{}", stderr(&o));
    assert!(root.join("stage3_ppo/curves/reward.png").is_file());
    // One page with the run's main charts; none for a scalar that never
    // moved.
    assert!(root.join("stage3_ppo/curves/overview.png").is_file());
    assert!(!root.join("stage3_ppo/curves/world_size.png").exists());
    // `report` on an RL run speaks of its reward, not of a loss it has not.
    let r = trace_train(dir.path(), &["report", "checkpoints/quick/stage3_ppo"]);
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success() && text.contains("  reward      first ") && !text.contains("  loss "),
        "{text}{}",
        stderr(&r)
    );
    // The run ends with a summary on stdout: the time of each part, the
    // final model, what to run next.
    let out = String::from_utf8_lossy(&first.stdout);
    for want in [
        "pipeline done in ",
        "stage 1 (warmup) ",
        "final model: checkpoints/quick/stage3_ppo/merged",
        "next: ",
    ] {
        assert!(out.contains(want), "missing {want}: {out}");
    }
    for stage in ["stage1_warmup", "stage2_sft", "stage3_ppo"] {
        let names: Vec<String> = std::fs::read_dir(root.join(stage))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("events.out.tfevents.")),
            "{stage}: {names:?}"
        );
        assert!(
            root.join(stage).join("curves").read_dir().unwrap().count() > 0,
            "{stage}: no curves"
        );
    }
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("pipeline_state.json")).unwrap()).unwrap();
    assert_eq!(state["finished"], serde_json::json!([0, 1, 2, 3, 4]));
    // The folder is marked as the quick test's, and no run's lock is left.
    assert!(root.join(".trace-train-quick-test").is_file());
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            assert_ne!(p.file_name().unwrap(), ".lock", "left: {}", p.display());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    // The gate (default `warn`) scored the base model and every stage's on
    // its three sets and compared each stage with the model before it.
    let gate: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("gate.json")).unwrap()).unwrap();
    assert_eq!(gate["mode"], "warn", "{gate}");
    let stages: Vec<(u64, &str)> = gate["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["stage"].as_u64().unwrap(), s["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        stages,
        [(0, "base"), (1, "warmup"), (2, "sft"), (3, "ppo")],
        "{gate}"
    );
    for s in gate["stages"].as_array().unwrap() {
        let sets: Vec<&str> = s["sets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x[0].as_str().unwrap())
            .collect();
        assert_eq!(
            sets,
            ["heldout_short", "original_test", "transformed_test"],
            "{gate}"
        );
        // The quick test's gate reads 4 items a set.
        assert!(
            s["sets"].as_array().unwrap().iter().all(|x| x[1]["n"] == 4),
            "{gate}"
        );
    }
    let cmp: Vec<(u64, u64)> = gate["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["stage"].as_u64().unwrap(), c["against"].as_u64().unwrap()))
        .collect();
    assert_eq!(cmp, [(1, 0), (2, 1), (3, 2)], "{gate}");
    // Each set of each comparison item by item, from the two reports: the
    // items gained and lost are at most the set's 4, and the counts agree
    // with the change in correct answers.
    for c in gate["comparisons"].as_array().unwrap() {
        for x in c["sets"].as_array().unwrap() {
            let items = &x["items"];
            let (gained, lost) = (items["gained"].as_i64(), items["lost"].as_i64());
            let (Some(gained), Some(lost)) = (gained, lost) else {
                panic!("no items: {x}")
            };
            assert!(gained + lost <= 4, "{x}");
            let change =
                x["after"]["correct"].as_i64().unwrap() - x["before"]["correct"].as_i64().unwrap();
            assert_eq!(gained - lost, change, "{x}");
            let p = items["p_value"].as_f64().unwrap();
            assert!(p > 0.0 && p <= 1.0, "{x}");
        }
    }
    assert!(
        root.join("gate/0_base/heldout_short.json").is_file()
            && root.join("gate/3_ppo/transformed_test.json").is_file()
    );
    let e = stderr(&o);
    assert!(
        e.contains("gate (warn): exact match") && e.contains("stage 3 (ppo)"),
        "{e}"
    );

    let t = Instant::now();
    let before = std::fs::read(root.join("stage2_sft/final/adapter_model.safetensors")).unwrap();
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
    // The gate read its reports back instead of evaluating again.
    assert!(
        !stderr(&o).contains("== gate") && stderr(&o).contains("the report of an earlier run"),
        "{}",
        stderr(&o)
    );
    assert!(t.elapsed().as_secs() < 20);
    assert_eq!(
        before,
        std::fs::read(root.join("stage2_sft/final/adapter_model.safetensors")).unwrap()
    );

    // Regression: with Stage 3 changed (PPO to DPO, on a dataset with no
    // rows), a resume skipped it as finished and exited 0 naming Stage 2's
    // model as final. Its record's settings differ: it runs again, fails,
    // and the pipeline fails with it.
    let mut user: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/user_pipeline_config.json")).unwrap();
    user["stage3"]["algorithm"] = "dpo".into();
    user["stage3"]["ppo"]["dataset"] = "empty.jsonl".into();
    user["gate"] = serde_json::json!({"mode": "keep_best"});
    std::fs::write(dir.path().join("dpo.json"), user.to_string()).unwrap();
    std::fs::write(dir.path().join("empty.jsonl"), b"").unwrap();
    let o = trace_train(
        dir.path(),
        &[
            "pipeline",
            "--quick_test",
            "--resume",
            "--config",
            "dpo.json",
            "--start_stage",
            "3",
            "--device",
            "cpu",
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("stage 3 (dpo) runs again: its settings changed"),
        "{err}"
    );
    assert!(err.contains("the trace environment has no rows"), "{err}");
    assert!(!err.contains("the final model is"), "{err}");
}

#[test]
fn max_steps_and_last_stage_cap_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // The gate keeps the best model, on one set.
    std::fs::write(
        dir.path().join("p.json"),
        r#"{"gate": {"mode": "keep_best", "sets": ["original_test"]}}"#,
    )
    .unwrap();
    let o = trace_train(
        dir.path(),
        &[
            "pipeline",
            "--quick_test",
            "--config",
            "p.json",
            "--device",
            "cpu",
            "--max_steps",
            "2",
            "--last_stage",
            "3",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let root = dir.path().join("checkpoints/quick");
    for stage in ["stage1_warmup", "stage2_sft", "stage3_ppo"] {
        let text = std::fs::read_to_string(root.join(stage).join("metrics.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{stage}: {text}");
        // Every stage logs its step time; peak memory only on a GPU.
        assert!(
            lines
                .iter()
                .all(|l| l["time_step_s"].as_f64().unwrap() > 0.0),
            "{text}"
        );
        assert!(
            lines.iter().all(|l| l.get("peak_mem_gib").is_none()),
            "{text}"
        );
    }
    assert!(!root.join("eval").exists(), "eval ran past --last_stage 3");
    // keep_best recorded the gated model with the highest exact match on
    // the one set, ties to the earlier stage, and said which.
    let gate: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("gate.json")).unwrap()).unwrap();
    let scores: Vec<(u64, f64)> = gate["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["sets"].as_array().unwrap().len(), 1, "{gate}");
            (
                s["stage"].as_u64().unwrap(),
                s["sets"][0][1]["accuracy"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(scores.len(), 4, "{gate}");
    let best = scores
        .iter()
        .fold(scores[0], |b, &s| if s.1 > b.1 { s } else { b });
    assert_eq!(gate["kept"].as_u64(), Some(best.0), "{gate}");
    assert!(
        stderr(&o).contains("gate: keep_best: the final model is"),
        "{}",
        stderr(&o)
    );
    // The closing summary names the model keep_best kept.
    let kept = gate["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == gate["kept"])
        .unwrap()["model"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("final model: {kept}\n")), "{out}");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("pipeline_state.json")).unwrap()).unwrap();
    assert_eq!(state["finished"], serde_json::json!([0, 1, 2, 3]));

    let o = trace_train(
        dir.path(),
        &[
            "pipeline",
            "--quick_test",
            "--start_stage",
            "3",
            "--last_stage",
            "2",
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--last_stage 2") && stderr(&o).contains("hint:"),
        "{}",
        stderr(&o)
    );
}

/// `pipeline` on the CPU in `dir` with `config` written to `p.json` there,
/// checkpoints in `ck`, and `stages` (`--start_stage`, `--last_stage`).
fn pipeline_with(dir: &std::path::Path, config: &str, stages: &[&str]) -> std::process::Output {
    std::fs::write(dir.join("p.json"), config).unwrap();
    let mut args = vec!["pipeline", "--config", "p.json", "--checkpoints", "ck"];
    args.extend_from_slice(stages);
    args.extend_from_slice(&["--device", "cpu"]);
    trace_train(dir, &args)
}

#[test]
fn the_gate_refuses_before_training_what_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let run = |config: &str| pipeline_with(dir.path(), config, &["--start_stage", "1"]);
    // Stage 0's test splits are not there: the gate says so before Stage 1.
    let o = run(r#"{"model": {"load_in_4bit": false}}"#);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("gate.sets: `original_test`") && e.contains("hint:") && e.contains("gate.mode"),
        "{e}"
    );
    assert!(!e.contains("== stage 1"), "{e}");
    assert!(!dir.path().join("ck/stage1_warmup").exists());
    // An extra file that is not there, likewise.
    let o = run(
        r#"{"model": {"load_in_4bit": false}, "gate": {"sets": ["heldout_short"], "files": ["nope.jsonl"]}}"#,
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("gate.files: `nope.jsonl` is not a file"),
        "{}",
        stderr(&o)
    );
    // A bad mode names its key and the choices.
    let o = run(r#"{"gate": {"mode": "halt"}}"#);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("gate.mode: `halt` is not one of off, warn, stop, keep_best"),
        "{}",
        stderr(&o)
    );
}

/// Stage 3's dataset is checked before the first stage: a HumanEval file
/// that is not there stops the pipeline before Stage 0 writes anything,
/// naming the key and the file with the hint, where it used to stop only
/// once Stages 0-2 had run.
#[test]
fn a_missing_stage3_dataset_stops_the_pipeline_before_stage_0() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{"model": {"load_in_4bit": false}, "gate": {"mode": "off"},
        "stage0": {"output_dir": "data"},
        "stage3": {"ppo": {"dataset": "builtin+humaneval:HumanEval.jsonl.gz"}}}"#;
    let o = pipeline_with(dir.path(), config, &["--last_stage", "3"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("stage3.ppo.dataset in `p.json`")
            && e.contains("HumanEval file `HumanEval.jsonl.gz` not found")
            && e.contains("hint:"),
        "{e}"
    );
    assert!(!e.contains("== stage 0"), "{e}");
    assert!(!dir.path().join("data").exists());
}

/// A Stage 3 of multi-turn episodes (`stage3.ppo.max_turns` 2) makes the
/// pipeline's final evals score episodes of as many answers, with Stage
/// 3's feedback; the gate's evals stay single-turn.
#[test]
fn final_evals_take_stage3_turns() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints/quick");
    // Stage 3's model and the Stage 2 test set, as earlier stages left them.
    let merged = root.join("stage3_ppo/merged");
    let o = trace_train(dir.path(), &["model", "tiny", merged.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::create_dir_all(root.join("data")).unwrap();
    let mut text = String::new();
    for i in 0..3 {
        let rec = serde_json::json!({
            "messages": [{"role": "user", "content": format!("print({i})")},
                         {"role": "assistant", "content": i.to_string()}],
            "program": format!("print({i})"), "input": "", "expected_output": i.to_string(),
            "metadata": {"row_index": i, "seed": null, "output_lines": 1,
                         "features": {"lines": 1, "loop_depth": 0}},
        });
        text.push_str(&format!("{rec}\n"));
    }
    std::fs::write(root.join("data/stage2_transformed_test.jsonl"), text).unwrap();
    // As a quick test marks the folder it makes.
    std::fs::write(root.join(".trace-train-quick-test"), b"").unwrap();
    std::fs::write(
        dir.path().join("p.json"),
        r#"{"gate": {"mode": "off"},
            "stage3": {"ppo": {"max_turns": 2, "feedback": "verdict"}}}"#,
    )
    .unwrap();
    let o = trace_train(
        dir.path(),
        &[
            "pipeline",
            "--quick_test",
            "--resume",
            "--config",
            "p.json",
            "--start_stage",
            "4",
            "--device",
            "cpu",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("== eval: up to 2 answers an item, feedback verdict"),
        "{}",
        stderr(&o)
    );
    for report in ["eval/report.json", "eval/heldout_short.json"] {
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.join(report)).unwrap()).unwrap();
        let t = &r["turns"];
        assert_eq!(
            (t["max_turns"].as_u64(), t["feedback"].as_str()),
            (Some(2), Some("verdict")),
            "{report}: {r}"
        );
        assert_eq!(t["by_turn"].as_array().unwrap().len(), 2, "{report}");
        assert_eq!(t["by_turn"][1]["correct"], r["correct"], "{report}");
    }
}

/// Under a launcher's variables (torchrun's, with `MASTER_ADDR`), every
/// process would run Stage 0 and the evals: the pipeline refuses, saying
/// what to run instead, and writes nothing.
#[test]
fn pipeline_under_a_launcher_refuses_with_the_steps_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_trace-train"))
        .current_dir(dir.path())
        .args(["pipeline", "--quick_test"])
        .envs([
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("pipeline under a launcher of 2 ranks") && err.contains("hint:"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Regression: `--quick_test --checkpoints DIR` removed DIR whatever it
/// held. A folder the quick test did not make is refused and left intact.
#[test]
fn the_quick_test_refuses_a_folder_it_did_not_make() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("runs/stage1_warmup/checkpoint-5000");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("model.safetensors"), b"weights").unwrap();
    for extra in [&[][..], &["--resume"][..]] {
        let mut args = vec!["pipeline", "--quick_test", "--checkpoints", "runs"];
        args.extend_from_slice(extra);
        let o = trace_train(dir.path(), &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("is not a quick-test folder") && err.contains("hint:"),
            "{err}"
        );
        assert_eq!(
            std::fs::read(real.join("model.safetensors")).unwrap(),
            b"weights"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
            .unwrap()
            .collect();
        assert_eq!(names.len(), 1, "nothing added");
    }
    // A file in its place is refused too.
    std::fs::write(dir.path().join("file"), b"x").unwrap();
    let o = trace_train(
        dir.path(),
        &["pipeline", "--quick_test", "--checkpoints", "file"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(std::fs::read(dir.path().join("file")).unwrap(), b"x");
}

/// Regression: a second quick test emptied the first's folder while it ran,
/// and a SIGTERM to a pipeline exited 0. The second is refused while the
/// first holds the folder; the first, stopped, exits 143.
#[test]
fn a_second_quick_test_is_refused_and_a_stopped_one_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let first = start(
        dir.path(),
        &["pipeline", "--quick_test", "--device", "cpu"],
        std::process::Stdio::piped(),
    );
    let root = dir.path().join("checkpoints/quick");
    wait_for_steps(
        &root.join("stage1_warmup/metrics.jsonl"),
        1,
        std::time::Duration::from_secs(300),
    );
    let o = trace_train(dir.path(), &["pipeline", "--quick_test", "--device", "cpu"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("another quick test is using"), "{err}");
    assert!(root.join("base-model/config.json").is_file(), "left alone");
    signal(&first, nix::sys::signal::Signal::SIGTERM);
    let o = first.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(err.contains("continue with --resume"), "{err}");
}
