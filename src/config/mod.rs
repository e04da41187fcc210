//! Typed configuration: `config/pipeline_config.json` (model, hardware and
//! one section a stage) and one file a stage (`config/generate.json`, ...).
//!
//! Every struct rejects unknown fields and documents its defaults; a file may
//! leave out any field. CLI flags override file values (see `cli`).
//!
//! Files written for the Python pipeline load as they are: its names
//! ([`USER_NAMES`]: `model.base_model`, `stage0.variants_per_sample`,
//! `stage3.num_steps`; and `hardware.no_4bit`, one of
//! [`PRECISION_SWITCHES`]) are accepted beside ours, as is
//! `model.load_in_4bit`, `model.base_precision`'s name before FP8, and
//! `hardware.b200_mode` is the `--b200` preset. A file that gives one
//! setting under two names is refused. [`Sources`] records where each
//! resolved value came from (default, file, preset, flag) for
//! `trace-train config` and the run's record.
//!
//! One file a stage: [`pipeline`](PipelineConfig) (the pipeline file, its
//! model, hardware and gate sections), generate (Stage 0), sft (Stages 1-2),
//! rl (Stage 3 and its algorithm), dpo. This file reads and checks config
//! files; the types are re-exported here (`config::SftConfig`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::layers::lora::BasePrecision;
use crate::sandbox::Limits;

/// A configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config `{path}` at line {line}, column {column}: {message}\nhint: {hint}{}", more.iter().map(|m| format!("\nalso {m}")).collect::<String>())]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
        hint: String,
        /// The file's other errors, each `at line N: ...`, so that one run
        /// shows them all.
        more: Vec<String>,
    },
    #[error("invalid config `{path}`:\n{}", problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

/// Reads and validates a config file, JSON or YAML ([`read_text`]).
pub fn load<T: Settings>(path: &Path) -> Result<T, ConfigError> {
    let (text, yaml) = read_text(path)?;
    parse(&text, path).map_err(|e| at_yaml_lines(e, yaml.as_deref()))
}

/// Whether `path` names a YAML file (`.yaml`, `.yml`).
pub fn is_yaml(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

/// A config file's text as JSON, and the YAML it was read from when it is
/// a YAML file: YAML files are read into the same tree, so every key,
/// check and message is the JSON file's.
pub fn read_text(path: &Path) -> Result<(String, Option<String>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !is_yaml(path) {
        return Ok((text, None));
    }
    let tree: serde_json::Value = yaml_serde::from_str(&text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        ConfigError::Parse {
            path: path.to_owned(),
            line,
            column,
            message: e.to_string().split(" at line ").next().unwrap_or_default().to_owned(),
            hint: "the file must be a YAML mapping of the keys the JSON file has; see docs/reference/config.md".into(),
            more: Vec::new(),
        }
    })?;
    let json = serde_json::to_string_pretty(&tree).expect("a JSON tree serialises");
    Ok((json, Some(text)))
}

/// `e`, found in the JSON form of a YAML file, with its lines the YAML's:
/// each error's key is looked up there ([`yaml_line_of`]).
fn at_yaml_lines(e: ConfigError, yaml: Option<&str>) -> ConfigError {
    let Some(yaml) = yaml else { return e };
    match e {
        ConfigError::Parse {
            path,
            line,
            column,
            message,
            hint,
            more,
        } => {
            // The first error names its key in the message or sits on it.
            let key = message
                .strip_prefix("unknown field `")
                .and_then(|m| m.split('`').next())
                .map(str::to_owned);
            let found = key.and_then(|k| yaml_line_of(yaml, &[k]));
            let more = more
                .into_iter()
                .map(|m| {
                    let path: Option<Vec<String>> = m
                        .split('`')
                        .nth(1)
                        .map(|p| p.split('.').map(str::to_owned).collect());
                    match (
                        m.split_once(": "),
                        path.and_then(|p| yaml_line_of(yaml, &p)),
                    ) {
                        (Some((_, rest)), Some(n)) => format!("at line {n}: {rest}"),
                        _ => m,
                    }
                })
                .collect();
            ConfigError::Parse {
                path,
                line: found.unwrap_or(line),
                column: if found.is_some() { 1 } else { column },
                message,
                hint,
                more,
            }
        }
        other => other,
    }
}

/// The line (1-based) of the key at `path` in YAML `text`: each key found
/// after its parent's, written `key:` at the start of a line (after its
/// indentation or a `- `). A one-key path is looked for anywhere.
fn yaml_line_of(text: &str, path: &[String]) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0;
    let mut found = None;
    for k in path {
        let at = lines.iter().enumerate().skip(from).find(|(_, l)| {
            let t = l.trim_start().trim_start_matches("- ");
            t.strip_prefix(k.as_str())
                .or_else(|| t.strip_prefix(&format!("\"{k}\"")))
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })?;
        from = at.0 + 1;
        found = Some(at.0 + 1);
    }
    found
}

/// Parses and validates config text; `path` names it in errors.
pub fn parse<T: Settings>(text: &str, path: &Path) -> Result<T, ConfigError> {
    let parse_error = |e: serde_json::Error| {
        let (line, column) = located(text, &e);
        let mut message = e.to_string();
        // A stage's own keys and its flattened shared ones are one object
        // in the file, but serde lists none of them for an unknown key
        // there: list the keys `T` writes at that place.
        if message.starts_with("unknown field") && !message.contains("expected") {
            let at = path_at(text, offset(text, line, column));
            let pointer: String = at.iter().map(|k| format!("/{k}")).collect();
            if let Some(obj) = serde_json::to_value(T::default())
                .ok()
                .and_then(|v| v.pointer(&pointer).and_then(|o| o.as_object()).cloned())
            {
                let names: Vec<String> = obj.keys().map(|k| format!("`{k}`")).collect();
                let unknown = message.split(" at line ").next().unwrap_or_default();
                message = format!("{unknown}, expected one of {}", names.join(", "));
            }
        }
        let hint = if let Some(unknown) = message
            .strip_prefix("unknown field `")
            .and_then(|m| m.split('`').next())
        {
            let mut hint = match did_you_mean::<T>(unknown, &message) {
                Some(near) => format!("did you mean `{near}`? "),
                None => String::new(),
            };
            hint += if message.contains("expected") {
                "remove the field or check its spelling; the expected fields are listed above; docs/reference/config.md documents each"
            } else {
                "remove the field or check its spelling"
            };
            // serde lists our names only; say which also go by the Python
            // pipeline's.
            if let Some(expected) = message.split("expected one of").nth(1) {
                for (_, theirs, ours) in USER_NAMES {
                    if expected.contains(&format!("`{ours}`")) {
                        hint += &format!(" (`{ours}` may also be written `{theirs}`)");
                    }
                }
            }
            hint
        } else if let Some((theirs, ours)) = USER_NAMES
            .iter()
            .find(|(_, _, ours)| message.contains(&format!("duplicate field `{ours}`")))
            .map(|(_, theirs, ours)| (theirs, ours))
        {
            format!(
                "`{theirs}` (the Python pipeline's name) and `{ours}` are one setting; keep one of them"
            )
        } else if message.contains("duplicate field") {
            "a key appears twice in one object; keep one".into()
        } else if let Some(key) = (message.starts_with("invalid type")
            || message.starts_with("invalid value")
            || message.starts_with("unknown variant"))
        .then(|| key_before(text, line, column))
        .flatten()
        {
            let expected = message
                .split("expected ")
                .nth(1)
                .and_then(|x| x.split(" at line").next())
                .and_then(|x| x.split(" (key `").next())
                .unwrap_or("another value");
            let wanted = match expected {
                "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number, 0 or more".to_owned(),
                "i64" | "i32" => "a whole number".to_owned(),
                "f64" | "f32" => "a number".to_owned(),
                other => other.to_owned(),
            };
            format!(
                "`{key}` takes {wanted} (every key's type, default and meaning: docs/reference/config.md, or `trace-train config --reference`)"
            )
        } else {
            "the file must be a JSON object; see the shipped files in `config/` for examples".into()
        };
        ConfigError::Parse {
            path: path.to_owned(),
            line,
            column,
            message: message
                .split(" at line ")
                .next()
                .and_then(|m| m.split(" (key `").next())
                .unwrap_or(&message)
                .to_owned(),
            hint,
            more: Vec::new(),
        }
    };
    let mut value: T = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let mut err = parse_error(e);
            if let ConfigError::Parse {
                more,
                line,
                message,
                ..
            } = &mut err
            {
                *more = further_errors::<T>(text, *line, message);
            }
            return Err(err);
        }
    };
    let tree: serde_json::Value = serde_json::from_str(text).map_err(parse_error)?;
    let mut problems = value.settle(&tree);
    problems.extend(value.problems());
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            path: path.to_owned(),
            problems,
        })
    }
}

/// A config struct: read from JSON, checked, and written back for
/// `trace-train config`; its defaults give "did you mean" its keys.
pub trait Settings: for<'de> Deserialize<'de> + Serialize + Default + Validate {}
impl<T: for<'de> Deserialize<'de> + Serialize + Default + Validate> Settings for T {}

/// Most errors listed after the first.
const MAX_ERRORS: usize = 20;

/// A config's errors after the first, each `at line N: message`, in line
/// order, found by reading the file again as a tree with each offending key
/// taken out in turn; the first error (at `first_line`, saying
/// `first_message`) is already reported. Empty when the text is not JSON
/// at all (one syntax error says it).
fn further_errors<T: Settings>(text: &str, first_line: usize, first_message: &str) -> Vec<String> {
    let Ok(mut tree) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for _ in 0..MAX_ERRORS {
        let e = match serde_path_to_error::deserialize::<_, T>(tree.clone()) {
            Ok(_) => break,
            Err(e) => e,
        };
        let message = e.inner().to_string();
        let message = message
            .split(" (key `")
            .next()
            .unwrap_or(&message)
            .to_owned();
        let mut path: Vec<String> = e
            .path()
            .iter()
            .filter_map(|s| match s {
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                _ => None,
            })
            .collect();
        // An unknown key's path may stop at the object holding it, and a
        // flattened group's error at its stage: the message names the key.
        let full = e.inner().to_string();
        let named = full
            .strip_prefix("unknown field `")
            .or_else(|| full.split("(key `").nth(1))
            .and_then(|m| m.split('`').next())
            .map(str::to_owned);
        if let Some(k) = named
            && path.last() != Some(&k)
        {
            path.push(k);
        }
        if !remove_at(&mut tree, &path) {
            break;
        }
        let line = line_of(text, &path).unwrap_or(0);
        let short = message
            .split(", expected one of")
            .next()
            .unwrap_or(&message);
        let first = first_message
            .split(", expected one of")
            .next()
            .unwrap_or_default();
        if line == first_line && short == first {
            continue; // the one already reported
        }
        out.push((
            line,
            format!(
                "at line {line}: `{}`: {}",
                path.join("."),
                briefly::<T>(&message)
            ),
        ));
    }
    out.sort_by_key(|(line, _)| *line);
    out.into_iter().map(|(_, m)| m).collect()
}

/// A serde error about `T` in one line: without serde's list of expected
/// keys (a value's few choices stay), with "did you mean" for an unknown
/// key near a known one.
fn briefly<T: Settings>(message: &str) -> String {
    let near = message
        .strip_prefix("unknown field `")
        .and_then(|m| m.split('`').next())
        .and_then(|unknown| did_you_mean::<T>(unknown, message))
        .map(|k| format!(" (did you mean `{k}`?)"))
        .unwrap_or_default();
    let short = match message.starts_with("unknown variant") {
        true => message,
        false => message.split(", expected one of").next().unwrap_or(message),
    };
    format!("{short}{near}")
}

/// Takes the key at `path` out of `tree`; false when there is none.
fn remove_at(tree: &mut serde_json::Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = tree;
    for k in parents {
        match at.get_mut(k) {
            Some(next) => at = next,
            None => return false,
        }
    }
    at.as_object_mut().is_some_and(|o| o.remove(last).is_some())
}

/// The line (1-based) of the key at `path` in JSON `text`: each key found
/// after its parent's.
fn line_of(text: &str, path: &[String]) -> Option<usize> {
    let mut from = 0;
    for k in path {
        let re = regex::Regex::new(&format!(r#""{}"\s*:"#, regex::escape(k))).ok()?;
        from += re.find(&text[from..])?.start();
    }
    Some(text[..from].matches('\n').count() + 1)
}

/// Where error `e` is in `text`, as (line, column), 1-based. serde_json
/// places an error in a flattened group of shared keys
/// ([`groups`]) at the end of the object holding it; such errors name
/// their key (`unknown field `k``, or `(key `k`)` from
/// [`groups::with_defaults`]), and the place becomes that key's value.
fn located(text: &str, e: &serde_json::Error) -> (usize, usize) {
    let message = e.to_string();
    let named = message
        .split("(key `")
        .nth(1)
        .or_else(|| message.strip_prefix("unknown field `"))
        .and_then(|m| m.split('`').next());
    let end = offset(text, e.line(), e.column());
    let Some(key) = named else {
        return (e.line(), e.column());
    };
    let pattern = format!(r#""{}"\s*:\s*"#, regex::escape(key));
    let re = regex::Regex::new(&pattern).expect("an escaped key is a valid pattern");
    match re.find_iter(&text[..end]).last() {
        Some(m) => {
            let before = &text[..m.end()];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1);
            (line, column)
        }
        None => (e.line(), e.column()),
    }
}

/// The keys leading to the innermost object open at byte `offset` of JSON
/// `text` (`["stage1"]` inside `{"stage1": {...}}`).
fn path_at(text: &str, offset: usize) -> Vec<String> {
    // One entry an open container: the key being read in it (objects).
    let mut open: Vec<Option<String>> = Vec::new();
    let mut last_string = String::new();
    let mut chars = text[..offset.min(text.len())].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                last_string.clear();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        c => last_string.push(c),
                    }
                }
            }
            ':' => {
                if let Some(key) = open.last_mut() {
                    *key = Some(std::mem::take(&mut last_string));
                }
            }
            '{' | '[' => open.push(None),
            '}' | ']' => {
                open.pop();
            }
            _ => {}
        }
    }
    // The keys of the containers enclosing the innermost one.
    open.pop();
    open.into_iter().flatten().collect()
}

/// The byte offset of `line`:`column` (1-based) in `text`, at most its length.
fn offset(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    (start + column).min(text.len())
}

/// The known key nearest `unknown`: among those serde's `message` lists,
/// or, where it lists none (a stage's flattened shared keys), among every
/// key `T` writes. None when nothing is close.
fn did_you_mean<T: Settings>(unknown: &str, message: &str) -> Option<String> {
    let listed: Vec<String> = message
        .split_once("expected")
        .map(|(_, list)| {
            list.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let candidates = if listed.is_empty() {
        let mut all = Vec::new();
        if let Ok(v) = serde_json::to_value(T::default()) {
            object_keys(&v, &mut all);
        }
        all
    } else {
        listed
    };
    candidates
        .into_iter()
        .map(|k| (strsim::jaro_winkler(unknown, &k), k))
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

/// Every object key anywhere in `v`.
fn object_keys(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, child) in m {
                out.push(k.clone());
                object_keys(child, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|c| object_keys(c, out)),
        _ => {}
    }
}

/// The last object key written before `line`:`column` (1-based, as
/// serde_json reports an error) of `text`: the key whose value a type
/// error is about.
fn key_before(text: &str, line: usize, column: usize) -> Option<String> {
    let before = text.get(..offset(text, line, column))?;
    let re = regex::Regex::new(r#""((?:[^"\\]|\\.)*)"\s*:"#).expect("valid regex");
    re.captures_iter(before).last().map(|c| c[1].to_owned())
}

/// Applies command-line overrides `KEY=VALUE` (`--set
/// stage1.learning_rate=1e-4`) to `settings`, in order, each recorded in
/// `sources` as a flag. KEY is a dotted path of the file's keys; VALUE is
/// read as JSON (`1e-4`, `true`, `null`, `[1, 2]`, `"text"`), else taken
/// as a string (`stage0.dataset=builtin`). A key the settings do not have
/// or a value of the wrong type is an error naming the override (every
/// override's at once); then the settings are checked as a file's are.
pub fn apply_sets<T: Settings>(
    settings: &mut T,
    sources: &mut Sources,
    sets: &[String],
) -> anyhow::Result<()> {
    apply_sets_unchecked(settings, sources, sets)?;
    if sets.is_empty() {
        return Ok(());
    }
    refuse_problems(settings.problems())
}

/// [`apply_sets`] without the settings' own checks afterwards (each
/// override's key and type are still checked): for a caller that applies
/// its flags next and checks the result, so that a check across keys (the
/// algorithm a setting needs) sees the flags too.
pub fn apply_sets_unchecked<T: Settings>(
    settings: &mut T,
    sources: &mut Sources,
    sets: &[String],
) -> anyhow::Result<()> {
    if sets.is_empty() {
        return Ok(());
    }
    let mut tree = serde_json::to_value(&*settings)?;
    let mut problems = Vec::new();
    for set in sets {
        let Some((key, raw)) = set.split_once('=') else {
            problems.push(format!(
                "--set {set}: expected KEY=VALUE (e.g. stage1.learning_rate=1e-4)"
            ));
            continue;
        };
        let mut value: serde_json::Value =
            serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_owned()));
        // The Python pipeline's names (`model.base_model`) and the older
        // precision switches set ours.
        let ours = our_key("", key);
        if ours == "model.base_precision" && ours != key {
            match value {
                serde_json::Value::Bool(on) => {
                    let precision = switch_precision(key, on).expect("our_key named a switch");
                    value = precision.as_str().into();
                }
                _ => {
                    problems.push(format!(
                        "--set {set}: expected true or false (or `--set model.base_precision=bf16|nf4|fp8`)"
                    ));
                    continue;
                }
            }
        }
        let key = ours.as_str();
        let mut candidate = tree.clone();
        let mut at = &mut candidate;
        for part in key.split('.') {
            if !at.is_object() {
                *at = serde_json::Value::Object(Default::default());
            }
            at = at
                .as_object_mut()
                .expect("made an object above")
                .entry(part)
                .or_insert(serde_json::Value::Null);
        }
        *at = value;
        match serde_json::from_value::<T>(candidate.clone()) {
            Ok(_) => {
                tree = candidate;
                sources.flag(key, &format!("--set {set}"));
            }
            Err(e) => {
                let message = briefly::<T>(&e.to_string());
                problems.push(format!("--set {set}: {message}"));
            }
        }
    }
    if problems.is_empty() {
        *settings = serde_json::from_value(tree)?;
    }
    refuse_problems(problems)
}

/// An error listing `problems` with the hint to the reference; none: Ok.
fn refuse_problems(problems: Vec<String>) -> anyhow::Result<()> {
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}\nhint: every key's type, default and meaning: docs/reference/config.md, or `trace-train config --reference`",
        problems.join("\n  - ")
    );
    Ok(())
}

/// `name: must be at least 1` for each of `counts` that is 0.
pub(crate) fn at_least_one(counts: &[(&str, usize)]) -> Vec<String> {
    counts
        .iter()
        .filter(|(_, v)| *v == 0)
        .map(|(name, _)| format!("{name}: must be at least 1"))
        .collect()
}

/// Semantic checks beyond the types; all problems are gathered at once.
pub trait Validate {
    fn problems(&self) -> Vec<String>;

    /// Folds settings a file may give in another section (the Python
    /// pipeline's `hardware.no_4bit`) into ours, given the file as parsed
    /// JSON; returns the conflicts. Most configs have none.
    fn settle(&mut self, _file: &serde_json::Value) -> Vec<String> {
        Vec::new()
    }
}

/// The Python pipeline's names for our settings: (section, its key, ours).
/// Either loads; a file that gives both is refused. The older switches
/// for `model.base_precision` ([`PRECISION_SWITCHES`]) are folded by
/// [`PipelineConfig`]'s [`Validate::settle`].
pub const USER_NAMES: [(&str, &str, &str); 3] = [
    ("model", "base_model", "name"),
    ("stage0", "variants_per_sample", "variants"),
    ("stage3", "num_steps", "ppo.num_train_steps"),
];

/// The older names of `model.base_precision`, each a switch: (its dotted
/// key, the precision `true` means, the one `false` means). `load_in_4bit`
/// was ours before FP8; `hardware.no_4bit` is the Python pipeline's. One
/// of them, or `base_precision`, may say it in a file; `--set` takes them
/// too.
pub const PRECISION_SWITCHES: [(&str, BasePrecision, BasePrecision); 2] = [
    (
        "model.load_in_4bit",
        BasePrecision::Nf4,
        BasePrecision::Bf16,
    ),
    ("hardware.no_4bit", BasePrecision::Bf16, BasePrecision::Nf4),
];

/// The precision switch `key` ([`PRECISION_SWITCHES`]) set to `on` means;
/// none when `key` is no such switch.
pub fn switch_precision(key: &str, on: bool) -> Option<BasePrecision> {
    PRECISION_SWITCHES
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|&(_, t, f)| if on { t } else { f })
}

/// `key` (dotted, as a file under `section` or `--set` writes it) in our
/// names: the Python pipeline's `model.base_model` is `model.name`, the
/// precision switches (`hardware.no_4bit`, `model.load_in_4bit`) are
/// `model.base_precision` (their values mapped by the caller,
/// [`switch_precision`]).
fn our_key(section: &str, key: &str) -> String {
    let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
    let full_parent = match (section, parent) {
        ("", p) => p.to_owned(),
        (s, "") => s.to_owned(),
        (s, p) => format!("{s}.{p}"),
    };
    if switch_precision(&format!("{full_parent}.{last}"), true).is_some() {
        return "model.base_precision".to_owned();
    }
    let name = USER_NAMES
        .iter()
        .find(|(s, theirs, _)| *s == full_parent && *theirs == last)
        .map_or(last, |(_, _, ours)| ours);
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// Where a resolved setting came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "from")]
pub enum Source {
    /// The built-in default.
    Default,
    /// A config file, under the key as written there.
    File { path: PathBuf, key: String },
    /// A preset switched on by a flag or a file key (`--b200`).
    Preset { by: String },
    /// A command-line flag.
    Flag { flag: String },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File { path, key } => write!(f, "file {} ({key})", path.display()),
            Source::Preset { by } => write!(f, "preset {by}"),
            Source::Flag { flag } => write!(f, "flag {flag}"),
        }
    }
}

/// Where each resolved value came from, by dotted key in our names
/// (`stage1.epochs`); a key not recorded is a default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sources(std::collections::BTreeMap<String, Source>);

impl Sources {
    /// The keys a config file sets. `file` is the file as parsed JSON;
    /// `section` is the pipeline section its top level stands for (`""`
    /// for pipeline_config.json, `stage0` for generate.json), so that the
    /// Python pipeline's names map to ours.
    pub fn from_file(path: &Path, file: &serde_json::Value, section: &str) -> Self {
        let mut out = Sources::default();
        let mut leaves = Vec::new();
        leaf_keys(file, "", &mut leaves);
        for key in leaves {
            out.0.insert(
                our_key(section, &key),
                Source::File {
                    path: path.to_owned(),
                    key,
                },
            );
        }
        out
    }

    /// Records that `key` was set by `source` (later calls win).
    pub fn set(&mut self, key: &str, source: Source) {
        self.0.insert(key.to_owned(), source);
    }

    /// Records a flag's setting of `key`.
    pub fn flag(&mut self, key: &str, flag: &str) {
        self.set(
            key,
            Source::Flag {
                flag: flag.to_owned(),
            },
        );
    }

    /// Where `key` came from.
    pub fn get(&self, key: &str) -> Source {
        self.0.get(key).cloned().unwrap_or(Source::Default)
    }

    /// Every leaf of `resolved` (settings serialised to JSON) with its
    /// value and source, in key order: what `trace-train config` prints.
    pub fn table(&self, resolved: &serde_json::Value) -> Vec<(String, serde_json::Value, Source)> {
        let mut leaves = Vec::new();
        leaf_keys(resolved, "", &mut leaves);
        leaves
            .into_iter()
            .map(|k| {
                let v = resolved
                    .pointer(&format!("/{}", k.replace('.', "/")))
                    .cloned()
                    .unwrap_or(serde_json::Value::Null);
                let src = self.get(&k);
                (k, v, src)
            })
            .collect()
    }

    /// [`Self::table`] as JSON: `{key: {"value": v, "from": ...}}`.
    pub fn to_json(&self, resolved: &serde_json::Value) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (k, v, src) in self.table(resolved) {
            let mut entry = serde_json::to_value(&src).expect("serialises");
            entry["value"] = v;
            m.insert(k, entry);
        }
        serde_json::Value::Object(m)
    }
}

/// The dotted keys of every non-object value under `v`.
fn leaf_keys(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_keys(child, &key, out);
            }
        }
        _ if !prefix.is_empty() => out.push(prefix.to_owned()),
        _ => {}
    }
}

/// A config file parsed as `T`, with the keys it set.
pub fn load_with_sources<T: Settings>(
    path: &Path,
    section: &str,
) -> Result<(T, Sources), ConfigError> {
    let (text, yaml) = read_text(path)?;
    let value = parse(&text, path).map_err(|e| at_yaml_lines(e, yaml.as_deref()))?;
    let tree: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    Ok((value, Sources::from_file(path, &tree, section)))
}

mod dpo;
mod generate;
pub mod groups;
mod pipeline;
pub mod reference;
mod rl;
mod sft;

pub use dpo::*;
pub use generate::*;
pub use groups::{Group, LoraSettings, OptimSettings, SaveSettings, ScheduleSettings};
pub use pipeline::*;
pub use rl::*;
pub use sft::*;

#[cfg(test)]
mod tests {

    #[test]
    fn temperature_schedule_moves_linearly_then_holds() {
        let off = TemperatureSchedule::default();
        assert_eq!(off.at(0, 0.9), 0.9);
        let t: TemperatureSchedule = serde_json::from_str(
            r#"{"enabled": true, "initial": 1.5, "final": 0.5, "warmup_steps": 4}"#,
        )
        .unwrap();
        let got: Vec<f64> = (0..7).map(|s| t.at(s, 9.0)).collect();
        assert_eq!(got, [1.5, 1.25, 1.0, 0.75, 0.5, 0.5, 0.5]);
        let now = TemperatureSchedule {
            warmup_steps: 0,
            ..t.clone()
        };
        assert_eq!(now.at(0, 9.0), 0.5);
        assert!(serde_json::from_str::<TemperatureSchedule>(r#"{"start": 1}"#).is_err());
        let bad = RlConfig {
            temperature_schedule: TemperatureSchedule { r#final: 0.0, ..t },
            ..RlConfig::default()
        };
        assert!(
            bad.problems()
                .iter()
                .any(|p| p.contains("temperature_schedule.final")),
            "{:?}",
            bad.problems()
        );
    }

    use super::*;

    /// A stage's shared keys (LoRA, optimizer, schedule, saving) are
    /// declared once and flattened into it: a file leaving one out gets the
    /// stage's default, not the group's; a wrong one is placed and named.
    #[test]
    fn shared_keys_take_the_stages_defaults_and_errors_name_their_line() {
        let d: DpoConfig = parse(r#"{"learning_rate": 3e-5}"#, Path::new("d.json")).unwrap();
        assert_eq!(d.optim.learning_rate, 3e-5);
        assert_eq!(d.schedule.warmup_ratio, 0.1);
        assert_eq!(d.lora_dropout, 0.0);
        let r: RlConfig = parse(r#"{"lora_r": 8}"#, Path::new("r.json")).unwrap();
        assert_eq!((r.lora.r, r.lora.alpha), (8, 32.0));
        assert_eq!((r.save.save_steps, r.save.save_total_limit), (1000, 0));
        assert_eq!(r.optim.learning_rate, 5e-7);
        let s: SftConfig = parse("{}", Path::new("s.json")).unwrap();
        assert_eq!(s.optim.learning_rate, 2e-4);
        assert_eq!(s.schedule.warmup_ratio, 0.03);

        let err = |text: &str| {
            parse::<PipelineConfig>(text, Path::new("p.json"))
                .unwrap_err()
                .to_string()
        };
        let typo = err("{\"stage1\": {\n  \"epochs\": 2,\n  \"lora_rr\": 8,\n  \"seed\": 1\n}}");
        assert!(typo.contains("at line 3"), "{typo}");
        assert!(typo.contains("did you mean `lora_r`?"), "{typo}");
        let wrong = err(
            "{\"stage3\": {\"dpo\": {\"train\": {\n  \"lora_alpha\": \"big\",\n  \"beta\": 0.2\n}}}}",
        );
        assert!(wrong.contains("at line 2"), "{wrong}");
        assert!(wrong.contains("`lora_alpha` takes a number"), "{wrong}");
        // A key of neither the stage nor a group: the stage's keys listed.
        let own = err("{\"stage1\": {\n  \"epoch\": 2\n}}");
        assert!(
            own.contains("at line 2")
                && own.contains("did you mean `epochs`?")
                && own.contains("`learning_rate`")
                && own.contains("`eval_steps`"),
            "{own}"
        );
    }

    #[test]
    fn unknown_fields_are_rejected_with_location() {
        let err = parse::<GenerateConfig>("{\n  \"variantz\": 3\n}", Path::new("x.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.json"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("variantz"), "{err}");
        assert!(err.contains("hint:"), "{err}");
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let err =
            parse::<GenerateConfig>(r#"{"variants": 0, "test_ratio": 2.0}"#, Path::new("g.json"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("variants") && err.contains("test_ratio"),
            "{err}"
        );
    }

    #[test]
    fn empty_object_gives_documented_defaults() {
        let g: GenerateConfig = parse("{}", Path::new("g.json")).unwrap();
        assert_eq!(g.variants, 3);
        assert_eq!(g.seed_scheme, SeedScheme::Env);
        // Every output length is kept by default, in both sets.
        assert_eq!(g.filters.lines(false), LineFilter::default());
        assert_eq!(g.filters.lines(true).min_output_lines, 1);
        assert!(!g.balance_lines);
        assert_eq!(g.limits.wall_ms, 10_000);
    }

    #[test]
    fn line_filters_are_per_stage_and_the_old_key_still_loads() {
        let g: GenerateConfig = parse(
            r#"{"filters": {"original": {"min_output_lines": 2, "max_output_lines": 5}, "transformed": {"min_output_lines": 3}}}"#,
            Path::new("g.json"),
        )
        .unwrap();
        assert_eq!(
            (
                g.filters.lines(false).min_output_lines,
                g.filters.lines(true).min_output_lines
            ),
            (2, 3)
        );
        assert!(!g.filters.lines(false).admits(1) && g.filters.lines(false).admits(5));
        assert!(!g.filters.lines(false).admits(6) && g.filters.lines(true).admits(60));
        // The older layout: `filters.min_output_lines` is the transformed
        // set's minimum; the originals keep every length.
        let old: GenerateConfig = parse(
            r#"{"filters": {"min_output_lines": 3, "drop_empty": true}}"#,
            Path::new("old.json"),
        )
        .unwrap();
        assert_eq!(old.filters.lines(true).min_output_lines, 3);
        assert_eq!(old.filters.lines(false).min_output_lines, 1);
        let err = parse::<GenerateConfig>(
            r#"{"filters": {"original": {"max_output_lines": 0}}, "balance_ratio": 0.5}"#,
            Path::new("bad.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("filters.original: max_output_lines 0") && err.contains("balance_ratio"),
            "{err}"
        );
        let err = parse::<GenerateConfig>(
            r#"{"filters": {"original": {"min_lines": 2}}}"#,
            Path::new("typo.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("min_lines") && err.contains("typo.json"),
            "{err}"
        );
    }

    /// The Python pipeline's `config/pipeline_config.json`, whole.
    const USER_PIPELINE: &str = include_str!("../../tests/fixtures/user_pipeline_config.json");

    #[test]
    fn the_python_pipelines_names_load_and_mean_ours() {
        let p: PipelineConfig = parse(USER_PIPELINE, Path::new("p.json")).unwrap();
        assert_eq!(p.model.name, "Qwen/Qwen3-4B");
        assert!(p.hardware.b200_mode);
        // `no_4bit: false` keeps the NF4 base; folded away on load.
        assert_eq!(p.model.base_precision, BasePrecision::Nf4);
        assert!(p.model.load_in_4bit.is_none() && p.hardware.no_4bit.is_none());
        assert_eq!((p.stage0.variants, p.stage0.num_workers), (3, 32));
        assert_eq!((p.stage1.epochs, p.stage2.epochs), (2, 3));
        assert_eq!(p.stage3.ppo.num_train_steps, 5000);
        let p: PipelineConfig =
            parse(r#"{"hardware": {"no_4bit": true}}"#, Path::new("p.json")).unwrap();
        assert_eq!(p.model.base_precision, BasePrecision::Bf16);
        // Any subset loads; the rest are defaults.
        let p: PipelineConfig =
            parse(r#"{"stage3": {"num_steps": 7}}"#, Path::new("p.json")).unwrap();
        assert_eq!((p.stage3.ppo.num_train_steps, p.stage1.epochs), (7, 1));
        // The sources name the key as the file wrote it.
        let tree: serde_json::Value = serde_json::from_str(USER_PIPELINE).unwrap();
        let s = Sources::from_file(Path::new("p.json"), &tree, "");
        let key = |k: &str| match s.get(k) {
            Source::File { key, .. } => key,
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(key("model.name"), "model.base_model");
        assert_eq!(key("model.base_precision"), "hardware.no_4bit");
        assert_eq!(key("stage0.variants"), "stage0.variants_per_sample");
        assert_eq!(key("stage3.ppo.num_train_steps"), "stage3.num_steps");
        assert_eq!(key("stage1.epochs"), "stage1.epochs");
        assert_eq!(s.get("stage1.seed"), Source::Default);
        // A stage file: `generate.json` stands for `stage0`.
        let tree = serde_json::json!({"variants_per_sample": 2, "filters": {"drop_empty": false}});
        let s = Sources::from_file(Path::new("g.json"), &tree, "stage0");
        assert!(
            matches!(s.get("variants"), Source::File { key, .. } if key == "variants_per_sample")
        );
        assert!(matches!(s.get("filters.drop_empty"), Source::File { .. }));
    }

    #[test]
    fn one_setting_under_both_names_is_refused() {
        let err = parse::<PipelineConfig>(
            "{\n  \"model\": {\"base_model\": \"a/b\",\n \"name\": \"c/d\"}\n}",
            Path::new("both.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("both.json") && err.contains("line 3") && err.contains("`base_model`"),
            "{err}"
        );
        assert!(err.contains("hint:") && err.contains("keep one"), "{err}");
        let err = parse::<GenerateConfig>(
            r#"{"variants": 2, "variants_per_sample": 3}"#,
            Path::new("g.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("variants_per_sample"), "{err}");
        let err = parse::<PipelineConfig>(
            r#"{"model": {"load_in_4bit": true}, "hardware": {"no_4bit": true}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("hardware.no_4bit") && err.contains("model.load_in_4bit"),
            "{err}"
        );
    }

    /// `model.base_precision` takes its three values; `load_in_4bit` and
    /// `hardware.no_4bit` fold into it, in a file and in `--set`; a file
    /// giving two of them is refused with both keys named.
    #[test]
    fn base_precision_and_its_older_names_are_one_setting() {
        use BasePrecision::{Bf16, Fp8, Nf4};
        assert_eq!(PipelineConfig::default().model.base_precision, Nf4);
        for p in BasePrecision::ALL {
            let text = format!(r#"{{"model": {{"base_precision": "{}"}}}}"#, p.as_str());
            let c: PipelineConfig = parse(&text, Path::new("p.json")).unwrap();
            assert_eq!(c.model.base_precision, p);
        }
        for (text, want) in [
            (r#"{"model": {"load_in_4bit": true}}"#, Nf4),
            (r#"{"model": {"load_in_4bit": false}}"#, Bf16),
            (r#"{"hardware": {"no_4bit": true}}"#, Bf16),
            (r#"{"hardware": {"no_4bit": false}}"#, Nf4),
        ] {
            let c: PipelineConfig = parse(text, Path::new("p.json")).unwrap();
            assert_eq!(c.model.base_precision, want, "{text}");
            // Folded away: the resolved settings say base_precision alone.
            let v = serde_json::to_value(&c).unwrap();
            assert!(
                v["model"].get("load_in_4bit").is_none() && v["hardware"].get("no_4bit").is_none(),
                "{v}"
            );
            assert_eq!(v["model"]["base_precision"], want.as_str());
            // The key as the file wrote it is the source.
            let tree: serde_json::Value = serde_json::from_str(text).unwrap();
            let s = Sources::from_file(Path::new("p.json"), &tree, "");
            let written = if text.contains("no_4bit") {
                "hardware.no_4bit"
            } else {
                "model.load_in_4bit"
            };
            assert!(
                matches!(s.get("model.base_precision"), Source::File { key, .. } if key == written),
                "{text}"
            );
        }
        let err = parse::<PipelineConfig>(
            "{\"model\": {\n  \"base_precision\": \"fp16\"}}",
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "p.json",
            "line 2",
            "`fp16`",
            "`bf16`, `nf4`, `fp8`",
            "hint: `base_precision` takes",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        for (text, keys) in [
            (
                r#"{"model": {"load_in_4bit": true, "base_precision": "fp8"}}"#,
                &["model.base_precision", "model.load_in_4bit"][..],
            ),
            (
                r#"{"model": {"base_precision": "bf16"}, "hardware": {"no_4bit": true}}"#,
                &["model.base_precision", "hardware.no_4bit"],
            ),
            (
                r#"{"model": {"load_in_4bit": false}, "hardware": {"no_4bit": false}}"#,
                &["model.load_in_4bit", "hardware.no_4bit"],
            ),
        ] {
            let err = parse::<PipelineConfig>(text, Path::new("conflict.json"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("conflict.json")
                    && keys.iter().all(|k| err.contains(k))
                    && err.contains("keep one")
                    && err.contains("hint:"),
                "{err}"
            );
        }
        // `--set` takes every name, recorded as the flag it was.
        let (mut c, mut s) = (PipelineConfig::default(), Sources::default());
        apply_sets(&mut c, &mut s, &["model.load_in_4bit=false".into()]).unwrap();
        assert_eq!(c.model.base_precision, Bf16);
        assert_eq!(
            s.get("model.base_precision"),
            Source::Flag {
                flag: "--set model.load_in_4bit=false".into()
            }
        );
        apply_sets(&mut c, &mut s, &["hardware.no_4bit=false".into()]).unwrap();
        assert_eq!(c.model.base_precision, Nf4);
        apply_sets(&mut c, &mut s, &["model.base_precision=fp8".into()]).unwrap();
        assert_eq!(c.model.base_precision, Fp8);
        let err = apply_sets(&mut c, &mut s, &["model.base_precision=fp16".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`bf16`, `nf4`, `fp8`"), "{err}");
        let err = apply_sets(&mut c, &mut s, &["hardware.no_4bit=yes".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected true or false"), "{err}");
    }

    /// What a pipeline run before `base_precision` recorded of the model
    /// section is what the section gives now, for nf4 and bf16.
    #[test]
    fn the_model_section_as_earlier_runs_recorded_it() {
        let d = ModelConfig::default();
        assert_eq!(
            d.as_recorded(),
            serde_json::json!({"name": "Qwen/Qwen3-4B", "revision": null, "load_in_4bit": true, "dtype": "bf16", "max_length": 2048})
        );
        let bf16 = ModelConfig {
            base_precision: BasePrecision::Bf16,
            ..d.clone()
        };
        assert_eq!(bf16.as_recorded()["load_in_4bit"], false);
        let fp8 = ModelConfig {
            base_precision: BasePrecision::Fp8,
            ..d
        };
        let v = fp8.as_recorded();
        assert!(v.get("load_in_4bit").is_none() && v["base_precision"] == "fp8");
    }

    #[test]
    fn a_misspelled_key_names_file_line_and_the_expected_keys() {
        let err =
            parse::<PipelineConfig>(r#"{"model": {"base_modle": "a/b"}}"#, Path::new("p.json"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("`name` may also be written `base_model`"),
            "{err}"
        );
        let text = USER_PIPELINE.replace("\"epochs\": 3", "\"epoch\": 3");
        let err = parse::<PipelineConfig>(&text, Path::new("config/pipeline_config.json"))
            .unwrap_err()
            .to_string();
        for want in [
            "config/pipeline_config.json",
            "line 6",
            "unknown field `epoch`",
            "`epochs`",
            "`learning_rate`",
            "hint:",
        ] {
            assert!(err.contains(want), "missing {want}: {err}");
        }
    }

    #[test]
    fn the_b200_preset_is_recorded_as_such() {
        let mut p: PipelineConfig = parse(USER_PIPELINE, Path::new("p.json")).unwrap();
        let mut s = Sources::default();
        p.apply_b200(&mut s, "hardware.b200_mode");
        assert_eq!(p.model.base_precision, BasePrecision::Bf16);
        assert!(!p.hardware.gradient_checkpointing);
        assert_eq!(
            s.get("model.base_precision"),
            Source::Preset {
                by: "hardware.b200_mode".into()
            }
        );
        // An FP8 base was asked for: the preset keeps it.
        let mut fp8: PipelineConfig = parse(
            r#"{"model": {"base_precision": "fp8"}, "hardware": {"b200_mode": true}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        fp8.apply_b200(&mut Sources::default(), "hardware.b200_mode");
        assert_eq!(fp8.model.base_precision, BasePrecision::Fp8);
        assert_eq!(
            (p.stage2.batch_size, p.stage2.gradient_accumulation_steps),
            (8, 4)
        );
        assert_eq!(
            p.stage3.ppo.micro_batch_tokens,
            Some(B200_MICRO_BATCH_TOKENS)
        );
        assert_eq!(
            s.get("stage3.ppo.micro_batch_tokens"),
            Source::Preset {
                by: "hardware.b200_mode".into()
            }
        );
        assert_eq!(
            s.get("stage1.batch_size"),
            Source::Preset {
                by: "hardware.b200_mode".into()
            }
        );
        let table = s.table(&serde_json::to_value(&p).unwrap());
        assert!(
            table
                .iter()
                .any(|(k, v, _)| k == "stage3.ppo.num_train_steps" && v == 5000)
        );
    }

    #[test]
    fn the_users_stage3_file_parses_as_written() {
        let text = r#"{"ppo": {"batch_size": 16, "learning_rate": 5e-7, "num_train_steps": 5000}, "curriculum": {"enabled": true, "promotion_threshold": 0.7}}"#;
        let c: Stage3Config = parse(text, Path::new("stage3_ppo_config.json")).unwrap();
        assert_eq!(c.ppo.batch_size, 16);
        assert_eq!(c.ppo.optim.learning_rate, 5e-7);
        assert_eq!(c.ppo.num_train_steps, 5000);
        assert!(c.curriculum.enabled);
        assert_eq!(c.curriculum.promotion_threshold, 0.7);
        assert_eq!(c.ppo.algorithm, "ppo");
        assert_eq!((c.ppo.group_size(), c.ppo.kl_coef()), (1, 0.05));
        let err =
            parse::<Stage3Config>("{\n  \"ppo\": {\"batch_sise\": 4}\n}", Path::new("s3.json"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("s3.json")
                && err.contains("line 2")
                && err.contains("batch_sise")
                && err.contains("num_train_steps"),
            "{err}"
        );
        let err = parse::<Stage3Config>(
            r#"{"ppo": {"algorithm": "a2c"}, "curriculum": {"promotion_threshold": 2}}"#,
            Path::new("s3.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ppo.algorithm") && err.contains("curriculum.promotion_threshold"),
            "{err}"
        );
    }

    #[test]
    fn dpo_settings_are_checked_all_at_once_with_their_keys() {
        let c: DpoConfig = parse(r#"{"loss": "ipo", "beta": 0.2}"#, Path::new("dpo.json")).unwrap();
        assert_eq!(
            (c.loss.as_str(), c.beta, c.reference.as_str()),
            ("ipo", 0.2, "adapter_off")
        );
        let err = parse::<DpoConfig>(
            r#"{"loss": "kto", "beta": 0, "epsilon": 0.5, "batch_size": 0, "reference": "x", "warmup_ratio": 2}"#,
            Path::new("dpo.json"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "loss: `kto`",
            "beta: 0",
            "epsilon: 0.5",
            "batch_size: must be at least 1",
            "reference: `x`",
            "warmup_ratio: 2",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        let err = parse::<DpoConfig>("{\n  \"betaa\": 0.1\n}", Path::new("dpo.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("betaa"), "{err}");
        // In the pipeline: Stage 3's recipe and its rounds, under their path.
        let p: PipelineConfig = parse(
            r#"{"stage3": {"algorithm": "dpo", "dpo": {"rounds": 3, "train": {"nll_coef": 1}}}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        assert!(p.stage3.is_dpo());
        assert_eq!((p.stage3.dpo.rounds, p.stage3.dpo.train.nll_coef), (3, 1.0));
        assert!(!PipelineConfig::default().stage3.is_dpo());
        let err = parse::<PipelineConfig>(
            r#"{"stage3": {"algorithm": "kto", "dpo": {"rounds": 0, "train": {"loss": "x"}}}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "stage3.algorithm: `kto`",
            "stage3.dpo.rounds",
            "stage3.dpo.train.loss",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn stage3_memory_keys_load_and_bad_values_name_the_key() {
        let c: Stage3Config = parse(
            r#"{"ppo": {"micro_batch_tokens": 4096, "gradient_checkpointing": true}}"#,
            Path::new("s3.json"),
        )
        .unwrap();
        assert_eq!(
            (c.ppo.micro_batch_tokens, c.ppo.gradient_checkpointing),
            (Some(4096), Some(true))
        );
        let d = Stage3Config::default();
        assert_eq!(
            (d.ppo.micro_batch_tokens, d.ppo.gradient_checkpointing),
            (None, None)
        );
        for (text, want) in [
            (
                "{\"ppo\": {\"batch_size\": 4,\n  \"micro_batch_tokens\": -512}}",
                "a whole number, 0 or more",
            ),
            (
                r#"{"ppo": {"micro_batch_tokens": "lots", "seed": 1}}"#,
                "a whole number, 0 or more",
            ),
            (r#"{"ppo": {"gradient_checkpointing": "yes"}}"#, "a boolean"),
        ] {
            let err = parse::<Stage3Config>(text, Path::new("config/stage3_ppo_config.json"))
                .unwrap_err()
                .to_string();
            let key = if text.contains("gradient_checkpointing") {
                "`gradient_checkpointing` takes"
            } else {
                "`micro_batch_tokens` takes"
            };
            assert!(
                err.contains("config/stage3_ppo_config.json")
                    && err.contains(key)
                    && err.contains(want)
                    && err.contains("hint:"),
                "{err}"
            );
        }
        // The pipeline file's section names it too.
        let err = parse::<PipelineConfig>(
            r#"{"stage3": {"ppo": {"micro_batch_tokens": 1.5}}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`micro_batch_tokens` takes"), "{err}");
    }

    #[test]
    fn the_gate_section_loads_with_defaults_and_bad_values_name_the_key() {
        let d = PipelineConfig::default().gate;
        assert_eq!(d.mode, "warn");
        assert_eq!(d.mode(), GateMode::Warn);
        assert_eq!(d.sets, GATE_SETS.map(String::from).to_vec());
        assert_eq!((d.limit, d.max_new_tokens), (Some(200), 512));
        let p: PipelineConfig = parse(
            r#"{"gate": {"mode": "keep_best", "sets": ["heldout_short"], "files": ["extra.jsonl"], "limit": null}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        assert_eq!(p.gate.mode(), GateMode::KeepBest);
        assert_eq!(p.gate.files, [PathBuf::from("extra.jsonl")]);
        assert_eq!(p.gate.limit, None);
        let off: PipelineConfig = parse(
            r#"{"gate": {"mode": "off", "sets": []}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        assert_eq!(off.gate.mode(), GateMode::Off);
        let err = parse::<PipelineConfig>(
            r#"{"gate": {"mode": "halt", "sets": ["heldout_short", "cruxeval", "heldout_short"], "limit": 0, "batch_size": 0}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "gate.mode: `halt` is not one of off, warn, stop, keep_best",
            "hint:",
            "gate.sets: `cruxeval`",
            "gate.sets: `heldout_short` is named twice",
            "gate.limit: must be at least 1",
            "gate.batch_size: must be at least 1",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        let err = parse::<PipelineConfig>(r#"{"gate": {"sets": []}}"#, Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gate.sets, files: the gate has no set"),
            "{err}"
        );
        let err = parse::<PipelineConfig>(r#"{"gate": {"mod": "warn"}}"#, Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `mod`") && err.contains("`mode`"),
            "{err}"
        );
        let err = parse::<PipelineConfig>("{\"gate\": {\"mode\": 1}}", Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`mode` takes"), "{err}");
    }

    #[test]
    fn seed_schemes() {
        assert_eq!(SeedScheme::Peer.seed(7, 2, 100), 7002);
        // Env: task ids r, r+N, r+2N, ... all map back to row r.
        let n = 23_303;
        for v in 0..3 {
            assert_eq!(SeedScheme::Env.seed(5, v, n) % n, 5);
        }
    }
}
