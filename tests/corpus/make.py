#!/usr/bin/env python3
"""Regenerates the damaged traces of tests/corpus/ from intact ones (deterministic).

    python3 tests/corpus/make.py            (from the repository root)

Sources: a few of tests/traces/h200/*.trace (recorded on an H200) and the stand-in traces
tests/corpus/standin-*.bin (recorded with the stand-in CUDA of tests/standin/; see README.md
for how). Every damaged file is named SOURCE.DAMAGE.bin; the list with what each exercises is
printed as a Markdown table for README.md.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "corpus")
H200 = os.path.join(ROOT, "tests", "traces", "h200")


def frames(b):
    """(start, prefix_len, payload_len) of every frame after the 12-byte preamble."""
    out, at = [], 12
    while at < len(b):
        n, shift, i = 0, 0, at
        while True:
            if i >= len(b):
                return out
            x = b[i]
            i += 1
            n |= (x & 0x7F) << shift
            if not x & 0x80:
                break
            shift += 7
        if i + n > len(b):
            return out
        out.append((at, i - at, n))
        at = i + n
    return out


def first_record_of_kind(b, fr, kind):
    """The first record frame (not the header) whose variant byte is `kind`."""
    for start, pre, n in fr[1:]:
        if b[start + pre] == kind:
            return start, pre, n
    return None


made = []


def emit(name, data, what):
    with open(os.path.join(CORPUS, name), "wb") as f:
        f.write(bytes(data))
    made.append((name, len(data), what))


def damage(label, b, kinds):
    """Writes the damaged copies of `b` named in `kinds`."""
    fr = frames(b)
    hdr_start, hdr_pre, hdr_len = fr[0]
    body = fr[1:]
    mid = body[len(body) // 2]
    last = body[-1]
    payload = mid[0] + mid[1]
    for kind in kinds:
        x = bytearray(b)
        if kind == "cut-in-magic":
            x, what = b[:5], "ends inside the magic"
        elif kind == "cut-in-header":
            x, what = b[: hdr_start + hdr_pre + hdr_len // 2], "ends inside the header frame"
        elif kind == "cut-mid-frame":
            x, what = b[: payload + max(1, mid[2] // 2)], "ends inside a record frame (truncated)"
        elif kind == "cut-in-prefix":
            x, what = b[: mid[0]] + b"\x85", "ends inside a frame's length prefix (a continuation byte)"
        elif kind == "no-end":
            x, what = b[: last[0]], "cut at the frame boundary before End: no End record, not truncated"
        elif kind == "flip-magic":
            x[0] ^= 0x20
            what = "magic changed: not a trace"
        elif kind == "newer-version":
            # Far above any version a reader knows (a reader of version 2, then 3, ...).
            x[8] = 0xFF
            what = "format version 255: newer than the reader"
        elif kind == "bad-variant":
            x[payload] = 0x09
            what = "a record's variant changed to 9 (Module, of version 2), which its bytes are not: undecodable"
        elif kind == "huge-length":
            x[mid[0] : payload] = b"\xff\xff\xff\xff\x0f"
            what = "a frame length of 4 GiB - 1"
        elif kind == "flip-payload":
            x[payload + mid[2] // 2] ^= 0x80
            what = "one bit flipped in the middle of a record"
        elif kind == "thread-out-of-order":
            th = first_record_of_kind(b, fr, 1)  # the first Thread record
            x[th[0] + th[1] + 1] = 7  # its index
            what = "the first Thread record says index 7 (out of order)"
        else:
            raise ValueError(kind)
        emit(f"{label}.{kind}.bin", x, what)


def main():
    sources = []
    for name in ["stale_isolate.trace", "mlp-log_expandable.trace"]:
        with open(os.path.join(H200, name), "rb") as f:
            sources.append(("h200-" + name[: -len(".trace")], f.read()))
    for name in ["standin-launch.bin", "standin-threads-2-40.bin"]:
        with open(os.path.join(CORPUS, name), "rb") as f:
            sources.append((name[: -len(".bin")], f.read()))
    plan = {
        "h200-stale_isolate": ["cut-mid-frame", "huge-length", "flip-payload", "newer-version", "no-end"],
        "h200-mlp-log_expandable": ["cut-in-header", "cut-in-prefix", "bad-variant", "flip-payload"],
        "standin-launch": ["cut-mid-frame", "flip-payload", "bad-variant", "thread-out-of-order"],
        "standin-threads-2-40": ["cut-mid-frame", "huge-length", "no-end", "flip-magic", "cut-in-magic"],
    }
    for label, b in sources:
        damage(label, b, plan[label])
    # A few that are not derived from one trace.
    emit("empty.bin", b"", "an empty file")
    emit("elf.bin", b"\x7fELF\x02\x01\x01\x00" + bytes(56), "an ELF header, not a trace")
    emit("version-zero.bin", b"ISOTRACE\x00\x00\x00\x00", "format version 0 (does not exist)")
    # Header of one trace, records of another: deltas and thread table start fresh.
    a, c = sources[0][1], sources[2][1]
    fa, fc = frames(a), frames(c)
    emit("splice-h200-header-standin-records.bin", a[: fa[1][0]] + c[fc[1][0] :], "the header of one trace, the records of another")
    print("| file | bytes | what |")
    print("|---|---:|---|")
    for name, n, what in made:
        print(f"| `{name}` | {n} | {what} |")


if __name__ == "__main__":
    sys.exit(main())
