//! Multi-turn eval (`eval --max_turns K`): an item answered wrongly gets
//! the environment's feedback as a user turn ([`reward::feedback`], the
//! text Stage 3's episodes get) and answers again, up to `K` answers; the
//! episode ends at a right answer. The conversation goes on from the
//! tokens the model read and wrote ([`ChatTokenizer::next_turn`], as in
//! Stage 3), and every turn's prompts of all items are decoded in one
//! call of the sampler.
//!
//! What it adds to the report ([`Turns`]): the accuracy after turn 1, 2,
//! ..., K (an item counts as solved after turn k when one of its first k
//! answers was right), each with its Jeffreys interval, the retries (the
//! answers after an item's first) and how many of them gave the same
//! answer as the turn before ([`reward::same_answer`]: the collapse into
//! "edits" that change nothing). The report's other numbers (accuracy,
//! buckets, misses) are those of each episode's last answer, so its
//! accuracy is the accuracy after turn K.

use std::fmt::Write;
use std::sync::Mutex;

use anyhow::Context;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::envs::{EnvAttempt, EnvPrediction};
use super::{EvalItem, Interval, Prediction, TurnAccuracy, jeffreys_interval};
use crate::data::{ChatTokenizer, Message, Role};
use crate::env::{Environment, Episode, Score, Step, Task};
use crate::model::decode::generate::Generation;
use crate::reward;

/// An earlier answer of an episode: wrong (an episode ends at a right
/// one), and the feedback turn that followed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The model's whole completion.
    pub completion: String,
    /// What the environment read out of it ([`reward::extract_answer`]).
    pub answer: String,
    /// Whether it ended on a stop token.
    pub stopped: bool,
    /// The environment's reply, the next turn's user message.
    pub feedback: String,
}

/// A multi-turn eval's numbers (in the report when `K` is above 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turns {
    /// `K`: the most answers an item gets.
    pub max_turns: usize,
    /// The feedback's kind (`verdict`, `first_diff` or `line`).
    pub feedback: String,
    /// The accuracy after turn 1, 2, ..., K; the last is the report's.
    pub by_turn: Vec<TurnAccuracy>,
    /// Answers after an item's first, over all items.
    pub retries: usize,
    /// Retries whose answer is the answer of the turn before, as the
    /// environment compares answers.
    pub unchanged_retries: usize,
    /// `unchanged_retries / retries` (0 without retries).
    pub unchanged_share: f64,
}

impl Turns {
    /// Counts episodes whose last answers are `predictions` (each with its
    /// earlier answers), of at most `max_turns` answers, with `level`
    /// intervals.
    pub fn count(predictions: &[Prediction], max_turns: usize, feedback: &str, level: f64) -> Self {
        let n = predictions.len();
        let by_turn = (1..=max_turns)
            .map(|turn| {
                let correct = predictions
                    .iter()
                    .filter(|p| p.correct() && p.answers() <= turn)
                    .count();
                let (lo, hi) = jeffreys_interval(correct as u64, n as u64, level);
                TurnAccuracy {
                    turn,
                    correct,
                    accuracy: ratio(correct, n),
                    interval: Interval { level, lo, hi },
                }
            })
            .collect();
        let retries = predictions.iter().map(|p| p.earlier.len()).sum();
        let unchanged_retries = predictions
            .iter()
            .map(|p| {
                let texts: Vec<&str> = p
                    .earlier
                    .iter()
                    .map(|a| a.completion.as_str())
                    .chain([p.completion.as_str()])
                    .collect();
                texts
                    .windows(2)
                    .filter(|w| reward::same_answer(w[0], w[1]))
                    .count()
            })
            .sum();
        Self {
            max_turns,
            feedback: feedback.to_owned(),
            by_turn,
            retries,
            unchanged_retries,
            unchanged_share: ratio(unchanged_retries, retries),
        }
    }

    /// `after turn 1 30.0%, 2 45.0%; retries 70, unchanged 12.9%`: for the
    /// report's one-line summary.
    pub fn summary(&self) -> String {
        let by: Vec<String> = self
            .by_turn
            .iter()
            .map(|t| format!("{} {:.1}%", t.turn, 100.0 * t.accuracy))
            .collect();
        format!(
            "after turn {}; retries {}, unchanged {:.1}%",
            by.join(", "),
            self.retries,
            100.0 * self.unchanged_share
        )
    }

    /// The table printed after an eval of `n` items: each turn's accuracy
    /// with its interval, then the retries.
    pub fn table(&self, n: usize) -> String {
        let mut out = String::new();
        let level = self.by_turn.first().map_or(0.8, |t| t.interval.level);
        writeln!(
            out,
            "{:<12}{:>8}{:>8}{:>10}  {:.0}% interval",
            "after turn",
            "correct",
            "n",
            "accuracy",
            100.0 * level
        )
        .expect("a String takes writes");
        for t in &self.by_turn {
            writeln!(
                out,
                "{:<12}{:>8}{:>8}{:>9.1}%  [{:.1}, {:.1}]",
                t.turn,
                t.correct,
                n,
                100.0 * t.accuracy,
                100.0 * t.interval.lo,
                100.0 * t.interval.hi
            )
            .expect("a String takes writes");
        }
        writeln!(
            out,
            "retries {} (feedback: {}), unchanged {} ({:.1}%)",
            self.retries,
            self.feedback,
            self.unchanged_retries,
            100.0 * self.unchanged_share
        )
        .expect("a String takes writes");
        out
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// What the episode loop ([`drive`]) needs of a set of episodes: their
/// first prompts, each turn's scored prediction, and what the environment
/// replies to a wrong answer.
trait Episodes {
    type Prediction: Send;
    fn len(&self) -> usize;
    /// Episode `i`'s first user message.
    fn prompt(&self, i: usize) -> String;
    /// Episode `i`, as errors name it.
    fn name(&self, i: usize) -> String;
    /// Episode `i`'s prediction of a turn's `completion`, carrying the
    /// earlier answers of its prediction `before` (of the turn before).
    fn answer(
        &self,
        i: usize,
        completion: String,
        stopped: bool,
        before: Option<Self::Prediction>,
    ) -> Self::Prediction;
    /// The reply of kind `feedback` to episode `i`'s `last` answer, that
    /// answer moved into its earlier ones; `None` where the episode ended.
    fn again(&self, i: usize, last: &mut Self::Prediction, feedback: &str) -> Option<String>;
}

/// The episodes of `eps`, at most `max_turns` answers each: each episode's
/// last prediction, with its earlier answers.
///
/// Turn 1's prompt is the episode's prompt as one user message through the
/// chat template; a later turn's is the earlier prompt and answer tokens
/// as they were, then the template's tokens for the feedback turn
/// ([`ChatTokenizer::next_turn`]). `decode` takes one turn's prompts of
/// every episode still going (all of them at turn 1) and returns their
/// generations in the same order: it is called once a turn, and not after
/// a turn where every episode ended.
fn drive<E: Episodes + Sync>(
    eps: &E,
    tok: &ChatTokenizer,
    max_turns: usize,
    feedback: &str,
    mut decode: impl FnMut(&[Vec<u32>]) -> anyhow::Result<Vec<Generation>>,
) -> anyhow::Result<Vec<E::Prediction>> {
    anyhow::ensure!(max_turns >= 1, "an episode needs at least one turn");
    anyhow::ensure!(
        reward::FEEDBACK_KINDS.contains(&feedback),
        "feedback `{feedback}` is not one of {}",
        reward::FEEDBACK_KINDS.join(", ")
    );
    let n = eps.len();
    let mut prompts = (0..n)
        .map(|i| tok.encode_prompt(&[Message::new(Role::User, eps.prompt(i))]))
        .collect::<Result<Vec<_>, _>>()?;
    let mut going: Vec<usize> = (0..n).collect();
    // Each episode's latest answer: its tokens and its prediction.
    let mut answers: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut predictions: Vec<Option<E::Prediction>> = (0..n).map(|_| None).collect();
    for turn in 1..=max_turns {
        if turn > 1 {
            let mut next = Vec::new();
            for &i in &going {
                let last = predictions[i]
                    .as_mut()
                    .expect("turn 1 answered every episode");
                let Some(reply) = eps.again(i, last, feedback) else {
                    continue;
                };
                prompts[i] = tok
                    .next_turn(&prompts[i], &answers[i], &reply)
                    .with_context(|| format!("{}: turn {turn}'s prompt", eps.name(i)))?;
                next.push(i);
            }
            going = next;
        }
        if going.is_empty() {
            break;
        }
        let batch: Vec<Vec<u32>> = going.iter().map(|&i| prompts[i].clone()).collect();
        let gens = decode(&batch)?;
        anyhow::ensure!(
            gens.len() == batch.len(),
            "the sampler gave {} generations for {} prompts",
            gens.len(),
            batch.len()
        );
        // The turn's answers scored (or acted on) in parallel: an
        // environment may be a server or a sandboxed worker.
        let mut work = Vec::with_capacity(going.len());
        for (&i, g) in going.iter().zip(gens) {
            let text = tok.decode(&g.tokens, true)?;
            work.push((i, text, g.stopped, predictions[i].take()));
            answers[i] = g.tokens;
        }
        let answered: Vec<(usize, E::Prediction)> = work
            .into_par_iter()
            .map(|(i, text, stopped, before)| (i, eps.answer(i, text, stopped, before)))
            .collect();
        for (i, p) in answered {
            predictions[i] = Some(p);
        }
    }
    Ok(predictions
        .into_iter()
        .map(|p| p.expect("every episode answered"))
        .collect())
}

/// Trace items: scored by exact match, answered with
/// [`reward::feedback`].
struct Items<'a>(&'a [EvalItem]);

impl Episodes for Items<'_> {
    type Prediction = Prediction;

    fn len(&self) -> usize {
        self.0.len()
    }

    fn prompt(&self, i: usize) -> String {
        self.0[i].prompt.clone()
    }

    fn name(&self, i: usize) -> String {
        format!("item `{}`", self.0[i].id)
    }

    fn answer(
        &self,
        i: usize,
        completion: String,
        stopped: bool,
        before: Option<Prediction>,
    ) -> Prediction {
        let mut p = Prediction::new(&self.0[i], completion, stopped);
        if let Some(before) = before {
            p.earlier = before.earlier;
        }
        p
    }

    fn again(&self, i: usize, last: &mut Prediction, feedback: &str) -> Option<String> {
        if last.correct() {
            return None;
        }
        let reply = reward::feedback(&last.completion, &self.0[i].expected, feedback);
        last.earlier.push(Attempt {
            completion: std::mem::take(&mut last.completion),
            answer: std::mem::take(&mut last.answer),
            stopped: last.stopped,
            feedback: reply.clone(),
        });
        Some(reply)
    }
}

/// Runs the episodes of `items`, at most `max_turns` answers each (see
/// [`drive`]), and returns each item's last answer scored, with its
/// earlier answers. An answer that is not right gets [`reward::feedback`]
/// of kind `feedback`.
pub fn run_episodes(
    items: &[EvalItem],
    tok: &ChatTokenizer,
    max_turns: usize,
    feedback: &str,
    decode: impl FnMut(&[Vec<u32>]) -> anyhow::Result<Vec<Generation>>,
) -> anyhow::Result<Vec<Prediction>> {
    drive(&Items(items), tok, max_turns, feedback, decode)
}

/// Environments' tasks: task `.1` of environment `.0`, scored by its
/// environment, answered with the environment's own feedback (at most
/// `max_turns` answers); a multi-step environment's task is an episode
/// (its actions answered by the environment, which says when it is done).
struct EnvTasks<'a> {
    tasks: &'a [(&'a dyn Environment, &'a Task)],
    max_turns: usize,
    /// Each multi-step task's episode in progress and its last step
    /// (`None` for a one-answer task, or once the episode ended).
    running: Vec<Mutex<Running<'a>>>,
}

/// A multi-step episode of an eval: the environment's side and what it
/// answered last.
#[derive(Default)]
struct Running<'a> {
    episode: Option<Box<dyn Episode + 'a>>,
    last: Option<Step>,
}

impl<'a> EnvTasks<'a> {
    fn new(tasks: &'a [(&'a dyn Environment, &'a Task)], max_turns: usize) -> Self {
        Self {
            tasks,
            max_turns,
            running: tasks.iter().map(|_| Mutex::default()).collect(),
        }
    }

    /// Episode `i`'s state (poisoning is not possible: nothing panics
    /// while holding it, and a panic would end the eval anyway).
    fn state(&self, i: usize) -> std::sync::MutexGuard<'_, Running<'a>> {
        self.running[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Episode `i`'s next step: its action answered by its environment
    /// (the episode started at its first action).
    fn act(&self, i: usize, action: &str, first: bool) -> Step {
        let (env, task) = self.tasks[i];
        let mut st = self.state(i);
        if first {
            match env.start(task) {
                Ok(ep) => st.episode = Some(ep),
                Err(why) => return Step::masked(why),
            }
        }
        let step = match st.episode.as_mut() {
            Some(ep) => ep.act(action),
            None => Step::masked("episode_not_started"),
        };
        if step.done {
            // Its session (a server's, a worker's) ends now.
            st.episode = None;
        }
        st.last = Some(step.clone());
        step
    }
}

impl Episodes for EnvTasks<'_> {
    type Prediction = EnvPrediction;

    fn len(&self) -> usize {
        self.tasks.len()
    }

    fn prompt(&self, i: usize) -> String {
        self.tasks[i].1.prompt.clone()
    }

    fn name(&self, i: usize) -> String {
        let (env, task) = self.tasks[i];
        format!("{} task {}", env.name(), task.task_id)
    }

    fn answer(
        &self,
        i: usize,
        completion: String,
        stopped: bool,
        before: Option<EnvPrediction>,
    ) -> EnvPrediction {
        let (env, task) = self.tasks[i];
        let earlier = before.map(|p| p.earlier).unwrap_or_default();
        let (score, success) = if env.multi_step() {
            let step = self.act(i, &completion, earlier.is_empty());
            let so_far: f64 = earlier.iter().map(|a| a.score).sum();
            let score = match step.score {
                Score::Reward(r) => Score::Reward(so_far + r),
                masked => masked,
            };
            (score, Some(step.done && step.success))
        } else {
            (env.score(task, &completion), None)
        };
        let (score, masked) = match score {
            Score::Reward(r) => (Some(r), None),
            Score::Masked(why) => (None, Some(why)),
        };
        let own = env.own_id(task.task_id);
        EnvPrediction {
            task_id: task.task_id,
            own_id: (own != task.task_id).then_some(own),
            completion,
            score,
            masked,
            stopped,
            earlier,
            success,
        }
    }

    fn again(&self, i: usize, last: &mut EnvPrediction, feedback: &str) -> Option<String> {
        let (env, task) = self.tasks[i];
        if env.multi_step() {
            let step = self.state(i).last.clone()?;
            if last.masked.is_some() || step.done {
                return None;
            }
            let Score::Reward(r) = step.score else {
                return None;
            };
            last.earlier.push(EnvAttempt {
                completion: std::mem::take(&mut last.completion),
                score: r,
                stopped: last.stopped,
                feedback: step.observation.clone(),
            });
            return Some(step.observation);
        }
        if last.masked.is_some() || last.score == Some(1.0) || last.answers() >= self.max_turns {
            return None;
        }
        match env.feedback(task, &last.completion, feedback) {
            Ok(reply) => {
                last.earlier.push(EnvAttempt {
                    completion: std::mem::take(&mut last.completion),
                    score: last.score.unwrap_or(0.0),
                    stopped: last.stopped,
                    feedback: reply.clone(),
                });
                Some(reply)
            }
            Err(why) => {
                last.score = None;
                last.masked = Some(format!("feedback: {why}"));
                None
            }
        }
    }
}

/// [`run_episodes`] for environments' tasks (`eval --environment
/// --max_turns K`): task `tasks[i].1` of environment `tasks[i].0`, each
/// answer scored by its environment. An answer scoring below 1.0 gets the
/// environment's own feedback of kind `feedback`
/// ([`Environment::feedback`], what Stage 3's episodes get) and the task
/// is answered again, up to `max_turns` answers; an episode ends at a
/// score of 1.0. A masked score, or feedback the environment cannot give
/// (a sandbox failure), masks the episode, as in Stage 3.
///
/// A multi-step environment's task is an episode of up to `max_steps`
/// actions (`eval --max_steps_per_episode`), each answered by the
/// environment until it says done: its prediction's score is the return,
/// `success` what the environment said at the end, `earlier` its earlier
/// actions with their step rewards and observations. A masked step masks
/// the episode.
pub fn run_env_episodes(
    tasks: &[(&dyn Environment, &Task)],
    tok: &ChatTokenizer,
    max_turns: usize,
    max_steps: usize,
    feedback: &str,
    decode: impl FnMut(&[Vec<u32>]) -> anyhow::Result<Vec<Generation>>,
) -> anyhow::Result<Vec<EnvPrediction>> {
    let stepped = tasks.iter().any(|(env, _)| env.multi_step());
    let cap = if stepped {
        max_turns.max(max_steps)
    } else {
        max_turns
    };
    // An episode cut at the cap ends there, not done: no success.
    drive(&EnvTasks::new(tasks, max_turns), tok, cap, feedback, decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::buckets::Difficulty;
    use crate::eval::DEFAULT_LEVEL;

    fn item(id: &str, expected: &str) -> EvalItem {
        EvalItem {
            id: id.into(),
            prompt: String::new(),
            expected: expected.into(),
            difficulty: Difficulty::default(),
        }
    }

    /// An episode of `completions` (the last one scored) on `item`.
    fn episode(item: &EvalItem, completions: &[&str]) -> Prediction {
        let (last, before) = completions.split_last().unwrap();
        let mut p = Prediction::new(item, (*last).into(), true);
        p.earlier = before
            .iter()
            .map(|c| {
                let e = Prediction::new(item, (*c).into(), true);
                assert!(!e.correct(), "an episode goes on only after a wrong answer");
                Attempt {
                    completion: e.completion,
                    answer: e.answer,
                    stopped: true,
                    feedback: reward::feedback(c, &item.expected, "verdict"),
                }
            })
            .collect();
        p
    }

    #[test]
    fn accuracy_by_turn_counts_items_solved_by_then() {
        let preds = vec![
            episode(&item("a", "1"), &["1"]),
            episode(&item("b", "2"), &["3", "2"]),
            episode(&item("c", "3"), &["4", "5", "3"]),
            episode(&item("d", "4"), &["5", "6", "7"]),
            episode(&item("e", "5"), &["6", "5"]),
        ];
        let t = Turns::count(&preds, 3, "line", DEFAULT_LEVEL);
        let correct: Vec<(usize, usize)> = t.by_turn.iter().map(|x| (x.turn, x.correct)).collect();
        assert_eq!(correct, [(1, 1), (2, 3), (3, 4)]);
        assert_eq!(t.by_turn[1].accuracy, 0.6);
        for x in &t.by_turn {
            let (lo, hi) = jeffreys_interval(x.correct as u64, 5, DEFAULT_LEVEL);
            assert_eq!(
                (x.interval.lo, x.interval.hi, x.interval.level),
                (lo, hi, 0.8)
            );
        }
        // Retries: 0 + 1 + 2 + 2 + 1.
        assert_eq!((t.retries, t.unchanged_retries), (6, 0));
        assert_eq!((t.max_turns, t.feedback.as_str()), (3, "line"));
        // The last turn's accuracy is the report's.
        let r = crate::eval::Report::multi_turn(preds, DEFAULT_LEVEL, 3, "line");
        assert_eq!(r.correct, 4);
        assert_eq!(r.turns.as_ref().unwrap(), &t);
    }

    #[test]
    fn unchanged_retries_compare_answers_as_the_environment_does() {
        let preds = vec![
            // The same answer three times (whitespace, case and a code
            // fence do not make it another): two unchanged retries.
            episode(&item("a", "x\ny"), &["x\nz", "```\nX\n z\n```", "x z"]),
            // Changed, then repeated: one of two.
            episode(&item("b", "7"), &["8", "9", "<think>hm</think>9"]),
            // Changed to the right answer.
            episode(&item("c", "1"), &["2", "1"]),
            // Right at once: no retry.
            episode(&item("d", "1"), &["1"]),
        ];
        let t = Turns::count(&preds, 3, "verdict", DEFAULT_LEVEL);
        assert_eq!((t.retries, t.unchanged_retries), (5, 3));
        assert!((t.unchanged_share - 0.6).abs() < 1e-12);
        assert!(
            t.summary().ends_with("retries 5, unchanged 60.0%"),
            "{}",
            t.summary()
        );
        let table = t.table(4);
        assert!(table.contains("unchanged 3 (60.0%)"), "{table}");
        // No retry at all: a share of 0, not NaN.
        let t = Turns::count(&preds[3..], 2, "verdict", DEFAULT_LEVEL);
        assert_eq!((t.retries, t.unchanged_share), (0, 0.0));
    }

    #[test]
    fn turns_and_earlier_answers_round_trip_through_the_report_file() {
        let preds = vec![
            episode(&item("a", "1"), &["2", "2", "1"]),
            episode(&item("b", "2"), &["2"]),
        ];
        let r = crate::eval::Report::multi_turn(preds, DEFAULT_LEVEL, 3, "first_diff");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        r.write(&path).unwrap();
        let back = crate::eval::Report::read(&path).unwrap();
        // JSON keeps floats to within their last bit: the counts exactly.
        assert_eq!(back.predictions, r.predictions);
        assert_eq!(back.predictions[0].earlier.len(), 2);
        let (t, u) = (back.turns.unwrap(), r.turns.unwrap());
        let counts = |t: &Turns| {
            let by: Vec<(usize, usize)> = t.by_turn.iter().map(|x| (x.turn, x.correct)).collect();
            (
                t.max_turns,
                t.feedback.clone(),
                by,
                t.retries,
                t.unchanged_retries,
            )
        };
        assert_eq!(counts(&t), counts(&u));
        assert_eq!(counts(&t).2, [(1, 1), (2, 1), (3, 2)]);
        // One turn: no `turns`, no `earlier` in the file.
        let one = crate::eval::Report::multi_turn(
            vec![episode(&item("b", "2"), &["3"])],
            DEFAULT_LEVEL,
            1,
            "first_diff",
        );
        assert!(one.turns.is_none());
        let text = serde_json::to_string(&one).unwrap();
        assert!(
            !text.contains("\"turns\"") && !text.contains("\"earlier\""),
            "{text}"
        );
    }

    #[test]
    fn an_empty_eval_has_well_formed_turns() {
        let t = Turns::count(&[], 2, "first_diff", DEFAULT_LEVEL);
        assert_eq!(t.by_turn.len(), 2);
        assert!(
            t.by_turn
                .iter()
                .all(|x| x.accuracy == 0.0 && x.correct == 0)
        );
        assert!(serde_json::to_string(&t).is_ok());
    }
}
