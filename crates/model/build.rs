//! Build steps of the model crate, for the GPU features only (without
//! them, nothing).
//!
//! - `cuda`: compiles every `kernels/*.cu` to a fat binary in `OUT_DIR`
//!   with nvcc (`$CUDA_HOME/bin/nvcc` when `CUDA_HOME` is set, else `nvcc`
//!   on the PATH): SASS for `sm_$CUDA_COMPUTE_CAP` (default 90) and its PTX
//!   for newer GPUs.
//! - `cudnn`: compiles the cuDNN attention shim (`csrc/sdpa_cudnn.cpp`).
//!   Headers come from `scripts/fetch-cudnn-headers.sh` (at the workspace's
//!   root): cuDNN's (`CUDNN_INCLUDE_DIR`, default
//!   `/opt/cudnn/cudnn/include`), the cudnn-frontend's
//!   (`CUDNN_FRONTEND_INCLUDE_DIR`, default `/opt/cudnn/frontend/include`)
//!   and CUDA's (`$CUDA_HOME/include`, default `/opt/cuda13/include`). No
//!   cuDNN or CUDA runtime library is linked: the shim opens
//!   `libcudnn.so.9` with `dlopen` when attention first runs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    cuda_kernels();
    #[cfg(feature = "cudnn")]
    cudnn::build();
}

fn cuda_kernels() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
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

    let mut sources: Vec<PathBuf> = std::fs::read_dir("kernels")
        .expect("kernels/ holds the CUDA kernels")
        .map(|entry| entry.expect("readable kernels/").path())
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
