//! The process's stop request (`trace_train::stop`): one flag for the
//! whole process, set by a signal; a second signal ends the process at
//! once. Its own test binary, since a raised signal sets the flag for every
//! test in the process.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{ppo_args, signal, start, wait_for_steps, word_grpo};

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
    word_grpo(dir.path(), 8, 50, 256);
    let child = start(dir.path(), &ppo_args("run", &[]), Stdio::piped());
    // Step 1 logged: step 2 has just begun.
    wait_for_steps(
        &dir.path().join("run/metrics.jsonl"),
        1,
        Duration::from_secs(300),
    );
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(20));
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("stopped by a signal"), "{err}");
    assert!(!dir.path().join("run/final").exists());
    assert!(!dir.path().join("run/step_2").exists());
}
