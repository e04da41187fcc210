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
//!
//! The signal is remembered ([`received`]) so that a run it cut short exits
//! with the conventional status 128 + the signal's number (130 for SIGINT,
//! 143 for SIGTERM) after its checkpoint: a scheduler or `a && b` then
//! tells a preempted run from a finished one (status 0) and from a failed
//! one (status 1).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::Context;

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// The number of the last stop signal received; 0 before any.
static SIGNAL: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

/// The flag, its handlers installed on the first call.
pub fn flag() -> anyhow::Result<Arc<AtomicBool>> {
    if let Some(f) = FLAG.get() {
        return Ok(Arc::clone(f));
    }
    let flag = Arc::new(AtomicBool::new(false));
    let signal = Arc::clone(SIGNAL.get_or_init(|| Arc::new(AtomicUsize::new(0))));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // Registered first, so it sees the flag as the earlier signal left
        // it: set means this is the second signal.
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&flag))
            .context("cannot install signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&flag))
            .context("cannot install signal handler")?;
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)
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

/// Whether a stop signal cut something short: a stage stopped before its
/// last step, an eval before its report, a pipeline before its next stage.
/// A run the signal reached during its last step ends whole and exits 0.
static CUT: AtomicBool = AtomicBool::new(false);

/// Records that the stop request cut this run short.
pub fn cut_short() {
    CUT.store(true, Ordering::Relaxed);
}

/// Whether [`cut_short`] was called.
pub fn was_cut_short() -> bool {
    CUT.load(Ordering::Relaxed)
}

/// Whether a child's exit status says a stop signal cut it short (rather
/// than that it failed).
pub fn is_stop_status(code: i32) -> bool {
    [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM]
        .iter()
        .any(|&s| i32::from(exit_status(s)) == code)
}

/// The stop signal received, if any (its number: 2 SIGINT, 15 SIGTERM).
pub fn received() -> Option<i32> {
    let n = SIGNAL.get()?.load(Ordering::Relaxed);
    (n != 0 && requested()).then_some(n as i32)
}

/// The exit status of a run cut short by `signal`: 128 + its number, as a
/// shell reports a process the signal ended.
pub fn exit_status(signal: i32) -> u8 {
    (128 + signal).clamp(0, 255) as u8
}

/// The signal's name for messages (`SIGTERM`), or its number.
pub fn name(signal: i32) -> String {
    match signal {
        signal_hook::consts::SIGINT => "SIGINT".into(),
        signal_hook::consts::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_shell_convention() {
        assert_eq!(exit_status(signal_hook::consts::SIGINT), 130);
        assert_eq!(exit_status(signal_hook::consts::SIGTERM), 143);
        assert_eq!(name(15), "SIGTERM");
        assert_eq!(name(2), "SIGINT");
    }
}
