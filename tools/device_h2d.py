"""Host time of one small host-to-device copy on the GPU machine, two ways (issue 19).

A decode step copies a few small host arrays to the GPU; from pageable memory the driver stages
each one synchronously. This times, in µs of host time per copy (the device's time is not
counted), a contiguous int64 CPU tensor of each size copied with ``non_blocking=True``:

* ``pageable``: ``host.to(cuda)``, as the engine does by default;
* ``pin_memory``: ``host.pin_memory().to(cuda)`` (PyTorch's caching host allocator), as the
  Triton plugin's plan table does.

A third way, a pinned staging ring (``PinnedStaging`` at ``ee253fa``), measured 30-72 µs a copy
against pageable's 8-18 and was removed (BENCHMARKS.md, 2026-11-27, twenty-eighth session).

Each with the device idle and with the device busy (a long sleep kernel queued first, as during
a run, where the host works a step ahead).

    python3 tools/device_h2d.py [--sizes 8,64,512,8192] [--iters 2000] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _time(copy, host: torch.Tensor, iters: int, busy: bool) -> float:
    device = torch.device("cuda")
    for _ in range(20):  # warm-up: the allocators' caches
        copy(host, device)
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(2_000_000_000)  # ~1 s of the stream, longer than the loop
        # fewer copies than CUDA's launch queue holds: past about a thousand queued behind the
        # sleeping kernel the host blocks until it ends (the first call's 2,000-copy loops at
        # 8 and 64 elements read ~510 µs a copy that way)
        iters = min(iters, 256)
    started = time.perf_counter()
    for _ in range(iters):
        copy(host, device)
    spent = time.perf_counter() - started
    torch.cuda.synchronize()
    return spent / iters * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8,64,512,8192", help="int64 elements per copy")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--json")
    args = p.parse_args()
    ways = {
        "pageable": lambda host, device: host.to(device, non_blocking=True),
        "pin_memory": lambda host, device: host.pin_memory().to(device, non_blocking=True),
    }
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        host = torch.arange(size, dtype=torch.int64)
        for busy in (False, True):
            row = {"elements": size, "bytes": size * 8, "device_busy": busy}
            for name, copy in ways.items():
                row[f"{name}_us"] = round(_time(copy, host, args.iters, busy), 2)
            print(json.dumps(row), flush=True)
            results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
