//! Running untrusted Python exactly, fast and safely.
//!
//! The sandbox owns processes and bytes, nothing else: it knows no datasets,
//! tensors or prompts. An [`Executor`] keeps one pre-started, isolated Python
//! zygote per worker slot (see `zygote.py` for the process tree and the wire
//! format) and runs [`Request`]s on them in parallel. A program's failure is
//! data in its [`Outcome`]; a [`SandboxError`] means the sandbox itself could
//! not be set up.
//!
//! Isolation, per worker slot: its own unprivileged uid/gid, private mount
//! (read-only system, hidden home folders), network (no interfaces up), IPC
//! and UTS namespaces. Per program: a fresh pid namespace whose init is ours,
//! a fresh size-capped tmpfs as `/tmp`, rlimits, no_new_privs, seccomp, a
//! cleared environment, output caps enforced while reading, a wall deadline.
//!
//! A [`Session`] keeps one program running in a slot, with the same
//! isolation, answering newline-delimited JSON calls, each by a timeout;
//! a fault or its drop kills it and every process it started.
//!
//! Without root, each slot gets an unprivileged user namespace as well
//! ([`Isolation::Rootless`]): everything above holds but the host uid of
//! its own, as every slot is the caller's uid on the host. Inside, the
//! program is a non-zero uid with no capabilities. Where the kernel refuses
//! unprivileged user namespaces, [`Executor::new`] refuses with
//! [`SandboxError::NoUserNamespaces`].

mod check;
mod executor;
mod request;
mod seccomp;
mod session;
mod slots;
mod worker;

pub use check::{Protection, ProtectionReport, check_protections, mode_of};
pub use executor::{DEFAULT_UID_BASE, Executor};
pub use request::{
    ExecutorConfig, HOST_FOLDERS, Isolation, Limits, Outcome, Request, SandboxError, Status,
    default_workers, host_folders,
};
pub use session::{Session, SessionError};
