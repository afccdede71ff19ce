mod common;

use common::*;
use isolate_analyzer::{NoProgress, who};
use isolate_trace::{Api, Record, Violation};
use serde_json::json;

#[test]
fn exact_history_of_an_address() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096); // n0 seq 0
    t.malloc(A + 0x10_0000, 64); // n1: elsewhere
    t.free(A); // seq 2
    t.stream = 0x77;
    t.call(Api::CudaMallocAsync, A, 1 << 16); // n2 seq 3
    t.stream = 0;
    t.call(Api::CudaFreeAsync, A, 0); // seq 4
    t.record(Record::Violation(Violation {
        seq: 5,
        ptr: A,
        size: 1 << 16,
        first_offset: 0x100,
        changed_bytes: 4,
        alloc_seq: 3,
        free_seq: 4,
        free_api: Api::CudaFreeAsync,
        ..Violation::default()
    }));
    t.tid = 2000;
    t.malloc(A + 0x80, 32); // n3 seq 5: still live at the end
    let p = t.write(d.path(), "w.trace");
    let w = who::who(A + 0x100, &[&p], &mut NoProgress).unwrap();
    let v = serde_json::to_value(&w).unwrap();
    assert_eq!(v["address"], "0x7f0000000100");
    let h = &v["traces"][0]["history"];
    assert_eq!(h.as_array().unwrap().len(), 2, "{h:#}");
    assert_eq!(
        h[0],
        json!({"node":0,"category":"device","api":"cudaMalloc","device":0,"tid":1000,"stream":"0x0",
               "ptr":"0x7f0000000000","size":4096,"offset":256,"alloc_seq":0,"alloc_ts_ns":1001000,
               "free_seq":2,"free_ts_ns":1003000,"free_api":"cudaFree","lost":false,"lifetime_ns":2000,
               "next":{"node":2,"api":"cudaMallocAsync","size":65536,"alloc_seq":3,"gap_ns":1000},
               "handle":"0x0","handle_offset":null,"handle_node":null,"handle_size":null,"reservation":null})
    );
    assert_eq!(h[1]["node"], 2);
    assert_eq!(h[1]["stream"], "0x77");
    assert_eq!(h[1]["free_api"], "cudaFreeAsync");
    assert_eq!(h[1]["next"], json!(null));
    assert_eq!(v["traces"][0]["incidents"][0]["kind"], "poison_violation");
    // n3 covers A+0x80..A+0xa0: not A+0x100.
    let w = who::who(A + 0x90, &[&p], &mut NoProgress).unwrap();
    let nodes: Vec<u64> = w.traces[0].history.iter().map(|o| o.node).collect();
    assert_eq!(nodes, [0, 2, 3]);
    assert_eq!(w.traces[0].history[2].free_seq, None);
    assert_eq!(w.traces[0].history[2].tid, 2000);
}

/// `who` in words (issue 32): the finding's name as the summary says it (`STALE WRITE`, not the
/// internal `POISON_VIOLATION`) and places as events (`event 5`, not `seq 5`); an address that
/// is not one (`who -1`) is the usual `isolate:` error line, not clap's.
#[test]
fn who_speaks_in_the_finding_words() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096); // seq 0
    t.free(A); // seq 1
    t.record(Record::Violation(Violation {
        seq: 7,
        ptr: A,
        size: 4096,
        first_offset: 0x100,
        changed_bytes: 4,
        alloc_seq: 0,
        free_seq: 1,
        free_api: Api::CudaFree,
        ..Violation::default()
    }));
    t.malloc(A, 4096); // seq 2: still live
    t.write(d.path(), "w.trace");
    let o = isolate(d.path(), &["who", "0x7f0000000100", "w.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = &o.stdout;
    assert!(
        text.contains(
            "STALE WRITE: event 7 (cudaFree) 0x7f0000000000: 4 bytes changed from offset 256 \
             after the free (allocated at event 0, freed at event 1)"
        ),
        "{text}"
    );
    assert!(text.contains("events 0 to 1 ("), "{text}");
    assert!(text.contains("event 2, still live at the end"), "{text}");
    for internal in ["seq", "POISON_VIOLATION", "poison_violation"] {
        assert!(!text.contains(internal), "{internal}: {text}");
    }
    for addr in ["-1", "-4096"] {
        let o = isolate(d.path(), &["who", addr, "w.trace"]);
        assert_eq!(o.code, 2);
        assert_eq!(
            o.stderr,
            format!(
                "isolate: who: ADDR, the first argument, is \"{addr}\": not an address \
                 (expected 0x… hex or decimal)\n"
            )
        );
    }
}

#[test]
fn vmm_mappings_covering_an_address() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    let r = 0x6000_0000_0000u64;
    t.vmm(Api::CuMemAddressReserve, r, 64 * MIB, 0, 0); // n0
    t.vmm(Api::CuMemCreate, 0, 4 * MIB, 0x42, 0); // n1
    t.vmm(Api::CuMemMap, r + 2 * MIB, 2 * MIB, 0x42, MIB); // n2
    t.vmm(Api::CuMemUnmap, r + 2 * MIB, 2 * MIB, 0, 0);
    t.vmm(Api::CuMemRelease, 0, 0, 0x42, 0);
    let p = t.write(d.path(), "v.trace");
    let w = who::who(r + 2 * MIB + 0x10, &[&p], &mut NoProgress).unwrap();
    let tr = &w.traces[0];
    assert!(tr.history.is_empty());
    assert_eq!(tr.reservations.len(), 1);
    assert_eq!(tr.reservations[0].offset, 2 * MIB + 0x10);
    assert_eq!(tr.mappings.len(), 1);
    let m = &tr.mappings[0];
    assert_eq!(m.handle, 0x42);
    assert_eq!(m.handle_offset, Some(MIB + 0x10));
    assert_eq!(m.handle_node, Some(1));
    assert_eq!(m.handle_size, Some(4 * MIB));
    assert_eq!(m.reservation, Some(0));
    assert_eq!(m.free_api, Some("cuMemUnmap"));

    let o = isolate(d.path(), &["who", "0x600000200010", "v.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("maps handle 0x42 at offset 0x100010"),
        "{}",
        o.stdout
    );
    let o = isolate(d.path(), &["who", "--json", "0x600000200010", "v.trace"]);
    assert_eq!(
        o.json()["traces"][0]["mappings"][0]["handle_offset"],
        0x100010
    );
}
