//! Tiny random models for fast tests: 2 layers, hidden 64, 4 query heads
//! over 2 key/value heads, vocab 512, written as a real model folder
//! (`config.json` + `model.safetensors`, f32) so that they go through the
//! same loader as a downloaded checkpoint.
//!
//! Weights are deterministic in the seed: linear layers uniform in
//! `±1/sqrt(in)` (PyTorch's default scale), embeddings in `±1`, norm gains
//! near 1. The Qwen3 model has an explicit `head_dim` (32) different from
//! `hidden / heads` and an untied `lm_head`; the Llama one ties it, as
//! SmolLM2 does.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::json;

use crate::layers::init::Rng;
use crate::{common::CONFIG_FILE, common::ModelError, common::Result, common::WEIGHTS_FILE};

const VOCAB: usize = 512;
const HIDDEN: usize = 64;
const INTERMEDIATE: usize = 128;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;

/// Writes a tiny Qwen3 model into `dir` (created if needed).
pub fn write_tiny_qwen3(dir: &Path, seed: u64) -> Result<()> {
    let head_dim = 32;
    let config = json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": head_dim,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "hidden_act": "silu",
        "use_sliding_window": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    });
    let mut shapes = decoder_shapes(head_dim);
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}.self_attn");
        shapes.push((format!("{p}.q_norm.weight"), vec![head_dim]));
        shapes.push((format!("{p}.k_norm.weight"), vec![head_dim]));
    }
    shapes.push(("lm_head.weight".to_owned(), vec![VOCAB, HIDDEN]));
    write(dir, &config, &shapes, seed)
}

/// Writes a tiny Llama (SmolLM2-like, tied embeddings) model into `dir`.
pub fn write_tiny_llama(dir: &Path, seed: u64) -> Result<()> {
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100_000.0,
        "rope_scaling": null,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "mlp_bias": false,
        "hidden_act": "silu",
        "pretraining_tp": 1,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    });
    write(dir, &config, &decoder_shapes(HIDDEN / HEADS), seed)
}

/// Names and shapes shared by both architectures.
fn decoder_shapes(head_dim: usize) -> Vec<(String, Vec<usize>)> {
    let (q_out, kv_out) = (HEADS * head_dim, KV_HEADS * head_dim);
    let mut shapes = vec![
        ("model.embed_tokens.weight".to_owned(), vec![VOCAB, HIDDEN]),
        ("model.norm.weight".to_owned(), vec![HIDDEN]),
    ];
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}");
        shapes.extend([
            (format!("{p}.input_layernorm.weight"), vec![HIDDEN]),
            (format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]),
            (format!("{p}.self_attn.q_proj.weight"), vec![q_out, HIDDEN]),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv_out, HIDDEN]),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv_out, HIDDEN]),
            (format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN, q_out]),
            (
                format!("{p}.mlp.gate_proj.weight"),
                vec![INTERMEDIATE, HIDDEN],
            ),
            (
                format!("{p}.mlp.up_proj.weight"),
                vec![INTERMEDIATE, HIDDEN],
            ),
            (
                format!("{p}.mlp.down_proj.weight"),
                vec![HIDDEN, INTERMEDIATE],
            ),
        ]);
    }
    shapes
}

fn write(
    dir: &Path,
    config: &serde_json::Value,
    shapes: &[(String, Vec<usize>)],
    seed: u64,
) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ModelError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config_path = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(config).expect("a JSON value serialises");
    std::fs::write(&config_path, text).map_err(io(&config_path))?;
    let mut tensors = HashMap::new();
    for (name, shape) in shapes {
        let n: usize = shape.iter().product();
        let mut rng = Rng::for_tensor(seed, name);
        let values = if name.ends_with("norm.weight") {
            rng.uniform(n, 0.9, 1.1)
        } else if name.contains("embed_tokens") {
            rng.uniform(n, -1.0, 1.0)
        } else {
            let bound = 1.0 / (shape[1] as f32).sqrt();
            rng.uniform(n, -bound, bound)
        };
        let tensor =
            Tensor::from_vec(values, shape.as_slice(), &Device::Cpu).map_err(|source| {
                ModelError::Tensor {
                    context: format!("cannot build `{name}`"),
                    source,
                }
            })?;
        tensors.insert(name.clone(), tensor);
    }
    let weights_path = dir.join(WEIGHTS_FILE);
    crate::common::save_safetensors(&tensors, &weights_path).map_err(|source| ModelError::Tensor {
        context: format!("cannot write `{}`", weights_path.display()),
        source,
    })
}

/// A tiny Qwen3 with a real (byte-level) tokenizer and a ChatML template:
/// a complete chat model folder that trains and generates end to end in
/// seconds, for `pipeline --quick_test` and the recipe tests. The tokenizer
/// has the 256 byte tokens (GPT-2's byte-to-unicode alphabet, no merges) and
/// three specials: `<|endoftext|>` (256, padding), `<|im_start|>` (257) and
/// `<|im_end|>` (258, end of turn and eos).
pub fn write_tiny_chat_model(dir: &Path, seed: u64) -> Result<()> {
    write_tiny_qwen3(dir, seed)?;
    // LoRA leaves lm_head frozen, and with PyTorch's default scale its logits
    // stay too flat for a few answers to be learned confidently: widen it.
    let weights = dir.join(WEIGHTS_FILE);
    let wrap = |e: candle_core::Error| ModelError::Tensor {
        context: format!("rewriting `{}`", weights.display()),
        source: e,
    };
    let mut tensors = candle_core::safetensors::load(&weights, &Device::Cpu).map_err(wrap)?;
    let head = tensors
        .remove("lm_head.weight")
        .expect("tiny Qwen3 has lm_head");
    tensors.insert("lm_head.weight".into(), (head * 16.0).map_err(wrap)?);
    crate::common::save_safetensors(&tensors, &weights).map_err(wrap)?;
    let path = dir.join(CONFIG_FILE);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).map_err(|source| ModelError::Read {
            path: path.clone(),
            source,
        })?)
        .expect("config we wrote");
    config["max_position_embeddings"] = json!(8192);
    config["bos_token_id"] = json!(257);
    config["eos_token_id"] = json!(258);
    std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("json")).map_err(|source| {
        ModelError::Write {
            path: path.clone(),
            source,
        }
    })?;

    let mut vocab = serde_json::Map::new();
    for (byte, ch) in byte_alphabet().into_iter().enumerate() {
        vocab.insert(ch.to_string(), json!(byte));
    }
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []},
    });
    let template = "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}";
    let tokenizer_config = json!({
        "chat_template": template,
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 8192,
    });
    for (name, value) in [
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", tokenizer_config),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_vec_pretty(&value).expect("json")).map_err(|source| {
            ModelError::Write {
                path: p.clone(),
                source,
            }
        })?;
    }
    Ok(())
}

/// GPT-2's printable stand-in for each byte, so byte-level BPE vocabularies
/// are plain strings: printable Latin-1 bytes stand for themselves, the rest
/// map to U+0100 onwards in byte order.
fn byte_alphabet() -> Vec<char> {
    let keeps =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0u32..256)
        .map(|b| {
            if keeps(b) {
                char::from_u32(b).expect("latin-1")
            } else {
                let c = char::from_u32(next).expect("valid");
                next += 1;
                c
            }
        })
        .collect()
}
