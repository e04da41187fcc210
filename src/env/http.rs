//! `http://HOST:PORT`: an environment served over HTTP in AgentGym's
//! protocol, so that AgentGym's own servers (and ours in
//! `examples/agentgym/`) plug in unchanged.
//!
//! The protocol, one session an episode:
//! - `GET /` once when the environment is built: any answer shows the
//!   server is up; a JSON object's `name` picks the opening instructions
//!   and its `tasks` gives [`Environment::task_count`] (AgentGym answers a
//!   sentence, "This is environment BabyAI.", whose last word names it);
//!   a server of ours may also give its own `opening` text and its
//!   `action` form (`line` or `text`, below);
//! - `POST /create` (body `{}`) answers `{"id": N}`;
//! - `POST /reset` `{"id", "data_idx"}` answers the first `observation`;
//! - `POST /step` `{"id", "action"}` answers `observation`, `reward`,
//!   `done`, and where the server has them `score` (a running total, as
//!   AgentGym's BabyAI sends) and `success`;
//! - `POST /close` `{"id"}` when the episode is dropped;
//! - `POST /expert` `{"id"}` (ours only; `generate` asks it for
//!   demonstrations) answers `{"action", "thought"}`: what a scripted
//!   expert does now, `null` where it knows nothing; a server without the
//!   route knows nothing.
//!
//! (`id_key=NAME` renames `id` for a server that keys sessions otherwise.)
//!
//! An answer `{"error": "..."}` (AgentGym's servers answer their failures
//! so, with status 200) is a failure of the server.
//!
//! A task is its data index: task `id` is `reset` with `data_idx = id`,
//! its prompt the opening instructions (per environment: the actions and
//! the `Thought: ... Action: ...` form; AgentGym's clients keep them as a
//! fixed first turn) and then the first observation. [`Environment::task`]
//! opens a session to read that observation and closes it;
//! [`Environment::start`] opens another and resets it to the same index,
//! and masks the episode (`http_not_replayable`) when its first
//! observation is not the task's. So a run's state is its task ids alone:
//! a server must reset deterministically by data index (AgentGym's BabyAI
//! seeds each level from the index; TextCraft picks its goal and recipes
//! from it), and one that cannot is told by that reason.
//!
//! The action is the text after the completion's `Action:`: whitespace
//! after the marker (newlines too) skipped, up to the end of that line,
//! only letters, digits, commas and spaces kept, runs of spaces made one;
//! no marker sends the empty action (the server answers what it answers
//! to it); two markers or more are answered here, reward 0, not done,
//! asking for one action, and the server is not called. AgentGym's
//! clients parse actions so. With `action=text` (a URL setting, or the
//! server's `GET /`) the whole completion is the action, for a server
//! that reads code or free text itself (examples/agentgym/kernel_server.py).
//!
//! Failures never stop a run: a task that cannot be made is `Err` with an
//! `http_*` reason (counted, passed over), an episode that fails is
//! [`Step::masked`] with one. Each call has a timeout; `create`, `reset`,
//! `GET` and `close` are retried with backoff after a refused or dropped
//! connection or a 5xx/429 answer, `step` only when the connection was
//! refused (it never reached the server: a step sent twice would act
//! twice). A timeout is not retried (a slow server is not helped by
//! more load). Sessions are bounded by a pool: an episode holds one
//! place from `create` to `close`, and one that waits longer than the
//! timeout for a place fails with `http_pool_full`.
//!
//! Settings are the URL's query parameters ([`Settings`]), so that one
//! spec line says everything: `http://127.0.0.1:36001?opening=babyai&sessions=32`.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Environment, Episode, Score, Step, Task};

/// The opening instructions of AgentGym's BabyAI, in our words: the
/// actions its server understands and the answer's form.
pub const BABYAI_OPENING: &str = "You are an agent in a grid world of rooms. Each turn you are told your goal and what you see, and you answer with one action that brings you closer to the goal.

The actions:
- turn left
- turn right
- move forward
- go to <object> <n>: walk up to the n-th object of that name you see, facing it
- pick up <object> <n>: go to it and pick it up (you carry one thing at a time)
- drop: put down what you carry, in front of you
- go through <door> <n>: walk through an open door
- toggle and go through <door> <n>: open a closed or locked door (a locked door needs a key of its colour) and walk through it
- toggle: open or close the door right in front of you
- check available actions: list the actions possible now

Answer in this form:
Thought:
<why this action>

Action:
<one action>";

/// The opening instructions of AgentGym's TextCraft, in our words.
pub const TEXTCRAFT_OPENING: &str = "You craft items in Minecraft from a few crafting commands you are given, of the form \"craft [target] using [ingredients]\". Each turn you see the result of your last action and answer with the next one. You can:
- get <count> <item>: take basic ingredients from the environment (never say where from)
- craft <count> <item> using <count> <ingredient>, <count> <ingredient>, ...: use one of the given crafting commands
- inventory: list what you have

Always give counts, as in \"get 1 lapis lazuli\" or \"craft 1 golden carrot using 8 gold nugget, 1 carrot\". Use only the crafting commands given; where a command names a generic ingredient such as \"planks\", a specific kind such as \"oak planks\" will do.

Answer in this form:
Thought:
<your thoughts>

Action:
<one action>";

/// The opening instructions a name stands for (`opening=NAME`).
pub const OPENINGS: &[(&str, &str)] = &[
    ("babyai", BABYAI_OPENING),
    ("textcraft", TEXTCRAFT_OPENING),
    ("none", ""),
];

/// The observation a completion with more than one `Action:` gets.
pub const ONE_ACTION: &str =
    "Error: give exactly one \"Action:\" in your answer, followed by one action.";

/// What of a completion is sent as the action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionForm {
    /// The line after one `Action:` marker, cleaned ([`parse_action`]).
    Line,
    /// The whole completion, as the model wrote it.
    Text,
}

impl ActionForm {
    fn parse(value: &str) -> Option<Self> {
        match value {
            "line" => Some(Self::Line),
            "text" => Some(Self::Text),
            _ => None,
        }
    }
}

/// Which field of `/step`'s answer is the step's reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewardField {
    /// `reward`, the step's own reward.
    Reward,
    /// The change in `score`, a running total.
    Score,
}

/// What the URL's query parameters set, with their defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `opening=babyai|textcraft|none`, or the text of `opening_file=PATH`;
    /// `None`: named by the server's `GET /`.
    pub opening: Option<String>,
    /// `timeout=SECONDS` (default 60): one call's limit, and the longest
    /// wait for a place in the pool.
    pub timeout: Duration,
    /// `retries=N` (default 3): more tries of a call that may be repeated.
    pub retries: u32,
    /// `sessions=N` (default 1024): the most sessions open at once. A
    /// step's episodes run in lockstep (Stage 3: `batch_size x
    /// group_size`; eval: every task), so every one of them holds a
    /// session until it ends: the pool must hold them all.
    pub sessions: usize,
    /// `tasks=N`: how many data indices there are (default: the server's
    /// `GET /` `tasks`, else unbounded).
    pub tasks: Option<u64>,
    /// `reward=reward|score` (default `reward`).
    pub reward: RewardField,
    /// `id_key=NAME` (default `id`): the field that names a session in
    /// `/create`'s answer and in every later body, for a server that keys
    /// its sessions otherwise.
    pub id_key: String,
    /// `action=line|text`; `None`: the server's `GET /` `action`, else
    /// `line`.
    pub action: Option<ActionForm>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            opening: None,
            timeout: Duration::from_secs(60),
            retries: 3,
            sessions: 1024,
            tasks: None,
            reward: RewardField::Reward,
            id_key: "id".into(),
            action: None,
        }
    }
}

/// The query parameters [`Settings`] reads.
pub const PARAMETERS: [&str; 9] = [
    "opening",
    "opening_file",
    "timeout",
    "retries",
    "sessions",
    "tasks",
    "reward",
    "id_key",
    "action",
];

/// Splits `url` into the server's base (no query, no trailing `/`) and its
/// settings.
pub fn parse_url(url: &str) -> anyhow::Result<(String, Settings)> {
    let hint = "hint: an http environment is `http://HOST:PORT[/PATH][?KEY=VALUE&...]` with keys opening, opening_file, timeout, retries, sessions, tasks, reward, id_key, action";
    anyhow::ensure!(
        url.starts_with("http://") || url.starts_with("https://"),
        "environment `{url}` is not an http:// or https:// URL\n{hint}"
    );
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let base = base.trim_end_matches('/').to_owned();
    anyhow::ensure!(
        base.split_once("://").is_some_and(|(_, h)| !h.is_empty()),
        "environment `{url}` names no host\n{hint}"
    );
    let mut s = Settings::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let bad =
            |what: &str| anyhow::anyhow!("environment `{url}`: `{key}={value}` {what}\n{hint}");
        match key {
            "opening" => {
                let text = OPENINGS.iter().find(|(n, _)| *n == value).ok_or_else(|| {
                    bad(&format!(
                        "names no opening instructions (known: {}; or opening_file=PATH)",
                        OPENINGS
                            .iter()
                            .map(|(n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
                s.opening = Some(text.1.to_owned());
            }
            "opening_file" => {
                let text = std::fs::read_to_string(value)
                    .map_err(|e| bad(&format!("cannot be read ({e})")))?;
                s.opening = Some(text.trim_end().to_owned());
            }
            "timeout" => {
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|t: &f64| t.is_finite() && *t > 0.0)
                    .ok_or_else(|| bad("is not a number of seconds above 0"))?;
                s.timeout = Duration::from_secs_f64(secs);
            }
            "retries" => s.retries = value.parse().map_err(|_| bad("is not a whole number"))?,
            "sessions" => {
                s.sessions = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad("is not a whole number above 0"))?
            }
            "tasks" => {
                s.tasks = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad("is not a whole number above 0"))?,
                )
            }
            "reward" => {
                s.reward = match value {
                    "reward" => RewardField::Reward,
                    "score" => RewardField::Score,
                    _ => return Err(bad("is neither `reward` nor `score`")),
                }
            }
            "id_key" if !value.is_empty() => s.id_key = value.to_owned(),
            "action" => {
                s.action = Some(
                    ActionForm::parse(value).ok_or_else(|| bad("is neither `line` nor `text`"))?,
                )
            }
            _ => {
                return Err(anyhow::anyhow!(
                    "environment `{url}`: unknown setting `{key}` (known: {})\n{hint}",
                    PARAMETERS.join(", ")
                ));
            }
        }
    }
    Ok((base, s))
}

/// Why a call failed; its [`Self::reason`] is what a masked episode or a
/// task that cannot be made is counted under.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// No answer within the timeout.
    Timeout,
    /// The connection could not be made (refused, no such host): the
    /// request never reached the server.
    Connect(String),
    /// The connection broke before the whole answer came.
    Closed(String),
    /// An HTTP status other than 2xx.
    Status(u16),
    /// An answer that is not what the protocol says.
    BadReply(String),
    /// The server's own `{"error": ...}`.
    Server(String),
    /// No place in the session pool within the timeout.
    PoolFull,
}

impl Failure {
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::Timeout => "http_timeout",
            Failure::Connect(_) => "http_connect",
            Failure::Closed(_) => "http_closed",
            Failure::Status(_) => "http_status",
            Failure::BadReply(_) => "http_bad_reply",
            Failure::Server(_) => "http_server_error",
            Failure::PoolFull => "http_pool_full",
        }
    }

    /// Whether another try may help: a connection never made always; a
    /// dropped connection or a 5xx/429 answer when the call may repeat.
    fn retryable(&self, repeatable: bool) -> bool {
        match self {
            Failure::Connect(_) => true,
            Failure::Closed(_) => repeatable,
            Failure::Status(code) => repeatable && (*code >= 500 || *code == 429),
            _ => false,
        }
    }

    fn hint(&self) -> &'static str {
        match self {
            Failure::Timeout => {
                "the server is slow or stuck: raise `timeout=SECONDS` in the URL, or give it fewer sessions (`sessions=N`)"
            }
            Failure::Connect(_) => {
                "is the server running at that address? (examples/agentgym/README.md starts one)"
            }
            Failure::Closed(_) | Failure::Status(_) => "the server failed; its own log says why",
            Failure::BadReply(_) => {
                "the server does not speak AgentGym's protocol (create, reset, step, close with JSON answers)"
            }
            Failure::Server(_) => "the server refused the call; its log says why",
            Failure::PoolFull => {
                "more episodes are open at once than `sessions=N` allows: raise it to the number of episodes in flight"
            }
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Timeout => write!(f, "no answer within the timeout"),
            Failure::Connect(e) => write!(f, "cannot connect ({e})"),
            Failure::Closed(e) => write!(f, "the connection broke ({e})"),
            Failure::Status(c) => write!(f, "HTTP status {c}"),
            Failure::BadReply(e) => write!(f, "an answer outside the protocol ({e})"),
            Failure::Server(e) => write!(f, "the server's error: {e}"),
            Failure::PoolFull => write!(f, "no free session in the pool"),
        }
    }
}

/// At most `max` sessions open at once.
struct Pool {
    max: usize,
    open: Mutex<usize>,
    freed: Condvar,
}

/// A place in the [`Pool`], given back on drop.
struct Place<'a>(&'a Pool);

impl Pool {
    fn new(max: usize) -> Self {
        Self {
            max,
            open: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    fn take(&self, wait: Duration) -> Result<Place<'_>, Failure> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (mut open, _) = self
            .freed
            .wait_timeout_while(open, wait, |n| *n >= self.max)
            .unwrap_or_else(|e| e.into_inner());
        if *open >= self.max {
            return Err(Failure::PoolFull);
        }
        *open += 1;
        Ok(Place(self))
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        *self.0.open.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

/// An environment server reached over HTTP (see the module header).
pub struct HttpEnv {
    /// The URL as the spec gave it (for messages).
    url: String,
    /// The server's base URL, as logs and metrics name the environment
    /// (leaked once an environment built: `name` is `&'static`).
    name: &'static str,
    /// Where the calls go: the URL without its query.
    base: String,
    settings: Settings,
    opening: String,
    action: ActionForm,
    tasks: Option<u64>,
    agent: ureq::Agent,
    pool: Pool,
    /// Failure reasons already logged (one warning each).
    warned: Mutex<BTreeSet<&'static str>>,
}

impl HttpEnv {
    /// Reaches the server of `url` (`GET /`) and reads its settings.
    pub fn connect(url: &str) -> anyhow::Result<Self> {
        let (base, settings) = parse_url(url)?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(settings.timeout.min(Duration::from_secs(10)))
            .timeout(settings.timeout)
            .max_idle_connections_per_host(settings.sessions)
            .build();
        let mut env = Self {
            url: url.to_owned(),
            name: Box::leak(base.clone().into_boxed_str()),
            base,
            opening: String::new(),
            action: settings.action.unwrap_or(ActionForm::Line),
            tasks: settings.tasks,
            agent,
            pool: Pool::new(settings.sessions),
            warned: Mutex::new(BTreeSet::new()),
            settings,
        };
        // Any answer shows the server is up; only one that says nothing
        // useful (a status, a page that is not JSON) names nothing.
        let hello = match env.call("GET", "/", None, true) {
            Ok(v) => v,
            Err(Failure::Status(_) | Failure::BadReply(_) | Failure::Server(_)) => Value::Null,
            Err(f) => anyhow::bail!(
                "http environment `{url}`: `GET {}/` failed: {f}\nhint: {}",
                env.base,
                f.hint()
            ),
        };
        // Our servers name themselves in an object; AgentGym's in a sentence.
        let name = match &hello {
            Value::Object(m) => m.get("name").and_then(Value::as_str).map(str::to_lowercase),
            Value::String(s) => s
                .trim_end_matches('.')
                .split_whitespace()
                .last()
                .map(str::to_lowercase),
            _ => None,
        };
        if env.tasks.is_none() {
            env.tasks = hello
                .get("tasks")
                .and_then(Value::as_u64)
                .filter(|&n| n > 0);
        }
        let text = |key: &str| hello.get(key).and_then(Value::as_str);
        if env.settings.action.is_none()
            && let Some(form) = text("action")
        {
            env.action = ActionForm::parse(form).ok_or_else(|| {
                anyhow::anyhow!(
                    "http environment `{url}`: the server's `GET /` asks for the action form `{form}`, which is neither `line` nor `text`\nhint: give `?action=line` or `?action=text` in the URL"
                )
            })?;
        }
        env.opening = match (&env.settings.opening, &name) {
            (Some(text), _) => text.clone(),
            (None, _) if text("opening").is_some() => {
                text("opening").unwrap_or_default().to_owned()
            }
            (None, Some(name)) if OPENINGS.iter().any(|(n, _)| n == name) => OPENINGS
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| (*t).to_owned())
                .unwrap_or_default(),
            (None, name) => anyhow::bail!(
                "http environment `{url}`: which opening instructions its tasks begin with is unknown (the server calls itself {})\nhint: add `?opening=babyai`, `?opening=textcraft`, `?opening=none` or `?opening_file=PATH` to the URL",
                name.as_deref()
                    .map_or("nothing".to_owned(), |n| format!("`{n}`"))
            ),
        };
        Ok(env)
    }

    /// The settings the URL gave.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The opening instructions each prompt begins with.
    pub fn opening(&self) -> &str {
        &self.opening
    }

    /// What of a completion is sent as the action.
    pub fn action_form(&self) -> ActionForm {
        self.action
    }

    /// One call: `body` POSTed as JSON (`GET` without), the answer's JSON;
    /// tried again (with backoff) while the failure allows and
    /// `repeatable` says the call may be repeated.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        repeatable: bool,
    ) -> Result<Value, Failure> {
        let mut tries = 0;
        loop {
            match self.once(method, path, body) {
                Err(f) if tries < self.settings.retries && f.retryable(repeatable) => {
                    std::thread::sleep(Duration::from_millis(100u64 << tries.min(4)));
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn once(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        let request = self.agent.request(method, &format!("{}{path}", self.base));
        let answer = match body {
            Some(b) => request.send_json(b),
            None => request.call(),
        };
        let answer = match answer {
            Ok(a) => a,
            Err(ureq::Error::Status(code, _)) => return Err(Failure::Status(code)),
            Err(ureq::Error::Transport(t)) => return Err(transport(&t)),
        };
        let text = answer.into_string().map_err(|e| io_failure(&e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Failure::BadReply(format!("`{path}` answered {:?}: {e}", clip(&text))))?;
        if let Some(e) = value.get("error") {
            return Err(Failure::Server(match e {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }));
        }
        Ok(value)
    }

    /// Logs `failure` of `what` the first time its reason is seen.
    fn warn(&self, what: &str, failure: &Failure) {
        let reason = failure.reason();
        let first = self
            .warned
            .lock()
            .map(|mut w| w.insert(reason))
            .unwrap_or(false);
        if first {
            tracing::warn!(
                "http environment `{}`: {what} failed: {failure} (counted as `{reason}`; later ones are counted, not logged)\nhint: {}",
                self.url,
                failure.hint()
            );
        }
    }

    /// A session reset to `data_idx`, with its first observation.
    fn open(&self, data_idx: u64) -> Result<Session<'_>, Failure> {
        let place = self.pool.take(self.settings.timeout).inspect_err(|f| {
            self.warn("waiting for a free session", f);
        })?;
        let created = self
            .call("POST", "/create", Some(&json!({})), true)
            .inspect_err(|f| self.warn("`/create`", f))?;
        let key = self.settings.id_key.as_str();
        let id = created
            .get(key)
            .cloned()
            .filter(|v| v.is_i64() || v.is_u64() || v.is_string());
        let Some(id) = id else {
            let f = Failure::BadReply(format!(
                "`/create` answered no `{key}`: {}",
                clip(&created.to_string())
            ));
            self.warn("`/create`", &f);
            return Err(f);
        };
        let mut session = Session {
            env: self,
            id,
            _place: place,
            observation: String::new(),
            score: 0.0,
            done: false,
        };
        let reset = self
            .call(
                "POST",
                "/reset",
                Some(&session.body(json!({"data_idx": data_idx}))),
                true,
            )
            .inspect_err(|f| self.warn("`/reset`", f))?;
        session.observation = observation(&reset).inspect_err(|f| self.warn("`/reset`", f))?;
        session.score = reset.get("score").and_then(Value::as_f64).unwrap_or(0.0);
        Ok(session)
    }

    fn prompt(&self, observation: &str) -> String {
        if self.opening.is_empty() {
            observation.to_owned()
        } else {
            format!("{}\n\n{observation}", self.opening)
        }
    }
}

/// The `observation` of an answer (AgentGym's TextCraft answers a bare
/// string to `/observation`; `/reset` and `/step` answer objects).
fn observation(answer: &Value) -> Result<String, Failure> {
    match answer.get("observation") {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(Failure::BadReply(format!(
            "no `observation` text in {}",
            clip(&answer.to_string())
        ))),
    }
}

fn transport(t: &ureq::Transport) -> Failure {
    use std::error::Error;
    match t.kind() {
        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns => Failure::Connect(t.to_string()),
        ureq::ErrorKind::BadStatus | ureq::ErrorKind::BadHeader => Failure::BadReply(t.to_string()),
        _ => match t.source().and_then(|s| s.downcast_ref::<io::Error>()) {
            Some(e) => io_failure(e),
            None if t.to_string().contains("timed out") => Failure::Timeout,
            None => Failure::Closed(t.to_string()),
        },
    }
}

fn io_failure(e: &io::Error) -> Failure {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Failure::Timeout,
        _ if e.to_string().contains("timed out") => Failure::Timeout,
        _ => Failure::Closed(e.to_string()),
    }
}

/// The first 200 characters of `text`.
fn clip(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}

/// The action of a completion (the module header's rule); `None` when it
/// gives more than one `Action:`.
pub fn parse_action(completion: &str) -> Option<String> {
    let mut marks = completion.match_indices("Action:");
    let Some((at, _)) = marks.next() else {
        return Some(String::new());
    };
    if marks.next().is_some() {
        return None;
    }
    let rest = completion[at + "Action:".len()..].trim_start();
    let line = rest.lines().next().unwrap_or("");
    let kept: String = line
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == ',' || *c == ' ')
        .collect();
    Some(kept.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// One open session on the server, closed on drop.
struct Session<'a> {
    env: &'a HttpEnv,
    id: Value,
    _place: Place<'a>,
    observation: String,
    /// The running `score` (for `reward=score`).
    score: f64,
    done: bool,
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Err(f) = self
            .env
            .call("POST", "/close", Some(&self.body(json!({}))), true)
        {
            self.env.warn("`/close`", &f);
        }
    }
}

impl Session<'_> {
    /// `fields` with the session's id added (under `id_key`).
    fn body(&self, mut fields: Value) -> Value {
        fields[self.env.settings.id_key.as_str()] = self.id.clone();
        fields
    }

    fn step(&mut self, action: &str) -> Result<Step, Failure> {
        let a = self.env.call(
            "POST",
            "/step",
            Some(&self.body(json!({"action": action}))),
            false,
        )?;
        let observation = observation(&a)?;
        let number = |key: &str| -> Result<Option<f64>, Failure> {
            match a.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .map(Some)
                    .ok_or_else(|| {
                        Failure::BadReply(format!(
                            "`{key}` is not a number: {}",
                            clip(&a.to_string())
                        ))
                    }),
            }
        };
        let done = match a.get("done") {
            Some(Value::Bool(b)) => *b,
            _ => {
                return Err(Failure::BadReply(format!(
                    "no `done` true or false in {}",
                    clip(&a.to_string())
                )));
            }
        };
        let reward = number("reward")?;
        let score = number("score")?;
        let reward = match self.env.settings.reward {
            RewardField::Reward => reward.unwrap_or(0.0),
            RewardField::Score => {
                let Some(score) = score else {
                    return Err(Failure::BadReply(
                        "`reward=score` is set but the answer has no `score`".into(),
                    ));
                };
                let r = score - self.score;
                self.score = score;
                r
            }
        };
        let success = match a.get("success") {
            Some(Value::Bool(b)) => *b,
            _ => done && reward > 0.0,
        };
        self.done = done;
        Ok(Step {
            score: Score::Reward(reward),
            observation: if done { String::new() } else { observation },
            done,
            success: done && success,
        })
    }
}

/// An episode: a session, its steps until done.
struct HttpEpisode<'a> {
    session: Session<'a>,
}

impl Episode for HttpEpisode<'_> {
    fn act(&mut self, completion: &str) -> Step {
        if self.session.done {
            return Step::masked("http_after_done");
        }
        let action = match self.session.env.action {
            ActionForm::Line => parse_action(completion),
            ActionForm::Text => Some(completion.to_owned()),
        };
        let Some(action) = action else {
            return Step {
                score: Score::Reward(0.0),
                observation: ONE_ACTION.to_owned(),
                done: false,
                success: false,
            };
        };
        match self.session.step(&action) {
            Ok(step) => step,
            Err(f) => {
                self.session.env.warn("`/step`", &f);
                self.session.done = true;
                Step::masked(f.reason())
            }
        }
    }

    /// `POST /expert` `{"id"}`, a route of the servers in
    /// `examples/agentgym/` (not of AgentGym's): `{"action", "thought"}`,
    /// the action `null` where the game knows none. A server without the
    /// route (status 404) knows none. The completion is in the form the
    /// opening asks for: `Thought: ... Action: ...` (the action alone with
    /// `action=text`).
    fn expert(&mut self) -> Result<Option<String>, String> {
        if self.session.done {
            return Ok(None);
        }
        let env = self.session.env;
        let body = self.session.body(json!({}));
        let a = match env.call("POST", "/expert", Some(&body), true) {
            Ok(a) => a,
            Err(Failure::Status(404)) => return Ok(None),
            Err(f) => {
                env.warn("`/expert`", &f);
                return Err(f.reason().to_owned());
            }
        };
        let action = match a.get("action") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                let f = Failure::BadReply(format!(
                    "`/expert` answered an action that is not text: {}",
                    clip(&other.to_string())
                ));
                env.warn("`/expert`", &f);
                return Err(f.reason().to_owned());
            }
        };
        let thought = a
            .get("thought")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim();
        Ok(Some(match env.action {
            ActionForm::Text => action,
            ActionForm::Line if thought.is_empty() => format!("Action:\n{action}"),
            ActionForm::Line => format!("Thought:\n{thought}\n\nAction:\n{action}"),
        }))
    }
}

impl Environment for HttpEnv {
    /// The server's URL without its settings, as `http://127.0.0.1:36001`:
    /// two servers in one mixture are told apart in the metrics.
    fn name(&self) -> &'static str {
        self.name
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        if let Some(n) = self.tasks
            && task_id >= n
        {
            return Err("http_no_such_task".into());
        }
        let session = self.open(task_id).map_err(|f| f.reason().to_owned())?;
        Ok(Task {
            task_id,
            prompt: self.prompt(&session.observation),
            expected: String::new(),
            difficulty: Default::default(),
        })
    }

    /// On threads of their own (up to the pool's size, at most 16), not
    /// rayon's: they wait on the network, and rayon's threads are the
    /// trainer's.
    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        let next = AtomicUsize::new(0);
        let made: Vec<Mutex<Option<Result<Task, String>>>> =
            ids.iter().map(|_| Mutex::new(None)).collect();
        let threads = ids.len().min(self.settings.sessions).min(16);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&id) = ids.get(i) else { break };
                        let task = self.task(id);
                        *made[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
                    }
                });
            }
        });
        made.into_iter()
            .map(|m| {
                m.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .unwrap_or_else(|| Err("http_not_made".into()))
            })
            .collect()
    }

    /// One answer scored as a one-step episode: the reward of the task's
    /// first step with `completion` as the action.
    fn score(&self, task: &Task, completion: &str) -> Score {
        match self.start(task) {
            Ok(mut episode) => episode.act(completion).score,
            Err(why) => Score::Masked(why),
        }
    }

    fn key(&self, task: &Task) -> Value {
        json!({"url": self.base, "data_idx": task.task_id})
    }

    fn feedback(&self, _task: &Task, _completion: &str, _kind: &str) -> Result<String, String> {
        Err("http_episodes_only".into())
    }

    fn task_count(&self) -> Option<u64> {
        self.tasks
    }

    fn multi_step(&self) -> bool {
        true
    }

    fn start(&self, task: &Task) -> Result<Box<dyn Episode + '_>, String> {
        let session = self.open(task.task_id).map_err(|f| f.reason().to_owned())?;
        if self.prompt(&session.observation) != task.prompt {
            let f = Failure::BadReply(format!(
                "data index {} reset to another first observation than its task's",
                task.task_id
            ));
            self.warn("replaying a task", &f);
            return Err("http_not_replayable".into());
        }
        Ok(Box::new(HttpEpisode { session }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_is_the_line_after_one_marker() {
        assert_eq!(
            parse_action("Thought:\nclose.\n\nAction:\nturn left\n").unwrap(),
            "turn left"
        );
        assert_eq!(
            parse_action("Action: go to red ball 1.").unwrap(),
            "go to red ball 1"
        );
        assert_eq!(
            parse_action("Action:   craft 1 blue_dye using 1 lapis lazuli, 2  x\nmore").unwrap(),
            "craft 1 bluedye using 1 lapis lazuli, 2 x"
        );
        assert_eq!(parse_action("turn left").unwrap(), "");
        assert_eq!(parse_action("Action:").unwrap(), "");
        assert_eq!(parse_action("Action: a\nAction: b"), None);
    }

    #[test]
    fn url_settings_parse_and_refuse_with_a_hint() {
        let (base, s) = parse_url("http://127.0.0.1:36001/").unwrap();
        assert_eq!(
            (base.as_str(), &s),
            ("http://127.0.0.1:36001", &Settings::default())
        );
        let (base, s) = parse_url(
            "http://h:1/env/?opening=textcraft&timeout=2.5&retries=0&sessions=3&tasks=40&reward=score&id_key=env_idx&action=text",
        )
        .unwrap();
        assert_eq!(base, "http://h:1/env");
        assert_eq!(s.opening.as_deref(), Some(TEXTCRAFT_OPENING));
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert_eq!((s.retries, s.sessions, s.tasks), (0, 3, Some(40)));
        assert_eq!(
            (s.reward, s.id_key.as_str()),
            (RewardField::Score, "env_idx")
        );
        assert_eq!(s.action, Some(ActionForm::Text));
        for bad in [
            "http://h:1?sessions=0",
            "http://h:1?timeout=-1",
            "http://h:1?opening=chess",
            "http://h:1?reward=x",
            "http://h:1?colour=red",
            "http://h:1?id_key=",
            "http://h:1?action=code",
            "http://?tasks=3",
            "ftp://h:1",
        ] {
            let e = format!("{:#}", parse_url(bad).unwrap_err());
            assert!(e.contains("hint:"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_pool_waits_then_refuses() {
        let pool = Pool::new(2);
        let a = pool.take(Duration::ZERO).unwrap();
        let _b = pool.take(Duration::ZERO).unwrap();
        assert_eq!(
            pool.take(Duration::from_millis(20)).err(),
            Some(Failure::PoolFull)
        );
        std::thread::scope(|s| {
            let waiter = s.spawn(|| pool.take(Duration::from_secs(5)).map(|_| ()));
            std::thread::sleep(Duration::from_millis(50));
            drop(a);
            assert_eq!(waiter.join().unwrap(), Ok(()));
        });
    }
}
