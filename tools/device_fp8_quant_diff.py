"""Does the fp8 one-token GEMV round the activations exactly as ``quantize_rows``? Run on a GPU:

    python3 tools/device_fp8_quant_diff.py [--rows 4000] [--json F]

1. Identity weight (e4m3 1.0 on the diagonal, scales 1): the GEMV's output is then ``q(x) * x_scale``
   (float32 activations holding bf16 values: no rounding after the product), compared bitwise, row by row, with ``quantize_rows``' on random rows (with and without
   a few large entries); the first mismatching elements are printed with their operands.
2. The Triton row quantizer that feeds ``torch._scaled_mm`` against eager ``quantize_rows``, bitwise.
3. The case ``tools/device_fp8_check.py gemm`` flagged (o_proj, one token: 0.0077 from the
   emulation, 2026-11-26): its weight and token redrawn from the same generator sequence, the
   GEMV against the emulation in float64 and float32, and which quantized elements differ.
"""

from __future__ import annotations

import argparse
import json

import torch


def identity_rows(rows: int, k: int, device) -> dict:
    from minisgl_plugin_fp8.gemv import fp8_gemv
    from minisgl_plugin_fp8.method import FP8, quantize_rows

    weight = torch.eye(k, device=device).to(FP8).contiguous()
    ones = torch.ones(k, device=device)
    gen = torch.Generator(device=device).manual_seed(1)
    bad_rows, examples = 0, []
    for i in range(rows):
        x = torch.randn(1, k, generator=gen, device=device)
        if i % 2:
            x[0, :8] *= 10
        x = x.to(torch.bfloat16).float()  # bf16 values; float32 output: no rounding after the product
        got = fp8_gemv(x, weight, ones)
        q, scale = quantize_rows(x)
        want = q.float() * scale
        diff = (got != want).nonzero()
        if diff.numel():
            bad_rows += 1
            for _, j in diff[:3].tolist():
                xv = x[0, j].float().item()
                inv = torch.reciprocal(scale).item()
                examples.append({"row": i, "col": j, "x": xv, "scale": scale.item(), "x_times_inverse": xv * inv,
                                 "gemv": got[0, j].item(), "quantize_rows": want[0, j].item()})  # fmt: skip
    return {"rows": rows, "rows_with_a_difference": bad_rows, "examples": examples[:12]}


def row_quantizer(rows: int, device) -> dict:
    """The Triton row quantizer (the ``_scaled_mm`` path's) against eager ``quantize_rows``."""
    from minisgl_plugin_fp8.gemv import quantize_rows_triton
    from minisgl_plugin_fp8.method import quantize_rows

    gen = torch.Generator(device=device).manual_seed(2)
    differing = 0
    for k in (4096, 14336):
        x = torch.randn(rows, k, generator=gen, device=device)
        x[::2, :8] *= 10
        x = x.to(torch.bfloat16)
        q, scale = quantize_rows_triton(x)
        q_ref, scale_ref = quantize_rows(x)
        differing += int((scale != scale_ref).sum()) + int((q.float() != q_ref.float()).any(dim=1).sum())
    return {"rows": 2 * rows, "rows_with_a_difference": differing}


def flagged_case(device) -> dict:
    from minisgl_plugin_fp8 import method as fp8_method
    from minisgl_plugin_fp8.method import Fp8Method

    method = Fp8Method(device=device, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    # replay device_fp8_check.gemm_check's draws: qkv's weight and tokens, then o's weight and token
    for name, out_features, in_features in [("qkv", 6144, 4096), ("o", 4096, 4096)]:
        weight = torch.randn(out_features, in_features, generator=gen, device=device) * 0.02
        weight[:, :8] *= 10
        weight = weight.to(torch.bfloat16)
        x = torch.randn(1, in_features, generator=gen, device=device).to(torch.bfloat16)
        if name == "qkv":
            torch.randn(256, in_features, generator=gen, device=device)
            torch.randn(1, in_features, generator=gen, device=device)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    method.process_weights_after_loading(layer)
    out = method.apply(layer, x).double()
    wq = layer.weight.double() * layer.weight_scale.double().view(-1, 1)
    q, scale = fp8_method.quantize_rows(x)
    emulated64 = (q.double() * scale.double()) @ wq.t()
    emulated32 = (q.float() * scale) @ (layer.weight.float() * layer.weight_scale.view(-1, 1)).t()
    report = {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "vs_emulation_float64": ((out - emulated64).norm() / emulated64.norm()).item(),
        "vs_emulation_float32": ((out - emulated32.double()).norm() / emulated64.norm()).item(),
        "bf16_rounding_of_emulation": ((emulated64.to(torch.bfloat16).double() - emulated64).norm()
                                       / emulated64.norm()).item(),
    }  # fmt: skip
    # which quantized activations differ: the identity trick on this token
    from minisgl_plugin_fp8.gemv import fp8_gemv

    k = x.shape[1]
    eye = torch.eye(k, device=device).to(fp8_method.FP8).contiguous()
    got = fp8_gemv(x.float(), eye, torch.ones(k, device=device))
    want = q.float() * scale
    cols = sorted((got != want).nonzero()[:, 1].tolist(), key=lambda j: -abs((got - want)[0, j]).item())
    report["differing_activations"] = [
        {"col": j, "x": x[0, j].item(), "gemv": got[0, j].item(), "quantize_rows": want[0, j].item()}
        for j in cols[:8]
    ]
    return report


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1")
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device(args.device)
    report = {"identity": identity_rows(args.rows, 4096, device), "row_quantizer": row_quantizer(args.rows, device),
              "flagged": flagged_case(device)}  # fmt: skip
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
