mod common;

use common::*;
use isolate_analyzer::NoProgress;
use isolate_analyzer::graph::{self, Anomaly, EdgeKind, Filter};
use isolate_trace::{Api, Record, StaleLaunch, Violation};
use std::collections::{BTreeMap, BTreeSet};

/// (from, to, kind, overlap, gap)
type E = (u64, u64, &'static str, u64, Option<u64>);

fn edges(g: &graph::Graph) -> Vec<E> {
    g.edges
        .iter()
        .map(|e| (e.from, e.to, e.kind.name(), e.overlap_bytes, e.gap_ns))
        .collect()
}

/// The reuse scenario the tests below share; node ids in the comments.
fn reuse_trace() -> TraceBuilder {
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096); // n0, seq 0
    t.malloc(A + 4096, 4096); // n1
    t.free(A); // seq 2
    t.free(A + 4096); // seq 3
    t.malloc(A, 8192); // n2 takes both
    t.free(A); // seq 5
    t.malloc(A + 1024, 1024); // n3: middle of n2
    t.malloc(A, 1024); // n4: start of n2
    t.malloc(A + 2048, 8192); // n5: the rest of n2 and fresh memory
    t.free(A + 1024); // seq 9: n3
    t.malloc(A + 512, 2048); // n6: overlaps live n4 and n5, takes n3's place
    t.free(A + 512); // seq 11: n6
    t.free(A); // seq 12: n4
    t.malloc(A, 512); // n7
    t.free(A + 1024); // seq 14: double free of n3
    t
}

#[test]
fn exact_reuse_edges_and_overlaps() {
    let d = tempfile::tempdir().unwrap();
    let p = reuse_trace().write(d.path(), "r.trace");
    let g = graph::graph(&[&p], Filter::default(), &mut NoProgress).unwrap();
    assert_eq!(
        edges(&g),
        vec![
            (0, 2, "reuse", 4096, Some(2000)),
            (1, 2, "reuse", 4096, Some(1000)),
            (2, 3, "reuse", 1024, Some(1000)),
            (2, 4, "reuse", 1024, Some(2000)),
            (2, 5, "reuse", 6144, Some(3000)),
            (3, 6, "reuse", 1024, Some(1000)),
            (4, 7, "reuse", 512, Some(1000)),
        ]
    );
    assert_eq!(
        g.anomalies,
        vec![
            Anomaly::Overlap {
                nodes: [4, 6],
                overlap_bytes: 512
            },
            Anomaly::Overlap {
                nodes: [5, 6],
                overlap_bytes: 512
            },
            Anomaly::InvalidFree {
                trace: 0,
                what: "free",
                seq: 14,
                ts_ns: 1_015_000,
                api: "cudaFree",
                tid: 1000,
                ptr: A + 1024,
                after: Some(3),
                double_free: true,
            },
            Anomaly::NeverFreed {
                node: 5,
                category: "device",
                size: 8192
            },
            Anomaly::NeverFreed {
                node: 7,
                category: "device",
                size: 512
            },
        ]
    );
    // Nodes come out as they end, the never-freed ones last.
    let order: Vec<u64> = g.nodes.iter().map(|n| n.id).collect();
    assert_eq!(order, [0, 1, 2, 3, 6, 4, 5, 7]);
    let n2 = g.node(2).unwrap();
    assert_eq!(
        (n2.ptr, n2.size, n2.alloc_seq, n2.free_seq),
        (A, 8192, 4, Some(5))
    );
    assert_eq!(
        (n2.alloc_ts_ns, n2.free_ts_ns),
        (1_005_000, Some(1_006_000))
    );
    assert_eq!(n2.free_api, Some("cudaFree"));
}

#[test]
fn json_output_matches_and_is_stable() {
    let d = tempfile::tempdir().unwrap();
    reuse_trace().write(d.path(), "r.trace");
    let o = isolate(d.path(), &["graph", "--format", "json", "r.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 8);
    assert_eq!(v["edges"].as_array().unwrap().len(), 7);
    assert_eq!(
        v["edges"][4],
        serde_json::json!({"from":2,"to":5,"kind":"reuse","overlap_bytes":6144,"gap_ns":3000})
    );
    assert_eq!(v["nodes"][0]["ptr"], "0x7f0000000000");
    assert_eq!(v["anomalies"][2]["kind"], "invalid_free");
    assert_eq!(v["traces"][0]["file"], "r.trace");
    let again = isolate(d.path(), &["graph", "--format", "json", "r.trace"]);
    assert_eq!(o.stdout, again.stdout);
    // -o writes the same thing to a file; its name says JSON when --format does not.
    let o2 = isolate(d.path(), &["graph", "r.trace", "-o", "g.json"]);
    assert_eq!(o2.code, 0);
    assert_eq!(
        std::fs::read_to_string(d.path().join("g.json")).unwrap(),
        o.stdout
    );
}

#[test]
fn filters_keep_the_chains_through_one_address() {
    let d = tempfile::tempdir().unwrap();
    let p = reuse_trace().write(d.path(), "r.trace");
    let f = Filter {
        address: Some(A + 1024 + 8),
        ..Filter::default()
    };
    let g = graph::graph(&[&p], f, &mut NoProgress).unwrap();
    let mut ids: Vec<u64> = g.nodes.iter().map(|n| n.id).collect();
    ids.sort();
    assert_eq!(ids, [0, 2, 3, 6]);
    assert_eq!(
        edges(&g),
        vec![
            (0, 2, "reuse", 4096, Some(2000)),
            (2, 3, "reuse", 1024, Some(1000)),
            (3, 6, "reuse", 1024, Some(1000))
        ]
    );
    assert_eq!(g.anomalies.len(), 1, "{:?}", g.anomalies);

    // Size class 1024: n3, n4 (both 1024 bytes), n7 (512) is another class.
    let f = Filter {
        size_class: Some(1000),
        ..Filter::default()
    };
    let g = graph::graph(&[&p], f, &mut NoProgress).unwrap();
    let mut ids: Vec<u64> = g.nodes.iter().map(|n| n.id).collect();
    ids.sort();
    assert_eq!(ids, [3, 4]);
    assert!(g.edges.is_empty());

    // Live within [seq 6's time, seq 8's time]: n2 ended at seq 5, so it is out.
    let f = Filter {
        from_ns: Some(1_007_000),
        to_ns: Some(1_009_000),
        ..Filter::default()
    };
    let g = graph::graph(&[&p], f, &mut NoProgress).unwrap();
    let mut ids: Vec<u64> = g.nodes.iter().map(|n| n.id).collect();
    ids.sort();
    assert_eq!(ids, [3, 4, 5]);

    // The same through the binary.
    let o = isolate(
        d.path(),
        &[
            "graph",
            "--format",
            "json",
            "r.trace",
            "--address",
            "0x7f0000000408",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["edges"].as_array().unwrap().len(), 3);
    let o = isolate(d.path(), &["graph", "r.trace", "--address", "zzz"]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr
            .starts_with("isolate: --address: \"zzz\" is not a number"),
        "the error names the argument: {}",
        o.stderr
    );
}

#[test]
fn vmm_maps_edges_and_true_aliases() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    let r = 0x6000_0000_0000u64;
    t.vmm(Api::CuMemAddressReserve, r, 64 * MIB, 0, 0); // n0
    t.vmm(Api::CuMemCreate, 0, 4 * MIB, 0xabc, 0); // n1
    t.vmm(Api::CuMemMap, r, 2 * MIB, 0xabc, 0); // n2: handle bytes [0, 2M)
    t.vmm(Api::CuMemMap, r + 2 * MIB, 2 * MIB, 0xabc, 0); // n3: the same bytes again: alias
    t.vmm(Api::CuMemMap, r + 4 * MIB, 2 * MIB, 0xabc, 2 * MIB); // n4: [2M, 4M): no alias
    t.vmm(Api::CuMemUnmap, r + 2 * MIB, 2 * MIB, 0, 0); // n3 goes
    t.vmm(Api::CuMemMap, r + 2 * MIB, 2 * MIB, 0xabc, 2 * MIB); // n5: aliases n4, reuses n3's range
    let p = t.write(d.path(), "v.trace");
    let g = graph::graph(&[&p], Filter::default(), &mut NoProgress).unwrap();
    let m = 2 * MIB;
    assert_eq!(
        edges(&g),
        vec![
            (2, 1, "maps", m, None),
            (0, 2, "contains", m, None),
            (3, 1, "maps", m, None),
            (2, 3, "alias", m, None),
            (0, 3, "contains", m, None),
            (4, 1, "maps", m, None),
            (0, 4, "contains", m, None),
            (5, 1, "maps", m, None),
            (4, 5, "alias", m, None),
            (0, 5, "contains", m, None),
            (3, 5, "reuse", m, Some(1000)),
        ]
    );
    let aliases: Vec<&Anomaly> = g
        .anomalies
        .iter()
        .filter(|a| matches!(a, Anomaly::TrueAlias { .. }))
        .collect();
    assert_eq!(
        aliases,
        vec![
            &Anomaly::TrueAlias {
                nodes: [2, 3],
                handle: 0xabc,
                overlap_bytes: m
            },
            &Anomaly::TrueAlias {
                nodes: [4, 5],
                handle: 0xabc,
                overlap_bytes: m
            },
        ]
    );
    let n5 = g.node(5).unwrap();
    assert_eq!(
        (n5.reservation, n5.handle_node, n5.category),
        (Some(0), Some(1), "mapping")
    );
    assert_eq!(g.edges_of_kind(EdgeKind::Maps).count(), 4);
}

#[test]
fn dot_escapes_untrusted_text() {
    let d = tempfile::tempdir().unwrap();
    let mut h = header(7, &["evil\"name", "<script>alert(1)</script>", "a\\b"]);
    h.exe = "/tmp/\"quoted\"<b>".into();
    let mut t = TraceBuilder::with_header(h);
    t.malloc(A, 4096);
    t.free(A);
    t.record(Record::StaleLaunch(StaleLaunch {
        seq: 2,
        kernel: "k\"<script>x</script>\n".into(),
        ptr: A,
        alloc_ptr: A,
        alloc_size: 4096,
        ..StaleLaunch::default()
    }));
    t.write(d.path(), "e.trace");
    let o = isolate(d.path(), &["graph", "--format", "dot", "e.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let dot = o.stdout;
    assert!(!dot.contains("<script>"), "{dot}");
    assert!(dot.contains("evil\\\"name"), "{dot}");
    assert!(
        dot.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{dot}"
    );
    assert!(dot.contains("a\\\\b"));
    assert!(dot.contains("stale launch: k\\\"&lt;script&gt;"), "{dot}");
    assert_quotes_close_on_their_lines(&dot);
    // Graphviz must accept the file.
    match std::process::Command::new("dot")
        .arg("-Tsvg")
        .arg("-o")
        .arg(d.path().join("g.svg"))
        .stdin(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut c) => {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(dot.as_bytes()).unwrap();
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "dot rejected the graph");
        }
        Err(e) => skip(&format!(
            "Graphviz's dot cannot be run ({e}; apt-get install -y graphviz): the DOT file is not checked by it"
        )),
    }
}

#[test]
fn several_traces_get_distinct_ids() {
    let d = tempfile::tempdir().unwrap();
    let mut a = TraceBuilder::with_header(header(1, &["a"]));
    a.malloc(A, 64);
    a.free(A);
    a.malloc(A, 64);
    let mut b = TraceBuilder::with_header(header(2, &["b"]));
    b.malloc(A, 64);
    b.free(A);
    b.malloc(A, 64);
    let pa = a.write(d.path(), "a.trace");
    let pb = b.write(d.path(), "b.trace");
    let g = graph::graph(&[pa, pb], Filter::default(), &mut NoProgress).unwrap();
    assert_eq!(
        edges(&g),
        vec![
            (0, 1, "reuse", 64, Some(1000)),
            (2, 3, "reuse", 64, Some(1000))
        ]
    );
    assert_eq!(g.node(3).unwrap().trace, 1);
    assert_eq!(g.traces[1].pid, 2);
}

#[test]
fn lost_frees_and_shared_graph_addresses() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096); // n0: its free is never seen
    t.malloc(A, 4096); // n1 at the same start: n0 is lost
    t.call(Api::CuGraphAddMemAllocNode, 0x9000_0000, MIB); // n2
    t.call(Api::CuGraphAddMemAllocNode, 0x9000_0000, MIB); // n3: another graph, same address
    let p = t.write(d.path(), "l.trace");
    let g = graph::graph(&[&p], Filter::default(), &mut NoProgress).unwrap();
    assert!(g.node(0).unwrap().lost);
    assert_eq!(g.node(0).unwrap().free_seq, Some(1));
    let overlaps: Vec<&Anomaly> = g
        .anomalies
        .iter()
        .filter(|a| matches!(a, Anomaly::Overlap { .. }))
        .collect();
    assert_eq!(
        overlaps,
        vec![&Anomaly::Overlap {
            nodes: [0, 1],
            overlap_bytes: 4096
        }],
        "graph memory shared between graphs is no anomaly"
    );
    assert!(
        g.edges.is_empty(),
        "a lost node hands nothing on: {:?}",
        g.edges
    );
    let s = isolate_analyzer::summary::summarize(&[&p], &mut NoProgress).unwrap();
    assert_eq!(s.lost, 1);
    assert_eq!(s.live_at_end.bytes, 4096);
}

/// One freed allocation at `base` that three findings name: a stale launch of `kernel`, a
/// guard-mode stale value of `kernel_value`, and a stale write at byte `offset`. Then a stale
/// launch into memory the trace never saw (a finding attached to no node).
fn three_findings_on_one_allocation(
    t: &mut TraceBuilder,
    base: u64,
    kernel: &str,
    kernel_value: &str,
    offset: u64,
) {
    let alloc = t.malloc(base, 4096);
    let free = t.free(base);
    let stale = |seq: u64, kernel: &str| StaleLaunch {
        seq,
        kernel: kernel.into(),
        ptr: base + 256,
        alloc_ptr: base,
        alloc_size: 4096,
        alloc_seq: alloc,
        free_seq: free,
        ..StaleLaunch::default()
    };
    t.record(Record::StaleLaunch(stale(t.seq, kernel)));
    t.seq += 1;
    t.record(Record::StaleValue(stale(t.seq, kernel_value)));
    t.seq += 1;
    t.record(Record::Violation(Violation {
        seq: t.seq,
        ptr: base,
        size: 4096,
        first_offset: offset,
        changed_bytes: 8,
        alloc_seq: alloc,
        free_seq: free,
        free_api: Api::CudaFree,
        ..Violation::default()
    }));
    t.seq += 1;
    t.record(Record::StaleLaunch(StaleLaunch {
        seq: t.seq,
        kernel: format!("{kernel}_nowhere"),
        ptr: 0x1000,
        ..StaleLaunch::default()
    }));
    t.seq += 1;
}

/// A DOT file as declarations and edges (one statement a line, as `DotSink` writes them):
/// node id → its attribute text, and (from, to) of each edge.
struct Dot {
    nodes: BTreeMap<String, String>,
    edges: Vec<(String, String)>,
}

fn parse_dot(dot: &str) -> Dot {
    let mut nodes = BTreeMap::new();
    let mut edges = Vec::new();
    let is_id = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    for line in dot.lines() {
        let line = line.trim();
        if let Some((lhs, attrs)) = line.split_once(" [") {
            if let Some((from, to)) = lhs.split_once(" -> ") {
                assert!(is_id(from) && is_id(to), "edge {line:?}");
                edges.push((from.to_owned(), to.to_owned()));
            } else if !matches!(lhs, "graph" | "node" | "edge") {
                assert!(is_id(lhs), "declaration {line:?}");
                let old = nodes.insert(lhs.to_owned(), attrs.to_owned());
                assert!(old.is_none(), "node id {lhs} declared twice:\n{dot}");
            }
        }
    }
    Dot { nodes, edges }
}

/// Issue 12: two findings on one allocation shared the note id `a<node>`, so the second hid the
/// first. Every note now has an id of its own, over all traces of the graph.
#[test]
fn dot_keeps_every_finding_on_one_allocation() {
    let d = tempfile::tempdir().unwrap();
    let mut a = TraceBuilder::with_header(header(1, &["a"]));
    three_findings_on_one_allocation(&mut a, A, "stale_fill", "guarded_gemm", 0x1c0);
    a.malloc(A + 8192, 64); // never freed
    a.write(d.path(), "a.trace");
    let mut b = TraceBuilder::with_header(header(2, &["b"]));
    three_findings_on_one_allocation(&mut b, A, "other_fill", "other_gemm", 0x2c0);
    b.write(d.path(), "b.trace");

    for files in [&["a.trace"][..], &["a.trace", "b.trace"][..]] {
        let mut args = vec!["graph", "--format", "dot"];
        args.extend(files);
        let o = isolate(d.path(), &args);
        assert_eq!(o.code, 0, "{}", o.stderr);
        let dot = parse_dot(&o.stdout);
        for (from, to) in &dot.edges {
            assert!(
                dot.nodes.contains_key(from) && dot.nodes.contains_key(to),
                "edge {from} -> {to} joins an undeclared node:\n{}",
                o.stdout
            );
        }
        // The JSON of the same graph: every anomaly but never_freed is a note a<k>, k its
        // index there, pointing at the nodes it names.
        let mut args = vec!["graph", "--format", "json"];
        args.extend(files);
        let j = isolate(d.path(), &args).json();
        let anomalies = j["anomalies"].as_array().unwrap();
        let nodes = j["nodes"].as_array().unwrap();
        let mut notes = 0;
        for (k, an) in anomalies.iter().enumerate() {
            let id = format!("a{k}");
            if an["kind"] == "never_freed" {
                assert!(!dot.nodes.contains_key(&id));
                let n = format!("n{}", an["node"]);
                assert!(dot.nodes[&n].contains("live at end"), "{}", dot.nodes[&n]);
                continue;
            }
            notes += 1;
            let label = &dot.nodes[&id];
            let pointed: BTreeSet<String> = dot
                .edges
                .iter()
                .filter(|e| e.0 == id)
                .map(|e| e.1.clone())
                .collect();
            let named: BTreeSet<String> = an["node"]
                .as_u64()
                .into_iter()
                .map(|n| format!("n{n}"))
                .collect();
            assert_eq!(pointed, named, "{an} as {label}");
            if let Some(kernel) = an["kernel"].as_str() {
                assert!(label.contains(kernel), "{an} as {label}");
            }
        }
        let per_trace = 4; // launch, value, write, launch into nowhere
        assert_eq!(notes, per_trace * files.len(), "{}", o.stdout);
        assert_eq!(dot.nodes.len(), notes + nodes.len(), "{}", o.stdout);

        // The findings of trace a, all on its node 0, and its stale launch into nowhere.
        let on_n0: Vec<&String> = dot
            .edges
            .iter()
            .filter(|e| e.1 == "n0")
            .map(|e| &dot.nodes[&e.0])
            .collect();
        assert_eq!(on_n0.len(), 3, "{on_n0:?}");
        let has = |labels: &[&String], s: &str| labels.iter().any(|l| l.contains(s));
        assert!(has(&on_n0, "stale launch: stale_fill"), "{on_n0:?}");
        assert!(has(&on_n0, "stale value: guarded_gemm"), "{on_n0:?}");
        assert!(
            has(&on_n0, "stale write at offset 448 (0x7f00000001c0)"),
            "{on_n0:?}"
        );
        let all: Vec<&String> = dot.nodes.values().collect();
        assert!(has(&all, "stale launch: stale_fill_nowhere"), "{all:?}");
        if files.len() == 2 {
            assert!(has(&all, "stale launch: other_fill\\nptr"), "{all:?}");
            assert!(has(&all, "stale value: other_gemm"), "{all:?}");
            assert!(has(&all, "stale write at offset 704"), "{all:?}");
            assert!(has(&all, "stale launch: other_fill_nowhere"), "{all:?}");
        }
    }
}

/// The JSON keeps each of those findings with what the DOT shows of it.
#[test]
fn json_keeps_every_finding_on_one_allocation() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    three_findings_on_one_allocation(&mut t, A, "stale_fill", "guarded_gemm", 0x1c0);
    let p = t.write(d.path(), "t.trace");
    let g = graph::graph(&[&p], Filter::default(), &mut NoProgress).unwrap();
    assert_eq!(
        g.anomalies,
        vec![
            Anomaly::StaleLaunch {
                node: Some(0),
                trace: 0,
                seq: 2,
                kernel: "stale_fill".into(),
                ptr: A + 256
            },
            Anomaly::StaleValue {
                node: Some(0),
                trace: 0,
                seq: 3,
                kernel: "guarded_gemm".into(),
                ptr: A + 256
            },
            Anomaly::PoisonViolation {
                node: Some(0),
                trace: 0,
                seq: 4,
                ptr: A,
                first_offset: 0x1c0,
                changed_bytes: 8
            },
            Anomaly::StaleLaunch {
                node: None,
                trace: 0,
                seq: 5,
                kernel: "stale_fill_nowhere".into(),
                ptr: 0x1000
            },
        ]
    );
    let v = isolate(d.path(), &["graph", "--format", "json", "t.trace"]).json();
    assert_eq!(v["anomalies"][1]["kind"], "stale_value");
    assert_eq!(v["anomalies"][2]["first_offset"], 0x1c0);
    // An address filter keeps the findings on the nodes it keeps.
    let f = Filter {
        address: Some(A + 8),
        ..Filter::default()
    };
    let g = graph::graph(&[&p], f, &mut NoProgress).unwrap();
    let kinds: Vec<&str> = g.anomalies.iter().map(|a| a.kind()).collect();
    assert_eq!(kinds, ["stale_launch", "stale_value", "poison_violation"]);
}
