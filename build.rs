//! Build steps of the trace-train crate: the git commit for `trace-train
//! env` and the built-in corpora's folders. The model crate's `build.rs`
//! compiles the CUDA kernels and the cuDNN shim; the base crate's finds
//! NCCL for the link.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The built-in corpora are embedded with `include_dir!`, which tracks
    // the files it found but not the folders: a program added later would
    // not rebuild the crate. Watching the folders reruns this script, and
    // so recompiles the crate, when a file comes or goes.
    println!("cargo:rerun-if-changed=datasets");
    git_commit();
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
