//! A recipe's model for training: the tokenizer and the base model of a
//! folder with a fresh LoRA adapter on the target projections, in the
//! training dtype, its frozen projections in NF4 on a GPU when asked
//! (QLoRA).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};

use crate::config::{LoraSettings, ModelConfig};
use crate::data::tokenizer::ChatTokenizer;
use crate::model::layers::lora::{LoraConfig, TargetModule};
use crate::model::{self, LoadedModel};

/// The adapter a run trains.
#[derive(Debug, Clone, Copy)]
pub enum Adapter<'a> {
    /// A fresh one of this shape (its `B` factors zero: the model starts as
    /// its base).
    Fresh(&'a LoraConfig),
    /// The trained one in this folder (PEFT layout; its own rank, alpha
    /// and targets), to go on training.
    Trained(&'a Path),
}

/// The tokenizer and model of `base_dir` with `adapter`, in
/// [`train_dtype`], quantised when [`four_bit`]; the tokenizer checked
/// against the model's vocabulary.
pub fn trainee(
    base_dir: &Path,
    adapter: Adapter,
    model_cfg: &ModelConfig,
    device: &Device,
) -> anyhow::Result<(ChatTokenizer, LoadedModel)> {
    let mut tok = ChatTokenizer::from_dir(base_dir)?;
    tok.set_specials_in_messages(model_cfg.special_tokens_in_messages);
    let dtype = train_dtype(&model_cfg.dtype, device);
    let mut loaded = match adapter {
        Adapter::Fresh(lora) => model::load(base_dir, Some(lora), dtype, device)?,
        Adapter::Trained(dir) => model::io::adapter::load(base_dir, dir, dtype, device)?,
    };
    if four_bit(model_cfg, device) {
        loaded.model.hold_base(crate::model::BasePrecision::Nf4)?;
    }
    tok.check_against_vocab(loaded.model.vocab_size())?;
    Ok((tok, loaded))
}

/// Whether the frozen projections are held in NF4: asked for, and on an
/// accelerator (a CPU run keeps its dtype).
pub fn four_bit(model_cfg: &ModelConfig, device: &Device) -> bool {
    model_cfg.load_in_4bit && !device.is_cpu()
}

/// The projections named in a config's `target_modules`, each checked.
pub fn lora(settings: &LoraSettings, dropout: f64, seed: u64) -> anyhow::Result<LoraConfig> {
    Ok(LoraConfig {
        r: settings.r,
        alpha: settings.alpha,
        dropout: dropout as f32,
        target_modules: target_modules(&settings.target_modules)?,
        seed,
    })
}

fn target_modules(names: &[String]) -> anyhow::Result<Vec<TargetModule>> {
    names
        .iter()
        .map(|m| {
            TargetModule::parse(m).with_context(|| {
                format!("target module `{m}` is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj")
            })
        })
        .collect()
}

/// The dtype a run computes in: the configured one (`bf16`, `f16` or
/// `f32`) on an accelerator, f32 on the CPU.
pub fn train_dtype(name: &str, device: &Device) -> DType {
    match (name, device.is_cpu()) {
        (_, true) | ("f32", _) => DType::F32,
        ("f16", _) => DType::F16,
        _ => DType::BF16,
    }
}
