//! DPO from own rollouts through the real binary on the tiny chat model:
//! `rollouts` (K scored samples a prompt, deterministic for a seed),
//! `prefs` (pairs and the stats of prompts without one), `dpo` (the loss
//! of a fresh adapter starts at log 2 under every reference, learning,
//! exact resume); and the prompt/answer token boundary of a pair under the
//! Qwen3 and SmolLM2 chat templates.

mod common;

use std::path::Path;

use common::{stderr, trace_train};
use trace_train::data::{ChatTokenizer, Message, Role};
use trace_train::pref::pairs::Pair;
use trace_train::recipes::dpo::TokenPair;

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn tiny(dir: &Path) {
    let o = trace_train(dir, &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

fn rollouts(dir: &Path, out: &str, seed: &str) -> std::process::Output {
    rollouts_with(dir, out, seed, &[])
}

/// `rollouts` of 3 word prompts x 4 samples on the tiny model, with `extra`.
fn rollouts_with(dir: &Path, out: &str, seed: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "rollouts",
        "--model",
        "base",
        "--environment",
        "word",
        "--num_prompts",
        "3",
        "--num_samples",
        "4",
        "--max_new_tokens",
        "6",
        "--device",
        "cpu",
        "--seed",
        seed,
        "--output",
        out,
    ];
    args.extend_from_slice(extra);
    trace_train(dir, &args)
}

/// `prefs --rollouts ROLLOUTS --output OUT` with `extra`, which must
/// succeed; the stats it prints.
fn prefs(dir: &Path, rollouts: &str, out: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["prefs", "--rollouts", rollouts, "--output", out];
    args.extend_from_slice(extra);
    let o = trace_train(dir, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn rollouts_are_scored_recorded_and_repeat_for_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let o = rollouts(dir.path(), "r.jsonl", "5");
    assert!(o.status.success(), "{}", stderr(&o));
    let stats: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (stats["prompts"].as_u64(), stats["rollouts"].as_u64()),
        (Some(3), Some(12))
    );
    let rows = lines(&dir.path().join("r.jsonl"));
    assert_eq!(rows.len(), 12);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["sample"].as_u64(), Some((i % 4) as u64), "{r}");
        assert_eq!(
            r["prompt_id"],
            rows[i - i % 4]["prompt_id"],
            "samples of a prompt together"
        );
        let reward = r["reward"].as_f64().unwrap();
        assert_eq!(r["correct"].as_bool(), Some(reward == 1.0), "{r}");
        assert!(r["tokens"].as_u64().unwrap() <= 6, "{r}");
        assert!(
            r["prompt"]
                .as_str()
                .unwrap()
                .starts_with("Answer with the word"),
            "{r}"
        );
        assert_eq!(r["sampling"]["max_new_tokens"].as_u64(), Some(6));
        assert_eq!(r["sampling"]["seed"].as_u64(), Some(5));
        assert!(r["model"].as_str().unwrap().ends_with("base"), "{r}");
        // The word asked for is the environment's own right answer.
        assert_eq!(r["demonstration"], r["expected"], "{r}");
        for key in [
            "completion",
            "answer",
            "expected",
            "model_commit",
            "adapter",
            "stopped",
        ] {
            assert!(r.get(key).is_some(), "no {key}: {r}");
        }
    }
    // Four samples of a prompt are not all the same text (temperature 1).
    let texts: std::collections::BTreeSet<&str> = rows[..4]
        .iter()
        .map(|r| r["completion"].as_str().unwrap())
        .collect();
    assert!(texts.len() > 1, "{texts:?}");
    // The same seed: the same file; another: other samples.
    assert!(rollouts(dir.path(), "again.jsonl", "5").status.success());
    assert_eq!(
        std::fs::read(dir.path().join("r.jsonl")).unwrap(),
        std::fs::read(dir.path().join("again.jsonl")).unwrap()
    );
    assert!(rollouts(dir.path(), "other.jsonl", "6").status.success());
    assert_ne!(
        std::fs::read(dir.path().join("r.jsonl")).unwrap(),
        std::fs::read(dir.path().join("other.jsonl")).unwrap()
    );

    // prefs on what the tiny model said: every prompt is accounted for.
    let st = prefs(
        dir.path(),
        "r.jsonl",
        "p.jsonl",
        &["--among_correct", "shorter"],
    );
    let without: u64 = st["prompts_without_pairs"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(
        st["prompts_with_pairs"].as_u64().unwrap() + without,
        3,
        "{st}"
    );
    assert!(dir.path().join("p.jsonl.stats.json").exists());

    // With demonstrations, a prompt whose answers were all wrong pairs the
    // word over each of them: no prompt is left all_incorrect.
    let sd = prefs(
        dir.path(),
        "r.jsonl",
        "d.jsonl",
        &["--demonstrations", "--max_pairs_per_prompt", "0"],
    );
    assert!(
        sd["prompts_without_pairs"].get("all_incorrect").is_none(),
        "{sd}"
    );
    let all_wrong = st["prompts_without_pairs"]["all_incorrect"]
        .as_u64()
        .unwrap_or(0);
    // The untrained tiny model is wrong nearly always.
    assert!(all_wrong > 0, "{st}");
    let demo: Vec<serde_json::Value> = lines(&dir.path().join("d.jsonl"))
        .into_iter()
        .filter(|p| p["kind"] == "demonstration")
        .collect();
    assert_eq!(demo.len() as u64, 4 * all_wrong, "{sd}");
    for p in &demo {
        let id = p["prompt_id"].as_u64().unwrap();
        let expected = rows
            .iter()
            .find(|r| r["prompt_id"].as_u64() == Some(id))
            .unwrap();
        assert_eq!(p["chosen"], expected["expected"], "{p}");
        assert_ne!(p["chosen"], p["rejected"], "{p}");
    }
}

/// Writes a rollouts file by hand: `(prompt id, answer, right)` a line.
fn write_rollouts(path: &Path, answers: &[(u64, &str, bool)]) {
    let text: String = answers
        .iter()
        .enumerate()
        .map(|(i, &(id, text, correct))| {
            // Which of its prompt's samples this answer is.
            let sample = answers[..i].iter().filter(|a| a.0 == id).count();
            let row = serde_json::json!({
                "prompt_id": id, "prompt": format!("Answer with the word apple and nothing else. ({id})"),
                "completion": text, "answer": text, "expected": "apple", "tokens": text.len(),
                "stopped": true, "reward": if correct { 1.0 } else { 0.0 }, "correct": correct,
                "sample": sample,
                "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8, "seed": 1},
                "model": "base", "model_commit": null, "adapter": null
            });
            format!("{row}\n")
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// A rollouts file written by hand: prompt 1 has a correct and two wrong
/// answers, prompt 2 only wrong ones.
fn hand_rollouts(dir: &Path) {
    write_rollouts(
        &dir.join("hand.jsonl"),
        &[
            (1, "apple", true),
            (1, "river", false),
            (1, "stone", false),
            (2, "cloud", false),
            (2, "rivers", false),
        ],
    );
}

/// `prefs --same_lines`: a wrong answer longer than the right one gives no
/// pair, and a prompt left with none says why.
#[test]
fn prefs_same_lines_drops_pairs_that_differ_in_line_count() {
    let dir = tempfile::tempdir().unwrap();
    write_rollouts(
        &dir.path().join("lines.jsonl"),
        &[
            (1, "apple", true),
            (1, "pear", false),
            (1, "apple\napple", false),
            (2, "apple", true),
            (2, "apple\npear", false),
        ],
    );
    let all = prefs(dir.path(), "lines.jsonl", "all.jsonl", &[]);
    assert_eq!(lines(&dir.path().join("all.jsonl")).len(), 3, "{all}");
    let st = prefs(dir.path(), "lines.jsonl", "same.jsonl", &["--same_lines"]);
    let pairs = lines(&dir.path().join("same.jsonl"));
    assert_eq!(pairs.len(), 1, "{st}");
    assert_eq!(
        (pairs[0]["chosen"].as_str(), pairs[0]["rejected"].as_str()),
        (Some("apple"), Some("pear"))
    );
    assert_eq!(st["dropped"]["other_line_count"].as_u64(), Some(2), "{st}");
    assert_eq!(
        st["prompts_without_pairs"]["all_other_line_counts"].as_u64(),
        Some(1),
        "{st}"
    );
    // `--first_error`: each wrong answer also gives the expected line over
    // its first wrong one; the sides that go on are marked open.
    let st = prefs(dir.path(), "lines.jsonl", "fe.jsonl", &["--first_error"]);
    let pairs = lines(&dir.path().join("fe.jsonl"));
    let fe: Vec<_> = pairs
        .iter()
        .filter(|p| p["kind"] == "first_error")
        .collect();
    assert_eq!(fe.len(), 3, "{st}");
    assert_eq!(st["pairs"]["first_error"].as_u64(), Some(3), "{st}");
    let side = |p: &serde_json::Value| {
        (
            p["chosen"].as_str().unwrap().to_owned(),
            p["chosen_open"] == true,
            p["rejected"].as_str().unwrap().to_owned(),
            p["rejected_open"] == true,
        )
    };
    assert_eq!(side(fe[0]), ("apple".into(), true, "pear".into(), true));
    assert_eq!(
        side(fe[1]),
        ("apple".into(), false, "apple\napple".into(), true)
    );
    assert_eq!(
        side(fe[2]),
        ("apple".into(), false, "apple\npear".into(), true)
    );
    // A wrong answer in a fence gives none, and the log says so.
    write_rollouts(
        &dir.path().join("fenced.jsonl"),
        &[(1, "apple", true), (1, "```\npear\n```", false)],
    );
    let o = trace_train(
        dir.path(),
        &[
            "prefs",
            "--rollouts",
            "fenced.jsonl",
            "--output",
            "f.jsonl",
            "--first_error",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 wrong answers of `fenced.jsonl` are not the bare output"),
        "{}",
        stderr(&o)
    );
    assert_eq!(lines(&dir.path().join("f.jsonl")).len(), 1);
}

#[test]
fn prefs_pairs_correct_over_incorrect_and_says_why_a_prompt_gave_none() {
    let dir = tempfile::tempdir().unwrap();
    hand_rollouts(dir.path());
    // Asked for demonstrations that the file does not have: said, with
    // the file and the field, and the pairs are the same.
    let o = trace_train(
        dir.path(),
        &[
            "prefs",
            "--rollouts",
            "hand.jsonl",
            "--output",
            "p.jsonl",
            "--demonstrations",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("no line of `hand.jsonl` has a `demonstration`") && e.contains("hint:"),
        "{e}"
    );
    assert_eq!(lines(&dir.path().join("p.jsonl")).len(), 2);
    let st = prefs(dir.path(), "hand.jsonl", "p.jsonl", &[]);
    let pairs = lines(&dir.path().join("p.jsonl"));
    assert_eq!(pairs.len(), 2);
    assert!(
        pairs
            .iter()
            .all(|p| p["chosen"] == "apple" && p["kind"] == "correctness")
    );
    assert_eq!(
        st["prompts_without_pairs"]["all_incorrect"].as_u64(),
        Some(1),
        "{st}"
    );
    // A broken line names the file, the line and the field.
    std::fs::write(dir.path().join("bad.jsonl"), "{\"prompt_id\": 1}\n").unwrap();
    let o = trace_train(dir.path(), &["prefs", "--rollouts", "bad.jsonl"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("bad.jsonl") && e.contains("line 1") && e.contains("missing field"),
        "{e}"
    );
}

/// Pairs for the word task: the asked word over a refusal.
fn word_pairs(dir: &Path, n: usize) {
    common::write_word_pairs(dir, n);
    std::fs::write(
        dir.join("dpo.json"),
        r#"{"learning_rate": 0.001, "batch_size": 2, "epochs": 3, "save_steps": 2,
            "save_total_limit": 0, "warmup_ratio": 0.0, "lora_r": 4, "lora_alpha": 8}"#,
    )
    .unwrap();
}

fn dpo(dir: &Path, out: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "dpo",
        "--model",
        "base",
        "--pairs",
        "pairs.jsonl",
        "--config",
        "dpo.json",
        "--device",
        "cpu",
        "--output_dir",
        out,
    ];
    args.extend_from_slice(extra);
    trace_train(dir, &args)
}

fn metric(dir: &Path, key: &str) -> Vec<f64> {
    lines(&dir.join("metrics.jsonl"))
        .iter()
        .map(|m| m[key].as_f64().unwrap_or_else(|| panic!("no {key}: {m}")))
        .collect()
}

#[test]
fn dpo_starts_at_log_2_under_every_reference_and_learns() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    word_pairs(dir.path(), 8);
    let mut firsts = Vec::new();
    for reference in ["adapter_off", "initial", "precomputed"] {
        let o = dpo(dir.path(), reference, &["--reference", reference]);
        assert!(o.status.success(), "{reference}: {}", stderr(&o));
        let out = dir.path().join(reference);
        let loss = metric(&out, "loss");
        // 8 pairs, 2 a step, 3 epochs.
        assert_eq!(loss.len(), 12, "{reference}");
        // A fresh adapter is the reference: h = 0, −log σ(0) = log 2
        // (Rafailov et al. 2023 Eq. 7), and the margins are 0 (up to the
        // training forward's rounding against the reference's).
        assert!(
            (loss[0] - 2f64.ln()).abs() < 1e-5,
            "{reference}: {}",
            loss[0]
        );
        assert!(metric(&out, "rewards/margins")[0].abs() < 1e-5);
        // It learns: the last epoch's loss is below log 2 and the chosen
        // answers' rewards pass the rejected ones'.
        let last: f64 = loss[8..].iter().sum::<f64>() / 4.0;
        assert!(last < 0.2, "{reference}: {loss:?}");
        let margins = metric(&out, "rewards/margins");
        assert!(margins[11] > 1.0, "{reference}: {margins:?}");
        let accuracy = metric(&out, "rewards/accuracies");
        assert!(
            accuracy[8..].iter().sum::<f64>() / 4.0 > 0.5,
            "{reference}: {accuracy:?}"
        );
        // The run log every stage writes: TensorBoard events with the
        // rewards/* tags, and the curves.
        let events = trace_train::runlog::tfevents::event_files(&out).unwrap();
        assert_eq!(events.len(), 1, "{reference}");
        let tags: std::collections::BTreeSet<String> =
            trace_train::runlog::tfevents::read_events(&events[0])
                .unwrap()
                .iter()
                .flat_map(|e| e.values().into_iter().map(|(t, _)| t.to_owned()))
                .collect();
        assert!(
            tags.iter().any(|t| t.contains("rewards/margins")),
            "{tags:?}"
        );
        for part in [
            "final/adapter_model.safetensors",
            "merged/config.json",
            "train_config.json",
            "curves/rewards_margins.png",
            "curves/loss.svg",
        ] {
            assert!(out.join(part).exists(), "{reference}: no {part}");
        }
        firsts.push(loss);
    }
    // The three references agree on a fresh adapter (the precomputed one
    // up to the padding of its batches).
    for other in &firsts[1..] {
        for (a, b) in firsts[0].iter().zip(other) {
            assert!((a - b).abs() < 1e-3, "{:?} vs {other:?}", firsts[0]);
        }
    }
}

#[test]
fn dpo_resumed_from_a_checkpoint_repeats_the_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    word_pairs(dir.path(), 8);
    let o = dpo(dir.path(), "full", &["--loss", "ipo", "--nll_coef", "0.5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The state after step 4, as a run stopped there leaves it.
    let full = dir.path().join("full");
    let cut = dir.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    let ck = "checkpoint-4";
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    copy(&full.join(ck), &cut.join(ck));
    let metrics = std::fs::read_to_string(full.join("metrics.jsonl")).unwrap();
    let head: String = metrics.lines().take(4).map(|l| format!("{l}\n")).collect();
    std::fs::write(cut.join("metrics.jsonl"), head).unwrap();
    let o = dpo(
        dir.path(),
        "cut",
        &["--loss", "ipo", "--nll_coef", "0.5", "--resume"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed at 4"), "{}", stderr(&o));
    for key in ["loss", "rewards/margins", "logps/chosen", "grad_norm", "lr"] {
        assert_eq!(metric(&full, key), metric(&cut, key), "{key}");
    }
    assert_eq!(
        std::fs::read(full.join("final/adapter_model.safetensors")).unwrap(),
        std::fs::read(cut.join("final/adapter_model.safetensors")).unwrap(),
        "final adapters differ"
    );
    // Going on from the trained adapter: with its frozen copy as the
    // reference the first loss is log 2 again (the policy is its
    // reference); with the adapter switched off the reference is the base,
    // and the trained adapter already prefers the chosen answers.
    let from = |out: &str, reference: &str| {
        let o = dpo(
            dir.path(),
            out,
            &["--adapter", "full/final", "--reference", reference],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        metric(&dir.path().join(out), "loss")[0]
    };
    let frozen = from("on_initial", "initial");
    assert!((frozen - 2f64.ln()).abs() < 1e-5, "{frozen}");
    let off = from("on_off", "adapter_off");
    assert!(off < 2f64.ln() - 0.05, "{off}");
    // Without --resume the folder is refused; with other settings too.
    let o = dpo(dir.path(), "cut", &["--loss", "ipo", "--nll_coef", "0.5"]);
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    let o = dpo(dir.path(), "cut", &["--loss", "sigmoid", "--resume"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("the run changed"), "{}", stderr(&o));
}

/// The pair's tokens against the chat template's render of the whole
/// conversation: the prompt is the generation prompt's tokens, and the
/// prompt followed by an answer is the tokens of the conversation (its
/// trailing newline after the end-of-turn token left out), ending with
/// that token. An open answer (a `first_error` pair's side that goes on)
/// is the same tokens without the end-of-turn token.
fn boundary_matches_the_template(tok: &ChatTokenizer, what: &str) {
    for (prompt, chosen, rejected, open) in [
        (
            "Predict the output:\nprint(1 + 1)",
            "2",
            "3\n4",
            (false, false),
        ),
        ("x = [1, 2]\nprint(x)", "[1, 2]", "", (false, false)),
        (
            "for i in range(3):\n    print(i)",
            "0\n1",
            "0\n2",
            (true, true),
        ),
        ("print(5)\nprint(6)", "5\n6", "5", (true, false)),
    ] {
        let pair = Pair {
            prompt_id: 0,
            prompt: prompt.into(),
            chosen: chosen.into(),
            rejected: rejected.into(),
            chosen_open: open.0,
            rejected_open: open.1,
            kind: "test".into(),
            chosen_reward: 1.0,
            rejected_reward: 0.0,
            edit_distance: 1,
        };
        let t = TokenPair::new(tok, &pair).unwrap();
        let user = Message::new(Role::User, prompt);
        assert_eq!(
            t.prompt,
            tok.encode_prompt(std::slice::from_ref(&user)).unwrap(),
            "{what}"
        );
        for (answer, ids, open) in [(chosen, &t.chosen, open.0), (rejected, &t.rejected, open.1)] {
            let chat = [user.clone(), Message::new(Role::Assistant, answer)];
            let full = tok.template().render(&chat, false).unwrap();
            let mut got = t.prompt.clone();
            got.extend(ids.iter());
            if open {
                got.push(tok.end_of_turn().id);
            }
            assert_eq!(
                got,
                tok.encode(full.trim_end()).unwrap(),
                "{what}: {answer:?}"
            );
            let end = if open { "" } else { &tok.end_of_turn().text };
            assert_eq!(
                tok.decode(ids, false).unwrap(),
                format!("{answer}{end}"),
                "{what}"
            );
        }
    }
}

/// A multi-turn episode's next prompt (`ChatTokenizer::next_turn`): the
/// first turn's prompt and answer tokens as they were, then the template's
/// end of the answer, the feedback as a user turn and the generation
/// prompt the first turn had. `whole_too`: templating the whole
/// conversation again gives the same tokens (not so for Qwen3, whose
/// template drops the empty thinking block of past answers).
fn turns_extend_the_conversation(tok: &ChatTokenizer, what: &str, whole_too: bool) {
    let task = "x = [1, 2]\nprint(x)";
    let reply = "Your answer is incorrect. Try again.";
    let user = Message::new(Role::User, task);
    let first = tok.encode_prompt(std::slice::from_ref(&user)).unwrap();
    let opening = tok.decode(&first, false).unwrap();
    let opening = &opening[opening.rfind(task).unwrap() + task.len()..];
    for answer in ["[1, 2]", "3\n4"] {
        let said = tok.encode(answer).unwrap();
        let next = tok.next_turn(&first, &said, reply).unwrap();
        let mut before = first.clone();
        before.extend(&said);
        assert!(next.starts_with(&before), "{what}: {answer:?}");
        let text = tok.decode(&next[before.len()..], false).unwrap();
        assert!(
            text.starts_with(&tok.end_of_turn().text) && text.contains(reply),
            "{what}: {text:?}"
        );
        // The next answer opens as the first did (Qwen3: with its empty
        // thinking block).
        let tail = &opening[opening.find(&tok.end_of_turn().text).unwrap()..];
        assert!(text.ends_with(tail), "{what}: {text:?} against {tail:?}");
        let whole = tok
            .encode_prompt(&[
                user.clone(),
                Message::new(Role::Assistant, answer),
                Message::new(Role::User, reply),
            ])
            .unwrap();
        assert_eq!(whole == next, whole_too, "{what}: {answer:?}");
    }
}

#[test]
fn qwen3_pair_boundary_is_the_templates() {
    let dir = common::repo().join("target/fixtures/qwen3-tokenizer");
    if !dir.join("tokenizer.json").exists() {
        eprintln!(
            "*** SKIPPED qwen3_pair_boundary_is_the_templates: run .ci/fetch-qwen3-tokenizer.sh ***"
        );
        return;
    }
    let tok = ChatTokenizer::from_dir(&dir).unwrap();
    boundary_matches_the_template(&tok, "qwen3");
    turns_extend_the_conversation(&tok, "qwen3", false);
}

#[test]
fn smollm2_pair_boundary_is_the_templates() {
    let Some(dir) = common::train::smollm2_folder("smollm2_pair_boundary_is_the_templates") else {
        return;
    };
    let tok = ChatTokenizer::from_dir(&dir.path().join("smol")).unwrap();
    boundary_matches_the_template(&tok, "smollm2");
    turns_extend_the_conversation(&tok, "smollm2", true);
}

#[test]
fn tiny_pair_boundary_is_the_templates() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let tok = ChatTokenizer::from_dir(&dir.path().join("base")).unwrap();
    boundary_matches_the_template(&tok, "tiny");
    // An open side with no text has no token to score: refused, not a
    // division by zero in the NLL term.
    let pair = Pair {
        prompt_id: 0,
        prompt: "print(1)".into(),
        chosen: "".into(),
        rejected: "2".into(),
        chosen_open: true,
        rejected_open: true,
        kind: "first_error".into(),
        chosen_reward: 1.0,
        rejected_reward: 0.0,
        edit_distance: 1,
    };
    let e = TokenPair::new(&tok, &pair).unwrap_err().to_string();
    assert!(e.contains("open side with no text"), "{e}");
}

/// A pipeline folder whose Stage 2 is the tiny model (`ck/stage2_sft`)
/// and whose config (`p.json`) is `config`.
fn stage2_and_config(dir: &Path, config: &str) {
    let merged = dir.join("ck/stage2_sft/merged");
    let o = trace_train(dir, &["model", "tiny", merged.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(dir.join("p.json"), config).unwrap();
}

/// The pipeline's Stage 3 alone on the CPU, which must succeed; its stderr.
fn pipeline_stage3(dir: &Path, resume: bool) -> String {
    let mut args = vec![
        "pipeline",
        "--config",
        "p.json",
        "--checkpoints",
        "ck",
        "--start_stage",
        "3",
        "--last_stage",
        "3",
        "--device",
        "cpu",
    ];
    if resume {
        args.push("--resume");
    }
    let o = trace_train(dir, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    stderr(&o)
}

#[test]
fn pipeline_stage3_dpo_runs_rollouts_and_prefs_rounds_from_stage2() {
    let dir = tempfile::tempdir().unwrap();
    stage2_and_config(
        dir.path(),
        r#"{"model": {"load_in_4bit": false}, "gate": {"mode": "off"},
            "stage3": {"algorithm": "dpo", "ppo": {"environment": "word"},
                       "dpo": {"rounds": 2, "num_prompts": 3, "num_samples": 2,
                               "greedy": true, "first_error": true, "max_new_tokens": 4}}}"#,
    );
    let e = pipeline_stage3(dir.path(), false);
    for round in 0..2 {
        let r = dir.path().join(format!("ck/stage3_dpo/round_{round}"));
        // Two samples and the greedy answer (`stage3.dpo.greedy`) a prompt.
        let rows = lines(&r.join("rollouts.jsonl"));
        assert_eq!(rows.len(), 9, "round {round}: {e}");
        let greedy: Vec<_> = rows
            .iter()
            .filter(|r| r["sampling"]["temperature"].as_f64() == Some(0.0))
            .collect();
        assert_eq!(greedy.len(), 3, "round {round}");
        assert!(greedy.iter().all(|r| r["sample"].as_u64() == Some(2)));
        let st: serde_json::Value =
            serde_json::from_slice(&std::fs::read(r.join("pairs.jsonl.stats.json")).unwrap())
                .unwrap();
        assert_eq!(st["prompts"].as_u64(), Some(3), "{st}");
        // `stage3.dpo.first_error`: the tiny model's wrong answers give
        // pairs at their first wrong line, open sides marked, and the
        // round trains on them.
        let pairs = lines(&r.join("pairs.jsonl"));
        let fe = pairs.iter().filter(|p| p["kind"] == "first_error").count();
        assert!(fe > 0, "round {round}: {st}");
        assert_eq!(st["pairs"]["first_error"].as_u64(), Some(fe as u64), "{st}");
        assert!(
            pairs.iter().any(|p| p["chosen_open"] == true),
            "round {round}"
        );
        assert!(r.join("merged/config.json").is_file(), "round {round}: {e}");
        // Each round asks other prompts of the stream.
        assert!(e.contains(&format!("dpo round {round}")), "{e}");
    }
    let p0 = lines(&dir.path().join("ck/stage3_dpo/round_0/rollouts.jsonl"));
    let p1 = lines(&dir.path().join("ck/stage3_dpo/round_1/rollouts.jsonl"));
    assert_ne!(p0[0]["prompt_id"], p1[0]["prompt_id"]);
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ck/pipeline_state.json")).unwrap())
            .unwrap();
    assert_eq!(state["finished"], serde_json::json!([3]), "{state}");
}

/// Two in-process ranks (each a share of every step: whole micro-batches
/// with `accum` 2, row slices of one with `accum` 1) train what one rank
/// does: the same losses and margins, the same final adapter, up to the
/// order of additions.
#[test]
fn dpo_on_two_ranks_trains_what_one_rank_does() {
    use candle_core::Device;
    use trace_train::config::{DpoConfig, ModelConfig};
    use trace_train::dist::{Single, inprocess::run_ranks};
    use trace_train::kit::RunOptions;
    use trace_train::progress::NoProgress;
    use trace_train::recipes::dpo::{DpoJob, run_with};

    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    word_pairs(dir.path(), 8);
    let job = |out: &str, accum: usize| DpoJob {
        config: DpoConfig {
            batch_size: 2,
            gradient_accumulation_steps: accum,
            epochs: 2,
            optim: trace_train::config::OptimSettings {
                learning_rate: 1e-3,
                ..DpoConfig::default().optim
            },
            save: trace_train::config::SaveSettings {
                save_steps: 0,
                ..DpoConfig::default().save
            },
            schedule: trace_train::config::ScheduleSettings {
                warmup_ratio: 0.0,
                ..DpoConfig::default().schedule
            },
            lora: trace_train::config::LoraSettings {
                r: 4,
                alpha: 8.0,
                ..DpoConfig::default().lora
            },
            ..DpoConfig::default()
        },
        model: ModelConfig::default(),
        base_dir: dir.path().join("base"),
        base_commit: None,
        adapter: None,
        pairs_file: dir.path().join("pairs.jsonl"),
        run: RunOptions {
            output_dir: dir.path().join(out),
            device: Device::Cpu,
            resume: false,
            force: false,
            max_steps: None,
        },
    };
    let adapter = |out: &str| {
        let mut t: Vec<(String, candle_core::Tensor)> = candle_core::safetensors::load(
            dir.path().join(out).join("final/adapter_model.safetensors"),
            &Device::Cpu,
        )
        .unwrap()
        .into_iter()
        .collect();
        t.sort_by(|a, b| a.0.cmp(&b.0));
        t
    };
    for accum in [2, 1] {
        let (one, two) = (format!("one{accum}"), format!("two{accum}"));
        run_with(&job(&one, accum), &Single, &NoProgress).unwrap();
        run_ranks(2, |c| run_with(&job(&two, accum), &c, &NoProgress)).unwrap();
        for key in ["loss", "rewards/margins", "logps/chosen", "grad_norm"] {
            let (a, b) = (
                metric(&dir.path().join(&one), key),
                metric(&dir.path().join(&two), key),
            );
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                    "accum {accum}, {key}: {a:?} vs {b:?}"
                );
            }
        }
        let moved = adapter(&one)
            .iter()
            .filter(|(k, _)| k.contains("lora_B"))
            .map(|(_, t)| {
                t.abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            })
            .fold(0f32, f32::max);
        assert!(moved > 1e-4, "the adapter did not move");
        for ((k, a), (_, b)) in adapter(&one).iter().zip(adapter(&two).iter()) {
            let d = (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(d <= 1e-5, "accum {accum}: `{k}` differs by {d:e}");
        }
    }
}

/// `rollouts --base_precision`: bf16 is the default (the same answers for a
/// seed), fp8 samples from the FP8 codes, and a name it does not know is
/// refused with the three it does.
#[test]
fn rollouts_hold_the_base_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let answers = |out: &str, extra: &[&str]| {
        let o = rollouts_with(dir.path(), out, "3", extra);
        assert!(o.status.success(), "{}", stderr(&o));
        let rows = lines(&dir.path().join(out));
        assert_eq!(rows.len(), 12);
        rows.iter()
            .map(|r| r["completion"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let default = answers("d.jsonl", &[]);
    assert_eq!(answers("b.jsonl", &["--base_precision", "bf16"]), default);
    answers("f.jsonl", &["--base_precision", "fp8"]);
    let o = trace_train(
        dir.path(),
        &["rollouts", "--model", "base", "--base_precision", "fp16"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("fp16") && err.contains("bf16") && err.contains("fp8"),
        "{err}"
    );
}

/// `rollouts` on the trace environment: the built-in programs transformed
/// and run in the sandbox for their ground truth, the tiny model's answers
/// scored against it.
/// `rollouts` of the tiny model on the trace environment's built-in
/// programs into `out`: `prompts` prompts x `samples`, then `extra`.
fn trace_rollouts(
    dir: &Path,
    out: &str,
    prompts: &str,
    samples: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "rollouts",
        "--model",
        "base",
        "--environment",
        "trace",
        "--num_prompts",
        prompts,
        "--num_samples",
        samples,
        "--max_new_tokens",
        "4",
        "--num_workers",
        "2",
        "--device",
        "cpu",
        "--output",
        out,
    ];
    args.extend_from_slice(extra);
    trace_train(dir, &args)
}

#[test]
fn rollouts_on_the_trace_environment_carry_the_sandbox_ground_truth() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let o = trace_rollouts(dir.path(), "t.jsonl", "2", "2", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = lines(&dir.path().join("t.jsonl"));
    assert_eq!(rows.len(), 4, "{}", stderr(&o));
    for r in &rows {
        assert!(!r["expected"].as_str().unwrap().is_empty(), "{r}");
        // Trace's own right answer is the program's output.
        assert_eq!(r["demonstration"], r["expected"], "{r}");
        // The answer is what scoring reads of the completion.
        let completion = r["completion"].as_str().unwrap();
        assert_eq!(
            r["answer"].as_str().unwrap(),
            trace_train::reward::extract_answer(completion),
            "{r}"
        );
        // The tiny model's four tokens are not the program's output.
        assert_eq!(r["correct"].as_bool(), Some(false), "{r}");
    }
}

/// `rollouts --last_bucket 1`: only programs that print one line are
/// sampled, the others passed over and counted; a label the feature does
/// not have, on the command line or in the pipeline's DPO settings, is
/// refused with the labels it has.
#[test]
fn rollouts_up_to_a_bucket_sample_only_its_tasks() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let run = |bucket: &str, out: &str| {
        trace_rollouts(dir.path(), out, "4", "1", &["--last_bucket", bucket])
    };
    let o = run("1", "one.jsonl");
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = lines(&dir.path().join("one.jsonl"));
    assert_eq!(rows.len(), 4, "{}", stderr(&o));
    for r in &rows {
        let expected = r["expected"].as_str().unwrap();
        assert!(expected.trim_end_matches('\n').lines().count() <= 1, "{r}");
    }
    let stats: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        stats["skipped_tasks"]["above_last_bucket"]
            .as_u64()
            .unwrap()
            > 0,
        "the built-in programs that print several lines are passed over: {stats}"
    );

    let o = run("2", "bad.jsonl");
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("--last_bucket") && e.contains("2-3"), "{e}");
    assert!(!dir.path().join("bad.jsonl").exists(), "nothing written");

    // The pipeline's DPO settings `dpo`, refused by `config pipeline`: its
    // error.
    let refused = |dpo: &str| {
        std::fs::write(
            dir.path().join("p.json"),
            format!(r#"{{"stage3": {{"algorithm": "dpo", "dpo": {dpo}}}}}"#),
        )
        .unwrap();
        let o = trace_train(dir.path(), &["config", "pipeline", "--config", "p.json"]);
        assert!(!o.status.success(), "{dpo}");
        stderr(&o)
    };
    let e = refused(r#"{"last_bucket": "one"}"#);
    assert!(e.contains("last_bucket") && e.contains("`one`"), "{e}");

    // A feature that does not exist is refused under its own name, with or
    // without a bucket, and only once.
    for dpo in [
        r#"{"bucket_feature": "depth"}"#,
        r#"{"bucket_feature": "depth", "last_bucket": "1"}"#,
    ] {
        let e = refused(dpo);
        assert!(
            e.contains("bucket_feature") && e.contains("`depth`") && e.contains("loop_depth"),
            "{e}"
        );
        assert!(!e.contains("last_bucket"), "{e}");
    }
    let o = trace_rollouts(
        dir.path(),
        "feature.jsonl",
        "4",
        "1",
        &["--bucket_feature", "depth"],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--bucket_feature") && e.contains("`depth`"),
        "{e}"
    );
    assert!(
        !dir.path().join("feature.jsonl").exists(),
        "nothing written"
    );
}

/// The gate in the pipeline's DPO: every round (demonstration pairs, so
/// that the tiny model's all-wrong answers still train) is gated against
/// the model it started from (round 0 against Stage 2, round 1 against round 0), so
/// keep_best chooses among the rounds too; a resumed run gates the rounds
/// an earlier run trained from their reports.
#[test]
fn pipeline_dpo_gates_every_round() {
    let dir = tempfile::tempdir().unwrap();
    stage2_and_config(
        dir.path(),
        r#"{"model": {"load_in_4bit": false},
            "gate": {"mode": "keep_best", "sets": ["heldout_short"], "limit": 3,
                     "max_new_tokens": 4, "batch_size": 4},
            "stage3": {"algorithm": "dpo", "ppo": {"environment": "word"},
                       "dpo": {"rounds": 2, "num_prompts": 3, "num_samples": 2,
                               "max_new_tokens": 4, "demonstrations": true,
                               "train": {"epochs": 1, "batch_size": 2}}}}"#,
    );
    let e = pipeline_stage3(dir.path(), false);
    let gate: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ck/gate.json")).unwrap()).unwrap();
    let places: Vec<(u64, Option<u64>)> = gate["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["stage"].as_u64().unwrap(), s["round"].as_u64()))
        .collect();
    assert_eq!(places, [(2, None), (3, Some(0)), (3, Some(1))], "{gate}");
    let against: Vec<(u64, Option<u64>)> = gate["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["against"].as_u64().unwrap(), c["against_round"].as_u64()))
        .collect();
    assert_eq!(against, [(2, None), (3, Some(0))], "{gate}");
    for r in 0..2 {
        let report = dir
            .path()
            .join(format!("ck/gate/3_dpo_r{r}/heldout_short.json"));
        assert!(report.is_file(), "round {r}: {e}");
        assert!(e.contains(&format!("stage 3 (dpo r{r})")), "{e}");
    }
    // The tiny model answers none right anywhere: the tie goes to Stage 2.
    assert_eq!(gate["kept"], 2, "{gate}");
    assert!(gate.get("kept_round").is_none(), "{gate}");

    // Resumed after the end: nothing trains, the rounds' reports are read back.
    let e = pipeline_stage3(dir.path(), true);
    assert!(!e.contains("rollouts from"), "nothing trains again: {e}");
    assert!(
        e.contains("gate: dpo on `heldout_short`: the report of an earlier run"),
        "{e}"
    );
    let again: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ck/gate.json")).unwrap()).unwrap();
    assert_eq!(again["stages"], gate["stages"]);
    assert_eq!(again["comparisons"], gate["comparisons"]);
}

/// The Trace environment with what it knows of its rows' output hidden, so
/// that every draw is made: what rollouts drew before the early pass-over.
struct MakesEveryDraw(trace_train::env::TraceEnv);

impl trace_train::env::Environment for MakesEveryDraw {
    fn name(&self) -> &'static str {
        "trace"
    }
    fn task(&self, id: u64) -> Result<trace_train::env::Task, String> {
        self.0.task(id)
    }
    fn tasks(&self, ids: &[u64]) -> Vec<Result<trace_train::env::Task, String>> {
        self.0.tasks(ids)
    }
    fn score(&self, task: &trace_train::env::Task, completion: &str) -> trace_train::env::Score {
        self.0.score(task, completion)
    }
}

/// Under a cap on output lines, a draw whose row's own program already
/// prints too many lines is passed over without being made: the same
/// prompts, in the same order, as making every draw, the same number of
/// draws passed over, and the sandbox spared most of its runs.
#[test]
fn a_cap_on_output_lines_passes_over_long_rows_unmade_with_the_same_prompts() {
    use trace_train::data::buckets::UpToBucket;
    use trace_train::env::{Environment, TraceEnv};
    use trace_train::pref::rollout::{ABOVE_LAST_BUCKET, RolloutPlan, RolloutStats, draw_prompts};
    let env = || {
        // A few rows drawn many times each, as a real run draws its
        // dataset: 4 that print one line, 12 that print more.
        let (one, more): (Vec<_>, Vec<_>) = trace_train::dataset::builtin::programs()
            .into_iter()
            .partition(|r| {
                r.output
                    .as_deref()
                    .is_some_and(|o| o.trim().lines().count() == 1)
            });
        let rows: Vec<_> = one
            .into_iter()
            .take(4)
            .chain(more.into_iter().take(12))
            .collect();
        TraceEnv::new(
            rows,
            trace_train::sandbox::Executor::new(trace_train::sandbox::ExecutorConfig::new(
                common::PYTHON,
                2,
                false,
            ))
            .expect("sandbox executor (needs root)"),
            3,
        )
        .unwrap()
    };
    let draw = |env: &dyn Environment| {
        let plan = RolloutPlan {
            env,
            num_prompts: 16,
            num_samples: 1,
            greedy: false,
            task_seed: 5,
            first_draw: 0,
            max_prompt_tokens: usize::MAX,
            up_to: UpToBucket::from_settings("output_lines", Some("1")).unwrap(),
            sampling: Default::default(),
            max_rows: 0,
            model: "none".into(),
            model_commit: None,
            adapter: None,
            variants: Vec::new(),
        };
        let mut stats = RolloutStats::default();
        let tasks = draw_prompts(&plan, &mut stats, |t| {
            Ok(t.bytes().map(u32::from).collect())
        })
        .unwrap();
        let made: Vec<_> = tasks
            .iter()
            .map(|(t, _)| (t.task_id, t.prompt.clone(), t.expected.clone()))
            .collect();
        (made, stats)
    };
    let seeing = env();
    let (early, early_stats) = draw(&seeing);
    let blind = MakesEveryDraw(env());
    let (late, late_stats) = draw(&blind);
    assert_eq!(early.len(), 16);
    assert_eq!(early, late, "the same prompts");
    for (_, _, expected) in &early {
        assert!(expected.lines().count() <= 1, "{expected}");
    }
    assert_eq!(early_stats.next_draw, late_stats.next_draw);
    let passed = |s: &RolloutStats| s.skipped_tasks.values().sum::<u64>();
    assert_eq!(passed(&early_stats), passed(&late_stats));
    assert!(
        early_stats.skipped_tasks[ABOVE_LAST_BUCKET] > 0,
        "{early_stats:?}"
    );
    // The unmade draws are counted, among those above the last bucket.
    assert!(
        early_stats.unmade > 0
            && early_stats.unmade <= early_stats.skipped_tasks[ABOVE_LAST_BUCKET],
        "{early_stats:?}"
    );
    assert_eq!(late_stats.unmade, 0);
    let runs = |e: &TraceEnv| e.rows().unwrap().runs().iter().sum::<u64>();
    let (few, all) = (runs(&seeing), runs(&blind.0));
    assert!(
        few * 2 < all,
        "{few} sandbox runs with the early pass-over, {all} without"
    );
}

/// `greedy`: one more answer a prompt, sample `K`, marked temperature 0,
/// that is the greedy decode `eval` gives for the prompt alone: the same
/// under every sampling seed, while the sampled answers change with it.
#[test]
fn rollouts_add_the_greedy_answer_eval_would_give() {
    use candle_core::{DType, Device};
    use trace_train::env::WordEnv;
    use trace_train::pref::rollout::{RolloutPlan, roll_out};
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let base = dir.path().join("base");
    let tok = ChatTokenizer::from_dir(&base).unwrap();
    let model = trace_train::model::load(&base, None, DType::F32, &Device::Cpu).unwrap();
    let env = WordEnv::new(&["alpha", "beta", "gamma"]);
    let run = |seed: u64, greedy: bool| {
        let plan = RolloutPlan {
            env: &env,
            num_prompts: 3,
            num_samples: 4,
            greedy,
            task_seed: 3,
            first_draw: 0,
            max_prompt_tokens: usize::MAX,
            up_to: None,
            sampling: trace_train::pref::rollout::SamplingSettings {
                max_new_tokens: 6,
                seed,
                ..Default::default()
            },
            max_rows: 0,
            model: "base".into(),
            model_commit: None,
            adapter: None,
            variants: Vec::new(),
        };
        roll_out(&model, &tok, &plan).unwrap()
    };
    let (plain, stats) = run(1, false);
    assert_eq!((plain.len(), stats.rollouts), (12, 12));
    assert!(plain.iter().all(|r| !r.is_greedy()));
    let (a, stats) = run(1, true);
    let (b, _) = run(2, true);
    assert_eq!((a.len(), stats.rollouts, stats.prompts), (15, 15, 3));
    let right =
        |rs: &[trace_train::pref::rollout::Rollout]| rs.iter().filter(|r| r.correct).count();
    let greedy_right = a.iter().filter(|r| r.is_greedy() && r.correct).count();
    assert_eq!(
        (stats.correct, stats.greedy_correct),
        (right(&a), greedy_right)
    );
    // The sampled answers are the run without greedy's, each prompt's
    // greedy answer after them.
    let sampled: Vec<_> = a.iter().filter(|r| !r.is_greedy()).cloned().collect();
    assert_eq!(sampled, plain);
    for p in 0..3 {
        let g = &a[p * 5 + 4];
        assert!(g.is_greedy(), "{g:?}");
        assert_eq!(g.sample, 4);
        assert_eq!((g.sampling.top_p, g.sampling.top_k), (1.0, 0));
        assert_eq!(g.prompt_id, a[p * 5].prompt_id);
        assert_eq!(b[p * 5 + 4].completion, g.completion, "seed-free");
        // What eval decodes for this prompt alone.
        let ids = tok
            .encode_prompt(&[Message::new(Role::User, g.prompt.clone())])
            .unwrap();
        let alone = trace_train::model::decode::generate::greedy(
            &model.model,
            &[ids],
            6,
            &tok.stop_ids(),
            tok.pad().id,
            0,
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(g.completion, tok.decode(&alone[0].tokens, true).unwrap());
        assert_eq!(g.tokens, alone[0].tokens.len());
    }
    let differs = (0..15).any(|i| i % 5 != 4 && a[i].completion != b[i].completion);
    assert!(differs, "the sampled answers follow the seed");
}

/// Prompt variants (`rollouts --prompt_variants`): each sample is drawn
/// under one variant, named on its line, with the task's own prompt kept
/// for the pairs; a variant that asks the prompt as it is samples what no
/// variant does, and another template changes what is sampled.
#[test]
fn rollouts_draw_a_prompt_variant_a_sample() {
    use candle_core::{DType, Device};
    use trace_train::env::WordEnv;
    use trace_train::pref::rollout::{PromptVariant, RolloutPlan, SamplingSettings, roll_out};
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let base = dir.path().join("base");
    let tok = ChatTokenizer::from_dir(&base).unwrap();
    let model = trace_train::model::load(&base, None, DType::F32, &Device::Cpu).unwrap();
    let env = WordEnv::new(&["alpha", "beta", "gamma"]);
    let run = |variants: Vec<PromptVariant>| {
        let plan = RolloutPlan {
            env: &env,
            num_prompts: 3,
            num_samples: 6,
            greedy: true,
            task_seed: 3,
            first_draw: 0,
            max_prompt_tokens: usize::MAX,
            up_to: None,
            sampling: SamplingSettings {
                max_new_tokens: 6,
                seed: 1,
                ..Default::default()
            },
            max_rows: 0,
            model: "base".into(),
            model_commit: None,
            adapter: None,
            variants,
        };
        roll_out(&model, &tok, &plan).unwrap().0
    };
    let plain = run(Vec::new());
    let same = run(vec![PromptVariant {
        name: "as_is".into(),
        template: "{prompt}".into(),
    }]);
    let text = |rs: &[trace_train::pref::rollout::Rollout]| -> Vec<String> {
        rs.iter().map(|r| r.completion.clone()).collect()
    };
    assert_eq!(text(&same), text(&plain));
    assert!(
        same.iter()
            .all(|r| r.variant.as_deref() == if r.is_greedy() { None } else { Some("as_is") })
    );
    let styled = run(PromptVariant::builtin());
    let names: std::collections::BTreeSet<&str> =
        styled.iter().filter_map(|r| r.variant.as_deref()).collect();
    assert_eq!(
        names.len(),
        3,
        "every style drawn over 18 samples: {names:?}"
    );
    for (a, b) in styled.iter().zip(&plain) {
        assert_eq!((a.prompt_id, &a.prompt), (b.prompt_id, &b.prompt));
    }
    // The greedy answers read the task's own prompt; the sampled ones
    // read their variant's.
    let greedy = |rs: &[trace_train::pref::rollout::Rollout]| -> Vec<String> {
        rs.iter()
            .filter(|r| r.is_greedy())
            .map(|r| r.completion.clone())
            .collect()
    };
    assert_eq!(greedy(&styled), greedy(&plain));
    assert_ne!(text(&styled), text(&plain));
    // A variants file: refused without `{prompt}`, or with a name twice.
    let f = dir.path().join("v.json");
    std::fs::write(&f, r#"[{"name": "a", "template": "Answer."}]"#).unwrap();
    let e = format!(
        "{:#}",
        PromptVariant::load(f.to_str().unwrap()).unwrap_err()
    );
    assert!(
        e.contains("variant 0 (`a`)") && e.contains("{prompt}"),
        "{e}"
    );
    std::fs::write(
        &f,
        r#"[{"name": "a", "template": "{prompt}"}, {"name": "a", "template": "x {prompt}"}]"#,
    )
    .unwrap();
    assert!(
        format!(
            "{:#}",
            PromptVariant::load(f.to_str().unwrap()).unwrap_err()
        )
        .contains("twice")
    );
}
