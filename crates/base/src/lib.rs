//! The ground every part of trace-train stands on, and nothing else: files
//! written whole or not at all ([`atomic`]), seeded randomness ([`rng`]),
//! the stop signals ([`stop`]), the progress reporter ([`progress`]) and
//! what a CUDA device needs beyond candle ([`gpu`]). It knows no model, no
//! task and no training loop; every other crate of the workspace may use
//! it.

pub mod atomic;
pub mod gpu;
pub mod progress;
pub mod rng;
pub mod stop;

/// Lowercase hex of `bytes` (digests, ids, raw bytes in reports).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
