//! Two ranks of one job, as `torchrun` would leave them: one trace per process, each with its own
//! pid, rank and device, and (as real processes often do) the same virtual addresses and the
//! same handle values, which mean nothing across processes. `summary`, `graph` and `report`
//! over both must keep them apart.

mod common;

use common::*;
use isolate_trace::{Api, Event, Header, Stats};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Reservation, the same in both ranks.
const R: u64 = 0x6000_0000_0000;
/// The physical handle value, the same in both ranks (handles are per process).
const H: u64 = 0x11;

fn rank_header(rank: u32, pid: u32) -> Header {
    let mut h = header(
        pid,
        &["python3", "tests/gpu/ddp_train.py", "--steps", "100"],
    );
    h.ppid = 4000; // both workers of one launcher
    h.rank = Some(rank);
    h.local_rank = Some(rank);
    h.world_size = Some(2);
    h.config = vec![
        ("ISOLATE_MODE".into(), "log".into()),
        ("ISOLATE_TRACE".into(), "ddp-log-r%r-%p.trace".into()),
    ];
    h
}

/// What one rank does: NCCL-like VMM buffers mapped for itself and its peer, plus a few
/// cudaMalloc/cudaFree with one reuse. `big` makes the ranks' sizes differ, and rank 1 keeps
/// one allocation to the end, so that per-trace figures can be told apart.
fn rank_trace(rank: u32, pid: u32) -> TraceBuilder {
    let mut t = TraceBuilder::with_header(rank_header(rank, pid));
    t.device = rank as i32;
    t.tid = pid;
    t.ts = 1_000_000 + rank as u64 * 500; // interleaved in time, as real ranks are
    let big = (4 + 4 * rank as u64) * MIB; // rank 0: 4 MiB, rank 1: 8 MiB
    // NCCL_CUMEM_ENABLE=1: reserve, create, map, give access to both devices.
    t.vmm(Api::CuMemAddressReserve, R, 64 * MIB, 0, 2 * MIB);
    t.vmm(Api::CuMemCreate, 0, 2 * MIB, H, 0);
    t.vmm(Api::CuMemMap, R, 2 * MIB, H, 0);
    t.event(Event {
        api: Api::CuMemSetAccess,
        ptr: R,
        size: 2 * MIB,
        handle: 0b11, // devices 0 and 1
        offset: 2,    // two access descriptors
        ..Event::default()
    });
    // A second buffer only for itself.
    t.vmm(Api::CuMemCreate, 0, 2 * MIB, H + 1, 0);
    t.vmm(Api::CuMemMap, R + 2 * MIB, 2 * MIB, H + 1, 0);
    t.event(Event {
        api: Api::CuMemSetAccess,
        ptr: R + 2 * MIB,
        size: 2 * MIB,
        handle: 1 << rank,
        offset: 1,
        ..Event::default()
    });
    // Plain runtime memory, one reuse of A.
    t.malloc(A, big);
    t.malloc(A + big, MIB);
    t.free(A);
    t.malloc(A, 2 * MIB);
    t.free(A);
    if rank == 0 {
        t.free(A + big);
    }
    // Tear down the VMM buffers.
    t.vmm(Api::CuMemUnmap, R, 4 * MIB, 0, 0);
    t.vmm(Api::CuMemRelease, 0, 0, H, 0);
    t.vmm(Api::CuMemRelease, 0, 0, H + 1, 0);
    t.vmm(Api::CuMemAddressFree, R, 64 * MIB, 0, 0);
    t.end(Stats::default());
    t
}

const PIDS: [u32; 2] = [4101, 4102];

fn write_both(dir: &std::path::Path) -> Vec<PathBuf> {
    (0..2u32)
        .map(|r| {
            let name = format!("ddp-log-r{r}-{}.trace", PIDS[r as usize]);
            rank_trace(r, PIDS[r as usize]).write(dir, &name)
        })
        .collect()
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned number: {v}"))
}

#[test]
fn summary_keeps_ranks_apart_and_totals_are_sums() {
    let d = tempfile::tempdir().unwrap();
    let paths = write_both(d.path());
    let o = isolate(
        d.path(),
        &[
            "summary",
            "--json",
            "ddp-log-r0-4101.trace",
            "ddp-log-r1-4102.trace",
        ],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let s = o.json();
    let traces = s["traces"].as_array().expect("traces array");
    assert_eq!(traces.len(), 2, "one entry per rank");

    for (r, t) in traces.iter().enumerate() {
        let h = &t["header"];
        assert_eq!(h["rank"], r as u64, "trace {r}: header.rank");
        assert_eq!(h["local_rank"], r as u64);
        assert_eq!(h["world_size"], 2);
        assert_eq!(h["pid"], PIDS[r]);
        assert_eq!(
            t["file"],
            paths[r].file_name().unwrap().to_str().unwrap(),
            "trace {r}: file"
        );
        // Its device and no other.
        let devs: Vec<&String> = t["devices"].as_object().unwrap().keys().collect();
        assert_eq!(devs, [&r.to_string()], "trace {r}: devices");
        // Every API of the scenario, with the right counts.
        let c = &t["calls"];
        for (api, n) in [
            ("cuMemAddressReserve", 1),
            ("cuMemCreate", 2),
            ("cuMemMap", 2),
            ("cuMemSetAccess", 2),
            ("cuMemUnmap", 1),
            ("cuMemRelease", 2),
            ("cuMemAddressFree", 1),
            ("cudaMalloc", 3),
            ("cudaFree", if r == 0 { 3 } else { 2 }),
        ] {
            assert_eq!(c[api], n, "trace {r}: calls[{api}] in {c}");
        }
        // The events of each trace name its own device.
        for e in t["last_events"].as_array().unwrap() {
            assert_eq!(e["device"], r as i64, "trace {r}: last event {e}");
            assert_eq!(e["trace"], r as u64, "trace {r}: last event {e}");
        }
        assert_eq!(
            t["invalid_free_count"], 0,
            "trace {r}: same handles/addresses in the other rank are not invalid"
        );
        assert_eq!(t["lost"], 0, "trace {r}: nothing lost");
        assert_eq!(t["complete"], true);
    }
    // Distinct ranks.
    let ranks: BTreeSet<u64> = traces.iter().map(|t| u(&t["header"]["rank"])).collect();
    assert_eq!(ranks, BTreeSet::from([0, 1]));

    // What tells the ranks apart, per trace.
    let (t0, t1) = (&traces[0], &traces[1]);
    // rank 0: peak = 2 handles (4 MiB) + 4 MiB + 1 MiB; rank 1: 4 MiB + 8 MiB + 1 MiB
    assert_eq!(t0["peak_live_bytes"], 9 * MIB, "rank 0 peak");
    assert_eq!(t1["peak_live_bytes"], 13 * MIB, "rank 1 peak");
    assert_eq!(t0["live_at_end"]["count"], 0);
    assert_eq!(t1["live_at_end"]["count"], 1);
    assert_eq!(t1["live_at_end"]["bytes"], MIB);
    assert_eq!(
        t0["devices"]["0"]["peak_live_bytes"],
        9 * MIB,
        "rank 0 device 0"
    );
    assert_eq!(t1["devices"]["1"]["live_at_end"]["bytes"], MIB);

    // Totals are the sums of the per-trace figures.
    for k in [
        "events",
        "allocations",
        "frees",
        "peak_live_bytes",
        "invalid_free_count",
        "lost",
    ] {
        assert_eq!(u(&s[k]), u(&t0[k]) + u(&t1[k]), "totals.{k}");
    }
    for k in ["count", "bytes"] {
        assert_eq!(
            u(&s["live_at_end"][k]),
            u(&t0["live_at_end"][k]) + u(&t1["live_at_end"][k]),
            "totals.live_at_end.{k}"
        );
    }
    let mut summed: BTreeMap<String, u64> = BTreeMap::new();
    for t in traces {
        for (api, n) in t["calls"].as_object().unwrap() {
            *summed.entry(api.clone()).or_default() += u(n);
        }
    }
    let total_calls: BTreeMap<String, u64> = s["calls"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), u(v)))
        .collect();
    assert_eq!(total_calls, summed, "totals.calls = sum of per-trace calls");
    for (cat, c) in s["categories"].as_object().unwrap() {
        for k in ["started", "ended", "bytes_started"] {
            assert_eq!(
                u(&c[k]),
                u(&t0["categories"][cat][k]) + u(&t1["categories"][cat][k]),
                "totals.categories.{cat}.{k}"
            );
        }
    }
    assert_eq!(s["complete"], true);
}

#[test]
fn summary_text_names_both_ranks() {
    let d = tempfile::tempdir().unwrap();
    write_both(d.path());
    let o = isolate(
        d.path(),
        &["summary", "ddp-log-r0-4101.trace", "ddp-log-r1-4102.trace"],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    assert!(
        o.stdout.contains("rank 0"),
        "text summary names rank 0:\n{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("rank 1"),
        "text summary names rank 1:\n{}",
        o.stdout
    );
}

#[test]
fn graph_ids_do_not_collide_and_edges_stay_inside_a_rank() {
    let d = tempfile::tempdir().unwrap();
    write_both(d.path());
    let o = isolate(
        d.path(),
        &[
            "graph",
            "--format",
            "json",
            "ddp-log-r0-4101.trace",
            "ddp-log-r1-4102.trace",
        ],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let g = o.json();

    let gt = g["traces"].as_array().unwrap();
    assert_eq!(gt.len(), 2);
    for (r, t) in gt.iter().enumerate() {
        assert_eq!(t["index"], r as u64);
        assert_eq!(t["rank"], r as u64, "graph trace {r}: rank");
        assert_eq!(t["pid"], PIDS[r]);
    }

    // Node ids: unique over both traces, 0..n with no gap; each node in one trace, on its device.
    let nodes = g["nodes"].as_array().unwrap();
    let mut trace_of: BTreeMap<u64, u64> = BTreeMap::new();
    for n in nodes {
        let id = u(&n["id"]);
        let tr = u(&n["trace"]);
        assert!(
            trace_of.insert(id, tr).is_none(),
            "node id {id} appears twice"
        );
        let cat = n["category"].as_str().unwrap();
        assert_eq!(
            n["device"], tr as i64,
            "node {id} ({cat}) of trace {tr}: device"
        );
    }
    let ids: Vec<u64> = trace_of.keys().copied().collect();
    assert_eq!(ids, (0..nodes.len() as u64).collect::<Vec<_>>(), "ids 0..n");
    // Each trace: 1 reservation, 2 handles, 2 mappings, 3 allocations = 8 nodes, the first
    // trace's ids before the second's.
    for tr in 0..2u64 {
        let mine: Vec<u64> = trace_of
            .iter()
            .filter(|(_, t)| **t == tr)
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(mine.len(), 8, "trace {tr}: nodes {mine:?}");
        assert_eq!(
            mine,
            (tr * 8..tr * 8 + 8).collect::<Vec<_>>(),
            "trace {tr}: ids one after the other"
        );
    }
    // References between nodes stay inside a trace.
    for n in nodes {
        for k in ["reservation", "handle_node"] {
            if let Some(other) = n[k].as_u64() {
                assert_eq!(
                    trace_of[&other],
                    u(&n["trace"]),
                    "node {}: {k} {other} in another trace",
                    n["id"]
                );
            }
        }
    }

    // Edges: never from one rank to the other, and each rank has its own of every kind.
    let edges = g["edges"].as_array().unwrap();
    let mut kinds: BTreeMap<(u64, String), u64> = BTreeMap::new();
    for e in edges {
        let (from, to) = (u(&e["from"]), u(&e["to"]));
        let (tf, tt) = (trace_of[&from], trace_of[&to]);
        assert_eq!(tf, tt, "edge {e} joins trace {tf} to trace {tt}");
        *kinds
            .entry((tf, e["kind"].as_str().unwrap().to_owned()))
            .or_default() += 1;
    }
    for tr in 0..2u64 {
        assert_eq!(
            kinds.get(&(tr, "reuse".into())),
            Some(&1),
            "trace {tr}: one reuse edge; {kinds:?}"
        );
        assert_eq!(
            kinds.get(&(tr, "maps".into())),
            Some(&2),
            "trace {tr}: two maps edges; {kinds:?}"
        );
        assert_eq!(
            kinds.get(&(tr, "contains".into())),
            Some(&2),
            "trace {tr}: two contains edges; {kinds:?}"
        );
    }
    assert!(
        !kinds.keys().any(|(_, k)| k == "alias"),
        "no alias: same handle value in two processes is not one memory; {kinds:?}"
    );

    // Anomalies: none joins the ranks; same addresses and handles are no overlap or alias.
    for a in g["anomalies"].as_array().unwrap() {
        let kind = a["kind"].as_str().unwrap();
        assert!(
            kind != "overlap" && kind != "true_alias" && kind != "invalid_free",
            "anomaly across ranks: {a}"
        );
        if let Some(ns) = a["nodes"].as_array() {
            let ts: BTreeSet<u64> = ns.iter().map(|n| trace_of[&u(n)]).collect();
            assert_eq!(ts.len(), 1, "anomaly {a} joins traces {ts:?}");
        }
    }
    // The one never-freed allocation is rank 1's.
    let never: Vec<&Value> = g["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "never_freed")
        .collect();
    assert_eq!(never.len(), 1, "{never:?}");
    assert_eq!(trace_of[&u(&never[0]["node"])], 1);
}

#[test]
fn report_names_both_ranks() {
    let d = tempfile::tempdir().unwrap();
    write_both(d.path());
    let o = isolate(
        d.path(),
        &[
            "report",
            "ddp-log-r0-4101.trace",
            "ddp-log-r1-4102.trace",
            "-o",
            "ddp-report.html",
        ],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let html = std::fs::read_to_string(d.path().join("ddp-report.html")).expect("report written");
    // The title names both traces (file and pid).
    let title = html
        .split_once("<title>")
        .and_then(|(_, r)| r.split_once("</title>"))
        .map(|(t, _)| t)
        .expect("a title");
    for (r, pid) in PIDS.iter().enumerate() {
        assert!(
            title.contains(&format!("ddp-log-r{r}-{pid}.trace")),
            "title: {title}"
        );
        assert!(title.contains(&format!("pid {pid}")), "title: {title}");
    }
    // The page's data: one trace per rank, each with its rank and device.
    let data = html
        .split_once(r#"<script type="application/json" id="isolate-data">"#)
        .and_then(|(_, r)| r.split_once("</script>"))
        .map(|(d, _)| d)
        .expect("the data block");
    let page: Value = serde_json::from_str(data).expect("data is JSON");
    let traces = page["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2);
    for (r, t) in traces.iter().enumerate() {
        let s = &t["summary"];
        assert_eq!(s["header"]["rank"], r as u64, "report trace {r}: rank");
        assert_eq!(s["header"]["pid"], PIDS[r]);
        let devs: Vec<&String> = s["devices"].as_object().unwrap().keys().collect();
        assert_eq!(devs, [&r.to_string()], "report trace {r}: devices");
    }
    // The page's script puts ", rank N" in each trace's heading from header.rank.
    assert!(
        html.contains(r#"", rank " + h.rank"#),
        "the heading shows the rank"
    );
}

#[test]
fn who_answers_per_rank() {
    let d = tempfile::tempdir().unwrap();
    write_both(d.path());
    let addr = format!("{:#x}", A + 256);
    let o = isolate(
        d.path(),
        &[
            "who",
            "--json",
            &addr,
            "ddp-log-r0-4101.trace",
            "ddp-log-r1-4102.trace",
        ],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let w = o.json();
    let traces = w["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2);
    for (r, t) in traces.iter().enumerate() {
        assert_eq!(t["rank"], r as u64);
        assert_eq!(t["pid"], PIDS[r]);
        let h = t["history"].as_array().unwrap();
        let sizes: Vec<u64> = h.iter().map(|n| u(&n["size"])).collect();
        assert_eq!(
            sizes,
            [(4 + 4 * r as u64) * MIB, 2 * MIB],
            "trace {r}: history {h:?}"
        );
        for n in h {
            assert_eq!(n["device"], r as i64, "trace {r}: {n}");
        }
    }
}
