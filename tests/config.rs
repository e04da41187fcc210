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
