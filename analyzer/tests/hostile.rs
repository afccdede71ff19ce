//! Traces whose numbers are hostile — sizes near `u64::MAX`, an allocation at the very last
//! address, counters at their maximum: sums saturate at `u64::MAX` instead of wrapping to
//! something small (or, in a debug build like this one, panicking on overflow), what is live is
//! still exact once the huge allocations are gone, and every subcommand ends cleanly.

mod common;

use common::*;
use isolate_analyzer::{NoProgress, diff, summary};
use isolate_trace::{Api, Stats};

const MAX: u64 = u64::MAX;

fn hostile() -> TraceBuilder {
    let mut t = TraceBuilder::new();
    t.malloc(A, MAX - 10); // 0: device, almost all of the address space
    t.malloc(0x1000, 100); // 1
    t.call(Api::CudaMallocManaged, 0x2000, MAX); // 2: device memory in use passes u64::MAX
    t.free(A); // 3
    t.free(0x2000); // 4
    t.malloc(MAX, 16); // 5: at the last address
    t.call(Api::CudaMallocHost, 0x5000, MAX); // 6
    t.call(Api::CudaMallocHost, 0x6000, MAX); // 7: pinned host memory passes it too
    t.end(Stats {
        events: MAX,
        queue_waits: MAX,
        queue_wait_ns: MAX,
        quarantine_peak_bytes: MAX,
        quarantine_releases: MAX,
        quarantine_early_releases: MAX,
        ..Stats::default()
    });
    t
}

#[test]
fn sums_saturate_and_live_bytes_stay_exact() {
    let d = tempfile::tempdir().unwrap();
    let p = hostile().write(d.path(), "h.trace");
    let s = summary::summarize(&[&p], &mut NoProgress).unwrap();
    assert_eq!(s.peak_live_bytes, MAX, "saturated, not wrapped");
    assert_eq!(s.live_at_end.count, 2);
    assert_eq!(
        s.live_at_end.bytes, 116,
        "exact again once the huge ones are freed"
    );
    assert_eq!(s.categories["device"].bytes_started, MAX);
    assert_eq!(s.categories["managed"].peak_live_bytes, MAX);
    let dev = &s.traces[0].devices["0"];
    assert_eq!(dev.peak_live_bytes, MAX);
    assert_eq!(dev.live_at_end.bytes, 116);
    assert_eq!(s.host.peak_live_bytes, MAX);
    assert_eq!(
        s.host.live_at_end.bytes, MAX,
        "2 × u64::MAX held, saturated"
    );
    assert_eq!(s.host.live_at_end.count, 2);

    // Two traces added up: every sum saturates.
    let two = summary::summarize(&[&p, &p], &mut NoProgress).unwrap();
    assert_eq!(two.peak_live_bytes, MAX);
    assert_eq!(two.live_at_end.bytes, 232);
    assert_eq!(two.categories["device"].bytes_started, MAX);
    assert_eq!(two.host.live_at_end.bytes, MAX);
    assert_eq!(two.quarantine.peak_bytes, MAX);
    assert_eq!(two.quarantine.releases, MAX);
    assert_eq!(two.writer.events_accepted, MAX);
    assert_eq!(two.writer.queue_wait_ns, MAX);
    let text = summary::render_text(&two);
    assert!(text.contains("peak 16384.0 PiB of device memory"), "{text}");

    let profile = diff::profile(&p, &mut NoProgress).unwrap();
    assert_eq!(profile.allocated_bytes, MAX);
    assert_eq!(profile.by_api["cudaMallocHost"].bytes, MAX);
}

#[test]
fn every_subcommand_ends_cleanly() {
    let d = tempfile::tempdir().unwrap();
    hostile().write(d.path(), "h.trace");
    for args in [
        &["summary", "h.trace", "h.trace"][..],
        &["summary", "--json", "h.trace", "h.trace"],
        &["graph", "h.trace", "h.trace", "-o", "g.json"],
        &["graph", "--format", "dot", "h.trace", "-o", "g.dot"],
        &["graph", "--address", "0xffffffffffffffff", "h.trace"],
        &["who", "0xffffffffffffffff", "h.trace"],
        &["who", "--json", "0x7f0000000000", "h.trace"],
        &["report", "h.trace", "h.trace", "-o", "r.html"],
        &[
            "export",
            "--format",
            "chrome-trace",
            "h.trace",
            "-o",
            "e.json",
        ],
        &["diff", "--json", "h.trace", "h.trace"],
        &["check", "h.trace", "--baseline", "h.trace"],
    ] {
        let o = isolate(d.path(), args);
        assert_eq!(o.code, 0, "isolate {}: {}", args.join(" "), o.stderr);
        // `report` says where it wrote, and nothing else.
        let said = if args[0] == "report" {
            "isolate: report written: r.html\n"
        } else {
            ""
        };
        assert!(o.stderr == said, "isolate {}: {}", args.join(" "), o.stderr);
    }
}
