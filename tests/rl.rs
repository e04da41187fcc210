//! Stage 3 on the tiny chat model: PPO and GRPO learn a verifiable reward
//! ("answer with the given word"), one update changes what the sampler
//! draws, and a run killed with SIGKILL resumes to the same curriculum
//! state, batches and adapter as an uninterrupted one (the real binary).

mod common;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{D, Device, Tensor};
use common::{
    ppo_args, sigterm_during_last_step, start, stderr, trace_train, wait_for_steps, word_grpo,
};
use trace_train::config::{CurriculumConfig, ModelConfig, RlConfig};
use trace_train::dataset::SourceRow;
use trace_train::dist::inprocess::run_ranks;
use trace_train::env::{Environment, TraceEnv, WordEnv, WordStepsEnv};
use trace_train::model::decode::generate::Generation;
use trace_train::recipes::ppo::{self, Policy, RlJob, Sample};
use trace_train::recipes::sft::NoProgress;
use trace_train::sandbox::Executor;

/// Settings for the tiny model: one new token, so a completion is the word
/// or not, and a high learning rate (the tiny model's LoRA is small).
fn tiny_config(algorithm: &str) -> RlConfig {
    RlConfig {
        algorithm: algorithm.into(),
        batch_size: 16,
        group_size: Some(if algorithm == "ppo" { 1 } else { 4 }),
        value_learning_rate: 1e-2,
        num_train_steps: 20,
        ppo_epochs: 2,
        mini_batch_size: 64,
        max_new_tokens: 1,
        kl_coef: Some(0.0),
        environment: "word".into(),
        optim: trace_train::config::OptimSettings {
            learning_rate: if algorithm == "ppo" { 2e-2 } else { 1e-2 },
            ..RlConfig::default().optim
        },
        lora: trace_train::config::LoraSettings {
            r: 8,
            alpha: 16.0,
            ..RlConfig::default().lora
        },
        save: trace_train::config::SaveSettings {
            save_steps: 0,
            ..RlConfig::default().save
        },
        ..RlConfig::default()
    }
}

fn tiny_model(dir: &Path) -> std::path::PathBuf {
    let base = dir.join("base");
    trace_train::model::arch::tiny::write_tiny_chat_model(&base, 7).unwrap();
    base
}

/// A one-character word and a temperature at which the untrained tiny model
/// answers it with probability between 5 and 40% (RL sharpens what a model
/// sometimes does; a random model never writes a given word unprompted).
fn learnable_word(base: &Path) -> (String, f64) {
    let policy = Policy::load(
        base,
        &tiny_config("ppo"),
        &ModelConfig::default(),
        &Device::Cpu,
    )
    .unwrap();
    for temperature in [1.0, 2.0, 4.0, 8.0] {
        for c in ('a'..='z').chain('0'..='9') {
            let word = c.to_string();
            let env = WordEnv::new(&[&word]);
            let task = env.task(0).unwrap();
            let ids = policy.encode(&task.prompt).unwrap();
            let n = ids.len();
            let ids = Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap();
            let logits = policy.loaded.model.forward(&ids, None, false).unwrap();
            let last = (logits.get(0).unwrap().get(n - 1).unwrap() / temperature).unwrap();
            let p = candle_nn::ops::softmax(&last, D::Minus1)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            // Byte-level vocabulary: a lowercase letter or digit is its byte.
            let mut prob = p[c as usize];
            if c.is_ascii_lowercase() {
                prob += p[c.to_ascii_uppercase() as usize];
            }
            if (0.05..0.4).contains(&prob) {
                return (word, temperature);
            }
        }
    }
    panic!("no word the tiny model sometimes answers");
}

fn rewards(metrics: &Path) -> Vec<f64> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["reward"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

fn learns(algorithm: &str) {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_model(dir.path());
    let (word, temperature) = learnable_word(&base);
    let mut config = tiny_config(algorithm);
    config.temperature = temperature;
    let job = RlJob {
        config,
        curriculum: CurriculumConfig::default(),
        model: ModelConfig::default(),
        base_dir: base,
        output_dir: dir.path().join("out"),
        device: Device::Cpu,
        env: Arc::new(WordEnv::new(&[&word])),
        env_description: format!("word:{word}"),
        resume: false,
        force: false,
        max_steps: None,
    };
    let s = ppo::run(&job, &NoProgress).unwrap();
    assert_eq!(s.steps, 20);
    let r = rewards(&dir.path().join("out/metrics.jsonl"));
    // The first step's reward is the untrained model's (sampled before
    // any update).
    let first = r[0];
    let last = r[r.len() - 3..].iter().sum::<f64>() / 3.0;
    assert!(
        last >= 0.8 && last > first + 0.3,
        "{algorithm}: word `{word}` at T={temperature}: reward {first:.3} -> {last:.3}: {r:?}"
    );
    // The sampler and the trainer agree on the sampled tokens' log-probs
    // (both f32 on the CPU; the sampler decodes with the KV cache). A GRPO
    // step whose groups all had equal rewards trains nothing and has none.
    let mismatch: Vec<f64> = std::fs::read_to_string(dir.path().join("out/metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["logprob_mismatch_max"].as_f64()
        })
        .collect();
    assert!(!mismatch.is_empty());
    assert!(mismatch.iter().all(|&m| m < 1e-3), "{mismatch:?}");
    for f in [
        "final/adapter_model.safetensors",
        "merged/model.safetensors",
        "merged/tokenizer.json",
    ] {
        assert!(dir.path().join("out").join(f).exists(), "missing {f}");
    }
    if algorithm == "ppo" {
        assert!(dir.path().join("out/final/value_head.safetensors").exists());
    }
    // The micro-batch budget (the CPU's default) and checkpointing (off on
    // the CPU) are recorded: once in the metrics, and in train_config.json.
    let lines = lines_of(&dir.path().join("out/metrics.jsonl"));
    assert_eq!(lines[0]["micro_batch_tokens"], 8192.0);
    assert!(
        lines[1..]
            .iter()
            .all(|l| l.get("micro_batch_tokens").is_none())
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/train_config.json")).unwrap())
            .unwrap();
    assert_eq!(record["micro_batch_tokens"], 8192);
    assert_eq!(record["gradient_checkpointing"], false);
}

#[test]
fn ppo_raises_the_reward_of_answering_with_the_given_word() {
    learns("ppo");
}

#[test]
fn grpo_raises_the_reward_of_answering_with_the_given_word() {
    learns("grpo");
}

#[test]
fn dr_grpo_raises_the_reward_of_answering_with_the_given_word() {
    learns("dr_grpo");
}

#[test]
fn gspo_raises_the_reward_of_answering_with_the_given_word() {
    learns("gspo");
}

/// Every algorithm through the command line (`ppo --algorithm`, over the
/// config file's) and through the pipeline's Stage 3 (`stage3.ppo.algorithm`),
/// on the word environment: two steps, finite losses, the run's outputs.
#[test]
fn each_algorithm_runs_through_ppo_and_the_pipeline() {
    for algorithm in ["dr_grpo", "gspo"] {
        let dir = tempfile::tempdir().unwrap();
        word_grpo(dir.path(), 2, 2, 4);
        let out = format!("run_{algorithm}");
        let o = trace_train(dir.path(), &ppo_args(&out, &["--algorithm", algorithm]));
        let err = stderr(&o);
        assert!(o.status.success(), "{algorithm}: {err}");
        assert!(
            err.contains(&format!("stage 3: {algorithm} on the word environment")),
            "{err}"
        );
        let lines = lines_of(&dir.path().join(&out).join("metrics.jsonl"));
        assert_eq!(lines.len(), 2, "{algorithm}");
        assert!(
            lines
                .iter()
                .all(|l| l["policy_loss"].as_f64().is_some_and(f64::is_finite)),
            "{lines:?}"
        );
        assert!(
            dir.path()
                .join(&out)
                .join("merged/model.safetensors")
                .is_file()
        );
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(&out).join("train_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(record["ppo"]["algorithm"], algorithm, "{record}");

        // The pipeline's Stage 3 from a Stage 2 model already there.
        let root = dir.path().join("ck");
        std::fs::create_dir_all(root.join("stage2_sft")).unwrap();
        std::fs::rename(dir.path().join("base"), root.join("stage2_sft/merged")).unwrap();
        let config = format!(
            r#"{{"model": {{"load_in_4bit": false}}, "gate": {{"mode": "off"}},
                "stage3": {{"ppo": {{"algorithm": "{algorithm}", "environment": "word",
                  "group_size": 2, "batch_size": 2, "num_train_steps": 2, "max_new_tokens": 4,
                  "mini_batch_size": 2, "save_steps": 0, "learning_rate": 0.001}}}}}}"#
        );
        std::fs::write(dir.path().join("p.json"), config).unwrap();
        let o = trace_train(
            dir.path(),
            &[
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
            ],
        );
        let err = stderr(&o);
        assert!(o.status.success(), "{algorithm}: {err}");
        assert!(
            err.contains(&format!("stage 3: {algorithm} on the word environment")),
            "{err}"
        );
        assert!(root.join("stage3_ppo/merged/model.safetensors").is_file());
    }
}

#[test]
fn one_update_changes_what_the_sampler_draws() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_model(dir.path());
    let (word, temperature) = learnable_word(&base);
    let mut cfg = tiny_config("grpo");
    cfg.temperature = temperature;
    cfg.optim.learning_rate = 5e-2;
    cfg.ppo_epochs = 1;
    let mut policy = Policy::load(&base, &cfg, &ModelConfig::default(), &Device::Cpu).unwrap();
    let env = WordEnv::new(&[&word]);
    let task = env.task(0).unwrap();
    let ids = policy.encode(&task.prompt).unwrap();
    let prompts = vec![ids.clone(); 64];
    let hits = |g: &[Generation], policy: &Policy| {
        g.iter()
            .filter(|g| {
                trace_train::reward::score(&policy.tok.decode(&g.tokens, true).unwrap(), &word)
                    == 1.0
            })
            .count()
    };
    let before = policy.sample(&prompts, 11).unwrap();
    let mut samples: Vec<Sample> = before
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let r = trace_train::reward::score(&policy.tok.decode(&g.tokens, true).unwrap(), &word);
            Sample::new(i / 4, ids.clone(), g, policy.stop_id(), r)
        })
        .collect();
    policy.score_old(&mut samples).unwrap();
    policy.advantages(&mut samples);
    let st = policy.update(&samples, 0, cfg.optim.learning_rate).unwrap();
    assert_eq!(st.minibatches, 1);
    // The same seed: the sampler draws the same uniforms from the updated
    // weights (the live model, no copy to refresh).
    let after = policy.sample(&prompts, 11).unwrap();
    assert_ne!(before, after, "the update did not reach the sampler");
    assert!(
        hits(&after, &policy) > hits(&before, &policy),
        "{} -> {}",
        hits(&before, &policy),
        hits(&after, &policy)
    );
}

fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            // Wall-clock figures differ run to run; everything else must not.
            v.as_object_mut()
                .unwrap()
                .retain(|k, _| !k.starts_with("time_") && !k.contains("per_s") && k != "wall_time");
            v
        })
        .collect()
}

/// Twelve short programs printing 1 to 6 lines, as `rows.jsonl` in `dir`.
fn write_counting_rows(dir: &Path) {
    let mut rows = String::new();
    for k in 0..12u32 {
        let n = k % 6 + 1;
        let program = "n = int(input())\nt = 0\nfor i in range(n):\n    t = t + i\n    print(t)\n";
        let output: Vec<String> = (0..n).map(|i| (i * (i + 1) / 2).to_string()).collect();
        rows.push_str(&format!(
            "{}\n",
            serde_json::json!({"program": program, "inputs": format!("{n}\n"), "output": output.join("\n")})
        ));
    }
    std::fs::write(dir.join("rows.jsonl"), rows).unwrap();
}

/// The tiny chat model as `base` (made through the CLI) and the counting
/// programs as `rows.jsonl`, in `dir`.
fn tiny_base_and_counting_rows(dir: &Path) {
    let o = trace_train(dir, &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    write_counting_rows(dir);
}

/// Runs `ppo_args` to the end as `full`, and as `cut` killed (SIGKILL) once
/// its metrics pass step 3 and then resumed; both runs' metrics.
fn full_and_killed_then_resumed(dir: &Path) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let o = trace_train(dir, &ppo_args("full", &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let mut child = start(dir, &ppo_args("cut", &[]), Stdio::null());
    let metrics = dir.join("cut/metrics.jsonl");
    wait_for_steps(&metrics, 3, Duration::from_secs(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!dir.join("cut/final").exists(), "killed before the end");
    let o = trace_train(dir, &ppo_args("cut", &["--resume"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed at"), "{}", stderr(&o));
    (
        lines_of(&dir.join("full/metrics.jsonl")),
        lines_of(&metrics),
    )
}

/// Multi-turn episodes (feedback naming the wrong line, three answers at
/// most) stop and resume exactly; each step reports accuracy after each
/// answer, never falling from one answer to the next.
#[test]
fn multi_turn_episodes_resume_exactly_and_report_accuracy_by_answer() {
    let dir = tempfile::tempdir().unwrap();
    tiny_base_and_counting_rows(dir.path());
    std::fs::write(
        dir.path().join("s3.json"),
        r#"{"ppo": {"algorithm": "grpo", "group_size": 2, "dynamic_sampling": false, "batch_size": 2,
                    "num_train_steps": 4, "max_new_tokens": 3, "mini_batch_size": 4, "save_steps": 2,
                    "learning_rate": 0.001, "max_prompt_tokens": 2000, "num_workers": 2, "kl_coef": 0.01,
                    "dataset": "rows.jsonl", "max_turns": 3, "feedback": "line"}}"#,
    )
    .unwrap();
    let (full, cut) = full_and_killed_then_resumed(dir.path());
    assert_eq!(full.len(), 4);
    assert_eq!(full, cut, "the resumed run's steps differ");
    let mut retries = 0.0;
    for v in &full {
        let acc: Vec<f64> = (1..=3)
            .map(|t| v[format!("accuracy/turn={t}")].as_f64().unwrap())
            .collect();
        assert!(acc.windows(2).all(|w| w[0] <= w[1]), "{v}");
        assert_eq!(acc[2], v["accuracy"].as_f64().unwrap(), "{v}");
        let u = v["unchanged_retries"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&u), "{v}");
        retries += v["retries"].as_f64().unwrap();
    }
    // An untrained tiny model is wrong nearly always: episodes go on.
    assert!(retries > 0.0, "no episode had a second answer: {full:?}");
}

/// The episode budget (`max_episode_tokens`): where the next turn's prompt
/// and answer would not fit, the episode ends after its answer and is
/// counted; with the budget unset the same run goes on to second answers.
#[test]
fn episodes_past_their_token_budget_end_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    tiny_base_and_counting_rows(dir.path());
    let config = |budget: usize| {
        format!(
            r#"{{"ppo": {{"algorithm": "grpo", "group_size": 2, "dynamic_sampling": false, "batch_size": 2,
                        "num_train_steps": 2, "max_new_tokens": 3, "mini_batch_size": 4, "save_steps": 10,
                        "learning_rate": 0.001, "max_prompt_tokens": 2000, "num_workers": 2,
                        "dataset": "rows.jsonl", "max_turns": 2, "feedback": "first_diff",
                        "max_episode_tokens": {budget}}}}}"#
        )
    };
    let run = |budget: usize, out: &str| {
        std::fs::write(dir.path().join("s3.json"), config(budget)).unwrap();
        let o = trace_train(dir.path(), &ppo_args(out, &[]));
        assert!(o.status.success(), "{}", stderr(&o));
        lines_of(&dir.path().join(out).join("metrics.jsonl"))
    };
    let sum = |rows: &[serde_json::Value], k: &str| -> f64 {
        rows.iter().map(|v| v[k].as_f64().unwrap()).sum()
    };
    // The first prompt alone is far past 10 tokens: no second turn fits.
    let tight = run(10, "tight");
    assert_eq!(sum(&tight, "retries"), 0.0, "{tight:?}");
    // Every episode of an untrained model is wrong nearly always, and each
    // wrong one wanted a second turn: 2 steps x 2 prompts x 2 answers.
    let over = sum(&tight, "episodes_over_budget");
    assert!(over > 0.0 && over <= 8.0, "{tight:?}");
    for v in &tight {
        assert_eq!(v["accuracy/turn=1"], v["accuracy/turn=2"], "{v}");
    }
    let open = run(0, "open");
    assert!(sum(&open, "retries") > 0.0, "{open:?}");
    assert_eq!(sum(&open, "episodes_over_budget"), 0.0, "{open:?}");
}

#[test]
fn kill_9_then_resume_repeats_the_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    // The trace environment (programs transformed and run in the sandbox)
    // on twelve short programs printing 1 to 6 lines before injection, so
    // prompts are short and every output-line bucket comes up; a curriculum
    // that moves on every full window (threshold 0); GRPO with dynamic
    // sampling off so every step trains; a token budget that gives each
    // completion its own micro-batch (a resume repeats those too).
    tiny_base_and_counting_rows(dir.path());
    std::fs::write(
        dir.path().join("s3.json"),
        r#"{"ppo": {"algorithm": "grpo", "group_size": 2, "dynamic_sampling": false, "batch_size": 2,
                    "num_train_steps": 6, "max_new_tokens": 2, "mini_batch_size": 4, "save_steps": 2,
                    "learning_rate": 0.001, "max_prompt_tokens": 2000, "num_workers": 2, "kl_coef": 0.01,
                    "dataset": "rows.jsonl", "micro_batch_tokens": 1,
                    "temperature_schedule": {"enabled": true, "initial": 1.5, "final": 0.5,
                                             "warmup_steps": 4}},
            "curriculum": {"enabled": true, "promotion_threshold": 0.0, "window": 4}}"#,
    )
    .unwrap();
    // Killed past the step-2 checkpoint, before the end.
    let (full, cut) = full_and_killed_then_resumed(dir.path());
    assert_eq!(full.len(), 6);
    assert_eq!(full, cut, "the resumed run's steps differ");
    // The temperature schedule, step by step, resumed with the run.
    let temps: Vec<f64> = full
        .iter()
        .map(|v| v["temperature"].as_f64().unwrap())
        .collect();
    assert_eq!(temps, [1.5, 1.25, 1.0, 0.75, 0.5, 0.5]);
    let levels: Vec<f64> = full
        .iter()
        .map(|v| v["curriculum_level"].as_f64().unwrap())
        .collect();
    assert!(
        levels.windows(2).any(|w| w[1] > w[0]),
        "the curriculum never moved: {levels:?}"
    );
    // The same curriculum state, task cursor and counters at the end.
    let state = |run: &str| -> serde_json::Value {
        let s: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(run).join("step_6/trainer_state.json")).unwrap(),
        )
        .unwrap();
        s["extra"].clone()
    };
    assert_eq!(state("full"), state("cut"));
    assert!(
        state("full")["curriculum"]["history"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    );
    assert_eq!(
        std::fs::read(dir.path().join("full/final/adapter_model.safetensors")).unwrap(),
        std::fs::read(dir.path().join("cut/final/adapter_model.safetensors")).unwrap(),
        "final adapters differ"
    );
}

/// A run of `config` on the tiny model at `base` in the word environment
/// of `words`, writing to `out`: fresh, on the CPU.
fn word_job(config: &RlConfig, base: &Path, out: &Path, words: &[&str]) -> RlJob {
    RlJob {
        config: config.clone(),
        curriculum: CurriculumConfig::default(),
        model: ModelConfig::default(),
        base_dir: base.to_path_buf(),
        output_dir: out.to_path_buf(),
        device: Device::Cpu,
        env: Arc::new(WordEnv::new(words)),
        env_description: format!("word:{}", words.join(",")),
        resume: false,
        force: false,
        max_steps: None,
    }
}

/// One RL run of `config` on `world` in-process ranks (threads); rank 0's
/// metrics.
fn run_on_ranks(
    dir: &Path,
    base: &Path,
    word: &str,
    config: &RlConfig,
    world: usize,
) -> Vec<serde_json::Value> {
    let out = dir.join(format!("{}-{world}", config.algorithm));
    let job = word_job(config, base, &out, &[word]);
    let summaries = run_ranks(world, |c| ppo::run_with(&job, &c, &NoProgress)).unwrap();
    assert!(
        summaries
            .iter()
            .all(|s| s.steps == config.num_train_steps as u64)
    );
    assert!(out.join("final/adapter_model.safetensors").exists());
    lines_of(&out.join("metrics.jsonl"))
}

#[test]
fn two_and_three_ranks_train_as_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_model(dir.path());
    let (word, temperature) = learnable_word(&base);
    // GRPO: whole groups a rank, dynamic sampling's rounds decided on the
    // kept groups of every rank; minibatches of 24 completions cut across
    // the ranks' shares. PPO: three new tokens (completions of several
    // lengths, so token weights matter) and advantages whitened over every
    // rank's tokens.
    let mut grpo = tiny_config("grpo");
    grpo.temperature = temperature;
    grpo.num_train_steps = 5;
    grpo.mini_batch_size = 24;
    let mut ppo_cfg = tiny_config("ppo");
    ppo_cfg.temperature = temperature;
    ppo_cfg.num_train_steps = 5;
    ppo_cfg.mini_batch_size = 6;
    ppo_cfg.max_new_tokens = 3;
    ppo_cfg.kl_coef = Some(0.05);
    // Gentle steps: at the learning test's rates three-token answers
    // collapse onto one sequence within five steps (entropy near 1e-5),
    // where rounding alone moves the value loss.
    ppo_cfg.optim.learning_rate = 2e-3;
    ppo_cfg.value_learning_rate = 1e-3;
    for config in [grpo, ppo_cfg] {
        let one = run_on_ranks(dir.path(), &base, &word, &config, 1);
        let rewards: Vec<f64> = one.iter().map(|m| m["reward"].as_f64().unwrap()).collect();
        assert!(
            rewards.iter().any(|&r| r > 0.0),
            "{}: no reward at all, nothing is compared: {rewards:?}",
            config.algorithm
        );
        for world in [2, 3] {
            let many = run_on_ranks(dir.path(), &base, &word, &config, world);
            assert_eq!(one.len(), many.len());
            if std::env::var_os("RL_DEBUG").is_some() {
                for (a, b) in one.iter().zip(&many) {
                    eprintln!("{a}\n{b}\n");
                }
            }
            for (step, (a, b)) in one.iter().zip(&many).enumerate() {
                for key in [
                    "reward",
                    "scored",
                    "trained_samples",
                    "sampling_rounds",
                    "stopped_fraction",
                ] {
                    assert_eq!(
                        a[key], b[key],
                        "{} on {world} ranks, step {step}, {key}",
                        config.algorithm
                    );
                }
                for key in [
                    "policy_loss",
                    "grad_norm",
                    "entropy",
                    "kl",
                    "clip_fraction",
                    "value_loss",
                ] {
                    let (Some(x), Some(y)) = (a[key].as_f64(), b[key].as_f64()) else {
                        assert_eq!(a.get(key).is_some(), b.get(key).is_some(), "{key}");
                        continue;
                    };
                    assert!(
                        (x - y).abs() <= 1e-4 * (1.0 + x.abs().max(y.abs())),
                        "{} on {world} ranks, step {step}, {key}: {x} vs {y}",
                        config.algorithm
                    );
                }
            }
        }
    }
}

/// Sandbox uids of this file's in-process trace environment (clear of the
/// other test binaries' ranges).
const TRACE_UIDS: u32 = 61_070;

#[test]
fn ranks_share_the_trace_environment_and_read_the_same_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_model(dir.path());
    // Programs printing 1 to 6 lines; each rank makes every other task in
    // the sandbox and the ranks exchange them; the curriculum (a full
    // window promotes) and the task cursor must move as in one process.
    let rows: Vec<SourceRow> = (0..12u64)
        .map(|k| {
            let n = k % 6 + 1;
            let output: Vec<String> = (0..n).map(|i| (i * (i + 1) / 2).to_string()).collect();
            SourceRow {
                index: k,
                name: format!("row {k}"),
                program:
                    "n = int(input())\nt = 0\nfor i in range(n):\n    t = t + i\n    print(t)\n"
                        .into(),
                inputs: format!("{n}\n"),
                output: Some(output.join("\n")),
            }
        })
        .collect();
    let exec = Executor::new(common::sandbox_config(2, TRACE_UIDS))
        .expect("sandbox executor (needs root)");
    let env: Arc<dyn Environment> = Arc::new(TraceEnv::new(rows, exec, 3).unwrap());
    let mut config = tiny_config("grpo");
    config.batch_size = 4;
    config.group_size = Some(2);
    config.dynamic_sampling = false;
    config.num_train_steps = 3;
    config.max_new_tokens = 2;
    config.mini_batch_size = 4;
    // The tiny model earns no reward here, so advantages are zero; a KL
    // term alone would be float noise that AdamW scales into full steps,
    // different on one and two ranks. Without it the weights stay put and
    // the test is about the tasks.
    config.kl_coef = Some(0.0);
    config.max_prompt_tokens = 2000;
    let run = |world: usize| {
        let out = dir.path().join(format!("trace-{world}"));
        let job = RlJob {
            config: config.clone(),
            curriculum: CurriculumConfig {
                enabled: true,
                promotion_threshold: 0.0,
                window: 4,
                ..CurriculumConfig::default()
            },
            model: ModelConfig::default(),
            base_dir: base.clone(),
            output_dir: out.clone(),
            device: Device::Cpu,
            env: Arc::clone(&env),
            env_description: "trace:rows".into(),
            resume: false,
            force: false,
            max_steps: None,
        };
        run_ranks(world, |c| ppo::run_with(&job, &c, &NoProgress)).unwrap();
        lines_of(&out.join("metrics.jsonl"))
    };
    let (one, two) = (run(1), run(2));
    assert_eq!((one.len(), two.len()), (3, 3));
    for (step, (a, b)) in one.iter().zip(&two).enumerate() {
        for key in [
            "task_cursor",
            "curriculum_level",
            "scored",
            "trained_samples",
            "reward",
            "response_tokens_mean",
            "skipped_tasks_total/error_exit",
        ] {
            assert_eq!(a.get(key), b.get(key), "step {step}, {key}");
        }
    }
    let levels: Vec<f64> = one
        .iter()
        .map(|m| m["curriculum_level"].as_f64().unwrap())
        .collect();
    assert!(
        levels.windows(2).any(|w| w[1] > w[0]),
        "the curriculum never moved: {levels:?}"
    );
}

#[test]
fn a_stop_during_the_last_step_still_saves_the_whole_run() {
    // SIGTERM while the last step runs: that step completes the run, so the
    // run must end as a whole one (final adapter, merged model, its last
    // checkpoint), not as a stopped one that saved nothing.
    let dir = tempfile::tempdir().unwrap();
    word_grpo(dir.path(), 4, 3, 48);
    let child = start(dir.path(), &ppo_args("run", &[]), Stdio::piped());
    let metrics = dir.path().join("run/metrics.jsonl");
    // Steps 1 and 2 logged: step 3, the last, is running.
    sigterm_during_last_step(
        child,
        &metrics,
        2,
        &dir.path().join("run"),
        &["final/adapter_model.safetensors", "merged", "step_3"],
    );
    assert_eq!(lines_of(&metrics).len(), 3);
}

/// One-step off-policy (`sampler_ranks`): the last ranks sample step k+1's
/// batch while the others train on step k's. The first batch is on-policy
/// (the synchronous run's); later ones are one update old, weighted by
/// truncated importance ratios; the run still learns. How the ranks split
/// between sampling and training does not change what is learned: one
/// sampler and one trainer, one sampler and two trainers, two samplers and
/// one trainer train as one another.
#[test]
fn off_policy_ranks_learn_and_train_as_one_whatever_the_split() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_model(dir.path());
    let (word, temperature) = learnable_word(&base);
    let mut config = tiny_config("grpo");
    config.temperature = temperature;
    config.mini_batch_size = 24;
    let run = |world: usize, samplers: usize| {
        let out = dir.path().join(format!("off-{world}-{samplers}"));
        let config = RlConfig {
            sampler_ranks: samplers,
            ..config.clone()
        };
        let job = word_job(&config, &base, &out, &[&word]);
        let summaries = run_ranks(world, |c| ppo::run_with(&job, &c, &NoProgress))?;
        assert!(summaries.iter().all(|s| s.steps == 20 && !s.interrupted));
        assert!(out.join("final/adapter_model.safetensors").exists());
        anyhow::Ok(lines_of(&out.join("metrics.jsonl")))
    };
    let sync = run(1, 0).unwrap();
    let off = run(2, 1).unwrap();
    assert_eq!(off.len(), 20);
    let r: Vec<f64> = off.iter().map(|m| m["reward"].as_f64().unwrap()).collect();
    let last = r[r.len() - 3..].iter().sum::<f64>() / 3.0;
    assert!(
        last >= 0.8 && last > r[0] + 0.3,
        "word `{word}` at T={temperature}: reward {:.3} -> {last:.3}: {r:?}",
        r[0]
    );
    for key in ["reward", "scored", "trained_samples"] {
        assert_eq!(off[0][key], sync[0][key], "step 0 is on-policy: {key}");
    }
    let stale: Vec<f64> = off
        .iter()
        .map(|m| m["staleness"].as_f64().unwrap())
        .collect();
    assert!(
        stale[0] == 0.0 && stale[1..].iter().all(|&x| x == 1.0),
        "{stale:?}"
    );
    assert!(
        off.iter()
            .zip(&sync)
            .skip(1)
            .any(|(a, b)| a["reward"] != b["reward"]),
        "every later batch equals the synchronous run's: were they sampled late?"
    );
    // Trained steps weigh their tokens (the cap defaults to 2 off-policy);
    // the trainer's wait for each batch is logged (`lines_of` leaves out
    // the times).
    let trained: Vec<&serde_json::Value> = off
        .iter()
        .filter(|m| m["trained_samples"].as_f64() > Some(0.0))
        .collect();
    assert!(trained.len() >= 2, "{off:?}");
    for m in trained {
        let w = m["tis_weight_mean"].as_f64();
        assert!(w.is_some_and(|w| w > 0.0 && w <= 2.0), "{m}");
    }
    let raw = std::fs::read_to_string(dir.path().join("off-2-1/metrics.jsonl")).unwrap();
    assert!(raw.lines().all(|l| l.contains("\"time_wait_s\"")), "{raw}");
    for (world, samplers) in [(3, 1), (3, 2)] {
        let other = run(world, samplers).unwrap();
        assert_eq!(other.len(), off.len());
        for (step, (a, b)) in off.iter().zip(&other).enumerate() {
            for key in ["reward", "scored", "trained_samples", "task_cursor"] {
                assert_eq!(
                    a[key], b[key],
                    "{world} ranks, {samplers} sampling, step {step}: {key}"
                );
            }
            for key in ["policy_loss", "grad_norm", "kl", "tis_weight_mean"] {
                let (Some(x), Some(y)) = (a[key].as_f64(), b[key].as_f64()) else {
                    assert_eq!(a.get(key).is_some(), b.get(key).is_some(), "{key}");
                    continue;
                };
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + x.abs().max(y.abs())),
                    "{world} ranks, {samplers} sampling, step {step}, {key}: {x} vs {y}"
                );
            }
        }
    }
    // PPO (a value head, advantages whitened over the trainers' tokens):
    // one trainer and two train as one.
    let mut ppo_cfg = tiny_config("ppo");
    ppo_cfg.temperature = temperature;
    ppo_cfg.sampler_ranks = 1;
    ppo_cfg.num_train_steps = 4;
    ppo_cfg.mini_batch_size = 6;
    ppo_cfg.max_new_tokens = 3;
    ppo_cfg.optim.learning_rate = 2e-3;
    ppo_cfg.value_learning_rate = 1e-3;
    let ppo_run = |world: usize| {
        let out = dir.path().join(format!("off-ppo-{world}"));
        let job = word_job(&ppo_cfg, &base, &out, &[&word]);
        run_ranks(world, |c| ppo::run_with(&job, &c, &NoProgress)).unwrap();
        lines_of(&out.join("metrics.jsonl"))
    };
    let (one, two) = (ppo_run(2), ppo_run(3));
    assert_eq!((one.len(), two.len()), (4, 4));
    for (step, (a, b)) in one.iter().zip(&two).enumerate() {
        assert_eq!(a["reward"], b["reward"], "ppo, step {step}");
        for key in ["policy_loss", "value_loss", "grad_norm"] {
            let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + x.abs().max(y.abs())),
                "ppo, step {step}, {key}: {x} vs {y}"
            );
        }
    }
    // Every rank sampling leaves none to train: a clear error.
    let err = run(1, 1).unwrap_err();
    assert!(
        format!("{err:#}").contains("leaves none to train") && format!("{err:#}").contains("hint:"),
        "{err:#}"
    );
}

/// An off-policy run cut after step 3 and resumed repeats the
/// uninterrupted run: its checkpoint holds the samplers' draw state and the
/// weights they were making step 4's batch with, one update behind the
/// trainers'.
#[test]
fn a_resumed_off_policy_run_repeats_the_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_model(dir.path());
    let (word, temperature) = learnable_word(&base);
    let mut config = tiny_config("grpo");
    config.temperature = temperature;
    config.sampler_ranks = 1;
    config.num_train_steps = 6;
    config.dynamic_sampling = false;
    config.batch_size = 4;
    let run = |name: &str, max_steps: Option<u64>, resume: bool| {
        let out = dir.path().join(name);
        let job = RlJob {
            resume,
            max_steps,
            ..word_job(&config, &base, &out, &[&word])
        };
        let s = run_ranks(2, |c| ppo::run_with(&job, &c, &NoProgress)).unwrap();
        (s[0].clone(), lines_of(&out.join("metrics.jsonl")))
    };
    let (_, full) = run("full", None, false);
    let (first, _) = run("cut", Some(3), false);
    assert_eq!(first.steps, 3);
    let (resumed, cut) = run("cut", None, true);
    assert_eq!((resumed.resumed_from, resumed.steps), (Some(3), 6));
    assert_eq!(full.len(), 6);
    assert_eq!(cut.len(), 6);
    for (step, (a, b)) in full.iter().zip(&cut).enumerate() {
        assert_eq!(a, b, "step {step}");
    }
    // Not vacuous: the samplers' weights were not the trainers' when the
    // cut run saved, and the adapter moved.
    assert!(full.iter().any(|m| m["grad_norm"].as_f64() > Some(0.0)));
    assert_eq!(
        std::fs::read(dir.path().join("full/final/adapter_model.safetensors")).unwrap(),
        std::fs::read(dir.path().join("cut/final/adapter_model.safetensors")).unwrap(),
        "final adapters differ"
    );
}

/// Multi-step episodes (`word_steps`: the word twice, one step at a time,
/// a wrong word ending the episode): PPO with GAE over the steps and GRPO
/// over whole episodes raise the return, and episodes grow to both steps.
fn learns_over_steps(algorithm: &str, episode_sequences: bool) {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_model(dir.path());
    let (word, temperature) = learnable_word(&base);
    let mut config = tiny_config(algorithm);
    config.temperature = temperature;
    config.environment = "word_steps".into();
    config.max_steps_per_episode = 4;
    config.episode_sequences = episode_sequences;
    let mut job = word_job(&config, &base, &dir.path().join("out"), &[&word]);
    job.env = Arc::new(WordStepsEnv::new(&[&word], 2));
    job.env_description = format!("word_steps:{word}");
    let s = ppo::run(&job, &NoProgress).unwrap();
    assert_eq!(s.steps, 20);
    // Episodes of both steps trained apart are counted (for the hint
    // to train them whole); none when they train whole.
    assert_eq!(
        s.episodes_apart == 0,
        episode_sequences,
        "{}",
        s.episodes_apart
    );
    let lines = lines_of(&dir.path().join("out/metrics.jsonl"));
    let metric = |k: &str| -> Vec<f64> { lines.iter().map(|l| l[k].as_f64().unwrap()).collect() };
    let (ret, len, success) = (
        metric("episode_return"),
        metric("episode_length"),
        metric("episode_success"),
    );
    assert_eq!(ret, metric("reward"));
    let tail = |v: &[f64]| v[v.len() - 3..].iter().sum::<f64>() / 3.0;
    assert!(
        tail(&ret) >= 0.8 && tail(&ret) > ret[0] + 0.3,
        "{algorithm}: return {:.3} -> {:.3}: {ret:?}",
        ret[0],
        tail(&ret)
    );
    // Two steps at most (the environment is done after the second word),
    // and most episodes reach it once the word is learned.
    assert!(len.iter().all(|&l| (1.0..=2.0).contains(&l)), "{len:?}");
    assert!(
        tail(&len) > 1.6 && tail(&success) > 0.6,
        "{len:?} {success:?}"
    );
    assert!(len[0] < tail(&len));
    assert!(
        lines
            .iter()
            .all(|l| l["policy_loss"].as_f64().unwrap().is_finite())
    );
    // An episode a sequence: never more trained samples than episodes,
    // and every episode's prompts chained (episodes of both steps are
    // there, above, so that is not vacuous).
    if episode_sequences {
        let (trained, scored) = (metric("trained_samples"), metric("scored"));
        assert!(
            trained.iter().zip(&scored).all(|(t, s)| t <= s),
            "{trained:?} {scored:?}"
        );
        assert!(metric("episodes_unchained").iter().all(|&u| u == 0.0));
    }
}

#[test]
fn ppo_learns_over_the_steps_of_an_episode() {
    learns_over_steps("ppo", false);
}

#[test]
fn grpo_learns_over_whole_episodes() {
    learns_over_steps("grpo", false);
}

#[test]
fn grpo_learns_over_whole_episodes_each_one_sequence() {
    learns_over_steps("grpo", true);
}

#[test]
fn ppo_learns_over_the_steps_of_an_episode_as_one_sequence() {
    learns_over_steps("ppo", true);
}

/// The command line drives multi-step episodes through every wrapper an
/// environment gets (the registry's training/held-out split, the
/// mixture): `ppo --environment word_steps` logs episodes of more than
/// one action at times, and `eval --environment word_steps` reports steps.
#[test]
fn the_command_line_runs_multi_step_episodes() {
    let dir = tempfile::tempdir().unwrap();
    common::word_grpo(dir.path(), 4, 2, 2);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s3.json")).unwrap()).unwrap();
    let mut cfg = cfg;
    cfg["ppo"]["environment"] = "word_steps".into();
    cfg["ppo"]["max_steps_per_episode"] = 3.into();
    std::fs::write(dir.path().join("s3.json"), cfg.to_string()).unwrap();
    let o = common::trace_train(
        dir.path(),
        &common::ppo_args("out", &["--environment", "word_steps"]),
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let lines = lines_of(&dir.path().join("out/metrics.jsonl"));
    assert!(
        lines.iter().all(|l| l["episode_length"].as_f64().is_some()),
        "{lines:?}"
    );
    let o = common::trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "base",
            "--environment",
            "word_steps",
            "--tasks",
            "4",
            "--max_new_tokens",
            "2",
            "--device",
            "cpu",
            "--output",
            "e.json",
        ],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("e.json")).unwrap()).unwrap();
    let section = &r["environments"][0];
    assert!(
        section["mean_steps"].as_f64().is_some_and(|s| s >= 1.0),
        "{section}"
    );
    assert!(
        section["predictions"][0]["success"].is_boolean(),
        "{section}"
    );
}
