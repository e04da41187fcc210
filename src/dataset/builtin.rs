//! The built-in corpus: stdin-driven programs written by the team, shipped
//! inside the binary (`datasets/builtin/programs/NNN_name.{py,in,out}`), so
//! `generate` and the quick test need no files at all.
//!
//! Beside it, the held-out short set (`datasets/heldout_short/programs`,
//! same layout): small stdin programs that print one to three lines,
//! written by the team for eval only. No `generate` source reads it, so no
//! training split ever holds one of its programs; `trace-train eval
//! --heldout short` scores a model on it.

use include_dir::{Dir, include_dir};

use super::SourceRow;

static PROGRAMS: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/datasets/builtin/programs");
static HELDOUT_SHORT: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/datasets/heldout_short/programs");

/// Every corpus program, in file-name order, with its recorded output.
pub fn programs() -> Vec<SourceRow> {
    rows(&PROGRAMS)
}

/// Every program of the held-out short set (eval only), in file-name
/// order, with its recorded output.
pub fn heldout_short() -> Vec<SourceRow> {
    rows(&HELDOUT_SHORT)
}

fn rows(dir: &'static Dir<'static>) -> Vec<SourceRow> {
    let mut files: Vec<_> = dir
        .files()
        .filter(|f| f.path().extension().is_some_and(|e| e == "py"))
        .collect();
    files.sort_by_key(|f| f.path());
    files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let stem = f.path().file_stem().unwrap_or_default().to_string_lossy();
            let text = |ext: &str| {
                dir.get_file(f.path().with_extension(ext))
                    .and_then(|g| g.contents_utf8())
                    .map(str::to_owned)
            };
            SourceRow {
                index: i as u64,
                name: stem.into_owned(),
                program: f.contents_utf8().unwrap_or_default().to_owned(),
                inputs: text("in").unwrap_or_default(),
                output: text("out"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn corpus_is_complete() {
        let rows = super::programs();
        assert!(rows.len() >= 150, "only {} programs", rows.len());
        for r in &rows {
            assert!(!r.program.is_empty(), "{}", r.name);
            assert!(r.output.is_some(), "{} has no .out", r.name);
        }
        // Outputs of every length: a corpus of long outputs only teaches a
        // model to keep writing lines after its answer.
        let short = rows
            .iter()
            .filter(|r| {
                let n = crate::reward::python_strip(r.output.as_deref().unwrap_or_default())
                    .lines()
                    .count();
                (1..=3).contains(&n)
            })
            .count();
        assert!(short >= 50, "only {short} programs print 1 to 3 lines");
    }

    #[test]
    fn heldout_short_set_is_short_complete_and_apart_from_the_corpus() {
        let rows = super::heldout_short();
        assert!(rows.len() >= 100, "only {} programs", rows.len());
        let corpus: std::collections::BTreeSet<String> = super::programs()
            .into_iter()
            .map(|r| r.program.trim().to_owned())
            .collect();
        let mut names = std::collections::BTreeSet::new();
        for r in &rows {
            assert!(names.insert(r.name.clone()), "{} twice", r.name);
            assert!(
                !corpus.contains(r.program.trim()),
                "{} is in the corpus",
                r.name
            );
            let out = r
                .output
                .as_deref()
                .unwrap_or_else(|| panic!("{} has no .out", r.name));
            let lines = crate::reward::python_strip(out).lines().count();
            assert!((1..=3).contains(&lines), "{}: {lines} output lines", r.name);
            assert!(!r.inputs.is_empty(), "{} has no stdin", r.name);
        }
    }
}
