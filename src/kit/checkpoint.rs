//! Periodic training checkpoints that resume exactly, and survive kills.
//!
//! A checkpoint is a folder `checkpoint-<step>` under the stage's output
//! folder holding the trainable tensors, the optimizer's moments, the
//! trainer state (step, data position, what the run was started with) and a
//! manifest of SHA-256 hashes written last. It is built in a temp folder on
//! the same filesystem, every file fsynced, then renamed into place and the
//! parent fsynced; older checkpoints beyond the limit are removed only after
//! that. On resume the newest checkpoint whose manifest verifies is used;
//! temp folders (a save killed midway) are removed and a checkpoint whose
//! files do not match their hashes is skipped with a warning.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::layers::lora::BasePrecision;

const PARAMS: &str = "trainable.safetensors";
const OPTIM: &str = "optimizer.safetensors";
const STATE: &str = "trainer_state.json";
const MANIFEST: &str = "manifest.json";

/// What a run depends on; a resume with any of it changed is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The resolved stage config.
    pub config: serde_json::Value,
    pub base_model: String,
    /// [`crate::kit::fingerprint::weights`]: the quick fingerprint of the base weights (config
    /// and samples of every weight file), so a base folder rewritten in
    /// place (a re-run Stage 1 merge) is noticed. Empty when unknown.
    #[serde(default)]
    pub base_weights: String,
    pub train_data_sha256: String,
    pub tokenizer_sha256: String,
}

/// Settings that say where a run's files are, not what it computes: a run
/// folder copied or moved elsewhere resumes without `--force`. The training
/// data's contents are compared by their digest, the base model's by its
/// weights'.
const LOCATIONS: [&str; 3] = ["output_dir", "train_file", "eval_file"];

/// The mark a base's label carries when its frozen weights are held in
/// fewer bits ([`crate::kit::fingerprint::base_label`]); a bf16 base
/// carries none, as every label did before FP8.
pub fn held_mark(held: BasePrecision) -> &'static str {
    match held {
        BasePrecision::Bf16 => "",
        BasePrecision::Nf4 => " (NF4)",
        BasePrecision::Fp8 => " (FP8)",
    }
}

/// The mark `label` ends with (empty for a bf16 base).
fn mark_of(label: &str) -> &'static str {
    BasePrecision::ALL
        .into_iter()
        .map(held_mark)
        .find(|m| !m.is_empty() && label.ends_with(m))
        .unwrap_or("")
}

impl Fingerprint {
    /// The fields that differ from `other`, for an error message. A base
    /// folder found at another path with the same weights, and a run's
    /// files at other paths ([`LOCATIONS`]), are the same run.
    pub fn differences(&self, other: &Fingerprint) -> Vec<String> {
        let mut d = Vec::new();
        let same_weights = !self.base_weights.is_empty() && self.base_weights == other.base_weights;
        let moved = same_weights && mark_of(&self.base_model) == mark_of(&other.base_model);
        if self.base_model != other.base_model && !moved {
            d.push(format!(
                "base model: `{}` then, `{}` now",
                other.base_model, self.base_model
            ));
        }
        if !self.base_weights.is_empty()
            && !other.base_weights.is_empty()
            && self.base_weights != other.base_weights
        {
            d.push("base model: its config or weights changed".into());
        }
        if self.train_data_sha256 != other.train_data_sha256 {
            d.push("training data: its contents changed".into());
        }
        if self.tokenizer_sha256 != other.tokenizer_sha256 {
            d.push("tokenizer: tokenizer.json or tokenizer_config.json changed".into());
        }
        if let (Some(a), Some(b)) = (self.config.as_object(), other.config.as_object()) {
            // A setting added since the checkpoint was written reads as
            // absent there and null (its default) here: the same run.
            let get = |m: &serde_json::Map<String, serde_json::Value>, k: &str| {
                m.get(k).filter(|v| !v.is_null()).cloned()
            };
            for k in a
                .keys()
                .chain(b.keys())
                .collect::<std::collections::BTreeSet<_>>()
            {
                if get(a, k) != get(b, k) && !LOCATIONS.contains(&k.as_str()) {
                    d.push(format!(
                        "config `{k}`: {} then, {} now",
                        b.get(k).map_or("absent".into(), |v| v.to_string()),
                        a.get(k).map_or("absent".into(), |v| v.to_string())
                    ));
                }
            }
        } else if self.config != other.config {
            d.push("config changed".into());
        }
        d
    }
}

/// Where a run stands; saved with every checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps done.
    pub step: u64,
    /// Data position: the next micro-batch is `batch` of `epoch`.
    pub epoch: usize,
    pub batch: usize,
    pub tokens_seen: u64,
    pub skipped_steps: u64,
    pub fingerprint: Fingerprint,
    /// What else a recipe needs to resume (RL: task cursor, curriculum,
    /// counters); null for SFT.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub extra: serde_json::Value,
}

impl TrainerState {
    /// A fresh run's state: step 0 at the data's start.
    pub fn new(fingerprint: Fingerprint) -> Self {
        TrainerState {
            step: 0,
            epoch: 0,
            batch: 0,
            tokens_seen: 0,
            skipped_steps: 0,
            fingerprint,
            extra: serde_json::Value::Null,
        }
    }
}

/// The tensors of named variables, by name: what a checkpoint stores of
/// them.
pub fn tensors_of(vars: &[(String, candle_core::Var)]) -> BTreeMap<String, Tensor> {
    vars.iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect()
}

/// [`save_as`] of an optimizer's variables and moments: the checkpoint of
/// a recipe that trains only what `opt` holds (SFT, DPO).
pub fn save_optimizer(
    out_dir: &Path,
    prefix: &str,
    state: &TrainerState,
    opt: &crate::train::optim::AdamW,
    keep: usize,
) -> anyhow::Result<PathBuf> {
    let dir = save_as(
        out_dir,
        prefix,
        state,
        &tensors_of(opt.vars()),
        &opt.state(),
        keep,
    )?;
    tracing::info!("saved `{}`", dir.display());
    Ok(dir)
}

/// Folder name prefix of SFT checkpoints (`checkpoint-<step>`).
pub const SFT_PREFIX: &str = "checkpoint-";

/// Saves a checkpoint of `params` and `optim` at `state.step`; keeps the
/// newest `keep` checkpoints. Returns its folder.
pub fn save(
    out_dir: &Path,
    state: &TrainerState,
    params: &BTreeMap<String, Tensor>,
    optim: &BTreeMap<String, Tensor>,
    keep: usize,
) -> anyhow::Result<PathBuf> {
    save_as(out_dir, SFT_PREFIX, state, params, optim, keep)
}

/// [`save`] into `<prefix><step>` (RL writes `step_<step>`).
pub fn save_as(
    out_dir: &Path,
    prefix: &str,
    state: &TrainerState,
    params: &BTreeMap<String, Tensor>,
    optim: &BTreeMap<String, Tensor>,
    keep: usize,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create `{}`", out_dir.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-checkpoint-")
        .tempdir_in(out_dir)
        .with_context(|| format!("cannot create a checkpoint in `{}`", out_dir.display()))?;
    let write = || -> anyhow::Result<()> {
        let as_map = |m: &BTreeMap<String, Tensor>| -> std::collections::HashMap<String, Tensor> {
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        crate::model::save_safetensors(&as_map(params), tmp.path().join(PARAMS))?;
        crate::model::save_safetensors(&as_map(optim), tmp.path().join(OPTIM))?;
        std::fs::write(tmp.path().join(STATE), serde_json::to_vec_pretty(state)?)?;
        let mut files = BTreeMap::new();
        for name in [PARAMS, OPTIM, STATE] {
            let p = tmp.path().join(name);
            File::open(&p)?.sync_all()?;
            files.insert(name.to_owned(), sha256_file(&p)?);
        }
        // The manifest last: a checkpoint without it is not one.
        let m = tmp.path().join(MANIFEST);
        std::fs::write(
            &m,
            serde_json::to_vec_pretty(&serde_json::json!({ "step": state.step, "files": files }))?,
        )?;
        File::open(&m)?.sync_all()?;
        File::open(tmp.path())?.sync_all()?;
        Ok(())
    };
    write().with_context(|| {
        format!(
            "saving the checkpoint of step {} in `{}` failed; earlier checkpoints are untouched",
            state.step,
            out_dir.display()
        )
    })?;
    let dest = out_dir.join(format!("{prefix}{}", state.step));
    if dest.exists() {
        std::fs::remove_dir_all(&dest)?;
    }
    let tmp_path = tmp.keep();
    std::fs::rename(&tmp_path, &dest)
        .with_context(|| format!("cannot move the checkpoint to `{}`", dest.display()))?;
    File::open(out_dir)?.sync_all()?;
    rotate(out_dir, prefix, keep)?;
    Ok(dest)
}

fn sha256_file(p: &Path) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    hash_file(&mut h, p)?;
    Ok(crate::hex(&h.finalize()))
}

/// Feeds the file at `p` to `h`, a megabyte at a time (datasets may be
/// larger than memory is willing to hold twice).
pub(crate) fn hash_file(h: &mut Sha256, p: &Path) -> std::io::Result<()> {
    use std::io::Read;
    let mut f = File::open(p)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

/// `<prefix><step>` folders, newest first.
fn list(out_dir: &Path, prefix: &str) -> anyhow::Result<Vec<(u64, PathBuf)>> {
    let mut v = Vec::new();
    let Ok(entries) = std::fs::read_dir(out_dir) else {
        return Ok(v);
    };
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(step) = name.strip_prefix(prefix).and_then(|s| s.parse().ok()) {
            v.push((step, e.path()));
        }
    }
    v.sort_by_key(|e| std::cmp::Reverse(e.0));
    Ok(v)
}

/// Prefix a checkpoint folder gets when it is set aside as diverged: no
/// resume picks it (it no longer starts with the stage's prefix), and
/// nothing is deleted.
pub const DIVERGED_PREFIX: &str = "diverged-";

/// Renames every `<prefix><step>` checkpoint at or after `from` to
/// `diverged-<prefix><step>`. Returns the newest checkpoint left, if any.
pub fn set_aside_from(
    out_dir: &Path,
    prefix: &str,
    from: u64,
) -> anyhow::Result<(Vec<PathBuf>, Option<PathBuf>)> {
    let mut aside = Vec::new();
    let mut kept = None;
    for (step, path) in list(out_dir, prefix)? {
        if step < from {
            kept.get_or_insert(path);
            continue;
        }
        let name = path.file_name().expect("listed entries have names");
        let to = out_dir.join(format!("{DIVERGED_PREFIX}{}", name.to_string_lossy()));
        if to.exists() {
            // An earlier divergence's copy of the same step: keep the older.
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("cannot remove `{}`", path.display()))?;
        } else {
            std::fs::rename(&path, &to)
                .with_context(|| format!("cannot rename `{}`", path.display()))?;
        }
        aside.push(to);
    }
    aside.reverse();
    Ok((aside, kept))
}

fn rotate(out_dir: &Path, prefix: &str, keep: usize) -> anyhow::Result<()> {
    for (_, path) in list(out_dir, prefix)?.into_iter().skip(keep.max(1)) {
        std::fs::remove_dir_all(&path)
            .with_context(|| format!("cannot remove old checkpoint `{}`", path.display()))?;
    }
    Ok(())
}

/// Whether every file of a checkpoint matches its manifest.
fn verify(dir: &Path) -> anyhow::Result<()> {
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join(MANIFEST)).context("no manifest (save was interrupted)")?,
    )
    .context("unreadable manifest")?;
    let files = m["files"].as_object().context("manifest without files")?;
    for name in [PARAMS, OPTIM, STATE] {
        let want = files
            .get(name)
            .and_then(|v| v.as_str())
            .with_context(|| format!("manifest lacks {name}"))?;
        let got = sha256_file(&dir.join(name)).with_context(|| format!("cannot read {name}"))?;
        if got != want {
            bail!("{name} does not match its hash (truncated or corrupted)");
        }
    }
    Ok(())
}

/// A checkpoint found on resume.
pub struct Loaded {
    pub dir: PathBuf,
    pub state: TrainerState,
    pub params: BTreeMap<String, Tensor>,
    pub optim: BTreeMap<String, Tensor>,
}

impl Loaded {
    /// Sets each of `vars` to its saved tensor (in the variable's dtype);
    /// a variable the checkpoint lacks is an error naming both.
    pub fn restore(&self, vars: &[(String, candle_core::Var)]) -> anyhow::Result<()> {
        for (name, var) in vars {
            let t = self
                .params
                .get(name)
                .with_context(|| format!("checkpoint `{}` lacks `{name}`", self.dir.display()))?;
            var.set(&t.to_dtype(var.dtype())?)?;
        }
        Ok(())
    }
}

/// The newest valid checkpoint, after removing interrupted saves.
pub fn latest(out_dir: &Path, device: &Device) -> anyhow::Result<Option<Loaded>> {
    latest_as(out_dir, SFT_PREFIX, device)
}

/// [`latest`] among `<prefix><step>` folders.
pub fn latest_as(out_dir: &Path, prefix: &str, device: &Device) -> anyhow::Result<Option<Loaded>> {
    if let Ok(entries) = std::fs::read_dir(out_dir) {
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(".tmp-checkpoint-")
            {
                tracing::warn!(
                    "removing interrupted checkpoint save `{}`",
                    e.path().display()
                );
                std::fs::remove_dir_all(e.path())?;
            }
        }
    }
    for (_, dir) in list(out_dir, prefix)? {
        if let Err(e) = verify(&dir) {
            tracing::warn!("skipping checkpoint `{}`: {e:#}", dir.display());
            continue;
        }
        let state: TrainerState = serde_json::from_slice(&std::fs::read(dir.join(STATE))?)
            .with_context(|| format!("`{}`: unreadable trainer state", dir.display()))?;
        let load = |name: &str| -> anyhow::Result<BTreeMap<String, Tensor>> {
            Ok(candle_core::safetensors::load(dir.join(name), device)?
                .into_iter()
                .collect())
        };
        let (params, optim) = (load(PARAMS)?, load(OPTIM)?);
        return Ok(Some(Loaded {
            dir,
            state,
            params,
            optim,
        }));
    }
    Ok(None)
}

/// An exclusive hold on a stage's output folder for one run: `.lock` in
/// the folder, flocked, and removed again when the run lets go (a run that
/// ended leaves no `.lock` behind; one killed outright leaves a stale file
/// that holds no lock, which the next run takes over).
pub struct RunLock {
    /// Held for as long as the value lives.
    _lock: nix::fcntl::Flock<File>,
    path: PathBuf,
    remove: bool,
}

impl RunLock {
    pub fn acquire(out_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(out_dir)
            .with_context(|| format!("cannot create `{}`", out_dir.display()))?;
        Self::on_file(&out_dir.join(".lock"), true).map_err(|busy| {
            busy.context(format!(
                "another run is using `{}`\nhint: wait for it to finish, or choose another output folder",
                out_dir.display()
            ))
        })
    }

    /// Holds `path` (created if missing) exclusively; `remove` deletes it
    /// when the hold ends. Fails at once when another process holds it.
    pub fn on_file(path: &Path, remove: bool) -> anyhow::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        // Another run may remove the file between our open and our lock;
        // a lock on a removed file holds nothing, so check and retry.
        for _ in 0..3 {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .with_context(|| format!("cannot create `{}`", path.display()))?;
            let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
                .map_err(|(_, e)| anyhow::anyhow!("`{}` is locked ({e})", path.display()))?;
            let held = lock.metadata()?.ino();
            if std::fs::metadata(path).is_ok_and(|m| m.ino() == held) {
                return Ok(RunLock {
                    _lock: lock,
                    path: path.to_owned(),
                    remove,
                });
            }
        }
        bail!("`{}` keeps being replaced", path.display())
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still held, so no other run can lock the old file
        // and believe it owns the folder.
        if self.remove {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: u64) -> TrainerState {
        TrainerState {
            step,
            epoch: 0,
            batch: step as usize,
            tokens_seen: 0,
            skipped_steps: 0,
            extra: serde_json::Value::Null,
            fingerprint: Fingerprint {
                config: serde_json::json!({"lr": 1}),
                base_model: "m".into(),
                base_weights: "w".into(),
                train_data_sha256: "d".into(),
                tokenizer_sha256: "t".into(),
            },
        }
    }

    fn tensors(v: f32) -> BTreeMap<String, Tensor> {
        let mut m = BTreeMap::new();
        m.insert(
            "w".to_owned(),
            Tensor::new(&[v, v + 1.0], &Device::Cpu).unwrap(),
        );
        m
    }

    #[test]
    fn newest_valid_wins_and_damage_falls_back() {
        let d = tempfile::tempdir().unwrap();
        for s in 1..=3 {
            save(d.path(), &state(s), &tensors(s as f32), &tensors(0.0), 2).unwrap();
        }
        // Rotation kept the newest two.
        assert!(!d.path().join("checkpoint-1").exists());
        let l = latest(d.path(), &Device::Cpu).unwrap().unwrap();
        assert_eq!(l.state.step, 3);
        assert_eq!(l.params["w"].to_vec1::<f32>().unwrap(), vec![3.0, 4.0]);

        // A flipped byte in the newest: fall back to the previous one.
        let p = d.path().join("checkpoint-3").join(PARAMS);
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&p, bytes).unwrap();
        assert_eq!(
            latest(d.path(), &Device::Cpu).unwrap().unwrap().state.step,
            2
        );

        // An interrupted save (no manifest, temp name) is removed.
        std::fs::create_dir(d.path().join(".tmp-checkpoint-x")).unwrap();
        std::fs::write(d.path().join(".tmp-checkpoint-x").join(PARAMS), b"half").unwrap();
        latest(d.path(), &Device::Cpu).unwrap();
        assert!(!d.path().join(".tmp-checkpoint-x").exists());
    }

    #[test]
    fn fingerprint_differences_are_named() {
        let a = state(1).fingerprint;
        let mut b = a.clone();
        b.config = serde_json::json!({"lr": 2});
        b.train_data_sha256 = "other".into();
        let d = b.differences(&a);
        assert!(
            d.iter().any(|x| x.contains("config `lr`: 1 then, 2 now")),
            "{d:?}"
        );
        assert!(d.iter().any(|x| x.contains("training data")), "{d:?}");
    }

    /// A run folder copied elsewhere, with its base model and data at new
    /// paths, is the same run; the same path with other weights, or the
    /// same weights quantised, is not.
    #[test]
    fn a_moved_run_is_the_same_run() {
        let mut a = state(1).fingerprint;
        a.base_model = "/old/ck/stage1_warmup/merged".into();
        a.config = serde_json::json!({"lr": 1, "output_dir": "/old/ck/stage2_sft", "train_file": "/old/d.jsonl"});
        let mut b = a.clone();
        b.base_model = "/new/ck/stage1_warmup/merged".into();
        b.config = serde_json::json!({"lr": 1, "output_dir": "/new/ck/stage2_sft", "train_file": "/new/d.jsonl"});
        assert!(b.differences(&a).is_empty(), "{:?}", b.differences(&a));
        for held in [BasePrecision::Nf4, BasePrecision::Fp8] {
            let mut c = b.clone();
            c.base_model = format!("{}{}", b.base_model, held_mark(held));
            assert!(c.differences(&a).iter().any(|x| x.contains("base model")));
        }
        // Quantised alike, moved: the same run; NF4 then and FP8 now: not.
        let nf4 = |fp: &Fingerprint| Fingerprint {
            base_model: format!("{}{}", fp.base_model, held_mark(BasePrecision::Nf4)),
            ..fp.clone()
        };
        assert!(nf4(&b).differences(&nf4(&a)).is_empty());
        let mut fp8 = b.clone();
        fp8.base_model = format!("{}{}", b.base_model, held_mark(BasePrecision::Fp8));
        let d = fp8.differences(&nf4(&a));
        assert!(
            d.iter()
                .any(|x| x.contains("(NF4)` then") && x.contains("(FP8)` now")),
            "{d:?}"
        );
        let mut e = b.clone();
        e.base_weights = "other".into();
        let d = e.differences(&a);
        assert!(
            d.iter().any(|x| x.contains("`/old/ck")) && d.iter().any(|x| x.contains("weights")),
            "{d:?}"
        );
    }

    #[test]
    fn a_setting_added_since_the_checkpoint_is_no_difference_while_null() {
        let mut a = state(1).fingerprint;
        a.config = serde_json::json!({"lr": 1});
        let mut b = a.clone();
        b.config = serde_json::json!({"lr": 1, "micro_batch_tokens": null});
        assert!(b.differences(&a).is_empty(), "{:?}", b.differences(&a));
        b.config = serde_json::json!({"lr": 1, "micro_batch_tokens": 4096});
        let d = b.differences(&a);
        assert!(
            d.iter()
                .any(|x| x.contains("config `micro_batch_tokens`: absent then, 4096 now")),
            "{d:?}"
        );
    }

    #[test]
    fn second_run_on_a_folder_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let _a = RunLock::acquire(d.path()).unwrap();
        let e = RunLock::acquire(d.path()).err().unwrap().to_string();
        assert!(e.contains("another run"), "{e}");
    }
}
