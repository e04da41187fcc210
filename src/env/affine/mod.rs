//! The sibling tasks of Trace, as Affine's `affine` environment defines
//! them (docs: /work/shared/docs/affine-envs.md): SAT ([`sat`]), ABD
//! ([`abd`]) and DED ([`ded`]), each an [`crate::env::Environment`],
//! with their prompts byte for byte, their extraction and scoring with
//! every quirk, and their programs run in our sandbox with the original
//! executor's semantics ([`run`]). Python's string rules where the scorers
//! use them ([`py`]); CPython's `random` for SAT's formulas ([`pyrandom`]);
//! the rows ABD and DED read ([`rows`]); supervised data from any of them
//! ([`sft`]); the training and held-out tasks of each ([`split`]).
//!
//! Common to all three: the reply is stripped first, and an empty reply
//! scores 0 (the original raises before scoring); every reward is 0.0 or
//! 1.0.
//!
//! Where the documentation leaves a detail open, our reading (each a
//! single place to change):
//! - ABD's line gate counts `input.splitlines()` (none for an empty
//!   input), and a first line of digits that `int()` rejects (`²`) scores 0,
//!   as the original's exception would ([`abd::extract`]);
//! - output is decoded as UTF-8 with replacement characters, without
//!   newline translation, and the 1,000,000 cap counts bytes, not
//!   characters ([`run`]);
//! - the auto-run's main block is ours ([`run::SOLVE_MAIN`]); "blank" is
//!   empty after `strip()`;
//! - DED's `to_str(None)` is `json.dumps(None)` (`"null"`); tests that crash
//!   the parser (a case that is not a dict, a missing `fn_name`) score 0
//!   ([`ded::PARSE_TESTS`]);
//! - the string tables are CPython 3.11's (Unicode 14); the original image
//!   runs 3.12 (Unicode 15), which differs only on characters added in 15.

pub mod abd;
pub mod ded;
pub mod feedback;
pub mod py;
mod py_unicode;
pub mod pyrandom;
pub mod rows;
pub mod run;
pub mod sat;
pub mod sft;
pub mod split;

/// Why a task id past the end of the rows makes no task (the original
/// raises `ValueError`; there is no wrapping).
pub const OUT_OF_RANGE: &str = "task_id_out_of_range";
