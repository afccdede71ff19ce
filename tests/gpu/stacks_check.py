#!/usr/bin/env python3
"""Issue 13 on the GPU: do findings name the code?

    python3 tests/gpu/stacks_check.py --isolate target/gpu/isolate [--out DIR]

Runs under `isolate run` (the libisolate.so beside the binary), isolate mode, stacks on (the
default), and reads the summaries:
  stale     tests/gpu/bug_stale_write.py --writer cupy: the stale write must name the line that
            made the tensor (`x = torch.zeros(...)`) and the line that released it (`del x`);
            the stale launch (CuPy's kernel handed the freed pointer) the line that launched it
  stream    tests/gpu/bug_record_stream.py (the missing record_stream) under the new default:
            poison shows through (NaN) or a finding, never silently wrong data
  sites     a GPT-2 training run (transformers, 6 steps): `isolate sites` ranks its allocation
            sites; the top ones must name Python lines of the model code
Prints PASS/FAIL per case with the lines that matter; logs and traces go to $OUT/stacks/.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def line_of(path, pattern):
    for i, line in enumerate(open(path), 1):
        if re.search(pattern, line):
            return i
    return None


def run(cmd, log, env=None, timeout=240):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = 124, "", "timeout"
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\nrc={rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
    return rc, out, err


def traces_in(d):
    return sorted(os.path.join(d, t) for t in os.listdir(d) if t.endswith(".trace"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--isolate", required=True)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "stacks"))
    ap.add_argument("--only", default="stale,stream,sites")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, "stacks_check.log")
    iso = os.path.abspath(args.isolate)
    results = []
    env = dict(os.environ)
    for k in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)

    if "stale" in args.only:
        d = os.path.join(args.out, "stale")
        os.makedirs(d, exist_ok=True)
        src = os.path.join(HERE, "bug_stale_write.py")
        a = line_of(src, r"x = torch\.zeros\(N")
        f = line_of(src, r"^\s*del x\b")
        w = line_of(src, r"workload\.cupy_fill\(ptr")
        rc, out, err = run([iso, "run", "--mode", "isolate", "--trace", os.path.join(d, "sw-%p.trace"),
                            "--", sys.executable, src, "--writer", "cupy"], log, env)
        ts = traces_in(d)
        s = run([iso, "summary", *ts], log)[1] if ts else ""
        want = {f"bug_stale_write.py:{a}": "allocation", f"bug_stale_write.py:{f}": "free",
                f"bug_stale_write.py:{w}": "launch"}
        missing = [f"{v} ({k})" for k, v in want.items() if k not in s]
        ok = "STALE WRITE" in s and not missing
        findings = "\n".join(l for l in s.splitlines()[:60] if l.strip())
        results.append(("stale", ok, f"missing: {missing}" if missing else "all three lines named"))
        print(f"{'PASS' if ok else 'FAIL'} stale: alloc line {a}, free line {f}, launch line {w}; "
              f"{'missing ' + str(missing) if missing else 'all named'}\n--- summary (head)\n{findings}\n---",
              flush=True)

    if "stream" in args.only:
        d = os.path.join(args.out, "stream")
        os.makedirs(d, exist_ok=True)
        rc, out, err = run([iso, "run", "--mode", "isolate", "--trace", os.path.join(d, "rs-%p.trace"),
                            "--", sys.executable, os.path.join(HERE, "bug_record_stream.py")], log, env)
        res = {}
        for l in out.splitlines():
            if l.startswith("RESULT "):
                res = json.loads(l[7:])
        ts = traces_in(d)
        s = run([iso, "summary", *ts], log)[1] if ts else ""
        finding = "STALE" in s or "findings: none" not in s
        wrong = res.get("wrong")
        nan = res.get("nan", None)
        ok = rc == 0 and (bool(wrong) or finding)
        print(f"{'PASS' if ok else 'FAIL'} stream: rc={rc} wrong={wrong} nan={nan} same_address="
              f"{res.get('same_address')} finding={finding}\n    result: {json.dumps(res)[:400]}",
              flush=True)
        results.append(("stream", ok, f"wrong={wrong}"))

    if "sites" in args.only:
        d = os.path.join(args.out, "sites")
        os.makedirs(d, exist_ok=True)
        rc, out, err = run([iso, "run", "--mode", "isolate", "--trace", os.path.join(d, "gpt2-%p.trace"),
                            "--", sys.executable, os.path.join(HERE, "train_small.py"), "--model", "gpt2",
                            "--steps", "4", "--warmup", "2"], log, env, timeout=300)
        ts = traces_in(d)
        s = run([iso, "sites", "--top", "8", *ts], log)[1] if ts else ""
        c = run([iso, "sites", "--by", "calls", "--top", "5", *ts], log)[1] if ts else ""
        summ = run([iso, "summary", *ts], log)[1] if ts else ""
        py = len(re.findall(r"\.py:\d+", s))
        ok = rc == 0 and py >= 3 and "findings: none" in summ
        print(f"{'PASS' if ok else 'FAIL'} sites: rc={rc}, {py} Python lines among the top sites; "
              f"findings none: {'findings: none' in summ}\n--- isolate sites --top 8\n{s[:3500]}\n"
              f"--- isolate sites --by calls --top 5\n{c[:2000]}\n---", flush=True)
        results.append(("sites", ok, f"{py} python lines"))

    print("stacks_check: " + ", ".join(f"{n} {'PASS' if ok else 'FAIL'}" for n, ok, _ in results))
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
