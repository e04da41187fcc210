//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use trace_train::sandbox::{Executor, ExecutorConfig};

/// One sandbox for a whole test binary (2 workers).
pub fn exec() -> &'static Executor {
    static EXEC: OnceLock<Executor> = OnceLock::new();
    EXEC.get_or_init(|| {
        Executor::new(ExecutorConfig::new("/usr/bin/python3", 2, false))
            .expect("the sandbox needs root and /usr/bin/python3")
    })
}

/// The `trace-train` binary, run in `dir`.
pub fn trace_train(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trace-train"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run trace-train")
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
