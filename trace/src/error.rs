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
    /// The file ends inside the header (also: it holds nothing but the start of the magic, or
    /// nothing at all); the offset is where it ends.
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
                "not an isolate trace (a trace starts with {}, this file with {})",
                crate::MAGIC.escape_ascii(),
                found.escape_ascii()
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
            ErrorKind::TruncatedHeader if self.offset == 0 => write!(
                f,
                "the file is empty: a trace cut before its header was written (truncated; as when \
                 the disk was full when the process began it)"
            ),
            ErrorKind::TruncatedHeader => write!(
                f,
                "the file ends inside the trace header (truncated; as when the disk was full when \
                 the process began it)"
            ),
        }
    }
}

/// What went wrong opening a file, in a few words: `no such file`, `permission denied`, `is a
/// directory`; other errors as the system says them. The analyzer's words for a trace it cannot
/// open, and `isolate run`'s for a trace directory it cannot use.
pub fn io_short(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound => "no such file".to_owned(),
        K::PermissionDenied => "permission denied".to_owned(),
        K::IsADirectory => "is a directory, not a trace".to_owned(),
        _ => match e.raw_os_error() {
            Some(libc::ELOOP) => "is a symbolic link loop".to_owned(),
            Some(libc::ENOTDIR) => "a part of the path is not a directory".to_owned(),
            _ => e.to_string(),
        },
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

/// What bincode found wrong with a record's bytes, in words. bincode's own `Display` is its
/// `Debug` (`Utf8 { inner: Utf8Error { valid_up_to: 4, .. } }`), which names its internals, not
/// what is wrong with the file.
pub(crate) fn decode_words(e: &bincode::error::DecodeError) -> String {
    use bincode::error::{AllowedEnumVariants, DecodeError as D};
    match e {
        D::UnexpectedEnd { additional } => format!(
            "its bytes end before it does (at least {additional} more {} needed)",
            if *additional == 1 {
                "byte was"
            } else {
                "bytes were"
            }
        ),
        D::LimitExceeded => format!(
            "a length inside it is larger than a record may be ({} bytes)",
            crate::MAX_FRAME
        ),
        D::InvalidIntegerType { expected, found } => format!(
            "a number is encoded as {} where {} belongs",
            format!("{found:?}").to_ascii_lowercase(),
            format!("{expected:?}").to_ascii_lowercase()
        ),
        D::NonZeroTypeIsZero { .. } => "a number that cannot be zero is zero".into(),
        D::UnexpectedVariant {
            type_name, found, ..
        } => {
            let what = match *type_name {
                "WireRecord" => "record kind".to_owned(),
                "Api" => "API number".to_owned(),
                "NoteKind" => "note kind".to_owned(),
                "EndReason" => "way of ending".to_owned(),
                other => format!("value of {other}"),
            };
            let allowed = match e {
                D::UnexpectedVariant {
                    allowed: AllowedEnumVariants::Range { min, max },
                    ..
                } => format!("{min} to {max}"),
                D::UnexpectedVariant {
                    allowed: AllowedEnumVariants::Allowed(list),
                    ..
                } => list
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => String::new(),
            };
            format!("unknown {what} {found} (this reader knows {allowed})")
        }
        D::Utf8 { inner } => format!(
            "a text in it is not UTF-8 (a bad byte after {} good ones)",
            inner.valid_up_to()
        ),
        D::InvalidCharEncoding(_) => "a character in it is not a valid character".into(),
        D::InvalidBooleanValue(v) => format!("a yes/no value in it is {v}, not 0 or 1"),
        D::ArrayLengthMismatch { required, found } => {
            format!("a list in it has {found} items where {required} belong")
        }
        D::OutsideUsizeRange(v) => format!("a length in it ({v}) is too large for this machine"),
        D::Io { inner, .. } => inner.to_string(),
        D::Other(what) => (*what).to_owned(),
        D::OtherString(what) => what.clone(),
        _ => "its bytes are not a record of this format".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::decode_words;
    use bincode::error::{AllowedEnumVariants, DecodeError};

    /// Every message says what is wrong in words: none is a Rust value (`Utf8 { inner: … }`).
    #[test]
    fn decode_errors_in_words() {
        let bytes = vec![b'a', b'b', b'c', b'd', 0xff];
        let bad_utf8 = std::str::from_utf8(&bytes).unwrap_err();
        let cases = [
            (
                DecodeError::Utf8 { inner: bad_utf8 },
                "a text in it is not UTF-8 (a bad byte after 4 good ones)",
            ),
            (
                DecodeError::UnexpectedVariant {
                    type_name: "WireRecord",
                    allowed: &AllowedEnumVariants::Range { min: 0, max: 12 },
                    found: 40,
                },
                "unknown record kind 40 (this reader knows 0 to 12)",
            ),
            (
                DecodeError::UnexpectedEnd { additional: 635 },
                "its bytes end before it does (at least 635 more bytes were needed)",
            ),
            (
                DecodeError::LimitExceeded,
                "a length inside it is larger than a record may be (1048576 bytes)",
            ),
            (
                DecodeError::InvalidBooleanValue(7),
                "a yes/no value in it is 7, not 0 or 1",
            ),
        ];
        for (e, want) in cases {
            let got = decode_words(&e);
            assert_eq!(got, want);
            assert!(!got.contains('{') && !got.contains("::"), "{got}");
        }
    }
}
