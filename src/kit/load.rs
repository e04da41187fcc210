//! The one way a model is loaded: for training, the tokenizer and the
//! base model of a folder with a fresh or trained LoRA adapter on the
//! target projections, in the training dtype; for inference (`eval`,
//! `serve`), the model with its adapters as they are. Either way its
//! frozen projections are held as `model.base_precision` (or the command's
//! `--base_precision`) asks, in bf16, NF4 (QLoRA) or FP8, as [`held`]
//! decides for the device.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};

use crate::config::{LoraSettings, ModelConfig};
use crate::data::tokenizer::ChatTokenizer;
use crate::model::layers::lora::{BasePrecision, LoraConfig, TargetModule};
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
/// [`train_dtype`], its base held as [`held`] says for the config's
/// `base_precision`; the tokenizer checked against the model's vocabulary.
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
    loaded
        .model
        .hold_base(held(model_cfg.base_precision, device))?;
    tok.check_against_vocab(loaded.model.vocab_size())?;
    Ok((tok, loaded))
}

/// How the frozen projections are held on `device` when `asked` is asked
/// for: as asked, except NF4 on the CPU, where a run keeps its dtype (f32)
/// as it always has (NF4 is the default, and the CPU runs tests and quick
/// checks). FP8 is never a default, so it is held on the CPU too when
/// asked: the model crate makes the same E4M3 codes there and multiplies
/// after dequantising, slower than bf16 but a check of what FP8 does to
/// the numbers.
pub fn held(asked: BasePrecision, device: &Device) -> BasePrecision {
    match asked {
        BasePrecision::Nf4 if device.is_cpu() => BasePrecision::Bf16,
        other => other,
    }
}

/// The model in `model_dir` for inference, in f32 on the CPU and bf16 on
/// a GPU, its base held as [`held`] says for `precision`: alone; with one
/// adapter, with it applied; with several, with all of them beside it (a
/// batch row picks one, as `serve` runs them).
pub fn for_inference(
    model_dir: &Path,
    adapters: &[std::path::PathBuf],
    precision: BasePrecision,
    device: &Device,
) -> anyhow::Result<LoadedModel> {
    let dtype = if device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    };
    let mut loaded = match adapters {
        [] => model::load(model_dir, None, dtype, device)?,
        [a] => model::io::adapter::load(model_dir, a, dtype, device)?,
        many => model::io::adapter::load_bank(model_dir, many, dtype, device)?,
    };
    loaded.model.hold_base(held(precision, device))?;
    Ok(loaded)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PipelineConfig, SftConfig, parse};
    use crate::model::layers::lora::BaseLinear;
    use BasePrecision::{Bf16, Fp8, Nf4};

    /// Which way each projection of `loaded` holds its frozen weight.
    fn held_as(loaded: &LoadedModel) -> Vec<BasePrecision> {
        let mut kinds: Vec<BasePrecision> = loaded
            .model
            .projections()
            .iter()
            .map(|p| match p.base() {
                BaseLinear::Dense { .. } => Bf16,
                BaseLinear::Nf4 { .. } => Nf4,
                BaseLinear::Fp8 { .. } => Fp8,
            })
            .collect();
        kinds.dedup();
        kinds
    }

    /// A config's `base_precision`, under any of its names, is how the
    /// trainee and the inference model hold their base; on the CPU NF4 is
    /// not applied and FP8 is.
    #[test]
    fn the_base_is_held_as_the_config_says_but_nf4_not_on_the_cpu() {
        let dir = tempfile::tempdir().unwrap();
        model::arch::tiny::write_tiny_chat_model(dir.path(), 3).unwrap();
        let cpu = Device::Cpu;
        let lora = lora(&SftConfig::default().lora, 0.0, 1).unwrap();
        for (text, asked, on_cpu) in [
            ("{}", Nf4, Bf16),
            (r#"{"model": {"base_precision": "fp8"}}"#, Fp8, Fp8),
            (r#"{"model": {"base_precision": "nf4"}}"#, Nf4, Bf16),
            (r#"{"model": {"load_in_4bit": false}}"#, Bf16, Bf16),
            (r#"{"hardware": {"no_4bit": false}}"#, Nf4, Bf16),
        ] {
            let p: PipelineConfig = parse(text, Path::new("p.json")).unwrap();
            assert_eq!(p.model.base_precision, asked, "{text}");
            assert_eq!(held(p.model.base_precision, &cpu), on_cpu, "{text}");
            let (_, trainee) = trainee(dir.path(), Adapter::Fresh(&lora), &p.model, &cpu).unwrap();
            assert_eq!(held_as(&trainee), [on_cpu], "{text}");
            let served = for_inference(dir.path(), &[], p.model.base_precision, &cpu).unwrap();
            assert_eq!(held_as(&served), [on_cpu], "{text}");
        }
    }
}
