//! One convention for every subcommand, applied to the parsed-from-derive
//! command before it reads the arguments:
//!
//! - flags and subcommands in snake_case, as the seed's scripts,
//!   transformers' `TrainingArguments` and TRL spell them
//!   (`--learning_rate`, `--no_4bit`); a kebab-case spelling
//!   (`--unsafe-no-sandbox`, `model import-gguf`) stays accepted as a
//!   hidden alias, so nothing that ran before breaks (a subcommand's own
//!   derive names it so);
//! - negative numbers are values (`--learning_rate -1e-4` reaches the
//!   check that refuses it, instead of being read as an unknown flag):
//!   [`negative_values`] joins such a value to its flag before clap reads
//!   the line (clap's own setting does not take `-1e-4`);
//! - each subcommand's options grouped under headings ([`HEADINGS`]), with
//!   examples after them ([`EXAMPLES`]).
//!
//! Kept in one table rather than an attribute on each of some 300 fields, so
//! that a flag's heading is decided once for every subcommand that has it.

use std::ffi::OsString;

use clap::Command;

/// Option headings by flag name (the same flag has the same heading in
/// every subcommand); a flag not listed stays under "Options".
const HEADINGS: [(&str, &[&str]); 9] = [
    (
        "Model",
        &["model", "revision", "adapter", "max_length", "name"],
    ),
    (
        "Data",
        &[
            "train_file",
            "eval_file",
            "dataset",
            "data",
            "pairs",
            "rollouts",
            "environment",
            "tasks",
            "task_id",
            "task_offset",
            "split",
            "heldout",
            "prompt",
            "variants",
            "trace_dataset",
            "abd_dataset",
            "ded_dataset",
            "hub_file",
            "max_samples",
            "max_injections",
            "curriculum",
            "num_prompts",
            "first_draw",
            "max_rows",
            "last_bucket",
            "bucket_feature",
            "balance_lines",
            "balance_ratio",
            "balance_by",
            "seed_scheme",
            "skip_bad",
            "stdin",
        ],
    ),
    (
        "Training",
        &[
            "epochs",
            "batch_size",
            "gradient_accumulation_steps",
            "micro_batch_tokens",
            "packing",
            "learning_rate",
            "lora_r",
            "seed",
            "max_steps",
            "num_train_steps",
            "algorithm",
            "group_size",
            "kl_coef",
            "loss",
            "beta",
            "nll_coef",
            "reference",
            "sampler_ranks",
            "select_metric",
            "select_every_steps",
            "select_set",
            "select_limit",
            "select_max_new_tokens",
            "select_batch_size",
        ],
    ),
    (
        "Sampling",
        &[
            "max_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "num_samples",
            "greedy",
            "max_prompt_tokens",
            "max_turns",
            "max_steps_per_episode",
            "feedback",
            "limit",
        ],
    ),
    (
        "Output",
        &[
            "output_dir",
            "output",
            "checkpoints",
            "save_steps",
            "force",
            "json",
            "plot",
        ],
    ),
    (
        "Settings",
        &[
            "config",
            "pipeline_config",
            "set",
            "quick_test",
            "b200",
            "start_stage",
            "last_stage",
            "resume",
        ],
    ),
    (
        "Hardware",
        &[
            "device",
            "num_gpus",
            "base_precision",
            "no_4bit",
            "load_in_4bit",
            "gradient_checkpointing",
            "num_workers",
            "python",
        ],
    ),
    ("Safety", &["unsafe_no_sandbox", "cpu_seconds", "wall_ms"]),
    ("Logging", &["verbose", "log_format", "log_every", "color"]),
];

/// Examples shown after each subcommand's options, by its path.
const EXAMPLES: [(&str, &str); 33] = [
    (
        "generate",
        "trace-train generate                                  # the built-in corpus, config/generate.json\n  trace-train generate --dataset builtin+humaneval:HumanEval.jsonl.gz --output_dir data",
    ),
    (
        "warmup",
        "trace-train warmup --model Qwen/Qwen3-4B             # Stage 1 into checkpoints/stage1_warmup\n  trace-train warmup --set learning_rate=1e-4 --resume",
    ),
    (
        "sft",
        "trace-train sft                                       # Stage 2, from checkpoints/stage1_warmup/merged\n  trace-train sft --num_gpus 4 --resume                 # a checkpoint resumes on any number of GPUs",
    ),
    (
        "ppo",
        "trace-train ppo --algorithm grpo --group_size 8       # from checkpoints/stage2_sft/merged\n  trace-train ppo --quick_test                          # a few steps on a tiny model, seconds",
    ),
    (
        "rollouts",
        "trace-train rollouts --model checkpoints/stage2_sft/merged --num_prompts 256 --num_samples 8 --output rollouts.jsonl",
    ),
    (
        "prefs",
        "trace-train prefs --rollouts rollouts.jsonl --output pairs.jsonl --max_pairs_per_prompt 4",
    ),
    (
        "dpo",
        "trace-train dpo --pairs pairs.jsonl --loss sigmoid --beta 0.1\n  trace-train dpo --pairs pairs.jsonl --resume",
    ),
    (
        "eval",
        "trace-train eval --model checkpoints/stage2_sft/merged --output sft.json\n  trace-train eval --model checkpoints/stage3_ppo/merged --heldout short\n  trace-train eval --compare warmup.json sft.json        # two Trace reports side by side",
    ),
    (
        "pipeline",
        "trace-train pipeline --quick_test                     # every stage in a minute on a tiny model\n  trace-train pipeline --b200 --set stage1.learning_rate=1e-4\n  trace-train pipeline --resume                         # skip finished stages, resume the stopped one",
    ),
    (
        "serve",
        "trace-train serve --model checkpoints/stage3_ppo/merged --port 8001\n  trace-train serve --model Qwen/Qwen3-4B --adapter sft=runs/sft/final --adapter rl=runs/rl/final   # both, one base",
    ),
    ("report", "trace-train report checkpoints/quick"),
    ("task", "trace-train task --environment sat --task_id 42"),
    (
        "compare",
        "trace-train eval --model a/merged --environment sat+abd+ded --output a.json   # reports from `eval --environment`\n  trace-train compare a.json b.json --plot standings.png",
    ),
    (
        "config",
        "trace-train config                                    # check config/, then every setting\n  trace-train config pipeline --b200                    # the settings those flags give\n  trace-train config my_run.json --reference",
    ),
    (
        "config pipeline",
        "trace-train config pipeline --b200 --set stage1.learning_rate=1e-4",
    ),
    (
        "config warmup",
        "trace-train config warmup --batch_size 2 --json",
    ),
    (
        "config sft",
        "trace-train config sft --set lora_dropout=0.1",
    ),
    (
        "init",
        "trace-train init my-run && cd my-run && trace-train config",
    ),
    ("env", "trace-train env --json"),
    (
        "model import_gguf",
        "trace-train model import_gguf SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m",
    ),
    ("model tiny", "trace-train model tiny models/tiny"),
    (
        "model merge",
        "trace-train model merge --base Qwen/Qwen3-4B --adapter checkpoints/stage2_sft/final --output_dir merged --dtype bf16",
    ),
    (
        "model export",
        "trace-train model export --gguf checkpoints/stage3_ppo/merged --output model.gguf --outtype q8_0",
    ),
    (
        "completions",
        "trace-train completions bash > ~/.local/share/bash-completion/completions/trace-train",
    ),
    (
        "push",
        "trace-train push checkpoints/stage3_ppo/merged --repo me/trace-qwen3-4b --private",
    ),
    (
        "sandbox run",
        "trace-train sandbox run prog.py --stdin in.txt",
    ),
    ("sandbox check", "trace-train sandbox check"),
    (
        "bench train",
        "trace-train bench train --model qwen3-4b --batch_size 4 --seq 1024 --gradient_checkpointing",
    ),
    (
        "bench gen",
        "trace-train bench gen --model qwen3-4b --batch_size 32 --prompt 256 --max_new_tokens 256",
    ),
    (
        "bench rl",
        "trace-train bench rl --model qwen3-4b --algorithm grpo --batch_size 16 --group_size 8 --max_new_tokens 512",
    ),
    (
        "bench serve",
        "trace-train bench serve --model checkpoints/stage2_sft/merged --clients 32",
    ),
    ("bench sandbox", "trace-train bench sandbox --json out.json"),
    (
        "bench fp8",
        "trace-train bench fp8 --model qwen3-4b --tokens 4096",
    ),
];

/// `cmd` and its subcommands, all levels, with the convention applied.
pub fn apply(cmd: Command) -> Command {
    apply_at(cmd, "")
}

/// The command line with each negative number that follows a long flag
/// joined to it (`--learning_rate -1e-4` becomes `--learning_rate=-1e-4`),
/// so that it is read as the flag's value, not as short flags.
pub fn negative_values(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    for a in args {
        let joins = a.to_str().is_some_and(is_negative_number)
            && out
                .last()
                .and_then(|p| p.to_str())
                .is_some_and(|p| p.starts_with("--") && p.len() > 2 && !p.contains('='));
        match out.last_mut() {
            Some(flag) if joins => {
                flag.push("=");
                flag.push(&a);
            }
            _ => out.push(a),
        }
    }
    out
}

/// `-1`, `-0.5`, `-1e-4`, `-.5`, `-2E+3`: a minus sign and a number.
fn is_negative_number(s: &str) -> bool {
    s.strip_prefix('-').is_some_and(|n| {
        !n.is_empty()
            && n.starts_with(|c: char| c.is_ascii_digit() || c == '.')
            && n.parse::<f64>().is_ok()
    })
}

fn apply_at(mut cmd: Command, path: &str) -> Command {
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().as_str().to_owned())
        .collect();
    for id in ids {
        cmd = cmd.mut_arg(&id, |mut a| {
            if let Some(long) = a.get_long().filter(|l| l.contains('-')).map(str::to_owned) {
                a = a.long(long.replace('-', "_")).alias(long);
            }
            // A value named after the field (`--batch_size <BATCH>`) is
            // named after the flag instead.
            if let Some(long) = a.get_long().map(str::to_owned)
                && let Some([name]) = a.get_value_names()
                && *name == a.get_id().as_str().to_uppercase()
                && long != a.get_id().as_str()
            {
                a = a.value_name(long.to_uppercase());
            }
            if a.get_help_heading().is_none()
                && let Some(long) = a.get_long()
                && let Some((heading, _)) = HEADINGS.iter().find(|(_, names)| names.contains(&long))
            {
                a = a.help_heading(*heading);
            }
            a
        });
    }
    if let Some((_, ex)) = EXAMPLES.iter().find(|(p, _)| *p == path)
        && cmd.get_after_help().is_none()
    {
        cmd = cmd.after_help(format!("Examples:\n  {ex}"));
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    // Subcommands are named in their derive (a renamed one would not be
    // found by the derive's reading of the matches): `model import_gguf`
    // with its alias `import-gguf` there.
    for name in names {
        let sub_path = match path {
            "" => name.clone(),
            p => format!("{p} {name}"),
        };
        cmd = cmd.mut_subcommand(&name, |sub| apply_at(sub, &sub_path));
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_number_after_a_flag_is_its_value() {
        let line = |s: &str| -> Vec<String> {
            negative_values(s.split(' ').map(OsString::from))
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            line("t warmup --learning_rate -1e-4 --seed -3 --set x=-1 -v"),
            [
                "t",
                "warmup",
                "--learning_rate=-1e-4",
                "--seed=-3",
                "--set",
                "x=-1",
                "-v"
            ]
        );
        // Not after a flag, a flag with its value given, or not a number.
        assert_eq!(
            line("t -1 --a=2 -5 --b -x --c -.5"),
            ["t", "-1", "--a=2", "-5", "--b", "-x", "--c=-.5"]
        );
        assert!(
            !is_negative_number("-inf") && !is_negative_number("-") && !is_negative_number("-e5")
        );
    }

    /// Every heading's flags and every example's subcommand exist: a
    /// renamed flag or subcommand must move its table entry with it.
    #[test]
    fn the_tables_name_what_exists() {
        let cmd = apply(<crate::Cli as clap::CommandFactory>::command());
        let mut longs = std::collections::BTreeSet::new();
        let mut paths = std::collections::BTreeSet::new();
        fn walk(
            c: &Command,
            path: &str,
            longs: &mut std::collections::BTreeSet<String>,
            paths: &mut std::collections::BTreeSet<String>,
        ) {
            for a in c.get_arguments() {
                if let Some(l) = a.get_long() {
                    longs.insert(l.to_owned());
                }
            }
            for s in c.get_subcommands() {
                let p = match path {
                    "" => s.get_name().to_owned(),
                    p => format!("{p} {}", s.get_name()),
                };
                paths.insert(p.clone());
                walk(s, &p, longs, paths);
            }
        }
        walk(&cmd, "", &mut longs, &mut paths);
        for (heading, names) in HEADINGS {
            for n in names {
                assert!(longs.contains(*n), "{heading}: no flag --{n}");
            }
        }
        for (path, _) in EXAMPLES {
            assert!(paths.contains(path), "no subcommand `{path}`");
        }
        // Every command that runs something shows an example.
        for p in &paths {
            let leaf = !paths.iter().any(|q| q.starts_with(&format!("{p} ")));
            let help = p == "help" || p.ends_with(" help");
            assert!(
                !leaf || help || EXAMPLES.iter().any(|(e, _)| e == p),
                "`{p}` has no example"
            );
        }
        // Every flag and subcommand is snake_case now.
        assert!(longs.iter().all(|l| !l.contains('-')), "{longs:?}");
        assert!(paths.iter().all(|p| !p.contains('-')), "{paths:?}");
    }
}
