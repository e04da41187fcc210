//! The model layer on the tiny random Qwen3 and Llama models: shapes, LoRA
//! equivalences (B = 0, merge, adapter round trip), the KV cache, a few
//! training steps, and loader errors.

mod common;

use common::max_diff;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::Optimizer;
use tempfile::TempDir;
use trace_train::model::{self, LoadedModel, LoraConfig, TargetModule, arch::tiny, io::adapter};

type Writer = fn(&Path, u64) -> model::Result<()>;
const ARCHS: [(&str, Writer); 2] = [
    ("qwen3", tiny::write_tiny_qwen3),
    ("llama", tiny::write_tiny_llama),
];

/// A tiny model of architecture `write` in a fresh temporary folder.
fn tiny_model(write: Writer) -> (TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("base");
    write(&dir, 42).unwrap();
    (tmp, dir)
}

fn lora(dropout: f32) -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout,
        target_modules: TargetModule::ALL.to_vec(),
        seed: 1,
    }
}

fn load(dir: &Path, lora: Option<&LoraConfig>) -> LoadedModel {
    model::load(dir, lora, DType::F32, &Device::Cpu).unwrap()
}

/// `(2, 9)` token ids, deterministic.
fn ids() -> Tensor {
    let v: Vec<u32> = (0..18u32).map(|i| (i * 37 + 11) % 512).collect();
    Tensor::from_vec(v, (2, 9), &Device::Cpu).unwrap()
}

/// Gives every `lora_B` a non-zero, deterministic value.
fn set_random_b(m: &LoadedModel) {
    let vars = m.varmap.data().lock().unwrap();
    let mut named: Vec<_> = vars
        .iter()
        .filter(|(n, _)| n.ends_with("lora_B.weight"))
        .collect();
    named.sort_by_key(|(n, _)| n.as_str());
    for (k, (name, var)) in named.into_iter().enumerate() {
        let n = var.elem_count();
        let t = Tensor::arange(0f32, n as f32, &Device::Cpu)
            .unwrap()
            .affine(0.37, k as f64)
            .unwrap()
            .sin()
            .unwrap()
            .affine(0.05, 0.0)
            .unwrap()
            .reshape(var.shape())
            .unwrap();
        var.set(&t).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn logits(m: &LoadedModel) -> Tensor {
    m.model.forward(&ids(), None, false).unwrap()
}

#[test]
fn forward_gives_batch_by_length_by_vocab_logits() {
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let m = load(&dir, None);
        let out = logits(&m);
        assert_eq!(out.dims(), &[2, 9, 512], "{arch}");
        let mask = Tensor::ones((2, 9), DType::U32, &Device::Cpu).unwrap();
        let masked = m.model.forward(&ids(), Some(&mask), false).unwrap();
        assert_eq!(
            max_diff(&out, &masked),
            0.0,
            "{arch}: an all-ones mask changes nothing"
        );
        let sum: f32 = out.abs().unwrap().sum_all().unwrap().to_scalar().unwrap();
        assert!(sum.is_finite() && sum > 0.0, "{arch}");
    }
}

#[test]
fn right_padding_does_not_change_the_logits_of_real_tokens() {
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let m = load(&dir, None);
        let short = ids().narrow(1, 0, 5).unwrap();
        let padded = Tensor::cat(
            &[
                &short,
                &Tensor::zeros((2, 4), DType::U32, &Device::Cpu).unwrap(),
            ],
            1,
        )
        .unwrap();
        let mask = Tensor::new(
            &[[1u32, 1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0, 0]],
            &Device::Cpu,
        )
        .unwrap();
        let alone = m.model.forward(&short, None, false).unwrap();
        let within = m
            .model
            .forward(&padded, Some(&mask), false)
            .unwrap()
            .narrow(1, 0, 5)
            .unwrap();
        assert!(max_diff(&alone, &within) < 1e-5, "{arch}");
    }
}

#[test]
fn lora_with_zero_b_gives_the_base_logits() {
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let base = logits(&load(&dir, None));
        let m = load(&dir, Some(&lora(0.0)));
        assert_eq!(
            m.trainable_vars().len(),
            2 * 7 * 2,
            "{arch}: A and B for 7 projections in 2 layers"
        );
        assert_eq!(max_diff(&base, &logits(&m)), 0.0, "{arch}");
        // The training path (differentiable kernels) agrees too.
        let train = m.model.forward(&ids(), None, true).unwrap();
        assert!(max_diff(&base, &train) < 1e-4, "{arch}");
    }
}

#[test]
fn merged_model_gives_the_base_plus_adapter_logits() {
    for (arch, write) in ARCHS {
        let (tmp, dir) = tiny_model(write);
        let m = load(&dir, Some(&lora(0.0)));
        set_random_b(&m);
        let adapted = logits(&m);
        assert!(
            max_diff(&adapted, &logits(&load(&dir, None))) > 1e-2,
            "{arch}: B must matter"
        );
        let merged_dir = tmp.path().join("merged");
        adapter::merge(&m, &merged_dir).unwrap();
        let merged = logits(&load(&merged_dir, None));
        let diff = max_diff(&adapted, &merged);
        assert!(diff < 1e-4, "{arch}: {diff}");
        let names: Vec<String> =
            candle_core::safetensors::load(merged_dir.join("model.safetensors"), &Device::Cpu)
                .unwrap()
                .into_keys()
                .collect();
        assert!(
            names.contains(&"model.layers.1.mlp.down_proj.weight".to_owned()),
            "{arch}"
        );
        assert!(!names.iter().any(|n| n.contains("lora")), "{arch}");
    }
}

#[test]
fn adapter_save_then_load_gives_identical_logits() {
    for (arch, write) in ARCHS {
        let (tmp, dir) = tiny_model(write);
        let m = load(&dir, Some(&lora(0.1)));
        set_random_b(&m);
        let adapter_dir = tmp.path().join("adapter");
        adapter::save(&m, &adapter_dir, "tiny/base").unwrap();

        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(adapter_dir.join("adapter_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(config["peft_type"], "LORA");
        assert_eq!(config["task_type"], "CAUSAL_LM");
        assert_eq!(
            (config["r"].as_u64(), config["lora_alpha"].as_f64()),
            (Some(4), Some(8.0))
        );
        assert_eq!(config["target_modules"].as_array().unwrap().len(), 7);
        let stored = candle_core::safetensors::load(
            adapter_dir.join("adapter_model.safetensors"),
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(stored.len(), 28, "{arch}");
        let a = &stored["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
        assert_eq!(a.dims(), &[4, 64]);
        assert!(stored.contains_key("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));

        let back = adapter::load(&dir, &adapter_dir, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(back.lora.as_ref().unwrap().dropout, 0.1);
        assert_eq!(max_diff(&logits(&m), &logits(&back)), 0.0, "{arch}");
    }
}

#[test]
fn adapter_of_another_shape_is_rejected_naming_the_tensors() {
    let (tmp, dir) = tiny_model(tiny::write_tiny_qwen3);
    let m = load(&dir, Some(&lora(0.0)));
    let adapter_dir = tmp.path().join("adapter");
    adapter::save(&m, &adapter_dir, "tiny").unwrap();
    // The Llama base has other q/o shapes (head_dim 16, not 32).
    let (_tmp2, llama) = tiny_model(tiny::write_tiny_llama);
    let err = adapter::load(&llama, &adapter_dir, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("adapter_model.safetensors")
            && err.contains("q_proj.lora_B.weight` has shape [128, 4], the model needs [64, 4]"),
        "{err}"
    );
}

#[test]
fn kv_cache_decoding_matches_the_full_forward() {
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let m = load(&dir, Some(&lora(0.0)));
        set_random_b(&m);
        let ids = ids();
        let full = m.model.forward(&ids, None, false).unwrap(); // (2, 9, V)
        let mut cache = m.model.new_cache();
        // A 3-token prefill, then one token at a time.
        let prefill = m
            .model
            .forward_with_cache(&ids.narrow(1, 0, 3).unwrap(), 0, &mut cache)
            .unwrap();
        assert_eq!(prefill.dims(), &[2, 512]);
        let at = |t: usize| full.narrow(1, t, 1).unwrap().squeeze(1).unwrap();
        assert!(max_diff(&prefill, &at(2)) < 1e-4, "{arch}: prefill");
        for t in 3..9 {
            let step = m
                .model
                .forward_with_cache(&ids.narrow(1, t, 1).unwrap(), t, &mut cache)
                .unwrap();
            let diff = max_diff(&step, &at(t));
            assert!(diff < 1e-4, "{arch}: position {t}: {diff}");
        }
        assert_eq!(cache.len(), 9);
        let wrong_offset = m
            .model
            .forward_with_cache(&ids.narrow(1, 0, 1).unwrap(), 3, &mut cache);
        assert!(wrong_offset.is_err(), "{arch}");
    }
}

#[test]
fn adamw_steps_lower_the_loss_and_leave_the_base_weights_alone() {
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let m = load(&dir, Some(&lora(0.05)));
        let base_before: Vec<Tensor> = m
            .model
            .projections()
            .iter()
            .map(|p| p.base().weight().unwrap().copy().unwrap())
            .collect();
        let ids = ids();
        let inputs = ids.narrow(1, 0, 8).unwrap();
        let targets = ids.narrow(1, 1, 8).unwrap().flatten_all().unwrap();
        let loss = |train: bool| {
            let logits = m
                .model
                .forward(&inputs, None, train)
                .unwrap()
                .reshape(((), 512))
                .unwrap();
            candle_nn::loss::cross_entropy(&logits, &targets).unwrap()
        };
        let first: f32 = loss(false).to_scalar().unwrap();
        let params = candle_nn::ParamsAdamW {
            lr: 1e-2,
            ..Default::default()
        };
        let mut opt = candle_nn::AdamW::new(m.trainable_vars(), params).unwrap();
        for _ in 0..8 {
            let grads = m.model.backward(&loss(true)).unwrap();
            opt.step(&grads).unwrap();
        }
        // `loss.backward()` alone leaves the factors' gradients in the
        // layers: the next training forward refuses to go on.
        let _ = loss(true).backward().unwrap();
        let err = m
            .model
            .forward(&inputs, None, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Model::backward"), "{err}");
        let last: f32 = loss(false).to_scalar().unwrap();
        assert!(last < first - 0.1, "{arch}: loss {first} -> {last}");
        for (p, before) in m.model.projections().iter().zip(&base_before) {
            assert_eq!(
                max_diff(&p.base().weight().unwrap(), before),
                0.0,
                "{arch}: {} changed",
                p.name()
            );
        }
    }
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let (tmp, dir) = tiny_model(tiny::write_tiny_qwen3);
    let sharded = write_shards(&dir, &tmp.path().join("sharded"), true);
    assert_eq!(
        max_diff(&logits(&load(&dir, None)), &logits(&load(&sharded, None))),
        0.0
    );
}

/// Splits `dir`'s checkpoint into two shards plus an index in `out`; the
/// second shard is left out unless `both`.
fn write_shards(dir: &Path, out: &Path, both: bool) -> PathBuf {
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    let tensors =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<_> = tensors.keys().cloned().collect();
    names.sort();
    let shard = |i: usize| format!("model-0000{i}-of-00002.safetensors");
    let mut weight_map = serde_json::Map::new();
    for (i, half) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let part: HashMap<_, _> = half
            .iter()
            .map(|n| (n.clone(), tensors[n].clone()))
            .collect();
        if i == 0 || both {
            candle_core::safetensors::save(&part, out.join(shard(i + 1))).unwrap();
        }
        for n in half {
            weight_map.insert(n.clone(), shard(i + 1).into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
    out.to_owned()
}

fn load_err(dir: &Path) -> String {
    model::load(dir, None, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string()
}

#[test]
fn missing_config_json_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let err = load_err(tmp.path());
    assert!(
        err.starts_with("missing `") && err.contains("config.json`") && err.contains("hint:"),
        "{err}"
    );
}

#[test]
fn unsupported_model_type_names_the_file_and_field() {
    let (_tmp, dir) = tiny_model(tiny::write_tiny_llama);
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"llama\"", "\"gpt2\"");
    std::fs::write(&path, text).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("config.json`") && err.contains("field `model_type` is `gpt2`"),
        "{err}"
    );
    assert!(err.contains("hint: supported: `qwen3`"), "{err}");
}

#[test]
fn unsupported_stored_dtype_and_activation_name_their_fields() {
    let (_tmp, dir) = tiny_model(tiny::write_tiny_qwen3);
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"float32\"", "\"int8\"");
    std::fs::write(&path, text).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("config.json`") && err.contains("field `torch_dtype` is `int8`"),
        "{err}"
    );

    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"int8\"", "\"bfloat16\"")
        .replace("\"silu\"", "\"gelu\"");
    std::fs::write(&path, text).unwrap();
    assert!(load_err(&dir).contains("field `hidden_act` is `gelu`"));
    let bad_dtype = model::load(&dir, None, DType::U8, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        bad_dtype.contains("unsupported dtype U8") && bad_dtype.contains("hint:"),
        "{bad_dtype}"
    );
}

#[test]
fn missing_weights_and_missing_shard_are_named() {
    let (tmp, dir) = tiny_model(tiny::write_tiny_qwen3);
    let sharded = write_shards(&dir, &tmp.path().join("sharded"), false);
    let err = load_err(&sharded);
    assert!(
        err.contains("model-00002-of-00002.safetensors`") && err.contains("index.json"),
        "{err}"
    );

    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let err = load_err(&dir);
    assert!(
        err.starts_with("missing `") && err.contains("model.safetensors`"),
        "{err}"
    );
}

#[test]
fn a_missing_tensor_is_named() {
    let (_tmp, dir) = tiny_model(tiny::write_tiny_llama);
    let path = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let err = load_err(&dir);
    assert!(err.contains("model.layers.1.mlp.up_proj.weight"), "{err}");
}

#[test]
fn bf16_loads_and_stays_close_to_f32() {
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let m = model::load(&dir, Some(&lora(0.0)), DType::BF16, &Device::Cpu).unwrap();
        let out = m.model.forward(&ids(), None, false).unwrap();
        assert_eq!(out.dtype(), DType::BF16);
        let diff = max_diff(
            &out.to_dtype(DType::F32).unwrap(),
            &logits(&load(&dir, None)),
        );
        assert!(diff < 0.25, "{arch}: {diff}");
    }
}

#[test]
fn tiny_models_are_deterministic_in_the_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let read = |seed: u64, name: &str| {
        let dir = tmp.path().join(name);
        tiny::write_tiny_qwen3(&dir, seed).unwrap();
        std::fs::read(dir.join("model.safetensors")).unwrap()
    };
    assert_eq!(read(3, "a"), read(3, "b"));
    assert_ne!(read(3, "a"), read(4, "c"));
}

/// The folder of the PyTorch reference (see its README).
fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_reference")
}

/// HF transformers 5.17 and PEFT 0.21 (PyTorch 2.11, f32, CPU, eager
/// attention) on the same tiny models (rebuilt bit for bit by the script),
/// the same LoRA factors, and the same ids; see the fixture's README.
#[test]
fn matches_the_transformers_and_peft_reference() {
    let reference =
        candle_core::safetensors::load(reference_dir().join("reference.safetensors"), &Device::Cpu)
            .unwrap();
    let ref_ids = reference["ids"].to_dtype(DType::F32).unwrap();
    assert_eq!(
        max_diff(&ref_ids, &ids().to_dtype(DType::F32).unwrap()),
        0.0,
        "same ids"
    );
    for (arch, write) in ARCHS {
        let (tmp, dir) = tiny_model(write);
        let expect = |what: &str, got: &Tensor| {
            let diff = max_diff(got, &reference[&format!("{arch}.{what}")]);
            assert!(diff < 1e-4, "{arch} {what}: max diff {diff}");
        };
        expect("base_logits", &logits(&load(&dir, None)));

        // Our forward with the adapter equals PEFT's with the same factors.
        let m = load(&dir, Some(&lora(0.0)));
        set_random_b(&m);
        expect("adapter_logits", &logits(&m));

        // PEFT's file of those factors reads back here to the same logits...
        let peft_dir = reference_dir().join(format!("peft_adapter_{arch}"));
        let from_peft = adapter::load(&dir, &peft_dir, DType::F32, &Device::Cpu).unwrap();
        expect("adapter_logits", &logits(&from_peft));

        // ...and the file written here holds the same names and values.
        let ours_dir = tmp.path().join("ours");
        adapter::save(&m, &ours_dir, "tiny").unwrap();
        let read = |d: &Path| {
            candle_core::safetensors::load(d.join("adapter_model.safetensors"), &Device::Cpu)
                .unwrap()
        };
        let (ours, peft) = (read(&ours_dir), read(&peft_dir));
        let mut names: Vec<_> = ours.keys().collect();
        names.sort();
        let mut peft_names: Vec<_> = peft.keys().collect();
        peft_names.sort();
        assert_eq!(names, peft_names, "{arch}");
        for name in names {
            assert!(max_diff(&ours[name], &peft[name]) < 1e-6, "{arch} {name}");
        }
    }
}

/// Every trainable tensor's gradient in `grads`, in `named_trainable_vars`
/// order (each must have one).
fn trainable_grads(
    m: &LoadedModel,
    grads: &candle_core::backprop::GradStore,
    arch: &str,
) -> Vec<Tensor> {
    m.named_trainable_vars()
        .iter()
        .map(|(name, v)| {
            grads
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{arch}: no gradient for {name}"))
                .clone()
        })
        .collect()
}

/// `|got - want| / |want|` in the L2 norm.
fn relative_error(got: &Tensor, want: &Tensor) -> f32 {
    let norm = |t: &Tensor| {
        t.sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            .sqrt()
    };
    norm(&(got - want).unwrap()) / norm(want)
}

/// The hand-written layer backward gives candle autograd's gradients, and
/// per-layer gradient checkpointing (which recomputes each layer in the
/// backward pass) gives exactly the non-checkpointed ones (same ops on the
/// same values, dropout masks included).
#[test]
fn gradient_checkpointing_gives_the_same_gradients() {
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let mut m = load(&dir, Some(&lora(0.1)));
        set_random_b(&m);
        let ids = ids();
        let labels = ids.to_dtype(DType::I64).unwrap();
        let run = |m: &LoadedModel| {
            model::layers::lora::set_dropout_seed(99);
            let hidden = m.model.forward_hidden(&ids, None, true).unwrap();
            let (sum, n) = trace_train::train::loss::lm_head_cross_entropy(
                &hidden,
                &m.model.lm_head().weight().unwrap(),
                &labels,
            )
            .unwrap();
            let loss = (sum / n as f64).unwrap();
            let grads = m.model.backward(&loss).unwrap();
            let per_var = trainable_grads(m, &grads, arch);
            (loss.to_scalar::<f32>().unwrap(), per_var)
        };
        let (plain_loss, plain) = run(&m);
        m.model.set_gradient_checkpointing(true);
        let (ckpt_loss, ckpt) = run(&m);
        assert_eq!(plain_loss, ckpt_loss, "{arch}: loss");
        // The hand-written layer backward against candle's op-by-op autograd
        // (fused inference kernels in one, composed ops in the other: f32
        // rounding apart).
        m.model.set_gradient_checkpointing(false);
        m.model.decoder_mut().set_manual_backward(false);
        let (auto_loss, auto) = run(&m);
        m.model.decoder_mut().set_manual_backward(true);
        assert!(
            (auto_loss - plain_loss).abs() < 1e-5 * auto_loss.abs(),
            "{arch}: loss {plain_loss} vs autograd {auto_loss}"
        );
        for ((name, _), (g, r)) in m.named_trainable_vars().iter().zip(plain.iter().zip(&auto)) {
            let err = relative_error(g, r);
            assert!(
                err < 1e-4,
                "{arch}: {name}: relative error {err} against autograd"
            );
        }
        assert_eq!(
            plain.len(),
            2 * 7 * 2,
            "{arch}: every factor of both layers"
        );
        let mut nonzero = 0;
        for (p, c) in plain.iter().zip(&ckpt) {
            assert_eq!(max_diff(p, c), 0.0, "{arch}: gradients differ");
            nonzero += usize::from(
                p.abs()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
                    > 0.0,
            );
        }
        assert_eq!(nonzero, plain.len(), "{arch}: every gradient is non-zero");
    }
}

/// A packed row of several examples (positions restarting at each,
/// attention inside each) gives the loss and the LoRA gradients of the same
/// examples as right-padded rows, through the hand-written layer backward
/// (plain and checkpointed) and through autograd.
#[test]
fn packed_rows_give_the_unpacked_loss_and_gradients() {
    use trace_train::data::batch::Batcher;
    use trace_train::data::example::Example;
    use trace_train::model::layers::segments::Segments;
    // Lengths with a prompt of at least one token; one as long as the
    // longest so that packing adds an attention row of padding.
    let lens = [(7, 3), (12, 5), (4, 1), (12, 9)];
    let examples: Vec<Example> = lens
        .iter()
        .enumerate()
        .map(|(k, &(n, prompt))| Example {
            input_ids: (0..n as u32)
                .map(|t| (t * 53 + 97 * k as u32 + 5) % 511 + 1)
                .collect(),
            prompt_len: prompt,
            line: k as u64 + 1,
        })
        .collect();
    let batcher = Batcher::new(&examples, 4, 0, 0).unwrap();
    let rows = [2usize, 0, 3, 1];
    let padded = batcher.batch(&rows);
    let packed = batcher.pack(&rows);
    assert_eq!(padded.answer_tokens, packed.answer_tokens);
    assert_eq!(packed.tokens, 35);
    assert!(packed.len > packed.tokens && packed.seqs() * packed.seq_len > packed.tokens);
    let dev = Device::Cpu;
    for (arch, write) in ARCHS {
        let (_tmp, dir) = tiny_model(write);
        let mut m = load(&dir, Some(&lora(0.0)));
        set_random_b(&m);
        let run = |m: &LoadedModel, pack: bool| {
            let (hidden, labels) = if pack {
                let ids = Tensor::from_slice(&packed.input_ids, (1, packed.len), &dev).unwrap();
                let pos = Tensor::from_slice(&packed.positions, (1, packed.len), &dev).unwrap();
                let segs = Segments::new(
                    &packed.gather,
                    &packed.scatter,
                    packed.seq_len,
                    &packed.lens,
                    &dev,
                )
                .unwrap();
                let labels = Tensor::from_slice(&packed.labels, (1, packed.len), &dev).unwrap();
                (
                    m.model
                        .forward_hidden_packed(&ids, &pos, &segs, true)
                        .unwrap(),
                    labels,
                )
            } else {
                let shape = (padded.batch, padded.seq_len);
                let ids = Tensor::from_slice(&padded.input_ids, shape, &dev).unwrap();
                let mask = Tensor::from_slice(&padded.attention_mask, shape, &dev).unwrap();
                let labels = Tensor::from_slice(&padded.labels, shape, &dev).unwrap();
                (
                    m.model.forward_hidden(&ids, Some(&mask), true).unwrap(),
                    labels,
                )
            };
            let (sum, n) = trace_train::train::loss::lm_head_cross_entropy(
                &hidden,
                &m.model.lm_head().weight().unwrap(),
                &labels,
            )
            .unwrap();
            let loss = (sum / 30.0).unwrap();
            let grads = m.model.backward(&loss).unwrap();
            let per_var = trainable_grads(m, &grads, arch);
            (loss.to_scalar::<f32>().unwrap(), n, per_var)
        };
        let (want_loss, want_n, want) = run(&m, false);
        for (what, ckpt, manual) in [
            ("manual", false, true),
            ("checkpointed", true, true),
            ("autograd", false, false),
        ] {
            m.model.set_gradient_checkpointing(ckpt);
            m.model.decoder_mut().set_manual_backward(manual);
            let (loss, n, got) = run(&m, true);
            m.model.set_gradient_checkpointing(false);
            m.model.decoder_mut().set_manual_backward(true);
            assert_eq!(n, want_n, "{arch} {what}: answer tokens");
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "{arch} {what}: loss {loss} packed vs {want_loss}"
            );
            for ((name, _), (g, r)) in m.named_trainable_vars().iter().zip(got.iter().zip(&want)) {
                let err = relative_error(g, r);
                assert!(err < 1e-5, "{arch} {what}: {name}: relative error {err}");
            }
        }
    }
}
