"""Bounds of the offline standard workload on one GPU, taken step by step (CPU only, no GPU).

    python tools/roofline.py [--bandwidth 4.8e12] [--flops 989e12] [--kv-bytes 1] [--weight-bytes 1] [--json]

The workload (``minisgl_core.bench.workloads.standard_offline``: 256 requests, all admitted at
once) is walked the way the engine runs it: one prefill of every prompt, then decode steps in
which every request with tokens left adds one; request i's decode step t reads ``prompt_i + t``
tokens of KV. Two bounds per model shape (``minisgl_core.bench.shapes``):

- **bandwidth**: every byte a step must read (all weight matrices once a decode step, the KV of
  every running request) at ``--bandwidth``; prefill at ``--flops``. This is the kind of bound
  the shared README's 40.8k / 15.7k figures are.
- **roofline**: the same, but each weight matrix of a decode step takes the longer of reading it
  and its ``2 * batch * N * K`` FLOPs at ``--flops``: at a batch of 256 Llama-3.1-8B's GEMMs
  need more time for their arithmetic than for their bytes.

A mixture-of-experts shape (Qwen3-30B-A3B) reads, a decode step, the experts its batch's tokens
chose: with routing spread evenly over ``E`` experts (random weights route so), ``E * (1 - (1 -
top_k / E) ** batch)`` of them in each sparse layer, every one at a batch of 256; each token
multiplies by its ``top_k`` experts' matrices (prefill too).

``--kv-bytes 1``: the bounds of a float8 KV pool (``--kv-cache-dtype fp8_e4m3``), whose decode
steps read half the KV bytes (weights stay bf16). ``--weight-bytes 1``: the decode steps of
``--quantization fp8`` (every linear layer's and expert's weights in e4m3, the lm_head in bf16;
the scales and prefill's FLOPs not counted apart). Printed for the nominal H200 figures (4.8 TB/s, 989 TFLOP/s dense bf16) and for the rates
measured on it (the decode kernel's ≈ 4.25 TB/s, an 8192² bf16 matmul's ≈ 789 TFLOP/s).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minisgl_core.bench.shapes import SHAPES, experts_of, linear_shapes, sparse_layer  # noqa: E402
from minisgl_core.bench.workloads import standard_offline  # noqa: E402

BYTES = 2  # bf16 weights and KV


def bounds(
    shape: str, bandwidth: float, flops: float, kv_element_bytes: int = BYTES, weight_bytes: int = BYTES
) -> dict:
    config = SHAPES[shape]
    layers = config["num_hidden_layers"]
    d = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_bytes = (
        2 * config["num_key_value_heads"] * d * kv_element_bytes * layers
    )  # K and V, every layer, a token
    q_dim = config["num_attention_heads"] * d
    products = linear_shapes(config)
    head = products.pop("lm_head")
    sparse = sum(sparse_layer(config, i) for i in range(layers))
    experts, top_k, _ = experts_of(config)
    # every layer's dense products; an expert's (gate/up, down) in the sparse layers, a dense
    # MLP's in the others
    expert = [products.pop("gate_up"), products.pop("down")] if sparse else []
    layer = list(products.values())
    dense_mlp = []  # a mixture-of-experts shape's dense layers' MLP (mlp_only_layers)
    if sparse and sparse < layers:
        inter = config["intermediate_size"]
        dense_mlp = [(2 * inter, config["hidden_size"]), (config["hidden_size"], inter)]
    requests = standard_offline()
    prompts = [len(r.prompt_ids) for r in requests]
    outputs = [r.max_tokens for r in requests]
    # prefill: every prompt token through every matrix (its top_k experts' in a sparse layer);
    # causal attention QK^T and PV; each request's last row through the lm_head (its first token)
    layer_params = sum(n * k for n, k in layer) * layers
    if sparse:
        layer_params += top_k * sum(n * k for n, k in expert) * sparse
        layer_params += sum(n * k for n, k in dense_mlp) * (layers - sparse)
    prefill_flops = 2 * layer_params * sum(prompts) + 2 * head[0] * head[1] * len(prompts)
    prefill_flops += sum(2 * 2 * layers * q_dim * p * (p + 1) / 2 for p in prompts)
    prefill_s = prefill_flops / flops
    gemm_bw = gemm_roof = attn = 0.0
    steps = max(outputs) - 1
    for t in range(1, steps + 1):
        running = [i for i, out in enumerate(outputs) if out > t]
        batch = len(running)
        kv = sum(prompts[i] + t for i in running) * kv_bytes
        attn += kv / bandwidth
        mats = [*layer * layers]
        if sparse:
            mats += dense_mlp * (layers - sparse)
        for n, k in [*mats, head]:
            read = n * k * (BYTES if (n, k) == head else weight_bytes) / bandwidth
            gemm_bw += read
            gemm_roof += max(read, 2 * batch * n * k / flops)
        if sparse:
            touched = experts * (1 - (1 - top_k / experts) ** batch)
            for n, k in expert:
                read = touched * n * k * weight_bytes / bandwidth * sparse
                gemm_bw += read
                gemm_roof += max(read, 2 * batch * top_k * n * k / flops * sparse)
    out_tokens = sum(outputs)
    bw_s = prefill_s + gemm_bw + attn
    roof_s = prefill_s + gemm_roof + attn
    return {
        "shape": shape,
        "bandwidth_TBps": bandwidth / 1e12,
        "TFLOPs": flops / 1e12,
        "decode_steps": steps,
        "seconds": {
            "prefill": round(prefill_s, 3),
            "decode_gemm_bytes": round(gemm_bw, 3),
            "decode_gemm_roofline": round(gemm_roof, 3),
            "decode_attention": round(attn, 3),
        },  # fmt: skip
        "bandwidth_bound_tok_s": round(out_tokens / bw_s),
        "roofline_tok_s": round(out_tokens / roof_s),
        "70pct_of_roofline": round(0.7 * out_tokens / roof_s),
    }


#: the rates taken, (lowest, highest): bytes/s from 1 GB/s to 1 PB/s, FLOP/s from 1 GFLOP/s to
#: 1 EFLOP/s, a device's. Past them (``--bandwidth 1e-300``, or 4.8 meant as TB/s) the bounds were
#: inf seconds and 0 tok/s, or a 300-digit TB/s column: never a device's numbers
BANDWIDTH_RANGE = (1e9, 1e15)
FLOPS_RANGE = (1e9, 1e18)


def _rate_in(low: float, high: float, unit: str, example: str):
    """The argparse type of a rate in ``unit``: a positive, finite number (argparse turns the
    ValueError into "invalid positive finite number value"), from ``low`` to ``high``."""

    def rate(text: str) -> float:
        value = float(text)
        if not (0 < value < float("inf")):
            raise ValueError(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text} {unit} is outside {low:g} to {high:g}: give the device's rate in {unit}, e.g. {example}"
            )
        return value

    rate.__name__ = "positive finite number"  # what argparse's message calls the type
    return rate


_bandwidth = _rate_in(*BANDWIDTH_RANGE, "bytes/s", "4.8e12 for 4.8 TB/s")
_flops = _rate_in(*FLOPS_RANGE, "FLOP/s", "989e12 for 989 TFLOP/s")


def rates_of(p: argparse.ArgumentParser, bandwidths: list[float] | None, flops: list[float] | None):
    """The (bandwidth, FLOP/s) pairs to print. Given once, a rate goes with every one of the other
    kind; given as often as the other, pairwise; only one kind given, it goes with the defaults
    pairwise when there are as many of it, else with the first default (the nominal H200's)."""
    nominal, measured = (4.8e12, 989e12), (4.25e12, 789e12)
    if bandwidths is None and flops is None:
        return [nominal, measured]
    if bandwidths is None or flops is None:
        given = bandwidths if bandwidths is not None else flops
        defaults = [r[1 if flops is None else 0] for r in (nominal, measured)]
        paired = defaults if len(given) == len(defaults) else [defaults[0]] * len(given)
        return [(g, d) if flops is None else (d, g) for g, d in zip(given, paired, strict=True)]
    if len(bandwidths) == 1:
        bandwidths = bandwidths * len(flops)
    elif len(flops) == 1:
        flops = flops * len(bandwidths)
    if len(bandwidths) != len(flops):
        p.error(
            f"{len(bandwidths)} --bandwidth and {len(flops)} --flops values: give them pairwise "
            "(as many of each), or one of either kind"
        )
    return list(zip(bandwidths, flops, strict=True))


def main() -> None:
    main_with(sys.argv[1:])


def main_with(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="roofline.py")
    p.add_argument(
        "--bandwidth",
        type=_bandwidth,
        action="append",
        help="bytes/s, 1e9 to 1e15 (default: 4.8e12 and 4.25e12)",
    )
    p.add_argument(
        "--flops", type=_flops, action="append", help="FLOP/s, 1e9 to 1e18 (default: 989e12 and 789e12)"
    )
    p.add_argument(
        "--kv-bytes",
        type=int,
        choices=(1, 2),
        default=BYTES,
        help="bytes a KV element (default 2: bf16; 1: fp8)",
    )
    p.add_argument(
        "--weight-bytes", type=int, choices=(1, 2), default=BYTES,
        help="bytes a weight element (1: fp8; lm_head bf16)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    args = p.parse_args(argv)
    rates = rates_of(p, args.bandwidth, args.flops)
    for shape in sorted(SHAPES):
        for bandwidth, flops in rates:
            row = bounds(shape, bandwidth, flops, args.kv_bytes, args.weight_bytes)
            if args.json:
                print(json.dumps(row))
                continue
            s = row["seconds"]
            print(
                f"{shape:13} {bandwidth / 1e12:.2f} TB/s {flops / 1e12:4.0f} TFLOP/s: bandwidth bound "
                f"{row['bandwidth_bound_tok_s']:6,} tok/s, roofline {row['roofline_tok_s']:6,} (70%: "
                f"{row['70pct_of_roofline']:6,}); s: prefill {s['prefill']}, decode GEMMs {s['decode_gemm_bytes']}"
                f" by bytes / {s['decode_gemm_roofline']} by roofline, attention {s['decode_attention']}"
            )


if __name__ == "__main__":
    main()
