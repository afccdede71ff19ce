use isolate_trace::{ErrorKind as TraceErrorKind, TraceError, io_short};
use std::fmt;
use std::path::PathBuf;

/// What went wrong in an analysis.
#[derive(Debug)]
pub struct Error {
    pub kind: ErrorKind,
}

#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A trace could not be read: missing, foreign, corrupt. The message names file and offset.
    Trace(TraceError),
    /// Writing an output (or reading something that is not a trace) failed.
    Io {
        path: Option<PathBuf>,
        source: std::io::Error,
    },
    /// An argument that makes no sense (an address that does not parse, an empty window).
    Invalid(String),
}

impl Error {
    pub fn io(path: Option<PathBuf>, source: std::io::Error) -> Self {
        Error {
            kind: ErrorKind::Io { path, source },
        }
    }

    pub fn invalid(what: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Invalid(what.into()),
        }
    }
}

impl From<TraceError> for Error {
    fn from(e: TraceError) -> Self {
        Error {
            kind: ErrorKind::Trace(e),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::io(None, e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            // A file that cannot be opened (or read at all) has no byte offset worth naming:
            // `isolate: FILE: no such file`.
            ErrorKind::Trace(TraceError {
                path: Some(p),
                offset: 0,
                kind: TraceErrorKind::Io(e),
            }) => write!(f, "{}: {}", p.display(), io_short(e)),
            ErrorKind::Trace(e) => write!(f, "{e}"),
            ErrorKind::Io {
                path: Some(p),
                source,
            } => write!(f, "{}: {source}", p.display()),
            ErrorKind::Io { path: None, source } => write!(f, "{source}"),
            ErrorKind::Invalid(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The Display above already says everything its cause says (file, offset, what):
        // returning the cause too would make `{:#}` print it twice.
        None
    }
}
