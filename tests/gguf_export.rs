//! `model export --gguf`: the tiny chat model (Qwen3), a tiny Llama with
//! the same tokenizer, and a merged model written as GGUFs and read back
//! with our own `import_gguf`: equal weights (f32 exactly; f16, bf16 and
//! Q8_0 within their rounding; norms always f32), the same token ids and
//! the same rendered chat template; Llama's q/k permutation checked by
//! candle's quantized Llama (llama.cpp's interleaved RoPE) giving our
//! logits; Qwen2's and Llama 3's split pre-tokenizers (and Qwen's NFC)
//! through export and import; refusals. On the real SmolLM2 GGUF (`.ci/fetch-smollm2.sh`;
//! SKIPPED without it): import, export f32, import again is the identity.
//! With Python's `gguf` package (SKIPPED without it), the file reads there.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use common::{max_diff, stderr, trace_train};
use tokenizers::Tokenizer;
use trace_train::data::tokenizer::ChatTokenizer;
use trace_train::data::{Message, Role};
use trace_train::model::arch::tiny;
use trace_train::model::io::gguf;

const SMOLLM2: &str = "target/fixtures/SmolLM2-135M-Instruct.Q4_1.gguf";

fn skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED {test}: {why} ***\n");
}

fn weights(dir: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap()
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

/// `trace-train model export --gguf MODEL --output FILE` with `extra`
/// flags, run in `dir`; panics unless it succeeds.
fn export(dir: &Path, model: &str, file: &str, extra: &[&str]) {
    let args = [
        &["model", "export", "--gguf", model, "--output", file][..],
        extra,
    ]
    .concat();
    let o = trace_train(dir, &args);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `trace-train model import_gguf FILE OUT`, run in `dir`.
fn import(dir: &Path, file: &str, out: &str) -> PathBuf {
    let o = trace_train(dir, &["model", "import_gguf", file, out]);
    assert!(o.status.success(), "{}", stderr(&o));
    dir.join(out)
}

/// Each tensor of `got` against `want`: same names and shapes, values
/// within `tol(want)` (per tensor), one-dimensional ones exact.
fn assert_weights(
    want: &HashMap<String, Tensor>,
    got: &HashMap<String, Tensor>,
    tol: fn(&Tensor) -> f32,
) {
    let mut names: Vec<_> = want.keys().collect();
    names.sort();
    let mut got_names: Vec<_> = got.keys().collect();
    got_names.sort();
    assert_eq!(names, got_names);
    for name in names {
        let (w, g) = (
            want[name].to_dtype(DType::F32).unwrap(),
            got[name].to_dtype(DType::F32).unwrap(),
        );
        assert_eq!(w.dims(), g.dims(), "{name}");
        let bound = if w.rank() == 1 { 0.0 } else { tol(&w) };
        let diff = max_diff(&w, &g);
        assert!(diff <= bound, "{name}: {diff} > {bound}");
    }
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

fn exact(_: &Tensor) -> f32 {
    0.0
}

const TEXTS: [&str; 4] = [
    "hello world",
    "<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n",
    "  spaces\tand\nnewlines ",
    "unicode: é, ß, 漢字, 🙂",
];

/// The same ids for `TEXTS`, and the same rendered chat.
fn assert_same_tokenizer(a: &Path, b: &Path) {
    let (ta, tb) = (
        Tokenizer::from_file(a.join("tokenizer.json")).unwrap(),
        Tokenizer::from_file(b.join("tokenizer.json")).unwrap(),
    );
    for text in TEXTS {
        let ids = |t: &Tokenizer| t.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids(&ta), ids(&tb), "{text:?}");
    }
    let messages = [
        Message::new(Role::System, "Be brief."),
        Message::new(Role::User, "What is 2 + 2?"),
    ];
    let render = |dir: &Path| {
        ChatTokenizer::from_dir(dir)
            .unwrap()
            .render_prompt(&messages)
            .unwrap()
    };
    let rendered = render(a);
    assert!(rendered.contains("What is 2 + 2?"), "{rendered}");
    assert_eq!(rendered, render(b));
}

#[test]
fn tiny_qwen3_round_trips_in_every_outtype() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = trace_train(dir, &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let base = weights(&dir.join("base"));
    type Tol = fn(&Tensor) -> f32;
    let cases: [(&str, Tol); 4] = [
        ("f32", exact),
        // Half an ulp at the largest magnitude: 2^-11 (f16), 2^-8 (bf16).
        ("f16", |w| max_abs(w) / 2048.0),
        ("bf16", |w| max_abs(w) / 256.0),
        // Half a step of a block's scale max|x| / 127, plus its f16 rounding.
        ("q8_0", |w| max_abs(w) / 127.0),
    ];
    for (outtype, tol) in cases {
        let file = format!("tiny-{outtype}.gguf");
        export(dir, "base", &file, &["--outtype", outtype]);
        let back = import(dir, &file, &format!("back-{outtype}"));
        assert_weights(&base, &weights(&back), tol);
        let (want, got) = (config(&dir.join("base")), config(&back));
        for key in [
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_theta",
            "tie_word_embeddings",
            "vocab_size",
            "eos_token_id",
        ] {
            assert_eq!(want[key], got[key], "{outtype}: {key}");
        }
        assert_same_tokenizer(&dir.join("base"), &back);
        let mut reader = std::fs::File::open(dir.join(&file)).unwrap();
        let content = Content::read(&mut reader).unwrap();
        let md = &content.metadata;
        assert!(matches!(&md["general.architecture"], Value::String(a) if a == "qwen3"));
        assert!(matches!(md["qwen3.attention.key_length"], Value::U32(32)));
        assert!(matches!(md["qwen3.context_length"], Value::U32(8192)));
        assert!(matches!(&md["tokenizer.ggml.model"], Value::String(m) if m == "gpt2"));
        assert!(matches!(md["tokenizer.ggml.eos_token_id"], Value::U32(258)));
        assert!(
            matches!(&md["tokenizer.chat_template"], Value::String(t) if t.contains("<|im_start|>"))
        );
        let types = content.tensor_infos["blk.0.attn_norm.weight"].ggml_dtype;
        assert_eq!(format!("{types:?}"), "F32", "{outtype}: norms stay f32");
    }
    // The file starts with GGUF version 3.
    let head = std::fs::read(dir.join("tiny-f32.gguf")).unwrap();
    assert_eq!(&head[..8], b"GGUF\x03\x00\x00\x00");
}

/// Our logits for `ids` on the model in `dir`, `(L, vocab)`.
fn our_logits(dir: &Path, ids: &[u32]) -> Tensor {
    let m = trace_train::model::load(dir, None, DType::F32, &Device::Cpu).unwrap();
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
fn tiny_llama_is_permuted_as_llama_cpp_runs_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    tiny::write_tiny_chat_model(&dir.join("chat"), 3).unwrap();
    tiny::write_tiny_llama(&dir.join("llama"), 5).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join("chat").join(f), dir.join("llama").join(f)).unwrap();
    }
    export(dir, "llama", "llama.gguf", &["--outtype", "f32"]);
    let back = import(dir, "llama.gguf", "back");
    let base = weights(&dir.join("llama"));
    assert_weights(&base, &weights(&back), exact);
    assert_same_tokenizer(&dir.join("llama"), &back);

    // The stored q rows are the HF rows permuted (not as they are), and
    // candle's quantized Llama, which rotates adjacent pairs as llama.cpp
    // does, gives the logits our half-split model gives.
    let mut reader = std::fs::File::open(dir.join("llama.gguf")).unwrap();
    let content = Content::read(&mut reader).unwrap();
    assert!(!content.tensor_infos.contains_key("output.weight"), "tied");
    let q = content
        .tensor(&mut reader, "blk.0.attn_q.weight", &Device::Cpu)
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap();
    let hf_q = &base["model.layers.0.self_attn.q_proj.weight"];
    assert_eq!(
        max_diff(&q, &gguf::permute_rope_rows(hf_q, 4).unwrap()),
        0.0
    );
    assert!(max_diff(&q, hf_q) > 1e-3);
    let ids = [257u32, 72, 101, 108, 108, 111, 258];
    let mut model = ModelWeights::from_gguf(content, &mut reader, &Device::Cpu).unwrap();
    let rows: Vec<Tensor> = ids
        .iter()
        .enumerate()
        .map(|(pos, &id)| {
            let x = Tensor::new(&[id], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            model.forward(&x, pos).unwrap().squeeze(0).unwrap()
        })
        .collect();
    let theirs = Tensor::stack(&rows, 0).unwrap();
    let ours = our_logits(&dir.join("llama"), &ids);
    let diff = max_diff(&theirs, &ours);
    assert!(diff < 1e-3, "{diff}");
}

#[test]
fn export_with_adapter_equals_merge_then_export() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    tiny::write_tiny_chat_model(&dir.join("base"), 9).unwrap();
    // An adapter on q_proj and down_proj with non-zero B.
    let adapter = dir.join("adapter");
    std::fs::create_dir(&adapter).unwrap();
    std::fs::write(
        adapter.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "down_proj"]}"#,
    )
    .unwrap();
    let mut factors = HashMap::new();
    for layer in 0..2 {
        for (m, input, out) in [("self_attn.q_proj", 64, 128), ("mlp.down_proj", 128, 64)] {
            let p = format!("base_model.model.model.layers.{layer}.{m}");
            let a = Tensor::randn(0f32, 0.3, (2, input), &Device::Cpu).unwrap();
            let b = Tensor::randn(0f32, 0.3, (out, 2), &Device::Cpu).unwrap();
            factors.insert(format!("{p}.lora_A.weight"), a);
            factors.insert(format!("{p}.lora_B.weight"), b);
        }
    }
    trace_train::model::save_safetensors(&factors, adapter.join("adapter_model.safetensors"))
        .unwrap();
    let o = trace_train(
        dir,
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
    export(dir, "merged", "merged.gguf", &["--outtype", "f32"]);
    export(
        dir,
        "base",
        "direct.gguf",
        &["--adapter", "adapter", "--outtype", "f32"],
    );
    let via_merge = weights(&import(dir, "merged.gguf", "a"));
    let direct = weights(&import(dir, "direct.gguf", "b"));
    assert_weights(&weights(&dir.join("merged")), &direct, exact);
    assert_weights(&via_merge, &direct, exact);
    let q = "model.layers.1.self_attn.q_proj.weight";
    assert!(max_diff(&direct[q], &weights(&dir.join("base"))[q]) > 1e-3);
    assert_same_tokenizer(&dir.join("base"), &dir.join("b"));
}

#[test]
fn export_refuses_an_existing_file_and_a_folder_without_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    tiny::write_tiny_chat_model(&dir.join("base"), 1).unwrap();
    std::fs::write(dir.join("taken.gguf"), "mine").unwrap();
    let o = trace_train(
        dir,
        &[
            "model",
            "export",
            "--gguf",
            "base",
            "--output",
            "taken.gguf",
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`taken.gguf` exists"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(dir.join("taken.gguf")).unwrap(),
        "mine"
    );

    tiny::write_tiny_qwen3(&dir.join("bare"), 1).unwrap();
    let o = trace_train(
        dir,
        &["model", "export", "--gguf", "bare", "--output", "b.gguf"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("tokenizer.json") && err.contains("is missing"),
        "{err}"
    );
    assert!(!dir.join("b.gguf").exists() && !dir.join(".b.gguf.partial").exists());
}

#[test]
fn smollm2_import_export_import_is_the_identity() {
    let test = "smollm2_import_export_import_is_the_identity";
    let file = common::repo().join(SMOLLM2);
    if !file.is_file() {
        return skipped(
            test,
            &format!("`{SMOLLM2}` is absent; run `bash .ci/fetch-smollm2.sh`"),
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let first = import(dir, file.to_str().unwrap(), "first");
    export(dir, "first", "again.gguf", &["--outtype", "f32"]);
    let second = import(dir, "again.gguf", "second");
    assert_weights(&weights(&first), &weights(&second), exact);
    assert_eq!(
        std::fs::read(first.join("tokenizer.json")).unwrap(),
        std::fs::read(second.join("tokenizer.json")).unwrap()
    );
    let (a, b) = (
        serde_json::from_slice::<serde_json::Value>(
            &std::fs::read(first.join("tokenizer_config.json")).unwrap(),
        )
        .unwrap(),
        serde_json::from_slice::<serde_json::Value>(
            &std::fs::read(second.join("tokenizer_config.json")).unwrap(),
        )
        .unwrap(),
    );
    assert_eq!(a, b);
    assert_eq!(config(&first), config(&second));
    assert_same_tokenizer(&first, &second);
}

#[test]
fn python_gguf_reads_the_export() {
    let test = "python_gguf_reads_the_export";
    let probe = std::process::Command::new("python3")
        .args(["-c", "import gguf"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return skipped(test, "Python's `gguf` package is not installed");
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    tiny::write_tiny_chat_model(&dir.join("base"), 2).unwrap();
    export(dir, "base", "t.gguf", &["--outtype", "f16"]);
    let script = r#"
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
f = r.fields
arch = bytes(f["general.architecture"].parts[-1]).decode()
tokens = len(f["tokenizer.ggml.tokens"].data)
names = sorted(t.name for t in r.tensors)
print(arch, tokens, len(names), names[0], r.tensors[0].name)
"#;
    let o = std::process::Command::new("python3")
        .args(["-c", script, dir.join("t.gguf").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    // 2 blocks of 11 tensors, the embeddings, the final norm, the output.
    assert_eq!(
        out.trim(),
        "qwen3 512 25 blk.0.attn_k.weight token_embd.weight"
    );
}

/// Qwen2's split regex (with its NFC normalizer) and Llama 3's, as their
/// `tokenizer.json` files spell them.
const SPLITS: [(&str, &str); 2] = [
    (
        "qwen2",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    (
        "llama-bpe",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
];

/// A real Qwen3's tokenizer splits with a regex and normalizes to NFC: the
/// tiny model given Qwen2's (and Llama 3's) pre-tokenizer and a few merges
/// exports with `tokenizer.ggml.pre` named as llama.cpp knows it, and
/// imports back to the same ids; the regex and NFC are in force.
#[test]
fn split_pre_tokenizers_and_nfc_round_trip() {
    for (name, pattern) in SPLITS {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        tiny::write_tiny_chat_model(&dir.join("base"), 4).unwrap();
        let path = dir.join("base/tokenizer.json");
        let mut tok: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let merges = [
            ("1", "2"),
            ("12", "3"),
            ("Ġ", "t"),
            ("h", "e"),
            ("Ġt", "he"),
            ("'", "s"),
        ];
        // The merged tokens take ids 256.. and the three specials move
        // after them (262..265), as a real file orders its added tokens.
        for (i, (a, b)) in merges.iter().enumerate() {
            tok["model"]["vocab"][format!("{a}{b}")] = serde_json::json!(256 + i);
        }
        for added in tok["added_tokens"].as_array_mut().unwrap() {
            added["id"] = serde_json::json!(added["id"].as_u64().unwrap() + 6);
        }
        tok["model"]["merges"] = serde_json::json!(
            merges
                .iter()
                .map(|(a, b)| format!("{a} {b}"))
                .collect::<Vec<_>>()
        );
        tok["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]});
        if name == "qwen2" {
            tok["normalizer"] = serde_json::json!({"type": "NFC"});
        }
        std::fs::write(&path, tok.to_string()).unwrap();
        let config_path = dir.join("base/config.json");
        let mut config = config(&dir.join("base"));
        config["bos_token_id"] = serde_json::json!(263);
        config["eos_token_id"] = serde_json::json!(264);
        std::fs::write(&config_path, config.to_string()).unwrap();

        export(dir, "base", "t.gguf", &["--outtype", "f32"]);
        let mut reader = std::fs::File::open(dir.join("t.gguf")).unwrap();
        let content = Content::read(&mut reader).unwrap();
        assert!(
            matches!(&content.metadata["tokenizer.ggml.pre"], Value::String(p) if p == name),
            "{name}"
        );
        let back = import(dir, "t.gguf", "back");
        assert_same_tokenizer(&dir.join("base"), &back);
        let tok = Tokenizer::from_file(back.join("tokenizer.json")).unwrap();
        let ids = |text: &str| tok.encode(text, false).unwrap().get_ids().to_vec();
        // Qwen2 splits digits one by one, Llama 3 in runs of up to three.
        let digits = if name == "qwen2" { 3 } else { 1 };
        assert_eq!(ids("123").len(), digits, "{name}");
        assert_eq!(ids(" the"), [260], "{name}");
        if name == "qwen2" {
            assert_eq!(ids("e\u{301}"), ids("\u{e9}"), "NFC");
        }
    }
}
