"""Planted bug: a tensor freed on its allocation stream while another stream still reads it
(the missing `t.record_stream(s1)`).

    s2:  t = full(3.0)                      t is allocated on s2
    s1:  wait for s2; sleep ~0.3 s; out = t * 2
    s2:  del t   (no record_stream)         the caching allocator sees t's block free on s2 ...
    s2:  u = empty(); u.fill_(-1.0)         ... hands it to u, and s2 overwrites it at once
    expected: out == 6.0 everywhere

RESULT: whether u got t's address and how many elements of `out` are wrong.
"""

import argparse
import sys

import workload

N = 2**20  # float32 elements: 4 MiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sleep-cycles",
        type=int,
        default=600_000_000,
        help="GPU cycles s1 spins before reading t (0.3 s at 2 GHz, longer at idle clocks)",
    )
    workload.add_history_args(parser)
    args = parser.parse_args()

    import torch

    workload.start_history(args)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    # Warm up every kernel the race uses: CUDA loads modules lazily, and loading one while the
    # sleep kernel runs waits for it, which would serialise the streams and hide the race.
    w = torch.full((N,), 3.0, device="cuda")
    torch.cuda._sleep(1000)
    (w * 2.0).sum().item()
    torch.empty((N,), device="cuda").fill_(-1.0)
    (w != 6.0).sum().item()
    torch.cuda.synchronize()
    del w
    with torch.cuda.stream(s2):
        t = torch.full((N,), 3.0, device="cuda")
    t_ptr = t.data_ptr()
    nbytes = t.numel() * t.element_size()
    s1.wait_stream(s2)
    with torch.cuda.stream(s1):
        torch.cuda._sleep(args.sleep_cycles)  # keeps s1 busy so the read of t comes late
        out = t * 2.0
    result = {
        "bug": "record_stream",
        "t_ptr": hex(t_ptr),
        "target": hex(t_ptr),
        "target_bytes": nbytes,
        "error": None,
        "wrong": None,
    }
    try:
        with torch.cuda.stream(s2):
            del t  # BUG: t.record_stream(s1) is missing
            u = torch.empty((N,), device="cuda")
            u.fill_(-1.0)
        result["u_ptr"] = hex(u.data_ptr())
        result["same_address"] = u.data_ptr() == t_ptr
        torch.cuda.synchronize()
        result["wrong"] = int((out != 6.0).sum().item())
    except Exception as err:
        result["error"] = workload.error_text(err)
    result["correct"] = result["wrong"] == 0 if result["error"] is None else None
    workload.finish_history(args, result)
    workload.emit(result)
    return 0 if result["error"] is None else 3


if __name__ == "__main__":
    sys.exit(main())
