//! Bytes that must wait for their turn in the output: kept in memory up to
//! [`SPOOL_IN_MEMORY`], then in an unlinked temporary file, so that what a graph holds back
//! (edges and anomalies, which come out after all nodes) never grows its memory.

use std::io::{Read, Seek, SeekFrom, Write};

/// Bytes a spool holds in memory before it moves to a temporary file.
pub const SPOOL_IN_MEMORY: usize = 4 << 20;

/// Write-only until drained: [`Spool::drain_into`] or [`Spool::reader`] hand back every byte
/// in the order it was written.
pub(super) struct Spool {
    mem: Vec<u8>,
    file: Option<std::io::BufWriter<std::fs::File>>,
    limit: usize,
    /// Items written (the writer counts them; the spool does not look inside).
    pub(super) items: u64,
}

impl Default for Spool {
    fn default() -> Self {
        Self::with_limit(SPOOL_IN_MEMORY)
    }
}

impl Spool {
    /// A spool that moves to a file past `limit` bytes (tests use small limits).
    pub(super) fn with_limit(limit: usize) -> Self {
        Spool {
            mem: Vec::new(),
            file: None,
            limit: limit.max(1),
            items: 0,
        }
    }

    /// True when nothing was written.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.file.is_none() && self.mem.is_empty()
    }

    fn spill(&mut self) -> std::io::Result<()> {
        if self.file.is_none() {
            self.file = Some(std::io::BufWriter::with_capacity(1 << 16, temp_file()?));
        }
        if let Some(f) = &mut self.file {
            f.write_all(&self.mem)?;
        }
        self.mem.clear();
        Ok(())
    }

    /// Writes everything to `out`, and empties the spool.
    pub(super) fn drain_into(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        std::io::copy(&mut self.reader()?, out)?;
        Ok(())
    }

    /// Everything written, to read back from the start; the spool is empty afterwards.
    pub(super) fn reader(&mut self) -> std::io::Result<Box<dyn Read>> {
        let mem = std::io::Cursor::new(std::mem::take(&mut self.mem));
        self.items = 0;
        Ok(match self.file.take() {
            Some(f) => {
                let mut f = f.into_inner().map_err(|e| e.into_error())?;
                f.seek(SeekFrom::Start(0))?;
                Box::new(std::io::BufReader::with_capacity(1 << 16, f).chain(mem))
            }
            None => Box::new(mem),
        })
    }
}

impl Write for Spool {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.mem.extend_from_slice(buf);
        if self.mem.len() >= self.limit {
            self.spill()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A temporary file that is gone from the directory as soon as it is open (`tempfile`:
/// `O_TMPFILE` where the file system has it, else a random name made with `O_EXCL` and unlinked
/// at once), mode 0600 (`O_TMPFILE` makes it 0666 less the umask: set again). Its bytes come from a trace (the program's argv, its
/// addresses): no other user may read them, or keep the spool from starting by making the files
/// a predictable name would have (`.isolate-spool-PID-N` in `/tmp` did both).
fn temp_file() -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::PermissionsExt;
    let f = tempfile::tempfile()?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_come_back_in_order_through_the_file() {
        let mut s = Spool::with_limit(100);
        let mut want = Vec::new();
        for i in 0..1000u32 {
            let line = format!("line {i}\n");
            s.write_all(line.as_bytes()).unwrap();
            want.extend_from_slice(line.as_bytes());
        }
        assert!(s.file.is_some(), "past its limit the spool is a file");
        assert!(s.mem.len() < 100);
        let mut got = Vec::new();
        s.drain_into(&mut got).unwrap();
        assert_eq!(got, want);
        assert!(s.is_empty());
        // Usable again after a drain.
        s.write_all(b"again").unwrap();
        let mut got = Vec::new();
        s.reader().unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got, b"again");
    }

    /// Another user making the names the spool once took (`.isolate-spool-PID-0` to `-99` in
    /// the temporary directory) neither stops it nor gets its bytes; its file is private.
    #[test]
    fn squatted_names_do_not_stop_the_spool_and_its_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir();
        let squat: Vec<_> = (0..100u32)
            .map(|i| dir.join(format!(".isolate-spool-{}-{i}", std::process::id())))
            .collect();
        for p in &squat {
            let _ = std::fs::write(p, b"");
        }
        let f = temp_file();
        for p in &squat {
            let _ = std::fs::remove_file(p);
        }
        let f = f.expect("a temporary file despite the squatted names");
        let mode = f.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the spool file is private: {mode:o}");
    }
}
