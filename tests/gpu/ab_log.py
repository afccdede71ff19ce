"""Log mode against no preload, interleaved (A B B A ...), on both training workloads; and the
launch check over full training runs under guard mode (no false reports).

    python3 tests/gpu/ab_log.py [--rounds 4] [--steps 150]

Prints a table of ms/step per round and the median ratio, then the stale-launch counts.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIB = REPO / "target/release/libisolate.so"
ISOLATE = REPO / "target/release/isolate"


def run(model, steps, extra_env, trace_dir=None):
    env = dict(os.environ)
    env.update(extra_env)
    if trace_dir:
        env["ISOLATE_TRACE"] = str(Path(trace_dir) / f"{model}-%p.trace")
    cmd = [sys.executable, str(HERE / "train_small.py"), "--model", model, "--steps", str(steps)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        print(f"FAILED rc={p.returncode} {model} {extra_env}\n{p.stderr[-2000:]}")
        return None
    return json.loads(line[-1][7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--guard-steps", type=int, default=80)
    a = ap.parse_args()
    log_env = {"LD_PRELOAD": str(LIB), "ISOLATE_MODE": "log"}
    print(f"log mode vs no preload, {a.steps} timed steps, {a.rounds} rounds, order alternating")
    print(f"{'model':7} {'round':5} {'baseline ms':>12} {'log ms':>8} {'ratio':>6}")
    for model in ["lm", "resnet"]:
        ratios = []
        with tempfile.TemporaryDirectory() as d:
            for r in range(a.rounds):
                order = [("base", {}), ("log", log_env)]
                if r % 2:
                    order.reverse()
                got = {}
                for name, env in order:
                    res = run(model, a.steps, env, d if name == "log" else None)
                    got[name] = res["ms_per_step"] if res else None
                if got["base"] and got["log"]:
                    ratios.append(got["log"] / got["base"])
                    print(f"{model:7} {r + 1:5} {got['base']:12.3f} {got['log']:8.3f} {ratios[-1]:6.3f}")
        if ratios:
            print(f"{model:7} {'median':5} {'':12} {'':8} {statistics.median(ratios):6.3f}")
    print()
    print(f"launch check over training under guard mode ({a.guard_steps} steps): stale launches")
    for model in ["lm", "resnet"]:
        with tempfile.TemporaryDirectory() as d:
            env = {"LD_PRELOAD": str(LIB), "ISOLATE_MODE": "isolate", "ISOLATE_GUARD": "on",
                   "ISOLATE_CHECK_LAUNCH": "on"}
            res = run(model, a.guard_steps, env, d)
            traces = sorted(str(p) for p in Path(d).glob("*.trace"))
            s = subprocess.run([str(ISOLATE), "summary", "--json", *traces], capture_output=True, text=True)
            try:
                j = json.loads(s.stdout)
            except json.JSONDecodeError:
                print(f"{model}: summary failed: {s.stderr[-500:]}")
                continue
            notes = j.get("notes")
            kernels = sorted({x.get("kernel") for x in j.get("stale_launches", [])})
            print(f"{model}: ran={'yes' if res else 'NO'} stale_launches={j.get('stale_launch_count')} "
                  f"kernels={kernels[:5]} stale_values={j.get('stale_value_count')} "
                  f"device_faults={len(j.get('device_faults') or [])} notes={notes}")
            # Where the unused stale values pointed: offset into the freed allocation, its size,
            # and how many events before the launch it was freed.
            for v in (j.get("stale_values") or [])[:12]:
                off = int(v["ptr"], 16) - int(v["alloc_ptr"], 16)
                print(f"  stale value: {v['kernel'][:70]} param {v['param_index']} byte {v['param_offset']}: "
                      f"+{off} into {v['alloc_size']} B (alloc seq {v['allocation']}, freed seq "
                      f"{v['freed_at']['seq']}, launch seq {v['seq']})")

if __name__ == "__main__":
    main()
