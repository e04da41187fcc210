//! `trace-train env`: the bug-report facts, as text and as JSON, on any
//! machine (no GPU is not an error), never showing the HF token.

mod common;

use std::process::{Command, Output};

fn env(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trace-train"))
        .current_dir(common::repo())
        .env("HF_TOKEN", "hf_do_not_print_me")
        .env("HF_HOME", "/nonexistent/hf-home")
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_HUB_CACHE")
        .arg("env")
        .args(args)
        .output()
        .expect("run trace-train")
}

#[test]
fn env_reports_build_machine_gpu_sandbox_and_hf_settings() {
    let o = env(&["--json"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!out.contains("hf_do_not_print_me"), "{out}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["trace_train"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        r["trace_train"]["features"]
            .as_array()
            .unwrap()
            .contains(&"cuda".into()),
        cfg!(feature = "cuda")
    );
    assert!(r["system"]["cpu_cores"].as_u64().unwrap() >= 1);
    assert!(r["system"]["memory_bytes"].as_u64().unwrap() > 0);
    assert!(r["system"]["kernel"].as_str().is_some());
    // Devices or the reason there are none.
    let devices = r["gpu"]["devices"].as_array().unwrap();
    assert!(!devices.is_empty() || r["gpu"]["note"].is_string(), "{r}");
    let sb = &r["sandbox"];
    assert_eq!(sb["python"], "/usr/bin/python3");
    assert!(
        sb["python_version"]
            .as_str()
            .unwrap()
            .starts_with("Python 3"),
        "{sb}"
    );
    // Started with its protections judged, or the reason it did not start.
    assert!(
        sb["protections"].is_object() || sb["error"].is_string(),
        "{sb}"
    );
    let hf = &r["hugging_face"];
    assert_eq!(hf["cache"], "/nonexistent/hf-home/hub");
    assert_eq!(hf["offline"], true);
    assert_eq!(hf["token_from"], "HF_TOKEN");

    let o = env(&[]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!text.contains("hf_do_not_print_me"), "{text}");
    for want in [
        "trace-train ",
        "kernel ",
        "cpu: ",
        "gpu",
        "cudnn: ",
        "sandbox python: /usr/bin/python3 (Python 3",
        "token set (from HF_TOKEN)",
    ] {
        assert!(text.contains(want), "missing {want}: {text}");
    }
}
