//! The worker slots of an executor: the idle zygotes, taken for a run or
//! a session and given back (a session's with a fresh zygote), shared by
//! the executor and its sessions.

use std::sync::{Condvar, Mutex};

use crate::request::ExecutorConfig;
use crate::worker::Worker;

/// The worker slots, shared with the sessions that hold one: a
/// session gives its slot back (with a fresh zygote) when it ends, even
/// after the executor is gone.
pub(crate) struct Slots {
    pub(crate) config: ExecutorConfig,
    /// Holds this executor's block of slot uids (see `claim_uid_block`)
    /// while any of its slots' processes may run.
    _uid_block: Option<nix::fcntl::Flock<std::fs::File>>,
    pub(crate) seccomp: Vec<Vec<u8>>,
    idle: Mutex<Vec<Worker>>,
    freed: Condvar,
}

impl Slots {
    /// The slots of `config`'s executor, its `workers` started, holding
    /// its block of slot uids.
    pub(crate) fn new(
        config: ExecutorConfig,
        uid_block: Option<nix::fcntl::Flock<std::fs::File>>,
        seccomp: Vec<Vec<u8>>,
        workers: Vec<Worker>,
    ) -> Self {
        Self {
            config,
            _uid_block: uid_block,
            seccomp,
            idle: Mutex::new(workers),
            freed: Condvar::new(),
        }
    }

    /// The next free worker, waiting for one.
    pub(crate) fn take(&self) -> Worker {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(w) = idle.pop() {
                return w;
            }
            idle = self.freed.wait(idle).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Gives a worker back to the pool.
    pub(crate) fn give_back(&self, worker: Worker) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(worker);
        self.freed.notify_one();
    }

    /// A fresh zygote for `slot`, or a dead one whose runs fail (a later
    /// run retries the spawn).
    pub(crate) fn respawn(&self, slot: usize) -> Worker {
        match Worker::spawn(slot, &self.config, &self.seccomp) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!("sandbox worker {slot} could not restart: {e}");
                Worker::dead(slot)
            }
        }
    }
}
