//! Rollouts: `K` sampled answers to each of a set of prompts from the
//! batched sampler, each scored by the environment, one JSON line each
//! with what a pair builder and a reader of the file need (prompt,
//! completion, extracted answer, token count, reward, correctness, the
//! sampling settings and the model with its commit).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::data::ChatTokenizer;
use crate::data::buckets::UpToBucket;
use crate::env::{self, Environment, MAX_BARREN_DRAWS, Score, Task};
use crate::model::LoadedModel;
use crate::model::decode::generate::{self, Sampling};

/// How the answers were sampled (recorded on every line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingSettings {
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    pub max_new_tokens: usize,
    /// Prompt `i`'s sample `j` draws from the stream `(seed, i·K + j)`.
    pub seed: u64,
}

impl SamplingSettings {
    /// Temperature 0: the greedy decode, the answer `eval` would give.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

impl Default for SamplingSettings {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 512,
            seed: 42,
        }
    }
}

/// One sampled, scored answer: a line of the rollouts file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    /// The environment's task id.
    pub prompt_id: u64,
    /// The user message, before any chat template.
    pub prompt: String,
    /// The sampled text (special tokens left out).
    pub completion: String,
    /// What scoring reads of it (`reward::extract_answer`).
    pub answer: String,
    /// The environment's ground truth.
    pub expected: String,
    /// A right answer the environment knows ([`Environment::demonstration`])
    /// and scores 1, where it has one: what `prefs --demonstrations` pairs
    /// against wrong answers. Absent in files of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demonstration: Option<String>,
    /// Sampled tokens, the stop token not counted.
    pub tokens: usize,
    /// Ended by a stop token (else by `max_new_tokens`).
    pub stopped: bool,
    pub reward: f64,
    /// Reward 1: the exact answer.
    pub correct: bool,
    /// Which of the prompt's `K` samples (`K`: the greedy answer, where
    /// one was asked for; its `sampling` says temperature 0).
    pub sample: usize,
    pub sampling: SamplingSettings,
    /// The model folder (or hub id) sampled from.
    pub model: String,
    /// Its commit, when it came from the hub cache.
    pub model_commit: Option<String>,
    /// The adapter applied on it, if any.
    pub adapter: Option<String>,
    /// The prompt variant it was sampled under (`rollouts
    /// --prompt_variants`); `prompt` stays the task's own, which the pairs
    /// train on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Scores of the user's own added to the line (a reasoning-quality
    /// score, a length penalty): `prefs --among_correct score:NAME` ranks
    /// correct answers by one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scores: BTreeMap<String, f64>,
}

/// A way of asking a task: its name and its user message, `{prompt}`
/// standing for the task's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptVariant {
    pub name: String,
    pub template: String,
}

impl PromptVariant {
    /// The user message of `prompt` under this variant.
    pub fn apply(&self, prompt: &str) -> String {
        self.template.replace("{prompt}", prompt)
    }

    /// Three reasoning styles (the DPO guide's): `direct`, `reflective`,
    /// `deliberative`.
    pub fn builtin() -> Vec<Self> {
        [
            ("direct", "{prompt}\n\nBe brief: give the answer with as little working as it needs."),
            ("reflective", "{prompt}\n\nWork it out step by step, then check your answer once before you give it."),
            ("deliberative", "{prompt}\n\nThink of two ways to solve it, say which you trust more and why, then give the answer."),
        ]
        .into_iter()
        .map(|(name, template)| Self {
            name: name.into(),
            template: template.into(),
        })
        .collect()
    }

    /// `builtin`, or a JSON file of variants (`[{"name": ..., "template":
    /// ...}]`), each template holding `{prompt}` once at least, the names
    /// distinct.
    pub fn load(spec: &str) -> anyhow::Result<Vec<Self>> {
        if spec == "builtin" {
            return Ok(Self::builtin());
        }
        let text = std::fs::read_to_string(spec)
            .with_context(|| format!("cannot read the prompt variants `{spec}`"))?;
        let variants: Vec<Self> = serde_json::from_str(&text).with_context(|| {
            format!("`{spec}` is not a JSON list of prompt variants\nhint: write [{{\"name\": \"direct\", \"template\": \"{{prompt}}\\n\\nAnswer briefly.\"}}, ...]")
        })?;
        anyhow::ensure!(!variants.is_empty(), "`{spec}` holds no prompt variant");
        let mut seen = std::collections::BTreeSet::new();
        for (i, v) in variants.iter().enumerate() {
            anyhow::ensure!(
                v.template.contains("{prompt}"),
                "`{spec}`: variant {i} (`{}`) has no `{{prompt}}` in its template\nhint: `{{prompt}}` stands for the task's own user message",
                v.name
            );
            anyhow::ensure!(
                seen.insert(v.name.as_str()),
                "`{spec}`: the name `{}` is given twice",
                v.name
            );
        }
        Ok(variants)
    }
}

impl Rollout {
    /// Decoded greedily (temperature 0): the answer `eval` would give.
    pub fn is_greedy(&self) -> bool {
        self.sampling.is_greedy()
    }
}

/// What one rollout run asks for.
pub struct RolloutPlan<'a> {
    pub env: &'a dyn Environment,
    /// Prompts wanted (draws that give no task are passed over).
    pub num_prompts: usize,
    /// Samples a prompt.
    pub num_samples: usize,
    /// Also one answer a prompt decoded greedily (temperature 0, as `eval`
    /// and the gate decode), written as sample `num_samples` with
    /// temperature 0 in its `sampling`: the answer the model gives when it
    /// is evaluated, which `prefs` pairs first.
    pub greedy: bool,
    /// Draw `k` is task `env::task_id(task_seed, first_draw + k)`.
    pub task_seed: u64,
    pub first_draw: u64,
    /// Prompts longer than this many tokens are passed over.
    pub max_prompt_tokens: usize,
    /// Only tasks up to this bucket (the others are passed over and
    /// counted as `above_last_bucket`); none: every task.
    pub up_to: Option<UpToBucket>,
    pub sampling: SamplingSettings,
    /// Completions decoding at once (0: all).
    pub max_rows: usize,
    pub model: String,
    pub model_commit: Option<String>,
    pub adapter: Option<String>,
    /// Ways of asking each task, one drawn a sample (seeded by the
    /// sampling seed, the task and the sample); empty: the task's own
    /// prompt. The greedy answer reads the task's own.
    pub variants: Vec<PromptVariant>,
}

/// What a rollout run made and passed over.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RolloutStats {
    pub prompts: usize,
    pub rollouts: usize,
    pub correct: usize,
    /// Of the `correct`, the greedy answers (with `greedy`): what `eval`
    /// would score on these prompts.
    pub greedy_correct: usize,
    /// Draws that gave no prompt, by why.
    pub skipped_tasks: BTreeMap<String, u64>,
    /// Of the draws above the last bucket, those passed over before they
    /// were made (their row's own program already prints too many lines):
    /// the sandbox ran neither their transform nor their variant.
    pub unmade: u64,
    /// Answers the environment could not score (left out), by why.
    pub masked: BTreeMap<String, u64>,
    /// The next draw, for a later run to continue from.
    pub next_draw: u64,
}

/// Samples and scores `plan.num_samples` answers to each of
/// `plan.num_prompts` prompts of the environment.
pub fn roll_out(
    model: &LoadedModel,
    tok: &ChatTokenizer,
    plan: &RolloutPlan,
) -> anyhow::Result<(Vec<Rollout>, RolloutStats)> {
    let mut stats = RolloutStats::default();
    let tasks = draw_prompts(plan, &mut stats, |text| {
        // Too long (and, by its bytes alone, not even tokenised): empty.
        Ok(
            match env::prompt_within(tok, text, plan.max_prompt_tokens)? {
                env::PromptLength::Fits(ids) => ids,
                env::PromptLength::TooLong { .. } => Vec::new(),
            },
        )
    })?;
    let k = plan.num_samples;
    let s = &plan.sampling;
    // Each sample's variant (none without variants) and its prompt.
    let mut chosen: Vec<Option<usize>> = Vec::with_capacity(tasks.len() * k);
    let mut prompts: Vec<Vec<u32>> = Vec::with_capacity(tasks.len() * k);
    for (task, ids) in &tasks {
        for j in 0..k {
            if plan.variants.is_empty() {
                chosen.push(None);
                prompts.push(ids.clone());
                continue;
            }
            let v = (crate::rng::keyed(s.seed, task.task_id, j as u64) % plan.variants.len() as u64)
                as usize;
            let text = plan.variants[v].apply(&task.prompt);
            let ids = tok
                .encode_prompt(&[crate::data::Message::new(crate::data::Role::User, text)])
                .with_context(|| {
                    format!(
                        "task {}'s prompt under variant `{}`",
                        task.task_id, plan.variants[v].name
                    )
                })?;
            chosen.push(Some(v));
            prompts.push(ids);
        }
    }
    let gens = generate::sample(
        &model.model,
        &prompts,
        s.max_new_tokens,
        &tok.stop_ids(),
        tok.pad().id,
        plan.max_rows,
        &Sampling {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            seed: s.seed,
            first_stream: 0,
        },
        &model.device,
    )?;
    let greedy_settings = SamplingSettings {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        ..s.clone()
    };
    let greedy = if plan.greedy {
        // The decode `eval` runs, one answer a prompt.
        let once: Vec<Vec<u32>> = tasks.iter().map(|(_, ids)| ids.clone()).collect();
        generate::greedy(
            &model.model,
            &once,
            s.max_new_tokens,
            &tok.stop_ids(),
            tok.pad().id,
            plan.max_rows,
            &model.device,
        )?
    } else {
        Vec::new()
    };
    let mut out = Vec::with_capacity(gens.len() + greedy.len());
    for (i, (task, _)) in tasks.iter().enumerate() {
        // Kept only where the environment scores it right (a demonstration
        // that fails its own check would teach a wrong answer as chosen).
        let demonstration = plan
            .env
            .demonstration(task)
            .filter(|d| matches!(plan.env.score(task, d), Score::Reward(r) if r == 1.0));
        let answers = gens[i * k..(i + 1) * k]
            .iter()
            .map(|g| (g, s))
            .chain(greedy.get(i).map(|g| (g, &greedy_settings)));
        for (j, (g, settings)) in answers.enumerate() {
            let variant = chosen
                .get(i * k + j)
                .filter(|_| j < k)
                .copied()
                .flatten()
                .map(|v| plan.variants[v].name.clone());
            let text = tok.decode(&g.tokens, true)?;
            let reward = match plan.env.score(task, &text) {
                Score::Reward(r) => r,
                Score::Masked(why) => {
                    *stats.masked.entry(why).or_default() += 1;
                    continue;
                }
            };
            let correct = reward == 1.0;
            stats.correct += usize::from(correct);
            stats.greedy_correct += usize::from(correct && settings.is_greedy());
            out.push(Rollout {
                prompt_id: task.task_id,
                prompt: task.prompt.clone(),
                answer: crate::reward::extract_answer(&text),
                completion: text,
                expected: task.expected.clone(),
                demonstration: demonstration.clone(),
                tokens: g.tokens.len(),
                stopped: g.stopped,
                reward,
                correct,
                sample: j,
                sampling: settings.clone(),
                model: plan.model.clone(),
                model_commit: plan.model_commit.clone(),
                adapter: plan.adapter.clone(),
                variant,
                scores: BTreeMap::new(),
            });
        }
    }
    stats.rollouts = out.len();
    Ok((out, stats))
}

/// Why a draw above `up_to` is passed over (counted in `skipped_tasks`).
pub const ABOVE_LAST_BUCKET: &str = "above_last_bucket";

/// The prompts of a rollout run: draws in order, a chunk at a time (made in
/// parallel where the environment can), each task with its prompt's
/// tokens; the draws that gave none counted in `stats` by why.
///
/// Under a cap on output lines, a draw whose environment already knows it
/// prints too many (Trace: its row's own program does, and a variant only
/// adds prints) is passed over without being made, as it would have been
/// once made: the same prompts come out, and the sandbox runs neither the
/// transform nor the variant. Such a draw counts as above the last bucket
/// even where its variant would have failed to run. A draw of the one-line
/// bucket keeps about one task in 27, and the rows' own programs already
/// print more than one line for most of the rest.
pub fn draw_prompts(
    plan: &RolloutPlan,
    stats: &mut RolloutStats,
    encode: impl Fn(&str) -> anyhow::Result<Vec<u32>>,
) -> anyhow::Result<Vec<(Task, Vec<u32>)>> {
    let mut tasks = Vec::new();
    let mut draw = plan.first_draw;
    let mut barren = 0u64;
    while tasks.len() < plan.num_prompts {
        let want = (plan.num_prompts - tasks.len()).max(8);
        let ids: Vec<u64> = (draw..draw + want as u64)
            .map(|k| env::task_id(plan.task_seed, k))
            .collect();
        let ruled_out: Vec<bool> = ids
            .iter()
            .map(|&id| {
                plan.up_to.is_some_and(|u| {
                    plan.env
                        .output_lines_at_least(id)
                        .is_some_and(|n| u.rules_out_output_lines(n))
                })
            })
            .collect();
        let to_make: Vec<u64> = ids
            .iter()
            .zip(&ruled_out)
            .filter(|&(_, &out)| !out)
            .map(|(&id, _)| id)
            .collect();
        let mut made = plan.env.tasks(&to_make).into_iter();
        for out in ruled_out {
            if tasks.len() == plan.num_prompts {
                break;
            }
            draw += 1;
            let made = match out {
                true => {
                    stats.unmade += 1;
                    Err(ABOVE_LAST_BUCKET.to_owned())
                }
                false => made.next().expect("the environment makes every task asked"),
            };
            let why = match made {
                Ok(task) if plan.up_to.is_some_and(|u| !u.admits(&task.difficulty)) => {
                    ABOVE_LAST_BUCKET.to_owned()
                }
                Ok(task) => {
                    let ids = encode(&task.prompt)?;
                    if ids.is_empty() || ids.len() > plan.max_prompt_tokens {
                        "prompt_too_long".to_owned()
                    } else {
                        barren = 0;
                        tasks.push((task, ids));
                        continue;
                    }
                }
                Err(why) => why,
            };
            *stats.skipped_tasks.entry(why).or_default() += 1;
            barren += 1;
            anyhow::ensure!(
                barren < MAX_BARREN_DRAWS,
                "{barren} draws in a row of the {} environment gave no usable prompt ({:?})\nhint: check the dataset, raise --max_prompt_tokens, or admit more buckets (--last_bucket)",
                plan.env.name(),
                stats.skipped_tasks
            );
        }
    }
    stats.next_draw = draw;
    stats.prompts = tasks.len();
    Ok(tasks)
}

/// Writes `rows` as JSON lines at `path`, atomically.
pub fn write_jsonl<T: Serialize>(path: &Path, rows: &[T]) -> anyhow::Result<()> {
    let mut text = String::new();
    for r in rows {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    crate::atomic::write(path, text.as_bytes())
}

/// Reads JSON lines of `T` (`what` names a line in errors); blank lines
/// are skipped, anything else that does not parse stops with the file,
/// the line and why.
pub fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &Path, what: &str) -> anyhow::Result<Vec<T>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!(
                "`{}` line {}: not a {what}: {e}\nhint: each line is one JSON object as `trace-train {}` writes it",
                path.display(),
                i + 1,
                if what == "rollout" { "rollouts" } else { "prefs" }
            )
        })?;
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_line_is_named_with_its_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let good = serde_json::json!({
            "prompt_id": 1, "prompt": "p", "completion": "c", "answer": "c",
            "expected": "c", "tokens": 1, "stopped": true, "reward": 1.0,
            "correct": true, "sample": 0,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8, "seed": 1},
            "model": "m", "model_commit": null, "adapter": null
        });
        let mut bad = good.clone();
        bad.as_object_mut().unwrap().remove("reward");
        std::fs::write(&p, format!("{good}\n\n{bad}\n")).unwrap();
        let e = read_jsonl::<Rollout>(&p, "rollout")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("missing field `reward`"), "{e}");
        assert!(e.contains("r.jsonl"), "{e}");
        std::fs::write(&p, format!("{good}\n")).unwrap();
        let rows = read_jsonl::<Rollout>(&p, "rollout").unwrap();
        assert_eq!(rows.len(), 1);
        // Written back, read back: the same.
        write_jsonl(&p, &rows).unwrap();
        assert_eq!(read_jsonl::<Rollout>(&p, "rollout").unwrap(), rows);
    }
}
