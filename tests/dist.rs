//! Data-parallel SFT against one process: the same global batch trained by
//! 2 and 3 ranks (threads sharing memory through `dist::InProcess`) gives
//! the one-rank losses and LoRA weights, up to the order of additions; a
//! checkpoint written by 2 ranks resumes on 1.

mod common;

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use trace_train::config::{ModelConfig, SftConfig};
use trace_train::dist::inprocess::run_ranks;
use trace_train::recipes::sft::{self, NoProgress, SftJob, SftSummary};

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    trace_train::model::arch::tiny::write_tiny_chat_model(&root.join("base"), 3).unwrap();
    common::train::write_records(&root.join("train.jsonl"), 24);
    common::train::write_records(&root.join("eval.jsonl"), 5);
    Setup { _dir: dir, root }
}

fn job(root: &Path, out: &str, batch: usize, accum: usize, dropout: f64, steps: u64) -> SftJob {
    let config = SftConfig {
        batch_size: batch,
        gradient_accumulation_steps: accum,
        epochs: 3,
        lora_dropout: dropout,
        eval_steps: 2,
        seed: 7,
        optim: trace_train::config::OptimSettings {
            learning_rate: 3e-3,
            ..SftConfig::default().optim
        },
        lora: trace_train::config::LoraSettings {
            r: 4,
            alpha: 8.0,
            ..SftConfig::default().lora
        },
        save: trace_train::config::SaveSettings {
            save_steps: 2,
            ..SftConfig::default().save
        },
        ..SftConfig::default()
    };
    SftJob {
        stage: "warmup".into(),
        config,
        model: ModelConfig {
            name: "base".into(),
            revision: None,
            base_precision: trace_train::model::BasePrecision::Bf16,
            dtype: "f32".into(),
            max_length: 256,
            ..ModelConfig::default()
        },
        base_dir: root.join("base"),
        base: trace_train::model::io::resolve::Resolved {
            spec: root.join("base").display().to_string(),
            dir: root.join("base"),
            repo: None,
            revision: None,
            commit: None,
        },
        train_file: root.join("train.jsonl"),
        eval_file: Some(root.join("eval.jsonl")),
        output_dir: root.join(out),
        device: Device::Cpu,
        resume: false,
        force: false,
        max_steps: Some(steps),
        gradient_checkpointing: false,
        select_items: Vec::new(),
    }
}

fn losses(out: &Path) -> Vec<(f64, Option<f64>)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["loss"].as_f64().unwrap(), v["eval_loss"].as_f64())
        })
        .collect()
}

fn adapter(out: &Path) -> Vec<(String, Tensor)> {
    let mut t: Vec<_> =
        candle_core::safetensors::load(out.join("final/adapter_model.safetensors"), &Device::Cpu)
            .unwrap()
            .into_iter()
            .collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

/// Trains `job` on `world` ranks (rank 0's summary), or on one with 1.
fn train(job: &SftJob, world: usize) -> SftSummary {
    if world == 1 {
        return sft::run(job, &NoProgress).unwrap();
    }
    let mut all = run_ranks(world, |c| sft::run_with(job, &c, &NoProgress)).unwrap();
    all.swap_remove(0)
}

fn assert_same_training(root: &Path, one: &str, many: &str, what: &str) {
    assert_same_training_within(root, one, many, what, 1e-4)
}

/// [`assert_same_training`] with LoRA weights equal within `tol` of their
/// largest magnitude.
fn assert_same_training_within(root: &Path, one: &str, many: &str, what: &str, tol: f32) {
    let (a, b) = (losses(&root.join(one)), losses(&root.join(many)));
    assert_eq!(a.len(), b.len(), "{what}: steps");
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            rel(x.0, y.0) < 1e-5,
            "{what}: step {} loss {} vs {}",
            step + 1,
            x.0,
            y.0
        );
        match (x.1, y.1) {
            (Some(e1), Some(e2)) => assert!(rel(e1, e2) < 1e-5, "{what}: eval loss {e1} vs {e2}"),
            (None, None) => {}
            other => panic!("{what}: eval losses {other:?}"),
        }
    }
    let (wa, wb) = (adapter(&root.join(one)), adapter(&root.join(many)));
    assert_eq!(wa.len(), wb.len());
    for ((name, x), (_, y)) in wa.iter().zip(&wb) {
        let scale = x
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let diff = common::max_diff(x, y);
        assert!(
            diff <= tol * scale.max(1e-3),
            "{what}: `{name}` differs by {diff} (scale {scale})"
        );
    }
}

#[test]
fn two_and_three_ranks_train_as_one() {
    let s = setup();
    let root = &s.root;
    // Whole micro-batches a rank (6 divides by 2 and 3): the dropout masks
    // are the one-rank ones, so dropout stays on.
    let one = train(&job(root, "one", 2, 6, 0.1, 4), 1);
    assert!(one.last_loss.unwrap() < one.first_loss.unwrap());
    for world in [2, 3] {
        let out = format!("whole{world}");
        let many = train(&job(root, &out, 2, 6, 0.1, 4), world);
        assert_eq!(many.steps, 4);
        assert_same_training(
            root,
            "one",
            &out,
            &format!("{world} ranks, whole micro-batches"),
        );
        let first: serde_json::Value = serde_json::from_str(
            std::fs::read_to_string(root.join(&out).join("metrics.jsonl"))
                .unwrap()
                .lines()
                .next()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(first["world_size"], world);
    }
    // One micro-batch a step: its rows are split over the ranks (a slice
    // draws its own dropout masks, so dropout is off to compare).
    train(&job(root, "rows1", 4, 1, 0.0, 5), 1);
    for world in [2, 3] {
        let out = format!("rows{world}");
        train(&job(root, &out, 4, 1, 0.0, 5), world);
        assert_same_training(root, "rows1", &out, &format!("{world} ranks, row slices"));
    }
}

fn passes(out: &Path) -> Vec<u64> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["passes"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn passes_regrouped_by_tokens_train_as_fixed_micro_batches() {
    let s = setup();
    let root = &s.root;
    // Dropout off: a pass draws the masks of its own index.
    train(&job(root, "fixed", 2, 3, 0.0, 4), 1);
    assert_eq!(passes(&root.join("fixed")), [3, 3, 3, 3]);
    for (out, budget, world) in [
        ("one_pass", 4096, 1),
        ("tight", 1, 1),
        ("one_pass2", 4096, 2),
    ] {
        let mut j = job(root, out, 2, 3, 0.0, 4);
        j.config.micro_batch_tokens = Some(budget);
        train(&j, world);
        // Two ranks split the one pass into row slices, each padded to its
        // own longest row: another order of additions, which AdamW's
        // normalisation magnifies where a gradient is tiny.
        let tol = if world == 1 { 1e-4 } else { 3e-4 };
        assert_same_training_within(root, "fixed", out, out, tol);
        // 6 rows of at most 256 tokens fit 4096 at once; a budget of 1
        // leaves each row a pass of its own.
        let want = if budget == 1 { 6 } else { 1 };
        assert_eq!(passes(&root.join(out)), [want; 4], "{out}");
    }
    // Resuming regroups the remaining steps as the uninterrupted run did.
    assert_resume_repeats_the_passes(root, |j| j.config.micro_batch_tokens = Some(700));
}

/// A run of 4 steps (dropout on, a constant rate) against one stopped after
/// 2 and resumed, both set up by `configure`: the same passes a step and
/// the same losses.
fn assert_resume_repeats_the_passes(root: &Path, configure: impl Fn(&mut SftJob)) {
    let constant = |out: &str, steps: u64| {
        let mut j = job(root, out, 2, 3, 0.1, steps);
        (
            j.config.schedule.warmup_ratio,
            j.config.schedule.min_lr_ratio,
        ) = (0.0, 1.0);
        configure(&mut j);
        j
    };
    train(&constant("straight", 4), 1);
    train(&constant("resumed", 2), 1);
    let mut rest = constant("resumed", 4);
    rest.resume = true;
    assert_eq!(train(&rest, 1).resumed_from, Some(2));
    assert_eq!(
        passes(&root.join("straight")),
        passes(&root.join("resumed"))
    );
    assert_eq!(
        losses(&root.join("straight")),
        losses(&root.join("resumed"))
    );
}

#[test]
fn packed_passes_train_as_fixed_micro_batches() {
    let s = setup();
    let root = &s.root;
    // Dropout off: a pass draws the masks of its own index and shape.
    train(&job(root, "fixed", 2, 3, 0.0, 4), 1);
    for (out, budget, world, ckpt) in [
        // batch_size x max_length = 512 tokens a pass.
        ("packed", None, 1, false),
        ("packed_ckpt", None, 1, true),
        ("packed_one_pass", Some(4096), 1, false),
        ("packed_tight", Some(1), 1, false),
        ("packed_two_ranks", None, 2, false),
    ] {
        let mut j = job(root, out, 2, 3, 0.0, 4);
        j.config.packing = Some(true);
        j.config.micro_batch_tokens = budget;
        j.gradient_checkpointing = ckpt;
        train(&j, world);
        let tol = if world == 1 { 1e-4 } else { 3e-4 };
        assert_same_training_within(root, "fixed", out, out, tol);
        let p = passes(&root.join(out));
        match budget {
            Some(4096) => assert_eq!(p, [1; 4], "{out}"),
            Some(1) => assert_eq!(p, [6; 4], "{out}"),
            _ => assert!(p.iter().all(|&n| (1..=6).contains(&n)), "{out}: {p:?}"),
        }
    }
    // Resuming packs the remaining steps as the uninterrupted run did.
    assert_resume_repeats_the_passes(root, |j| j.config.packing = Some(true));
}

#[test]
fn a_checkpoint_of_two_ranks_resumes_on_one() {
    let s = setup();
    let root = &s.root;
    // A constant rate, so a run stopped by max_steps 2 sees the rates of
    // the first two steps of a 4-step run.
    let constant = |out: &str, steps: u64| {
        let mut j = job(root, out, 2, 2, 0.1, steps);
        j.config.schedule.warmup_ratio = 0.0;
        j.config.schedule.min_lr_ratio = 1.0;
        j
    };
    train(&constant("straight", 4), 1);
    // Two ranks train steps 1-2 and leave a checkpoint at step 2 ...
    train(&constant("resumed", 2), 2);
    // ... from which one rank continues to step 4.
    let mut rest = constant("resumed", 4);
    rest.resume = true;
    let s1 = train(&rest, 1);
    assert_eq!(s1.resumed_from, Some(2));
    let (a, b) = (
        losses(&root.join("straight")),
        losses(&root.join("resumed")),
    );
    assert_eq!(b.len(), 4);
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            rel(x.0, y.0) < 1e-5,
            "step {}: {} vs {}",
            step + 1,
            x.0,
            y.0
        );
    }
}
