use super::*;

fn header() -> Header {
    Header {
        pid: 42,
        ppid: 1,
        exe: "/usr/bin/python3".into(),
        argv: vec!["python3".into(), "train.py".into()],
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 5_000_000,
        hostname: "h".into(),
        library_version: "0.1.0".into(),
        mode: "log".into(),
        rank: Some(1),
        local_rank: Some(1),
        world_size: Some(2),
        config: vec![("ISOLATE_MODE".into(), "log".into())],
    }
}

fn events() -> Vec<Record> {
    let mut v = Vec::new();
    for i in 0..100u64 {
        v.push(Record::Event(Event {
            seq: i,
            ts_ns: 10_000_000 + i * 1500,
            tid: 1000 + (i % 3) as u32,
            device: 0,
            api: if i % 2 == 0 {
                Api::CudaMalloc
            } else {
                Api::CudaFree
            },
            result: if i == 50 { 2 } else { 0 },
            duration_ns: 900 + i,
            ptr: 0x7f12_3400_0000 + (i / 2) * 0x10_0000,
            size: if i % 2 == 0 { 1 << 20 } else { 0 },
            stream: if i == 7 { 0x5555_1234_5678 } else { 0 },
            ..Event::default()
        }));
    }
    v.push(Record::Note(Note {
        seq: 100,
        ts_ns: 1,
        kind: NoteKind::Info,
        ptr: 0,
        size: 0,
        value: 0,
        text: "hello".into(),
    }));
    v.push(Record::End(End {
        ts_ns: 2,
        reason: EndReason::Exit,
        stats: Stats::default(),
    }));
    v
}

fn encode_all(recs: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::preamble(&header(), &mut out);
    let mut enc = Encoder::new();
    for r in recs {
        enc.encode(r, &mut out);
    }
    out
}

#[test]
fn round_trip() {
    let recs = events();
    let bytes = encode_all(&recs);
    let mut r = Reader::new(&bytes[..], None).unwrap();
    assert_eq!(r.header(), &header());
    let back: Vec<Record> = (&mut r).map(|x| x.unwrap()).collect();
    assert_eq!(back, recs);
    assert_eq!(r.truncated_at(), None);
}

#[test]
fn events_are_small() {
    let recs: Vec<Record> = events().into_iter().take(100).collect();
    let mut hdr = Vec::new();
    Encoder::preamble(&header(), &mut hdr);
    let bytes = encode_all(&recs);
    let per_event = (bytes.len() - hdr.len()) as f64 / 100.0;
    assert!(per_event <= 32.0, "{per_event} bytes per event");
}

#[test]
fn every_truncation_is_reported_not_failed() {
    let recs = events();
    let bytes = encode_all(&recs);
    let mut hdr = Vec::new();
    Encoder::preamble(&header(), &mut hdr);
    for cut in hdr.len()..bytes.len() {
        let mut r = Reader::new(&bytes[..cut], None).unwrap();
        let mut n = 0;
        while let Some(rec) = r.next_record().unwrap() {
            assert_eq!(rec, recs[n]);
            n += 1;
        }
        // Either the cut fell between frames or the reader says where the partial one starts.
        if n < recs.len() {
            assert!(r.truncated_at().is_some() || r.offset() == cut as u64);
        }
    }
    for cut in 0..hdr.len() {
        assert!(Reader::new(&bytes[..cut], None).is_err());
    }
}

#[test]
fn newer_version_refused_with_message() {
    let mut bytes = encode_all(&events());
    bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let e = Reader::new(&bytes[..], Some("x.trace".into()))
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(msg.contains("x.trace") && msg.contains("newer"), "{msg}");
}

#[test]
fn foreign_file_named() {
    let e = Reader::new(
        &b"\x7fELF\x02\x01\x01\x00abcdefgh"[..],
        Some("a.out".into()),
    )
    .err()
    .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("a.out: at byte 0") && msg.contains("not an isolate trace"),
        "{msg}"
    );
}

/// A file of nothing, or of the magic's first bytes only (a disk full as the trace began), is a
/// trace cut short, not a foreign file; both readers say so, with where the file ends.
#[test]
fn a_cut_magic_is_truncated_not_foreign() {
    for n in 0..8 {
        let bytes = &crate::MAGIC[..n];
        let fast = Reader::new(bytes, Some("t.trace".into())).err().unwrap();
        let slow = crate::reference::Reader::new(bytes, Some("t.trace".into()))
            .err()
            .unwrap();
        for e in [fast, slow] {
            let msg = e.to_string();
            assert!(matches!(e.kind, ErrorKind::TruncatedHeader), "{msg}");
            assert_eq!(e.offset, n as u64, "{msg}");
            assert!(msg.starts_with(&format!("t.trace: at byte {n}: ")), "{msg}");
            assert!(msg.contains("truncated"), "{msg}");
            assert!(!msg.contains("not an isolate trace"), "{msg}");
        }
    }
    let e = Reader::new(&b"I"[..], None).err().unwrap();
    assert!(
        e.to_string()
            .contains("ends inside the trace header (truncated")
    );
    // One wrong byte is a foreign file again.
    let e = Reader::new(&b"ISOX"[..], None).err().unwrap();
    assert!(e.to_string().contains("not an isolate trace"), "{e}");
}

#[test]
fn huge_length_does_not_allocate() {
    let mut bytes = Vec::new();
    Encoder::preamble(&header(), &mut bytes);
    let at = bytes.len();
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // 4 GiB - 1
    let mut r = Reader::new(&bytes[..], None).unwrap();
    let e = r.next_record().err().unwrap();
    assert_eq!(e.offset, at as u64);
    assert!(matches!(e.kind, ErrorKind::FrameTooLong { .. }));
}

#[test]
fn bit_flips_never_panic() {
    let bytes = encode_all(&events());
    for i in 0..bytes.len() {
        for bit in [0x01u8, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= bit;
            if let Ok(mut r) = Reader::new(&b[..], None) {
                for _ in 0..10_000 {
                    match r.next_record() {
                        Ok(Some(_)) => {}
                        _ => break,
                    }
                }
            }
        }
    }
}

/// The format document lists every API with the index the trace stores: it must not drift.
#[test]
fn format_document_lists_every_api_at_its_index() {
    let doc = include_str!("../../docs/trace-format.md");
    for (i, api) in Api::ALL.iter().enumerate() {
        let row = format!("| {i} | `{}` |", api.name());
        assert!(
            doc.contains(&row),
            "docs/trace-format.md lacks the row {row}"
        );
    }
}

/// Marks and regions of libisolate.so's C API (`isolate_mark`, `isolate_region_push`/`_pop`)
/// are `Mark`, `RegionPush` and `RegionPop` notes (kinds 11, 12, 13) with the bare name as
/// text, `ptr` = thread id and `value` = region depth: they round-trip. Older libraries wrote
/// them as `Info` notes with a text prefix; those still read back unchanged.
#[test]
fn marks_and_regions_round_trip() {
    let note = |seq, kind, text: &str, depth| {
        Record::Note(Note {
            seq,
            ts_ns: 100 + seq,
            kind,
            ptr: 4242,
            size: 0,
            value: depth,
            text: text.into(),
        })
    };
    let recs = vec![
        note(0, NoteKind::RegionPush, "tests/test_x.py::test_step", 1),
        note(1, NoteKind::Mark, "step 12 — ünïcode", 1),
        note(2, NoteKind::RegionPush, "inner", 2),
        note(3, NoteKind::RegionPop, "inner", 2),
        note(4, NoteKind::RegionPop, "tests/test_x.py::test_step", 1),
        // the older convention
        note(5, NoteKind::Info, "region push: old", 1),
        note(6, NoteKind::Info, "mark: old mark", 1),
        note(7, NoteKind::Info, "region pop: old", 1),
    ];
    let bytes = encode_all(&recs);
    let back: Vec<Record> = Reader::new(&bytes[..], None)
        .unwrap()
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(back, recs);
    let kind_byte = |r: &Record| {
        let mut one = Vec::new();
        Encoder::new().encode(r, &mut one);
        // length, record 4 (Note), seq, ts (one byte each here), kind, ptr 4242 (0xFB + u16)
        assert_eq!(one[1], 4);
        assert_eq!(one[5], 0xFB);
        one[4]
    };
    assert_eq!(kind_byte(&recs[1]), 11);
    assert_eq!(kind_byte(&recs[0]), 12);
    assert_eq!(kind_byte(&recs[3]), 13);
    assert_eq!(kind_byte(&recs[6]), 0);
}

/// Format version 3 added the stacks to `Violation` and `StaleLaunch` as new record variants; a
/// version-2 trace's variants (written here as the version-2 encoder wrote them) still read,
/// with stack ids 0.
#[test]
fn version_2_violations_and_stale_launches_still_read() {
    use crate::wire::{CONFIG, V1StaleLaunch, V1Violation, WireRecord};
    let v1 = V1Violation {
        seq: 5,
        ts_ns: 6,
        device: 0,
        ptr: 0x7f00_0000_0000,
        size: 4096,
        first_offset: 8,
        changed_bytes: 2,
        alloc_seq: 1,
        free_seq: 2,
        free_ts_ns: 3,
        free_api: Api::CudaFree,
    };
    let s1 = V1StaleLaunch {
        seq: 7,
        ts_ns: 8,
        tid: 9,
        device: 0,
        api: Api::CuLaunchKernel,
        kernel: "k".into(),
        param_index: 1,
        param_offset: 8,
        ptr: 0x7f00_0000_0010,
        alloc_ptr: 0x7f00_0000_0000,
        alloc_size: 4096,
        alloc_seq: 1,
        free_seq: 2,
        free_ts_ns: 3,
    };
    let mut bytes = Vec::new();
    Encoder::preamble(&header(), &mut bytes);
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    for w in [
        WireRecord::Violation(v1.clone()),
        WireRecord::StaleLaunch(s1.clone()),
        WireRecord::StaleValue(s1.clone()),
    ] {
        let payload = bincode::encode_to_vec(&w, CONFIG).unwrap();
        bytes.push(payload.len() as u8); // < 128: one LEB128 byte
        bytes.extend_from_slice(&payload);
    }
    let want = [
        Record::Violation(v1.into()),
        Record::StaleLaunch(s1.clone().into()),
        Record::StaleValue(s1.into()),
    ];
    for rec in &want {
        match rec {
            Record::Violation(v) => assert_eq!((v.alloc_stack, v.free_stack), (0, 0)),
            Record::StaleLaunch(s) | Record::StaleValue(s) => {
                assert_eq!((s.alloc_stack, s.free_stack), (0, 0))
            }
            _ => unreachable!(),
        }
    }
    let mut r = Reader::new(&bytes[..], None).unwrap();
    assert_eq!(r.version(), 2);
    let back: Vec<Record> = (&mut r).map(|x| x.unwrap()).collect();
    assert_eq!(back, want);
    let mut r = crate::reference::Reader::new(&bytes[..], None).unwrap();
    let back: Vec<Record> = (&mut r).map(|x| x.unwrap()).collect();
    assert_eq!(back, want);

    // Version 3 (and every later one) writes the stacks, and reads them back.
    let mut v = Violation::from(v1_again());
    (v.alloc_stack, v.free_stack) = (3, 4);
    let bytes = encode_all(&[Record::Violation(v.clone())]);
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        FORMAT_VERSION
    );
    let back: Vec<Record> = Reader::new(&bytes[..], None)
        .unwrap()
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(back, [Record::Violation(v)]);
}

fn v1_again() -> crate::wire::V1Violation {
    crate::wire::V1Violation {
        seq: 1,
        ts_ns: 2,
        device: 0,
        ptr: 3,
        size: 4,
        first_offset: 0,
        changed_bytes: 1,
        alloc_seq: 0,
        free_seq: 1,
        free_ts_ns: 2,
        free_api: Api::CudaFree,
    }
}

/// The example frame of docs/trace-format.md (version 3, `Violation`), byte for byte.
#[test]
fn the_documented_bytes_of_a_version_3_violation() {
    let mut out = Vec::new();
    Encoder::new().encode(
        &Record::Violation(Violation {
            seq: 9,
            ptr: 0x100,
            size: 256,
            changed_bytes: 1,
            alloc_seq: 1,
            free_seq: 2,
            free_api: Api::CudaFree,
            alloc_stack: 3,
            free_stack: 4,
            ..Violation::default()
        }),
        &mut out,
    );
    let hex: Vec<String> = out.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex.join(" "),
        "12 0d 09 00 00 fb 00 01 fb 00 01 00 01 01 02 00 01 03 04"
    );
}

/// Format version 4's record, a free while a use on another stream may still run, reads back
/// as written through both readers; a version-3 trace (no such record) still reads.
#[test]
fn version_4_freed_in_use_round_trips() {
    let f = FreedInUse {
        seq: 9,
        ts_ns: 77,
        tid: 1234,
        device: 0,
        alloc_ptr: 0x7f00_0000_0000,
        alloc_size: 4 << 20,
        alloc_seq: 3,
        alloc_stack: 5,
        free_seq: 9,
        free_api: Api::CudaFreeAsync,
        free_stream: 0x5555_0000_1000,
        free_stack: 6,
        use_name: "mul_kernel".into(),
        use_kernel: true,
        use_stream: 0x5555_0000_2000,
        use_after_seq: 4,
        use_ts_ns: 50,
        use_stack: 7,
        use_tick: 12,
        seen_tick: 0,
    };
    let mut recs = events();
    recs.insert(10, Record::FreedInUse(Box::new(f.clone())));
    let bytes = encode_all(&recs);
    let back: Vec<Record> = Reader::new(&bytes[..], None)
        .unwrap()
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(back, recs);
    assert_eq!(Record::FreedInUse(Box::new(f)).seq(), Some(9));
    let slow: Vec<Record> = crate::reference::Reader::new(&bytes[..], None)
        .unwrap()
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(slow, recs);
    let mut v3 = encode_all(&events());
    v3[8..12].copy_from_slice(&3u32.to_le_bytes());
    let r = Reader::new(&v3[..], None).unwrap();
    assert_eq!(r.version(), 3);
    let back: Vec<Record> = r.map(|x| x.unwrap()).collect();
    assert_eq!(back, events());
}
