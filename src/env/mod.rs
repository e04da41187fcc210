//! Environments RL trains against: an [`Environment`] makes the task of a
//! task id and scores a completion of it. The trace environment
//! ([`TraceEnv`]) is the Trace task; [`WordEnv`] ("answer with the given
//! word") is a verifiable reward without a sandbox, for tests. The sibling
//! tasks (SAT, ABD, DED) implement the same trait in [`crate::env::affine`].
//!
//! Task ids are drawn as the Trace environment draws them: `task_id` in
//! `[0, 10^6)`, row `task_id mod N`, transform seed `task_id`. The run's
//! `k`-th draw is [`task_id`]`(seed, k)`, a pure function, so the cursor `k`
//! is all a checkpoint needs to repeat the same tasks. A [`TaskStream`]
//! makes the tasks on a worker thread (the trace environment transforms
//! and runs each program in the sandbox, over the executor's slots) while
//! the model samples, a bounded number of draws ahead.
//!
//! Broken rows: before the first task of a row is made, the row's own
//! program (as the dataset has it, untransformed) runs once in the sandbox.
//! A row whose program fails there (an error exit, a time, memory or output
//! limit, a signal, stderr, output that is not UTF-8) is bad: its draws are
//! passed over without the sandbox from then on, counted as `original_*`
//! the first time and as [`BAD_ROW`] after. A failure of a transformed
//! variant alone blames the injection, not the row, and a sandbox failure
//! blames neither. Which rows are bad is decided in cursor order by the
//! reader of the stream ([`Barren::skip`]), so every rank and a resumed run
//! agree on it; the run stops with an error naming the dataset when every
//! row is bad, or when [`MAX_BARREN_DRAWS`] draws in a row made no task.

pub mod affine;
pub mod answers;
pub mod http;
pub mod mixture;
pub mod python;
pub mod registry;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::data::buckets::Difficulty;
use crate::dataset::SourceRow;
use crate::dist::{Communicator, stats};
use crate::reward::{self, python_strip};
use crate::sandbox::{Executor, Limits, Outcome, Request, Status};
use crate::{prompt, transform};

/// The environment's task id range: `[0, TASK_IDS)`.
pub const TASK_IDS: u64 = 1_000_000;

/// Skip reasons that blame the row itself start with this: its own program
/// (untransformed) fails in the sandbox, as `original_wall_timeout`.
pub const ORIGINAL: &str = "original_";

/// The skip reason of a draw of a row already known to be bad (not run).
/// It counts draws, as every skip reason does (`skipped_tasks_total/...`);
/// the rows found bad are counted apart (`bad_rows`), once each.
pub const BAD_ROW: &str = "bad_row_again";

/// Draws in a row that made no usable task before a run gives up on its
/// data (see [`Barren`]).
pub const MAX_BARREN_DRAWS: u64 = 1_000;

/// One task: the user message, the ground truth, how hard it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub task_id: u64,
    /// The user message, before any chat template.
    pub prompt: String,
    pub expected: String,
    pub difficulty: Difficulty,
}

/// A completion's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Score {
    Reward(f64),
    /// Not scorable (the sandbox failed while checking it): the completion
    /// is left out of the loss and counted under this reason, never scored 0.
    Masked(String),
}

/// What the environment answers one action of an episode: the action's
/// reward, the next observation, and whether the episode is over.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The action's reward (a step reward; a one-answer task's whole
    /// reward), or why it cannot be known: [`Score::Masked`] masks the
    /// whole episode, none of it trained.
    pub score: Score,
    /// The next observation, the next user turn (empty once done).
    pub observation: String,
    /// The episode is over: its goal reached, failed for good, or the
    /// environment's own limit met.
    pub done: bool,
    /// Whether the episode reached its goal (read once it is done).
    pub success: bool,
}

impl Step {
    /// The last step of an episode: `reward`, a success when `success`.
    pub fn last(reward: f64, success: bool) -> Self {
        Self {
            score: Score::Reward(reward),
            observation: String::new(),
            done: true,
            success,
        }
    }

    /// A step that cannot be scored (`why`): the episode ends, masked.
    pub fn masked(why: impl Into<String>) -> Self {
        Self {
            score: Score::Masked(why.into()),
            observation: String::new(),
            done: true,
            success: false,
        }
    }
}

/// One episode in progress: the environment's side of one conversation,
/// from a task's prompt (the first observation) to the step that is done.
/// An environment server's session, a Python worker's state, or (for a
/// one-answer environment) nothing but the task.
pub trait Episode: Send {
    /// Answers the model's `action` (its whole completion of the turn).
    fn act(&mut self, action: &str) -> Step;

    /// The completion an expert would give now (in the form the model is
    /// asked to answer in), where the environment knows one: the actions of
    /// a demonstrated episode ([`demonstrate`]). `Ok(None)` when it knows
    /// none (the default); `Err` with a reason when asking failed.
    fn expert(&mut self) -> Result<Option<String>, String> {
        Ok(None)
    }
}

/// One action of a demonstrated episode: the observation it answered (the
/// task's prompt for the first) and the expert's completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub observation: String,
    pub completion: String,
}

/// The episode of `task` played by its environment's expert
/// ([`Episode::expert`]) for at most `max_steps` actions: each observation
/// and the completion that answered it, when the episode reached its goal;
/// else why not (`no_demonstration`: the expert knew no action;
/// `demonstration_failed`: it ended without the goal;
/// `demonstration_too_long`: `max_steps` were taken; or the environment's
/// reason for a step it could not answer).
pub fn demonstrate(
    env: &dyn Environment,
    task: &Task,
    max_steps: usize,
) -> Result<Vec<Shown>, String> {
    let mut episode = begin(env, task)?;
    let mut shown = Vec::new();
    let mut observation = task.prompt.clone();
    for _ in 0..max_steps {
        let Some(completion) = episode.expert()? else {
            return Err("no_demonstration".into());
        };
        let step = episode.act(&completion);
        shown.push(Shown {
            observation: std::mem::take(&mut observation),
            completion,
        });
        if let Score::Masked(why) = step.score {
            return Err(why);
        }
        if step.done {
            return if step.success {
                Ok(shown)
            } else {
                Err("demonstration_failed".into())
            };
        }
        observation = step.observation;
    }
    Err("demonstration_too_long".into())
}

/// The episode of a one-answer environment: the first action is scored and
/// ends it, a success when its reward is 1.
pub struct OneAnswer<'a> {
    env: &'a dyn Environment,
    task: Task,
}

/// The episode of `task` in `env`: its own ([`Environment::start`]) when
/// `env` is multi-step, else one answer scored by [`Environment::score`].
pub fn begin<'a>(env: &'a dyn Environment, task: &Task) -> Result<Box<dyn Episode + 'a>, String> {
    if env.multi_step() {
        env.start(task)
    } else {
        Ok(Box::new(OneAnswer {
            env,
            task: task.clone(),
        }))
    }
}

impl Episode for OneAnswer<'_> {
    fn act(&mut self, action: &str) -> Step {
        match self.env.score(&self.task, action) {
            Score::Reward(r) => Step::last(r, r >= 1.0),
            Score::Masked(why) => Step::masked(why),
        }
    }

    fn expert(&mut self) -> Result<Option<String>, String> {
        Ok(self.env.demonstration(&self.task))
    }
}

pub trait Environment: Send + Sync {
    /// Short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// The task of `task_id`, or why none can be made from it (a program
    /// whose run fails, a sandbox failure): such draws are counted by
    /// reason and passed over.
    fn task(&self, task_id: u64) -> Result<Task, String>;

    /// [`Self::task`] of many ids, in order (in parallel where it pays).
    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        ids.iter().map(|&id| self.task(id)).collect()
    }

    /// Scores one completion of `task`.
    fn score(&self, task: &Task, completion: &str) -> Score;

    /// What scoring a task needs, for `trace-train task` (default: the
    /// expected answer): SAT's planted assignment and clauses, ABD's
    /// expected output, DED's test cases.
    fn key(&self, task: &Task) -> serde_json::Value {
        serde_json::Value::String(task.expected.clone())
    }

    /// A right answer to `task`, where the environment knows one (SAT's
    /// planted assignment, ABD's row input, DED's reference program, the
    /// Trace program's output, the word asked for): supervised data, and
    /// the chosen answer of `prefs --demonstrations`; `None` when it does
    /// not.
    fn demonstration(&self, _task: &Task) -> Option<String> {
        None
    }

    /// How many task ids there are (`0..n`), for an environment whose ids
    /// index a dataset without wrapping (ABD, DED); `None` when any id makes
    /// a task (Trace wraps, SAT seeds from it).
    fn task_count(&self) -> Option<u64> {
        None
    }

    /// The rows task ids map onto, for an environment that draws from a
    /// dataset whose rows' own programs can fail; `None` for one without.
    fn rows(&self) -> Option<&TaskRows> {
        None
    }

    /// What the environment answers a wrong `completion` of `task` before
    /// the model tries again (a multi-turn episode), by `kind` (`verdict`,
    /// `first_diff` or `line`; see [`crate::reward::feedback`]), or why it
    /// cannot say (a sandbox failure while running the answer again, as
    /// [`Score::Masked`] names one). The same task and completion give the
    /// same text, as far as the programs run are deterministic. Default:
    /// the verdict alone, whatever the kind.
    fn feedback(&self, task: &Task, completion: &str, _kind: &str) -> Result<String, String> {
        Ok(crate::reward::feedback(
            completion,
            &task.expected,
            "verdict",
        ))
    }

    /// The environments a mixture draws from, by name; empty for a single
    /// environment. Stage 3 logs reward and accuracy a part.
    fn parts(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// The index in [`Self::parts`] of the environment task `task_id`
    /// comes from; `None` for a single environment.
    fn part_of(&self, _task_id: u64) -> Option<usize> {
        None
    }

    /// A lower bound on the lines of task `task_id`'s expected answer,
    /// known without making the task; `None` when none is known. A caller
    /// that wants only short answers passes over a draw whose bound is too
    /// high and spares the environment making it (a Trace task costs two
    /// sandbox runs). It must never exceed what the task would have.
    fn output_lines_at_least(&self, _task_id: u64) -> Option<u32> {
        None
    }

    /// Whether tasks are episodes of several steps: each action answered
    /// with an observation and a step reward until the environment says
    /// done ([`Self::start`]). A one-answer environment's episode is one
    /// step (retries after feedback are `max_turns`'s, not steps).
    fn multi_step(&self) -> bool {
        false
    }

    /// Starts the episode of `task`, whose prompt is its first
    /// observation; or why it cannot start (counted as that reason, the
    /// episode masked). Called by [`begin`] for a [`Self::multi_step`]
    /// environment only; a one-answer environment leaves the default.
    fn start(&self, _task: &Task) -> Result<Box<dyn Episode + '_>, String> {
        Err(format!("{} has one-answer tasks, no episodes", self.name()))
    }

    /// The id `trace-train task --task_id` takes for task `task_id`: the
    /// id itself, except behind a view that renumbers (a sibling
    /// environment's training or held-out part).
    fn own_id(&self, task_id: u64) -> u64 {
        task_id
    }
}

/// What is known of a row's own program.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Unknown,
    /// It runs cleanly, printing this many lines (its stripped stdout's).
    Usable {
        output_lines: u32,
    },
    /// Why it fails (an [`ORIGINAL`] reason).
    Bad(String),
}

/// The source rows an environment maps task ids onto (`task_id mod N`),
/// with what is known of each row's own program: found once a row (the
/// first draw of a row runs it; draws of the same row made meanwhile wait
/// for that verdict), or told by the stream's reader ([`Self::mark_bad`]).
pub struct TaskRows {
    name: String,
    rows: Vec<SourceRow>,
    verdicts: Vec<Mutex<Verdict>>,
    runs: Vec<AtomicU64>,
}

impl TaskRows {
    /// `rows` of the dataset `name` (as messages name it: a path, `builtin`).
    pub fn new(name: impl Into<String>, rows: Vec<SourceRow>) -> Self {
        Self {
            name: name.into(),
            verdicts: rows.iter().map(|_| Mutex::new(Verdict::Unknown)).collect(),
            runs: rows.iter().map(|_| AtomicU64::new(0)).collect(),
            rows,
        }
    }

    /// The dataset's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn len(&self) -> u64 {
        self.rows.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The row of a task id.
    pub fn row_of(&self, task_id: u64) -> u64 {
        task_id % self.len()
    }

    pub fn get(&self, row: u64) -> &SourceRow {
        &self.rows[row as usize]
    }

    /// Records that `row`'s own program fails (`reason`), so that it is
    /// never run again: a rank's reader tells its environment what any rank
    /// found, and a resumed run what its checkpoint holds. A row whose
    /// verdict is being found right now keeps the verdict it finds.
    pub fn mark_bad(&self, row: u64, reason: &str) {
        if let Some(v) = self.verdicts.get(row as usize)
            && let Ok(mut v) = v.try_lock()
        {
            *v = Verdict::Bad(reason.to_owned());
        }
    }

    /// How many times each row's program (the original or a variant) has
    /// run in the sandbox.
    pub fn runs(&self) -> Vec<u64> {
        self.runs
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .collect()
    }

    /// The lines `row`'s own program prints, once it is known to run
    /// cleanly; `None` while unknown (or being found right now), or when it
    /// fails.
    pub fn own_output_lines(&self, row: u64) -> Option<u32> {
        match &*self.verdicts.get(row as usize)?.try_lock().ok()? {
            Verdict::Usable { output_lines } => Some(*output_lines),
            _ => None,
        }
    }

    /// Counts one run of `row`'s program.
    fn ran(&self, row: u64) {
        self.runs[row as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `Ok` when `row`'s own program is known to run cleanly, else why not
    /// (`sandbox_failure` while that is unknown). `find` runs the program
    /// when nothing is known yet, under the row's lock.
    fn usable(&self, row: u64, find: impl FnOnce() -> Verdict) -> Result<(), String> {
        let mut v = self.verdicts[row as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *v == Verdict::Unknown {
            *v = find();
        }
        match &*v {
            Verdict::Usable { .. } => Ok(()),
            Verdict::Bad(why) => Err(why.clone()),
            Verdict::Unknown => Err(Status::SandboxFailure.as_str().to_owned()),
        }
    }
}

/// The run's `k`-th task id: a hash of (seed, k) into `[0, TASK_IDS)`.
pub fn task_id(seed: u64, k: u64) -> u64 {
    let mut h = seed ^ 0x2545_f491_4f6c_dd1d;
    for x in [k, 0x7261_6e64] {
        h = (h ^ x).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 29;
    }
    h % TASK_IDS
}

/// "Answer with the given word": task `id` asks for `words[id mod n]`;
/// the reward is the Trace rule ([`reward::score`]) against that word.
pub struct WordEnv {
    pub words: Vec<String>,
}

impl WordEnv {
    pub fn new(words: &[&str]) -> Self {
        Self {
            words: words.iter().map(|w| (*w).to_owned()).collect(),
        }
    }
}

impl Environment for WordEnv {
    fn name(&self) -> &'static str {
        "word"
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let word = &self.words[(task_id % self.words.len() as u64) as usize];
        Ok(Task {
            task_id,
            prompt: format!("Answer with the word {word} and nothing else."),
            expected: word.clone(),
            difficulty: Difficulty::default(),
        })
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        Score::Reward(reward::score(completion, &task.expected))
    }

    fn demonstration(&self, task: &Task) -> Option<String> {
        Some(task.expected.clone())
    }
}

/// "Answer with each word in turn", a multi-step environment without a
/// sandbox (for tests and demonstrations): task `id` asks for `steps`
/// words, `words[(id + k) mod n]` at step `k`, one at a time. Each action
/// is scored by the Trace rule against its word; the step reward is that
/// score over `steps` (so a whole episode's return is at most 1). A wrong
/// word ends the episode, the last right one is a success; the
/// observation after a right word asks for the next.
pub struct WordStepsEnv {
    pub words: Vec<String>,
    pub steps: usize,
}

impl WordStepsEnv {
    pub fn new(words: &[&str], steps: usize) -> Self {
        Self {
            words: words.iter().map(|w| (*w).to_owned()).collect(),
            steps: steps.max(1),
        }
    }

    fn word(&self, task_id: u64, k: usize) -> &str {
        &self.words[((task_id + k as u64) % self.words.len() as u64) as usize]
    }

    fn ask(word: &str) -> String {
        format!("Answer with the word {word} and nothing else.")
    }
}

impl Environment for WordStepsEnv {
    fn name(&self) -> &'static str {
        "word_steps"
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let words: Vec<&str> = (0..self.steps).map(|k| self.word(task_id, k)).collect();
        Ok(Task {
            task_id,
            prompt: Self::ask(words[0]),
            expected: words.join(" "),
            difficulty: Difficulty::default(),
        })
    }

    /// One answer (as `eval` without steps reads it): the first word.
    fn score(&self, task: &Task, completion: &str) -> Score {
        Score::Reward(reward::score(completion, self.word(task.task_id, 0)))
    }

    fn multi_step(&self) -> bool {
        true
    }

    fn start(&self, task: &Task) -> Result<Box<dyn Episode + '_>, String> {
        Ok(Box::new(WordSteps {
            env: self,
            task_id: task.task_id,
            at: 0,
        }))
    }
}

/// An episode of [`WordStepsEnv`]: the index of the word asked for now.
struct WordSteps<'a> {
    env: &'a WordStepsEnv,
    task_id: u64,
    at: usize,
}

impl Episode for WordSteps<'_> {
    fn act(&mut self, action: &str) -> Step {
        let steps = self.env.steps;
        let r = reward::score(action, self.env.word(self.task_id, self.at));
        self.at += 1;
        if r < 1.0 || self.at == steps {
            return Step::last(r / steps as f64, r >= 1.0);
        }
        Step {
            score: Score::Reward(r / steps as f64),
            observation: WordStepsEnv::ask(self.env.word(self.task_id, self.at)),
            done: false,
            success: false,
        }
    }

    /// The word asked for now (none once the episode is over).
    fn expert(&mut self) -> Result<Option<String>, String> {
        Ok((self.at < self.env.steps).then(|| self.env.word(self.task_id, self.at).to_owned()))
    }
}

/// The Trace task on a set of source rows: task `id` is row `id mod N`
/// transformed with seed `id` (the environment's `__DBG_` injection, in the
/// sandbox), its ground truth the transformed program's stripped stdout on
/// the row's stdin (run in the sandbox), its prompt the environment's. A
/// row's own program runs once, before its first task is made; a row whose
/// program fails is never run again (see the module's documentation).
pub struct TraceEnv {
    rows: TaskRows,
    exec: Executor,
    max_injections: usize,
    limits: Limits,
}

impl TraceEnv {
    pub fn new(
        rows: Vec<SourceRow>,
        exec: Executor,
        max_injections: usize,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !rows.is_empty(),
            "the trace environment has no rows\nhint: check the `dataset` setting"
        );
        Ok(Self {
            rows: TaskRows::new("the trace environment's rows", rows),
            exec,
            max_injections,
            limits: Limits {
                wall_ms: 10_000,
                ..Limits::default()
            },
        })
    }

    /// Names the dataset the rows came from, for messages.
    pub fn with_dataset(mut self, name: impl Into<String>) -> Self {
        self.rows.name = name.into();
        self
    }

    /// The limits every program runs under (default: 10 s of CPU, 10 s of
    /// wall time, the sandbox's other defaults).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Runs one of `row`'s programs on the row's stdin.
    fn run(&self, row: u64, program: &str) -> Outcome {
        self.rows.ran(row);
        self.exec.run(&Request {
            program: program.as_bytes().to_vec(),
            stdin: self.rows.get(row).inputs.as_bytes().to_vec(),
            limits: self.limits,
        })
    }
}

/// The lines of a ground truth, as a task's difficulty counts them.
fn line_count(truth: &str) -> u32 {
    u32::try_from(truth.lines().count()).unwrap_or(u32::MAX)
}

/// A run's stripped stdout, or why it cannot be a ground truth.
fn ground_truth(out: &Outcome) -> Result<String, String> {
    match (out.status, std::str::from_utf8(&out.stdout)) {
        (Status::Ok, Ok(s)) if out.stderr.is_empty() => Ok(python_strip(s).to_owned()),
        (Status::Ok, Ok(_)) => Err("stderr".into()),
        (Status::Ok, Err(_)) => Err("non_utf8_output".into()),
        (s, _) => Err(s.as_str().to_owned()),
    }
}

impl Environment for TraceEnv {
    fn name(&self) -> &'static str {
        "trace"
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let r = self.rows.row_of(task_id);
        let row = self.rows.get(r);
        self.rows.usable(r, || {
            let out = self.run(r, transform::strip_fence(&row.program));
            match ground_truth(&out) {
                _ if out.status == Status::SandboxFailure => Verdict::Unknown,
                Ok(truth) => Verdict::Usable {
                    output_lines: line_count(&truth),
                },
                Err(why) => Verdict::Bad(format!("{ORIGINAL}{why}")),
            }
        })?;
        let t = transform::parse_outcome(&self.exec.run(&transform::request(
            &row.program,
            &[task_id],
            self.max_injections,
            Limits {
                wall_ms: 20_000,
                ..self.limits
            },
        )))
        .map_err(|e| match e {
            transform::TransformError::DoesNotParse(_) => "does_not_parse".to_owned(),
            transform::TransformError::Failed { status, .. } => format!("transform_{status}"),
        })?;
        let v = t.variants.first().ok_or("transform_no_variant")?;
        let truth = ground_truth(&self.run(r, &v.code))?;
        Ok(Task {
            task_id,
            prompt: prompt::trace_prompt(&v.code, &row.inputs),
            difficulty: Difficulty {
                loop_depth: Some(t.features.loop_depth),
                lines: Some(t.features.lines),
                injections: Some(v.injections),
                output_lines: Some(line_count(&truth)),
            },
            expected: truth,
        })
    }

    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        self.exec
            .install(|| ids.par_iter().map(|&id| self.task(id)).collect())
    }

    fn feedback(&self, task: &Task, completion: &str, kind: &str) -> Result<String, String> {
        Ok(crate::reward::feedback(completion, &task.expected, kind))
    }

    /// The program's output itself: what Stages 1-2 train the answer to be.
    fn demonstration(&self, task: &Task) -> Option<String> {
        Some(task.expected.clone())
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        Score::Reward(reward::score(completion, &task.expected))
    }

    fn rows(&self) -> Option<&TaskRows> {
        Some(&self.rows)
    }

    /// The lines the row's own program prints, once it has run: a variant
    /// is that program with prints added (`ast.unparse` keeps its meaning),
    /// and text added to a stream never lowers its stripped line count.
    fn output_lines_at_least(&self, task_id: u64) -> Option<u32> {
        self.rows.own_output_lines(self.rows.row_of(task_id))
    }
}

/// One draw: the cursor it was made at, its task id, the task or why not.
pub type Drawn = (u64, u64, Result<Task, String>);

/// Tasks made ahead on a worker thread, in cursor order.
pub struct TaskStream {
    rx: Option<Receiver<Drawn>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl TaskStream {
    /// Makes the draws `from, from + 1, ...` of the run seeded `seed`,
    /// `ahead` at a time, at most about twice that many ahead of the reader.
    pub fn start(env: Arc<dyn Environment>, seed: u64, from: u64, ahead: usize) -> Self {
        Self::strided(env, seed, from, ahead, 0, 1)
    }

    /// [`TaskStream::start`] of every `stride`-th draw: those from `from` on
    /// whose cursor is `offset` modulo `stride` (one rank's share).
    pub fn strided(
        env: Arc<dyn Environment>,
        seed: u64,
        from: u64,
        ahead: usize,
        offset: usize,
        stride: usize,
    ) -> Self {
        let ahead = ahead.max(1);
        let stride = stride.max(1) as u64;
        let first = from + (offset as u64 + stride - from % stride) % stride;
        let (tx, rx): (SyncSender<Drawn>, _) = sync_channel(ahead);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let worker = std::thread::Builder::new()
            .name("rl-tasks".into())
            .spawn(move || {
                let mut k = first;
                while !flag.load(Ordering::Relaxed) {
                    let cursors: Vec<u64> = (0..ahead as u64).map(|i| k + i * stride).collect();
                    let ids: Vec<u64> = cursors.iter().map(|&c| task_id(seed, c)).collect();
                    for ((c, id), task) in cursors.iter().zip(&ids).zip(env.tasks(&ids)) {
                        if tx.send((*c, *id, task)).is_err() {
                            return; // the reader is gone
                        }
                    }
                    k += ahead as u64 * stride;
                }
            })
            .expect("spawn the task thread");
        Self {
            rx: Some(rx),
            stop,
            worker: Some(worker),
        }
    }

    /// The next draw, in cursor order.
    pub fn recv(&mut self) -> anyhow::Result<Drawn> {
        self.rx
            .as_ref()
            .and_then(|rx| rx.recv().ok())
            .ok_or_else(|| {
                anyhow::anyhow!("the task thread stopped (it panicked; see the log above)")
            })
    }
}

impl Drop for TaskStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.rx.take()); // unblocks a send in progress
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The task stream of a run over several ranks, the same draws in the same
/// order on every rank: each rank makes every `world`-th draw (its share of
/// the sandbox work), and the ranks exchange what they made, `per_rank`
/// draws each at a time. With one rank, a plain [`TaskStream`].
pub struct SharedTasks {
    env: Arc<dyn Environment>,
    mine: TaskStream,
    made: std::collections::VecDeque<Drawn>,
    per_rank: usize,
}

impl SharedTasks {
    /// The draws from cursor `from` on; about `ahead` made ahead in all.
    /// `bad_rows` (row, reason) are known bad already (a resumed run's):
    /// their programs are not run again.
    pub fn start(
        env: Arc<dyn Environment>,
        seed: u64,
        from: u64,
        ahead: usize,
        bad_rows: &BTreeMap<u64, String>,
        comm: &dyn Communicator,
    ) -> Self {
        if let Some(rows) = env.rows() {
            for (&row, why) in bad_rows {
                rows.mark_bad(row, why);
            }
        }
        let per_rank = ahead.div_ceil(comm.world()).max(1);
        Self {
            mine: TaskStream::strided(
                Arc::clone(&env),
                seed,
                from,
                per_rank,
                comm.rank(),
                comm.world(),
            ),
            env,
            made: std::collections::VecDeque::new(),
            per_rank,
        }
    }

    /// The environment the tasks come from.
    pub fn env(&self) -> &dyn Environment {
        &*self.env
    }

    /// The next draw, in cursor order (a collective when the ranks must
    /// exchange: every rank calls it the same number of times).
    pub fn recv(&mut self, comm: &dyn Communicator) -> anyhow::Result<Drawn> {
        if comm.world() == 1 {
            return self.mine.recv();
        }
        if self.made.is_empty() {
            let mut batch = Vec::with_capacity(self.per_rank);
            for _ in 0..self.per_rank {
                batch.push(self.mine.recv()?);
            }
            let mut all: Vec<Drawn> = Vec::with_capacity(self.per_rank * comm.world());
            for bytes in stats::all_gather_bytes(comm, &serde_json::to_vec(&batch)?)? {
                let theirs: Vec<Drawn> = serde_json::from_slice(&bytes)
                    .map_err(|e| anyhow::anyhow!("a rank sent unreadable tasks: {e}"))?;
                all.extend(theirs);
            }
            all.sort_by_key(|d| d.0);
            self.made.extend(all);
        }
        Ok(self.made.pop_front().expect("filled above"))
    }
}

/// A reader's run of draws that made no usable task (one `draw` of a step:
/// it ends with the tasks it wanted, so the run never outlives a step and a
/// checkpoint needs none of it).
///
/// Each such draw is counted by reason. A draw whose reason blames its row
/// ([`ORIGINAL`]) marks the row bad the first time (counted under that
/// reason, logged once, told to the environment so that its programs are
/// not run again); later draws of a bad row count as [`BAD_ROW`]. The
/// reader stops the run with an error naming the dataset when every row is
/// bad, or when [`MAX_BARREN_DRAWS`] draws in a row made no usable task
/// (with one usable row in a hundred, that happens once in some 20,000
/// draws; it would otherwise spin, paying the sandbox for every draw).
#[derive(Debug, Default)]
pub struct Barren {
    /// Draws in a row without a usable task, by reason.
    streak: BTreeMap<String, u64>,
    /// Whether this reader logs newly bad rows (one rank does).
    log: bool,
}

impl Barren {
    pub fn new(log: bool) -> Self {
        Self {
            streak: BTreeMap::new(),
            log,
        }
    }

    /// A usable task came: the run of barren draws is over.
    pub fn made(&mut self) {
        self.streak.clear();
    }

    /// Counts the draw of `task_id` that made no usable task, for `reason`,
    /// into `skipped` (by reason) and `bad_rows` (row, first reason).
    pub fn skip(
        &mut self,
        env: &dyn Environment,
        task_id: u64,
        reason: String,
        bad_rows: &mut BTreeMap<u64, String>,
        skipped: &mut BTreeMap<String, u64>,
    ) -> anyhow::Result<()> {
        let rows = env.rows().filter(|r| !r.is_empty());
        let counted = match rows {
            Some(rows) if reason.starts_with(ORIGINAL) => {
                let row = rows.row_of(task_id);
                match bad_rows.entry(row) {
                    Entry::Occupied(_) => BAD_ROW.to_owned(),
                    Entry::Vacant(e) => {
                        if self.log {
                            tracing::warn!(
                                "dataset `{}`: row {row} ({}) fails when its program runs in the sandbox ({reason}); it is not drawn again",
                                rows.name(),
                                rows.get(row).name
                            );
                        }
                        rows.mark_bad(row, &reason);
                        e.insert(reason.clone());
                        reason
                    }
                }
            }
            _ => reason,
        };
        *skipped.entry(counted.clone()).or_default() += 1;
        *self.streak.entry(counted).or_default() += 1;
        if let Some(rows) = rows
            && bad_rows.len() as u64 >= rows.len()
        {
            let mut why = BTreeMap::<&str, u64>::new();
            for r in bad_rows.values() {
                *why.entry(r.as_str()).or_default() += 1;
            }
            anyhow::bail!(
                "dataset `{}`: all {} rows fail when their programs run in the sandbox ({}), so there is no task to train on\nhint: the log names each row and why; try one with `trace-train sandbox run`, fix or remove the broken rows, or choose another dataset",
                rows.name(),
                rows.len(),
                tally(&why)
            );
        }
        let n: u64 = self.streak.values().sum();
        if n >= MAX_BARREN_DRAWS {
            let what = match rows {
                Some(r) => format!(
                    "dataset `{}`: {n} draws in a row made no usable task ({}); {} of its {} rows are known to fail when their programs run in the sandbox",
                    r.name(),
                    tally(&self.streak),
                    bad_rows.len(),
                    r.len()
                ),
                None => format!(
                    "the {} environment: {n} draws in a row made no usable task ({})",
                    env.name(),
                    tally(&self.streak)
                ),
            };
            anyhow::bail!(
                "{what}\nhint: too few tasks are usable: `sandbox_failure` means the sandbox itself failed, `prompt_too_long` the `max_prompt_tokens` setting, the others the programs (`trace-train generate` on the dataset counts every row's failures)"
            );
        }
        Ok(())
    }
}

/// `a 3, b 1`.
/// Prompts an environment must have made before a run judges that none
/// of them fits `max_prompt_tokens`.
pub const PROMPT_FIT_PROBE: u64 = 32;

/// How the prompts of one environment (one part of a mixture) fit the
/// prompt budget so far; kept with the run's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptFit {
    pub fitted: u64,
    pub too_long: u64,
    /// The shortest prompt that did not fit, in tokens.
    pub shortest_too_long: Option<usize>,
}

/// The environment a task id's prompt comes from: a mixture's part, else
/// the environment itself.
pub fn part_name(env: &dyn Environment, task_id: u64) -> &'static str {
    env.part_of(task_id)
        .and_then(|i| env.parts().get(i).copied())
        .unwrap_or_else(|| env.name())
}

/// A task's prompt measured against a budget of tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptLength {
    /// Its chat-template tokens, within the budget.
    Fits(Vec<u32>),
    /// Over the budget: `tokens` it takes, or at least takes when
    /// `unread` (surely too long by its bytes alone, so never tokenised:
    /// a huge row would take gigabytes only to be dropped).
    TooLong { tokens: usize, unread: bool },
}

/// `text` as a user message's chat-template tokens, if they fit `limit`.
pub fn prompt_within(
    tok: &crate::data::ChatTokenizer,
    text: &str,
    limit: usize,
) -> anyhow::Result<PromptLength> {
    let at_least = tok.fewest_tokens(text.len());
    if at_least > limit {
        return Ok(PromptLength::TooLong {
            tokens: at_least,
            unread: true,
        });
    }
    let ids = tok.encode_prompt(&[crate::data::Message::new(
        crate::data::Role::User,
        text.to_owned(),
    )])?;
    Ok(if ids.len() > limit || ids.is_empty() {
        PromptLength::TooLong {
            tokens: ids.len(),
            unread: false,
        }
    } else {
        PromptLength::Fits(ids)
    })
}

/// Counts a prompt of `len` tokens from environment `name` against the
/// budget `limit`, and says whether it fits. Stops the run when the first
/// [`PROMPT_FIT_PROBE`] prompts of an environment were all too long: the
/// run would otherwise go on without it, and a mixture would quietly train
/// on the other environments alone.
pub fn prompt_fits(
    fits: &mut BTreeMap<String, PromptFit>,
    name: &str,
    len: usize,
    limit: usize,
) -> anyhow::Result<bool> {
    let f = fits.entry(name.to_owned()).or_default();
    if len <= limit {
        f.fitted += 1;
        return Ok(true);
    }
    f.too_long += 1;
    f.shortest_too_long = Some(f.shortest_too_long.map_or(len, |s| s.min(len)));
    if f.fitted == 0 && f.too_long >= PROMPT_FIT_PROBE {
        let shortest = f.shortest_too_long.unwrap_or(len);
        anyhow::bail!(
            "environment `{name}`: all {} of its prompts drawn so far are longer than ppo.max_prompt_tokens ({limit} tokens; the shortest was {shortest}), so the run would train without it\nhint: set ppo.max_prompt_tokens to at least {shortest} in the Stage 3 config (model.max_length must hold the prompt and the answer), or leave `{name}` out of ppo.environment",
            f.too_long
        );
    }
    Ok(false)
}

fn tally<K: std::fmt::Display>(counts: &BTreeMap<K, u64>) -> String {
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: an RL prompt was tokenised whole before its length was
    /// checked, so a huge row took gigabytes only to be dropped. One surely
    /// too long by its bytes is refused unread; one that might fit is
    /// tokenised and measured.
    #[test]
    fn a_prompt_surely_too_long_is_refused_before_tokenising() {
        let tok = crate::data::testing::tokenizer();
        let limit = 64;
        let huge = "x".repeat((limit + 1) * tok.longest_token_bytes());
        assert_eq!(
            prompt_within(&tok, &huge, limit).unwrap(),
            PromptLength::TooLong {
                tokens: limit + 1,
                unread: true
            }
        );
        // The bound never refuses what fits.
        assert!(tok.encode(&huge).unwrap().len() > limit);
        match prompt_within(&tok, &"y ".repeat(limit), limit).unwrap() {
            PromptLength::TooLong {
                tokens,
                unread: false,
            } => assert!(tokens > limit),
            other => panic!("measured, then too long: {other:?}"),
        }
        match prompt_within(&tok, "print(1)", limit).unwrap() {
            PromptLength::Fits(ids) => assert!(!ids.is_empty() && ids.len() <= limit),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_environment_whose_prompts_never_fit_stops_the_run() {
        let mut fits = BTreeMap::new();
        assert!(prompt_fits(&mut fits, "trace", 100, 512).unwrap());
        // One of `abd`'s prompts fits: many too long after it never stop.
        assert!(!prompt_fits(&mut fits, "abd", 900, 512).unwrap());
        assert!(prompt_fits(&mut fits, "abd", 400, 512).unwrap());
        for _ in 0..PROMPT_FIT_PROBE * 2 {
            assert!(!prompt_fits(&mut fits, "abd", 900, 512).unwrap());
        }
        // None of `sat`'s ever fits: the probe's last draw stops the run.
        for i in 0..PROMPT_FIT_PROBE - 1 {
            assert!(!prompt_fits(&mut fits, "sat", 3000 + i as usize, 512).unwrap());
        }
        let err = prompt_fits(&mut fits, "sat", 2990, 512)
            .unwrap_err()
            .to_string();
        assert!(err.contains("environment `sat`"), "{err}");
        assert!(
            err.contains("ppo.max_prompt_tokens (512 tokens; the shortest was 2990)"),
            "{err}"
        );
        assert!(err.contains("at least 2990"), "{err}");
        assert_eq!(fits["sat"].too_long, PROMPT_FIT_PROBE);
        assert_eq!(
            fits["trace"],
            PromptFit {
                fitted: 1,
                too_long: 0,
                shortest_too_long: None
            }
        );
    }

    #[test]
    fn task_ids_are_a_pure_function_in_range() {
        let a: Vec<u64> = (0..100).map(|k| task_id(7, k)).collect();
        let b: Vec<u64> = (0..100).map(|k| task_id(7, k)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|&x| x < TASK_IDS));
        assert_ne!(a, (0..100).map(|k| task_id(8, k)).collect::<Vec<_>>());
    }

    #[test]
    fn the_stream_yields_draws_in_order_from_the_cursor() {
        let env: Arc<dyn Environment> = Arc::new(WordEnv::new(&["a", "b", "c"]));
        let mut s = TaskStream::start(Arc::clone(&env), 3, 10, 4);
        for k in 10..25 {
            let (cursor, id, task) = s.recv().unwrap();
            assert_eq!((cursor, id), (k, task_id(3, k)));
            let t = task.unwrap();
            assert_eq!(t.expected, ["a", "b", "c"][(id % 3) as usize]);
            assert_eq!(
                env.score(&t, &format!(" {}\n", t.expected.to_uppercase())),
                Score::Reward(1.0)
            );
            assert_eq!(env.score(&t, "zz"), Score::Reward(0.0));
        }
        drop(s); // joins the worker, which is blocked on a full channel
    }

    #[test]
    fn ranks_share_the_making_and_read_the_same_draws() {
        let env: Arc<dyn Environment> = Arc::new(WordEnv::new(&["a", "b", "c"]));
        let mut alone = TaskStream::start(Arc::clone(&env), 3, 11, 4);
        let want: Vec<Drawn> = (0..20).map(|_| alone.recv().unwrap()).collect();
        for world in [2, 3] {
            let got = crate::dist::inprocess::run_ranks(world, |c| {
                let mut s = SharedTasks::start(Arc::clone(&env), 3, 11, 5, &BTreeMap::new(), &c);
                (0..20)
                    .map(|_| s.recv(&c))
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .unwrap();
            for ranks_draws in got {
                assert_eq!(ranks_draws, want, "{world} ranks");
            }
        }
        // One rank's share: every third cursor from 11 on, offset 1.
        let mut share = TaskStream::strided(Arc::clone(&env), 3, 11, 2, 1, 3);
        let cursors: Vec<u64> = (0..4).map(|_| share.recv().unwrap().0).collect();
        assert_eq!(cursors, [13, 16, 19, 22]);
    }

    #[test]
    fn word_steps_episodes_answer_each_action_until_done() {
        let env = WordStepsEnv::new(&["a", "b", "c"], 3);
        let task = env.task(1).unwrap();
        assert_eq!(task.prompt, "Answer with the word b and nothing else.");
        assert!(env.multi_step());
        let mut ep = begin(&env, &task).unwrap();
        let s = ep.act("b");
        assert_eq!(s.score, Score::Reward(1.0 / 3.0));
        assert!(!s.done && s.observation.contains("word c"));
        let s = ep.act("c");
        assert!(!s.done && s.observation.contains("word a"));
        let s = ep.act("a");
        assert!(s.done && s.success);
        // A wrong word ends the episode, no success.
        let mut ep = begin(&env, &task).unwrap();
        let s = ep.act("x");
        assert!(s.done && !s.success && s.score == Score::Reward(0.0));
        // A one-answer environment's episode is one scored step.
        let word = WordEnv::new(&["a"]);
        let t = word.task(0).unwrap();
        let s = begin(&word, &t).unwrap().act("a");
        assert_eq!(
            (s.score, s.done, s.success),
            (Score::Reward(1.0), true, true)
        );
        assert!(word.start(&t).is_err());
    }
}
