//! The SFT recipe on a real pretrained model: SmolLM2-135M-Instruct, imported
//! from its GGUF (fetched by `.ci/run`; without it this test says SKIPPED).

mod common;

use candle_core::{DType, Device, Tensor};
use common::train::smollm2_folder;
use common::{max_diff, stderr, trace_train};
use trace_train::model::{self, io::adapter};

#[test]
fn smollm2_learns_a_small_set_to_full_exact_match() {
    let Some(dir) = smollm2_folder("smollm2_learns_a_small_set_to_full_exact_match") else {
        return;
    };
    let mut text = String::new();
    for (i, (q, a)) in [
        ("what is 2+5?", "7"),
        ("forty-two in digits", "42"),
        ("reply ok", "ok"),
        ("opposite of yes", "no"),
    ]
    .iter()
    .enumerate()
    {
        let rec = serde_json::json!({
            "messages": [{"role": "user", "content": format!("q{i}: {q}")}, {"role": "assistant", "content": a}],
            "program": q, "input": "", "expected_output": a,
            "metadata": {"row_index": i, "seed": null, "output_lines": 1, "features": {"lines": 1, "loop_depth": 0}},
        });
        text.push_str(&format!("{rec}\n"));
    }
    std::fs::write(dir.path().join("small.jsonl"), text).unwrap();
    let eval = |model: &str, out: &str| -> serde_json::Value {
        let o = trace_train(
            dir.path(),
            &[
                "eval",
                "--model",
                model,
                "--data",
                "small.jsonl",
                "--output",
                out,
                "--max_new_tokens",
                "8",
                "--device",
                "cpu",
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&std::fs::read(dir.path().join(out)).unwrap()).unwrap()
    };
    let before = eval("smol", "before.json");
    let o = trace_train(
        dir.path(),
        &[
            "warmup",
            "--model",
            "smol",
            "--train_file",
            "small.jsonl",
            "--eval_file",
            "none.jsonl",
            "--output_dir",
            "out",
            "--batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
            "--learning_rate",
            "0.003",
            "--max_steps",
            "8",
            "--save_steps",
            "100",
            "--epochs",
            "100",
            "--device",
            "cpu",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let losses: Vec<f64> = std::fs::read_to_string(dir.path().join("out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert!(losses[losses.len() - 1] < 0.2 * losses[0], "{losses:?}");
    let after = eval("out/merged", "after.json");
    assert!(before["correct"].as_u64().unwrap() < 4, "{before}");
    assert_eq!(after["correct"], 4, "{after}");

    // The trained adapter, read back from disk and applied to the base,
    // gives the merged model's logits (f32, CPU).
    let cpu = Device::Cpu;
    let base = dir.path().join("smol");
    let with_adapter =
        adapter::load(&base, &dir.path().join("out/final"), DType::F32, &cpu).unwrap();
    let merged = model::load(&dir.path().join("out/merged"), None, DType::F32, &cpu).unwrap();
    let plain = model::load(&base, None, DType::F32, &cpu).unwrap();
    let ids: Vec<u32> = (0..24u32).map(|i| (i * 1009 + 17) % 49152).collect();
    let ids = Tensor::from_vec(ids, (2, 12), &cpu).unwrap();
    let logits = |m: &model::LoadedModel| m.model.forward(&ids, None, false).unwrap();
    let adapted = logits(&with_adapter);
    assert!(
        max_diff(&adapted, &logits(&plain)) > 1e-2,
        "the trained adapter must change the logits"
    );
    // f32 sums taken in another order differ in their last bits, and 30
    // layers carry that to the logits: bound the difference relative to the
    // logits' size (the tiny models, 2 layers, meet 1e-4 absolute).
    let diff = max_diff(&adapted, &logits(&merged));
    let scale: f32 = adapted
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    eprintln!("merged vs base + adapter: max abs diff {diff:e}, largest logit {scale}");
    assert!(
        diff / scale < 1e-5,
        "merged vs base + adapter: {diff} (largest logit {scale})"
    );
}

/// SmolLM2's chat template, as imported: an SFT example's labels are the
/// answer and the end-of-turn token `<|im_end|>`, which is also a stop id
/// of decoding, so what training teaches ends generation.
#[test]
fn smollm2_sft_labels_end_with_the_end_of_turn_token_decoding_stops_on() {
    use trace_train::data::{ChatTokenizer, Example, IGNORE_INDEX, Message, Role};
    let Some(dir) =
        smollm2_folder("smollm2_sft_labels_end_with_the_end_of_turn_token_decoding_stops_on")
    else {
        return;
    };
    let tok = ChatTokenizer::from_dir(&dir.path().join("smol")).unwrap();
    let eot = tok.end_of_turn().clone();
    assert_eq!(eot.text, "<|im_end|>");
    assert!(tok.stop_ids().contains(&eot.id), "{:?}", tok.stop_ids());
    for answer in ["[]", "7\n8", ""] {
        let chat = [
            Message::new(Role::User, "Predict the output of print([])"),
            Message::new(Role::Assistant, answer),
        ];
        let ex = Example::new(&tok, &chat).unwrap();
        let labels = ex.labels();
        assert!(labels[..ex.prompt_len].iter().all(|&l| l == IGNORE_INDEX));
        assert_eq!(*labels.last().unwrap(), i64::from(eot.id), "{answer:?}");
        let learned: Vec<u32> = ex.input_ids[ex.prompt_len..].to_vec();
        assert_eq!(
            tok.decode(&learned, false).unwrap(),
            format!("{answer}<|im_end|>")
        );
    }
}

/// Greedy decoding from FP8 base weights (E4M3, a scale an output channel,
/// activations a scale a token) against the weights as imported, on the
/// CPU (f32; the CPU multiplies the same codes after dequantising them):
/// how many tokens agree before the first difference, over five prompts of
/// 24 new tokens. Printed, and held to at least a third of them (NF4,
/// measured the same way, is printed beside it).
#[test]
fn smollm2_greedy_in_fp8_keeps_the_16_bit_tokens() {
    use trace_train::data::template::{Message, Role};
    use trace_train::data::tokenizer::ChatTokenizer;
    use trace_train::model::BasePrecision;
    let Some(dir) = smollm2_folder("smollm2_greedy_in_fp8_keeps_the_16_bit_tokens") else {
        return;
    };
    let smol = dir.path().join("smol");
    let tok = ChatTokenizer::from_dir(&smol).unwrap();
    let prompts: Vec<Vec<u32>> = [
        "What is the capital of France?",
        "Write a Python function that adds two numbers.",
        "Name three colours.",
        "What does print(2 ** 10) print?",
        "Explain in one sentence what a list is.",
    ]
    .iter()
    .map(|q| tok.encode_prompt(&[Message::new(Role::User, *q)]).unwrap())
    .collect();
    let decode = |precision: BasePrecision| -> Vec<Vec<u32>> {
        let mut m = model::load(&smol, None, DType::F32, &Device::Cpu).unwrap();
        m.model.hold_base(precision).unwrap();
        model::greedy(&m.model, &prompts, 24, &[], 0, 0, &Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|g| g.tokens)
            .collect()
    };
    let reference = decode(BasePrecision::Bf16);
    let agree = |other: &[Vec<u32>]| -> (usize, usize) {
        let mut same = 0;
        let mut all = 0;
        for (a, b) in reference.iter().zip(other) {
            same += a.iter().zip(b).take_while(|(x, y)| x == y).count();
            all += a.len();
        }
        (same, all)
    };
    let (fp8, all) = agree(&decode(BasePrecision::Fp8));
    let (nf4, _) = agree(&decode(BasePrecision::Nf4));
    println!("greedy tokens before the first difference: fp8 {fp8}/{all}, nf4 {nf4}/{all}");
    assert!(all >= 5, "the model said almost nothing: {reference:?}");
    assert!(3 * fp8 >= all, "fp8 kept {fp8} of {all} tokens");
}
