//! The sibling tasks of Trace, as Affine's `affine` environment defines
//! them (docs: /work/shared/docs/affine-envs.md): SAT ([`sat`]), ABD
//! ([`abd`]) and DED ([`ded`]), each an [`crate::rl::env::Environment`],
//! with their prompts byte for byte, their extraction and scoring with
//! every quirk, and their programs run in our sandbox with the original
//! executor's semantics ([`run`]). Python's string rules where the scorers
//! use them ([`py`]); CPython's `random` for SAT's formulas ([`pyrandom`]);
//! the rows ABD and DED read ([`rows`]); supervised data from any of them
//! ([`sft`]).
//!
//! Common to all three: the reply is stripped first, and an empty reply
//! scores 0 (the original raises before scoring); every reward is 0.0 or
//! 1.0.

pub mod abd;
pub mod ded;
pub mod py;
mod py_unicode;
pub mod pyrandom;
pub mod rows;
pub mod run;
pub mod sat;
pub mod sft;

/// Why a task id past the end of the rows makes no task (the original
/// raises `ValueError`; there is no wrapping).
pub const OUT_OF_RANGE: &str = "task_id_out_of_range";
