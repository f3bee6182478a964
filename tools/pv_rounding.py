"""The softmax-weighted mean of V with P rounded to bf16, in float64 on the CPU: divided by the
unrounded sum of P (the Triton decode before a02bd10) or by the sum of the rounded P (since), and
with P·V float32-accurate. Prints each variant's mean and worst output error over random rows,
for V centred and with a mean of 1 and 3 (BENCHMARKS.md).

    python3 tools/pv_rounding.py [--rows 200] [--positions 800]
"""

from __future__ import annotations

import argparse

import torch


def errors(rows: int, positions: int, v_mean: float, head_dim: int = 128) -> dict[str, tuple[float, float]]:
    gen = torch.Generator().manual_seed(0)
    found: dict[str, list[float]] = {"unrounded sum": [], "rounded sum": [], "exact P·V": []}
    for _ in range(rows):
        q = torch.randn(head_dim, generator=gen, dtype=torch.float64).bfloat16().double()
        k = (torch.randn(positions, head_dim, generator=gen, dtype=torch.float64) * 0.6).bfloat16().double()
        v = (
            (torch.randn(positions, head_dim, generator=gen, dtype=torch.float64) + v_mean)
            .bfloat16()
            .double()
        )
        p = torch.exp(k @ q / head_dim**0.5 - (k @ q / head_dim**0.5).max())
        want = p @ v / p.sum()
        p32 = p.float().double()
        rounded = p.float().bfloat16().double()
        found["unrounded sum"].append(float((rounded @ v / p32.sum() - want).abs().max()))
        found["rounded sum"].append(float((rounded @ v / rounded.sum() - want).abs().max()))
        found["exact P·V"].append(float((p32 @ v / p32.sum() - want).abs().max()))
    return {name: (sum(e) / len(e), max(e)) for name, e in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--positions", type=int, default=800)
    args = parser.parse_args()
    for v_mean in (0.0, 1.0, 3.0):
        row = errors(args.rows, args.positions, v_mean)
        print(
            f"V mean {v_mean}: " + ", ".join(f"{k} mean {m:.2e} worst {w:.2e}" for k, (m, w) in row.items())
        )


if __name__ == "__main__":
    main()
