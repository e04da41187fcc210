//! Build steps: the git commit for `trace-train env`, and the GPU
//! features' (without them, nothing more).
//!
//! - `cuda`: compiles every `src/kernels/*.cu` to a fat binary in `OUT_DIR`
//!   with nvcc (`$CUDA_HOME/bin/nvcc` when `CUDA_HOME` is set, else `nvcc`
//!   on the PATH): SASS for `sm_$CUDA_COMPUTE_CAP` (default 90) and its PTX
//!   for newer GPUs.
//! - `cudnn`: compiles the cuDNN attention shim (`csrc/sdpa_cudnn.cpp`).
//!   Headers come from `scripts/fetch-cudnn-headers.sh`: cuDNN's
//!   (`CUDNN_INCLUDE_DIR`, default `/opt/cudnn/cudnn/include`), the
//!   cudnn-frontend's (`CUDNN_FRONTEND_INCLUDE_DIR`, default
//!   `/opt/cudnn/frontend/include`) and CUDA's (`$CUDA_HOME/include`,
//!   default `/opt/cuda13/include`). No cuDNN or CUDA runtime library is
//!   linked: the shim opens `libcudnn.so.9` with `dlopen` when attention
//!   first runs.
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
    git_commit();
    cuda_kernels();
    nccl_link();
    #[cfg(feature = "cudnn")]
    cudnn::build();
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

fn cuda_kernels() {
    println!("cargo:rerun-if-changed=build.rs");
    // The built-in corpora are embedded with `include_dir!`, which tracks
    // the files it found but not the folders: a program added later would
    // not rebuild the crate. Watching the folders reruns this script, and
    // so recompiles the crate, when a file comes or goes.
    println!("cargo:rerun-if-changed=datasets");
    println!("cargo:rerun-if-changed=src/kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".to_owned());
    let cap = cap.trim().replace('.', "");
    if cap.is_empty() || !cap.chars().all(|c| c.is_ascii_digit()) {
        panic!("CUDA_COMPUTE_CAP must be a compute capability such as 90 or 8.9, got `{cap}`");
    }
    println!("cargo:rustc-env=TRACE_TRAIN_CUDA_CAP={cap}");
    let nvcc = std::env::var_os("CUDA_HOME")
        .map(|home| Path::new(&home).join("bin").join("nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));

    let mut sources: Vec<PathBuf> = std::fs::read_dir("src/kernels")
        .expect("src/kernels holds the CUDA kernels")
        .map(|entry| entry.expect("readable src/kernels").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    for source in sources {
        println!("cargo:rerun-if-changed={}", source.display());
        let stem = source.file_stem().expect("a file name").to_string_lossy();
        let fatbin = out_dir.join(format!("{stem}.fatbin"));
        // SASS for the build's architecture (loads at once: no driver JIT
        // on a fresh machine) and PTX of it for newer GPUs.
        let status = Command::new(&nvcc)
            .arg("--fatbin")
            .arg(format!("-gencode=arch=compute_{cap},code=sm_{cap}"))
            .arg(format!("-gencode=arch=compute_{cap},code=compute_{cap}"))
            .arg("-O3")
            .arg("-o")
            .arg(&fatbin)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{}` to compile {}: {e}\nhint: install the CUDA toolkit and set \
                     CUDA_HOME or put nvcc on the PATH",
                    nvcc.display(),
                    source.display()
                )
            });
        if !status.success() {
            panic!("nvcc failed on {} ({status})", source.display());
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

#[cfg(feature = "cudnn")]
mod cudnn {
    use std::path::PathBuf;

    const SOURCE: &str = "csrc/sdpa_cudnn.cpp";

    fn dir(var: &str, default: &str, marker: &str) -> PathBuf {
        println!("cargo:rerun-if-env-changed={var}");
        let path = std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(default));
        if !path.join(marker).is_file() {
            panic!(
                "the `cudnn` feature needs `{marker}` in `{}` ({var}); run `bash scripts/fetch-cudnn-headers.sh` \
                 (CUDA's headers: set CUDA_HOME), or point {var} at the folder",
                path.display()
            );
        }
        path
    }

    pub fn build() {
        println!("cargo:rerun-if-changed={SOURCE}");
        let cudnn = dir(
            "CUDNN_INCLUDE_DIR",
            "/opt/cudnn/cudnn/include",
            "cudnn_graph.h",
        );
        let frontend = dir(
            "CUDNN_FRONTEND_INCLUDE_DIR",
            "/opt/cudnn/frontend/include",
            "cudnn_frontend.h",
        );
        let cuda_home = std::env::var("CUDA_HOME").unwrap_or_else(|_| "/opt/cuda13".to_owned());
        let cuda = dir_of_cuda(&cuda_home);
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std("c++17")
            .file(SOURCE)
            .define("NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING", None)
            .define("CUDNN_FRONTEND_SKIP_JSON_LIB", None)
            .warnings(true)
            .extra_warnings(true);
        // System includes: the vendor headers' own warnings are not ours.
        for include in [&frontend, &cudnn, &cuda] {
            build.flag(format!("-isystem{}", include.display()));
        }
        build.compile("sdpa_cudnn");
        println!("cargo:rustc-link-lib=dl");
    }

    fn dir_of_cuda(cuda_home: &str) -> PathBuf {
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        let include = PathBuf::from(cuda_home).join("include");
        if !include.join("cuda_runtime_api.h").is_file() {
            panic!(
                "the `cudnn` feature needs CUDA's headers in `{}`; set CUDA_HOME to the CUDA toolkit \
                 first",
                include.display()
            );
        }
        include
    }
}
