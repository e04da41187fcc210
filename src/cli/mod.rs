//! Subcommands whose settings need more than a few lines of glue, one
//! module each (the binary's own; the library knows nothing of them).

pub mod eval;
pub mod launch;
pub mod pipeline;
pub mod train;

/// Adds what to do to a device out-of-memory error; other errors pass.
pub fn out_of_memory_hint(e: anyhow::Error, what_to_do: &str) -> anyhow::Error {
    let text = format!("{e:#}");
    if text.contains("OUT_OF_MEMORY") || text.contains("out of memory") {
        e.context(format!("the device ran out of memory\nhint: {what_to_do}"))
    } else {
        e
    }
}
