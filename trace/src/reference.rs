//! The reference decoder: the simplest reader of the format (small `read` calls, every payload
//! through bincode), kept only to check [`crate::Reader`] against (the unit tests, the stable
//! fuzzer `trace/tests/fuzz.rs`, the libFuzzer target `trace/fuzz`). Compiled for the crate's
//! tests and with the feature `reference`; not part of the library's API.

use crate::error::{ErrorKind, TraceError, decode_words};
use crate::record::{Header, Record};
use crate::wire::{CONFIG, Decoder, FrameLength};
use crate::{FORMAT_VERSION, MAGIC};
use std::fs::File;
use std::io::{BufReader, ErrorKind as IoKind, Read};
use std::path::{Path, PathBuf};

/// Reads a trace record by record, slowly and plainly.
pub struct Reader<R> {
    inner: R,
    path: Option<PathBuf>,
    header: Header,
    version: u32,
    offset: u64,
    buf: Vec<u8>,
    decoder: Decoder,
    truncated_at: Option<u64>,
    done: bool,
}

enum Frame {
    Full,
    Eof,
    Truncated,
}

impl Reader<BufReader<File>> {
    /// Opens a trace file and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| TraceError {
            path: Some(path.to_owned()),
            offset: 0,
            kind: ErrorKind::Io(e),
        })?;
        Reader::new(
            BufReader::with_capacity(1 << 16, file),
            Some(path.to_owned()),
        )
    }
}

impl<R: Read> Reader<R> {
    /// Reads the header from `inner`; `path` is only used in messages.
    pub fn new(mut inner: R, path: Option<PathBuf>) -> Result<Self, TraceError> {
        let err = |offset, kind| TraceError {
            path: path.clone(),
            offset,
            kind,
        };
        let mut magic = [0u8; 8];
        let n = read_full(&mut inner, &mut magic).map_err(|e| err(0, ErrorKind::Io(e)))?;
        if n < 8 && magic[..n] == MAGIC[..n] {
            return Err(err(n as u64, ErrorKind::TruncatedHeader));
        }
        if n < 8 || magic != MAGIC {
            return Err(err(
                0,
                ErrorKind::NotATrace {
                    found: magic[..n].to_vec(),
                },
            ));
        }
        let mut v = [0u8; 4];
        let n = read_full(&mut inner, &mut v).map_err(|e| err(8, ErrorKind::Io(e)))?;
        if n < 4 {
            return Err(err(8, ErrorKind::TruncatedHeader));
        }
        let version = u32::from_le_bytes(v);
        if version > FORMAT_VERSION {
            return Err(err(
                8,
                ErrorKind::NewerVersion {
                    found: version,
                    supported: FORMAT_VERSION,
                },
            ));
        }
        if version == 0 {
            return Err(err(
                8,
                ErrorKind::Corrupt("format version 0 does not exist".into()),
            ));
        }
        let mut r = Reader {
            inner,
            path,
            header: Header::default(),
            version,
            offset: 12,
            buf: Vec::new(),
            decoder: Decoder::default(),
            truncated_at: None,
            done: false,
        };
        let at = r.offset;
        match r.read_frame()? {
            Frame::Full => {}
            Frame::Eof | Frame::Truncated => return Err(r.err(at, ErrorKind::TruncatedHeader)),
        }
        let (header, used): (Header, usize) =
            bincode::decode_from_slice(&r.buf, CONFIG).map_err(|e| {
                r.err(
                    at,
                    ErrorKind::Corrupt(format!("the header does not decode: {}", decode_words(&e))),
                )
            })?;
        if used != r.buf.len() {
            return Err(r.err(
                at,
                ErrorKind::Corrupt("header frame has trailing bytes".into()),
            ));
        }
        r.header = header;
        Ok(r)
    }

    fn err(&self, offset: u64, kind: ErrorKind) -> TraceError {
        TraceError {
            path: self.path.clone(),
            offset,
            kind,
        }
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The format version the file was written with.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Where the file ended inside a record, once the reader has reached that point.
    pub fn truncated_at(&self) -> Option<u64> {
        self.truncated_at
    }

    /// The next record, `Ok(None)` at the end of the file (also after a partial last record:
    /// see [`Reader::truncated_at`]).
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        while !self.done {
            let at = self.offset;
            let frame = match self.read_frame() {
                Ok(f) => f,
                Err(e) => {
                    // A bad length leaves no way to find the next frame: stop here for good.
                    self.done = true;
                    return Err(e);
                }
            };
            match frame {
                Frame::Eof => self.done = true,
                Frame::Truncated => {
                    self.truncated_at = Some(at);
                    self.done = true;
                }
                Frame::Full => match self.decoder.decode(&self.buf) {
                    Ok(Some(rec)) => return Ok(Some(rec)),
                    Ok(None) => continue,
                    Err(what) => {
                        self.done = true;
                        return Err(self.err(at, ErrorKind::Corrupt(what)));
                    }
                },
            }
        }
        Ok(None)
    }

    fn read_frame(&mut self) -> Result<Frame, TraceError> {
        let start = self.offset;
        let mut prefix = FrameLength::default();
        let len = loop {
            let mut b = [0u8; 1];
            let n = read_full(&mut self.inner, &mut b)
                .map_err(|e| self.err(self.offset, ErrorKind::Io(e)))?;
            if n == 0 {
                return Ok(if self.offset == start {
                    Frame::Eof
                } else {
                    Frame::Truncated
                });
            }
            self.offset += 1;
            if let Some(len) = prefix.push(b[0]).map_err(|k| self.err(start, k))? {
                break len;
            }
        };
        // `len` is bounded by MAX_FRAME, so a corrupt length cannot make this allocate much.
        self.buf.resize(len as usize, 0);
        let n = read_full(&mut self.inner, &mut self.buf)
            .map_err(|e| self.err(self.offset, ErrorKind::Io(e)))?;
        self.offset += n as u64;
        if n < len as usize {
            return Ok(Frame::Truncated);
        }
        Ok(Frame::Full)
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
