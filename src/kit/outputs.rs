//! What a finished stage leaves: the adapter in PEFT's layout (`final/`),
//! the merged model with the base's tokenizer files (`merged/`), each with
//! its model card and `generation_config.json` ([`super::card`]), and
//! `train_config.json`, the settings the run used.

use std::path::Path;

use super::card;
use crate::data::tokenizer::ChatTokenizer;
use crate::model::{self, LoadedModel};

/// How a run ended and where its outputs are.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ending {
    /// `final/`: the adapter in PEFT's layout.
    pub final_dir: std::path::PathBuf,
    /// `merged/`: the adapter merged into the base.
    pub merged_dir: std::path::PathBuf,
    /// Stopped by a signal, after saving a checkpoint (no outputs).
    pub interrupted: bool,
    /// A stop signal came, whether or not it cut the run.
    pub stop_requested: bool,
}

/// A run's `final/` (the adapter) and `merged/` folders.
pub fn dirs(output_dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    (output_dir.join("final"), output_dir.join("merged"))
}

/// The adapter of `loaded` in `final_dir`, the merged model in
/// `merged_dir` (Stages 1, 2 and 3 and DPO alike).
pub fn write_adapter_and_merged(
    loaded: &LoadedModel,
    tok: &ChatTokenizer,
    base_dir: &Path,
    info: &card::CardInfo,
    final_dir: &Path,
    merged_dir: &Path,
) -> anyhow::Result<()> {
    model::io::adapter::save(loaded, final_dir, &info.base_model)?;
    // The merge copies the base's config, tokenizer files and chat template
    // (`adapter::COPIED_FILES`) beside the weights.
    model::io::adapter::merge(loaded, merged_dir)?;
    let generation = card::generation_config(base_dir, tok)?;
    card::write(final_dir, info, card::Kind::Adapter, &generation)?;
    card::write(merged_dir, info, card::Kind::Merged, &generation)?;
    Ok(())
}

/// `train_config.json` in `output_dir`: what the run was given, as the
/// recipe chooses to record it (atomic).
pub fn write_train_config(output_dir: &Path, settings: &serde_json::Value) -> anyhow::Result<()> {
    crate::atomic::write(
        &output_dir.join("train_config.json"),
        serde_json::to_string_pretty(settings)?.as_bytes(),
    )
}
