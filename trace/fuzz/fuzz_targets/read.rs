//! libFuzzer target: any bytes into the trace reader and the reference decoder.
//!
//! The same properties as `trace/tests/fuzz.rs` (the stable, time-bounded fuzzer that CI runs):
//! no panic, every error names its byte offset inside the input, and `RefReader` and `Reader`
//! agree on the header, every record, the error (text and offset) and the truncation point.
//!
//! Seed it with real traces for a fast start:
//!
//!     mkdir -p corpus/read && cp ../../tests/traces/h200/*.trace ../../tests/corpus/*.bin corpus/read/
//!     cargo +nightly fuzz run read corpus/read -- -max_len=65536

#![no_main]

use isolate_trace::reference::Reader as RefReader;
use isolate_trace::{Reader, Record, TraceError};
use libfuzzer_sys::fuzz_target;

/// What a reader makes of the input: the header's debug text (or the error that refused it),
/// the records, and how it stopped.
#[derive(Debug, PartialEq)]
struct Outcome {
    header: Result<String, String>,
    records: Vec<Record>,
    error: Option<String>,
    truncated_at: Option<u64>,
}

fn named(e: &TraceError, len: usize) -> String {
    let msg = e.to_string();
    assert!(msg.contains(&format!("at byte {}", e.offset)), "{msg}");
    assert!(e.offset <= len as u64, "offset past the input: {msg}");
    msg
}

macro_rules! read {
    ($reader:ident, $data:expr) => {{
        let data: &[u8] = $data;
        match $reader::new(data, None) {
            Err(e) => Outcome {
                header: Err(named(&e, data.len())),
                records: Vec::new(),
                error: None,
                truncated_at: None,
            },
            Ok(mut r) => {
                let header = Ok(format!("{:?}", r.header()));
                let mut records = Vec::new();
                let mut error = None;
                loop {
                    match r.next_record() {
                        Ok(Some(rec)) => records.push(rec),
                        Ok(None) => break,
                        Err(e) => {
                            error = Some(named(&e, data.len()));
                            break;
                        }
                    }
                }
                Outcome {
                    header,
                    records,
                    error,
                    truncated_at: r.truncated_at(),
                }
            }
        }
    }};
}

fuzz_target!(|data: &[u8]| {
    let slow = read!(RefReader, data);
    let fast = read!(Reader, data);
    assert_eq!(slow, fast, "RefReader and Reader disagree");
});
