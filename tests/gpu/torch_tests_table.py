#!/usr/bin/env python3
"""Tables from the results of tests/gpu/torch_tests.py: counts per configuration, the tests
whose outcome differs between configurations (with the re-runs alone and a verdict), and the
whole per-test table, as text (what the runner prints) or Markdown (for docs/reliability.md).

    python3 tests/gpu/torch_tests_table.py RESULTS_DIR [RESULTS_DIR ...] [--text] [--no-full]

RESULTS_DIR is a folder holding `<config>.jsonl` files, `confirm.jsonl` and `meta.json` (what
the runner writes under `$OUT/results`); several folders (one per shard, `--shard 1/2` and
`--shard 2/2`) are merged, a later record of the same test and configuration replacing an
earlier one.
"""

import argparse
import glob
import json
import os
import re
import sys

OUTCOMES = ["pass", "fail", "error", "skip", "crash", "timeout"]
NOT_RUN = "not run"
DEFAULT_CONFIGS = ["plain", "async", "isolate"]
CONFIG_TITLES = {
    "plain": "plain",
    "async": "stream-ordered backend",
    "isolate": "isolate",
}


def load(dirs):
    """(main, confirm, meta): main[config][id] = record, confirm[id][config] = record,
    meta = {"ids": [...], "configs": [...], "uncollected": [...], "shimmed": [...], ...}."""
    main, confirm = {}, {}
    meta = {"ids": [], "configs": [], "uncollected": [], "shimmed": [], "not_run": {}}
    seen_ids = set()
    for d in dirs:
        mpath = os.path.join(d, "meta.json")
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
            for k, v in m.items():
                if k not in meta:
                    meta[k] = v
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


# The library's stderr lines that report a finding (tests/gpu/torch_tests.py keeps every
# `isolate:` line a test's worker printed while it ran, in the record's `isolate` field).
FINDING = re.compile(r"STALE|INVALID|FAULT|VIOLATION|DOUBLE FREE|OUT OF BOUNDS", re.I)


def findings(main, confirm, meta):
    """{id: [lines]}: tests during which isolate mode printed a finding (main or alone runs)."""
    out = {}
    recs = [main.get("isolate", {}).get(t) for t in meta["ids"]]
    recs += [c.get("isolate") for c in confirm.values()]
    for rec in recs:
        if not rec:
            continue
        lines = [l for l in rec.get("isolate", []) if FINDING.search(l)]
        if lines:
            out.setdefault(rec["id"], [])
            out[rec["id"]] += [l for l in lines if l not in out[rec["id"]]]
    return out


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
    """What the re-runs alone say about a test whose isolate outcome differs from plain."""
    plain = outcome(main, "plain", tid)
    iso = outcome(main, "isolate", tid)
    if plain == NOT_RUN or iso == NOT_RUN or plain == iso:
        # isolate agrees with plain: any difference is the backend's alone
        be = outcome(main, "async", tid)
        if be not in (NOT_RUN, plain) and plain == iso:
            return "backend alone differs (isolate matches plain)"
        return ""
    c = confirm.get(tid, {})
    iso_alone = c.get("isolate", {}).get("outcome")
    be_alone = c.get("async", {}).get("outcome")
    if iso_alone is None:
        return "not confirmed (no re-run alone)"
    if iso_alone == plain:
        return "flaky or interference: isolate alone matches plain"
    if be_alone is None:
        return "isolate alone differs; backend alone not re-run"
    if be_alone == iso_alone:
        return "stream-ordered backend: the backend alone does the same"
    return "ISOLATE ADDS THIS (ours to fix)"


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


def render_text(main, confirm, meta, max_not_run=20):
    lines = []
    cnt = counts(main, meta)
    cols = OUTCOMES + [NOT_RUN]
    lines.append(f"{'configuration':<24}" + "".join(f"{c:>9}" for c in cols))
    for c in meta["configs"]:
        lines.append(f"{CONFIG_TITLES.get(c, c):<24}" + "".join(f"{cnt[c][o]:>9}" for o in cols))
    lines.append(f"({len(meta['ids'])} tests selected)")
    if meta.get("uncollected"):
        lines.append("")
        lines.append(f"could not be collected ({len(meta['uncollected'])}):")
        for u in meta["uncollected"]:
            lines.append(f"  {u}")
    if meta.get("shimmed"):
        lines.append("")
        lines.append("names the installed torch lacks, filled by torch_tests_shim:")
        for s in meta["shimmed"]:
            lines.append(f"  {s}")
    diff = differing(main, meta)
    lines.append("")
    head = " / ".join(CONFIG_TITLES.get(c, c) for c in meta["configs"])
    lines.append(f"outcomes that differ between configurations ({len(diff)}): {head}")
    for tid in diff:
        outs = " / ".join(outcome(main, c, tid) for c in meta["configs"])
        c = confirm.get(tid, {})
        alone = ""
        if c:
            alone = "  [alone: " + ", ".join(f"{k} {v['outcome']}" for k, v in sorted(c.items())) + "]"
        v = verdict(main, confirm, tid)
        lines.append(f"  {tid}: {outs}{alone}{'  -> ' + v if v else ''}")
        err = first_error(main, confirm, tid, meta["configs"])
        if err:
            lines.append(f"      {err[:240]}")
    fnd = findings(main, confirm, meta)
    lines.append("")
    lines.append(f"tests during which isolate mode printed a finding ({len(fnd)}):")
    for tid, fl in fnd.items():
        lines.append(f"  {tid}: {fl[0][:220]}" + (f" (+{len(fl) - 1} more)" if len(fl) > 1 else ""))
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


def render_markdown(main, confirm, meta, full=True):
    out = []
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
    if meta.get("uncollected"):
        out.append("")
        out.append("Could not be collected: " + "; ".join(f"`{_md(u)}`" for u in meta["uncollected"]))
    if meta.get("shimmed"):
        out.append("")
        out.append("Filled by `tests/gpu/torch_tests_shim.py` (not in the installed torch): "
                   + ", ".join(f"`{_md(s)}`" for s in meta["shimmed"]))
    diff = differing(main, meta)
    out.append("")
    out.append(f"Outcomes that differ between configurations ({len(diff)}):")
    out.append("")
    titles = [CONFIG_TITLES.get(c, c) for c in configs]
    out.append("| test | " + " | ".join(titles) + " | isolate alone | backend alone | verdict | first error line |")
    out.append("|---|" + "---|" * (len(configs) + 4))
    for tid in diff:
        c = confirm.get(tid, {})
        cells = [outcome(main, k, tid) for k in configs]
        cells.append(c.get("isolate", {}).get("outcome", ""))
        cells.append(c.get("async", {}).get("outcome", ""))
        cells.append(verdict(main, confirm, tid))
        cells.append(first_error(main, confirm, tid, configs)[:200])
        out.append(f"| `{_md(tid)}` | " + " | ".join(_md(x) for x in cells) + " |")
    fnd = findings(main, confirm, meta)
    out.append("")
    out.append(f"Tests during which isolate mode printed a finding ({len(fnd)}):")
    if fnd:
        out.append("")
        out.append("| test | isolate's first line |")
        out.append("|---|---|")
        for tid, fl in fnd.items():
            out.append(f"| `{_md(tid)}` | {_md(fl[0][:240])} |")
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
    a = ap.parse_args(argv)
    for d in a.dirs:
        if not os.path.isdir(d):
            print(f"torch_tests_table: {d}: not a folder", file=sys.stderr)
            return 2
    main, confirm, meta = load(a.dirs)
    if a.text:
        print(render_text(main, confirm, meta))
    else:
        sys.stdout.write(render_markdown(main, confirm, meta, full=not a.no_full))
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
