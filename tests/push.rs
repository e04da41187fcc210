//! `push` against a fake Hub: a local HTTP server (a thread on a
//! `TcpListener`) that answers as the Hub's API does and records every
//! request. Checks the calls in order (method, path, the bearer token), the
//! preupload's file list (a file it says to ignore then left out), the LFS
//! batch and upload of the weights (in one piece, or in the parts a
//! multipart answer asks for, then their ETags), the NDJSON commit's lines
//! and contents; that 401, 404 and 500 answers become errors naming the
//! repository and the status with a non-zero exit; and the refusals before
//! any request (no token, not a model folder).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// One request the fake Hub received.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Request {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A fake Hub on a free port.
struct FakeHub {
    url: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

fn read_request(stream: &mut impl BufRead) -> Option<Request> {
    let mut line = String::new();
    stream.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        stream.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
    }
    let len: usize = headers
        .get("content-length")
        .map_or(0, |l| l.parse().unwrap());
    let mut body = vec![0; len];
    stream.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

/// How the fake Hub answers: `fail` makes every request whose path contains
/// its first element answer with its status; `chunk` asks for multipart
/// LFS uploads of parts of that many bytes.
#[derive(Clone, Copy, Default)]
struct Mode {
    fail: Option<(&'static str, u16)>,
    chunk: Option<usize>,
}

fn start_hub(mode: Mode) -> FakeHub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let (log, base) = (requests.clone(), url.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let Some(req) = read_request(&mut reader) else {
                continue;
            };
            let (status, body) = answer(&req, &base, mode);
            // Storage answers a part with its ETag.
            let etag = req
                .path
                .strip_prefix("/part/")
                .map(|n| format!("ETag: \"etag-{n}\"\r\n"))
                .unwrap_or_default();
            log.lock().unwrap().push(req);
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{etag}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    FakeHub { url, requests }
}

/// The Hub's answers: `.safetensors` files go through LFS, the rest in the
/// commit.
fn answer(req: &Request, base: &str, mode: Mode) -> (u16, String) {
    if let Some((part, status)) = mode.fail
        && req.path.contains(part)
    {
        return (
            status,
            json!({"error": format!("fake {status}")}).to_string(),
        );
    }
    let p = req.path.as_str();
    let body = if p == "/api/repos/create" {
        json!({"url": format!("{base}/alice/tiny")})
    } else if p.contains("/preupload/") {
        let files: Vec<Value> = req.json()["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let path = f["path"].as_str().unwrap();
                let mode = if path.ends_with(".safetensors") {
                    "lfs"
                } else {
                    "regular"
                };
                // As if the repository's .gitignore named `*.log`.
                let ignore = path.ends_with(".log");
                json!({"path": path, "uploadMode": mode, "shouldIgnore": ignore})
            })
            .collect();
        json!({"files": files})
    } else if p.ends_with(".git/info/lfs/objects/batch") {
        let objects: Vec<Value> = req.json()["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                if let Some(chunk) = mode.chunk {
                    let parts = o["size"].as_u64().unwrap().div_ceil(chunk as u64);
                    let mut header = json!({"chunk_size": chunk.to_string()});
                    for i in 1..=parts {
                        header[i.to_string()] = json!(format!("{base}/part/{i}"));
                    }
                    return json!({"oid": o["oid"], "size": o["size"], "actions": {
                        "upload": {"href": format!("{base}/complete"), "header": header}}});
                }
                json!({"oid": o["oid"], "size": o["size"], "actions": {
                    "upload": {"href": format!("{base}/storage/{}", o["oid"].as_str().unwrap()),
                               "header": {"X-Upload-Key": "k"}},
                    "verify": {"href": format!("{base}/verify"), "header": {"Authorization": "Basic v"}}}})
            })
            .collect();
        json!({"transfer": "basic", "objects": objects})
    } else if p.contains("/commit/") {
        json!({"commitUrl": format!("{base}/alice/tiny/commit/abc"), "commitOid": "abc"})
    } else {
        json!({})
    };
    (200, body.to_string())
}

fn push(dir: &Path, args: &[&str], token_env: Option<&str>) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_trace-train"));
    cmd.current_dir(dir)
        .arg("push")
        .args(args)
        .env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN_PATH")
        .env("HF_HOME", dir.join("hf-home"))
        .env("HOME", dir);
    if let Some(t) = token_env {
        cmd.env("HF_TOKEN", t);
    }
    cmd.output().unwrap()
}

/// A small model folder: the tiny chat model with a hidden file and a
/// model card whose base_model is a local path.
fn folder(dir: &Path) -> std::path::PathBuf {
    let model = dir.join("model");
    trace_train::model::arch::tiny::write_tiny_chat_model(&model, 1).unwrap();
    std::fs::write(model.join(".lock"), "").unwrap();
    std::fs::create_dir(model.join("extra")).unwrap();
    std::fs::write(model.join("extra/notes.txt"), "notes").unwrap();
    std::fs::write(model.join("extra/run.log"), "log").unwrap();
    std::fs::write(
        model.join("README.md"),
        "---\nbase_model: ../runs/sft/merged\n---\n# tiny\n",
    )
    .unwrap();
    model
}

#[test]
fn push_creates_the_repo_uploads_lfs_and_commits_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = folder(tmp.path());
    let hub = start_hub(Mode::default());
    let o = push(
        tmp.path(),
        &[
            "model",
            "--repo",
            "alice/tiny",
            "--private",
            "--endpoint",
            &hub.url,
            "--token",
            "hf_test",
        ],
        Some("hf_not_this"),
    );
    let err = common::stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning:") && err.contains("../runs/sft/merged"),
        "{err}"
    );
    let requests = hub.requests.lock().unwrap().clone();
    let calls: Vec<(&str, &str)> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str()))
        .collect();
    let weights = std::fs::read(model.join("model.safetensors")).unwrap();
    let oid: String = Sha256::digest(&weights)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let storage = format!("/storage/{oid}");
    assert_eq!(
        calls,
        [
            ("POST", "/api/repos/create"),
            ("POST", "/api/models/alice/tiny/preupload/main"),
            ("POST", "/alice/tiny.git/info/lfs/objects/batch"),
            ("PUT", storage.as_str()),
            ("POST", "/verify"),
            ("POST", "/api/models/alice/tiny/commit/main"),
        ]
    );
    // The Hub's own calls carry the token; the storage gets only its headers.
    for r in requests
        .iter()
        .filter(|r| !r.path.starts_with("/storage") && r.path != "/verify")
    {
        assert_eq!(r.headers["authorization"], "Bearer hf_test", "{}", r.path);
    }
    assert!(!requests[3].headers.contains_key("authorization"));
    assert_eq!(requests[3].headers["x-upload-key"], "k");
    assert_eq!(requests[4].headers["authorization"], "Basic v");
    assert_eq!(
        requests[0].json(),
        json!({"name": "tiny", "organization": "alice", "private": true})
    );

    let expected = [
        "README.md",
        "config.json",
        "extra/notes.txt",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    // The preupload sees every file; the Hub's `shouldIgnore` keeps the log out.
    let pre = requests[1].json();
    let pre_paths: Vec<&str> = pre["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        pre_paths,
        [&expected[..3], &["extra/run.log"], &expected[3..]].concat()
    );
    assert_eq!(pre["files"][4]["size"], weights.len());
    assert_eq!(
        BASE64
            .decode(pre["files"][4]["sample"].as_str().unwrap())
            .unwrap(),
        weights[..512]
    );

    let batch = requests[2].json();
    assert_eq!(
        requests[2].headers["accept"],
        "application/vnd.git-lfs+json"
    );
    assert_eq!(batch["operation"], "upload");
    assert_eq!(
        batch["objects"],
        json!([{"oid": oid, "size": weights.len()}])
    );
    assert_eq!(requests[3].body, weights);
    assert_eq!(
        requests[4].json(),
        json!({"oid": oid, "size": weights.len()})
    );

    let commit = &requests[5];
    assert_eq!(commit.headers["content-type"], "application/x-ndjson");
    let lines: Vec<Value> = String::from_utf8(commit.body.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["key"], "header");
    assert_eq!(lines[0]["value"]["summary"], "Upload with trace-train");
    let mut seen = Vec::new();
    for line in &lines[1..] {
        let v = &line["value"];
        let path = v["path"].as_str().unwrap();
        seen.push(path);
        match line["key"].as_str().unwrap() {
            "file" => {
                assert_eq!(v["encoding"], "base64");
                let content = BASE64.decode(v["content"].as_str().unwrap()).unwrap();
                assert_eq!(content, std::fs::read(model.join(path)).unwrap(), "{path}");
            }
            "lfsFile" => {
                assert_eq!(path, "model.safetensors");
                assert_eq!(
                    (v["algo"].as_str(), v["oid"].as_str()),
                    (Some("sha256"), Some(oid.as_str()))
                );
            }
            other => panic!("line kind {other}"),
        }
    }
    seen.sort();
    assert_eq!(seen, expected);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        report["commit_url"],
        format!("{}/alice/tiny/commit/abc", hub.url)
    );
    assert_eq!(report["ignored"], json!(["extra/run.log"]));
}

#[test]
fn a_branch_is_created_and_the_token_and_endpoint_come_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let model = folder(tmp.path());
    std::fs::remove_file(model.join("model.safetensors")).unwrap();
    let hub = start_hub(Mode::default());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_trace-train"));
    let o = cmd
        .current_dir(tmp.path())
        .args([
            "push",
            "model",
            "--repo",
            "alice/tiny",
            "--revision",
            "dev/1",
        ])
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_TOKEN", "hf_env")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    let requests = hub.requests.lock().unwrap().clone();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/api/repos/create",
            "/api/models/alice/tiny/branch/dev%2F1",
            "/api/models/alice/tiny/preupload/dev%2F1",
            "/api/models/alice/tiny/commit/dev%2F1",
        ]
    );
    assert!(
        requests
            .iter()
            .all(|r| r.headers["authorization"] == "Bearer hf_env")
    );
}

#[test]
fn hub_errors_name_the_repo_and_the_status_and_fail() {
    for (part, status) in [
        ("/api/repos/create", 401),
        ("/commit/", 404),
        ("/preupload/", 500),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        folder(tmp.path());
        let hub = start_hub(Mode {
            fail: Some((part, status)),
            chunk: None,
        });
        let o = push(
            tmp.path(),
            &["model", "--repo", "alice/tiny", "--endpoint", &hub.url],
            Some("hf_test"),
        );
        assert!(!o.status.success(), "{part}");
        assert_eq!(o.status.code(), Some(1));
        let err = common::stderr(&o);
        assert!(
            err.contains("`alice/tiny`")
                && err.contains(&format!("HTTP {status}"))
                && err.contains(&format!("fake {status}"))
                && err.contains("hint:"),
            "{err}"
        );
        let commits = hub
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path.contains("/commit/"))
            .count();
        assert_eq!(commits, usize::from(part == "/commit/"), "{part}");
    }
}

#[test]
fn no_token_or_no_model_folder_is_refused_before_any_request() {
    let tmp = tempfile::tempdir().unwrap();
    folder(tmp.path());
    let hub = start_hub(Mode::default());
    let o = push(
        tmp.path(),
        &["model", "--repo", "alice/tiny", "--endpoint", &hub.url],
        None,
    );
    assert!(!o.status.success());
    assert!(
        common::stderr(&o).contains("no Hugging Face token"),
        "{}",
        common::stderr(&o)
    );
    // The token file `hf auth login` writes is read.
    std::fs::create_dir(tmp.path().join("hf-home")).unwrap();
    std::fs::write(tmp.path().join("hf-home/token"), "hf_file\n").unwrap();
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let o = push(
        tmp.path(),
        &["empty", "--repo", "alice/tiny", "--endpoint", &hub.url],
        None,
    );
    assert!(!o.status.success());
    assert!(
        common::stderr(&o).contains("is not a model or adapter folder"),
        "{}",
        common::stderr(&o)
    );
    assert!(hub.requests.lock().unwrap().is_empty());
    let o = push(
        tmp.path(),
        &["model", "--repo", "alice/tiny", "--endpoint", &hub.url],
        None,
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(
        hub.requests.lock().unwrap()[0].headers["authorization"],
        "Bearer hf_file"
    );
}

#[test]
fn a_multipart_lfs_upload_sends_each_part_then_their_etags() {
    let tmp = tempfile::tempdir().unwrap();
    let model = folder(tmp.path());
    let weights = std::fs::read(model.join("model.safetensors")).unwrap();
    let chunk = weights.len() / 3 + 1;
    let hub = start_hub(Mode {
        fail: None,
        chunk: Some(chunk),
    });
    let o = push(
        tmp.path(),
        &[
            "model",
            "--repo",
            "alice/tiny",
            "--endpoint",
            &hub.url,
            "--token",
            "hf_test",
        ],
        None,
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let requests = hub.requests.lock().unwrap().clone();
    let parts: Vec<&Request> = requests
        .iter()
        .filter(|r| r.path.starts_with("/part/"))
        .collect();
    assert_eq!(parts.len(), 3);
    for (i, part) in parts.iter().enumerate() {
        assert_eq!(part.method, "PUT");
        assert_eq!(part.path, format!("/part/{}", i + 1));
        assert!(!part.headers.contains_key("authorization"));
        assert_eq!(
            part.body,
            weights[i * chunk..((i + 1) * chunk).min(weights.len())]
        );
    }
    let complete = requests.iter().find(|r| r.path == "/complete").unwrap();
    let oid: String = Sha256::digest(&weights)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        complete.json(),
        json!({"oid": oid, "parts": [
            {"partNumber": 1, "etag": "\"etag-1\""},
            {"partNumber": 2, "etag": "\"etag-2\""},
            {"partNumber": 3, "etag": "\"etag-3\""}]})
    );
    assert!(requests.last().unwrap().path.contains("/commit/"));
}
