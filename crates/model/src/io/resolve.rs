//! Finding a model folder: a local path, or a repository id (`Qwen/Qwen3-4B`)
//! at a revision, from the Hugging Face cache or, when online, the hub.
//!
//! The environment is read as `huggingface_hub` reads it ([`HubSettings`]):
//! `HF_HOME` (default `$XDG_CACHE_HOME/huggingface`, else
//! `~/.cache/huggingface`), `HF_HUB_CACHE` (default `$HF_HOME/hub`),
//! `HF_HUB_OFFLINE` (no network attempt at all), `HF_TOKEN` (else the
//! token file `$HF_HOME/token`). hf-hub 0.4 reads only `HF_HOME` and looks
//! revisions up by ref name, so the cache lookup is written here: a
//! revision is a ref (`refs/<name>` holds the commit) or a commit (a
//! `snapshots/<commit>/` folder).

use std::path::{Path, PathBuf};

use hf_hub::Cache;
use serde::Serialize;

use crate::{
    common::CONFIG_FILE, common::ModelError, common::Result, common::WEIGHTS_FILE,
    common::WEIGHTS_INDEX_FILE,
};

/// The Hugging Face settings of this process.
#[derive(Clone, Serialize)]
pub struct HubSettings {
    /// `HF_HOME`.
    pub home: PathBuf,
    /// The hub cache (`HF_HUB_CACHE`): `models--org--name/` folders.
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE`: never reach the network.
    pub offline: bool,
    /// Where the token comes from (`HF_TOKEN`, or the token file), if any;
    /// the token itself is never shown.
    pub token_from: Option<String>,
    #[serde(skip)]
    token: Option<String>,
}

impl std::fmt::Debug for HubSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubSettings")
            .field("home", &self.home)
            .field("cache", &self.cache)
            .field("offline", &self.offline)
            .field("token_from", &self.token_from)
            .finish()
    }
}

impl HubSettings {
    /// From this process's environment.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// From the variables `var` returns (tests pass their own).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let cache = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("hub"));
        // huggingface_hub's truthy values.
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_uppercase().as_str(),
                "1" | "ON" | "YES" | "TRUE"
            )
        });
        let token_file = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("token"));
        let (token, token_from) = match var("HF_TOKEN") {
            Some(t) => (Some(t), Some("HF_TOKEN".to_owned())),
            None => match std::fs::read_to_string(&token_file)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
            {
                Some(t) => (Some(t), Some(token_file.display().to_string())),
                None => (None, None),
            },
        };
        HubSettings {
            home,
            cache,
            offline,
            token_from,
            token,
        }
    }

    /// The hub client for downloads, on this cache with this token.
    pub fn api(&self) -> std::result::Result<hf_hub::api::sync::Api, hf_hub::api::sync::ApiError> {
        hf_hub::api::sync::ApiBuilder::new()
            .with_cache_dir(self.cache.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .build()
    }
}

/// A model folder found for a model name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolved {
    /// What was asked for: a folder or a hub id.
    pub spec: String,
    /// The folder holding `config.json`.
    pub dir: PathBuf,
    /// The hub id, when `spec` named one.
    pub repo: Option<String>,
    /// The revision asked for (`main` by default for a hub id).
    pub revision: Option<String>,
    /// The commit the files come from: the snapshot's name, for a hub id or
    /// a folder inside a hub cache.
    pub commit: Option<String>,
}

/// The folder `spec` names: `spec` itself if it is a directory, else the
/// cached snapshot of the repository `spec` at `refs/main`.
pub fn resolve(spec: &str) -> Result<PathBuf> {
    resolve_revision(spec, None).map(|r| r.dir)
}

/// [`resolve`] at a revision (branch, tag or commit; default `main`), with
/// the commit found. A hub id missing from the cache is downloaded unless
/// `HF_HUB_OFFLINE` is set.
pub fn resolve_revision(spec: &str, revision: Option<&str>) -> Result<Resolved> {
    let settings = HubSettings::from_env();
    match resolve_cached(spec, revision, &settings.cache) {
        Err(ModelError::NotFound { .. })
            if !settings.offline && !Path::new(spec).exists() && looks_like_repo_id(spec) =>
        {
            let dir = download(spec, revision, &settings)?;
            Ok(Resolved {
                spec: spec.to_owned(),
                commit: snapshot_commit(&dir),
                dir,
                repo: Some(spec.to_owned()),
                revision: Some(revision.unwrap_or("main").to_owned()),
            })
        }
        other => other,
    }
}

/// [`resolve_revision`] against the cache folder `cache`, never the network.
pub fn resolve_cached(spec: &str, revision: Option<&str>, cache: &Path) -> Result<Resolved> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(Resolved {
            spec: spec.to_owned(),
            dir: path.to_owned(),
            repo: None,
            revision: revision.map(str::to_owned),
            commit: snapshot_commit(path),
        });
    }
    let not_found = || ModelError::NotFound {
        spec: spec.to_owned(),
        cache: cache.to_owned(),
    };
    if !looks_like_repo_id(spec) {
        return Err(not_found());
    }
    let rev = revision.unwrap_or("main");
    let repo_dir = cache.join(format!("models--{}", spec.replace('/', "--")));
    // A ref names a commit; else the revision may be a commit itself.
    let commit = std::fs::read_to_string(repo_dir.join("refs").join(rev))
        .map(|c| c.trim().to_owned())
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| rev.to_owned());
    let dir = repo_dir.join("snapshots").join(&commit);
    if !dir.join(CONFIG_FILE).exists() {
        return Err(not_found());
    }
    Ok(Resolved {
        spec: spec.to_owned(),
        dir,
        repo: Some(spec.to_owned()),
        revision: Some(rev.to_owned()),
        commit: Some(commit),
    })
}

/// [`resolve`] against an explicit hf-hub cache.
pub fn resolve_in(spec: &str, cache: &Cache) -> Result<PathBuf> {
    resolve_cached(spec, None, cache.path()).map(|r| r.dir)
}

/// `org/name`, as hub ids are.
fn looks_like_repo_id(spec: &str) -> bool {
    let mut parts = spec.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The commit of a folder in a hub cache (`.../snapshots/<commit>`).
fn snapshot_commit(dir: &Path) -> Option<String> {
    let parent = dir.parent()?;
    (parent.file_name()? == "snapshots")
        .then(|| dir.file_name()?.to_str().map(str::to_owned))
        .flatten()
}

/// Downloads `repo_id`'s config, tokenizer and safetensors weights at
/// `revision` into the cache and returns the snapshot folder. Refused when
/// `HF_HUB_OFFLINE` is set.
pub fn download(repo_id: &str, revision: Option<&str>, settings: &HubSettings) -> Result<PathBuf> {
    let hub = |message: String| ModelError::Hub {
        repo: repo_id.to_owned(),
        message,
    };
    if settings.offline {
        return Err(hub(
            "HF_HUB_OFFLINE is set, so the hub is not asked\nhint: download the model on a machine that is online, or pass a local folder".into(),
        ));
    }
    let repo = settings
        .api()
        .map_err(|e| hub(e.to_string()))?
        .repo(hf_hub::Repo::with_revision(
            repo_id.to_owned(),
            hf_hub::RepoType::Model,
            revision.unwrap_or("main").to_owned(),
        ));
    let get = |file: &str| repo.get(file).map_err(|e| hub(format!("`{file}`: {e}")));
    let config = get(CONFIG_FILE)?;
    for optional in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    ] {
        // Not every repository has each; the loader names what it lacks.
        let _ = repo.get(optional);
    }
    match repo.get(WEIGHTS_INDEX_FILE) {
        Ok(index_path) => {
            let index = crate::common::read_json(&index_path, "")?;
            let mut shards: Vec<&str> = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| m.values().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                get(shard)?;
            }
        }
        Err(_) => {
            get(WEIGHTS_FILE)?;
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

    /// A hub cache as huggingface_hub lays it out: `refs/main` names
    /// commit `aaa...`, a tag `v1` names `bbb...`.
    fn fake_cache() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--Org--Tiny");
        let main = "a".repeat(40);
        let tagged = "b".repeat(40);
        let mut dirs = Vec::new();
        for commit in [&main, &tagged] {
            let snap = repo.join("snapshots").join(commit);
            std::fs::create_dir_all(&snap).unwrap();
            std::fs::write(snap.join(CONFIG_FILE), "{}").unwrap();
            dirs.push(snap);
        }
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), format!("{main}\n")).unwrap();
        std::fs::write(repo.join("refs/v1"), &tagged).unwrap();
        let tagged_dir = dirs.pop().unwrap();
        (cache, dirs.pop().unwrap(), tagged_dir)
    }

    #[test]
    fn revisions_resolve_through_refs_or_as_commits() {
        let (cache, main_dir, tagged_dir) = fake_cache();
        let r = resolve_cached("Org/Tiny", None, cache.path()).unwrap();
        assert_eq!(r.dir, main_dir);
        assert_eq!(r.commit.as_deref(), Some("a".repeat(40).as_str()));
        assert_eq!(r.revision.as_deref(), Some("main"));
        let r = resolve_cached("Org/Tiny", Some("v1"), cache.path()).unwrap();
        assert_eq!(
            (r.dir, r.commit),
            (tagged_dir.clone(), Some("b".repeat(40)))
        );
        let r = resolve_cached("Org/Tiny", Some(&"b".repeat(40)), cache.path()).unwrap();
        assert_eq!(r.dir, tagged_dir);
        assert!(resolve_cached("Org/Tiny", Some("v2"), cache.path()).is_err());
        // A snapshot folder given as a path still knows its commit.
        let r = resolve_cached(main_dir.to_str().unwrap(), None, cache.path()).unwrap();
        assert_eq!(r.commit, Some("a".repeat(40)));
        assert_eq!(r.repo, None);
    }

    #[test]
    fn settings_follow_huggingface_hub() {
        let vars = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            HubSettings::from_vars(move |k| {
                pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
            })
        };
        let s = vars(&[("HOME", "/home/u")]);
        assert_eq!(s.home, Path::new("/home/u/.cache/huggingface"));
        assert_eq!(s.cache, Path::new("/home/u/.cache/huggingface/hub"));
        assert!(!s.offline && s.token_from.is_none());
        let s = vars(&[("HF_HOME", "/hf"), ("HF_HUB_OFFLINE", "1")]);
        assert_eq!(s.cache, Path::new("/hf/hub"));
        assert!(s.offline);
        let s = vars(&[
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/elsewhere"),
            ("HF_HUB_OFFLINE", "0"),
            ("HF_TOKEN", "hf_secret"),
        ]);
        assert_eq!(s.cache, Path::new("/elsewhere"));
        assert!(!s.offline);
        assert_eq!(s.token_from.as_deref(), Some("HF_TOKEN"));
        assert_eq!(s.token.as_deref(), Some("hf_secret"));
        // Neither Debug nor the JSON a report prints shows the token.
        assert!(!format!("{s:?}").contains("hf_secret"));
        assert!(!serde_json::to_string(&s).unwrap().contains("hf_secret"));
        // The token file under HF_HOME.
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("token"), "hf_file\n").unwrap();
        let s = vars(&[("HF_HOME", home.path().to_str().unwrap())]);
        assert_eq!(s.token.as_deref(), Some("hf_file"));
    }

    #[test]
    fn offline_never_downloads() {
        let cache = tempfile::tempdir().unwrap();
        let s = HubSettings {
            home: cache.path().to_owned(),
            cache: cache.path().to_owned(),
            offline: true,
            token_from: None,
            token: None,
        };
        let err = download("Org/Missing", None, &s).unwrap_err().to_string();
        assert!(
            err.contains("HF_HUB_OFFLINE") && err.contains("hint:"),
            "{err}"
        );
        // Nothing was written to the cache.
        assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
    }
}
