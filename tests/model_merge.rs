//! `model merge`: a hand-written PEFT adapter merged into the tiny chat
//! model equals `W + (alpha / r) B A` computed here, in f32 and in bf16;
//! the folder is complete and loads; an adapter of the wrong shape is
//! refused naming its tensor; a non-empty output folder is refused without
//! `--force` and keeps the files it held with it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::{max_diff, stderr, trace_train};
use serde_json::json;

const R: usize = 4;
const ALPHA: f64 = 8.0;
/// The tiny chat model: hidden 64, 4 query heads and 2 key/value heads of 32.
const HIDDEN: usize = 64;
const Q_OUT: usize = 128;
const KV_OUT: usize = 64;

fn peft(module: &str, part: &str) -> String {
    format!("base_model.model.{module}.{part}.weight")
}

/// Deterministic values in about ±0.5 of `shape`.
fn values(seed: f32, shape: (usize, usize)) -> Tensor {
    Tensor::arange(0f32, (shape.0 * shape.1) as f32, &Device::Cpu)
        .unwrap()
        .affine(0.731, seed as f64)
        .unwrap()
        .sin()
        .unwrap()
        .affine(0.5, 0.0)
        .unwrap()
        .reshape(shape)
        .unwrap()
}

/// Writes an adapter as PEFT writes one (with fields we ignore) on q_proj
/// and v_proj of both layers; `q_in` is q_proj's input width (64 fits).
fn write_adapter(dir: &Path, q_in: usize) -> HashMap<String, (Tensor, Tensor)> {
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R, "lora_alpha": ALPHA,
        "lora_dropout": 0.05, "target_modules": ["v_proj", "q_proj"], "bias": "none",
        "base_model_name_or_path": "tiny", "revision": null, "init_lora_weights": true,
        "megatron_config": null, "exclude_modules": null, "inference_mode": true,
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let mut tensors = HashMap::new();
    let mut factors = HashMap::new();
    for layer in 0..2 {
        for (proj, input, out) in [("q_proj", q_in, Q_OUT), ("v_proj", HIDDEN, KV_OUT)] {
            let module = format!("model.layers.{layer}.self_attn.{proj}");
            let seed = (layer * 2 + proj.len()) as f32;
            let a = values(seed, (R, input));
            let b = values(seed + 0.5, (out, R));
            tensors.insert(peft(&module, "lora_A"), a.clone());
            tensors.insert(peft(&module, "lora_B"), b.clone());
            factors.insert(format!("{module}.weight"), (a, b));
        }
    }
    trace_train::model::save_safetensors(&tensors, dir.join("adapter_model.safetensors")).unwrap();
    factors
}

fn load(dir: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap()
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let o = trace_train(tmp.path(), &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    (tmp, tmp_path(&o))
}

fn tmp_path(o: &std::process::Output) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

#[test]
fn merged_weights_are_w_plus_scaled_ba_in_the_base_dtype_or_the_one_asked() {
    let (tmp, _) = setup();
    let factors = write_adapter(&tmp.path().join("adapter"), HIDDEN);
    let o = trace_train(
        tmp.path(),
        &[
            "model",
            "merge",
            "--base",
            "base",
            "--adapter",
            "adapter",
            "--output",
            "merged",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let base = load(&tmp.path().join("base"));
    let merged = load(&tmp.path().join("merged"));
    assert_eq!(
        base.keys().collect::<std::collections::BTreeSet<_>>(),
        merged.keys().collect()
    );
    let scale = ALPHA / R as f64;
    for (name, w) in &base {
        let m = &merged[name];
        assert_eq!(m.dtype(), DType::F32, "{name}");
        match factors.get(name) {
            Some((a, b)) => {
                let expected = (w + (b.matmul(a).unwrap() * scale).unwrap()).unwrap();
                assert!(max_diff(m, &expected) < 1e-6, "{name}");
                assert!(max_diff(m, w) > 1e-2, "{name} unchanged");
            }
            None => assert_eq!(max_diff(m, w), 0.0, "{name}"),
        }
    }
    let dir = tmp.path().join("merged");
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    trace_train::model::load(&dir, None, DType::F32, &Device::Cpu).unwrap();

    // --dtype bf16: the f32 merge rounded once, and the config says so.
    let o = trace_train(
        tmp.path(),
        &[
            "model",
            "merge",
            "--base",
            "base",
            "--adapter",
            "adapter",
            "--output",
            "m16",
            "--dtype",
            "bf16",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let m16 = load(&tmp.path().join("m16"));
    for (name, m) in &merged {
        assert_eq!(m16[name].dtype(), DType::BF16, "{name}");
        let want = m
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let got = m16[name].to_dtype(DType::F32).unwrap();
        assert_eq!(max_diff(&got, &want), 0.0, "{name}");
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("m16/config.json")).unwrap())
            .unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
}

#[test]
fn an_adapter_of_another_shape_is_refused_naming_the_tensor() {
    let (tmp, _) = setup();
    write_adapter(&tmp.path().join("adapter"), 32);
    let o = trace_train(
        tmp.path(),
        &[
            "model",
            "merge",
            "--base",
            "base",
            "--adapter",
            "adapter",
            "--output",
            "merged",
        ],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
            && err.contains("[4, 32]")
            && err.contains("[4, 64]")
            && err.contains("hint: an adapter loads only on the model it was trained on (its `adapter_config.json` names `tiny`)"),
        "{err}"
    );
    assert!(!tmp.path().join("merged").exists());
}

#[test]
fn a_non_empty_output_is_refused_without_force_and_kept_with_it() {
    let (tmp, _) = setup();
    write_adapter(&tmp.path().join("adapter"), HIDDEN);
    let out = tmp.path().join("merged");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let args = [
        "model",
        "merge",
        "--base",
        "base",
        "--adapter",
        "adapter",
        "--output",
        "merged",
    ];
    let o = trace_train(tmp.path(), &args);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("`merged` exists and is not empty") && err.contains("--force"),
        "{err}"
    );
    assert!(!out.join("model.safetensors").exists());

    let o = trace_train(tmp.path(), &[&args[..], &["--force"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );
    assert!(out.join("model.safetensors").is_file());
}
