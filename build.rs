//! Build steps of the trace-train crate: the git commit for `trace-train
//! env`, the built-in corpora's folders, and with `cuda` the NCCL link (the
//! model crate's `build.rs` compiles the CUDA kernels and the cuDNN shim).
//!
//! - `cuda`, NCCL: candle links cudarc's libraries at build time, so with
//!   cudarc's `nccl` feature (`dist::nccl`) the link needs a `libnccl.so`.
//!   When none is found (`$NCCL_HOME/lib`, `$CUDA_HOME/lib64`, the system's
//!   library folders), a link-time stub with NCCL's symbols and soname
//!   (`libnccl.so.2`) is made in `OUT_DIR`; at run time the loader finds
//!   the real `libnccl.so.2` (e.g. PyTorch's `nvidia-nccl` wheel on
//!   `LD_LIBRARY_PATH`). The stub is never run and never shipped.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The built-in corpora are embedded with `include_dir!`, which tracks
    // the files it found but not the folders: a program added later would
    // not rebuild the crate. Watching the folders reruns this script, and
    // so recompiles the crate, when a file comes or goes.
    println!("cargo:rerun-if-changed=datasets");
    git_commit();
    nccl_link();
}

/// `TRACE_TRAIN_GIT_COMMIT` for `trace-train env`: the commit being built,
/// when this is a git checkout with git installed (a tarball build has
/// none). The build reruns when HEAD or the branch it names moves.
fn git_commit() {
    let git = |args: &[&str]| -> Option<String> {
        let o = Command::new("git").args(args).output().ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let Some(commit) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    // No "-dirty" mark: the script does not rerun on every source edit, so
    // it could not keep one true.
    println!("cargo:rustc-env=TRACE_TRAIN_GIT_COMMIT={commit}");
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        // Only files that exist: a missing one would rerun every build.
        if let Some(path) = git(&["rev-parse", "--git-path", &name]).map(PathBuf::from)
            && path.exists()
        {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

/// NCCL's functions that cudarc 0.19 declares (its `nccl::sys`).
const NCCL_SYMBOLS: &str = "ncclAllGather ncclAllReduce ncclAlltoAll ncclBcast ncclBroadcast \
    ncclCommAbort ncclCommCount ncclCommCuDevice ncclCommDeregister ncclCommDestroy \
    ncclCommFinalize ncclCommGetAsyncError ncclCommGetUniqueId ncclCommGrow ncclCommInitAll \
    ncclCommInitRank ncclCommInitRankConfig ncclCommInitRankScalable ncclCommMemStats \
    ncclCommRegister ncclCommResume ncclCommRevoke ncclCommShrink ncclCommSplit ncclCommSuspend \
    ncclCommUserRank ncclCommWindowDeregister ncclCommWindowRegister ncclGather \
    ncclGetErrorString ncclGetLastError ncclGetUniqueId ncclGetVersion ncclGroupEnd \
    ncclGroupSimulateEnd ncclGroupStart ncclMemAlloc ncclMemFree ncclParamBind \
    ncclParamDumpAll ncclParamGet ncclParamGetAllParameterKeys ncclParamGetI \
    ncclParamGetParameter ncclParamGetStr ncclParamGetU ncclPutSignal ncclRecv \
    ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclReduceScatter ncclResetDebugInit \
    ncclScatter ncclSend ncclSignal ncclWaitSignal ncclWinGetUserPtr";

fn nccl_link() {
    println!("cargo:rerun-if-env-changed=NCCL_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let env_dir = |var: &str, sub: &str| std::env::var_os(var).map(|h| Path::new(&h).join(sub));
    let candidates = [
        env_dir("NCCL_HOME", "lib"),
        env_dir("CUDA_HOME", "lib64"),
        Some(PathBuf::from("/usr/lib/x86_64-linux-gnu")),
        Some(PathBuf::from("/usr/local/cuda/lib64")),
    ];
    if let Some(dir) = candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("libnccl.so").exists())
    {
        println!("cargo:rustc-link-search=native={}", dir.display());
        return;
    }
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("nccl-stub");
    std::fs::create_dir_all(&out).expect("OUT_DIR is writable");
    let source = out.join("nccl_stub.c");
    let body: String = NCCL_SYMBOLS
        .split_whitespace()
        .map(|f| format!("void {f}(void) {{}}\n"))
        .collect();
    std::fs::write(&source, body).expect("OUT_DIR is writable");
    let status = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
        .args(["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o"])
        .arg(out.join("libnccl.so"))
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler for the NCCL link stub: {e}\nhint: install gcc, or set NCCL_HOME to an NCCL install"));
    if !status.success() {
        panic!("the NCCL link stub did not compile ({status})");
    }
    println!("cargo:rustc-link-search=native={}", out.display());
}
