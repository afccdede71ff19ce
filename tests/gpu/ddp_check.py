"""Judges the runs `run_ddp.sh` made of `ddp_train.py` under torchrun (see README-ddp.md).

    python3 tests/gpu/ddp_check.py --work WORK --out OUT --nproc N --isolate target/release/isolate

WORK holds one directory per run (`baseline`, `log-cumem1`, `log-cumem0`, `isolate`), each with
`out.txt` (torchrun's stdout and stderr), `rc`, `seconds`, `env` and the run's traces. Prints a
short table and every check; appends the details to `--log`; writes `ddp-report.html`, the
summaries and (when small enough) the traces to OUT. Exit status 0 when every check passed, 1
when one failed.

Needs only Python and the analyzer: the cuMemSetAccess masks are read straight from the traces
with the small decoder below (docs/trace-format.md), since no analyzer command lists them all.

    python3 tests/gpu/ddp_check.py --selftest     # the decoder and the judging, no GPU needed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

# --------------------------------------------------------------------------------------------
# The trace format (docs/trace-format.md): only what the checks need.

API_NAMES = (
    "cudaMalloc cudaFree cudaMallocAsync cudaMallocAsync_ptsz cudaFreeAsync cudaFreeAsync_ptsz "
    "cudaMallocFromPoolAsync cudaMallocFromPoolAsync_ptsz cudaMallocManaged cudaMallocPitch "
    "cudaMalloc3D cudaMallocHost cudaHostAlloc cudaFreeHost cudaHostRegister cudaHostUnregister "
    "cuMemAlloc_v2 cuMemFree_v2 cuMemAllocAsync cuMemAllocAsync_ptsz cuMemFreeAsync "
    "cuMemFreeAsync_ptsz cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync_ptsz cuMemAllocManaged "
    "cuMemAllocPitch_v2 cuMemAllocHost_v2 cuMemHostAlloc cuMemFreeHost cuMemHostRegister_v2 "
    "cuMemHostUnregister cuMemAddressReserve cuMemAddressFree cuMemCreate cuMemRelease cuMemMap "
    "cuMemUnmap cuMemSetAccess cuGraphAddMemAllocNode cuGraphAddMemFreeNode cuLaunchKernel "
    "cuLaunchKernel_ptsz cuLaunchKernelEx cuLaunchKernelEx_ptsz cuLaunchCooperativeKernel "
    "cuLaunchCooperativeKernel_ptsz"
).split()
MAGIC = b"ISOTRACE"
MAX_FRAME = 1 << 20
MASK64 = (1 << 64) - 1


class TraceError(Exception):
    pass


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise TraceError("record ends early")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def uint(self) -> int:
        """bincode 2 standard varint."""
        b = self.byte()
        if b < 251:
            return b
        n = {251: 2, 252: 4, 253: 8, 254: 16}.get(b)
        if n is None:
            raise TraceError(f"bad varint marker {b:#x}")
        if self.pos + n > len(self.data):
            raise TraceError("record ends early")
        v = int.from_bytes(self.data[self.pos : self.pos + n], "little")
        self.pos += n
        return v

    def sint(self) -> int:
        """zigzag, then varint."""
        n = self.uint()
        return (n >> 1) ^ -(n & 1)


def read_events(path: str | Path):
    """Yields every Event record of a trace as a dict (absolute seq, ts_ns, ptr; tid; device;
    api name; result; size; handle; offset; flags). Stops quietly where a trace is cut short."""
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise TraceError(f"{path}: not an isolate trace")
    pos = 12
    first = True
    seq = ts = ptr = 0
    threads: list[int] = []
    while pos < len(data):
        length = shift = 0
        for i in range(5):
            if pos + i >= len(data):
                return  # cut inside the length
            b = data[pos + i]
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        else:
            raise TraceError(f"{path}: at byte {pos}: frame length longer than 5 bytes")
        start = pos + i + 1
        if length == 0 or length > MAX_FRAME:
            raise TraceError(f"{path}: at byte {pos}: bad frame length {length}")
        if start + length > len(data):
            return  # truncated
        payload = data[start : start + length]
        pos = start + length
        if first:  # the header
            first = False
            continue
        c = _Cursor(payload)
        kind = c.uint()
        if kind == 1:  # Thread {index, tid}
            c.uint()
            threads.append(c.uint())
            continue
        if kind != 0:
            continue
        seq = (seq + c.sint()) & MASK64
        ts = (ts + c.sint()) & MASK64
        thread = c.uint()
        device = c.sint()
        api = c.uint()
        result = c.sint()
        c.uint()  # duration_ns
        ptr = (ptr + c.sint()) & MASK64
        size = c.uint()
        pitch = stream = handle = offset = flags = 0
        if c.byte():
            pitch, stream, handle, offset, flags = (c.uint() for _ in range(5))
        yield {
            "seq": seq,
            "ts_ns": ts,
            "tid": threads[thread] if thread < len(threads) else None,
            "device": device,
            "api": API_NAMES[api] if api < len(API_NAMES) else f"api#{api}",
            "result": result,
            "ptr": ptr,
            "size": size,
            "pitch": pitch,
            "stream": stream,
            "handle": handle,
            "offset": offset,
            "flags": flags,
        }


def devices_of(mask: int) -> list[int]:
    return [d for d in range(64) if mask >> d & 1]


def peer_access(path: str | Path, own_device: int | None) -> dict:
    """What the cuMemSetAccess calls of one trace gave access to.

    `handle` of a cuMemSetAccess event is the bit mask of the devices its descriptors named
    (docs/trace-format.md). NCCL gives access one device per call (one descriptor each), so a
    buffer shared with a peer shows as several calls on the same range; one call naming several
    devices counts too. A *peer range* is a range whose calls together name more than one
    device, or any device but the process's own."""
    calls = multi = other = failed = 0
    ranges: dict[tuple[int, int], int] = {}
    for e in read_events(path):
        if e["api"] != "cuMemSetAccess":
            continue
        calls += 1
        if e["result"] != 0:
            failed += 1
            continue
        mask = e["handle"]
        if bin(mask).count("1") > 1:
            multi += 1
        if own_device is not None and mask & ~(1 << own_device):
            other += 1
        key = (e["ptr"], e["size"])
        ranges[key] = ranges.get(key, 0) | mask
    peer = {
        k: m
        for k, m in ranges.items()
        if bin(m).count("1") > 1 or (own_device is not None and m & ~(1 << own_device))
    }
    devs = sorted({d for m in peer.values() for d in devices_of(m)})
    return {
        "set_access_calls": calls,
        "failed_calls": failed,
        "multi_device_calls": multi,
        "calls_naming_another_device": other,
        "ranges": len(ranges),
        "peer_ranges": len(peer),
        "peer_bytes": sum(size for (_, size) in peer),
        "peer_devices": devs,
    }


# --------------------------------------------------------------------------------------------
# Runs and checks.

RUNS = (
    # name, mode (None: no preload), NCCL_CUMEM_ENABLE
    ("baseline", None, None),
    ("log-cumem1", "log", "1"),
    ("log-cumem0", "log", "0"),
    ("isolate", "isolate", "1"),
)
TRACE_RE = re.compile(r"^ddp-(log|isolate)-r(\d+)-(\d+)\.trace(\.\d+)?$")
TRACES_TAR_LIMIT = 14 << 20
PLAIN = ("cudaMalloc", "cuMemAlloc_v2")
VMM = ("cuMemCreate", "cuMemMap", "cuMemSetAccess")


@dataclasses.dataclass
class Run:
    name: str
    mode: str | None
    cumem: str | None
    dir: Path
    rc: int | None = None
    seconds: float | None = None
    out: str = ""
    result: dict | None = None
    rank_results: dict = dataclasses.field(default_factory=dict)
    traces: dict = dataclasses.field(default_factory=dict)  # rank -> [paths]
    stray: list = dataclasses.field(default_factory=list)
    summary: dict | None = None
    by_rank: dict = dataclasses.field(default_factory=dict)  # rank -> summary trace entry
    peers: dict = dataclasses.field(default_factory=dict)  # rank -> peer_access()
    imported: dict = dataclasses.field(default_factory=dict)  # rank -> mappings of foreign handles


class Judge:
    def __init__(self, log_path: Path | None):
        self.checks: list[tuple[str, str, str]] = []
        self.log_file = open(log_path, "a", encoding="utf-8") if log_path else None

    def log(self, text: str) -> None:
        if self.log_file:
            self.log_file.write(text.rstrip("\n") + "\n")
            self.log_file.flush()

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(("PASS" if ok else "FAIL", name, detail))
        self.log(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}")
        return ok

    def info(self, name: str, detail: str) -> None:
        self.checks.append(("INFO", name, detail))
        self.log(f"[INFO] {name}: {detail}")

    def failed(self) -> bool:
        return any(s == "FAIL" for s, _, _ in self.checks)


def tagged_json(text: str, tag: str) -> list[dict]:
    """The JSON of every `TAG {json}` line (torchrun may prefix worker lines: `[rank0]:TAG`)."""
    out = []
    pat = re.compile(r"(?:^|[^A-Za-z0-9_])" + re.escape(tag) + r" (\{.*)$")
    for line in text.splitlines():
        m = pat.search(line)
        if m:
            try:
                out.append(json.loads(m.group(1)))
            except json.JSONDecodeError:
                pass
    return out


def load_run(work: Path, name: str, mode, cumem) -> Run:
    d = work / name
    r = Run(name, mode, cumem, d)
    if (d / "rc").exists():
        r.rc = int((d / "rc").read_text().strip() or "-1")
    if (d / "seconds").exists():
        try:
            r.seconds = float((d / "seconds").read_text().strip())
        except ValueError:
            pass
    if (d / "out.txt").exists():
        r.out = (d / "out.txt").read_text(errors="replace")
    results = tagged_json(r.out, "RESULT")
    r.result = results[-1] if results else None
    for rr in tagged_json(r.out, "RANK_RESULT"):
        r.rank_results[int(rr["rank"])] = rr
    if d.is_dir():
        for f in sorted(d.iterdir()):
            m = TRACE_RE.match(f.name)
            if m and m.group(1) == mode:
                r.traces.setdefault(int(m.group(2)), []).append(f)
            elif ".trace" in f.name:
                r.stray.append(f)
    return r


def cli(isolate: str, args: list[str], timeout: float = 300) -> tuple[int, str, str]:
    try:
        p = subprocess.run(
            [isolate, *args], capture_output=True, text=True, errors="replace", timeout=timeout
        )
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout}s"
    except OSError as e:
        return 127, "", str(e)


def close(a: float, b: float, rtol: float) -> bool:
    return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))


def judge_run(j: Judge, r: Run, nproc: int, isolate: str, out: Path, work: Path) -> None:
    tag = r.name
    ok = r.rc == 0
    j.check(f"{tag}: torchrun exit status", ok, f"rc={r.rc}, {r.seconds or 0:.1f}s")
    if r.result is None:
        j.check(f"{tag}: rank 0 printed RESULT", False, "no RESULT line")
    else:
        j.check(
            f"{tag}: world size",
            r.result.get("world_size") == nproc,
            f"{r.result.get('world_size')} (asked for {nproc})",
        )
    j.check(
        f"{tag}: every rank printed RANK_RESULT",
        sorted(r.rank_results) == list(range(nproc)),
        f"ranks {sorted(r.rank_results)}",
    )
    if r.mode is None:
        return

    # Every trace file first: a process that made no CUDA call must leave none
    # (configuration.md), so a trace without a single event and without RANK in its header
    # (the launcher, a shell, a pyenv shim) is reported and then left out of the rank checks.
    every = [p for k in sorted(r.traces) for p in r.traces[k]]
    if every:
        rc, so, se = cli(isolate, ["summary", "--json", *map(str, every)])
        try:
            entries = json.loads(so).get("traces") or []
        except json.JSONDecodeError:
            entries = []
        empty = {
            e["file"]: e
            for e in entries
            if not e.get("events") and (e.get("header") or {}).get("rank") is None
        }
        what = [
            f"{f} (pid {e['header'].get('pid')}, {e['header'].get('exe')}, notes {e.get('notes')})"
            for f, e in sorted(empty.items())
        ]
        j.check(
            f"{tag}: no trace from processes that made no CUDA call",
            not empty,
            f"{len(empty)} empty trace(s): {'; '.join(what[:6])}{' …' if len(what) > 6 else ''}"
            if empty
            else f"{len(every)} files, all with events",
        )
        for k in list(r.traces):
            r.traces[k] = [p for p in r.traces[k] if p.name not in empty]
            if not r.traces[k]:
                del r.traces[k]

    # One trace per rank, and nothing else.
    counts = {k: len(v) for k, v in sorted(r.traces.items())}
    want = {k: 1 for k in range(nproc)}
    detail = ", ".join(f"r{k}: {n}" for k, n in counts.items()) or "no trace"
    if r.stray:
        detail += f"; other files: {[p.name for p in r.stray]}"
    j.check(f"{tag}: one trace per rank", counts == want and not r.stray, detail)
    for rank, paths in r.traces.items():
        rr = r.rank_results.get(rank)
        if rr and len(paths) == 1:
            pid = int(TRACE_RE.match(paths[0].name).group(3))
            j.check(
                f"{tag}: rank {rank}'s trace is its worker's",
                pid == rr.get("pid"),
                f"file pid {pid}, worker pid {rr.get('pid')}",
            )
    paths = [p for k in sorted(r.traces) for p in r.traces[k]]
    if not paths:
        return

    # summary --json over every rank.
    rc, so, se = cli(isolate, ["summary", "--json", *map(str, paths)])
    j.log(f"$ isolate summary --json {' '.join(p.name for p in paths)}  -> rc {rc}\n{se.strip()}")
    try:
        r.summary = json.loads(so)
    except json.JSONDecodeError:
        r.summary = None
    j.check(
        f"{tag}: isolate summary --json",
        rc == 0 and r.summary is not None,
        f"rc={rc} {se.strip()[:300]}",
    )
    if r.summary is None:
        return
    (out / f"ddp-summary-{tag}.json").write_text(json.dumps(r.summary, indent=1, sort_keys=True))
    entries = r.summary.get("traces") or []
    ranks = [(e.get("header") or {}).get("rank") for e in entries]
    j.check(
        f"{tag}: summary has one entry per rank, distinct header.rank",
        len(entries) == nproc and sorted(x for x in ranks if x is not None) == list(range(nproc)),
        f"{len(entries)} entries, header.rank {ranks}",
    )
    worlds = {(e.get("header") or {}).get("world_size") for e in entries}
    j.check(f"{tag}: header.world_size", worlds == {nproc}, f"{sorted(worlds, key=str)}")
    incomplete = [e.get("file") for e in entries if not e.get("complete")]
    j.check(
        f"{tag}: every trace complete (End record)", not incomplete, f"incomplete: {incomplete}"
    )
    for e in entries:
        h = e.get("header") or {}
        if h.get("rank") is not None:
            r.by_rank[int(h["rank"])] = e
    # Totals are the sums (the analyzer's own promise; cheap to hold it to it here).
    for key in ("events", "allocations", "frees"):
        s = sum(int(e.get(key) or 0) for e in entries)
        got = r.summary.get(key)
        j.check(f"{tag}: totals.{key} = sum over ranks", got == s, f"{got} vs {s}")

    for rank, e in sorted(r.by_rank.items()):
        calls = e.get("calls") or {}
        j.log(f"{tag} rank {rank} calls: {json.dumps(calls, sort_keys=True)}")
        own = (e.get("header") or {}).get("local_rank")
        devs = e.get("devices") or {}
        if own is not None and devs:
            top = max(devs, key=lambda d: devs[d].get("peak_live_bytes", 0))
            j.check(
                f"{tag}: rank {rank}'s memory is on its own device {own}",
                top == str(own),
                f"devices {json.dumps({d: v.get('peak_live_bytes') for d, v in devs.items()})}",
            )
        if r.cumem == "1":
            missing = [a for a in VMM if not calls.get(a)]
            j.check(
                f"{tag}: rank {rank} has {'/'.join(VMM)} (NCCL_CUMEM_ENABLE=1)",
                not missing,
                ", ".join(f"{a} {calls.get(a, 0)}" for a in VMM),
            )
        inv = e.get("invalid_frees") or []
        if inv:
            kinds: dict[str, int] = {}
            for f in inv:
                k = f"{f.get('kind')} {f.get('api')}"
                kinds[k] = kinds.get(k, 0) + 1
            j.info(
                f"{tag}: rank {rank} invalid frees",
                f"{e.get('invalid_free_count')} ({kinds}); a cuMemRelease of a handle NCCL "
                "imported from a peer (cuMemImportFromShareableHandle is not intercepted) shows "
                "as a release of an unknown handle",
            )
        try:
            r.peers[rank] = peer_access(r.traces[rank][0], own)
        except (TraceError, OSError, KeyError, IndexError) as err:
            r.peers[rank] = None
            j.check(f"{tag}: rank {rank} trace decodes", False, str(err))
        if r.peers.get(rank) is not None:
            j.log(f"{tag} rank {rank} cuMemSetAccess: {json.dumps(r.peers[rank])}")

    if r.cumem == "1":
        p = {k: v for k, v in r.peers.items() if v}
        detail = "; ".join(
            f"r{k}: {v['peer_ranges']} peer ranges ({v['peer_bytes'] >> 20} MiB, devices "
            f"{v['peer_devices']}), {v['multi_device_calls']} multi-device calls, "
            f"{v['calls_naming_another_device']} calls naming another device"
            for k, v in sorted(p.items())
        )
        if nproc >= 2:
            j.check(
                f"{tag}: peer mappings (cuMemSetAccess naming a peer device)",
                any(v["peer_ranges"] for v in p.values()),
                detail,
            )
        else:
            j.info(f"{tag}: peer mappings (one rank: none expected)", detail)

    # graph --format json: ids unique, edges inside one trace.
    gpath = work / f"graph-{tag}.json"
    rc, so, se = cli(isolate, ["graph", "--format", "json", *map(str, paths), "-o", str(gpath)])
    j.log(f"$ isolate graph --format json … -o {gpath.name}  -> rc {rc} {se.strip()}")
    g = None
    if rc == 0:
        try:
            g = json.loads(gpath.read_text())
        except (OSError, json.JSONDecodeError) as err:
            se = str(err)
    j.check(f"{tag}: isolate graph --format json", g is not None, f"rc={rc} {se.strip()[:300]}")
    if g is not None:
        nodes = g.get("nodes") or []
        trace_of = {}
        dup = 0
        for n in nodes:
            if n["id"] in trace_of:
                dup += 1
            trace_of[n["id"]] = n["trace"]
        cross = [
            e for e in g.get("edges") or [] if trace_of.get(e["from"]) != trace_of.get(e["to"])
        ]
        gtr = [t.get("rank") for t in g.get("traces") or []]
        j.check(
            f"{tag}: graph node ids unique, edges never join two ranks",
            not dup and not cross and sorted(x for x in gtr if x is not None) == list(range(nproc)),
            f"{len(nodes)} nodes, {len(g.get('edges') or [])} edges, {dup} duplicate ids, "
            f"{len(cross)} cross-trace edges, ranks {gtr}",
        )
        # Mappings of a handle this process never created: imported from a peer.
        rank_of_trace = {t["index"]: t.get("rank") for t in g.get("traces") or []}
        for n in nodes:
            if n.get("category") == "mapping" and n.get("handle_node") is None:
                rk = rank_of_trace.get(n["trace"])
                r.imported[rk] = r.imported.get(rk, 0) + 1
        anomalies: dict[str, int] = {}
        for a in g.get("anomalies") or []:
            anomalies[a["kind"]] = anomalies.get(a["kind"], 0) + 1
        j.info(
            f"{tag}: graph",
            f"anomalies {anomalies}; mappings of handles not created in that process "
            f"(imported peer buffers) by rank {dict(sorted(r.imported.items(), key=str))}",
        )
        try:
            gpath.unlink()  # can be large; the summary and the traces carry what is needed
        except OSError:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--nproc", type=int)
    ap.add_argument("--isolate", default="target/release/isolate")
    ap.add_argument("--log", type=Path)
    ap.add_argument("--rtol", type=float, default=float(os.environ.get("DDP_LOSS_RTOL", "1e-6")))
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    if not (a.work and a.out and a.nproc):
        ap.error("--work, --out and --nproc are needed")
    a.out.mkdir(parents=True, exist_ok=True)
    j = Judge(a.log)
    runs = {name: load_run(a.work, name, mode, cumem) for name, mode, cumem in RUNS}
    for r in runs.values():
        j.log(
            f"\n===== judging {r.name} (mode {r.mode or 'none'}, "
            f"NCCL_CUMEM_ENABLE={r.cumem or 'unset'})"
        )
        judge_run(j, r, a.nproc, a.isolate, a.out, a.work)

    # NCCL's own buffers: cuMemCreate with NCCL_CUMEM_ENABLE=1, plain allocations with it off.
    on, off = runs["log-cumem1"], runs["log-cumem0"]
    for rank in range(a.nproc):
        c1 = (on.by_rank.get(rank) or {}).get("calls") or {}
        c0 = (off.by_rank.get(rank) or {}).get("calls") or {}
        if not c1 or not c0:
            continue
        p1, p0 = sum(c1.get(x, 0) for x in PLAIN), sum(c0.get(x, 0) for x in PLAIN)
        torch1 = (on.rank_results.get(rank) or {}).get("num_device_alloc")
        torch0 = (off.rank_results.get(rank) or {}).get("num_device_alloc")
        j.check(
            f"NCCL_CUMEM_ENABLE=0: rank {rank}'s NCCL buffers come from cudaMalloc, "
            "not cuMemCreate",
            c0.get("cuMemCreate", 0) < c1.get("cuMemCreate", 0) and p0 > p1,
            f"cuMemCreate {c1.get('cuMemCreate', 0)} -> {c0.get('cuMemCreate', 0)}; "
            f"cudaMalloc+cuMemAlloc_v2 {p1} -> {p0} (PyTorch's own cudaMalloc segments "
            f"{torch1} -> {torch0}; NCCL's statically linked runtime may show as cuMemAlloc_v2)",
        )

    # Losses: the preload must not change a single number.
    base = runs["baseline"].result
    for name in ("log-cumem1", "log-cumem0", "isolate"):
        got = runs[name].result
        if not base or not got:
            j.check(f"{name}: losses equal the baseline's", False, "a RESULT is missing")
            continue
        same_steps = base.get("loss_steps") == got.get("loss_steps")
        bl, gl = base.get("losses") or [], got.get("losses") or []
        diffs = [abs(x - y) for x, y in zip(bl, gl)]
        ok = same_steps and len(bl) == len(gl) and all(close(x, y, a.rtol) for x, y in zip(bl, gl))
        if bl == gl:
            how = "bitwise equal"
        elif not diffs or len(bl) != len(gl) or not same_steps:
            how = f"steps {got.get('loss_steps')} vs {base.get('loss_steps')}"
        else:
            how = f"max |diff| {max(diffs):.3g} (rtol {a.rtol:g})"
        j.check(
            f"{name}: losses equal the baseline's",
            ok,
            f"final {gl[-1] if gl else None} vs {bl[-1] if bl else None}; {how}",
        )

    iso = runs["isolate"]
    if iso.summary is not None:
        for rank, e in sorted(iso.by_rank.items()):
            j.check(
                f"isolate: rank {rank} no poison violations",
                e.get("poison_violation_count", 0) == 0,
                f"{e.get('poison_violation_count')} violations "
                f"{json.dumps((e.get('poison_violations') or [])[:3])}",
            )
            sl = e.get("stale_launches") or []
            j.info(
                f"isolate: rank {rank} stale launches",
                f"{e.get('stale_launch_count', 0)} "
                f"{sorted({s.get('kernel', '')[:80] for s in sl})[:5]}",
            )
            q = e.get("quarantine") or {}
            j.info(f"isolate: rank {rank} quarantine", json.dumps(q, sort_keys=True))

    # isolate check: isolate rank 0 against log rank 0 (reported, not judged).
    b0, n0 = on.traces.get(0), iso.traces.get(0)
    if b0 and n0:
        rc, so, se = cli(a.isolate, ["check", str(n0[0]), "--baseline", str(b0[0])])
        reasons = "; ".join(x for x in so.splitlines() if x.strip()) or se.strip() or "-"
        j.info("isolate check (isolate r0 vs log-cumem1 r0)", f"exit {rc}: {reasons}")

    # The report over every rank of the isolate run.
    if iso.traces:
        paths = [str(p) for k in sorted(iso.traces) for p in iso.traces[k]]
        html = a.out / "ddp-report.html"
        rc, so, se = cli(a.isolate, ["report", *paths, "-o", str(html)])
        size = html.stat().st_size if html.exists() else 0
        text = html.read_text(errors="replace") if size else ""
        named = all(f'"rank":{k}' in text for k in range(a.nproc))
        j.check(
            "isolate report over every rank -> ddp-report.html",
            rc == 0 and size > 0 and named,
            f"rc={rc}, {size} bytes, every rank named in its data: {named} {se.strip()[:200]}",
        )

    # The traces, if small enough to bring back.
    all_traces = [p for r in runs.values() for v in r.traces.values() for p in v]
    total = sum(p.stat().st_size for p in all_traces)
    if all_traces and total <= TRACES_TAR_LIMIT:
        with tarfile.open(a.out / "ddp-traces.tar.gz", "w:gz") as tar:
            for p in all_traces:
                tar.add(p, arcname=f"{p.parent.name}/{p.name}")
        j.info("traces", f"{len(all_traces)} files, {total >> 10} KiB -> ddp-traces.tar.gz")
    elif all_traces:
        j.info("traces", f"{len(all_traces)} files, {total >> 20} MiB: too large to keep")

    print(table(runs, a.nproc))
    print()
    for status, name, detail in j.checks:
        if status != "PASS" or os.environ.get("DDP_VERBOSE"):
            print(f"[{status}] {name}: {detail}")
    n_pass = sum(s == "PASS" for s, _, _ in j.checks)
    n_fail = sum(s == "FAIL" for s, _, _ in j.checks)
    line = f"ddp checks: {n_pass} passed, {n_fail} failed"
    print(line)
    j.log("\n" + table(runs, a.nproc) + "\n" + line)
    return 1 if j.failed() else 0


def table(runs: dict, nproc: int) -> str:
    head = ["run", "rank", "rc", "s", "cudaMalloc", "cuMemAlloc", "cuMemCreate", "cuMemMap",
            "SetAccess", "peer rng", "imported", "viol", "final loss", "ms/step"]
    rows = []
    for r in runs.values():
        for rank in range(nproc):
            e = r.by_rank.get(rank) or {}
            c = e.get("calls") or {}
            p = r.peers.get(rank) or {}
            rr = r.rank_results.get(rank) or {}
            traced = r.mode is not None

            def n(k):
                return str(c.get(k, 0)) if traced else "-"

            rows.append([
                r.name if rank == 0 else "",
                str(rank),
                str(r.rc) if rank == 0 else "",
                f"{r.seconds:.0f}" if rank == 0 and r.seconds is not None else "",
                n("cudaMalloc"), n("cuMemAlloc_v2"), n("cuMemCreate"), n("cuMemMap"),
                n("cuMemSetAccess"),
                str(p.get("peer_ranges", "-")) if traced else "-",
                str(r.imported.get(rank, 0)) if traced else "-",
                str(e.get("poison_violation_count", "-")) if traced else "-",
                f"{rr['final_loss']:.6g}" if "final_loss" in rr else "-",
                f"{rr['ms_per_step']:.2f}" if "ms_per_step" in rr else "-",
            ])
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*row) for row in rows)])


# --------------------------------------------------------------------------------------------
# Self-test: the decoder on a trace written by hand with the same encoding.


def _uint(v: int) -> bytes:
    if v < 251:
        return bytes([v])
    for marker, n in ((251, 2), (252, 4), (253, 8)):
        if v < 1 << (8 * n):
            return bytes([marker]) + v.to_bytes(n, "little")
    raise ValueError(v)


def _sint(v: int) -> bytes:
    return _uint(((v << 1) ^ (v >> 63)) & MASK64)


def _frame(payload: bytes) -> bytes:
    n, out = len(payload), bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out) + payload


def _event(
    prev: dict, seq, ts, thread, device, api, ptr, size, handle=0, offset=0, result=0
) -> bytes:
    p = _uint(0) + _sint(seq - prev["seq"]) + _sint(ts - prev["ts"]) + _uint(thread)
    p += _sint(device) + _uint(API_NAMES.index(api)) + _sint(result) + _uint(7)
    p += _sint(ptr - prev["ptr"]) + _uint(size)
    if handle or offset:
        p += b"\x01" + b"".join(_uint(x) for x in (0, 0, handle, offset, 0))
    else:
        p += b"\x00"
    prev.update(seq=seq, ts=ts, ptr=ptr)
    return _frame(p)


def selftest() -> int:
    import tempfile

    hdr = _frame(b"\x05" * 40)  # the header is skipped unread
    prev = {"seq": 0, "ts": 0, "ptr": 0}
    r = 0x7F00_0000_0000
    body = _frame(_uint(1) + _uint(0) + _uint(4242))  # Thread 0 = tid 4242
    body += _event(prev, 0, 10**9, 0, 1, "cuMemAddressReserve", r, 1 << 26, 0, 1 << 21)
    body += _event(prev, 1, 10**9 + 5, 0, 1, "cuMemCreate", 0, 1 << 21, 0x11)
    body += _event(prev, 2, 10**9 + 9, 0, 1, "cuMemMap", r, 1 << 21, 0x11)
    # NCCL's way: one call per device on the same range.
    body += _event(prev, 3, 10**9 + 12, 0, 1, "cuMemSetAccess", r, 1 << 21, 0b10, 1)
    body += _event(prev, 4, 10**9 + 13, 0, 1, "cuMemSetAccess", r, 1 << 21, 0b01, 1)
    # A buffer only for itself, and one multi-descriptor call.
    body += _event(prev, 5, 10**9 + 20, 0, 1, "cuMemSetAccess", r + (1 << 21), 1 << 21, 0b10, 1)
    body += _event(prev, 6, 10**9 + 30, 0, 1, "cuMemSetAccess", r + (2 << 21), 1 << 21, 0b11, 2)
    body += _event(prev, 7, 10**9 + 31, 0, 1, "cuMemSetAccess", 0, 0, 0b1, 1, result=1)
    body += _event(prev, 8, 10**9 + 40, 0, 1, "cudaMalloc", 0x7E00_0000_0000, 300)
    data = MAGIC + (1).to_bytes(4, "little") + hdr + body
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.trace"
        p.write_bytes(data)
        ev = list(read_events(p))
        assert [e["api"] for e in ev][:3] == ["cuMemAddressReserve", "cuMemCreate", "cuMemMap"], ev
        assert ev[0]["offset"] == 1 << 21 and ev[1]["handle"] == 0x11 and ev[2]["ptr"] == r
        assert ev[-1]["ptr"] == 0x7E00_0000_0000 and ev[-1]["size"] == 300 and ev[-1]["tid"] == 4242
        assert all(e["device"] == 1 for e in ev) and ev[-1]["ts_ns"] == 10**9 + 40
        got = peer_access(p, own_device=1)
        want = {
            "set_access_calls": 5,
            "failed_calls": 1,
            "multi_device_calls": 1,
            "calls_naming_another_device": 2,
            "ranges": 3,
            "peer_ranges": 2,
            "peer_bytes": 2 << 21,
            "peer_devices": [0, 1],
        }
        assert got == want, got
        # Cut anywhere: never an exception, a prefix of the events.
        for cut in range(12, len(data)):
            p.write_bytes(data[:cut])
            assert len(list(read_events(p))) <= len(ev)
    print("ddp_check selftest: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
