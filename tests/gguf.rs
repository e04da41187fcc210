//! `model import_gguf`: errors on synthetic GGUFs, an exact round trip of
//! the tiny Llama through a GGUF written the way llama.cpp writes one, and,
//! on the real SmolLM2-135M-Instruct Q4_1 GGUF (fetched by
//! `.ci/fetch-smollm2.sh`; the tests say SKIPPED without it), logits against
//! candle's own quantized Llama, greedy answers, the rebuilt tokenizer
//! against the GGUF's vocabulary and merges, and the chat template.

mod common;

use common::max_diff;

use std::collections::HashMap;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, IndexOp, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use tempfile::TempDir;
use tokenizers::Tokenizer;
use trace_train::model::io::gguf::{self, GgufError};
use trace_train::model::{self, LoadedModel, arch::tiny};

const SMOLLM2: &str = "target/fixtures/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The fixture, or `None` after a SKIPPED line that output capture cannot
/// hide.
fn smollm2(test: &str) -> Option<PathBuf> {
    let path = common::repo().join(SMOLLM2);
    if path.is_file() {
        return Some(path);
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: `{SMOLLM2}` is absent; run `bash .ci/fetch-smollm2.sh` ***\n"
    );
    None
}

/// Imports `file` into a fresh temporary folder.
fn import(file: &Path) -> (TempDir, PathBuf, gguf::ImportReport) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("model");
    let report = gguf::import_gguf(file, &out).unwrap();
    (tmp, out, report)
}

fn rms(x: &Tensor) -> f32 {
    x.sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .sqrt()
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn argmax(logits: &Tensor) -> u32 {
    logits.argmax(0).unwrap().to_scalar().unwrap()
}

/// Writes a GGUF holding `metadata` and `tensors` (stored as `dtype`).
fn write_gguf(path: &Path, metadata: &[(String, Value)], tensors: &[(String, Tensor)]) {
    let qs: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), QTensor::quantize(t, GgmlDType::F32).unwrap()))
        .collect();
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = qs.iter().map(|(n, q)| (n.as_str(), q)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md, &ts).unwrap();
}

/// GPT-2's byte-to-symbol table (`bytes_to_unicode`): printable Latin-1
/// bytes stand for themselves, the others for code points from 256 on.
fn byte_symbols() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xFF).contains(&b) && b != 0xAD;
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).unwrap()
        })
        .collect()
}

// ---------------------------------------------------------------- tiny --

const TINY_HEADS: usize = 4;
const TINY_KV_HEADS: usize = 2;

/// The tiny Llama's 512-token byte-level vocabulary: three ChatML control
/// tokens, the 256 byte symbols, and 253 merges of lowercase letter pairs.
fn tiny_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    tokens.extend(byte_symbols().iter().map(|c| c.to_string()));
    let mut merges = Vec::new();
    'outer: for a in 'a'..='z' {
        for b in 'a'..='z' {
            if tokens.len() == 512 {
                break 'outer;
            }
            merges.push(format!("{a} {b}"));
            tokens.push(format!("{a}{b}"));
        }
    }
    let types = (0..tokens.len())
        .map(|i| if i < 3 { 3 } else { 1 })
        .collect();
    (tokens, types, merges)
}

/// Metadata of a llama GGUF with the tiny model's shape and vocabulary.
fn tiny_metadata(architecture: &str) -> Vec<(String, Value)> {
    let (tokens, types, merges) = tiny_vocab();
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let u32s = |k: &str, v: u32| (k.to_owned(), Value::U32(v));
    vec![
        (
            "general.architecture".into(),
            Value::String(architecture.into()),
        ),
        u32s("llama.block_count", 2),
        u32s("llama.context_length", 256),
        u32s("llama.embedding_length", 64),
        u32s("llama.feed_forward_length", 128),
        u32s("llama.attention.head_count", TINY_HEADS as u32),
        u32s("llama.attention.head_count_kv", TINY_KV_HEADS as u32),
        u32s("llama.rope.dimension_count", 16),
        ("llama.rope.freq_base".into(), Value::F32(100_000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-5),
        ),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
        ("tokenizer.ggml.tokens".into(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        u32s("tokenizer.ggml.bos_token_id", 1),
        u32s("tokenizer.ggml.eos_token_id", 2),
        u32s("tokenizer.ggml.unknown_token_id", 0),
        u32s("tokenizer.ggml.padding_token_id", 2),
        (
            "tokenizer.chat_template".into(),
            Value::String(
                "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}".into(),
            ),
        ),
    ]
}

/// The GGUF tensors of the tiny Llama in `hf_dir`, as llama.cpp's converter
/// writes them: llama.cpp names, q and k rows permuted.
fn tiny_gguf_tensors(hf_dir: &Path) -> Vec<(String, Tensor)> {
    let hf =
        candle_core::safetensors::load(hf_dir.join(model::WEIGHTS_FILE), &Device::Cpu).unwrap();
    let mut names = vec!["token_embd.weight".to_owned(), "output_norm.weight".into()];
    for i in 0..2 {
        for part in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
            "attn_norm",
            "ffn_norm",
        ] {
            names.push(format!("blk.{i}.{part}.weight"));
        }
    }
    names
        .into_iter()
        .map(|name| {
            let w = &hf[&gguf::hf_name(&name).unwrap()];
            let w = if name.contains("attn_q") {
                gguf::permute_rope_rows(w, TINY_HEADS).unwrap()
            } else if name.contains("attn_k") {
                gguf::permute_rope_rows(w, TINY_KV_HEADS).unwrap()
            } else {
                w.clone()
            };
            (name, w)
        })
        .collect()
}

/// A tiny HF Llama and the GGUF made from it, in `tmp`; `untied` adds an
/// `output.weight` of its own.
fn tiny_gguf(tmp: &Path, untied: bool) -> (PathBuf, PathBuf) {
    let hf_dir = tmp.join("hf");
    tiny::write_tiny_llama(&hf_dir, 7).unwrap();
    let mut tensors = tiny_gguf_tensors(&hf_dir);
    if untied {
        let output = tensors[0].1.affine(-0.7, 0.01).unwrap();
        tensors.push(("output.weight".into(), output));
    }
    let file = tmp.join("tiny.gguf");
    write_gguf(&file, &tiny_metadata("llama"), &tensors);
    (hf_dir, file)
}

fn load(dir: &Path) -> LoadedModel {
    model::load(dir, None, DType::F32, &Device::Cpu).unwrap()
}

#[test]
fn tiny_llama_round_trips_through_gguf_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let (hf_dir, file) = tiny_gguf(tmp.path(), false);
    let (_out_tmp, out, report) = import(&file);
    assert_eq!(report.tensors, 20);
    assert!(report.tie_word_embeddings);

    // Every weight comes back bit for bit, q and k un-permuted.
    let original =
        candle_core::safetensors::load(hf_dir.join(model::WEIGHTS_FILE), &Device::Cpu).unwrap();
    let imported =
        candle_core::safetensors::load(out.join(model::WEIGHTS_FILE), &Device::Cpu).unwrap();
    let mut names: Vec<_> = imported.keys().collect();
    names.sort();
    let mut expected: Vec<_> = original.keys().collect();
    expected.sort();
    assert_eq!(names, expected);
    for (name, w) in &original {
        let back = &imported[name];
        assert_eq!(back.dtype(), DType::F32, "{name}");
        assert_eq!(back.dims(), w.dims(), "{name}");
        assert_eq!(max_diff(back, w), 0.0, "{name}");
    }

    // The config says what the tiny model's says.
    let read = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap()
    };
    let (a, b) = (read(&hf_dir), read(&out));
    for key in [
        "model_type",
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "tie_word_embeddings",
        "hidden_act",
        "bos_token_id",
        "eos_token_id",
        "torch_dtype",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    // The GGUF pads with its eos; the import must not.
    assert_eq!(b["pad_token_id"], 0);
}

/// candle's quantized Llama runs the GGUF as llama.cpp does (interleaved
/// RoPE on permuted rows); the imported folder runs through our Llama
/// (half-split RoPE on un-permuted rows). Same numbers, up to f32 rounding.
/// The synthetic GGUF (merges, SmolLM's digit split, q/k permuted, a
/// padding token that is the eos) imported, exported by `model export`
/// and imported again gives the same folder: what the SmolLM2 test in
/// `gguf_export.rs` checks on the real file, on a file always present.
#[test]
fn tiny_llama_import_export_import_is_the_identity() {
    let tmp = tempfile::tempdir().unwrap();
    for untied in [false, true] {
        let dir = tmp.path().join(format!("untied-{untied}"));
        std::fs::create_dir(&dir).unwrap();
        let (_, file) = tiny_gguf(&dir, untied);
        let first = dir.join("first");
        gguf::import_gguf(&file, &first).unwrap();
        let again = dir.join("again.gguf");
        let o = common::trace_train(
            &dir,
            &[
                "model",
                "export",
                "--gguf",
                "first",
                "--output",
                "again.gguf",
                "--outtype",
                "f32",
            ],
        );
        assert!(o.status.success(), "{}", common::stderr(&o));
        let second = dir.join("second");
        gguf::import_gguf(&again, &second).unwrap();
        for f in [
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "config.json",
        ] {
            assert_eq!(
                std::fs::read(first.join(f)).unwrap(),
                std::fs::read(second.join(f)).unwrap(),
                "untied {untied}: {f}"
            );
        }
        // The exported GGUF holds what the original holds, tensors included.
        let (mut a, mut b) = (
            std::fs::File::open(&file).unwrap(),
            std::fs::File::open(&again).unwrap(),
        );
        let (ca, cb) = (
            Content::read(&mut a).unwrap(),
            Content::read(&mut b).unwrap(),
        );
        let mut names: Vec<_> = ca.tensor_infos.keys().collect();
        names.sort();
        let mut names_b: Vec<_> = cb.tensor_infos.keys().collect();
        names_b.sort();
        assert_eq!(names, names_b);
        for name in names {
            let t = |c: &Content, r: &mut std::fs::File| {
                c.tensor(r, name, &Device::Cpu)
                    .unwrap()
                    .dequantize(&Device::Cpu)
                    .unwrap()
            };
            assert_eq!(max_diff(&t(&ca, &mut a), &t(&cb, &mut b)), 0.0, "{name}");
        }
        for key in [
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.pre",
        ] {
            assert_eq!(
                format!("{:?}", ca.metadata[key]),
                format!("{:?}", cb.metadata[key]),
                "{key}"
            );
        }
    }
}

#[test]
fn tiny_import_matches_candle_quantized_llama() {
    for untied in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let (_, file) = tiny_gguf(tmp.path(), untied);
        let (_out_tmp, out, report) = import(&file);
        assert_eq!(report.tie_word_embeddings, !untied);
        let ids: Vec<u32> = (0..12u32).map(|i| (i * 37 + 5) % 512).collect();
        let ours = our_logits(&load(&out), &ids);
        let reference = reference_logits(&file, &ids, false);
        let diff = max_diff(&ours, &reference);
        eprintln!("tiny (untied {untied}): max |ours - candle quantized_llama| = {diff:e}");
        assert!(diff < 1e-4, "{diff}");
    }
}

#[test]
fn cli_imports_and_prints_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, file) = tiny_gguf(tmp.path(), false);
    let out = tmp.path().join("imported");
    let o = common::trace_train(
        tmp.path(),
        &["model", "import_gguf", "tiny.gguf", "imported"],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["files"].as_array().unwrap().len(), 5);
    assert_eq!(report["pad_token"], "<|endoftext|>");
    assert!(common::stderr(&o).contains("note: the GGUF pads with its eos"));
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(out.join(name).is_file(), "{name}");
    }
    assert!(file.is_file());
}

/// Logits `(L, vocab)` of candle's quantized Llama on `file`, one position at
/// a time through its KV cache. `dequantized`: first rewrite every tensor as
/// F32, so that its matmuls are plain f32 ones.
fn reference_logits(file: &Path, ids: &[u32], dequantized: bool) -> Tensor {
    let dev = Device::Cpu;
    let mut reader = std::fs::File::open(file).unwrap();
    let content = Content::read(&mut reader).unwrap();
    let mut model = if dequantized {
        let mut names: Vec<&String> = content.tensor_infos.keys().collect();
        names.sort();
        let tensors: Vec<(String, QTensor)> = names
            .into_iter()
            .map(|n| {
                let w = content
                    .tensor(&mut reader, n, &dev)
                    .unwrap()
                    .dequantize(&dev)
                    .unwrap();
                (n.clone(), QTensor::quantize(&w, GgmlDType::F32).unwrap())
            })
            .collect();
        let md: Vec<(&str, &Value)> = content
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, q)| (n.as_str(), q)).collect();
        let mut bytes = Cursor::new(Vec::new());
        gguf_file::write(&mut bytes, &md, &ts).unwrap();
        bytes.set_position(0);
        let content = Content::read(&mut bytes).unwrap();
        ModelWeights::from_gguf(content, &mut bytes, &dev).unwrap()
    } else {
        ModelWeights::from_gguf(content, &mut reader, &dev).unwrap()
    };
    let rows: Vec<Tensor> = ids
        .iter()
        .enumerate()
        .map(|(pos, &id)| {
            let x = Tensor::new(&[id], &dev).unwrap().unsqueeze(0).unwrap();
            model.forward(&x, pos).unwrap().squeeze(0).unwrap()
        })
        .collect();
    Tensor::stack(&rows, 0).unwrap()
}

// -------------------------------------------------------------- errors --

fn run_import(file: &Path, out: &Path) -> (bool, String) {
    let o = common::trace_train(
        file.parent().unwrap(),
        &[
            "model",
            "import_gguf",
            file.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    );
    (o.status.success(), common::stderr(&o))
}

#[test]
fn cli_names_a_missing_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("absent.gguf");
    let (ok, err) = run_import(&file, &tmp.path().join("out"));
    assert!(!ok);
    assert!(
        err.contains(&format!("GGUF file `{}` does not exist", file.display())),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
}

#[test]
fn cli_rejects_a_file_that_is_not_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("model.safetensors");
    std::fs::write(&file, b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ").unwrap();
    let (ok, err) = run_import(&file, &tmp.path().join("out"));
    assert!(!ok);
    assert!(
        err.contains(&format!("`{}` is not a GGUF file", file.display())),
        "{err}"
    );
    let empty = tmp.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let err = gguf::import_gguf(&empty, tmp.path()).unwrap_err();
    assert!(matches!(
        err.downcast_ref::<GgufError>(),
        Some(GgufError::NotGguf { .. })
    ));
}

#[test]
fn cli_rejects_other_architectures() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("qwen.gguf");
    let x = Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap();
    write_gguf(
        &file,
        &tiny_metadata("qwen2"),
        &[("token_embd.weight".into(), x)],
    );
    let (ok, err) = run_import(&file, &tmp.path().join("out"));
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "`{}` holds a `qwen2` model; only `llama` and `qwen3` GGUFs can be imported",
            file.display()
        )),
        "{err}"
    );
}

#[test]
fn cli_rejects_tensor_types_candle_cannot_read() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("iq4.gguf");
    let x = Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap();
    write_gguf(&file, &tiny_metadata("llama"), &[("zz.weight".into(), x)]);
    // Tensor info: name (u64 length, bytes), n_dims u32, dims u64 each,
    // ggml type u32. Turn F32 (0) into IQ4_NL (20).
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.windows(9).position(|w| w == b"zz.weight").unwrap() + 9 + 4 + 2 * 8;
    assert_eq!(bytes[at..at + 4], 0u32.to_le_bytes());
    bytes[at..at + 4].copy_from_slice(&20u32.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let (ok, err) = run_import(&file, &tmp.path().join("out"));
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "`{}` holds a tensor of ggml type 20 (IQ4_NL)",
            file.display()
        )),
        "{err}"
    );
}

#[test]
fn missing_and_unknown_tensors_are_reported_together() {
    let tmp = tempfile::tempdir().unwrap();
    let hf_dir = tmp.path().join("hf");
    tiny::write_tiny_llama(&hf_dir, 7).unwrap();
    let mut tensors = tiny_gguf_tensors(&hf_dir);
    tensors.retain(|(n, _)| n != "blk.1.ffn_up.weight" && n != "output_norm.weight");
    let x = Tensor::zeros(8, DType::F32, &Device::Cpu).unwrap();
    tensors.push(("rope_freqs.weight".into(), x));
    let file = tmp.path().join("broken.gguf");
    write_gguf(&file, &tiny_metadata("llama"), &tensors);
    let out = tmp.path().join("out");
    let err = gguf::import_gguf(&file, &out).unwrap_err();
    let Some(GgufError::Unsupported { problems, .. }) = err.downcast_ref::<GgufError>() else {
        panic!("{err:#}");
    };
    assert_eq!(
        problems,
        &[
            "tensor `rope_freqs.weight`: Llama 3.1 RoPE scaling is not supported",
            "tensor `blk.1.ffn_up.weight` is missing",
            "tensor `output_norm.weight` is missing",
        ]
    );
    assert!(!out.exists(), "nothing is written for a GGUF that fails");
}

// ------------------------------------------------------------- SmolLM2 --

fn tokenizer(dir: &Path) -> Tokenizer {
    Tokenizer::from_file(dir.join(gguf::TOKENIZER_FILE)).unwrap()
}

fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false).unwrap().get_ids().to_vec()
}

/// The imported model's logits `(L, vocab)` for `ids`.
fn our_logits(m: &LoadedModel, ids: &[u32]) -> Tensor {
    let x = Tensor::new(ids, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    m.model
        .forward(&x, None, false)
        .unwrap()
        .squeeze(0)
        .unwrap()
}

#[test]
fn smollm2_logits_match_candle_quantized_llama() {
    let Some(file) = smollm2("smollm2_logits_match_candle_quantized_llama") else {
        return;
    };
    let (_tmp, dir, report) = import(&file);
    assert_eq!(report.parameters, 134_515_008);
    assert_eq!(report.source_types["Q4_1"], 210);
    let ids = encode(&tokenizer(&dir), "The capital of France is");
    let ours = our_logits(&load(&dir), &ids);
    let scale: f32 = ours.abs().unwrap().max_all().unwrap().to_scalar().unwrap();

    // Same dequantized weights, llama.cpp's layout and interleaved RoPE:
    // only f32 summation order differs.
    let exact = reference_logits(&file, &ids, true);
    let diff = max_diff(&ours, &exact);
    eprintln!(
        "SmolLM2: max |ours - quantized_llama on f32 weights| = {diff:e} (max |logit| {scale})"
    );
    assert!(diff < 1e-3, "{diff}");

    // The quantized kernels also round the activations to 8 bits (Q8_1
    // blocks of 32) before each Q4_1 dot product, so they differ by more.
    let quantized = reference_logits(&file, &ids, false);
    let diff = max_diff(&ours, &quantized);
    let relative = rms(&(&ours - &quantized).unwrap()) / rms(&ours);
    eprintln!(
        "SmolLM2: |ours - quantized_llama on Q4_1 kernels|: max {diff}, RMS {relative} of the logits' RMS"
    );
    assert!(
        diff < 2.0 && relative < 0.1,
        "max {diff}, relative RMS {relative}"
    );
    for pos in 0..ids.len() {
        let (a, b) = (ours.i(pos).unwrap(), quantized.i(pos).unwrap());
        assert_eq!(argmax(&a), argmax(&b), "position {pos}");
    }
}

#[test]
fn smollm2_greedy_answers_are_sensible() {
    let Some(file) = smollm2("smollm2_greedy_answers_are_sensible") else {
        return;
    };
    let (_tmp, dir, report) = import(&file);
    let (tok, m) = (tokenizer(&dir), load(&dir));
    let ids = encode(&tok, "The capital of France is");
    let logits = our_logits(&m, &ids);
    let top = argmax(&logits.i(ids.len() - 1).unwrap());
    assert_eq!(tok.decode(&[top], false).unwrap(), " Paris");

    // A ChatML turn, decoded greedily through the KV cache until the eos.
    let prompt =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let mut ids = encode(&tok, prompt);
    let eos = tok
        .token_to_id(report.eos_token.as_deref().unwrap())
        .unwrap();
    let mut cache = m.model.new_cache();
    let mut offset = 0;
    let mut answer = Vec::new();
    for _ in 0..24 {
        let x = Tensor::new(&ids[offset..], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = m.model.forward_with_cache(&x, offset, &mut cache).unwrap();
        offset = ids.len();
        let next = argmax(&logits.squeeze(0).unwrap());
        if next == eos {
            break;
        }
        answer.push(next);
        ids.push(next);
    }
    let text = tok.decode(&answer, false).unwrap();
    eprintln!("SmolLM2 answers: {text:?}");
    assert!(text.contains("Paris"), "{text:?}");
}

/// The GGUF's vocabulary and merge ranks, read directly.
struct GgufVocab {
    tokens: Vec<String>,
    types: Vec<i32>,
    ids: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
}

fn gguf_vocab(file: &Path) -> GgufVocab {
    let mut reader = std::fs::File::open(file).unwrap();
    let content = Content::read(&mut reader).unwrap();
    let strings = |key: &str| -> Vec<String> {
        content.metadata[key]
            .to_vec()
            .unwrap()
            .iter()
            .map(|v| v.to_string().unwrap().clone())
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens");
    let types = content.metadata["tokenizer.ggml.token_type"]
        .to_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_i32().unwrap())
        .collect();
    let ranks = strings("tokenizer.ggml.merges")
        .into_iter()
        .enumerate()
        .map(|(rank, m)| {
            let (a, b) = m.split_once(' ').unwrap();
            ((a.to_owned(), b.to_owned()), rank)
        })
        .collect();
    let ids = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    GgufVocab {
        tokens,
        types,
        ids,
        ranks,
    }
}

impl GgufVocab {
    /// BPE as llama.cpp runs it on one pre-token: byte symbols, then the
    /// lowest-ranked adjacent pair merged until no pair has a rank.
    fn bpe(&self, piece: &str) -> Vec<u32> {
        let symbols = byte_symbols();
        let mut parts: Vec<String> = piece
            .bytes()
            .map(|b| symbols[b as usize].to_string())
            .collect();
        loop {
            let best = parts
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| Some((*self.ranks.get(&(w[0].clone(), w[1].clone()))?, i)))
                .min();
            let Some((_, i)) = best else { break };
            let merged = format!("{}{}", parts[i], parts[i + 1]);
            parts.splice(i..=i + 1, [merged]);
        }
        parts.iter().map(|p| self.ids[p]).collect()
    }

    /// The text a token stands for, when it is whole UTF-8.
    fn text(&self, id: usize) -> Option<String> {
        let symbols = byte_symbols();
        let bytes: Option<Vec<u8>> = self.tokens[id]
            .chars()
            .map(|c| symbols.iter().position(|&s| s == c).map(|b| b as u8))
            .collect();
        String::from_utf8(bytes?).ok()
    }
}

#[test]
fn smollm2_tokenizer_encodes_as_the_gguf_vocabulary_and_merges() {
    let Some(file) = smollm2("smollm2_tokenizer_encodes_as_the_gguf_vocabulary_and_merges") else {
        return;
    };
    let (_tmp, dir, _) = import(&file);
    let tok = tokenizer(&dir);
    let v = gguf_vocab(&file);
    assert_eq!(tok.get_vocab_size(true), v.tokens.len());
    for (id, t) in v.tokens.iter().enumerate() {
        assert_eq!(tok.token_to_id(t), Some(id as u32), "{t:?}");
    }

    // Every token alone encodes to itself where that is well defined.
    let mut alone = 0;
    let mut mismatches = Vec::new();
    for id in 0..v.tokens.len() {
        if v.types[id] != 1 {
            assert_eq!(encode(&tok, &v.tokens[id]), [id as u32], "special {id}");
            continue;
        }
        let Some(text) = v.text(id) else { continue };
        let got = encode(&tok, &text);
        if got == [id as u32] {
            alone += 1;
        } else {
            mismatches.push((id, text, got));
        }
    }
    // The rest (313 in SmolLM2) are pieces of multi-byte characters.
    eprintln!("SmolLM2: {alone} tokens encode alone to themselves");
    assert!(mismatches.is_empty(), "{mismatches:?}");
    assert!(alone > 48_000, "{alone}");

    // Known texts: pre-tokens as llama.cpp's `smollm` regexes split them
    // (each digit alone, then GPT-2's split), each run through the
    // reference BPE; `Err(id)` is a special token.
    let cases: [(&str, Vec<Result<&str, u32>>); 6] = [
        ("Hello world", vec![Ok("Hello"), Ok(" world")]),
        (
            "The capital of France is",
            vec![
                Ok("The"),
                Ok(" capital"),
                Ok(" of"),
                Ok(" France"),
                Ok(" is"),
            ],
        ),
        (
            "def f(x):\n    return x * 2",
            vec![
                Ok("def"),
                Ok(" f"),
                Ok("("),
                Ok("x"),
                Ok("):"),
                Ok("\n   "),
                Ok(" return"),
                Ok(" x"),
                Ok(" *"),
                Ok(" "),
                Ok("2"),
            ],
        ),
        (
            "x = 12345",
            vec![
                Ok("x"),
                Ok(" ="),
                Ok(" "),
                Ok("1"),
                Ok("2"),
                Ok("3"),
                Ok("4"),
                Ok("5"),
            ],
        ),
        (
            "héllo wörld 日本語",
            vec![Ok("héllo"), Ok(" wörld"), Ok(" 日本語")],
        ),
        (
            "<|im_start|>user\nHi!<|im_end|>\n",
            vec![
                Err(1),
                Ok("user"),
                Ok("\n"),
                Ok("Hi"),
                Ok("!"),
                Err(2),
                Ok("\n"),
            ],
        ),
    ];
    for (text, pieces) in cases {
        let expected: Vec<u32> = pieces
            .iter()
            .flat_map(|p| match p {
                Ok(piece) => v.bpe(piece),
                Err(id) => vec![*id],
            })
            .collect();
        assert_eq!(encode(&tok, text), expected, "{text:?}");
    }
    assert_eq!(encode(&tok, " Paris"), [v.ids["ĠParis"]]);
}

#[test]
fn smollm2_tokenizer_round_trips_text() {
    let Some(file) = smollm2("smollm2_tokenizer_round_trips_text") else {
        return;
    };
    let (_tmp, dir, _) = import(&file);
    let tok = tokenizer(&dir);
    let texts = [
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))  # 55\n",
        "for i in range(3):\n\tprint(f\"{i!r:>4}\", end='')\n",
        "naïve café, Straße, ĳ, 日本語のテキスト, 한국어, emoji 🦀🚀 and ∑∫√ math",
        "   leading, trailing   \n\n\n  \t \r\n runs of    whitespace   ",
        "<|im_start|>system\nYou trace code.<|im_end|>\n<|im_start|>user\nx = 1<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|><repo_name>a/b<file_sep>main.py",
        "",
    ];
    for text in texts {
        let ids = encode(&tok, text);
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
    // Special tokens are single ids and can be skipped when decoding.
    let ids = encode(&tok, "<|im_start|>user\nHi<|im_end|>");
    assert_eq!((ids[0], *ids.last().unwrap()), (1, 2));
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nHi");
}

#[test]
fn smollm2_folder_has_the_chat_template_and_special_tokens() {
    let Some(file) = smollm2("smollm2_folder_has_the_chat_template_and_special_tokens") else {
        return;
    };
    let (_tmp, dir, report) = import(&file);
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
    };
    let config = read(gguf::TOKENIZER_CONFIG_FILE);
    assert_eq!(config["bos_token"], "<|im_start|>");
    assert_eq!(config["eos_token"], "<|im_end|>");
    // The GGUF pads with `<|im_end|>`; padding must never hide the eos.
    assert_eq!(config["pad_token"], "<|endoftext|>");
    assert_eq!(report.pad_token.as_deref(), Some("<|endoftext|>"));
    assert_eq!(config["added_tokens_decoder"]["2"]["special"], true);
    let model_config = read(model::CONFIG_FILE);
    let generation = read(gguf::GENERATION_CONFIG_FILE);
    for c in [&model_config, &generation] {
        assert_eq!(
            (&c["bos_token_id"], &c["eos_token_id"], &c["pad_token_id"]),
            (&1.into(), &2.into(), &0.into())
        );
    }
    assert_eq!(model_config["tie_word_embeddings"], true);
    assert_eq!(model_config["rms_norm_eps"], 1e-5);
    assert_eq!(model_config["rope_theta"], 100_000.0);
    assert_eq!(model_config["max_position_embeddings"], 8192);

    let mut env = minijinja::Environment::new();
    env.add_template("chat", config["chat_template"].as_str().unwrap())
        .unwrap();
    let chat = env.get_template("chat").unwrap();
    let render = |messages: serde_json::Value, add_generation_prompt: bool| {
        let messages = minijinja::Value::from(minijinja::value::Serde(messages));
        chat.render(minijinja::context! { messages, add_generation_prompt })
            .unwrap()
    };
    let user = serde_json::json!({"role": "user", "content": "What is 2+2?"});
    assert_eq!(
        render(serde_json::json!([user]), true),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let system = serde_json::json!({"role": "system", "content": "Trace the program."});
    let assistant = serde_json::json!({"role": "assistant", "content": "4"});
    let rendered = render(serde_json::json!([system, user, assistant]), false);
    assert_eq!(
        rendered,
        "<|im_start|>system\nTrace the program.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4<|im_end|>\n"
    );
}
