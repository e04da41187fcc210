//! Every shipped config file parses and validates; the Python pipeline's
//! own file loads and resolves to what it says; `trace-train config` shows
//! each setting with where it came from.

mod common;

use std::path::Path;

use common::{stderr, trace_train};

use trace_train::config::{self, GenerateConfig, PipelineConfig, SftConfig, Stage3Config};

#[test]
fn every_shipped_config_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let r = match stem.as_str() {
            "pipeline_config" => config::load::<PipelineConfig>(&path).map(|_| ()),
            "generate" => config::load::<GenerateConfig>(&path).map(|_| ()),
            "warmup" | "sft" => config::load::<SftConfig>(&path).map(|_| ()),
            "stage3_ppo_config" => config::load::<Stage3Config>(&path).map(|_| ()),
            other => panic!("config/{other}.json has no test: add it here"),
        };
        r.unwrap_or_else(|e| panic!("{e}"));
        seen += 1;
    }
    assert!(seen >= 5, "expected the five shipped configs, saw {seen}");
}

/// The recipes under `config/recipes/` (a pipeline config each, measured
/// on the model it is named for) load as `pipeline --config` loads them.
#[test]
fn every_recipe_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/recipes");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path().join("pipeline_config.json");
        let p: PipelineConfig = config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            p.stage1.optim.learning_rate > 0.0 && p.stage2.optim.learning_rate > 0.0,
            "{}",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 1, "no recipe found under {}", dir.display());
}

#[test]
fn pipeline_config_matches_the_stage_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let p: PipelineConfig = config::load(&dir.join("pipeline_config.json")).unwrap();
    let g: GenerateConfig = config::load(&dir.join("generate.json")).unwrap();
    assert_eq!(
        serde_json::to_value(&p.stage0).unwrap(),
        serde_json::to_value(&g).unwrap()
    );
    assert_eq!(p.model.name, "Qwen/Qwen3-4B");
}

/// The Python pipeline's `config/pipeline_config.json`, exactly as its
/// users have it.
const USER_PIPELINE: &str = include_str!("fixtures/user_pipeline_config.json");

/// `trace-train ARGS --json` in `dir`, parsed.
fn settings(dir: &Path, args: &[&str]) -> serde_json::Value {
    let mut args = args.to_vec();
    args.push("--json");
    let o = trace_train(dir, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_python_pipelines_file_resolves_the_pipeline_to_what_it_says() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/pipeline_config.json"),
        USER_PIPELINE,
    )
    .unwrap();
    let s = settings(dir.path(), &["config", "pipeline"]);
    let value = |k: &str| s[k]["value"].clone();
    let from = |k: &str| {
        let e = &s[k];
        match e["from"].as_str().unwrap() {
            "file" => format!("file {}", e["key"].as_str().unwrap()),
            "preset" => format!("preset {}", e["by"].as_str().unwrap()),
            "flag" => format!("flag {}", e["flag"].as_str().unwrap()),
            other => other.to_owned(),
        }
    };
    assert_eq!(value("model.name"), "Qwen/Qwen3-4B");
    assert_eq!(from("model.name"), "file model.base_model");
    assert_eq!(value("hardware.b200_mode"), true);
    // b200_mode is the --b200 preset: bf16 weights, no checkpointing,
    // micro-batches of 8 x 4.
    assert_eq!(value("model.base_precision"), "bf16");
    assert_eq!(from("model.base_precision"), "preset hardware.b200_mode");
    assert_eq!(value("hardware.gradient_checkpointing"), false);
    assert_eq!(value("stage1.batch_size"), 8);
    assert_eq!(value("stage2.gradient_accumulation_steps"), 4);
    // Stage 3: larger training micro-batches (a token budget).
    assert_eq!(value("stage3.ppo.micro_batch_tokens"), 12288);
    assert_eq!(
        from("stage3.ppo.micro_batch_tokens"),
        "preset hardware.b200_mode"
    );
    assert_eq!(
        value("stage3.ppo.gradient_checkpointing"),
        serde_json::Value::Null
    );
    assert_eq!(value("stage0.variants"), 3);
    assert_eq!(from("stage0.variants"), "file stage0.variants_per_sample");
    assert_eq!(value("stage0.num_workers"), 32);
    assert_eq!(
        (value("stage1.epochs"), value("stage2.epochs")),
        (2.into(), 3.into())
    );
    assert_eq!(value("stage3.ppo.num_train_steps"), 5000);
    assert_eq!(from("stage3.ppo.num_train_steps"), "file stage3.num_steps");
    assert_eq!(from("stage1.learning_rate"), "default");
    // The user's folder layout.
    assert_eq!(value("stage1.output_dir"), "checkpoints/stage1_warmup");
    assert_eq!(value("stage2.output_dir"), "checkpoints/stage2_sft");
    assert_eq!(
        value("stage2.train_file"),
        "datasets/trace_training/stage2_transformed_train.jsonl"
    );
    // A flag wins, and says so.
    let s = settings(
        dir.path(),
        &["config", "pipeline", "--device", "cpu", "--revision", "v2"],
    );
    assert_eq!(s["hardware.device"]["value"], "cpu");
    assert_eq!(s["hardware.device"]["flag"], "--device");
    assert_eq!(s["model.revision"]["value"], "v2");

    // The stages run alone read the same file's model and hardware.
    let s = settings(dir.path(), &["config", "warmup"]);
    assert_eq!(s["base_model"]["value"], "Qwen/Qwen3-4B");
    assert_eq!(s["output_dir"]["value"], "checkpoints/stage1_warmup");
    assert_eq!(s["batch_size"]["value"], 8);
    let s = settings(dir.path(), &["config", "sft", "--batch_size", "3"]);
    assert_eq!(s["base_model"]["value"], "checkpoints/stage1_warmup/merged");
    assert_eq!(s["output_dir"]["value"], "checkpoints/stage2_sft");
    assert_eq!(s["batch_size"]["value"], 3);
    assert_eq!(s["batch_size"]["flag"], "--batch_size");

    // `config` alone shows Stage 3 too, under the same preset.
    std::fs::write(
        dir.path().join("config/stage3_ppo_config.json"),
        r#"{"ppo": {"batch_size": 8, "gradient_checkpointing": true}}"#,
    )
    .unwrap();
    let s = settings(dir.path(), &["config"]);
    let ppo = &s["ppo"];
    assert_eq!(ppo["ppo.micro_batch_tokens"]["value"], 12288);
    assert_eq!(ppo["ppo.micro_batch_tokens"]["by"], "hardware.b200_mode");
    assert_eq!(ppo["ppo.gradient_checkpointing"]["value"], true);
    assert_eq!(ppo["ppo.gradient_checkpointing"]["from"], "file");
    assert_eq!(ppo["ppo.batch_size"]["value"], 8);
}

#[test]
fn config_checks_the_shipped_files_and_shows_every_stage() {
    let o = trace_train(&common::repo(), &["config"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("ok  config/pipeline_config.json"), "{out}");
    for title in [
        "== pipeline",
        "== generate",
        "== warmup",
        "== sft",
        "== ppo",
    ] {
        assert!(out.contains(title), "missing {title}: {out}");
    }
    // Stage 3's memory settings, with where they came from.
    for key in [
        "stage3.ppo.micro_batch_tokens ",
        "ppo.micro_batch_tokens ",
        "ppo.gradient_checkpointing ",
    ] {
        assert!(
            out.lines().any(
                |l| l.starts_with(key) && (l.ends_with("default") || l.contains("  default  "))
            ),
            "missing {key}: {out}"
        );
    }
    // Each value has its meaning beside it, from the reference.
    assert!(
        out.lines().any(|l| l.starts_with("ppo.micro_batch_tokens ")
            && l.ends_with(
                "Tokens one training pass holds at once (old and reference log-probs, va…"
            )),
        "{out}"
    );
    // The shipped file uses the Python pipeline's names.
    assert!(
        out.lines()
            .any(|l| l.starts_with("model.name ") && l.contains("(model.base_model)")),
        "{out}"
    );
}

#[test]
fn a_misspelled_key_is_refused_with_file_line_and_expected_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pipeline_config.json");
    std::fs::write(
        &path,
        USER_PIPELINE.replace("\"variants_per_sample\"", "\"variant_per_sample\""),
    )
    .unwrap();
    let o = trace_train(dir.path(), &["config", path.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = stderr(&o);
    for want in [
        "pipeline_config.json",
        "line 4",
        "unknown field `variant_per_sample`",
        "`variants`",
        "`num_workers`",
        "may also be written `variants_per_sample`",
        "hint:",
    ] {
        assert!(err.contains(want), "missing {want}: {err}");
    }
}

#[test]
fn a_config_in_the_layout_before_per_stage_line_filters_still_loads() {
    // `config/generate.json` as shipped before the line filters were split:
    // `filters.min_output_lines` applied to both sets.
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/generate_config_before_line_filters.json");
    let g: GenerateConfig = config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    // It now means what its documentation said: the transformed set's
    // minimum. The original set keeps every length.
    assert_eq!(g.filters.lines(true).min_output_lines, 3);
    assert_eq!(g.filters.lines(false).min_output_lines, 1);
}

#[test]
fn shipped_configs_keep_every_output_length() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let g: GenerateConfig = config::load(&dir.join("generate.json")).unwrap();
    for transformed in [false, true] {
        let f = g.filters.lines(transformed);
        assert!(f.admits(1) && f.admits(2), "{f:?}");
    }
}

#[test]
fn the_shipped_stage3_file_is_the_users_text_and_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/stage3_ppo_config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.trim(),
        r#"{"ppo": {"batch_size": 16, "learning_rate": 5e-7, "num_train_steps": 5000}, "curriculum": {"enabled": true, "promotion_threshold": 0.7}}"#
    );
    let c: Stage3Config = config::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            c.ppo.batch_size,
            c.ppo.optim.learning_rate,
            c.ppo.num_train_steps
        ),
        (16, 5e-7, 5000)
    );
    assert!(c.curriculum.enabled && c.curriculum.promotion_threshold == 0.7);
}

/// docs/reference/config.md is what `trace-train config --reference`
/// prints: a key added, renamed or re-documented in the code without
/// regenerating the file fails here.
#[test]
fn the_committed_config_reference_matches_the_code() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/config.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let made = config::reference::markdown();
    if committed != made {
        let first = committed
            .lines()
            .zip(made.lines())
            .position(|(a, b)| a != b)
            .map_or(committed.lines().count().min(made.lines().count()), |i| i);
        panic!(
            "docs/reference/config.md differs from the code at line {}\nhint: cargo run --release -- config --reference > docs/reference/config.md",
            first + 1
        );
    }
    // The binary prints the same text.
    let o = trace_train(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &["config", "--reference"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap(), made);
}

/// `--base_precision` goes over the file (whichever name it used) and the
/// preset, and is the setting's source; `--no_4bit` is its other name for
/// bf16; the two disagreeing, or a value not one of the three, is refused.
#[test]
fn the_base_precision_flag_overrides_the_file_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/pipeline_config.json"),
        r#"{"model": {"load_in_4bit": false}}"#,
    )
    .unwrap();
    for cmd in ["pipeline", "warmup", "sft"] {
        let s = settings(dir.path(), &["config", cmd]);
        let e = &s["model.base_precision"];
        assert_eq!(
            (&e["value"], &e["key"]),
            (&"bf16".into(), &"model.load_in_4bit".into()),
            "{cmd}"
        );
        assert!(s.get("model.load_in_4bit").is_none(), "{cmd}");
        let s = settings(dir.path(), &["config", cmd, "--base_precision", "fp8"]);
        let e = &s["model.base_precision"];
        assert_eq!(
            (&e["value"], &e["flag"]),
            (&"fp8".into(), &"--base_precision".into()),
            "{cmd}"
        );
        let s = settings(
            dir.path(),
            &["config", cmd, "--no_4bit", "--base_precision", "bf16"],
        );
        assert_eq!(s["model.base_precision"]["value"], "bf16", "{cmd}");
    }
    let s = settings(
        dir.path(),
        &["config", "pipeline", "--b200", "--base_precision", "nf4"],
    );
    assert_eq!(s["model.base_precision"]["value"], "nf4");
    assert_eq!(s["model.base_precision"]["flag"], "--base_precision");
    let s = settings(dir.path(), &["config", "pipeline", "--no_4bit"]);
    assert_eq!(s["model.base_precision"]["flag"], "--no_4bit");
    let o = trace_train(
        dir.path(),
        &["config", "warmup", "--no_4bit", "--base_precision", "fp8"],
    );
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("--no_4bit and --base_precision fp8") && err.contains("hint:"),
        "{err}"
    );
    for cmd in ["pipeline", "ppo", "dpo", "eval", "serve"] {
        let o = trace_train(dir.path(), &[cmd, "--base_precision", "fp16"]);
        let err = stderr(&o);
        assert!(
            !o.status.success() && err.contains("`fp16` is not bf16, nf4 or fp8"),
            "{cmd}: {err}"
        );
    }
}

/// `--set KEY=VALUE` overrides one setting over the file, shown as a flag
/// in `config`; a misspelt key or a wrong type is refused with the
/// override named, every bad override at once.
#[test]
fn dotted_overrides_set_one_setting_and_bad_ones_are_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = trace_train(
        root,
        &[
            "config",
            "pipeline",
            "--set",
            "stage1.learning_rate=1e-4",
            "--set",
            "stage3.ppo.algorithm=grpo",
            "--set",
            "stage1.select.metric=last",
            // The Python pipeline's names set ours, as they do in a file.
            "--set",
            "model.base_model=/models/mine",
            "--set",
            "hardware.no_4bit=true",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    for (key, value) in [
        ("model.name ", "\"/models/mine\""),
        ("model.base_precision ", "\"bf16\""),
        ("stage1.learning_rate ", "0.0001"),
        ("stage3.ppo.algorithm ", "\"grpo\""),
        ("stage1.select.metric ", "\"last\""),
    ] {
        let line = out.lines().find(|l| l.starts_with(key)).unwrap_or_default();
        assert!(
            line.contains(value) && line.contains("flag --set"),
            "{key}: {line}"
        );
    }
    let o = trace_train(
        root,
        &[
            "config",
            "warmup",
            "--set",
            "learnin_rate=1e-4",
            "--set",
            "epochs=two",
        ],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    for want in [
        "--set learnin_rate=1e-4: unknown field `learnin_rate` (did you mean `learning_rate`?)",
        "--set epochs=two: invalid type: string \"two\"",
        "docs/reference/config.md",
    ] {
        assert!(err.contains(want), "missing {want}: {err}");
    }
}

/// A config file of any name is checked as what its keys say it is; one
/// whose keys fit two stages alike is refused with the way out.
#[test]
fn a_config_of_any_name_is_read_by_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, from) in [
        ("my_warmup.json", "config/warmup.json"),
        ("prod.json", "config/pipeline_config.json"),
        ("rl.json", "config/stage3_ppo_config.json"),
    ] {
        std::fs::copy(root.join(from), dir.path().join(name)).unwrap();
    }
    std::fs::write(
        dir.path().join("mine.json"),
        r#"{"loss": "ipo", "beta": 0.2}"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("amb.json"), r#"{"batch_size": 2}"#).unwrap();
    for (name, kind) in [
        ("my_warmup.json", "sft"),
        ("prod.json", "pipeline_config"),
        ("rl.json", "stage3_ppo_config"),
        ("mine.json", "dpo"),
    ] {
        let o = trace_train(dir.path(), &["config", name]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let out = String::from_utf8(o.stdout).unwrap();
        assert!(out.contains(&format!("ok  {name} ({kind})")), "{out}");
    }
    // A bad key is still found in a file of another name.
    std::fs::write(
        dir.path().join("bad.json"),
        "{\n  \"loss\": \"ipo\",\n  \"betta\": 1\n}",
    )
    .unwrap();
    let o = trace_train(dir.path(), &["config", "bad.json"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("line 3") && stderr(&o).contains("did you mean `beta`?"),
        "{}",
        stderr(&o)
    );
    let o = trace_train(dir.path(), &["config", "amb.json"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("cannot tell which config"),
        "{}",
        stderr(&o)
    );
}

/// `init DIR` writes the shipped configs into DIR/config/, which `config`
/// then reads from DIR; a second `init` refuses to replace them and
/// writes nothing, `--force` replaces them.
#[test]
fn init_writes_starter_configs_and_never_replaces_them_unasked() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let project = dir.path().join("my run");
    let o = trace_train(dir.path(), &["init", project.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for name in [
        "pipeline_config.json",
        "generate.json",
        "warmup.json",
        "sft.json",
        "stage3_ppo_config.json",
    ] {
        let written = std::fs::read(project.join("config").join(name)).unwrap();
        assert_eq!(
            written,
            std::fs::read(root.join("config").join(name)).unwrap(),
            "{name}"
        );
    }
    let o = trace_train(&project, &["config"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8(o.stdout)
            .unwrap()
            .contains("ok  config/pipeline_config.json")
    );
    let edited = project.join("config/warmup.json");
    std::fs::write(&edited, r#"{"epochs": 3}"#).unwrap();
    let o = trace_train(dir.path(), &["init", project.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("already there; nothing written"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(&edited).unwrap(),
        r#"{"epochs": 3}"#
    );
    let o = trace_train(dir.path(), &["init", project.to_str().unwrap(), "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(
        std::fs::read_to_string(&edited).unwrap(),
        r#"{"epochs": 3}"#
    );
}

/// `config | head`, `task | head`: a reader that stops early ends the
/// command quietly and with success, not with a panic about a broken pipe.
#[test]
fn output_piped_into_a_reader_that_stops_early_exits_quietly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for args in [
        &["config", "--reference"][..],
        &["task", "--environment", "sat", "--task_id", "1"],
        &["config", "pipeline", "--json"],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_trace-train"))
            .args(args)
            .current_dir(root)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The read end closes before the command has written anything.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {:?} {err}", o.status);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// The command line's convention: snake_case everywhere, the old kebab
/// and bench spellings still accepted, negative numbers read as values.
#[test]
fn old_spellings_still_parse_and_negative_numbers_are_values() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for args in [
        &[
            "bench", "train", "--batch", "2", "--accum", "2", "--gc", "--4bit", "--rank", "4",
            "--help",
        ][..],
        &[
            "bench", "rl", "--batch", "2", "--group", "4", "--new", "8", "--gc", "--help",
        ],
        &[
            "bench", "gen", "--batch", "2", "--new", "8", "--4bit", "--help",
        ],
        &["model", "import-gguf", "--help"],
        &["model", "import_gguf", "--help"],
        &[
            "task",
            "--environment",
            "sat",
            "--task_id",
            "1",
            "--unsafe-no-sandbox",
        ],
        &[
            "task",
            "--environment",
            "sat",
            "--task_id",
            "1",
            "--unsafe_no_sandbox",
        ],
    ] {
        let o = trace_train(root, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    // A negative learning rate reaches the check that names it.
    let o = trace_train(root, &["config", "warmup", "--learning_rate", "-1e-4"]);
    let err = stderr(&o);
    assert!(
        !o.status.success() && err.contains("learning_rate: -0.0001 must be positive"),
        "{err}"
    );
    // Help is grouped, with an example.
    let o = trace_train(root, &["ppo", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for want in [
        "Training:",
        "Sampling:",
        "Hardware:",
        "Examples:\n  trace-train ppo",
    ] {
        assert!(out.contains(want), "missing {want}: {out}");
    }
}

/// One run names every error of a file, each at its line, not only the
/// first.
#[test]
fn every_error_of_a_file_is_reported_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.json");
    std::fs::write(
        &file,
        "{\n  \"stage1\": {\n    \"learnin_rate\": 1e-4,\n    \"epochs\": 2\n  },\n  \"stage2\": {\n    \"epochs\": \"two\"\n  },\n  \"gate\": {\"mode\": \"warn\", \"limt\": 3}\n}\n",
    )
    .unwrap();
    let o = trace_train(dir.path(), &["config", "p.json"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    for want in [
        "at line 3",
        "learnin_rate",
        "also at line 7: `stage2.epochs`: invalid type: string \"two\"",
        "also at line 9: `gate.limt`: unknown field `limt` (did you mean `limit`?)",
    ] {
        assert!(err.contains(want), "missing {want}: {err}");
    }
}

/// `completions SHELL` prints a script that completes the subcommands and
/// the snake_case flags.
#[test]
fn completion_scripts_name_the_commands_and_flags() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for shell in ["bash", "zsh", "fish"] {
        let o = trace_train(root, &["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = String::from_utf8_lossy(&o.stdout);
        for want in [
            "pipeline",
            "import_gguf",
            "learning_rate",
            "unsafe_no_sandbox",
        ] {
            assert!(script.contains(want), "{shell}: no {want}");
        }
    }
}

/// A YAML config is read as the JSON file with the same keys would be,
/// and its errors are placed at the YAML's own lines.
#[test]
fn yaml_configs_resolve_as_json_does_and_errors_name_yaml_lines() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.json"),
        r#"{"model": {"base_model": "Org/M"}, "stage1": {"learning_rate": 1e-4, "epochs": 3}, "gate": {"mode": "off"}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        "model:\n  base_model: Org/M\nstage1:\n  learning_rate: 1.0e-4\n  epochs: 3\ngate:\n  mode: \"off\"\n",
    )
    .unwrap();
    let json = |file: &str| -> serde_json::Value {
        let o = trace_train(
            dir.path(),
            &["config", "pipeline", "--config", file, "--json"],
        );
        assert!(o.status.success(), "{file}: {}", stderr(&o));
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        // The sources name the file; everything else must agree.
        for (_, entry) in v.as_object_mut().unwrap().iter_mut() {
            entry.as_object_mut().map(|e| e.remove("path"));
        }
        v
    };
    assert_eq!(json("p.json"), json("p.yaml"));
    std::fs::write(
        dir.path().join("bad.yml"),
        "stage1:\n  learnin_rate: 1.0e-4\n  epochs: 2\nstage2:\n  epochs: two\n",
    )
    .unwrap();
    let o = trace_train(dir.path(), &["config", "bad.yml"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    for want in [
        "`bad.yml` at line 2",
        "learnin_rate",
        "also at line 5: `stage2.epochs`: invalid type: string \"two\"",
    ] {
        assert!(err.contains(want), "missing {want}: {err}");
    }
}
