#!/usr/bin/env python3
"""Leaks are growth (issue 30, item 3), on the GPU with PyTorch: two training scripts written
as users write them, at module level.

    python3 tests/gpu/leak_check.py --lib target/gpu/libisolate.so --isolate target/gpu/isolate \
        [--out $OUT] [--steps 12] [--modes isolate,log]

  held.py   an MLP and its AdamW state live until exit (module-level variables), the losses
            kept as numbers (`losses.append(loss.item())`): memory held at exit, NO finding
  leak.py   the same, but `losses.append(loss)` keeps each step's loss tensor: a LEAK named
            with its site (leak.py's `loss = ...` line) and its bytes a step

Each script runs without the library, then under it in each mode (isolate: PyTorch's
stream-ordered backend, set by the library; log: with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that
each tensor is one driver allocation), and the trace is read with `isolate summary --json` (and
the text summary, for its LEAK line). Checks, one row a run:
  same losses as without the library;
  held.py: 0 findings of any kind (leaks included); what is held at exit is shown (information);
  leak.py: exactly 1 leak; its place (the program's own Python line, not torch's) is leak.py
            at the `loss = ...` line; bytes a step > 0;
  its steps are the iterations of the loop at leak.py (`steps` names the loop).
Exit 0 when every check passed. Logs and the summaries go to OUT/leak/.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = r'''
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 512, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
losses = []
for step in range(int(sys.argv[1])):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)  # LOSS
    loss.backward()
    opt.step()
    losses.append(KEEP)
torch.cuda.synchronize()
print("losses", " ".join(f"{float(l):.5f}" for l in losses))
'''


def write(dirname, name, keep):
    text = SCRIPT.replace("KEEP", keep)
    path = os.path.join(dirname, name)
    with open(path, "w") as f:
        f.write(text)
    line = next(i + 1 for i, l in enumerate(text.splitlines()) if l.endswith("# LOSS"))
    return path, line


def run(cmd, env, timeout=180):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, e.stdout or "", e.stderr or ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--isolate", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/leak-check-out"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--modes", default="isolate,log")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    lib, cli = os.path.abspath(a.lib), os.path.abspath(a.isolate)
    logdir = os.path.join(a.out, "leak")
    os.makedirs(logdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="leak-")
    scripts = {
        "held.py": write(work, "held.py", "loss.item()"),
        "leak.py": write(work, "leak.py", "loss"),
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ISOLATE_", "PYTORCH_CUDA"))}
    base.pop("LD_PRELOAD", None)
    failed = 0
    print(f"{'script':8} {'mode':8} {'rc':>3} {'same':5} {'findings':9} {'leaks':5} "
          f"{'held at exit':18} leak site, bytes a step, steps -> verdict")
    log = open(os.path.join(logdir, "leak.log"), "w")
    for name, (path, loss_line) in scripts.items():
        rc0, out0, err0 = run([a.python, path, str(a.steps)], dict(base), timeout=180)
        log.write(f"===== {name} plain rc={rc0}\n{out0}{err0}\n")
        plain = [l for l in out0.splitlines() if l.startswith("losses")]
        for mode in a.modes.split(","):
            tdir = os.path.join(work, f"{name}-{mode}")
            os.makedirs(tdir, exist_ok=True)
            env = dict(base, LD_PRELOAD=lib, ISOLATE_MODE=mode,
                       ISOLATE_TRACE=os.path.join(tdir, "t-%p.trace"))
            if mode == "log":
                env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
            rc, out, err = run([a.python, path, str(a.steps)], env, timeout=240)
            traces = sorted(os.path.join(tdir, f) for f in os.listdir(tdir))
            sj = subprocess.run([cli, "summary", "--json", *traces], capture_output=True, text=True)
            st = subprocess.run([cli, "summary", *traces], capture_output=True, text=True)
            tag = f"{name[:-3]}-{mode}"
            with open(os.path.join(logdir, f"{tag}.summary.txt"), "w") as f:
                f.write(st.stdout + st.stderr)
            log.write(f"===== {name} {mode} rc={rc}\n{out}{err}\n--- summary\n{st.stdout}{st.stderr}\n")
            why = []
            try:
                s = json.loads(sj.stdout)
            except Exception as e:  # noqa: BLE001 - any unreadable summary is a failed check
                s = {}
                why.append(f"summary unreadable: {e}; {sj.stderr.strip()[:200]}")
            same = [l for l in out.splitlines() if l.startswith("losses")] == plain and rc == rc0 == 0
            if not same:
                why.append(f"rc {rc} (plain {rc0}) or losses differ")
            findings = len(s.get("findings") or []) if isinstance(s.get("findings"), list) else s.get("findings", 0)
            leaks = s.get("leaks") or []
            held = s.get("held_at_exit") or {}
            held_s = f"{held.get('count', 0)} ({held.get('bytes', 0) / 2**20:.1f} MiB)"
            site, place, user_lines = "-", "?", []
            if leaks:
                l0 = leaks[0]
                stack = l0.get("alloc_stack") or {}
                place = stack.get("place") or "?"
                user_lines = [f.get("line") for f in stack.get("frames") or []
                              if f.get("kind") == "python" and (f.get("file") or "").endswith("/" + name)]
                steps = l0.get("steps") or "?"
                site = f"{place}, {l0.get('bytes_per_step')} B/step, {l0.get('steps_judged')} judged of {l0.get('step_count')} ({steps})"
            if name == "held.py":
                if findings:
                    why.append(f"{findings} findings (want none)")
            else:
                if len(leaks) != 1:
                    why.append(f"{len(leaks)} leaks (want 1)")
                elif loss_line not in user_lines:
                    why.append(f"the leak's stack has no leak.py:{loss_line} (has {user_lines})")
                elif f"leak.py:{loss_line} " not in place + " ":
                    why.append(f"the leak's place is {place}, not leak.py:{loss_line}")
                elif not leaks[0].get("bytes_per_step"):
                    why.append("no bytes a step")
            leak_line = next((l.strip() for l in st.stdout.splitlines() if "LEAK:" in l), "")
            verdict = "PASS" if not why else "FAIL: " + "; ".join(why)
            failed |= bool(why)
            print(f"{name:8} {mode:8} {rc:>3} {'yes' if same else 'NO':5} {findings!s:9} "
                  f"{len(leaks):5} {held_s:18} {site} -> {verdict}")
            if leak_line:
                print(f"{'':27}{leak_line[:160]}")
            for t in traces:
                if os.path.getsize(t) < 4 << 20:
                    os.replace(t, os.path.join(logdir, f"{tag}.trace"))
                    break
    log.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
