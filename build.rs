//! Compiles the cuDNN attention shim (`csrc/sdpa_cudnn.cpp`) when the
//! `cudnn` feature is on; does nothing otherwise.
//!
//! Headers come from `scripts/fetch-cudnn-headers.sh`: cuDNN's
//! (`CUDNN_INCLUDE_DIR`, default `/opt/cudnn/cudnn/include`), the
//! cudnn-frontend's (`CUDNN_FRONTEND_INCLUDE_DIR`, default
//! `/opt/cudnn/frontend/include`) and CUDA's (`$CUDA_HOME/include`, default
//! `/opt/cuda13/include`). No cuDNN or CUDA runtime library is linked: the
//! shim opens `libcudnn.so.9` with `dlopen` when attention first runs.

fn main() {
    #[cfg(feature = "cudnn")]
    cudnn::build();
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
                 (or `source /work/shared/cuda/build-env.sh` for CUDA's headers), or point {var} at the folder",
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
                "the `cudnn` feature needs CUDA's headers in `{}`; `source /work/shared/cuda/build-env.sh` \
                 (CUDA_HOME) first",
                include.display()
            );
        }
        include
    }
}
