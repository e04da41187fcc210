//! The built-in corpus: stdin-driven programs written by the team, shipped
//! inside the binary (`datasets/builtin/programs/NNN_name.{py,in,out}`), so
//! `generate` and the quick test need no files at all.

use include_dir::{Dir, include_dir};

use super::SourceRow;

static PROGRAMS: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/datasets/builtin/programs");

/// Every corpus program, in file-name order, with its recorded output.
pub fn programs() -> Vec<SourceRow> {
    let mut files: Vec<_> = PROGRAMS
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
                PROGRAMS
                    .get_file(f.path().with_extension(ext))
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
    }
}
