//! The NCCL link, with the `cuda` feature (without it, nothing).
//!
//! candle links cudarc's libraries at build time, so with cudarc's `nccl`
//! feature (`dist::nccl` in the trace-train crate) every binary and test
//! that links candle needs a `libnccl.so`. This crate is below all the
//! others, so the folder it names reaches every link. When no NCCL is
//! found (`$NCCL_HOME/lib`, `$CUDA_HOME/lib64`, the system's library
//! folders), a link-time stub with NCCL's symbols and soname
//! (`libnccl.so.2`) is made in `OUT_DIR`; at run time the loader finds the
//! real `libnccl.so.2` (e.g. PyTorch's `nvidia-nccl` wheel on
//! `LD_LIBRARY_PATH`). The stub is never run and never shipped.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    nccl_link();
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
