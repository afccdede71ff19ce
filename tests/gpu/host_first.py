"""Issues 17 and 18 on the GPU: the host process first, on programs no one here wrote.

Each case runs WITHOUT the library first, then with it (log, isolate), and compares:

  ipc        torch.multiprocessing shares a CUDA tensor (CUDA IPC) with a consumer process, which
             sums it: same sum; the consumer's trace has the cudaIpcOpenMemHandle/Close events;
             no finding; in isolate mode nothing of the shared memory is poisoned.
  ctrl-c     a GPT-2-sized transformers training loop on a pseudo-terminal gets Ctrl-C (the
             kernel's SIGINT, si_code SI_KERNEL): Python raises KeyboardInterrupt and exits 130
             (as without the library) and the trace is complete.
  sigterm    the same loop gets SIGTERM (default action): it dies of SIGTERM as without the
             library, and the trace ends with End(signal 15).
  vfork      isolate mode: subprocess.run() of a missing command (vfork + failed exec + _exit)
             between a free and a stale write: the stale write is still found.
  fds        after CUDA starts, the program closes every descriptor >= 3 but the driver's
             (/dev/nvidia*) and writes its own file: the file holds only its bytes, the trace is
             complete.

Usage: python3 tests/gpu/host_first.py [--out DIR] [--cases ipc,ctrl-c,...]
Prints one table; exit status 1 when a check failed.
"""

import argparse
import json
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIB = os.environ.get("ISOLATE_LIB_PATH", str(REPO / "target/release/libisolate.so"))
CLI = os.environ.get("ISOLATE_CLI_PATH", str(REPO / "target/release/isolate"))

IPC = r"""
import sys, torch, torch.multiprocessing as mp
def consumer(q, r):
    try:
        t = q.get(timeout=90)
        r.put(float(t.sum().item()))
        del t
    except Exception as e:
        r.put(f"consumer failed: {type(e).__name__}: {str(e)[:160]}")
if __name__ == "__main__":
    mp.set_start_method("spawn")
    q, r = mp.Queue(), mp.Queue()
    p = mp.Process(target=consumer, args=(q, r))
    p.start()
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    q.put(x)
    try:
        s = r.get(timeout=90)
    except Exception as e:
        s = f"no answer ({type(e).__name__})"
    p.join(timeout=30)
    if p.is_alive():
        p.kill()
    print(f"RESULT sum={s} exit={p.exitcode}")
"""

TRAIN = r"""
import sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4)).cuda()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randint(0, 50000, (8, 128), device="cuda")
try:
    step = 0
    while True:
        loss = m(x, labels=x).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        step += 1
        if step == 3:
            torch.cuda.synchronize()
            print("READY", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.exit(130)
"""

VFORK = r"""
import subprocess, torch, cupy
x = torch.zeros(1 << 20, device="cuda"); torch.cuda.synchronize()
p = x.data_ptr(); del x
try:
    subprocess.run(["/nonexistent/isolate-missing-command"])
except FileNotFoundError:
    print("missing command: FileNotFoundError")
y = torch.full((1 << 20,), 7.0, device="cuda")
mem = cupy.cuda.UnownedMemory(p, 4 << 20, None, 0)
a = cupy.ndarray((1 << 20,), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))
a[1024:2048] = 1.0
torch.cuda.synchronize()
print("RESULT corrupted", int((y != 7.0).sum().item()))
"""

FDS = r"""
import os, sys, torch
x = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize()
# Close every descriptor >= 3 but the driver's own (/dev/nvidia*: closing those breaks CUDA
# with or without isolate), as a careful daemon does.
for name in os.listdir("/proc/self/fd"):
    n = int(name)
    try:
        target = os.readlink(f"/proc/self/fd/{n}")
    except OSError:
        continue
    if n >= 3 and not target.startswith("/dev/nvidia"):
        try:
            os.close(n)
        except OSError:
            pass
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"nineteen bytes here")
os.close(fd)
for i in range(50):
    y = torch.empty(1 << 16, device="cuda"); del y
torch.cuda.synchronize()
print("RESULT fd", fd)
"""


def env_for(mode, trace_dir):
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("ISOLATE_"):
            del e[k]
    e.pop("LD_PRELOAD", None)
    e["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    if mode != "none":
        e["LD_PRELOAD"] = LIB
        e["ISOLATE_MODE"] = mode
        e["ISOLATE_TRACE"] = str(Path(trace_dir) / "t-%p.trace")
    return e


def summary(trace_dir):
    traces = sorted(str(p) for p in Path(trace_dir).glob("t-*.trace*"))
    if not traces:
        return [], None
    out = subprocess.run([CLI, "summary", "--json", *traces], capture_output=True, text=True)
    try:
        return traces, json.loads(out.stdout)
    except json.JSONDecodeError:
        return traces, {"error": out.stderr[-400:]}


def per_trace(trace):
    out = subprocess.run([CLI, "summary", "--json", trace], capture_output=True, text=True)
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        return {}


def run_script(code, mode, args=(), timeout=150):
    d = tempfile.mkdtemp(prefix="hf-")
    f = Path(d) / "prog.py"
    f.write_text(code)
    try:
        r = subprocess.run([sys.executable, str(f), *args], env=env_for(mode, d), capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(e.cmd, 124, (e.stdout or b"").decode(errors="replace")
                                        if isinstance(e.stdout, bytes) else (e.stdout or ""),
                                        f"timed out after {timeout} s")
    return d, r


def on_pty(code, mode, send, timeout=300):
    """Runs code on a pseudo-terminal as the foreground job; after READY, sends `send`:
    a byte to type (Ctrl-C) or a signal number (sent with kill). Returns (dir, status, output)."""
    d = tempfile.mkdtemp(prefix="hf-")
    f = Path(d) / "prog.py"
    f.write_text(code)
    pid, master = pty.fork()
    if pid == 0:
        e = env_for(mode, d)
        os.execve(sys.executable, [sys.executable, str(f)], e)
    out = b""
    sent = False
    deadline = time.time() + timeout
    status = None
    while time.time() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            out += chunk
        if not sent and b"READY" in out:
            if isinstance(send, bytes):
                os.write(master, send)
            else:
                os.kill(pid, send)
            sent = True
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid == pid:
            status = st
            break
    if status is None:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    return d, status, out.decode(errors="replace")


def describe(status):
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def complete(trace_dir, want_end):
    traces, _ = summary(trace_dir)
    ends = []
    for t in traces:
        s = per_trace(t)
        t0 = (s.get("traces") or [{}])[0]
        ends.append((s.get("complete"), t0.get("end_reason"), t0.get("signal")))
    return traces, ends


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="ctrl-c,sigterm,vfork,fds,ipc")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cases = args.cases.split(",")
    rows, failed = [], 0

    def row(case, mode, got, ok, detail=""):
        nonlocal failed
        rows.append((case, mode, got, "ok" if ok else "FAIL", detail))
        failed += not ok
        print("  ".join(str(v) for v in rows[-1]), flush=True)

    for case, send, want in [("ctrl-c", b"\x03", "exit 130"), ("sigterm", signal.SIGTERM, "signal 15")]:
        if case not in cases:
            continue
        for mode in ["none", "log", "isolate"]:
            d, st, out = on_pty(TRAIN, mode, send)
            got = describe(st)
            if mode == "none":
                row(case, mode, got, got == want)
                continue
            traces, ends = complete(d, want)
            ok = got == want and len(traces) == 1 and all(e[0] for e in ends)
            row(case, mode, got, ok, f"traces {len(traces)}, end {ends}")

    if "vfork" in cases:
        for mode in ["none", "isolate"]:
            d, r = run_script(VFORK, mode)
            got = next((l for l in r.stdout.splitlines() if l.startswith("RESULT")), r.stderr[-300:])
            if mode == "none":
                # With caching off the freed memory is unmapped: the write faults or lands.
                row("vfork", mode, got[-80:], True, "baseline, for the record")
                continue
            _, s = summary(d)
            v = s.get("poison_violation_count", 0) if s else 0
            row("vfork", mode, got, "corrupted 0" in got and v >= 1, f"stale writes found {v}")

    if "fds" in cases:
        for mode in ["none", "log", "isolate"]:
            d = tempfile.mkdtemp(prefix="hf-")
            target = Path(d) / "mydata.txt"
            d2, r = run_script(FDS, mode, args=(str(target),))
            content = target.read_bytes() if target.exists() else b""
            got = f"exit {r.returncode}, mydata {len(content)} bytes"
            if mode == "none":
                base_fds = r.returncode
                row("fds", mode, got, content == b"nineteen bytes here")
                continue
            traces, ends = complete(d2, "exit")
            ok = (r.returncode == base_fds and content == b"nineteen bytes here" and traces
                  and all(e[0] for e in ends))
            row("fds", mode, got, ok, f"traces {len(traces)}, end {ends}, stderr {r.stderr.strip()[-160:]!r}")

    if "ipc" in cases:
        base = None
        for mode in ["none", "log", "isolate"]:
            d, r = run_script(IPC, mode)
            got = next((l for l in r.stdout.splitlines() if l.startswith("RESULT")), r.stderr[-200:])
            if mode == "none":
                base = got
                row("ipc", mode, got, True, "baseline")
                continue
            traces, s = summary(d)
            opens = sum(per_trace(t).get("calls", {}).get("cudaIpcOpenMemHandle", 0) for t in traces)
            closes = sum(per_trace(t).get("calls", {}).get("cudaIpcCloseMemHandle", 0) for t in traces)
            findings = s and (s.get("invalid_free_count", 0) + s.get("poison_violation_count", 0)
                              + s.get("stale_launch_count", 0))
            shared = "sum=" in base and "no answer" not in base and "failed" not in base
            ok = got == base and not findings and (not shared or (opens >= 1 and closes >= 1))
            row("ipc", mode, got, ok, f"{len(traces)} traces, opens {opens}, closes {closes}, findings {findings}")

    print()
    w = [max(len(str(x[i])) for x in rows + [("case", "mode", "result", "check", "detail")]) for i in range(5)]
    for x in [("case", "mode", "result", "check", "detail")] + rows:
        print("  ".join(str(v).ljust(w[i]) for i, v in enumerate(x)))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows) - failed}/{len(rows)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
