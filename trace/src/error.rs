use std::fmt;
use std::path::PathBuf;

/// What went wrong reading a trace, where.
#[derive(Debug)]
pub struct TraceError {
    /// The file, when reading one.
    pub path: Option<PathBuf>,
    /// Byte offset in the file where the bad part starts.
    pub offset: u64,
    pub kind: ErrorKind,
}

#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    Io(std::io::Error),
    /// The file does not start with the trace magic.
    NotATrace {
        found: Vec<u8>,
    },
    /// Written by a newer library than this reader knows.
    NewerVersion {
        found: u32,
        supported: u32,
    },
    /// A frame longer than any record can be.
    FrameTooLong {
        len: u64,
        max: u64,
    },
    /// A frame whose payload does not decode.
    Corrupt(String),
    /// The file ends inside the header.
    TruncatedHeader,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: at byte {}: ", p.display(), self.offset)?,
            None => write!(f, "at byte {}: ", self.offset)?,
        }
        match &self.kind {
            ErrorKind::Io(e) => write!(f, "{e}"),
            ErrorKind::NotATrace { found } => write!(
                f,
                "not an isolate trace (expected magic {:?}, found {:?})",
                String::from_utf8_lossy(&crate::MAGIC),
                String::from_utf8_lossy(found)
            ),
            ErrorKind::NewerVersion { found, supported } => write!(
                f,
                "trace format version {found} is newer than this reader supports (up to {supported}); \
                 upgrade isolate to read it"
            ),
            ErrorKind::FrameTooLong { len, max } => {
                write!(
                    f,
                    "corrupt frame: length {len} exceeds the limit of {max} bytes"
                )
            }
            ErrorKind::Corrupt(what) => write!(f, "corrupt frame: {what}"),
            ErrorKind::TruncatedHeader => write!(f, "file ends inside the trace header"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}
