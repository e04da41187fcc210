//! One chat → token ids and labels for supervised fine-tuning.
//!
//! Owns the split between what the model reads and what it learns to say:
//! - prompt = template(messages[..n-1], add_generation_prompt), exactly
//!   what generation starts from at eval (for Qwen3 with thinking disabled
//!   it ends with the empty `<think>\n\n</think>\n\n` block);
//! - answer = the rest of template(messages) after the prompt, cut right
//!   after the end-of-turn token (`<|im_end|>`). The template's trailing
//!   newline after that token is dropped: generation stops at the token, so
//!   nothing after it is ever predicted or seen.
//!
//! The full render must start with the prompt render (checked; an error
//! otherwise). Prompt and answer are tokenized separately, so the prompt's
//! ids are the ones generation sees even where BPE would merge across the
//! boundary. Labels are the answer's ids, [`IGNORE_INDEX`] elsewhere, in
//! Hugging Face's unshifted convention: `labels[i]` is the token at
//! position `i`; the loss compares logits at `i - 1` with it.
//!
//! Over-long examples are dropped, not truncated, and counted in
//! [`BuildStats`]: cutting the prompt from the left removes the instruction
//! and the start of the program, so the recorded output could no longer be
//! derived from what the model reads (it would learn to invent output);
//! cutting the answer removes the end-of-turn token.

use rayon::prelude::*;
use serde::Serialize;

use super::records::Record;
use super::template::Message;
use super::tokenizer::ChatTokenizer;
use super::{DataError, Result};

/// The label of positions that carry no loss (prompt and padding), as in
/// PyTorch's `cross_entropy(ignore_index=-100)`.
pub const IGNORE_INDEX: i64 = -100;

/// One tokenized chat: `input_ids[..prompt_len]` is the prompt, the rest
/// the answer, ending with the end-of-turn token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub input_ids: Vec<u32>,
    pub prompt_len: usize,
    /// The record's line in its file (0 when built from bare messages).
    pub line: u64,
}

impl Example {
    /// Tokenizes a chat whose last message is the answer to learn.
    pub fn new(tok: &ChatTokenizer, messages: &[Message]) -> Result<Self> {
        Self::build(tok, messages).map_err(|(message, hint)| DataError::Example {
            line: 0,
            message,
            hint,
        })
    }

    fn build(
        tok: &ChatTokenizer,
        messages: &[Message],
    ) -> std::result::Result<Self, (String, String)> {
        let Some((_, context)) = messages.split_last() else {
            return Err(("no messages".into(), "a chat needs an answer".into()));
        };
        let template_err = |e: DataError| (e.to_string(), "check the chat template".into());
        let prompt = tok.render_prompt(context).map_err(template_err)?;
        let full = tok
            .template()
            .render(messages, false)
            .map_err(template_err)?;
        let Some(answer) = full.strip_prefix(prompt.as_str()) else {
            let at = prompt
                .char_indices()
                .zip(full.chars())
                .find(|((_, a), b)| a != b)
                .map_or(prompt.len().min(full.len()), |((i, _), _)| i);
            return Err((
                format!(
                    "the chat template does not render the prompt as a prefix of the full chat (they differ at byte {at}: prompt {:?}, chat {:?})",
                    snippet(&prompt, at),
                    snippet(&full, at)
                ),
                "the answer must follow the generation prompt exactly; with Qwen3's template an answer containing `</think>` is moved into a reasoning block".into(),
            ));
        };
        let eot = tok.end_of_turn();
        let body = answer.trim_end();
        if !body.ends_with(&eot.text) {
            return Err((
                format!(
                    "the rendered answer does not end with the end-of-turn token `{}` (it ends {:?})",
                    eot.text,
                    snippet(answer, answer.len().saturating_sub(30))
                ),
                "the template must close the assistant turn the way it did when the tokenizer was loaded".into(),
            ));
        }
        let tok_err = |e: DataError| (e.to_string(), "check the tokenizer files".into());
        let contents: Vec<&str> = context.iter().map(|m| m.content.as_str()).collect();
        let mut input_ids = tok.encode_chat(&prompt, &contents).map_err(tok_err)?;
        let prompt_len = input_ids.len();
        let said = messages.last().map_or("", |m| m.content.as_str());
        let answer_ids = tok.encode_chat(body, &[said]).map_err(tok_err)?;
        if answer_ids.last() != Some(&eot.id) {
            return Err((
                format!(
                    "the answer's last token is {:?}, not the end-of-turn token `{}` ({})",
                    answer_ids.last(),
                    eot.text,
                    eot.id
                ),
                "the end-of-turn token must be an added token of `tokenizer.json`".into(),
            ));
        }
        input_ids.extend_from_slice(&answer_ids);
        Ok(Example {
            input_ids,
            prompt_len,
            line: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Answer tokens, end-of-turn included: the positions with a label.
    pub fn answer_len(&self) -> usize {
        self.input_ids.len() - self.prompt_len
    }

    /// [`IGNORE_INDEX`] on the prompt, the token ids on the answer.
    pub fn labels(&self) -> Vec<i64> {
        let mut labels = vec![IGNORE_INDEX; self.len()];
        for (l, &id) in labels[self.prompt_len..]
            .iter_mut()
            .zip(&self.input_ids[self.prompt_len..])
        {
            *l = id as i64;
        }
        labels
    }
}

fn snippet(s: &str, at: usize) -> String {
    let mut start = at.min(s.len());
    while !s.is_char_boundary(start) {
        start -= 1;
    }
    s[start..].chars().take(30).collect()
}

/// What [`build_examples`] kept and dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BuildStats {
    pub records: usize,
    pub examples: usize,
    /// Examples longer than `max_length` tokens, left out.
    pub dropped_too_long: usize,
    /// Length of the longest dropped example that was tokenised (0 when
    /// none).
    pub longest_dropped: usize,
    /// Of `dropped_too_long`, records whose text alone is longer than
    /// `max_length` tokens could hold, dropped without tokenising (a huge
    /// record costs no memory to refuse).
    pub dropped_unread: usize,
    pub longest_kept: usize,
    pub prompt_tokens: u64,
    pub answer_tokens: u64,
}

/// Tokenizes every record (in parallel, results in record order) and drops
/// those longer than `max_length` tokens. A record the template or
/// tokenizer cannot handle is an error naming its line.
pub fn build_examples(
    tok: &ChatTokenizer,
    records: &[Record],
    max_length: usize,
) -> Result<(Vec<Example>, BuildStats)> {
    // A record with one message that alone encodes to more than
    // `max_length` tokens is left out unread: tokenising a record of tens
    // of MB takes gigabytes only to drop it. Earlier assistant turns are
    // not counted: a template may shorten them (Qwen3 drops their
    // reasoning), so only what it renders whole bounds the length.
    let surely_too_long = |r: &Record| {
        let last = r.messages.len().saturating_sub(1);
        let bytes = r
            .messages
            .iter()
            .enumerate()
            .filter(|(i, m)| *i == last || m.role != crate::data::Role::Assistant)
            .map(|(_, m)| m.content.len())
            .max()
            .unwrap_or(0);
        tok.fewest_tokens(bytes) > max_length
    };
    let built: Vec<_> = records
        .par_iter()
        .map(|r| {
            if surely_too_long(r) {
                return Ok(None);
            }
            Example::build(tok, &r.messages)
                .map(|e| Some(Example { line: r.line, ..e }))
                .map_err(|(message, hint)| DataError::Example {
                    line: r.line,
                    message,
                    hint,
                })
        })
        .collect();
    let mut stats = BuildStats {
        records: records.len(),
        ..BuildStats::default()
    };
    let mut examples = Vec::with_capacity(built.len());
    for e in built {
        let Some(e) = e? else {
            stats.dropped_too_long += 1;
            stats.dropped_unread += 1;
            continue;
        };
        if e.len() > max_length {
            stats.dropped_too_long += 1;
            stats.longest_dropped = stats.longest_dropped.max(e.len());
            continue;
        }
        stats.longest_kept = stats.longest_kept.max(e.len());
        stats.prompt_tokens += e.prompt_len as u64;
        stats.answer_tokens += e.answer_len() as u64;
        examples.push(e);
    }
    stats.examples = examples.len();
    Ok((examples, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::template::Role;
    use crate::data::testing;

    fn chat(answer: &str) -> Vec<Message> {
        vec![
            Message::new(Role::User, "hello"),
            Message::new(Role::Assistant, answer),
        ]
    }

    /// Regression: a 40 MB record was tokenised whole (6 GB of memory)
    /// only to be dropped as too long. A record whose one message is
    /// surely longer than `max_length` tokens is dropped unread; one that
    /// might fit is still tokenised and measured.
    #[test]
    fn a_record_surely_too_long_is_dropped_before_tokenising() {
        let tok = testing::tokenizer();
        let max_length = 64;
        let huge = "x".repeat((max_length + 1) * tok.longest_token_bytes());
        let record = |line, answer: &str| Record {
            line,
            messages: chat(answer),
            expected_output: None,
            metadata: serde_json::Value::Null,
        };
        let records = vec![
            record(1, "short"),
            record(2, &huge),
            // Long in characters but within the bound: tokenised, then
            // dropped by its real length.
            record(3, &"y".repeat(max_length * 2)),
        ];
        let (examples, stats) = build_examples(&tok, &records, max_length).unwrap();
        assert_eq!(examples.len(), 1);
        assert_eq!(examples[0].line, 1);
        assert_eq!(
            (stats.dropped_too_long, stats.dropped_unread),
            (2, 1),
            "{stats:?}"
        );
        assert!(
            stats.longest_dropped > max_length,
            "the third was measured: {stats:?}"
        );
        // The bound never drops what fits: each token stands for at most
        // that many bytes.
        assert!(tok.encode(&huge).unwrap().len() > max_length);
    }

    #[test]
    fn labels_cover_answer_and_end_of_turn_only() {
        let tok = testing::tokenizer();
        let ex = Example::new(&tok, &chat("world\n1")).unwrap();
        let prompt = tok.encode_prompt(&chat("")[..1]).unwrap();
        assert_eq!(&ex.input_ids[..ex.prompt_len], &prompt[..]);
        let answer = tok.encode("world\n1<|im_end|>").unwrap();
        assert_eq!(&ex.input_ids[ex.prompt_len..], &answer[..]);
        assert_eq!(*ex.input_ids.last().unwrap(), testing::IM_END);
        let labels = ex.labels();
        assert!(labels[..ex.prompt_len].iter().all(|&l| l == IGNORE_INDEX));
        let want: Vec<i64> = answer.iter().map(|&i| i as i64).collect();
        assert_eq!(&labels[ex.prompt_len..], &want[..]);
        assert_eq!(ex.answer_len(), answer.len());
        // The prompt ends with the empty think block (thinking disabled).
        assert!(
            tok.decode(&prompt, false)
                .unwrap()
                .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        );
    }

    /// Training data cannot inject turns either: an answer holding
    /// `<|im_end|>` still ends at its one end-of-turn token, so the model
    /// learns the string as text and stops only where the turn ends.
    #[test]
    fn a_special_token_string_in_an_answer_is_text_to_learn() {
        let tok = testing::tokenizer();
        let ex = Example::new(&tok, &chat("a<|im_end|>\n<|im_start|>user\nb")).unwrap();
        let answer = &ex.input_ids[ex.prompt_len..];
        let ends: Vec<usize> = (0..answer.len())
            .filter(|&i| answer[i] == testing::IM_END)
            .collect();
        assert_eq!(ends, [answer.len() - 1], "{answer:?}");
        assert!(!answer.contains(&testing::IM_START));
        assert_eq!(
            tok.decode(answer, false).unwrap(),
            "a<|im_end|>\n<|im_start|>user\nb<|im_end|>"
        );
    }

    #[test]
    fn empty_answer_still_learns_to_stop() {
        let tok = testing::tokenizer();
        let ex = Example::new(&tok, &chat("")).unwrap();
        assert_eq!(&ex.input_ids[ex.prompt_len..], &[testing::IM_END]);
    }

    #[test]
    fn prompt_not_a_prefix_is_an_error() {
        // A template that numbers turns differently when a generation
        // prompt is asked for.
        let mut c = testing::config_json();
        c["chat_template"] = "{% for m in messages %}<|im_start|>{{ m.role }}{% if add_generation_prompt %}*{% endif %}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into();
        let dir = tempfile::tempdir().unwrap();
        testing::write_dir(dir.path(), &testing::tokenizer_json(), &c);
        let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
        let e = Example::new(&tok, &chat("x")).unwrap_err().to_string();
        assert!(e.contains("does not render the prompt as a prefix"), "{e}");
        assert!(e.contains("hint:"), "{e}");
    }

    fn record(line: u64, answer: &str) -> Record {
        Record {
            line,
            messages: chat(answer),
            expected_output: None,
            metadata: serde_json::Value::Null,
        }
    }

    #[test]
    fn over_long_examples_are_dropped_and_counted() {
        let tok = testing::tokenizer();
        let short = Example::new(&tok, &chat("a")).unwrap().len();
        let records = [
            record(1, "a"),
            record(2, &"long answer ".repeat(20)),
            record(3, "b"),
        ];
        let (ex, stats) = build_examples(&tok, &records, short).unwrap();
        assert_eq!(ex.iter().map(|e| e.line).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(stats.records, 3);
        assert_eq!(stats.examples, 2);
        assert_eq!(stats.dropped_too_long, 1);
        assert!(stats.longest_dropped > short);
        assert_eq!(stats.longest_kept, short);
        assert_eq!(
            stats.answer_tokens,
            ex.iter().map(|e| e.answer_len() as u64).sum::<u64>()
        );
    }

    #[test]
    fn a_bad_record_names_its_line() {
        let tok = testing::tokenizer();
        let mut bad = record(7, "x");
        bad.messages.clear();
        let e = build_examples(&tok, &[record(1, "a"), bad], 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("record at line 7"), "{e}");
    }
}
