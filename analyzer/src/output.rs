//! Output files (`-o`: report, export, graph), written whole or not at all.
//!
//! [`write_atomically`] writes into a temporary file in the output's own directory and renames it
//! over the output only once everything was written and flushed: an error halfway (a corrupt
//! trace, a full disk) leaves the file that was there before, or none, never a 0-byte or partial
//! one. Every output that is one file goes through it (report, graph, export chrome-trace and
//! memory-viz); `export --format parquet` writes a directory of tables, each into a temporary file
//! of its own moved into place (`export::parquet`).

use crate::Error;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Writes `path` through `write`, atomically: `write` gets a buffered writer on a temporary file
/// beside `path` (mode 0600, as the trace it comes from is: it holds the trace's argv, paths and
/// addresses), which is flushed, synced and renamed over `path` when `write` succeeds, and
/// removed when it fails. A file already at `path` keeps its mode; a symbolic link is followed
/// (its target is replaced). A path that is not a regular file (`/dev/stdout`, a FIFO) cannot
/// be replaced and is written in place.
///
/// ```
/// use isolate_analyzer::output::write_atomically;
/// use std::io::Write;
/// let d = tempfile::tempdir().unwrap();
/// let p = d.path().join("out.json");
/// write_atomically(&p, |w| -> Result<(), isolate_analyzer::Error> { Ok(w.write_all(b"{}")?) }).unwrap();
/// assert_eq!(std::fs::read(&p).unwrap(), b"{}");
/// let failed = write_atomically(&p, |w| -> Result<(), isolate_analyzer::Error> {
///     w.write_all(b"{\"half")?;
///     Err(isolate_analyzer::Error::invalid("a corrupt trace"))
/// });
/// assert!(failed.is_err());
/// assert_eq!(std::fs::read(&p).unwrap(), b"{}", "the old file is kept whole");
/// assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1, "no temporary file is left");
/// ```
pub fn write_atomically<T, E: From<Error>>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<T, E>,
) -> Result<T, E> {
    let io = |p: &Path, e: std::io::Error| E::from(Error::io(Some(p.to_owned()), e));
    let existing = std::fs::metadata(path).ok();
    if existing
        .as_ref()
        .is_some_and(|m| m.file_type().is_char_device() || m.file_type().is_fifo())
    {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| io(path, e))?;
        let mut w = BufWriter::with_capacity(1 << 16, f);
        let v = write(&mut w)?;
        w.flush().map_err(|e| io(path, e))?;
        return Ok(v);
    }
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
        }
        _ => path.to_owned(),
    };
    let (tmp, f) = temporary(&target).map_err(|e| io(path, e))?;
    let done = (|| {
        let mut w = BufWriter::with_capacity(1 << 16, f);
        let v = write(&mut w)?;
        let f = w.into_inner().map_err(|e| io(path, e.into_error()))?;
        if let Some(m) = &existing {
            let mode = m.permissions().mode() & 0o7777;
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| io(path, e))?;
        }
        f.sync_all().map_err(|e| io(path, e))?;
        std::fs::rename(&tmp, &target).map_err(|e| io(path, e))?;
        Ok(v)
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// A new file beside `target`, named after it, made with `O_EXCL` (never someone else's).
fn temporary(target: &Path) -> std::io::Result<(PathBuf, File)> {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = target
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    loop {
        let tmp = dir.join(format!(
            ".{name}.{}-{}.tmp",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}
