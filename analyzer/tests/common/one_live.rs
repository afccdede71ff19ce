//! A synthetic trace with one live allocation at a time: the case where an analysis whose memory
//! grows with the number of allocations (rather than with what is live) shows it plainly.
//!
//! Used by the memory test (`analyzer/tests/memory.rs`) and by the bench example
//! (`--one-live`), which includes this file with `#[path]`.

use isolate_trace::{Api, Encoder, End, EndReason, Event, Header, Record, Stats};
use std::io::Write;
use std::path::Path;

/// Writes a trace of `events` events (rounded down to an even number): allocation, free,
/// allocation, free, …, so exactly one allocation is live at a time. Sizes vary from 256 B to
/// 1 MiB; addresses move on by 2 MiB with each allocation and never come back, except that
/// every fourth allocation takes the address just freed (a reuse edge). Pairs alternate between
/// `cudaMalloc`/`cudaFree` on thread 1000 and `cudaMallocAsync`/`cudaFreeAsync` on a stream of
/// thread 1001. A `Stats` record every million events, an `End` record at the end. Returns the
/// number of events written.
pub fn write_one_live(path: &Path, events: u64) -> std::io::Result<u64> {
    let f = std::fs::File::create(path)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut buf = Vec::with_capacity(2 << 20);
    Encoder::preamble(
        &Header {
            pid: 4343,
            ppid: 1,
            exe: "/usr/bin/python3".into(),
            argv: vec!["python3".into(), "one_live.py".into()],
            hostname: "bench".into(),
            mode: "log".into(),
            library_version: "0.1.0".into(),
            ..Header::default()
        },
        &mut buf,
    );
    let mut enc = Encoder::new();
    let pairs = events / 2;
    let mut seq = 0u64;
    let mut ts = 1_000_000_000u64;
    let mut next = 0x7f00_0000_0000u64;
    let mut last = next;
    for i in 0..pairs {
        let size = 256 * (1 + (i.wrapping_mul(7919) % 4096));
        let ptr = if i % 4 == 3 {
            last
        } else {
            let p = next;
            next += 2 << 20;
            p
        };
        last = ptr;
        let async_pair = i % 2 == 1;
        let (alloc, free, tid, stream) = if async_pair {
            (Api::CudaMallocAsync, Api::CudaFreeAsync, 1001, 0x5555_0000)
        } else {
            (Api::CudaMalloc, Api::CudaFree, 1000, 0)
        };
        for (api, sz) in [(alloc, size), (free, 0)] {
            ts += 1000;
            let ev = Event {
                seq,
                ts_ns: ts,
                tid,
                api,
                ptr,
                size: sz,
                stream,
                duration_ns: 500,
                ..Event::default()
            };
            enc.encode(&Record::Event(ev), &mut buf);
            seq += 1;
            if seq.is_multiple_of(1_000_000) {
                enc.encode(
                    &Record::Stats(Stats {
                        ts_ns: ts,
                        events: seq,
                        ..Stats::default()
                    }),
                    &mut buf,
                );
            }
        }
        if buf.len() > (1 << 20) {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    enc.encode(
        &Record::End(End {
            ts_ns: ts + 1,
            reason: EndReason::Exit,
            stats: Stats {
                events: seq,
                ..Stats::default()
            },
        }),
        &mut buf,
    );
    w.write_all(&buf)?;
    w.flush()?;
    Ok(seq)
}
