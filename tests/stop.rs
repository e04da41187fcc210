//! The process's stop request (`trace_train::stop`): one flag for the
//! whole process, set by a signal; a second signal ends the process at
//! once. Its own test binary, since a raised signal sets the flag for every
//! test in the process.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{stderr, trace_train};

#[test]
fn one_flag_for_the_process_that_a_signal_sets() {
    assert!(!trace_train::stop::requested(), "no flag installed yet");
    let a = trace_train::stop::flag().unwrap();
    let b = trace_train::stop::flag().unwrap();
    assert!(Arc::ptr_eq(&a, &b), "every stage shares one flag");
    assert!(!trace_train::stop::requested());
    // raise() runs the handlers before it returns.
    signal_hook::low_level::raise(signal_hook::consts::SIGINT).unwrap();
    assert!(trace_train::stop::requested());
}

#[test]
fn a_second_signal_ends_a_run_at_once() {
    // The first SIGTERM asks the run to finish its step and checkpoint; a
    // second one during that step ends the process there (status 1), with
    // no checkpoint and no outputs written after it.
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(dir.path(), &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(
        dir.path().join("s3.json"),
        r#"{"ppo": {"algorithm": "grpo", "environment": "word", "group_size": 2,
                    "dynamic_sampling": false, "batch_size": 8, "num_train_steps": 50,
                    "max_new_tokens": 256, "mini_batch_size": 8, "save_steps": 0,
                    "learning_rate": 0.001, "kl_coef": 0.01}}"#,
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_trace-train"))
        .current_dir(dir.path())
        .args([
            "ppo",
            "--model",
            "base",
            "--config",
            "s3.json",
            "--output_dir",
            "run",
        ])
        .args(["--device", "cpu"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = dir.path().join("run/metrics.jsonl");
    let t = Instant::now();
    // Step 1 logged: step 2 has just begun.
    while std::fs::read_to_string(&metrics).map_or(0, |s| s.lines().count()) < 1 {
        assert!(t.elapsed() < Duration::from_secs(300), "run too slow");
        std::thread::sleep(Duration::from_millis(2));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("stopped by a signal"), "{err}");
    assert!(!dir.path().join("run/final").exists());
    assert!(!dir.path().join("run/step_2").exists());
}
