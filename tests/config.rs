//! Every shipped config file parses and validates.

use std::path::Path;

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
        (c.ppo.batch_size, c.ppo.learning_rate, c.ppo.num_train_steps),
        (16, 5e-7, 5000)
    );
    assert!(c.curriculum.enabled && c.curriculum.promotion_threshold == 0.7);
}
