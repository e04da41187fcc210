//! Eval items from the held-out short set ([`crate::dataset::builtin::heldout_short`]):
//! programs no training split holds, each printing one to three lines.
//!
//! Each program goes through the transform in the sandbox, as `generate`
//! does: that gives its difficulty features (loop depth, program lines)
//! and, for transformed prompts, its `__DBG_` variants under the
//! environment's seeds (task id `r + v*N`). Original prompts take the
//! recorded output as ground truth; a transformed variant's ground truth
//! is its own sandboxed run, stripped, as the environment computes it.

use std::collections::BTreeMap;

use rayon::prelude::*;

use super::EvalItem;
use crate::config::SeedScheme;
use crate::data::buckets::Difficulty;
use crate::dataset::builtin;
use crate::prompt;
use crate::reward::python_strip;
use crate::sandbox::{Executor, Limits, Request, Status};
use crate::transform;

/// Which prompt the items carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptKind {
    /// The unmodified program (Stage 1's prompt).
    Original,
    /// The program with the environment's `__DBG_` prints (its prompt).
    Transformed,
}

impl PromptKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "original" => Some(Self::Original),
            "transformed" => Some(Self::Transformed),
            _ => None,
        }
    }
}

/// How the held-out items are made.
#[derive(Debug, Clone)]
pub struct Options {
    pub prompt: PromptKind,
    /// Transformed variants a program (ignored for original prompts).
    pub variants: usize,
    pub max_injections: usize,
    pub limits: Limits,
    /// Only the first N programs (None: all). With original prompts (one
    /// item a program) the items are those of all programs, cut at N.
    pub programs: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            prompt: PromptKind::Original,
            variants: 1,
            max_injections: 6,
            limits: Limits {
                wall_ms: 10_000,
                ..Limits::default()
            },
            programs: None,
        }
    }
}

/// The items, in program order, and the programs or variants left out by
/// reason (a variant that fails or writes on stderr).
pub fn short_items(
    exec: &Executor,
    opts: &Options,
) -> anyhow::Result<(Vec<EvalItem>, BTreeMap<String, u64>)> {
    let mut rows = builtin::heldout_short();
    // The seeds count every program, whatever is kept.
    let n = rows.len() as u64;
    if let Some(p) = opts.programs {
        rows.truncate(p);
    }
    let per_row: Vec<anyhow::Result<(Vec<EvalItem>, Vec<String>)>> = exec.install(|| {
        rows.par_iter()
            .map(|row| {
                let seeds: Vec<u64> = match opts.prompt {
                    PromptKind::Original => Vec::new(),
                    PromptKind::Transformed => (0..opts.variants as u64)
                        .map(|v| SeedScheme::Env.seed(row.index, v, n))
                        .collect(),
                };
                let t = transform::parse_outcome(&exec.run(&transform::request(
                    &row.program,
                    &seeds,
                    opts.max_injections,
                    opts.limits,
                )))
                .map_err(|e| anyhow::anyhow!("held-out program `{}`: {e}", row.name))?;
                let difficulty = |injections, expected: &str| Difficulty {
                    loop_depth: Some(t.features.loop_depth),
                    lines: Some(t.features.lines),
                    injections,
                    output_lines: u32::try_from(expected.lines().count()).ok(),
                };
                let mut items = Vec::new();
                let mut dropped = Vec::new();
                match opts.prompt {
                    PromptKind::Original => {
                        let expected = python_strip(row.output.as_deref().unwrap_or_default());
                        items.push(EvalItem {
                            id: format!("short:{}", row.name),
                            prompt: prompt::original_prompt(&row.program, &row.inputs),
                            expected: expected.to_owned(),
                            difficulty: difficulty(None, expected),
                        });
                    }
                    PromptKind::Transformed => {
                        for v in &t.variants {
                            let out = exec.run(&Request {
                                program: v.code.as_bytes().to_vec(),
                                stdin: row.inputs.as_bytes().to_vec(),
                                limits: opts.limits,
                            });
                            let truth = match std::str::from_utf8(&out.stdout) {
                                Ok(s) if out.status == Status::Ok && out.stderr.is_empty() => {
                                    python_strip(s).to_owned()
                                }
                                Ok(_) if out.status == Status::Ok => {
                                    dropped.push("variant_stderr".to_owned());
                                    continue;
                                }
                                Ok(_) => {
                                    dropped.push(format!("variant_{}", out.status.as_str()));
                                    continue;
                                }
                                Err(_) => {
                                    dropped.push("variant_non_utf8_output".to_owned());
                                    continue;
                                }
                            };
                            items.push(EvalItem {
                                id: format!("short:{}:{}", row.name, v.seed),
                                prompt: prompt::trace_prompt(&v.code, &row.inputs),
                                difficulty: difficulty(Some(v.injections), &truth),
                                expected: truth,
                            });
                        }
                    }
                }
                Ok((items, dropped))
            })
            .collect()
    });
    let mut items = Vec::new();
    let mut dropped = BTreeMap::new();
    for r in per_row {
        let (i, d) = r?;
        items.extend(i);
        for reason in d {
            *dropped.entry(reason).or_default() += 1;
        }
    }
    Ok((items, dropped))
}
