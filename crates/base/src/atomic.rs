//! Atomic file output: write into a temp file beside the target, fsync it,
//! rename it over the target, fsync the folder. A reader sees the old file or
//! the whole new one, never half of one, whatever kills the process.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// A file being written; it appears at its path only on `commit`.
pub struct AtomicFile {
    target: PathBuf,
    tmp: tempfile::NamedTempFile,
}

impl AtomicFile {
    pub fn create(target: &Path) -> anyhow::Result<Self> {
        let dir = parent(target);
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create folder `{}`", dir.display()))?;
        // Ordinary file permissions (tempfile's default is owner-only).
        let tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .tempfile_in(dir)
            .with_context(|| format!("cannot create a file in `{}`", dir.display()))?;
        Ok(AtomicFile {
            target: target.to_owned(),
            tmp,
        })
    }

    /// A buffered writer into the temp file.
    pub fn writer(&mut self) -> BufWriter<&mut File> {
        BufWriter::with_capacity(1 << 16, self.tmp.as_file_mut())
    }

    /// A second handle on the temp file, for a writer that outlives borrows.
    pub fn handle(&self) -> anyhow::Result<File> {
        Ok(self.tmp.as_file().try_clone()?)
    }

    /// A new file for the same target holding the lines of this one whose
    /// entry in `keep` is true, in order (this one is discarded). Lines
    /// beyond the end of `keep` are kept.
    pub fn filter_lines(self, keep: &[bool]) -> anyhow::Result<AtomicFile> {
        use std::io::BufRead;
        let mut out = AtomicFile::create(&self.target)?;
        let context = || format!("cannot filter `{}`", self.target.display());
        {
            let reader =
                std::io::BufReader::new(File::open(self.tmp.path()).with_context(context)?);
            let mut w = out.writer();
            for (i, line) in reader.split(b'\n').enumerate() {
                let line = line.with_context(context)?;
                if keep.get(i).copied().unwrap_or(true) {
                    w.write_all(&line)
                        .and_then(|_| w.write_all(b"\n"))
                        .with_context(context)?;
                }
            }
            w.flush().with_context(context)?;
        }
        Ok(out)
    }

    pub fn commit(self) -> anyhow::Result<()> {
        self.tmp
            .as_file()
            .sync_all()
            .with_context(|| format!("cannot flush `{}`", self.target.display()))?;
        let target = self.target;
        self.tmp
            .persist(&target)
            .map_err(|e| e.error)
            .with_context(|| format!("cannot write `{}`", target.display()))?;
        sync_dir(parent(&target))
    }
}

/// Writes `bytes` to `target` atomically.
pub fn write(target: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = AtomicFile::create(target)?;
    {
        let mut w = f.writer();
        w.write_all(bytes)
            .and_then(|_| w.flush())
            .with_context(|| format!("cannot write `{}`", target.display()))?;
    }
    f.commit()
}

fn parent(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync folder `{}`", dir.display()))
}

/// Fails early, with a hint, if `dir` cannot take new files.
pub fn ensure_writable_dir(dir: &Path) -> anyhow::Result<()> {
    let hint = "hint: choose a folder you can write with --output_dir";
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create output folder `{}`\n{hint}", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".probe-")
        .tempfile_in(dir)
        .with_context(|| format!("output folder `{}` is not writable\n{hint}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn uncommitted_files_never_appear() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("out.jsonl");
        std::fs::write(&target, b"old").unwrap();
        {
            let mut f = super::AtomicFile::create(&target).unwrap();
            use std::io::Write;
            f.writer().write_all(b"new, half").unwrap();
            // dropped without commit
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        super::write(&target, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
    }

    #[test]
    fn filtering_keeps_the_masked_lines_and_leaves_no_temp_file() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("out.jsonl");
        let mut f = super::AtomicFile::create(&target).unwrap();
        {
            let mut w = f.writer();
            w.write_all(b"a\nb\nc\nd\n").unwrap();
            w.flush().unwrap();
        }
        let f = f.filter_lines(&[true, false, true]).unwrap();
        assert!(!target.exists());
        f.commit().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"a\nc\nd\n");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
