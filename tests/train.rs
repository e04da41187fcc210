//! The SFT recipe through the real binary: learning, exact resume after
//! kill -9, damaged checkpoints, refusals. On the tiny chat model the
//! project makes itself and, where the recipe's guarantees must hold for a
//! real pretrained model too, on SmolLM2-135M-Instruct (fetched by
//! `.ci/run`; without it those tests say SKIPPED).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::train::{Base, losses, setup, warmup_args};
use common::{sigterm_during_last_step, start, stderr, trace_train, wait_for_steps};

#[test]
fn loss_falls_and_the_stage_writes_adapter_and_merged_model() {
    let dir = setup(Base::Tiny, "").unwrap();
    let o = trace_train(
        dir.path(),
        &warmup_args("out", "40", &["--learning_rate", "0.02"]),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let l = losses(&dir.path().join("out/metrics.jsonl"));
    assert_eq!(l.len(), 40);
    let first = l[..3].iter().map(|x| x.1).sum::<f64>() / 3.0;
    let last = l[37..].iter().map(|x| x.1).sum::<f64>() / 3.0;
    assert!(last < 0.5 * first, "loss {first:.3} -> {last:.3}");
    for f in [
        "final/adapter_config.json",
        "final/adapter_model.safetensors",
        "merged/config.json",
        "merged/model.safetensors",
        "merged/tokenizer.json",
        "merged/tokenizer_config.json",
    ] {
        assert!(dir.path().join("out").join(f).exists(), "missing {f}");
    }
    // Weights are readable like every other file the run writes (the
    // safetensors writer's temp files are owner-only).
    let mut odd = Vec::new();
    let mut stack = vec![dir.path().join("out")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let mode =
                std::os::unix::fs::PermissionsExt::mode(&e.metadata().unwrap().permissions());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == "safetensors")
                && mode & 0o777 != 0o644
            {
                odd.push(format!("{:o} {}", mode & 0o777, e.path().display()));
            }
        }
    }
    assert!(odd.is_empty(), "weight files not 0644: {odd:?}");
    // Each folder carries a model card with PEFT's metadata and a
    // generation config that stops at the chat's end of turn.
    let read = |f: &str| std::fs::read_to_string(dir.path().join("out").join(f)).unwrap();
    let card = read("final/README.md");
    assert!(card.starts_with("---\nbase_model: "), "{card}");
    for want in [
        "library_name: peft",
        "- \"trace-train\"",
        "- \"lora\"",
        "- \"stage1_warmup\"",
    ] {
        assert!(card.contains(want), "missing {want}: {card}");
    }
    assert!(read("merged/README.md").contains("library_name: transformers"));
    // The front matter is YAML as the hub reads it (PyYAML, when installed).
    for f in ["final/README.md", "merged/README.md"] {
        let check = "import sys, yaml\ntext = open(sys.argv[1]).read()\nmeta = yaml.safe_load(text.split('---')[1])\nassert meta['base_model'] and meta['library_name'] in ('peft', 'transformers'), meta\nassert {'trace-train', 'lora', 'stage1_warmup'} <= set(meta['tags']), meta\n";
        let o = Command::new("/usr/bin/python3")
            .args(["-c", check])
            .arg(dir.path().join("out").join(f))
            .output()
            .unwrap();
        if String::from_utf8_lossy(&o.stderr).contains("No module named 'yaml'") {
            eprintln!("SKIPPED: PyYAML is not installed; {f}'s front matter not parsed");
            continue;
        }
        assert!(o.status.success(), "{f}: {}", stderr(&o));
    }
    for f in [
        "final/generation_config.json",
        "merged/generation_config.json",
    ] {
        let g: serde_json::Value = serde_json::from_str(&read(f)).unwrap();
        // The tiny model's `<|im_end|>` (258) is its eos and end of turn.
        assert_eq!(g["eos_token_id"], 258, "{f}: {g}");
        assert_eq!(g["pad_token_id"], 256, "{f}: {g}");
    }
}

/// A fake Hugging Face cache holding the tiny model as `Org/Tiny` at a
/// tag: `--revision` loads it offline and the commit is recorded; a model
/// the cache lacks fails at once under `HF_HUB_OFFLINE`, without the
/// network.
#[test]
fn a_hub_model_loads_from_the_cache_at_a_revision_and_records_its_commit() {
    let dir = setup(Base::Tiny, "").unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = dir.path().join("hf/hub/models--Org--Tiny");
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    for e in std::fs::read_dir(dir.path().join("base")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), snapshot.join(e.file_name())).unwrap();
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/v1"), commit).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_trace-train"))
            .current_dir(dir.path())
            .env("HF_HOME", dir.path().join("hf"))
            .env("HF_HUB_OFFLINE", "1")
            .env_remove("HF_HUB_CACHE")
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&warmup_args(
        "out",
        "2",
        &["--model", "Org/Tiny", "--revision", "v1"],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/train_config.json")).unwrap())
            .unwrap();
    assert_eq!(record["base_model"]["commit"], commit, "{record}");
    assert_eq!(record["base_model"]["revision"], "v1", "{record}");
    let adapter: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("out/final/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(adapter["base_model_name_or_path"], "Org/Tiny");
    let card = std::fs::read_to_string(dir.path().join("out/final/README.md")).unwrap();
    assert!(
        card.contains("base_model: \"Org/Tiny\"") && card.contains(commit),
        "{card}"
    );

    let t = std::time::Instant::now();
    let o = run(&warmup_args("out2", "2", &["--model", "Org/Missing"]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("Org/Missing"), "{}", stderr(&o));
    assert!(t.elapsed().as_secs() < 10);
}

#[test]
fn kill_9_then_resume_repeats_the_uninterrupted_run_bit_for_bit() {
    kill_9_then_resume_repeats_the_uninterrupted_run_bit_for_bit_on(
        Base::Tiny,
        "kill_9_then_resume_repeats_the_uninterrupted_run_bit_for_bit",
    );
}

#[test]
fn smollm2_kill_9_then_resume_repeats_the_uninterrupted_run_bit_for_bit() {
    kill_9_then_resume_repeats_the_uninterrupted_run_bit_for_bit_on(
        Base::SmolLM2,
        "smollm2_kill_9_then_resume_repeats_the_uninterrupted_run_bit_for_bit",
    );
}

fn kill_9_then_resume_repeats_the_uninterrupted_run_bit_for_bit_on(base: Base, test: &str) {
    let Some(dir) = setup(base, test) else {
        return;
    };
    let o = trace_train(dir.path(), &warmup_args("full", "10", &[]));
    assert!(o.status.success(), "{}", stderr(&o));

    let mut child = start(dir.path(), &warmup_args("cut", "10", &[]), Stdio::null());
    let metrics = dir.path().join("cut/metrics.jsonl");
    // Past the step-6 checkpoint, before the end.
    wait_for_steps(&metrics, 7, Duration::from_secs(600));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !dir.path().join("cut/final").exists(),
        "killed before the end"
    );

    let o = trace_train(dir.path(), &warmup_args("cut", "10", &["--resume"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed at"), "{}", stderr(&o));
    assert_eq!(
        losses(&dir.path().join("full/metrics.jsonl")),
        losses(&metrics)
    );
    // The TensorBoard events hold each step once, as metrics.jsonl does.
    let steps: Vec<i64> = trace_train::runlog::tfevents::event_files(&dir.path().join("cut"))
        .unwrap()
        .iter()
        .flat_map(|f| trace_train::runlog::tfevents::read_events(f).unwrap())
        .filter(|e| !e.values().is_empty())
        .map(|e| e.step)
        .collect();
    assert_eq!(steps, (1..=10).collect::<Vec<i64>>());
    assert_eq!(
        std::fs::read(dir.path().join("full/final/adapter_model.safetensors")).unwrap(),
        std::fs::read(dir.path().join("cut/final/adapter_model.safetensors")).unwrap(),
        "final adapters differ"
    );
}

#[test]
fn damaged_and_half_written_checkpoints_are_skipped_on_resume() {
    damaged_and_half_written_checkpoints_are_skipped_on_resume_on(
        Base::Tiny,
        "damaged_and_half_written_checkpoints_are_skipped_on_resume",
    );
}

#[test]
fn smollm2_damaged_and_half_written_checkpoints_are_skipped_on_resume() {
    damaged_and_half_written_checkpoints_are_skipped_on_resume_on(
        Base::SmolLM2,
        "smollm2_damaged_and_half_written_checkpoints_are_skipped_on_resume",
    );
}

fn damaged_and_half_written_checkpoints_are_skipped_on_resume_on(base: Base, test: &str) {
    let Some(dir) = setup(base, test) else {
        return;
    };
    // Two checkpoints (steps 3 and 6), then stop.
    let o = trace_train(dir.path(), &warmup_args("out", "7", &["--save_steps", "3"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("out");
    // The end-of-run checkpoint (7) gets a flipped byte; a save killed midway
    // left a temp folder.
    let p = out.join("checkpoint-7/trainable.safetensors");
    let mut b = std::fs::read(&p).unwrap();
    let n = b.len() - 1;
    b[n] ^= 0xff;
    std::fs::write(&p, b).unwrap();
    std::fs::create_dir(out.join(".tmp-checkpoint-half")).unwrap();
    std::fs::remove_dir_all(out.join("final")).unwrap();
    let o = trace_train(
        dir.path(),
        &warmup_args("out", "9", &["--resume", "--force"]),
    );
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("resumed at 6"), "{e}");
    assert!(!out.join(".tmp-checkpoint-half").exists());
}

#[test]
fn resume_with_a_changed_config_is_refused_with_the_difference() {
    let dir = setup(Base::Tiny, "").unwrap();
    let o = trace_train(dir.path(), &warmup_args("out", "4", &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = trace_train(
        dir.path(),
        &warmup_args("out", "6", &["--resume", "--learning_rate", "0.01"]),
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("learning_rate") && e.contains("--force"), "{e}");
    // Without --resume, an earlier run's checkpoints are not overwritten.
    let o = trace_train(dir.path(), &warmup_args("out", "6", &[]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    // The base model rewritten in place (as a re-run Stage 1 merge does):
    // same path, other weights.
    let o = trace_train(dir.path(), &["model", "tiny", "base", "--seed", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = trace_train(dir.path(), &warmup_args("out", "6", &["--resume"]));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("base model: its config or weights changed"),
        "{e}"
    );
}

/// A project copied elsewhere (base model, data and run folder at new
/// absolute paths, the same contents) resumes without `--force`.
#[test]
fn a_run_copied_elsewhere_resumes_without_force() {
    let dir = setup(Base::Tiny, "").unwrap();
    let abs = |d: &Path, f: &str| d.join(f).display().to_string();
    let run = |d: &Path, steps: &str, extra: &[&str]| {
        let (base, data, out) = (abs(d, "base"), abs(d, "train.jsonl"), abs(d, "out"));
        let mut flags = vec![
            "--model",
            &base,
            "--train_file",
            &data,
            "--output_dir",
            &out,
        ];
        flags.extend_from_slice(extra);
        trace_train(d, &warmup_args("out", steps, &flags))
    };
    let o = run(dir.path(), "4", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let copy = tempfile::tempdir().unwrap();
    let cp = Command::new("cp")
        .args([
            "-r",
            &format!("{}/.", dir.path().display()),
            &copy.path().display().to_string(),
        ])
        .status()
        .unwrap();
    assert!(cp.success());
    let o = run(copy.path(), "6", &["--resume"]);
    let e = stderr(&o);
    assert!(o.status.success() && e.contains("resumed at 4"), "{e}");
}

#[test]
fn bad_inputs_name_the_file_and_field() {
    let dir = setup(Base::Tiny, "").unwrap();
    // A row without an answer.
    std::fs::write(
        dir.path().join("noanswer.jsonl"),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n",
    )
    .unwrap();
    let o = trace_train(
        dir.path(),
        &warmup_args("o1", "2", &["--train_file", "noanswer.jsonl"]),
    );
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("noanswer.jsonl") && e.contains("line 1"),
        "{e}"
    );
    // Records longer than max_length: trained without them, and said
    // before training, with the setting to raise.
    let long = "7 ".repeat(400);
    std::fs::write(
        dir.path().join("long.jsonl"),
        ["1", "2", long.as_str()]
            .iter()
            .map(|a| {
                serde_json::json!({"messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": a}]})
                .to_string()
                    + "\n"
            })
            .collect::<String>(),
    )
    .unwrap();
    let o = trace_train(
        dir.path(),
        &warmup_args(
            "o0",
            "1",
            &["--train_file", "long.jsonl", "--max_length", "128"],
        ),
    );
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(
            "warmup: warning: 1 of 3 records in `long.jsonl` are longer than max_length 128"
        ) && e.contains("hint: raise --max_length"),
        "{e}"
    );
    // A model folder without weights.
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    std::fs::copy(
        dir.path().join("base/config.json"),
        dir.path().join("empty/config.json"),
    )
    .unwrap();
    let o = trace_train(dir.path(), &warmup_args("o2", "2", &["--model", "empty"]));
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("empty") && e.contains("hint"),
        "{e}"
    );
    // A tokenizer with ids beyond the model's vocabulary (512).
    let tok_path = dir.path().join("base/tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&tok_path).unwrap()).unwrap();
    tok["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
        "id": 700, "content": "<|extra|>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true}));
    tok["model"]["vocab"]["<|extra|>"] = serde_json::json!(700);
    std::fs::write(&tok_path, tok.to_string()).unwrap();
    let o = trace_train(dir.path(), &warmup_args("o3", "2", &[]));
    assert!(!o.status.success());
    assert!(
        stderr(&o).to_lowercase().contains("vocab"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_small_set_is_learned_to_full_exact_match_as_eval_measures_it() {
    let dir = setup(Base::Tiny, "").unwrap();
    // Four short records in `generate`'s layout (eval reads the metadata).
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
    std::fs::write(dir.path().join("small.jsonl"), text).unwrap();
    let before = trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "base",
            "--data",
            "small.jsonl",
            "--output",
            "before.json",
            "--max_new_tokens",
            "8",
            "--device",
            "cpu",
        ],
    );
    assert!(before.status.success(), "{}", stderr(&before));
    let o = trace_train(
        dir.path(),
        &warmup_args(
            "out",
            "60",
            &["--train_file", "small.jsonl", "--learning_rate", "0.01"],
        ),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let after = trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "out/merged",
            "--data",
            "small.jsonl",
            "--output",
            "after.json",
            "--max_new_tokens",
            "8",
            "--device",
            "cpu",
        ],
    );
    assert!(after.status.success(), "{}", stderr(&after));
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.path().join(f)).unwrap()).unwrap()
    };
    let (b, a) = (read("before.json"), read("after.json"));
    assert_eq!(b["n"], 4);
    assert_eq!(b["correct"], 0, "{b}");
    assert_eq!(a["correct"], 4, "{a}");
    assert_eq!(a["accuracy"], 1.0);
    // The adapter applied to the base gives the same predictions as the merge.
    let via_adapter = trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "base",
            "--adapter",
            "out/final",
            "--data",
            "small.jsonl",
            "--output",
            "adapter.json",
            "--max_new_tokens",
            "8",
            "--device",
            "cpu",
        ],
    );
    assert!(via_adapter.status.success(), "{}", stderr(&via_adapter));
    assert_eq!(read("adapter.json")["correct"], 4);
}

/// Records in `generate`'s layout whose answers are `answer(i)`, for
/// prompts `print({i} * 3)`.
fn write_line_records(path: &std::path::Path, ids: std::ops::Range<usize>, lines: usize) {
    let mut text = String::new();
    for i in ids {
        let prompt = format!("print({i} * 3)");
        let answer = vec![(i * 3).to_string(); lines].join("\n");
        let one_line = (i * 3).to_string();
        let rec = serde_json::json!({
            "messages": [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": answer},
            ],
            "program": prompt, "input": "",
            // Eval asks for the single line: a model that runs on shows
            // as "longer".
            "expected_output": one_line,
            "metadata": {"row_index": i, "seed": null, "output_lines": 1,
                         "features": {"lines": 1, "loop_depth": 0}},
        });
        text.push_str(&format!("{rec}\n"));
    }
    std::fs::write(path, text).unwrap();
}

fn eval_report(dir: &std::path::Path, model: &str, data: &str, out: &str) -> serde_json::Value {
    let o = trace_train(
        dir,
        &[
            "eval",
            "--model",
            model,
            "--data",
            data,
            "--output",
            out,
            "--max_new_tokens",
            "24",
            "--device",
            "cpu",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&std::fs::read(dir.join(out)).unwrap()).unwrap()
}

/// Trained on single-line answers, the model ends its turn after one line,
/// on the prompts it learned and on ones it never saw; trained on the same
/// prompts with three-line answers, it runs on, and the report says so.
fn single_line_answers_teach_stopping_after_one_line(
    base: Base,
    test: &str,
    steps: &str,
    lr: &str,
) {
    let Some(dir) = setup(base, test) else {
        return;
    };
    let d = dir.path();
    write_line_records(&d.join("one.jsonl"), 0..12, 1);
    write_line_records(&d.join("three.jsonl"), 0..12, 3);
    write_line_records(&d.join("unseen.jsonl"), 12..18, 1);
    for (out, train) in [("one", "one.jsonl"), ("three", "three.jsonl")] {
        let o = trace_train(
            d,
            &warmup_args(out, steps, &["--train_file", train, "--learning_rate", lr]),
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // A tiny random model learns the twelve prompts it saw, but what it
    // writes for unseen numbers moves with the last bit of its training
    // (a run can end in "3333..." where another stops); SmolLM2, which can
    // read, is held to the unseen prompts too.
    let sets: &[&str] = match base {
        Base::Tiny => &["one.jsonl"],
        _ => &["one.jsonl", "unseen.jsonl"],
    };
    for &data in sets {
        let r = eval_report(d, "one/merged", data, "one_report.json");
        for p in r["predictions"].as_array().unwrap() {
            assert_eq!(p["stopped"], true, "{data}: no end of turn: {p}");
            let answer = p["answer"].as_str().unwrap();
            assert_eq!(answer.lines().count(), 1, "{data}: {answer:?}");
        }
        assert_eq!(r["misses"]["longer"], 0, "{data}: {}", r["misses"]);
        assert_eq!(r["truncated"], 0);
        // The three-line model runs past the single expected line (nearly
        // always: a model this small may garble a line into one).
        let r = eval_report(d, "three/merged", data, "three_report.json");
        let n = r["n"].as_u64().unwrap();
        let longer = r["misses"]["longer"].as_u64().unwrap();
        assert!(4 * longer >= 3 * n, "{data}: {longer} of {n} longer: {r}");
        assert_eq!(r["correct"], 0);
        let one = &r["by"]["output_lines"][0];
        assert_eq!(
            (one["bucket"].as_str(), one["n"].as_u64()),
            (Some("1"), Some(n))
        );
        assert_eq!(one["misses"]["longer"].as_u64(), Some(longer));
    }
    // On the prompts it learned, the single-line model is right.
    // (The tiny model, memorising twelve numbers by rote, may miss one or
    // two digits; it still stops after the line.)
    let r = eval_report(d, "one/merged", "one.jsonl", "one_report.json");
    let correct = r["correct"].as_u64().unwrap();
    let at_least = if matches!(base, Base::Tiny) { 10 } else { 12 };
    assert!(
        correct >= at_least,
        "{correct} of 12 right: {}",
        r["misses"]
    );
}

#[test]
fn a_model_trained_on_single_line_answers_stops_after_one_line() {
    single_line_answers_teach_stopping_after_one_line(Base::Tiny, "", "150", "0.01");
}

#[test]
fn smollm2_trained_on_single_line_answers_stops_after_one_line() {
    single_line_answers_teach_stopping_after_one_line(
        Base::SmolLM2,
        "smollm2_trained_on_single_line_answers_stops_after_one_line",
        "20",
        "0.003",
    );
}

#[test]
fn a_stop_during_the_last_step_still_saves_the_whole_run() {
    // SIGTERM while the last step runs: the run is whole, so it ends as one
    // (adapter, merged model, its last checkpoint), not as a stopped run
    // that saved nothing.
    let dir = setup(Base::Tiny, "").unwrap();
    let child = start(
        dir.path(),
        &warmup_args("run", "4", &["--batch_size", "16", "--save_steps", "0"]),
        Stdio::piped(),
    );
    let metrics = dir.path().join("run/metrics.jsonl");
    // Steps 1-3 logged: step 4, the last, is running.
    sigterm_during_last_step(
        child,
        &metrics,
        3,
        &dir.path().join("run"),
        &["final/adapter_model.safetensors", "merged", "checkpoint-4"],
    );
    assert_eq!(losses(&metrics).len(), 4);
}

/// Regression: a run SIGTERM stopped mid-way exited 0, so `warmup && sft`
/// or a scheduler took a preemption for a finished run. It now exits 143
/// (128 + SIGTERM) after its checkpoint, leaves no `.lock`, and resumes.
#[test]
fn a_run_stopped_by_sigterm_exits_143_after_its_checkpoint() {
    let dir = setup(Base::Tiny, "").unwrap();
    let child = start(
        dir.path(),
        &warmup_args("run", "40", &["--save_steps", "0"]),
        Stdio::piped(),
    );
    let metrics = dir.path().join("run/metrics.jsonl");
    wait_for_steps(&metrics, 2, Duration::from_secs(300));
    common::signal(&child, nix::sys::signal::Signal::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(err.contains("stopped by SIGTERM"), "{err}");
    let run = dir.path().join("run");
    let steps = losses(&metrics).len();
    assert!(steps < 40, "stopped early");
    assert!(run.join(format!("checkpoint-{steps}")).is_dir(), "{err}");
    assert!(!run.join("final").exists());
    assert!(!run.join(".lock").exists(), "the lock goes with the run");
    let o = trace_train(
        dir.path(),
        &warmup_args("run", "40", &["--save_steps", "0", "--resume"]),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(run.join("final/adapter_model.safetensors").is_file());
    assert!(!run.join(".lock").exists(), "no lock after success");
}

/// Regression: at learning rate 1e6 the loss sat at ln(vocabulary) with a
/// zero gradient for 29 steps and the run exited 0 with a final model of
/// diverged weights. The guard stops it, writes no final model, and sets
/// aside the checkpoints saved from the diverged weights.
#[test]
fn a_diverged_run_stops_and_keeps_only_good_checkpoints() {
    let dir = setup(Base::Tiny, "").unwrap();
    let o = trace_train(
        dir.path(),
        &warmup_args(
            "run",
            "30",
            &["--learning_rate", "1e6", "--save_steps", "1"],
        ),
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("diverged") || err.contains("non-finite"),
        "{err}"
    );
    assert!(err.contains("hint: lower the learning rate"), "{err}");
    let run = dir.path().join("run");
    assert!(!run.join("final").exists() && !run.join("merged").exists());
    let names: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("diverged-checkpoint-")),
        "{names:?}"
    );
    let steps = losses(&run.join("metrics.jsonl")).len();
    assert!(steps < 30, "stopped at step {steps}");
    // What resume would pick is from before the divergence.
    let left: Vec<u64> = names
        .iter()
        .filter_map(|n| n.strip_prefix("checkpoint-")?.parse().ok())
        .collect();
    let aside: Vec<u64> = names
        .iter()
        .filter_map(|n| n.strip_prefix("diverged-checkpoint-")?.parse().ok())
        .collect();
    assert!(
        left.iter().all(|l| aside.iter().all(|a| l < a)),
        "{left:?} {aside:?}"
    );
}

/// Regression: Stage 3 had no divergence guard. At learning rate 1e6 with
/// an entropy bonus the policy is uniform from step 2 (its entropy sits at
/// ln(vocabulary)) and the run exited 0 with a final model of those
/// weights. Now it stops, writes no final model, and sets aside the
/// checkpoints of the diverged weights.
#[test]
fn a_diverged_rl_run_stops_and_writes_no_final_model() {
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(dir.path(), &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(
        dir.path().join("s3.json"),
        r#"{"ppo": {"algorithm": "ppo", "batch_size": 4, "num_train_steps": 12, "max_new_tokens": 8,
                    "mini_batch_size": 4, "save_steps": 2, "learning_rate": 1e6, "entropy_coef": 0.01,
                    "max_prompt_tokens": 2000, "num_workers": 2}}"#,
    )
    .unwrap();
    let o = trace_train(dir.path(), &common::ppo_args("run", &[]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("stage3_ppo diverged") && err.contains("entropy sat at ln(vocabulary)"),
        "{err}"
    );
    assert!(err.contains("hint: lower the learning rate"), "{err}");
    let run = dir.path().join("run");
    assert!(!run.join("final").exists() && !run.join("merged").exists());
    let names: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("diverged-step_")),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with("step_")), "{names:?}");
}

/// A run whose stderr is a file (a scheduler's log, `nohup`, `tee`) says
/// where it is: a line when it starts, one at least every `--log_every`
/// seconds while it runs, one when it ends; no colour escapes. With
/// `--log_format json` each is a JSON object.
#[test]
fn a_redirected_run_writes_progress_lines_on_a_clock() {
    let dir = setup(Base::Tiny, "").unwrap();
    let mut args = vec!["--log_every", "0.2", "-v"];
    args.extend(warmup_args("text", "12", &["--save_steps", "0"]));
    let o = trace_train(dir.path(), &args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("[step ")).collect();
    assert!(lines.len() >= 2, "{err}");
    assert!(lines[0].starts_with("[step 0/12 (0%)] elapsed"), "{err}");
    let last = lines.last().unwrap();
    assert!(last.starts_with("[step 12/12 (100%)] done in"), "{err}");
    assert!(err.contains("INFO"), "-v logs: {err}");
    assert!(
        !err.contains('\u{1b}'),
        "colour escapes in a log file: {err}"
    );

    let mut args = vec!["--log_format", "json", "--log_every", "0.2", "-v"];
    args.extend(warmup_args("json", "12", &["--save_steps", "0"]));
    let o = trace_train(dir.path(), &args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let events: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["level"] == "INFO" && e["message"].is_string()),
        "{err}"
    );
    let progress: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["progress"] == "step").collect();
    assert_eq!(progress.first().unwrap()["event"], "start");
    let end = progress.last().unwrap();
    assert_eq!(
        (end["event"].as_str(), end["done"].as_u64()),
        (Some("end"), Some(12))
    );
    // The clock: no gap between lines much longer than the period.
    let at: Vec<f64> = progress
        .iter()
        .map(|e| e["elapsed_s"].as_f64().unwrap())
        .collect();
    for w in at.windows(2) {
        assert!(w[1] - w[0] <= 1.5, "a gap of {:.1} s: {at:?}", w[1] - w[0]);
    }
}
