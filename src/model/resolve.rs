//! Finding a model folder: a local path, or a repository id (`Qwen/Qwen3-4B`)
//! already in the Hugging Face cache (`$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`). [`download`] fetches into that cache from
//! the hub; the training machines are offline, so it is a separate, explicit
//! step rather than a fallback of [`resolve`].

use std::path::{Path, PathBuf};

use hf_hub::Cache;

use super::{CONFIG_FILE, ModelError, Result, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};

/// The folder `spec` names: `spec` itself if it is a directory, else the
/// cached snapshot of the repository `spec` (at `refs/main`).
pub fn resolve(spec: &str) -> Result<PathBuf> {
    resolve_in(spec, &Cache::from_env())
}

/// [`resolve`] against an explicit cache.
pub fn resolve_in(spec: &str, cache: &Cache) -> Result<PathBuf> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(path.to_owned());
    }
    cache
        .model(spec.to_owned())
        .get(CONFIG_FILE)
        .and_then(|config| config.parent().map(Path::to_owned))
        .ok_or_else(|| ModelError::NotFound {
            spec: spec.to_owned(),
            cache: cache.path().clone(),
        })
}

/// Downloads `repo_id`'s config and safetensors weights into the cache and
/// returns the snapshot folder. Needs network access.
pub fn download(repo_id: &str) -> Result<PathBuf> {
    let hub = |e: hf_hub::api::sync::ApiError| ModelError::Hub {
        repo: repo_id.to_owned(),
        message: e.to_string(),
    };
    let repo = hf_hub::api::sync::ApiBuilder::from_env()
        .build()
        .map_err(hub)?
        .model(repo_id.to_owned());
    let config = repo.get(CONFIG_FILE).map_err(hub)?;
    match repo.get(WEIGHTS_INDEX_FILE) {
        Ok(index_path) => {
            let index = super::read_json(&index_path, "")?;
            let mut shards: Vec<&str> = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| m.values().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                repo.get(shard).map_err(hub)?;
            }
        }
        Err(_) => {
            repo.get(WEIGHTS_FILE).map_err(hub)?;
        }
    }
    Ok(config
        .parent()
        .expect("a cached file lies in a snapshot folder")
        .to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_folder_resolves_to_itself() {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().to_str().unwrap();
        let cache = Cache::new(dir.path().join("no-cache"));
        assert_eq!(resolve_in(spec, &cache).unwrap(), dir.path());
    }

    #[test]
    fn a_cached_repository_resolves_to_its_snapshot() {
        let cache_dir = tempfile::tempdir().unwrap();
        let repo = cache_dir.path().join("models--Org--Tiny");
        let snapshot = repo.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "abc123").unwrap();
        std::fs::write(snapshot.join(CONFIG_FILE), "{}").unwrap();
        let cache = Cache::new(cache_dir.path().to_owned());
        assert_eq!(resolve_in("Org/Tiny", &cache).unwrap(), snapshot);
        let err = resolve_in("Org/Other", &cache).unwrap_err().to_string();
        assert!(
            err.contains("`Org/Other`") && err.contains("hint:"),
            "{err}"
        );
    }
}
