//! Supervised data from the sibling environments (`generate
//! --environment sat+abd+ded`): for each task, the user message and a
//! demonstration answer ([`Environment::demonstration`]) that the
//! environment itself scores 1.0 (one that does not is dropped and
//! counted), as chat records of the layout `warmup`/`sft` read; and a
//! mixture of several such files, by weight, shuffled with a seed.
//!
//! A multi-step environment's demonstration is a whole episode played by
//! its expert ([`crate::env::demonstrate`]), kept when it reaches the goal:
//! one record an action, the conversation up to that action's observation
//! (the earlier actions as assistant turns, as the episode shows them to
//! the model) and the expert's completion as the answer trained on.

use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde_json::json;

use crate::env::{Environment, Score, Task};
use crate::rng::SplitMix64;

/// What one environment's file holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SftCounts {
    pub environment: String,
    pub tasks: u64,
    pub written: u64,
    /// Of a multi-step environment, the episodes demonstrated (each gave
    /// `written` one record an action).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub episodes: Option<u64>,
    /// Tasks without a record, by reason (`no_demonstration`,
    /// `demonstration_scores_0`, `demonstration_failed`, a task's own
    /// reason).
    pub dropped: BTreeMap<String, u64>,
}

/// Writes the records of `env`'s tasks `ids` to `out` (JSONL).
pub fn write_records(env: &dyn Environment, ids: &[u64], out: &Path) -> anyhow::Result<SftCounts> {
    let mut counts = SftCounts {
        environment: env.name().to_owned(),
        tasks: ids.len() as u64,
        ..SftCounts::default()
    };
    let mut lines = Vec::new();
    let tasks = env.tasks(ids);
    if env.multi_step() {
        let played = episodes(env, tasks);
        let mut shown = 0;
        for (id, played) in ids.iter().zip(played) {
            match played {
                Ok(records) => {
                    shown += 1;
                    counts.written += records.len() as u64;
                    lines.extend(records.into_iter().map(|mut r| {
                        r["environment"] = json!(env.name());
                        r["task_id"] = json!(id);
                        r.to_string()
                    }));
                }
                Err(why) => *counts.dropped.entry(why).or_default() += 1,
            }
        }
        counts.episodes = Some(shown);
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        crate::atomic::write(out, text.as_bytes())?;
        return Ok(counts);
    }
    for (id, task) in ids.iter().zip(tasks) {
        let why = match task {
            Err(why) => why,
            Ok(task) => match env.demonstration(&task) {
                None => "no_demonstration".to_owned(),
                Some(answer) => match env.score(&task, &answer) {
                    Score::Reward(1.0) => {
                        lines.push(
                            json!({
                                "messages": [
                                    {"role": "user", "content": task.prompt},
                                    {"role": "assistant", "content": answer},
                                ],
                                "environment": env.name(),
                                "task_id": id,
                            })
                            .to_string(),
                        );
                        counts.written += 1;
                        continue;
                    }
                    Score::Reward(_) => "demonstration_scores_0".to_owned(),
                    Score::Masked(why) => why,
                },
            },
        };
        *counts.dropped.entry(why).or_default() += 1;
    }
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    crate::atomic::write(out, text.as_bytes())?;
    Ok(counts)
}

/// The most actions a demonstrated episode may take (the environments'
/// own limits, AgentGym's 50 among them, end theirs sooner).
pub const DEMONSTRATION_STEPS: usize = 50;

/// Each task's episode played by the expert, in parallel: its records (one
/// an action, `messages` and `step`), or why there are none.
fn episodes(
    env: &dyn Environment,
    tasks: Vec<Result<Task, String>>,
) -> Vec<Result<Vec<serde_json::Value>, String>> {
    use rayon::prelude::*;
    tasks
        .into_par_iter()
        .map(|task| {
            let task = task?;
            let shown = crate::env::demonstrate(env, &task, DEMONSTRATION_STEPS)?;
            let mut messages = Vec::new();
            let mut records = Vec::with_capacity(shown.len());
            for (k, s) in shown.into_iter().enumerate() {
                messages.push(json!({"role": "user", "content": s.observation}));
                messages.push(json!({"role": "assistant", "content": s.completion}));
                records.push(json!({"messages": messages.clone(), "step": k}));
            }
            Ok(records)
        })
        .collect()
}

/// Writes a mixture of record files: file `i` contributes
/// `round(total * w_i / sum(w))` records (cycling through its records when
/// that is more than it has), `total` being the records of all files; then
/// everything is shuffled with `seed`.
pub fn write_mixture(files: &[(&Path, f64)], out: &Path, seed: u64) -> anyhow::Result<u64> {
    let mut all: Vec<Vec<String>> = Vec::new();
    for (path, _) in files {
        let f = std::fs::File::open(path)
            .with_context(|| format!("cannot open `{}`", path.display()))?;
        let lines = std::io::BufReader::new(f)
            .lines()
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        all.push(lines.into_iter().filter(|l| !l.trim().is_empty()).collect());
    }
    let total: usize = all.iter().map(Vec::len).sum();
    let weight: f64 = files.iter().map(|(_, w)| w).sum();
    let mut mixed: Vec<&String> = Vec::new();
    for (records, (_, w)) in all.iter().zip(files) {
        if records.is_empty() {
            continue;
        }
        let want = (total as f64 * w / weight).round() as usize;
        mixed.extend(records.iter().cycle().take(want));
    }
    SplitMix64::new(seed).shuffle(&mut mixed);
    let tmp = out.with_extension("jsonl.tmp");
    {
        let mut w = BufWriter::new(
            std::fs::File::create(&tmp)
                .with_context(|| format!("cannot create `{}`", tmp.display()))?,
        );
        for line in &mixed {
            writeln!(w, "{line}")?;
        }
        w.flush()?;
    }
    std::fs::rename(&tmp, out).with_context(|| format!("cannot write `{}`", out.display()))?;
    Ok(mixed.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::affine::sat::SatEnv;

    #[test]
    fn sat_records_are_right_answers_and_mixtures_follow_weights() {
        let dir = tempfile::tempdir().unwrap();
        let sat = dir.path().join("sat.jsonl");
        let c = write_records(&SatEnv, &[0, 1, 2, 3], &sat).unwrap();
        assert_eq!((c.written, c.dropped.len()), (4, 0));
        let text = std::fs::read_to_string(&sat).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(
            first["messages"][1]["content"],
            SatEnv.task(0).unwrap().expected
        );
        assert_eq!(first["environment"], "sat");
        let other = dir.path().join("other.jsonl");
        std::fs::write(&other, "{\"x\": 1}\n{\"x\": 2}\n").unwrap();
        let mix = dir.path().join("mix.jsonl");
        // 6 records in all; weights 1:2 → 2 from sat, 4 from other (cycled).
        let n = write_mixture(&[(&sat, 1.0), (&other, 2.0)], &mix, 7).unwrap();
        assert_eq!(n, 6);
        let lines: Vec<String> = std::fs::read_to_string(&mix)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(lines.iter().filter(|l| l.contains("\"x\"")).count(), 4);
    }

    #[test]
    fn a_demonstrated_episode_is_one_record_an_action() {
        use crate::env::WordStepsEnv;
        let env = WordStepsEnv::new(&["alpha", "beta", "gamma"], 3);
        let task = env.task(1).unwrap();
        let shown = crate::env::demonstrate(&env, &task, 10).unwrap();
        let words: Vec<&str> = shown.iter().map(|s| s.completion.as_str()).collect();
        assert_eq!(words, ["beta", "gamma", "alpha"]);
        assert_eq!(shown[0].observation, task.prompt);
        assert_eq!(
            shown[1].observation,
            "Answer with the word gamma and nothing else."
        );
        // Too few steps allowed: no demonstration.
        assert_eq!(
            crate::env::demonstrate(&env, &task, 2),
            Err("demonstration_too_long".into())
        );
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("steps.jsonl");
        let c = write_records(&env, &[0, 1], &out).unwrap();
        assert_eq!((c.written, c.episodes, c.dropped.len()), (6, Some(2), 0));
        let records: Vec<serde_json::Value> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Task 1's third action: the whole conversation, the last answer its own.
        let r = &records[5];
        assert_eq!(
            (r["task_id"].as_u64(), r["step"].as_u64()),
            (Some(1), Some(2))
        );
        let m = r["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(m[0]["content"], task.prompt.as_str());
        assert_eq!(
            (m[1]["role"].as_str(), m[1]["content"].as_str()),
            (Some("assistant"), Some("beta"))
        );
        assert_eq!(m[5]["content"], "alpha");
    }
}
