"""When does a host-to-device copy hold the host until the device has run the work queued before it?
(issue 19; the GPU machine, plain torch: no prelude needed).

The engine plans step k+1 while the device runs step k, so every copy of a step is queued behind
a step's worth of kernels. A copy from pageable memory is staged by the driver; past some size the
host waits for the device. This queues a sleeping kernel (``--sleep-ms``, on the one stream the
engine uses too) and times, in ms of host time, each way of sending ``bytes`` to the device:

* ``pageable``: one ``.to(cuda, non_blocking=True)`` of a pageable CPU tensor of that size;
* ``pageable x2``: two such copies of half the size each;
* ``chunks 64K``: the same bytes in 64 KiB pageable copies into one device buffer;
* ``fresh cat`` / ``fresh array``: one pageable copy of a host tensor made anew each time (by
  ``torch.cat``, as the engine's one-copy pack; from an ``array.array``, as ``int_tensor``), where
  the ways above reuse one host tensor; ``fresh cat kept``: as ``fresh cat`` but each host tensor
  is freed three copies later (if only the freed ones wait, freeing the memory is what waits);
* ``pin_memory``: ``host.pin_memory()`` then the copy (PyTorch's caching host allocator);
* ``pinned buffer``: a pinned buffer allocated once, filled on the host, then copied (no event
  guards its reuse: a timing, not a way to ship data).

Each point after a synchronize, ``--repeats`` times (the first of ``pin_memory`` at a size also
allocates its pinned block). Then ``steps``: twenty "steps" in a row, each a ``--step-ms`` sleep
then the copy, the host waiting for the step before (one step ahead of the device, as the engine's
overlap runs): the host time of each copy.

    python3 tools/device_h2d_queue.py [--sizes 64,128,192,256,300,384,512] [--ways "pageable,fresh cat"]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import array
import json
import time

import torch

CHUNK = 64 * 1024
#: the ways :func:`_ways` times, by name
WAYS = (
    "pageable",
    "pageable x2",
    "chunks 64K",
    "fresh cat",
    "fresh cat kept",
    "fresh array",
    "pin_memory",
    "pinned buffer",
)


def _ways(nbytes: int, device: torch.device):
    host = torch.arange(nbytes, dtype=torch.int64).to(torch.uint8)
    half = nbytes // 2
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dest = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def pageable():
        return host.to(device, non_blocking=True)

    def pageable_x2():
        return host[:half].to(device, non_blocking=True), host[half:].to(device, non_blocking=True)

    def chunks():
        for start in range(0, nbytes, CHUNK):
            dest[start : start + CHUNK].copy_(host[start : start + CHUNK], non_blocking=True)
        return dest

    def fresh_cat():  # a new host tensor each time, as the engine's pack (torch.cat of its blocks)
        return torch.cat([host[:half], host[half:]]).to(device, non_blocking=True)

    kept: list[torch.Tensor] = []

    def fresh_cat_kept():  # as fresh cat, but each host tensor outlives its copy by three calls
        made = torch.cat([host[:half], host[half:]])
        kept.append(made)
        del kept[:-4]
        return made.to(device, non_blocking=True)

    def fresh_array():  # a new host tensor each time, from an array.array (as int_tensor builds them)
        return torch.frombuffer(array.array("B", bytes(nbytes)), dtype=torch.uint8).to(
            device, non_blocking=True
        )

    def pin_memory():
        return host.pin_memory().to(device, non_blocking=True)

    def pinned_buffer():
        pinned.copy_(host)
        return dest.copy_(pinned, non_blocking=True)

    ways = (pageable, pageable_x2, chunks, fresh_cat, fresh_cat_kept, fresh_array, pin_memory, pinned_buffer)
    return dict(zip(WAYS, ways, strict=True))


def _cycles(ms: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` for about ``ms`` (measured once)."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    torch.cuda._sleep(100_000_000)
    torch.cuda.synchronize()
    per_ms = 100_000_000 / ((time.perf_counter() - started) * 1e3)
    return int(per_ms * ms)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64,128,192,256,300,384,512", help="KiB per copy")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sleep-ms", type=float, default=200.0)
    p.add_argument("--step-ms", type=float, default=15.0)
    p.add_argument("--ways", help="comma-separated names of the ways to time (default: all)")
    p.add_argument("--json")
    args = p.parse_args()
    chosen = args.ways.split(",") if args.ways else None
    unknown = sorted(set(chosen or ()) - set(WAYS))
    if unknown:
        p.error(f"--ways: no way named {', '.join(unknown)}; the ways: {', '.join(WAYS)}")
    device = torch.device("cuda")
    sleep, step = _cycles(args.sleep_ms), _cycles(args.step_ms)
    rows = []
    for kib in (int(s) for s in args.sizes.split(",")):
        for name, way in _ways(kib * 1024, device).items():
            if chosen is not None and name not in chosen:
                continue
            way()
            host_ms = []
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                torch.cuda._sleep(sleep)
                started = time.perf_counter()
                way()
                host_ms.append(round((time.perf_counter() - started) * 1e3, 3))
            torch.cuda.synchronize()
            steps, previous = [], None
            for _ in range(20):  # one step ahead of the device, as the engine's overlap runs
                torch.cuda._sleep(step)
                started = time.perf_counter()
                way()
                steps.append(round((time.perf_counter() - started) * 1e3, 3))
                done = torch.cuda.Event()
                done.record()
                if previous is not None:
                    previous.synchronize()
                previous = done
            torch.cuda.synchronize()
            row = {"kib": kib, "way": name, "host_ms_behind_sleep": host_ms, "steps_ms": steps}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sleep_ms": args.sleep_ms, "step_ms": args.step_ms, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
