//! Subcommands whose settings need more than a few lines of glue, one
//! module each (the binary's own; the library knows nothing of them).

pub mod eval;
pub mod pipeline;
pub mod train;
