//! Eval: what a model's completions on held-out Trace items score, with
//! uncertainty, overall and by output-line and difficulty bucket, and what
//! its misses look like.
//!
//! Owns the eval item ([`EvalItem`], read from a `generate` record or made
//! from the held-out short set by [`heldout`]), the scored prediction
//! ([`Prediction`], through [`crate::reward`], the environment's own
//! scoring), the [`Report`] with its breakdowns ([`buckets`]), miss
//! diagnostics and JSON file, the side-by-side [`compare`] of two reports,
//! and the Jeffreys interval ([`interval`]). Over several environments
//! (SAT, ABD, DED, Trace): each environment's metrics and the aggregates
//! ([`envs`]), and the comparison of several models with the network's
//! dominance rules ([`dominance`], [`standings`], [`plot`]). Multi-turn
//! eval ([`turns`]): an item answered wrongly gets the environment's
//! feedback turn and answers again, and the report adds the accuracy after
//! each turn and the retries that changed nothing. Apart from the
//! episodes' driver ([`turns::run_episodes`], which builds each turn's
//! prompt with the chat tokenizer), it knows nothing of tokenizers or
//! models: the stage that runs eval hands the driver a function that
//! decodes a batch of prompts with [`crate::model::decode::generate::greedy`].

mod compare;
pub mod dominance;
pub mod envs;
pub mod exact;
pub mod gate;
pub mod heldout;
pub mod interval;
pub mod paired;
pub mod plot;
mod report;
pub mod standings;
pub mod turns;

pub use compare::compare;
pub use interval::{DEFAULT_LEVEL, jeffreys_interval};
pub use report::{Bucket, Interval, Misses, REPORT_VERSION, Report, line_diff};
pub use turns::{Attempt, Turns};

use serde::{Deserialize, Serialize};

use crate::data::buckets::Difficulty;
use crate::reward;

/// The accuracy after a turn: items with a right answer among their first
/// `turn` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnAccuracy {
    /// 1 for the first answer.
    pub turn: usize,
    pub correct: usize,
    /// `correct / n` (0 when there are no items).
    pub accuracy: f64,
    pub interval: Interval,
}

/// A record `generate` wrote could not be read as an eval item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(
        "the record has no `{field}`\nhint: eval reads the JSONL records that `generate` writes"
    )]
    Missing { field: &'static str },
}

/// One item to evaluate: a prompt and the stdout the program printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalItem {
    /// `row_index:seed` (or `row_index` for an original program): unique
    /// within one `generate` output.
    pub id: String,
    /// The user message, before any chat template.
    pub prompt: String,
    /// The ground truth: the program's stripped stdout.
    pub expected: String,
    pub difficulty: Difficulty,
}

impl EvalItem {
    /// Reads one record of `generate`'s JSONL output: the first user
    /// message, `expected_output`, and `metadata` (`row_index`, `seed`,
    /// `injections`, `output_lines`, `features.loop_depth`, `features.lines`).
    pub fn from_record(record: &serde_json::Value) -> Result<Self, RecordError> {
        let missing = |field| RecordError::Missing { field };
        let prompt = record
            .get("messages")
            .and_then(|m| m.as_array())
            .and_then(|m| {
                m.iter()
                    .find(|msg| msg.get("role").and_then(|r| r.as_str()) == Some("user"))
            })
            .and_then(|msg| msg.get("content"))
            .and_then(|c| c.as_str())
            .ok_or(missing("messages[role = user].content"))?;
        let expected = record
            .get("expected_output")
            .and_then(|e| e.as_str())
            .ok_or(missing("expected_output"))?;
        let meta = record.get("metadata").ok_or(missing("metadata"))?;
        let row = meta
            .get("row_index")
            .and_then(|r| r.as_u64())
            .ok_or(missing("metadata.row_index"))?;
        let number = |v: Option<&serde_json::Value>| {
            v.and_then(|v| v.as_u64())
                .and_then(|n| u32::try_from(n).ok())
        };
        let features = meta.get("features");
        let id = match meta.get("seed").and_then(|s| s.as_u64()) {
            Some(seed) => format!("{row}:{seed}"),
            None => row.to_string(),
        };
        Ok(Self {
            id,
            prompt: prompt.to_owned(),
            expected: expected.to_owned(),
            difficulty: Difficulty {
                loop_depth: number(features.and_then(|f| f.get("loop_depth"))),
                lines: number(features.and_then(|f| f.get("lines"))),
                injections: number(meta.get("injections")),
                output_lines: number(meta.get("output_lines")),
            },
        })
    }
}

/// One scored completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub id: String,
    /// The model's whole completion.
    pub completion: String,
    /// What the environment reads out of it ([`reward::extract_answer`]).
    pub answer: String,
    pub expected: String,
    /// The environment's reward: 1.0 on a match, else 0.0.
    pub score: f64,
    /// Lines of `expected` that `answer` reproduces at their position
    /// (partial credit for diagnostics; the reward is `score`).
    #[serde(default)]
    pub lines_matched: usize,
    #[serde(default)]
    pub lines_expected: usize,
    /// Whether the completion ended on a stop token; false when the token
    /// budget cut it.
    pub stopped: bool,
    pub difficulty: Difficulty,
    /// A multi-turn eval's earlier answers to the item (`--max_turns`), in
    /// order, each wrong and followed by the environment's feedback turn;
    /// this prediction is the episode's last answer. Empty (and not
    /// written) in a single-turn eval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<Attempt>,
}

impl Prediction {
    /// Scores `completion` against `item`.
    pub fn new(item: &EvalItem, completion: String, stopped: bool) -> Self {
        let answer = reward::extract_answer(&completion);
        let (lines_matched, lines_expected) = reward::lines_matched(&answer, &item.expected);
        Self {
            id: item.id.clone(),
            answer,
            lines_matched,
            lines_expected,
            score: reward::score(&completion, &item.expected),
            completion,
            expected: item.expected.clone(),
            stopped,
            difficulty: item.difficulty,
            earlier: Vec::new(),
        }
    }

    pub fn correct(&self) -> bool {
        self.score == 1.0
    }

    /// The answers of its episode: 1 in a single-turn eval.
    pub fn answers(&self) -> usize {
        self.earlier.len() + 1
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record() -> serde_json::Value {
        json!({
            "messages": [
                {"role": "user", "content": "Predict the output"},
                {"role": "assistant", "content": "1\n2"},
            ],
            "program": "print(1)\nprint(2)",
            "input": "",
            "expected_output": "1\n2",
            "metadata": {
                "row_index": 12, "row_name": "x", "program_id": "ab", "seed": 7007,
                "variant": 1, "injections": 2, "split": "test", "output_lines": 2,
                "output_chars": 3,
                "features": {"lines": 2, "loop_depth": 0, "functions": 0},
            },
        })
    }

    #[test]
    fn items_come_from_generate_records() {
        let item = EvalItem::from_record(&record()).unwrap();
        assert_eq!(item.id, "12:7007");
        assert_eq!(item.prompt, "Predict the output");
        assert_eq!(item.expected, "1\n2");
        assert_eq!(
            item.difficulty,
            Difficulty {
                loop_depth: Some(0),
                lines: Some(2),
                injections: Some(2),
                output_lines: Some(2),
            }
        );
        // An original program: no seed, no injections.
        let mut r = record();
        r["metadata"]["seed"] = json!(null);
        r["metadata"]["injections"] = json!(null);
        let item = EvalItem::from_record(&r).unwrap();
        assert_eq!((item.id.as_str(), item.difficulty.injections), ("12", None));
        let mut r = record();
        r.as_object_mut().unwrap().remove("expected_output");
        assert_eq!(
            EvalItem::from_record(&r).unwrap_err(),
            RecordError::Missing {
                field: "expected_output"
            }
        );
    }

    #[test]
    fn predictions_are_scored_by_the_environment_rule() {
        let item = EvalItem::from_record(&record()).unwrap();
        let p = Prediction::new(&item, "<think>hm</think>```\n1\n 2\n```".into(), true);
        assert_eq!((p.answer.as_str(), p.score), ("1\n 2", 1.0));
        assert!(p.correct());
        let p = Prediction::new(&item, "1\n3".into(), false);
        assert_eq!(p.score, 0.0);
    }
}
