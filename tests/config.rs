//! Every shipped config file parses and validates.

use std::path::Path;

use trace_train::config::{self, GenerateConfig, PipelineConfig, RlConfig, SftConfig};

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
            "ppo" => config::load::<RlConfig>(&path).map(|_| ()),
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
