//! Uploading a model or adapter folder to the Hugging Face Hub, through the
//! Hub's HTTP API as `huggingface_hub`'s `upload_folder` uses it (the
//! `hf-hub` crate downloads only):
//!
//! 1. `POST /api/repos/create` (`{"name", "organization", "private"}`); a
//!    409 means the repository exists, which is fine;
//! 2. for a `--revision` other than `main`, `POST
//!    /api/models/{repo}/branch/{revision}` (409: the branch exists);
//! 3. `POST /api/models/{repo}/preupload/{revision}`: each file's path, size
//!    and first 512 bytes (base64); the Hub answers `regular` or `lfs`;
//! 4. the LFS files through the Git LFS batch API (`POST
//!    {repo}.git/info/lfs/objects/batch`, sha256 ids): each object the Hub
//!    does not hold yet is `PUT` to the address it gives (in parts when it
//!    asks for a multipart upload), then verified;
//! 5. one commit, `POST /api/models/{repo}/commit/{revision}`, as NDJSON: a
//!    `header` line (the summary), a `file` line a regular file (its bytes
//!    in base64) and an `lfsFile` line a large one (its sha256).
//!
//! Every Hub request carries `Authorization: Bearer TOKEN`; the LFS storage
//! addresses get only the headers the batch answer names.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::CONFIG_FILE;
use crate::io::adapter::ADAPTER_CONFIG_FILE;

/// The Hub used when neither `--endpoint` nor `HF_ENDPOINT` is set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Bytes of each file the preupload call sees.
const SAMPLE_BYTES: usize = 512;
/// Files a preupload call asks about at most.
const PREUPLOAD_BATCH: usize = 250;

/// A push that cannot go ahead or that the Hub refused.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(
        "`{}` is not a model or adapter folder: it holds neither `config.json` nor `adapter_config.json`\nhint: push a model folder (a run's `merged/`, `model merge`'s output) or an adapter folder (a run's `final/`)",
        dir.display()
    )]
    NotModel { dir: PathBuf },
    #[error(
        "no Hugging Face token\nhint: pass --token, set HF_TOKEN, or log in with `hf auth login` (it writes `{}`)",
        path.display()
    )]
    NoToken { path: PathBuf },
    #[error(
        "invalid repository `{repo}`: {why}\nhint: name it OWNER/NAME, e.g. `alice/smollm2-sft`"
    )]
    Repo { repo: String, why: String },
    #[error("pushing to `{repo}`: {step} failed with HTTP {status}: {message}\nhint: {hint}")]
    Status {
        repo: String,
        step: String,
        status: u16,
        message: String,
        hint: String,
    },
    #[error(
        "pushing to `{repo}`: {step} failed: {message}\nhint: check --endpoint / HF_ENDPOINT and the network"
    )]
    Transport {
        repo: String,
        step: String,
        message: String,
    },
    #[error(
        "pushing to `{repo}`: {step}: the Hub's answer is not what its API documents: {message}"
    )]
    Answer {
        repo: String,
        step: String,
        message: String,
    },
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What to push where.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// `OWNER/NAME`.
    pub repo: String,
    /// Create the repository private (an existing one keeps its setting).
    pub private: bool,
    /// The branch to commit to.
    pub revision: String,
    /// The Hub's address, without a trailing slash.
    pub endpoint: String,
    pub token: String,
    /// The commit's summary.
    pub message: String,
}

/// What [`push`] did.
#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    pub repo: String,
    pub revision: String,
    /// The commit's address, as the Hub gives it.
    pub commit_url: Option<String>,
    /// Files sent in the commit itself.
    pub regular: Vec<String>,
    /// Files sent through LFS.
    pub lfs: Vec<String>,
    /// LFS files the Hub already held (not uploaded again).
    pub lfs_already_there: usize,
    /// Files the repository's `.gitignore` excludes, as the Hub said: not
    /// sent.
    pub ignored: Vec<String>,
}

/// The token: `flag`, else `HF_TOKEN`, else the token file `hf auth login`
/// writes (`$HF_HOME/token`, by default `~/.cache/huggingface/token`).
pub fn token(
    flag: Option<&str>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<String, PushError> {
    let nonempty = |s: String| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
    if let Some(t) = flag.map(str::to_owned).and_then(nonempty) {
        return Ok(t);
    }
    if let Some(t) = var("HF_TOKEN").and_then(nonempty) {
        return Ok(t);
    }
    let path = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| {
        var("HF_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(var("HOME").unwrap_or_default()).join(".cache/huggingface")
            })
            .join("token")
    });
    std::fs::read_to_string(&path)
        .ok()
        .and_then(nonempty)
        .ok_or(PushError::NoToken { path })
}

/// The endpoint: `flag`, else `HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`].
pub fn endpoint(flag: Option<&str>, var: impl Fn(&str) -> Option<String>) -> String {
    flag.map(str::to_owned)
        .or_else(|| var("HF_ENDPOINT"))
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
        .trim_end_matches('/')
        .to_owned()
}

/// Checks that `dir` is a model or adapter folder; returns warnings about
/// what a reader of the repository would trip on: a `base_model` (in the
/// model card or `adapter_config.json`) that is a local path.
pub fn check_folder(dir: &Path) -> Result<Vec<String>, PushError> {
    let adapter = dir.join(ADAPTER_CONFIG_FILE);
    if !dir.join(CONFIG_FILE).is_file() && !adapter.is_file() {
        return Err(PushError::NotModel {
            dir: dir.to_owned(),
        });
    }
    let mut warnings = Vec::new();
    let card = dir.join("README.md");
    if let Ok(text) = std::fs::read_to_string(&card) {
        for base in card_base_models(&text) {
            if looks_local(&base, dir) {
                warnings.push(format!(
                    "`{}` names `{base}` as base_model, a local path that means nothing on the Hub; write the base's Hub id there",
                    card.display()
                ));
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string(&adapter)
        && let Ok(config) = serde_json::from_str::<Value>(&text)
        && let Some(base) = config["base_model_name_or_path"].as_str()
        && looks_local(base, dir)
    {
        warnings.push(format!(
            "`{}` names `{base}` as base_model_name_or_path, a local path; PEFT on another machine will not find it",
            adapter.display()
        ));
    }
    Ok(warnings)
}

/// The `base_model` values of a model card's YAML front matter (a scalar
/// or a list).
fn card_base_models(card: &str) -> Vec<String> {
    let mut lines = card.lines();
    if lines.next().map(str::trim) != Some("---") {
        return Vec::new();
    }
    let front: Vec<&str> = lines.take_while(|l| l.trim() != "---").collect();
    let unquote = |s: &str| s.trim().trim_matches(|c| c == '"' || c == '\'').to_owned();
    let mut out = Vec::new();
    let mut in_list = false;
    for line in front {
        if let Some(rest) = line.strip_prefix("base_model:") {
            in_list = rest.trim().is_empty();
            if !in_list {
                out.push(unquote(rest));
            }
        } else if in_list && let Some(item) = line.trim_start().strip_prefix("- ") {
            out.push(unquote(item));
        } else {
            in_list = false;
        }
    }
    out
}

/// Whether `base` reads as a path on this machine rather than a Hub id
/// (`OWNER/NAME` or a bare legacy name).
fn looks_local(base: &str, dir: &Path) -> bool {
    base.starts_with(['.', '/', '~'])
        || base.contains('\\')
        || base.matches('/').count() > 1
        || Path::new(base).exists()
        || dir.join(base).exists()
}

/// Every file under `dir` to upload, by its path in the repository
/// (`/`-separated, sorted); hidden files and folders (a leading `.`, such
/// as a run's lock or a partial file) are left out.
fn files(dir: &Path) -> Result<Vec<(String, PathBuf)>, PushError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), PushError> {
        let read = |source| PushError::Read {
            path: dir.to_owned(),
            source,
        };
        for entry in std::fs::read_dir(dir).map_err(read)? {
            let path = entry.map_err(read)?.path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out)?;
            } else if path.is_file() {
                let rel = path.strip_prefix(root).expect("under the root");
                let name: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push((name.join("/"), path));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// Percent-encodes a path segment (a revision such as `refs/pr/1` becomes
/// one segment).
fn quote(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn check_repo(repo: &str) -> Result<(&str, &str), PushError> {
    let bad = |why: &str| PushError::Repo {
        repo: repo.to_owned(),
        why: why.to_owned(),
    };
    let (owner, name) = repo.split_once('/').ok_or_else(|| bad("it has no owner"))?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !ok(owner) || !ok(name) {
        return Err(bad(
            "the owner and the name are letters, digits, `-`, `_` and `.`, separated by one `/`",
        ));
    }
    Ok((owner, name))
}

/// How the Hub wants a file: in the commit, through LFS, or not at all
/// (`shouldIgnore`: the repository's `.gitignore` names it).
enum Mode {
    Regular,
    Lfs,
    Ignored,
}

/// One file's facts the upload needs.
struct Local {
    path_in_repo: String,
    path: PathBuf,
    size: u64,
}

/// The HTTP calls, each naming its step in errors.
struct Hub<'a> {
    agent: ureq::Agent,
    options: &'a PushOptions,
}

impl Hub<'_> {
    fn api(&self, path: &str) -> String {
        format!("{}{path}", self.options.endpoint)
    }

    fn error(&self, step: &str, e: ureq::Error) -> PushError {
        let repo = self.options.repo.clone();
        match e {
            ureq::Error::Status(status, response) => {
                let body = response.into_string().unwrap_or_default();
                let message = serde_json::from_str::<Value>(&body)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_owned))
                    .unwrap_or(body);
                let mut message: String = message.chars().take(300).collect();
                if message.is_empty() {
                    message = "(no message)".to_owned();
                }
                let hint = match status {
                    401 => "the Hub refused the token: check --token, HF_TOKEN or `hf auth login`",
                    403 => {
                        "the token may not write to this repository: use a token with write access to its owner"
                    }
                    404 => {
                        "no such repository or revision, or the token cannot see it: check --repo and --revision"
                    }
                    500..=599 => "the Hub failed; try again later",
                    _ => "see the Hub's message above",
                };
                PushError::Status {
                    repo,
                    step: step.to_owned(),
                    status,
                    message,
                    hint: hint.to_owned(),
                }
            }
            e => PushError::Transport {
                repo,
                step: step.to_owned(),
                message: e.to_string(),
            },
        }
    }

    fn answer(&self, step: &str, message: impl Into<String>) -> PushError {
        PushError::Answer {
            repo: self.options.repo.clone(),
            step: step.to_owned(),
            message: message.into(),
        }
    }

    fn post_json(&self, step: &str, url: &str, body: &Value) -> Result<Value, PushError> {
        let response = self
            .agent
            .post(url)
            .set("Authorization", &format!("Bearer {}", self.options.token))
            .send_json(body)
            .map_err(|e| self.error(step, e))?;
        let text = response
            .into_string()
            .map_err(|e| self.answer(step, e.to_string()))?;
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A POST whose 409 (already there) is success.
    fn create(&self, step: &str, url: &str, body: &Value) -> Result<(), PushError> {
        match self.post_json(step, url, body) {
            Err(PushError::Status { status: 409, .. }) | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Pushes the folder `dir` to the Hub as one commit (see the module
/// header).
pub fn push(dir: &Path, options: &PushOptions) -> Result<PushReport, PushError> {
    let (owner, name) = check_repo(&options.repo)?;
    let hub = Hub {
        agent: ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(300))
            .build(),
        options,
    };
    let repo = &options.repo;
    let rev = quote(&options.revision);

    hub.create(
        "creating the repository",
        &hub.api("/api/repos/create"),
        &json!({"name": name, "organization": owner, "private": options.private}),
    )?;
    if options.revision != "main" && !options.revision.starts_with("refs/") {
        hub.create(
            "creating the branch",
            &hub.api(&format!("/api/models/{repo}/branch/{rev}")),
            &json!({}),
        )?;
    }

    let mut locals = Vec::new();
    for (path_in_repo, path) in files(dir)? {
        let size = std::fs::metadata(&path)
            .map_err(|source| PushError::Read {
                path: path.clone(),
                source,
            })?
            .len();
        locals.push(Local {
            path_in_repo,
            path,
            size,
        });
    }

    // Regular or LFS, as the Hub decides.
    let step = "asking the Hub which files go through LFS (preupload)";
    let mut modes = BTreeMap::new();
    for batch in locals.chunks(PREUPLOAD_BATCH) {
        let mut files = Vec::new();
        for f in batch {
            let mut sample = Vec::with_capacity(SAMPLE_BYTES);
            read_file(&f.path)?
                .take(SAMPLE_BYTES as u64)
                .read_to_end(&mut sample)
                .map_err(|source| PushError::Read {
                    path: f.path.clone(),
                    source,
                })?;
            files.push(
                json!({"path": f.path_in_repo, "size": f.size, "sample": BASE64.encode(&sample)}),
            );
        }
        let answer = hub.post_json(
            step,
            &hub.api(&format!("/api/models/{repo}/preupload/{rev}")),
            &json!({"files": files}),
        )?;
        for f in answer["files"].as_array().into_iter().flatten() {
            if let (Some(path), Some(mode)) = (f["path"].as_str(), f["uploadMode"].as_str()) {
                let mode = if f["shouldIgnore"] == true {
                    Mode::Ignored
                } else if mode == "lfs" {
                    Mode::Lfs
                } else {
                    Mode::Regular
                };
                modes.insert(path.to_owned(), mode);
            }
        }
    }
    let mut regular = Vec::new();
    let mut lfs = Vec::new();
    let mut ignored = Vec::new();
    for f in locals {
        match modes.get(&f.path_in_repo) {
            Some(Mode::Lfs) => lfs.push(f),
            Some(Mode::Regular) => regular.push(f),
            Some(Mode::Ignored) => ignored.push(f.path_in_repo),
            None => {
                return Err(hub.answer(step, format!("no upload mode for `{}`", f.path_in_repo)));
            }
        }
    }

    let mut oids = Vec::new();
    for f in &lfs {
        oids.push(sha256(&f.path)?);
    }
    let lfs_already_there = upload_lfs(&hub, &lfs, &oids)?;

    // The commit.
    let mut lines =
        vec![json!({"key": "header", "value": {"summary": options.message, "description": ""}})];
    for f in &regular {
        let mut bytes = Vec::new();
        read_file(&f.path)?
            .read_to_end(&mut bytes)
            .map_err(|source| PushError::Read {
                path: f.path.clone(),
                source,
            })?;
        lines.push(json!({"key": "file", "value": {
            "path": f.path_in_repo, "content": BASE64.encode(&bytes), "encoding": "base64"}}));
    }
    for (f, oid) in lfs.iter().zip(&oids) {
        lines.push(json!({"key": "lfsFile", "value": {
            "path": f.path_in_repo, "algo": "sha256", "oid": oid}}));
    }
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let step = "committing";
    let response = hub
        .agent
        .post(&hub.api(&format!("/api/models/{repo}/commit/{rev}")))
        .set("Authorization", &format!("Bearer {}", options.token))
        .set("Content-Type", "application/x-ndjson")
        .send_string(&body)
        .map_err(|e| hub.error(step, e))?;
    let answer: Value = response
        .into_string()
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    Ok(PushReport {
        repo: repo.clone(),
        revision: options.revision.clone(),
        commit_url: answer["commitUrl"].as_str().map(str::to_owned),
        regular: regular.into_iter().map(|f| f.path_in_repo).collect(),
        lfs: lfs.into_iter().map(|f| f.path_in_repo).collect(),
        lfs_already_there,
        ignored,
    })
}

fn read_file(path: &Path) -> Result<std::fs::File, PushError> {
    std::fs::File::open(path).map_err(|source| PushError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The file's sha256, lowercase hex (Git LFS's object id).
fn sha256(path: &Path) -> Result<String, PushError> {
    let mut file = read_file(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|source| PushError::Read {
            path: path.to_owned(),
            source,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Uploads the LFS objects the Hub does not hold; returns how many it held.
fn upload_lfs(hub: &Hub, files: &[Local], oids: &[String]) -> Result<usize, PushError> {
    if files.is_empty() {
        return Ok(0);
    }
    let options = hub.options;
    let step = "asking for LFS upload addresses (batch)";
    let objects: Vec<Value> = files
        .iter()
        .zip(oids)
        .map(|(f, oid)| json!({"oid": oid, "size": f.size}))
        .collect();
    let body = json!({
        "operation": "upload",
        "transfers": ["basic", "multipart"],
        "objects": objects,
        "hash_algo": "sha256",
        "ref": {"name": options.revision},
    });
    let response = hub
        .agent
        .post(&hub.api(&format!("/{}.git/info/lfs/objects/batch", options.repo)))
        .set("Authorization", &format!("Bearer {}", options.token))
        .set("Accept", "application/vnd.git-lfs+json")
        .set("Content-Type", "application/vnd.git-lfs+json")
        .send_string(&body.to_string())
        .map_err(|e| hub.error(step, e))?;
    let answer: Value = response
        .into_json()
        .map_err(|e| hub.answer(step, e.to_string()))?;
    let mut held = 0;
    for (f, oid) in files.iter().zip(oids) {
        let object = answer["objects"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["oid"] == oid.as_str())
            .ok_or_else(|| hub.answer(step, format!("no object for `{}`", f.path_in_repo)))?;
        if !object["error"].is_null() {
            return Err(hub.answer(step, format!("`{}`: {}", f.path_in_repo, object["error"])));
        }
        let actions = &object["actions"];
        let Some(upload) = actions.get("upload") else {
            held += 1;
            continue;
        };
        let step = format!("uploading `{}` (LFS)", f.path_in_repo);
        let href = upload["href"]
            .as_str()
            .ok_or_else(|| hub.answer(&step, "no `href`"))?;
        let header = upload["header"].as_object().cloned().unwrap_or_default();
        match header.get("chunk_size") {
            Some(chunk) => {
                let chunk = chunk
                    .as_str()
                    .and_then(|c| c.parse::<u64>().ok())
                    .or_else(|| chunk.as_u64())
                    .filter(|&c| c > 0)
                    .ok_or_else(|| hub.answer(&step, "invalid `chunk_size`"))?;
                upload_parts(hub, &step, f, oid, href, &header, chunk)?;
            }
            None => {
                let mut request = hub
                    .agent
                    .put(href)
                    .set("Content-Length", &f.size.to_string());
                for (k, v) in &header {
                    if let Some(v) = v.as_str() {
                        request = request.set(k, v);
                    }
                }
                request
                    .send(read_file(&f.path)?)
                    .map_err(|e| hub.error(&step, e))?;
            }
        }
        if let Some(verify) = actions.get("verify") {
            let href = verify["href"]
                .as_str()
                .ok_or_else(|| hub.answer(&step, "no verify `href`"))?;
            let mut request = hub.agent.post(href);
            for (k, v) in verify["header"].as_object().into_iter().flatten() {
                if let Some(v) = v.as_str() {
                    request = request.set(k, v);
                }
            }
            request
                .send_json(json!({"oid": oid, "size": f.size}))
                .map_err(|e| hub.error(&format!("verifying `{}` (LFS)", f.path_in_repo), e))?;
        }
    }
    Ok(held)
}

/// A multipart LFS upload: part `i` (from 1) of `chunk` bytes is `PUT` to
/// the address under the header's key `i`; the parts' ETags are then
/// posted to `href`.
fn upload_parts(
    hub: &Hub,
    step: &str,
    f: &Local,
    oid: &str,
    href: &str,
    header: &serde_json::Map<String, Value>,
    chunk: u64,
) -> Result<(), PushError> {
    let count = f.size.div_ceil(chunk);
    let mut file = read_file(&f.path)?;
    let mut parts = Vec::new();
    for i in 1..=count {
        let url = header
            .get(&i.to_string())
            .and_then(Value::as_str)
            .ok_or_else(|| hub.answer(step, format!("no address for part {i}")))?;
        let mut bytes = Vec::new();
        (&mut file)
            .take(chunk)
            .read_to_end(&mut bytes)
            .map_err(|source| PushError::Read {
                path: f.path.clone(),
                source,
            })?;
        let response = hub
            .agent
            .put(url)
            .send_bytes(&bytes)
            .map_err(|e| hub.error(step, e))?;
        let etag = response.header("ETag").unwrap_or_default().to_owned();
        parts.push(json!({"partNumber": i, "etag": etag}));
    }
    hub.agent
        .post(href)
        .send_json(json!({"oid": oid, "parts": parts}))
        .map_err(|e| hub.error(step, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comes_from_the_flag_then_the_variable_then_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().to_str().unwrap().to_owned();
        let vars = |token: Option<&str>| {
            let home = home.clone();
            let token = token.map(str::to_owned);
            move |k: &str| match k {
                "HF_TOKEN" => token.clone(),
                "HF_HOME" => Some(home.clone()),
                _ => None,
            }
        };
        assert_eq!(
            token(Some("hf_flag"), vars(Some("hf_var"))).unwrap(),
            "hf_flag"
        );
        assert_eq!(token(None, vars(Some("hf_var"))).unwrap(), "hf_var");
        let e = token(None, vars(None)).unwrap_err().to_string();
        assert!(e.starts_with("no Hugging Face token\nhint: "), "{e}");
        std::fs::write(tmp.path().join("token"), "hf_file\n").unwrap();
        assert_eq!(token(None, vars(None)).unwrap(), "hf_file");
        assert_eq!(token(Some(" "), vars(Some(""))).unwrap(), "hf_file");
    }

    #[test]
    fn base_models_are_read_from_the_front_matter() {
        let card = "---\nlicense: mit\nbase_model: ../runs/sft/merged\ntags:\n- x\n---\n# Card\nbase_model: not-this";
        assert_eq!(card_base_models(card), ["../runs/sft/merged"]);
        let card =
            "---\nbase_model:\n  - \"Qwen/Qwen3-4B\"\n  - ./local\nlibrary_name: peft\n---\n";
        assert_eq!(card_base_models(card), ["Qwen/Qwen3-4B", "./local"]);
        let dir = Path::new("/nonexistent");
        assert!(!looks_local("Qwen/Qwen3-4B", dir));
        assert!(looks_local("./local", dir) && looks_local("runs/sft/merged", dir));
    }

    #[test]
    fn repositories_and_revisions_are_checked_and_quoted() {
        assert!(check_repo("alice/tiny-1.0").is_ok());
        for bad in ["tiny", "a/b/c", "/x", "a b/c"] {
            assert!(check_repo(bad).is_err(), "{bad}");
        }
        assert_eq!(quote("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(quote("main"), "main");
    }
}
