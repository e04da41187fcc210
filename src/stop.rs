//! The process's stop request: one flag, set by SIGTERM or SIGINT, that
//! every stage reads (a training stage checkpoints and ends at its next
//! step; `pipeline` starts no further stage).
//!
//! Installing a handler replaces the signal's default action, so a flag a
//! stage installed for itself alone would leave the process deaf to Ctrl-C
//! once that stage had returned (a pipeline's later stages, its eval). One
//! flag for the whole process, installed once, keeps every signal seen;
//! and a second signal while the first is being honoured ends the process
//! at once (exit status 1), as a user pressing Ctrl-C twice expects.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::Context;

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// The flag, its handlers installed on the first call.
pub fn flag() -> anyhow::Result<Arc<AtomicBool>> {
    if let Some(f) = FLAG.get() {
        return Ok(Arc::clone(f));
    }
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // Registered first, so it sees the flag as the earlier signal left
        // it: set means this is the second signal.
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&flag))
            .context("cannot install signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&flag))
            .context("cannot install signal handler")?;
    }
    // Two threads racing here would both install handlers on their own
    // flags; the loser's flag is then set too, so nothing is missed.
    let _ = FLAG.set(Arc::clone(&flag));
    Ok(FLAG.get().map_or(flag, Arc::clone))
}

/// Whether a stop was asked for (false when no stage installed the flag).
pub fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::Relaxed))
}
