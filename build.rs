//! With the `cuda` feature, compiles every `src/kernels/*.cu` to PTX in
//! `OUT_DIR` with nvcc (`$CUDA_HOME/bin/nvcc` when `CUDA_HOME` is set, else
//! `nvcc` on the PATH) for `sm_$CUDA_COMPUTE_CAP` (default 90). Without it,
//! does nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
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
        let ptx = out_dir.join(format!("{stem}.ptx"));
        let status = Command::new(&nvcc)
            .arg("--ptx")
            .arg(format!("-arch=sm_{cap}"))
            .arg("-O3")
            .arg("-o")
            .arg(&ptx)
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
