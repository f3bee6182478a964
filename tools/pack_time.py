"""Host time of packing one 8,192-token prefill step's inputs (the blocks
``Scheduler`` hands :func:`~minisgl_core.runner.sampler.rows_to_device`): each block's aligned
bytes, then joined by ``torch.cat`` (the one-copy pack until the sixty-seventh session) or by
``array.array.frombytes`` (since), ms per step, median and worst of ``--steps``. CPU only; run it
on the GPU machine's host to compare with a step trace's ``schedule.rows`` / ``schedule.pack``.

    python3 tools/pack_time.py [--tokens 8192] [--steps 40]
"""

from __future__ import annotations

import argparse
import array
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from minisgl_core.runner.sampler import _aligned  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    n, reqs = args.tokens, 16
    rng = random.Random(0)
    ways: dict[str, list[float]] = {"rows": [], "torch.cat": [], "array join": []}
    for _ in range(args.steps):
        slots = [rng.randrange(1 << 20) for _ in range(n)]
        wide = [
            slots,
            list(range(n)),
            [i * reqs // n for i in range(n)],
            [rng.randrange(10_000) for _ in range(n)],
        ]
        blocks = [(wide, torch.int64), ([list(range(reqs))] * 3, torch.int32), ([slots], torch.int32),
                  ([list(range(reqs))], torch.int64)]  # fmt: skip
        t0 = time.perf_counter()
        parts = [_aligned(rows, dtype) for rows, dtype in blocks]
        t1 = time.perf_counter()
        hosts = [torch.frombuffer(data, dtype=dtype) for (data, _), (_, dtype) in zip(parts, blocks)]
        torch.cat([h.view(torch.uint8) for h in hosts])
        t2 = time.perf_counter()
        packed = array.array("b")
        for data, _ in parts:
            packed.frombytes(memoryview(data).cast("B"))
        torch.frombuffer(packed, dtype=torch.uint8)
        t3 = time.perf_counter()
        for way, dt in zip(ways, (t1 - t0, t2 - t1, t3 - t2)):
            ways[way].append(dt * 1e3)
    print(f"{n} tokens, {args.steps} steps, torch threads {torch.get_num_threads()}: ms median / worst")
    for way, ms in ways.items():
        print(f"  {way:11s} {statistics.median(ms):7.3f} / {max(ms):7.3f}")


if __name__ == "__main__":
    main()
