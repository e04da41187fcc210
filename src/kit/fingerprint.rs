//! What a resume must find unchanged: a run's [`Fingerprint`] from its
//! settings, its base model folder (a sample of the weight bytes), its data
//! and the tokenizer files.

use std::path::Path;

use anyhow::Context;
use sha2::{Digest, Sha256};

use super::checkpoint::{self, Fingerprint};
use crate::model;
use crate::model::layers::lora::BasePrecision;

/// The fingerprint of a run on `base_dir`: `config` (the settings that
/// decide the numbers), `base_label` (how the base is named in a
/// difference: its folder, with [`base_label`]'s mark when held in fewer
/// bits), `data` (the training data's digest, or a description of an
/// environment).
pub fn of(
    config: serde_json::Value,
    base_label: String,
    base_dir: &Path,
    data: String,
) -> anyhow::Result<Fingerprint> {
    Ok(Fingerprint {
        config,
        base_model: base_label,
        base_weights: weights(base_dir)?,
        train_data_sha256: data,
        tokenizer_sha256: sha256_of(&[
            &base_dir.join("tokenizer.json"),
            &base_dir.join("tokenizer_config.json"),
        ])?,
    })
}

/// A base's label in a fingerprint: its folder, then ` (NF4)` or
/// ` (FP8)` when its frozen weights are held so (bf16: the folder alone,
/// so checkpoints written before FP8 existed resume as they were).
pub fn base_label(base_dir: &Path, held: BasePrecision) -> String {
    format!("{}{}", base_dir.display(), checkpoint::held_mark(held))
}

/// SHA-256 of the files at `paths` one after another (a missing file adds
/// nothing).
pub fn sha256_of(paths: &[&Path]) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    for p in paths {
        if p.exists() {
            checkpoint::hash_file(&mut h, p)
                .with_context(|| format!("cannot read `{}`", p.display()))?;
        }
    }
    Ok(crate::hex(&h.finalize()))
}

/// A quick fingerprint of a model folder: `config.json`, and each weight
/// file's name, length and 32 samples of 4 KiB spread over it. Hashing all
/// of a 4B model's 8 GB would cost seconds on every start; merging an
/// adapter rewrites most projection bytes, which the samples see.
pub fn weights(dir: &Path) -> anyhow::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    const SAMPLES: u64 = 32;
    const CHUNK: u64 = 4096;
    let mut h = Sha256::new();
    let config = dir.join("config.json");
    h.update(
        std::fs::read(&config).with_context(|| format!("cannot read `{}`", config.display()))?,
    );
    for path in model::weight_files(dir)? {
        let mut f = std::fs::File::open(&path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        let len = f.metadata()?.len();
        h.update(path.file_name().unwrap_or_default().as_encoded_bytes());
        h.update(len.to_le_bytes());
        let mut buf = vec![0u8; CHUNK as usize];
        for i in 0..SAMPLES {
            let at = (len.saturating_sub(CHUNK)) * i / (SAMPLES - 1);
            f.seek(SeekFrom::Start(at))?;
            let n = f.read(&mut buf)?;
            h.update(&buf[..n]);
        }
    }
    Ok(crate::hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels checkpoints of earlier versions carry: the folder alone
    /// for bf16, ` (NF4)` after it for NF4; FP8 has its own mark.
    #[test]
    fn a_base_label_marks_how_the_base_is_held() {
        let dir = Path::new("/ck/stage1_warmup/merged");
        assert_eq!(
            base_label(dir, BasePrecision::Bf16),
            "/ck/stage1_warmup/merged"
        );
        assert_eq!(
            base_label(dir, BasePrecision::Nf4),
            "/ck/stage1_warmup/merged (NF4)"
        );
        assert_eq!(
            base_label(dir, BasePrecision::Fp8),
            "/ck/stage1_warmup/merged (FP8)"
        );
    }
}
