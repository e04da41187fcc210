//! The one progress reporter every stage reports through. Stages count
//! units of work (rows for `generate`, optimizer steps for training, steps
//! for RL) and may attach a short status; the CLI draws a bar from it, tests
//! and nested stages pass [`NoProgress`]. Library code never prints.

/// Where a stage reports how far it is.
pub trait Progress: Sync {
    /// Work of `total` units begins (unknown: `None`), `done` of them already
    /// done (a resumed run starts past zero).
    fn start(&self, total: Option<u64>, done: u64);
    /// The stage has now done `done` units in all.
    fn set(&self, done: u64);
    /// `n` more units are done.
    fn advance(&self, n: u64);
    /// A short status for the unit just done (`loss 0.4121 9800 tok/s`).
    fn status(&self, _text: &str) {}
    fn finish(&self);
}

/// Progress that goes nowhere.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: Option<u64>, _: u64) {}
    fn set(&self, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}
