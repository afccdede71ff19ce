#!/usr/bin/env python3
"""Tables from the results of tests/gpu/torch_tests.py: counts per configuration and per outcome
triple, the tests whose outcome differs between configurations (with the re-runs alone and a
verdict), the tests where isolate mode differs from the stream-ordered backend alone, isolate
mode's findings, and the whole per-test table, as text (what the runner prints) or Markdown (for
docs/reliability.md).

    python3 tests/gpu/torch_tests_table.py RESULTS_DIR [RESULTS_DIR ...] [--text] [--no-full] [--logs LOGS ...]

RESULTS_DIR is a folder holding `<config>.jsonl` files, `confirm.jsonl` and `meta.json` (what
the runner writes under `$OUT/results`); several folders (one per shard, `--shard 1/2` and
`--shard 2/2`) are merged, a later record of the same test and configuration replacing an
earlier one.

`--logs` (optional, once per RESULTS_DIR, in the same order): that run's `logs.tar.gz` (or a
folder of its worker logs). The findings are then read from the logs, whole lines, those printed
between two tests or at a worker's exit included; without it they come from the records, which
hold the lines printed while each test ran.

Findings are attributed to the test that allocated the memory when the line names
`allocated at <test file>:LINE` (the line is mapped to the test function that holds it, and to the
last test of that function run in the same worker), else to the test during which the line was
printed ("printed during"). The test file is the one named in meta.json (`module`), else
tests/gpu/ext/<name> beside this script; without it, lines are not mapped and upstream gates
(`TEST_CUDAMALLOCASYNC`) are not shown.
"""

import argparse
import ast
import glob
import json
import os
import re
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))

OUTCOMES = ["pass", "fail", "error", "skip", "crash", "timeout"]
BAD = ("fail", "error", "crash", "timeout")
NOT_RUN = "not run"
DEFAULT_CONFIGS = ["plain", "async", "isolate"]
CONFIG_TITLES = {
    "plain": "plain",
    "async": "stream-ordered backend",
    "isolate": "isolate",
}

# Verdicts (verdict()); the ones that leave a difference of isolate's own to look at.
V_BACKEND_FAILS = "stream-ordered backend: the backend alone fails it too"
V_BACKEND_SAME = "stream-ordered backend: the backend alone does the same"
V_BACKEND_SKIPS = "skipped under the stream-ordered backend (upstream gate)"
V_DEPENDS = "depends on earlier tests in the worker (isolate alone passes)"
V_DEPENDS_OTHER = "depends on earlier tests in the worker (isolate alone matches plain)"
V_ADDS = "ISOLATE ADDS THIS (ours to fix)"
V_UNCONFIRMED = "isolate differs from the backend; not confirmed (no re-run alone)"
V_NO_BACKEND_ALONE = "isolate alone differs; backend alone not re-run"
V_RACE_NAMED = ("the test's own use-after-free across streams, named by isolate mode (FREED IN USE); "
                "its reads of the freed memory then read poison")
ISOLATE_VERDICTS = (V_ADDS, V_DEPENDS, V_DEPENDS_OTHER, V_UNCONFIRMED, V_NO_BACKEND_ALONE)

def load(dirs):
    """(main, confirm, meta): main[config][id] = record, confirm[id][config] = record,
    meta = {"ids": [...], "configs": [...], "uncollected": [...], "shimmed": [...], ...}.

    Every record gets `_src` (the index of its folder in `dirs`) and `_n` (its place in the
    order the records were read), which tell which worker ran what before what."""
    main, confirm = {}, {}
    meta = {"ids": [], "configs": [], "uncollected": [], "shimmed": [], "not_run": {},
            "shimmed_by_config": {}, "after_last_test": [], "metas": []}
    seen_ids = set()
    order = 0
    for src, d in enumerate(dirs):
        mpath = os.path.join(d, "meta.json")
        m = {}
        if os.path.exists(mpath):
            with open(mpath, encoding="utf-8") as f:
                m = json.load(f)
            for tid in m.get("ids", []):
                if tid not in seen_ids:
                    seen_ids.add(tid)
                    meta["ids"].append(tid)
            for c in m.get("configs", []):
                if c not in meta["configs"]:
                    meta["configs"].append(c)
            for key in ("uncollected", "shimmed"):
                for item in m.get(key, []):
                    if item not in meta[key]:
                        meta[key].append(item)
            for c, items in (m.get("shimmed_by_config") or {}).items():
                have = meta["shimmed_by_config"].setdefault(c, [])
                have += [i for i in items if i not in have]
            for item in m.get("after_last_test", []) or []:
                meta["after_last_test"].append(dict(item, _src=src))
            for k, v in m.items():
                if k not in meta:
                    meta[k] = v
        meta["metas"].append(m)
        for path in sorted(glob.glob(os.path.join(d, "*.jsonl"))):
            name = os.path.basename(path)[: -len(".jsonl")]
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        print(f"{path}:{n}: not JSON ({e}); line skipped", file=sys.stderr)
                        continue
                    order += 1
                    rec["_src"] = src
                    rec["_n"] = order
                    if name == "confirm":
                        confirm.setdefault(rec["id"], {})[rec["config"]] = rec
                    else:
                        main.setdefault(name, {})[rec["id"]] = rec
                        if rec["id"] not in seen_ids:
                            seen_ids.add(rec["id"])
                            meta["ids"].append(rec["id"])
    for c in main:
        if c not in meta["configs"]:
            meta["configs"].append(c)
    if not meta["configs"]:
        meta["configs"] = list(DEFAULT_CONFIGS)
    return main, confirm, meta


# ---------------------------------------------------------------------------------------
# The test file: which function holds a line, which tests are gated on TEST_CUDAMALLOCASYNC.


def find_module(meta):
    """The test file the results came from, if it is here: meta's `module`, else
    tests/gpu/ext/<its name> beside this script, else tests/gpu/ext/test_cuda.py."""
    cands = []
    for m in [meta] + meta.get("metas", []):
        if m.get("module"):
            cands += [m["module"], os.path.join(HERE, "ext", os.path.basename(m["module"]))]
    if not cands:  # results from before meta.json named the file
        cands.append(os.path.join(HERE, "ext", "test_cuda.py"))
    for c in cands:
        if os.path.isfile(c):
            return c
    return None


class Source:
    """The test file's functions by line, and its upstream gates on TEST_CUDAMALLOCASYNC."""

    GATE_NAME = "TEST_CUDAMALLOCASYNC"

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        self.spans = []  # (start, end, class or "", function)
        self.tests = {}  # class -> set of test function names
        self.gates = {}  # (class, function) -> "skipIf" | "in the test"
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.spans.append((self._start(node), node.end_lineno, "", node.name))
            if not isinstance(node, ast.ClassDef):
                continue
            class_gate = any(self._refs(d) for d in node.decorator_list)
            names = self.tests.setdefault(node.name, set())
            for item in node.body:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                self.spans.append((self._start(item), item.end_lineno, node.name, item.name))
                if not item.name.startswith("test"):
                    continue
                names.add(item.name)
                if class_gate or any(self._refs(d) for d in item.decorator_list):
                    self.gates[(node.name, item.name)] = "skipIf"
                elif any(self._refs(b) for b in item.body):
                    self.gates[(node.name, item.name)] = "in the test"

    @staticmethod
    def _start(node):
        return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])

    @classmethod
    def _refs(cls, node):
        return any(isinstance(n, ast.Name) and n.id == cls.GATE_NAME for n in ast.walk(node))

    def function_at(self, line):
        """(class, function) of the innermost class method or module function holding `line`."""
        best = None
        for start, end, cls, fn in self.spans:
            if start <= line <= end and (best is None or end - start < best[1] - best[0]):
                best = (start, end, cls, fn)
        return (best[2], best[3]) if best else (None, None)

    def function_of(self, tid):
        """(class, function) of the source definition a (possibly instantiated) test id comes
        from: `TestCudaOptimsCUDA.test_x_foreach_False_cuda_float32` -> (TestCudaOptims, test_x)."""
        cls, _, meth = tid.partition(".")
        cands = [c for c in self.tests if cls == c or cls.startswith(c)]
        if not cands:
            return None, None
        acls = cls if cls in self.tests else max(cands, key=len)
        funcs = [f for f in self.tests[acls] if meth == f or meth.startswith(f + "_")]
        if not funcs:
            return acls, None
        return acls, max(funcs, key=len)

    def gate(self, tid):
        """'skipIf' (upstream skips the test under backend:cudaMallocAsync), 'in the test' (it
        takes another branch there), or ''."""
        return self.gates.get(self.function_of(tid), "")


def load_source(meta):
    path = find_module(meta)
    if not path:
        return None
    try:
        return Source(path)
    except (OSError, SyntaxError, ValueError) as e:
        print(f"torch_tests_table: {path}: {e}; lines not mapped to tests", file=sys.stderr)
        return None


def old_shim(meta):
    """True when the results come from a runner whose shim set TEST_CUDAMALLOCASYNC = False in
    every configuration (before it was derived from the worker's PYTORCH_CUDA_ALLOC_CONF)."""
    return (not meta.get("shimmed_by_config")
            and any(s.split(" = ")[0].endswith(".TEST_CUDAMALLOCASYNC") and s.endswith("= False")
                    for s in meta.get("shimmed", [])))


def old_shim_note(main, meta, src):
    gated = []
    if src is not None:
        gated = [t for t in meta["ids"] if src.gate(t)
                 and all(outcome(main, c, t) != NOT_RUN for c in meta["configs"])]
    n = ""
    if src is not None:
        diff = differing(main, meta)
        n = (f" {len(gated)} of the tests run here are gated on it upstream, "
             f"{sum(1 for t in diff if src.gate(t))} of the {len(diff)} whose outcomes differ")
    return ("Taken with the old shim: TEST_CUDAMALLOCASYNC was False in every configuration, so the "
            "tests PyTorch's CI skips (or runs another way) under backend:cudaMallocAsync ran under "
            f"async and isolate as under the native allocator.{n} (column `upstream gate`: "
            "`skipIf` = skipped upstream under that backend, `in the test` = another branch there). "
            "The runner now derives TEST_CUDAMALLOCASYNC from the worker's PYTORCH_CUDA_ALLOC_CONF; "
            "these results were not taken again with it. The verdicts and the findings' attribution "
            "below are the fixed table script's.")


# ---------------------------------------------------------------------------------------
# Findings: the library's stderr lines that report one.

# tests/gpu/torch_tests.py keeps every `isolate:` line a test's worker printed while it ran, in
# the record's `isolate` field (and those printed between tests in `isolate_before`).
# (the library's headlines are upper case: "default" or "fault" in another line is not one)
FINDING = re.compile(r"STALE|INVALID|FAULT|VIOLATION|DOUBLE FREE|OUT OF BOUNDS|FREED IN USE")
KIND = re.compile(r"isolate: ([A-Z][A-Z ]+[A-Z]):")
ALLOCATED_AT = re.compile(r"allocated at (\S+?):(\d+)(?: in ([\w.<>]+))?")
PATH = re.compile(r"(/\S+/)([^/\s]+\.py):(?=\d)")
START = re.compile(r"^===== (\S+)$")
DONE = re.compile(r"^===== (\S+): (\w+) in ")


def _kind(line):
    m = KIND.search(line)
    return m.group(1) if m else "finding"


def _worker_config(worker, known):
    if worker in known:
        return known[worker]
    return worker.rsplit("-", 1)[0] if "-" in worker else ""


def _read_logs(path):
    """{worker: [lines]} from a logs.tar.gz or a folder of <worker>.log files."""
    out = {}
    if os.path.isdir(path):
        names = glob.glob(os.path.join(path, "**", "*.log"), recursive=True)
        for n in names:
            with open(n, "rb") as f:
                out[os.path.basename(n)[:-4]] = f.read().decode("utf-8", "replace").splitlines()
        return out
    with tarfile.open(path, "r:*") as tar:
        for m in tar.getmembers():
            if not (m.isfile() and m.name.endswith(".log")):
                continue
            f = tar.extractfile(m)
            if f is not None:
                out[os.path.basename(m.name)[:-4]] = f.read().decode("utf-8", "replace").splitlines()
    return out


def raw_findings(main, confirm, meta, logs=None):
    """[finding]: every finding line once, with where it was printed:
    {src, worker, config, line, kind, during (test id or None), after (the worker's last
    finished test when printed between tests or at exit), at_exit (bool), order (the worker's
    tests, in order, up to the line)}.

    `logs`: {src: {worker: [lines]}}; a results folder with logs takes its findings from them."""
    logs = logs or {}
    known = {}
    runs = {}  # (src, worker) -> [test ids in order]
    recs = [r for c in main.values() for r in c.values()] + [r for c in confirm.values() for r in c.values()]
    for r in sorted(recs, key=lambda r: r.get("_n", 0)):
        w = r.get("worker")
        if not w:
            continue
        known[w] = r.get("config", "")
        runs.setdefault((r.get("_src", 0), w), []).append(r["id"])
    out = []
    for src, wlogs in logs.items():
        for w, lines in sorted(wlogs.items()):
            cur, last, order = None, None, []
            last_start = max((i for i, x in enumerate(lines) if START.match(x)), default=-1)
            for i, line in enumerate(lines):
                m = START.match(line)
                if m:
                    cur = m.group(1)
                    order.append(cur)
                    continue
                m = DONE.match(line)
                if m:
                    cur, last = None, m.group(1)
                    continue
                if line.startswith("isolate:") and FINDING.search(line):
                    later = i < last_start
                    out.append({"src": src, "worker": w, "config": _worker_config(w, known), "line": line,
                                "kind": _kind(line), "during": cur, "after": None if cur else last,
                                "at_exit": cur is None and not later, "order": list(order)})
    for r in sorted(recs, key=lambda r: r.get("_n", 0)):
        src = r.get("_src", 0)
        if src in logs:
            continue
        w = r.get("worker", "")
        order = runs.get((src, w), [r["id"]])
        upto = order[: order.index(r["id"]) + 1] if r["id"] in order else order + [r["id"]]
        prev = upto[-2] if len(upto) > 1 else None
        for field, during in (("isolate_before", None), ("isolate", r["id"])):
            for line in r.get(field, []) or []:
                if FINDING.search(line):
                    out.append({"src": src, "worker": w, "config": r.get("config", ""), "line": line,
                                "kind": _kind(line), "during": during,
                                "after": prev if during is None else None, "at_exit": False,
                                "order": upto if during else upto[:-1]})
    for item in meta.get("after_last_test", []) or []:
        src = item.get("_src", 0)
        if src in logs:
            continue
        w = item.get("worker", "")
        order = runs.get((src, w), [])
        during = item.get("during")  # a test the worker was stopped in (budget), if any
        for line in item.get("lines", []):
            if FINDING.search(line):
                out.append({"src": src, "worker": w, "config": item.get("config", ""), "line": line,
                            "kind": _kind(line), "during": during,
                            "after": None if during else item.get("after"), "at_exit": not during,
                            "order": list(order) + ([during] if during and during not in order else [])})
    return out


def attribute(f, src):
    """(test, how): the test a finding is about, and how that was decided.

    how: "allocated" (its `allocated at FILE:LINE` is in a test function run in that worker),
    "allocated in a helper" / "allocated, not run in this worker" (a function of the test file,
    named as `Class.function`), or "printed during" / "printed after" (no line of the test file
    to go by: the test running when the line was printed, or the last one before it)."""
    m = ALLOCATED_AT.search(f["line"])
    if m and src is not None and os.path.basename(m.group(1)) == src.name:
        line = int(m.group(2))
        cls, fn = src.function_at(line)
        if fn:
            for tid in reversed(f["order"]):
                if src.function_of(tid) == (cls, fn):
                    return tid, "allocated"
            label = f"{cls}.{fn}" if cls else fn
            if fn.startswith("test"):
                return label, "allocated, not run in this worker"
            return label, "allocated in a helper"
    if m and src is None and m.group(3) and os.path.basename(m.group(1)).startswith("test"):
        # no test file here: the library's own `in Class.function` names it
        parts = m.group(3).split(".")
        label = ".".join(parts[:2])
        for tid in reversed(f["order"]):
            if tid == label or tid.startswith(label + "_"):
                return tid, "allocated"
        return label, "allocated, not run in this worker"
    if f["during"]:
        return f["during"], "printed during"
    return f["after"] or "(before the first test)", "printed after"


def _where(f, tid, how, src):
    """The note saying where a finding was printed and why it is listed under `tid`."""
    name = src.name if src is not None else "the test file"
    m = ALLOCATED_AT.search(f["line"])
    at = f"{name}:{m.group(2)}" if m else ""
    if f["during"]:
        printed = f"printed during {f['during']}"
    else:
        when = "at the worker's exit" if f["at_exit"] else "between tests"
        printed = f"printed after {f['after'] or 'no test'} ({when})"
    if how == "allocated":
        if f["during"] == tid:
            return f"allocated at {at} in this test, {printed}"
        return f"allocated at {at} in this test; {printed}, later in worker {f['worker']}"
    if how.startswith("allocated"):
        return f"allocated at {at} ({how}); {printed} in worker {f['worker']}"
    if how == "printed after":
        return f"{printed} in worker {f['worker']}; no allocation line in {name}"
    return ""


def attributed_findings(main, confirm, meta, src=None, logs=None):
    """(by_alloc, by_print): {test: [(finding, note)]}: findings attributed by their allocation
    line, and the others, by the test during (or after) which they were printed."""
    by_alloc, by_print = {}, {}
    seen = set()
    for f in raw_findings(main, confirm, meta, logs):
        tid, how = attribute(f, src)
        key = (tid, f["line"])
        if key in seen:
            continue
        seen.add(key)
        target = by_alloc if how.startswith("allocated") else by_print
        target.setdefault(tid, []).append((f, _where(f, tid, how, src)))
    place = {t: i for i, t in enumerate(meta["ids"])}

    def ordered(d):
        return dict(sorted(d.items(), key=lambda kv: (place.get(kv[0], len(place)), kv[0])))

    return ordered(by_alloc), ordered(by_print)


def findings(main, confirm, meta, src=None, logs=None):
    """{id: [lines]}: every finding, under the test it is attributed to (see attribute())."""
    by_alloc, by_print = attributed_findings(main, confirm, meta, src, logs)
    out = {}
    for d in (by_alloc, by_print):
        for tid, items in d.items():
            out.setdefault(tid, []).extend(f["line"] for f, _ in items)
    return out


def _summarise(items, width):
    """One line per kind of finding: the first line of that kind, its note, and how many more."""
    kinds = {}
    for f, note in items:
        # lines printed during the test apart from those printed after it
        kinds.setdefault((f["kind"], bool(note)), []).append((f, note))
    out = []
    for (kind, _), its in kinds.items():
        f, note = its[0]
        more = f" (+{len(its) - 1} more {kind})" if len(its) > 1 else ""
        text = f["line"][:width]
        if note or ALLOCATED_AT.search(f["line"]):
            text = _short(f["line"], width) + (f" [{note}]" if note else "")
        out.append(text + more)
    return out


def _short(line, width):
    """A finding line cut to `width`, keeping its `allocated at` part when the cut would lose it."""
    line = PATH.sub(lambda m: m.group(2) + ":", line)  # /long/path/test_cuda.py:12 -> test_cuda.py:12
    if len(line) <= width:
        return line
    return line[:width] + " ..."


# ---------------------------------------------------------------------------------------
# Outcomes and verdicts.


def outcome(main, config, tid):
    rec = main.get(config, {}).get(tid)
    return rec["outcome"] if rec else NOT_RUN


def counts(main, meta):
    """{config: {outcome: n}} over meta's ids, 'not run' included."""
    out = {}
    for c in meta["configs"]:
        row = {o: 0 for o in OUTCOMES + [NOT_RUN]}
        for tid in meta["ids"]:
            row[outcome(main, c, tid)] += 1
        out[c] = row
    return out


def triples(main, meta):
    """[(outcomes joined by ' / ', n)], most frequent first: how many tests had each
    combination of outcomes across the configurations."""
    n = {}
    for tid in meta["ids"]:
        key = " / ".join(outcome(main, c, tid) for c in meta["configs"])
        n[key] = n.get(key, 0) + 1
    return sorted(n.items(), key=lambda kv: (-kv[1], kv[0]))


def differing(main, meta):
    """Ids run in every configuration whose outcomes are not all the same."""
    rows = []
    for tid in meta["ids"]:
        outs = [outcome(main, c, tid) for c in meta["configs"]]
        if NOT_RUN in outs:
            continue
        if len(set(outs)) > 1:
            rows.append(tid)
    return rows


def not_run(main, meta):
    return {c: [t for t in meta["ids"] if outcome(main, c, t) == NOT_RUN] for c in meta["configs"]}


def verdict(main, confirm, tid):
    """What the configurations and the re-runs alone say about a test whose isolate outcome
    differs from plain.

    A test that the stream-ordered backend alone fails too (fail, error, crash or timeout, in the
    main run or alone) is the backend's, whatever the kind of failure under isolate: isolate mode
    runs on that backend. Otherwise isolate differs from the backend: it is isolate's to fix
    when it does so alone too, and depends on earlier tests in the worker (state carried over,
    such as memory the library kept) when isolate alone passes."""
    plain = outcome(main, "plain", tid)
    iso = outcome(main, "isolate", tid)
    be = outcome(main, "async", tid)
    if plain == NOT_RUN or iso == NOT_RUN or plain == iso:
        # isolate agrees with plain: any difference is the backend's alone
        if be not in (NOT_RUN, plain) and plain == iso:
            return "backend alone differs (isolate matches plain)"
        return ""
    c = confirm.get(tid, {})
    iso_alone = c.get("isolate", {}).get("outcome")
    be_alone = c.get("async", {}).get("outcome")
    if iso in BAD and (be in BAD or be_alone in BAD):
        how = be if be in BAD else f"{be_alone} alone"
        return V_BACKEND_FAILS + ("" if how == iso else f" (there: {how})")
    if iso == be:
        return V_BACKEND_SKIPS if iso == "skip" else V_BACKEND_SAME
    if iso in ("fail", "error") and be == "pass" and _race_named(main, confirm, tid):
        return V_RACE_NAMED
    if iso_alone is None:
        return V_UNCONFIRMED
    if iso_alone == plain:
        return V_DEPENDS if plain == "pass" else V_DEPENDS_OTHER
    if be_alone is None:
        return V_NO_BACKEND_ALONE
    if be_alone == iso_alone:
        return V_BACKEND_SAME
    return V_ADDS


def _race_named(main, confirm, tid):
    """Whether isolate mode named an unordered free during the test (a FREED IN USE line) and
    the test then failed by its values, not by a device error: the test frees memory another
    stream still uses, and the poison makes the stale read show. A device error (an illegal
    address, say) is never put down to that: the library must not add one."""
    for rec in (main.get("isolate", {}).get(tid), confirm.get(tid, {}).get("isolate")):
        if not rec:
            continue
        err = rec.get("error") or ""
        if "CUDA error" in err or "illegal" in err:
            return False
        if any("FREED IN USE" in line for line in rec.get("isolate", []) or []):
            return True
    return False


def isolate_differences(main, confirm, meta):
    """Ids whose verdict leaves a difference of isolate's own to look at."""
    return [t for t in differing(main, meta) if verdict(main, confirm, t) in ISOLATE_VERDICTS]


def first_error(main, confirm, tid, configs):
    """The first error line worth showing: the isolate run's, else any non-pass run's."""
    order = ["isolate"] + [c for c in configs if c != "isolate"]
    for c in order:
        rec = main.get(c, {}).get(tid)
        if rec and rec["outcome"] not in ("pass", "skip") and rec.get("error"):
            return f"{c}: {rec['error']}"
    for c, rec in confirm.get(tid, {}).items():
        if rec["outcome"] not in ("pass", "skip") and rec.get("error"):
            return f"{c} alone: {rec['error']}"
    return ""


def _md(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def _shim_lines(meta):
    out = []
    if meta.get("shimmed_by_config"):
        for c, items in meta["shimmed_by_config"].items():
            for s in items:
                out.append(f"{c}: {s}")
    else:
        out = list(meta.get("shimmed", []))
    return out


def render_text(main, confirm, meta, max_not_run=20, src=None, logs=None):
    if src is None:
        src = load_source(meta)
    lines = []
    if old_shim(meta):
        lines.append("NOTE: " + old_shim_note(main, meta, src))
        lines.append("")
    cnt = counts(main, meta)
    cols = OUTCOMES + [NOT_RUN]
    lines.append(f"{'configuration':<24}" + "".join(f"{c:>9}" for c in cols))
    for c in meta["configs"]:
        lines.append(f"{CONFIG_TITLES.get(c, c):<24}" + "".join(f"{cnt[c][o]:>9}" for o in cols))
    lines.append(f"({len(meta['ids'])} tests selected)")
    head = " / ".join(CONFIG_TITLES.get(c, c) for c in meta["configs"])
    lines.append("")
    lines.append(f"tests per outcome in each configuration ({head}):")
    for key, n in triples(main, meta):
        lines.append(f"  {n:>5}  {key}")
    if meta.get("uncollected"):
        lines.append("")
        lines.append(f"could not be collected ({len(meta['uncollected'])}):")
        for u in meta["uncollected"]:
            lines.append(f"  {u}")
    shim = _shim_lines(meta)
    if shim:
        lines.append("")
        lines.append("names the installed torch lacks, filled by torch_tests_shim:")
        for s in shim:
            lines.append(f"  {s}")
    diff = differing(main, meta)
    lines.append("")
    lines.append(f"outcomes that differ between configurations ({len(diff)}): {head}")
    for tid in diff:
        outs = " / ".join(outcome(main, c, tid) for c in meta["configs"])
        c = confirm.get(tid, {})
        alone = ""
        if c:
            alone = "  [alone: " + ", ".join(f"{k} {v['outcome']}" for k, v in sorted(c.items())) + "]"
        v = verdict(main, confirm, tid)
        gate = src.gate(tid) if src is not None else ""
        gate = f"  (upstream gate on TEST_CUDAMALLOCASYNC: {gate})" if gate else ""
        lines.append(f"  {tid}: {outs}{alone}{'  -> ' + v if v else ''}{gate}")
        err = first_error(main, confirm, tid, meta["configs"])
        if err:
            lines.append(f"      {err[:240]}")
    iso = isolate_differences(main, confirm, meta)
    lines.append("")
    lines.append(f"isolate differs from the stream-ordered backend alone ({len(iso)}): to look at")
    for tid in iso:
        outs = " / ".join(outcome(main, c, tid) for c in meta["configs"])
        lines.append(f"  {tid}: {outs}  -> {verdict(main, confirm, tid)}")
    by_alloc, by_print = attributed_findings(main, confirm, meta, src, logs)
    lines.append("")
    lines.append(f"isolate mode's findings, by the test whose line allocated the memory "
                 f"(\"allocated at {src.name if src else 'test file'}:LINE\") ({len(by_alloc)}):")
    for tid, items in by_alloc.items():
        for text in _summarise(items, 200):
            lines.append(f"  {tid}: {text}")
    lines.append("")
    lines.append(f"tests during which isolate mode printed a finding ({len(by_print)}):")
    for tid, items in by_print.items():
        for i, text in enumerate(_summarise(items, 220)):
            lines.append(f"  {tid}: {text}")
    nr = not_run(main, meta)
    if any(nr.values()):
        lines.append("")
        lines.append("not run (budget, shard or a configuration that could not start):")
        for c, ids in nr.items():
            if not ids:
                continue
            shown = ", ".join(ids[:max_not_run])
            more = f", ... ({len(ids) - max_not_run} more)" if len(ids) > max_not_run else ""
            lines.append(f"  {c} ({len(ids)}): {shown}{more}")
    return "\n".join(lines)


def render_markdown(main, confirm, meta, full=True, src=None, logs=None):
    if src is None:
        src = load_source(meta)
    out = []
    if old_shim(meta):
        out.append("**Note.** " + old_shim_note(main, meta, src))
        out.append("")
    configs = meta["configs"]
    cols = OUTCOMES + [NOT_RUN]
    cnt = counts(main, meta)
    out.append("| configuration | " + " | ".join(cols) + " |")
    out.append("|---|" + "---:|" * len(cols))
    for c in configs:
        out.append(f"| {CONFIG_TITLES.get(c, c)} | " + " | ".join(str(cnt[c][o]) for o in cols) + " |")
    out.append("")
    out.append(f"{len(meta['ids'])} tests selected.")
    if meta.get("torch"):
        out.append(f"torch {meta['torch']}; test file {meta.get('source', 'test/test_cuda.py')}.")
    titles = [CONFIG_TITLES.get(c, c) for c in configs]
    out.append("")
    out.append("| " + " / ".join(titles) + " | tests |")
    out.append("|---|---:|")
    for key, n in triples(main, meta):
        out.append(f"| {key} | {n} |")
    if meta.get("uncollected"):
        out.append("")
        out.append("Could not be collected: " + "; ".join(f"`{_md(u)}`" for u in meta["uncollected"]))
    shim = _shim_lines(meta)
    if shim:
        out.append("")
        out.append("Filled by `tests/gpu/torch_tests_shim.py` (not in the installed torch): "
                   + ", ".join(f"`{_md(s)}`" for s in shim))
    diff = differing(main, meta)
    out.append("")
    out.append(f"Outcomes that differ between configurations ({len(diff)}):")
    out.append("")
    out.append("| test | " + " | ".join(titles)
               + " | isolate alone | backend alone | verdict | upstream gate | first error line |")
    out.append("|---|" + "---|" * (len(configs) + 5))
    for tid in diff:
        c = confirm.get(tid, {})
        cells = [outcome(main, k, tid) for k in configs]
        cells.append(c.get("isolate", {}).get("outcome", ""))
        cells.append(c.get("async", {}).get("outcome", ""))
        cells.append(verdict(main, confirm, tid))
        cells.append(src.gate(tid) if src is not None else "")
        cells.append(first_error(main, confirm, tid, configs)[:200])
        out.append(f"| `{_md(tid)}` | " + " | ".join(_md(x) for x in cells) + " |")
    iso = isolate_differences(main, confirm, meta)
    out.append("")
    out.append(f"Isolate differs from the stream-ordered backend alone ({len(iso)}), to look at:")
    if iso:
        out.append("")
        out.append("| test | " + " | ".join(titles) + " | verdict |")
        out.append("|---|" + "---|" * (len(configs) + 1))
        for tid in iso:
            out.append(f"| `{_md(tid)}` | " + " | ".join(outcome(main, k, tid) for k in configs)
                       + f" | {_md(verdict(main, confirm, tid))} |")
    by_alloc, by_print = attributed_findings(main, confirm, meta, src, logs)
    name = src.name if src else "the test file"
    out.append("")
    out.append(f"Isolate mode's findings, by the test whose line allocated the memory "
               f"(`allocated at {name}:LINE`) ({len(by_alloc)}):")
    if by_alloc:
        out.append("")
        out.append("| test | finding | where |")
        out.append("|---|---|---|")
        for tid, items in by_alloc.items():
            for text in _summarise([(f, "") for f, _ in items], 240):
                note = items[0][1]
                out.append(f"| `{_md(tid)}` | {_md(text)} | {_md(note)} |")
    out.append("")
    out.append(f"Tests during which isolate mode printed a finding ({len(by_print)}):")
    if by_print:
        out.append("")
        out.append("| test | isolate's first line |")
        out.append("|---|---|")
        for tid, items in by_print.items():
            for text in _summarise(items, 240):
                out.append(f"| `{_md(tid)}` | {_md(text)} |")
    if full:
        out.append("")
        out.append("<details><summary>Every test</summary>")
        out.append("")
        out.append("| test | " + " | ".join(titles) + " |")
        out.append("|---|" + "---|" * len(configs))
        for tid in meta["ids"]:
            out.append(f"| `{_md(tid)}` | " + " | ".join(outcome(main, k, tid) for k in configs) + " |")
        out.append("")
        out.append("</details>")
    return "\n".join(out) + "\n"


def main_cli(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", help="results folders (each with <config>.jsonl, meta.json)")
    ap.add_argument("--text", action="store_true", help="the runner's text table instead of Markdown")
    ap.add_argument("--no-full", action="store_true", help="Markdown without the every-test table")
    ap.add_argument("--logs", action="append", default=[],
                    help="that run's logs.tar.gz (or folder of worker logs), once per results folder, "
                         "in the same order: findings are then read from the logs")
    a = ap.parse_args(argv)
    for d in a.dirs:
        if not os.path.isdir(d):
            print(f"torch_tests_table: {d}: not a folder", file=sys.stderr)
            return 2
    if a.logs and len(a.logs) != len(a.dirs):
        print(f"torch_tests_table: {len(a.logs)} --logs for {len(a.dirs)} results folders "
              f"(give one per folder, in the same order)", file=sys.stderr)
        return 2
    logs = {}
    for i, p in enumerate(a.logs):
        try:
            logs[i] = _read_logs(p)
        except (OSError, tarfile.TarError) as e:
            print(f"torch_tests_table: {p}: {e}", file=sys.stderr)
            return 2
    main, confirm, meta = load(a.dirs)
    src = load_source(meta)
    if a.text:
        print(render_text(main, confirm, meta, src=src, logs=logs))
    else:
        sys.stdout.write(render_markdown(main, confirm, meta, full=not a.no_full, src=src, logs=logs))
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
